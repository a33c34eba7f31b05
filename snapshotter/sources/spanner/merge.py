"""Merging a Spanner change stream's partitions into one totally ordered stream (pure: no IO).

A change stream is read as partitions, each a query of its own. Within a partition, records
come in commit-timestamp order; across partitions there is no order at all, and partitions
end, split and merge over time (a ``child_partitions`` record names the children, each with
a start timestamp and its parents). The merge is the change-stream connectors' low
watermark:

* Each partition says how far it is complete: a heartbeat at ``H`` means every record with a
  commit timestamp <= ``H`` has been sent; a data record at ``T`` only that every record
  before ``T`` has (another transaction may commit at the same ``T``).
* A child starts only once every parent has finished (sent its ``child_partitions`` record
  and ended); until then it counts as complete up to just before its start timestamp, since
  nothing it will send is older. A child named by several parents (a merge) is one child.
* A buffered record is released once every live or waiting partition is complete through
  its commit timestamp, in (commit timestamp, transaction, record sequence) order: the
  order of the merged stream. Records of one transaction (one commit timestamp and
  transaction id, maybe from several partitions) are therefore released together.

Timestamps are integers of microseconds since the epoch (Spanner's precision in change
records). The caller feeds what each partition's query returns (``data``, ``heartbeat``,
``child_partitions``, ``finished``) and takes ``release()``; ``to_start()`` says which
partitions should be queried, and from when.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# The reader's restart point and partitions: versioned JSON in state.
STATE_VERSION = 1


class MergeError(ValueError):
    """A record that breaks a partition's promises (older than what it said was complete),
    or a token nobody named: the stream cannot be merged safely."""


@dataclass(frozen=True, order=True)
class RecordKey:
    """The merged stream's order of data change records."""

    commit_us: int
    transaction: str
    sequence: int


@dataclass(frozen=True)
class Child:
    token: str
    start_us: int
    parents: frozenset[str]


@dataclass
class _Partition:
    token: str
    start_us: int
    complete_us: int  # every record with a commit timestamp <= this has arrived
    end_us: int | None = None  # where it ends (its child_partitions record's start)
    children: list[Child] = field(default_factory=list)


@dataclass(order=True)
class _Buffered:
    key: RecordKey
    seq: int  # arrival order, to keep the heap stable for equal keys (never equal in practice)
    payload: Any = field(compare=False)


class PartitionMerger:
    def __init__(self) -> None:
        self._live: dict[str, _Partition] = {}
        self._waiting: dict[str, Child] = {}  # children named, not started (parents running)
        self._done: set[str] = set()  # finished partitions whose children are known
        # Finished partitions that sent records the merge has not released yet (they end
        # after the low watermark): a restart must read them again. token -> (start, end)
        self._ended: dict[str, tuple[int, int]] = {}
        self._heap: list[_Buffered] = []
        self._arrived = 0
        self._released: RecordKey | None = None

    # ------------------------------------------------------------------ what to read

    def add_root(self, token: str, start_us: int) -> bool:
        """A partition with no parents (the answer to the query without a token); whether
        it is new (the query may be run again)."""
        if token in self._live or token in self._waiting or token in self._done:
            return False
        self._live[token] = _Partition(token, start_us, start_us - 1)
        return True

    def to_start(self) -> list[tuple[str, int]]:
        """Children whose parents have all finished: (token, start timestamp) to query; they
        are live from now on."""
        ready = []
        for token, child in list(self._waiting.items()):
            if all(p in self._done for p in child.parents):
                del self._waiting[token]
                self._live[token] = _Partition(token, child.start_us, child.start_us - 1)
                ready.append((token, child.start_us))
        return ready

    @property
    def live_tokens(self) -> list[str]:
        return list(self._live)

    def restart_points(self) -> list[tuple[str, int]]:
        """The live partitions and the timestamp each one's query starts at."""
        return [(t, p.start_us) for t, p in self._live.items()]

    def restart_point(self, token: str) -> int:
        """Where a live partition's query starts again after it failed: every record before
        it has arrived (what arrives twice is the caller's to drop)."""
        part = self._partition(token)
        return max(part.start_us, part.complete_us + 1)

    # ------------------------------------------------------------------ what a partition says

    def data(self, token: str, record: RecordKey, payload: Any) -> None:
        part = self._partition(token)
        if record.commit_us <= part.complete_us:
            raise MergeError(
                f"partition {token[:12]}...: a record at {record.commit_us} after it was "
                f"complete through {part.complete_us}"
            )
        if self._released is not None and record <= self._released:
            raise MergeError(f"a record at {record} after {self._released} was released")
        part.complete_us = record.commit_us - 1
        self._arrived += 1
        heapq.heappush(self._heap, _Buffered(record, self._arrived, payload))

    def heartbeat(self, token: str, at_us: int) -> None:
        part = self._partition(token)
        part.complete_us = max(part.complete_us, at_us)

    def child_partitions(self, token: str, start_us: int, children: Iterable[Child]) -> None:
        """The partition ends at ``start_us``: it has sent everything before it, and these
        children go on from there (once all of each one's parents have finished)."""
        part = self._partition(token)
        part.complete_us = max(part.complete_us, start_us - 1)
        part.end_us = start_us
        for child in children:
            if child.token in self._live or child.token in self._done:
                continue  # named by another parent too (a merge), and already started
            self._waiting.setdefault(child.token, child)
            part.children.append(child)

    def finished(self, token: str) -> None:
        """The partition's query ended (after its ``child_partitions`` record)."""
        part = self._live.pop(token, None)
        if part is None:
            raise MergeError(f"partition {token[:12]}... finished but was not live")
        self._done.add(token)
        if part.end_us is not None:
            self._ended[token] = (part.start_us, part.end_us)

    def _partition(self, token: str) -> _Partition:
        part = self._live.get(token)
        if part is None:
            raise MergeError(f"a record of partition {token[:12]}..., which is not live")
        return part

    # ------------------------------------------------------------------ the merged stream

    def low_watermark(self) -> int | None:
        """Every record with a commit timestamp <= this has arrived from every partition
        (None: no partition yet)."""
        bounds = [p.complete_us for p in self._live.values()]
        bounds += [c.start_us - 1 for c in self._waiting.values()]
        return min(bounds) if bounds else None

    def release(self) -> list[tuple[RecordKey, Any]]:
        """The buffered records every partition is complete through, in merged order."""
        mark = self.low_watermark()
        out: list[tuple[RecordKey, Any]] = []
        if mark is None:
            return out
        while self._heap and self._heap[0].key.commit_us <= mark:
            item = heapq.heappop(self._heap)
            out.append((item.key, item.payload))
            self._released = item.key
        return out

    def forget_through(self, restart_us: int) -> None:
        """A restart point at ``restart_us`` is durable: finished partitions that end at or
        before it will never be read again."""
        for token, (_, end) in list(self._ended.items()):
            if end <= restart_us:
                del self._ended[token]

    @property
    def buffered(self) -> int:
        return len(self._heap)

    # ------------------------------------------------------------------ restart

    def checkpoint(self, restart_us: int | None = None) -> dict[str, Any]:
        """What a restart needs, as JSON: every partition to query again and from when, the
        waiting children. The restart reads every record at or after ``restart_us``
        (default: just after the low watermark: every record at or before it was
        released); the caller skips, by position, what it had already handed on. A caller
        checkpointing at a transaction it released passes that transaction's commit
        timestamp (later transactions of the same timestamp may not have been handed on).
        Partitions that finished after ``restart_us`` are read again, from there (their
        ends are kept until ``forget_through``)."""
        mark = self.low_watermark()
        if restart_us is None:
            restart_us = 0 if mark is None else mark + 1
        return {
            "version": STATE_VERSION,
            "restart_us": restart_us,
            # Every live partition, even one that has sent its end: its query may not have
            # returned all its child_partitions records yet.
            "live": [{"token": t, "start_us": p.start_us} for t, p in sorted(self._live.items())]
            + [
                {"token": t, "start_us": start}
                for t, (start, end) in sorted(self._ended.items())
                if end > restart_us
            ],
            "waiting": [
                {"token": c.token, "start_us": c.start_us, "parents": sorted(c.parents)}
                for c in sorted(self._waiting.values(), key=lambda c: c.token)
            ],
            "done": sorted(p for p in self._done if self._needed(p)),
        }

    def _needed(self, token: str) -> bool:
        """A finished partition a waiting child still names as a parent."""
        return any(token in c.parents for c in self._waiting.values())

    @classmethod
    def restored(cls, saved: Mapping[str, Any]) -> PartitionMerger:
        """A merger that goes on from ``checkpoint()``'s answer: query each of
        ``restart_points()``, and what ``to_start()`` gives at once (children whose parents
        all finished before the checkpoint)."""
        if saved.get("version") != STATE_VERSION:
            raise MergeError(f"saved change-stream partitions of version {saved.get('version')}")
        merger = cls()
        restart = saved["restart_us"]
        for raw in saved["live"]:
            # A partition's query may not start before the partition did, nor at its end,
            # which may be the restart point (a heartbeat just before it made the low
            # watermark): one microsecond earlier is always inside the partition, and what
            # it sends again is skipped by position.
            start = max(raw["start_us"], restart - 1)
            merger._live[raw["token"]] = _Partition(raw["token"], start, start - 1)
        for raw in saved["waiting"]:
            child = Child(raw["token"], raw["start_us"], frozenset(raw["parents"]))
            merger._waiting[child.token] = child
        merger._done.update(t for t in saved["done"] if t not in merger._live)
        return merger

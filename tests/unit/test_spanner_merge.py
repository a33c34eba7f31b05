"""The change-stream partition merge (sources/spanner/merge.py) against an oracle: random
partition histories (splits, moves, merges at churn instants, as the emulator makes them),
transactions spread over partitions, every interleaving of the partitions' deliveries, and
restarts from a checkpoint: the merged stream is every record once, in (commit timestamp,
transaction, sequence) order, and a record is released only when no partition can still
send an older one."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snapshotter.sources.spanner.merge import Child, MergeError, PartitionMerger, RecordKey

END = 1000  # µs of stream time in a generated history


@dataclass
class _Part:
    token: str
    start: int
    end: int | None = None
    parents: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)


def _history(rng: random.Random) -> tuple[dict[str, _Part], list[RecordKey]]:
    live = [_Part(f"r{i}", 0) for i in range(rng.randint(1, 3))]
    parts = {p.token: p for p in live}
    serial = 0
    t = 0
    while True:
        t += rng.randint(30, 400)
        if t >= END:
            break
        order = live[:]
        rng.shuffle(order)
        new_live: list[_Part] = []
        i = 0
        while i < len(order):
            kind = rng.choice(("move", "split", "merge"))
            if kind == "merge" and i + 1 < len(order):
                parents, i = order[i : i + 2], i + 2
                count = 1
            else:
                parents, i = [order[i]], i + 1
                count = 2 if kind == "split" else 1
            kids = []
            for _ in range(count):
                serial += 1
                kids.append(_Part(f"c{serial}", t, parents=[p.token for p in parents]))
            for p in parents:
                p.end, p.children = t, [k.token for k in kids]
            for k in kids:
                parts[k.token] = k
            new_live += kids
        live = new_live
    records: list[RecordKey] = []
    for n in range(rng.randint(0, 40)):
        commit = rng.randrange(0, END)
        if rng.random() < 0.2 and records:
            commit = rng.choice(records).commit_us  # another transaction at the same time
        for seq in range(rng.randint(1, 3)):
            records.append(RecordKey(commit, f"tx{n:03d}", seq))
    return parts, records


def _placement(
    rng: random.Random, parts: dict[str, _Part], records: list[RecordKey]
) -> dict[str, list[tuple[int, int, str, Any]]]:
    """Per partition, its events in delivery order: (time, rank, kind, value)."""
    events: dict[str, list[tuple[int, int, str, Any]]] = {t: [] for t in parts}
    for r in records:
        at = [
            p
            for p in parts.values()
            if p.start <= r.commit_us and (p.end is None or r.commit_us < p.end)
        ]
        events[rng.choice(at).token].append((r.commit_us, 0, "data", r))
    for p in parts.values():
        last = p.end if p.end is not None else END
        for _ in range(rng.randint(0, 3)):
            h = rng.randrange(p.start, last) if last > p.start else p.start
            events[p.token].append((h, 1, "heartbeat", h))
        if p.end is None:
            events[p.token].append((END, 1, "heartbeat", END))
        else:
            kids = [Child(k, parts[k].start, frozenset(parts[k].parents)) for k in p.children]
            events[p.token].append((p.end, 2, "children", (p.end, kids)))
            events[p.token].append((p.end, 3, "finished", None))
        events[p.token].sort(key=lambda e: (e[0], e[1], str(e[3])))
    return events


def _run(
    rng: random.Random,
    parts: dict[str, _Part],
    events: dict[str, list[tuple[int, int, str, Any]]],
    restarts: int,
) -> list[RecordKey]:
    merger = PartitionMerger()
    queues: dict[str, list[tuple[int, int, str, Any]]] = {}
    for p in parts.values():
        if not p.parents:
            merger.add_root(p.token, p.start)
            queues[p.token] = list(events[p.token])
    out: list[RecordKey] = []
    skip_through: RecordKey | None = None
    handed_on: list[RecordKey] = []
    while queues:
        token = rng.choice(sorted(queues))
        _, _, kind, value = queues[token].pop(0)
        if kind == "data":
            merger.data(token, value, None)
        elif kind == "heartbeat":
            merger.heartbeat(token, value)
        elif kind == "children":
            merger.child_partitions(token, *value)
        else:
            merger.finished(token)
        if not queues[token]:
            del queues[token]
        for child, start in merger.to_start():
            queues[child] = [e for e in events[child] if e[0] >= start]
        released = [key for key, _ in merger.release()]
        assert all(key.commit_us <= (merger.low_watermark() or 0) for key in released), (
            "released past the low watermark"
        )
        fresh = [k for k in released if skip_through is None or k > skip_through]
        out += fresh
        handed_on += fresh  # since the last restart: what this merger can checkpoint at
        if handed_on and rng.random() < 0.1:
            # The engine saved a commit's restart point: no restart goes back before it.
            durable = rng.choice(handed_on)
            merger.forget_through(durable.commit_us)
            handed_on = [k for k in handed_on if k >= durable]
        if restarts and rng.random() < 0.05:
            restarts -= 1
            if handed_on and rng.random() < 0.5:
                # At a transaction handed on earlier (the engine's commit checkpoints):
                # what came after it is lost with the crash, and read again.
                last = rng.choice(handed_on)
                saved = merger.checkpoint(restart_us=last.commit_us)
                out = [k for k in out if k <= last]
                skip_through = last  # the engine skips what it had, by position
            else:
                # Past the low watermark (the engine's progress checkpoints): everything
                # released was handed on and is kept.
                saved = merger.checkpoint()
                skip_through = max(out, default=skip_through)
            merger = PartitionMerger.restored(saved)
            handed_on = []
            # Every live partition is queried again from its restart point; waiting
            # children start as their parents finish, as before.
            for t, start in merger.restart_points():
                # Spanner refuses a partition query that starts at or after its end.
                end = parts[t].end
                assert end is None or start < end, f"{t} restarted at {start}, ends at {end}"
            queues = {
                t: [e for e in events[t] if e[0] >= start] for t, start in merger.restart_points()
            }
            for child, start in merger.to_start():  # children whose parents all finished
                queues[child] = [e for e in events[child] if e[0] >= start]
            queues = {t: q for t, q in queues.items() if q}  # past the history's end
    return out


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 2**32), st.integers(0, 3))
def test_the_merged_stream_is_every_record_once_in_order(seed: int, restarts: int) -> None:
    rng = random.Random(seed)
    parts, records = _history(rng)
    events = _placement(rng, parts, records)
    merged = _run(rng, parts, events, restarts)
    assert merged == sorted(records)


def test_a_merge_is_one_child_started_when_both_parents_finished() -> None:
    merger = PartitionMerger()
    merger.add_root("a", 0)
    merger.add_root("b", 0)
    child = Child("c", 100, frozenset({"a", "b"}))
    merger.data("a", RecordKey(50, "t1", 0), "x")
    merger.child_partitions("a", 100, [child])
    merger.finished("a")
    assert merger.to_start() == []  # b is still running
    assert merger.release() == []  # b may still send something before 50
    merger.heartbeat("b", 99)
    assert [k for k, _ in merger.release()] == [RecordKey(50, "t1", 0)]
    merger.child_partitions("b", 100, [child])
    merger.finished("b")
    assert merger.to_start() == [("c", 100)]
    assert merger.live_tokens == ["c"]


def test_a_record_older_than_the_partition_promised_is_refused() -> None:
    merger = PartitionMerger()
    merger.add_root("a", 0)
    merger.heartbeat("a", 10)
    with pytest.raises(MergeError, match="complete through 10"):
        merger.data("a", RecordKey(10, "t", 0), None)

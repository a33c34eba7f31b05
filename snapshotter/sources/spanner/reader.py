"""The Spanner log reader: a change stream's partitions read at once, merged into one stream.

Every live partition is one streaming query of its own (``READ_<stream>`` in GoogleSQL,
``spanner.read_json_<stream>`` in the PostgreSQL dialect: strong single-use reads, as change
stream queries must be), run by a thread that queues what it returns. ``read`` feeds it to a
:class:`~snapshotter.sources.spanner.merge.PartitionMerger` and hands on what the merge
releases, in (commit timestamp, transaction, record sequence) order: each transaction's
changes, then its ``Commit`` (restart point: the merge's checkpoint at that transaction), and
a ``Progress`` whenever the low watermark moves (heartbeats) with nothing held back.

A stream starts with the query without a partition token at the saved start timestamp,
whose answer names the first partitions; each partition ends with a ``child_partitions``
record, and a child starts once all its parents have finished (``PartitionMerger.to_start``).
A partition query that fails for a transient reason is started again from where that
partition is complete, and what it sends twice is dropped; any other failure stops the
reader with a ``LogReaderError``.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import re
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from snapshotter.common.faults import failpoint
from snapshotter.core.position import Position
from snapshotter.sources.log import Commit, LogItem, LogReaderError, Progress
from snapshotter.sources.positions import LostPosition, StreamPositionLost
from snapshotter.sources.spanner.client import SpannerDialectKind, is_transient, reason
from snapshotter.sources.spanner.decoder import SpannerDecoder
from snapshotter.sources.spanner.merge import Child, MergeError, PartitionMerger, RecordKey
from snapshotter.sources.spanner.positions import position_text
from snapshotter.sources.spanner.records import (
    ChildPartitions,
    DataChange,
    Heartbeat,
    Record,
    googlesql_records,
    postgresql_records,
    transaction_order,
)

log = logging.getLogger(__name__)

_U64 = (1 << 64) - 1
_QUEUE_MESSAGES = 256  # rows of partition queries waiting for the engine: bounds memory
_RETRY_S = (0.2, 0.5, 1.0, 2.0, 5.0)
_RETRY_FOR_S = 300.0  # a partition failing transiently for longer stops the reader
_PARTITION_TOKEN = re.compile(r"\s*Received partition_token: \S+")


def resume_start(start_us: int, change_stream: str) -> dict[str, Any]:
    """A restart point that starts the stream at ``start_us`` (no partition read yet)."""
    return {"change_stream": change_stream, "start_us": start_us}


@dataclass(frozen=True, slots=True)
class _Rows:
    token: str | None  # None: the query without a token (the first partitions)
    records: list[Record]


@dataclass(frozen=True, slots=True)
class _Ended:
    token: str | None
    error: BaseException | None = None


class _PartitionQuery(threading.Thread):
    """One partition's query, from ``start_us`` until the partition ends."""

    def __init__(
        self,
        reader: SpannerLogReader,
        token: str | None,
        start_us: int,
    ) -> None:
        super().__init__(name=f"spanner-partition-{(token or 'root')[:12]}", daemon=True)
        self.reader = reader
        self.token = token
        self.start_us = start_us

    def run(self) -> None:
        reader = self.reader
        try:
            failpoint("spanner.partition_query")
            for records in reader.query_partition(self.token, self.start_us):
                if reader.stopping.is_set():
                    return
                reader.put(_Rows(self.token, records))
        except BaseException as exc:  # handed to the engine's thread, which decides
            reader.put(_Ended(self.token, exc))
            return
        reader.put(_Ended(self.token))


@dataclass
class _PartitionSeen:
    """What one partition sent at its latest commit timestamp: a query started again from
    there sends it again."""

    at_us: int = -1
    keys: set[RecordKey] | None = None
    failures: int = 0
    failing_since: float | None = None


class SpannerLogReader:
    def __init__(
        self,
        *,
        database: Any,
        dialect: SpannerDialectKind,
        change_stream: str,
        heartbeat_ms: int,
        decoder: SpannerDecoder,
        resume: Mapping[str, Any],
    ) -> None:
        self._database = database
        self._dialect = dialect
        self._change_stream = change_stream
        self._heartbeat_ms = heartbeat_ms
        self._decoder = decoder
        self._queue: queue.Queue[_Rows | _Ended] = queue.Queue(_QUEUE_MESSAGES)
        self.stopping = threading.Event()
        self._lock = threading.Lock()  # the merger: read() and confirm()
        self._seen: dict[str, _PartitionSeen] = {}
        self._mark: int | None = None  # the low watermark last reported
        self._threads: list[_PartitionQuery] = []
        self._sql = _stream_sql(dialect, change_stream)
        self._root_start = 0  # where the query without a token starts (a fresh stream)
        self._roots: list[Child] = []  # what it named so far
        saved = resume.get("partitions")
        if saved is not None:
            try:
                self._merger = PartitionMerger.restored(saved)
            except (MergeError, KeyError, TypeError) as exc:
                raise LogReaderError(
                    f"the saved change-stream partitions cannot be read ({exc}); run "
                    "`snapshotter reset-stream` and snapshot the tables again"
                ) from exc
            log.debug("change stream %s: resuming from %s", change_stream, saved)
            for token, start in self._merger.restart_points():
                self._start(token, start)
            for token, start in self._merger.to_start():
                self._start(token, start)
        else:
            self._merger = PartitionMerger()
            self._root_start = int(resume["start_us"])
            self._start(None, self._root_start)

    # --- the queries (threads) ------------------------------------------------------------

    def _start(self, token: str | None, start_us: int) -> None:
        thread = _PartitionQuery(self, token, start_us)
        self._threads = [t for t in self._threads if t.is_alive()]
        self._threads.append(thread)
        thread.start()

    def put(self, message: _Rows | _Ended) -> None:
        while not self.stopping.is_set():
            try:
                self._queue.put(message, timeout=0.5)
                return
            except queue.Full:
                continue

    def query_partition(self, token: str | None, start_us: int) -> Any:
        """Yield the records of each row the partition's query returns (blocking)."""
        return stream_records(
            self._database, self._dialect, self._sql, token, start_us, None, self._heartbeat_ms
        )

    # --- LogReader --------------------------------------------------------------------------

    def read(self, timeout: float) -> list[LogItem]:
        items: list[LogItem] = []
        try:
            message = self._queue.get(timeout=timeout)
        except queue.Empty:
            return items
        with self._lock:
            while True:
                self._handle(message)
                if self._queue.empty() or len(items) > 2000:
                    break
                message = self._queue.get_nowait()
                items.extend(self._released())
            items.extend(self._released())
        return items

    def _handle(self, message: _Rows | _Ended) -> None:
        merger = self._merger
        token = message.token
        if isinstance(message, _Ended):
            if message.error is not None:
                self._failed(token, message.error)
            elif token is not None:
                merger.finished(token)
                self._seen.pop(token, None)
            else:
                # All of them at once: a checkpoint naming only some first partitions would
                # lose the others' records for good.
                for child in self._roots:
                    if merger.add_root(child.token, child.start_us):
                        self._start(child.token, child.start_us)
            for ready, start in merger.to_start():
                self._start(ready, start)
            return
        seen = self._seen.get(token or "")
        if seen is not None and seen.failing_since is not None:
            seen.failures, seen.failing_since = 0, None  # answering again
        for record in message.records:
            if token is None:  # the first partitions: merged once the query has returned
                if isinstance(record, ChildPartitions):
                    self._roots.extend(record.children)
                continue
            if isinstance(record, DataChange):
                key = RecordKey(
                    record.commit_us,
                    f"{transaction_order(record.transaction):016x}",
                    record.sequence,
                )
                if self._again(token, key):
                    continue
                merger.data(token, key, (record, token))
            elif isinstance(record, Heartbeat):
                merger.heartbeat(token, record.at_us)
            else:
                merger.child_partitions(token, record.start_us, record.children)
                failpoint("spanner.partition_end")
                log.debug(
                    "change stream %s: partition %s... ends at %s, children %s",
                    self._change_stream,
                    token[:12],
                    record.start_us,
                    [c.token[:12] for c in record.children],
                    extra={"partition_end_us": record.start_us},
                )

    def _again(self, token: str, key: RecordKey) -> bool:
        """Whether the partition sent this record already (a query started again, from the
        commit timestamp of the last record it had sent: only records of that timestamp come
        twice). An older record is no repeat: the merger refuses it (out of order)."""
        seen = self._seen.setdefault(token, _PartitionSeen())
        if key.commit_us < seen.at_us:
            return False
        if key.commit_us > seen.at_us:
            seen.at_us, seen.keys = key.commit_us, set()
        assert seen.keys is not None
        if key in seen.keys:
            return True
        seen.keys.add(key)
        return False

    def _failed(self, token: str | None, error: BaseException) -> None:
        what = f"change stream {self._change_stream}"
        lost = lost_reason(error)
        if lost is not None:
            raise self._lost(lost, error)
        if not is_transient(error):
            raise LogReaderError(f"{what}: a partition query failed: {reason(error)}") from error
        seen = self._seen.setdefault(token or "", _PartitionSeen())
        now = time.monotonic()
        seen.failing_since = seen.failing_since or now
        if now - seen.failing_since > _RETRY_FOR_S:
            raise LogReaderError(
                f"{what}: a partition query kept failing for {_RETRY_FOR_S:.0f} s: {reason(error)}"
            ) from error
        delay = _RETRY_S[min(seen.failures, len(_RETRY_S) - 1)]
        seen.failures += 1
        log.warning(
            "%s: a partition query failed (%s); again in %.1f s", what, reason(error), delay
        )
        if token is None:
            self._roots.clear()  # the query is asked again, whole
        # From where the partition is complete: what it sends twice is dropped.
        start = self._root_start if token is None else self._merger.restart_point(token)
        timer = threading.Timer(delay, self._start, (token, start))
        timer.daemon = True
        timer.start()

    def _lost(self, said: str, error: BaseException) -> LogReaderError:
        """The saved position is gone (the stream was dropped and created again, or its
        retention passed): the lost-position message, kept as the cause for the CLI."""
        at = (
            self._resume(self._merger.checkpoint())
            if self._merger.live_tokens
            else resume_start(self._root_start, self._change_stream)
        )
        lost = StreamPositionLost(
            LostPosition(
                f"change stream {self._change_stream} can no longer be read from where the "
                f"engine was (Spanner: {said}); it was dropped and created again, or its "
                "retention_period passed",
                position_text(at) or "its start",
            )
        )
        lost.__cause__ = error
        stopped = LogReaderError(str(lost))
        stopped.__cause__ = lost
        return stopped

    def _released(self) -> list[LogItem]:
        merger = self._merger
        items: list[LogItem] = []
        current: tuple[int, str] | None = None
        for key, (record, partition) in merger.release():
            group = (key.commit_us, key.transaction)
            if current is not None and group != current:
                items.append(self._commit(*current))
            current = group
            items.extend(self._decoder.changes(record, partition))
        if current is not None:
            items.append(self._commit(*current))
        mark = merger.low_watermark()
        if mark is not None and mark != self._mark and merger.buffered == 0:
            self._mark = mark
            items.append(Progress(self._resume(merger.checkpoint()), mark))
        return items

    def _commit(self, commit_us: int, transaction: str) -> Commit:
        order = int(transaction, 16)
        return Commit(
            xid=0,
            position=Position(commit_us, order, _U64, 0),
            resume=self._resume(self._merger.checkpoint(restart_us=commit_us)),
            ts_ms=commit_us // 1000,
            log_offset=commit_us,
        )

    def _resume(self, partitions: dict[str, Any]) -> dict[str, Any]:
        return {"change_stream": self._change_stream, "partitions": partitions}

    def confirm(self, resume: Mapping[str, Any]) -> None:
        partitions = resume.get("partitions")
        if not partitions:
            return
        with self._lock:
            self._merger.forget_through(int(partitions["restart_us"]))

    def request_progress(self) -> None:
        return None  # heartbeats come every heartbeat_ms anyway

    def close(self) -> None:
        self.stopping.set()
        log.debug(
            "change stream %s: closing with partitions %s",
            self._change_stream,
            self._merger.checkpoint(),
        )
        # Queries end at their partition's end or their next row; none holds anything.
        with contextlib.suppress(queue.Empty):
            while True:
                self._queue.get_nowait()


def stream_records(
    database: Any,
    dialect: SpannerDialectKind,
    text: str,
    token: str | None,
    start_us: int,
    end_us: int | None,
    heartbeat_ms: int,
) -> Iterator[list[Record]]:
    """The records of each row a change stream query returns (blocking): a partition's
    (``token``), or the first partitions' (no token), from ``start_us`` to ``end_us`` (None:
    until the partition ends)."""
    from google.cloud.spanner_v1 import param_types

    names = (
        ("p1", "p2", "p3", "p4")
        if dialect is SpannerDialectKind.POSTGRESQL
        else ("start", "end", "token", "heartbeat")
    )
    end = None if end_us is None else _timestamp(end_us)
    values = (_timestamp(start_us), end, token, heartbeat_ms)
    kinds = (param_types.TIMESTAMP, param_types.TIMESTAMP, param_types.STRING, param_types.INT64)
    params = dict(zip(names, values, strict=True))
    types = dict(zip(names, kinds, strict=True))
    with database.snapshot() as snapshot:
        result = snapshot.execute_sql(text, params=params, param_types=types)
        if dialect is SpannerDialectKind.POSTGRESQL:
            for row in result:
                yield list(postgresql_records(row))
        else:
            field_type = None
            for row in result:
                if field_type is None:
                    field_type = result.fields[0].type_
                yield list(googlesql_records(row, field_type))


def unreadable_from(
    database: Any, dialect: SpannerDialectKind, change_stream: str, start_us: int
) -> str | None:
    """Why the change stream cannot be read from ``start_us`` (Spanner's words: the stream
    was dropped and created again after it, or its retention passed); None when it can. Asks
    for the first partitions at that one instant, which answers at once."""
    from google.api_core import exceptions as gexc

    text = _stream_sql(dialect, change_stream)
    try:
        for _ in stream_records(database, dialect, text, None, start_us, start_us, 1000):
            pass
    except gexc.GoogleAPICallError as exc:
        lost = lost_reason(exc)
        if lost is None:
            raise
        return lost
    return None


def lost_reason(exc: BaseException) -> str | None:
    """Spanner's words when a change stream query names a start the stream no longer has
    (before its creation, or past its retention) or a partition of a stream dropped since
    (one of the same name created again has other partitions); None for other errors."""
    from google.api_core import exceptions as gexc

    # Without the token it names: long, and of no use to a reader.
    said = _PARTITION_TOKEN.sub("", reason(exc))
    lower = said.lower()
    if isinstance(exc, gexc.OutOfRange) and "too far in the past" in lower:
        return said
    if isinstance(exc, gexc.InvalidArgument) and "does not belong to the change stream" in lower:
        return said
    return None


def _timestamp(us: int) -> Any:
    import datetime as dt

    return dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=us)


def _stream_sql(dialect: SpannerDialectKind, change_stream: str) -> str:
    # The stream's name is checked by the config (letters, digits, underscores) and is
    # part of the function's name, which no parameter can stand for.
    if dialect is SpannerDialectKind.POSTGRESQL:
        return f"SELECT * FROM spanner.read_json_{change_stream}($1, $2, $3, $4, null)"
    return (
        f"SELECT ChangeRecord FROM READ_{change_stream}(start_timestamp => @start, "
        "end_timestamp => @end, partition_token => @token, heartbeat_milliseconds => @heartbeat)"
    )

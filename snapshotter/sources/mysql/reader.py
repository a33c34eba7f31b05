"""The MySQL / MariaDB log reader: the binlog, streamed as a replica would read it.

mysql-replication's ``BinLogStreamReader`` asks the server for the binlog from a file and
offset (``COM_BINLOG_DUMP``, blocking: NOTES.md found its non-blocking GTID mode looping
forever on MariaDB), and a thread of ours turns its events into log items
(:class:`~snapshotter.sources.mysql.decoder.BinlogDecoder`) and queues them for the engine.

Restart points are the start of a transaction (``{"file", "pos", "gtid"}`` after a commit),
so the table maps are read again; the engine skips what it already emitted by position. If
the connection drops (server restart, network), the thread reconnects from the last
transaction boundary it handed over, skips the items it had already queued (positions are
stable), and goes on; only when the server stays unreachable for ``reconnect_for`` seconds,
or refuses the restart point (the binlog file was purged), does ``read`` raise a
``BinlogReaderError`` that says what to do.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.event import (
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    QueryEvent,
    RotateEvent,
    XidEvent,
)
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from snapshotter.common.faults import failpoint
from snapshotter.core.position import Position
from snapshotter.sources.log import (
    Change,
    Commit,
    LogItem,
    LogReaderError,
    Progress,
    TableShape,
)
from snapshotter.sources.mysql.decoder import BinlogDecoder, is_transaction_marker
from snapshotter.sources.positions import LostPosition, StreamPositionLost

log = logging.getLogger(__name__)

# The events the decoder needs; everything else is skipped before it is parsed.
_EVENTS = [
    WriteRowsEvent,
    UpdateRowsEvent,
    DeleteRowsEvent,
    XidEvent,
    GtidEvent,
    MariadbGtidEvent,
    QueryEvent,
    RotateEvent,
    HeartbeatLogEvent,
]
_HEARTBEAT_SECONDS = 1.0
# Parse a table's map once per table id, not before every transaction (2.1x the decode rate
# on one-row transactions, bench/log_bench.py binlog, which turns it off for "before"). A
# statement that may change a table drops the cached maps; a rotation does too.
FREEZE_TABLE_MAPS = True
_QUEUE_BATCHES = 64  # of at most _BATCH items: bounds memory when the engine is slower
_BATCH = 500
# Server errors that no reconnect can fix (ER_MASTER_FATAL_ERROR_READING_BINLOG: the file
# was purged or the position is not an event start; access denied).
_FATAL = {1236: "the server cannot send the binlog from there", 1045: "access denied"}


class BinlogReaderError(LogReaderError):
    """The binlog cannot be read; the message says why and what to do."""


class BinlogLogReader:
    """:class:`snapshotter.sources.log.LogReader` over a MySQL / MariaDB binlog."""

    def __init__(
        self,
        connect_args: Mapping[str, Any],
        *,
        server_id: int,
        decoder: BinlogDecoder,
        start: Mapping[str, Any],
        reconnect_for: float = 60.0,
    ) -> None:
        if not start.get("file") or not isinstance(start.get("pos"), int):
            raise BinlogReaderError(f"no binlog start point (file and pos) in {dict(start)!r}")
        self._settings = {
            "host": connect_args.get("host", "127.0.0.1"),
            "port": int(connect_args.get("port", 3306)),
            "user": connect_args.get("user", ""),
            "password": connect_args.get("password", connect_args.get("passwd", "")),
            "charset": "utf8mb4",
        }
        self._server_id = server_id
        self._decoder = decoder
        self._boundary = {"file": str(start["file"]), "pos": int(start["pos"])}
        if start.get("gtid"):
            self._boundary["gtid"] = start["gtid"]
        # Where this stream began (the engine saves it when state has no position yet).
        self.start_resume: Mapping[str, Any] = dict(self._boundary)
        self._reconnect_for = reconnect_for
        self._queue: queue.Queue[list[LogItem] | BaseException] = queue.Queue(_QUEUE_BATCHES)
        self._stopping = threading.Event()
        self._stream: BinLogStreamReader | None = None
        self._failure: BaseException | None = None
        self._last: Position | None = None  # the newest position queued
        self._thread = threading.Thread(target=self._run, name="binlog-reader", daemon=True)
        self._thread.start()

    # -- LogReader ----------------------------------------------------------------------------

    def read(self, timeout: float) -> list[LogItem]:
        if self._failure is not None:
            raise self._failure
        items: list[LogItem] = []
        try:
            first = self._queue.get(timeout=timeout)
        except queue.Empty:
            return items
        self._take(first, items)
        while len(items) < 5000:
            try:
                self._take(self._queue.get_nowait(), items)
            except queue.Empty:
                break
        return items

    def _take(self, batch: list[LogItem] | BaseException, items: list[LogItem]) -> None:
        if isinstance(batch, BaseException):
            self._failure = batch
            if items:
                return  # hand over what came before; raise on the next read
            raise batch
        items.extend(batch)

    def confirm(self, resume: Mapping[str, Any]) -> None:
        """Nothing to tell the server: it keeps binlogs by age (binlog_expire_logs_seconds /
        expire_logs_days), not by what replicas confirmed."""

    def request_progress(self) -> None:
        """Heartbeats (every second while the binlog is idle) report progress already."""

    def close(self) -> None:
        self._stopping.set()
        # The thread wakes at the next event or heartbeat (every second) and ends; only a
        # server that sends nothing is cut off (mysql-replication would log a reconnect).
        self._thread.join(3 * _HEARTBEAT_SECONDS)
        stream = self._stream
        if self._thread.is_alive() and stream is not None:
            _shutdown(stream)
            self._thread.join(10)

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        failing_since: float | None = None
        while not self._stopping.is_set():
            try:
                self._stream_from(dict(self._boundary))
                return
            except pymysql.err.OperationalError as exc:
                code = exc.args[0] if exc.args else None
                if self._stopping.is_set():
                    return
                if code in _FATAL:
                    self._fail(self._fatal_error(code, exc))
                    return
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since > self._reconnect_for:
                    self._fail(
                        BinlogReaderError(
                            f"the binlog connection failed and the server did not come back "
                            f"within {self._reconnect_for:.0f} s: {exc.args[-1]}; run again "
                            "(snapshotter resume) once the server is up"
                        )
                    )
                    return
                log.warning("binlog connection lost (%s); reconnecting", exc.args[-1])
                time.sleep(1.0)
            except Exception as exc:
                if self._stopping.is_set():
                    return
                # Said with where the reader was (a bug, or an event it cannot decode): the
                # engine stops with it, never waits on a reader that is gone.
                self._fail(exc if isinstance(exc, LogReaderError) else self._read_error(exc))
                return
            finally:
                self._close_stream()

    def _fatal_error(self, code: int, exc: BaseException) -> BinlogReaderError:
        where = f"{self._boundary['file']} at {self._boundary['pos']}"
        detail = exc.args[-1] if exc.args else exc
        if code == 1236:
            # The message of a lost position (what to run: reset-stream, execute-snapshot),
            # kept as the cause so that the CLI can name the config file and the tables.
            lost = StreamPositionLost(
                LostPosition(
                    f"the server cannot send the binlog from {where}: {detail}. The binlog "
                    "file was probably purged (binlog_expire_logs_seconds / "
                    "expire_logs_days, or PURGE BINARY LOGS; keep binlogs longer than the "
                    "engine may be stopped), or binary logging was reset",
                    f"binlog file {where}",
                )
            )
            error = BinlogReaderError(str(lost))
            error.__cause__ = lost
            return error
        return BinlogReaderError(f"reading the binlog from {where} failed: {detail}")

    def _read_error(self, exc: Exception) -> BinlogReaderError:
        where = f"{self._boundary['file']} at {self._boundary['pos']}"
        detail = " ".join(str(exc).split()) or "no message"
        error = BinlogReaderError(
            f"reading the binlog after {where} failed: {type(exc).__name__}: {detail}"
        )
        error.__cause__ = exc
        return error

    def _fail(self, exc: BaseException) -> None:
        self._put(exc)

    def _put(self, item: list[LogItem] | BaseException) -> None:
        while not self._stopping.is_set():
            try:
                self._queue.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def _stream_from(self, start: dict[str, Any]) -> None:
        stream = BinLogStreamReader(
            connection_settings=dict(self._settings),
            server_id=self._server_id,
            blocking=True,
            resume_stream=True,
            log_file=start["file"],
            log_pos=start["pos"],
            only_events=_EVENTS,
            slave_heartbeat=_HEARTBEAT_SECONDS,
            enable_logging=False,
            freeze_schema=FREEZE_TABLE_MAPS,
        )
        self._stream = stream
        decoder = self._decoder
        decoder.start(start["file"])
        batch: list[LogItem] = []
        last = self._last
        # After a reconnect the stream reads again what an earlier stream queued (up to
        # ``replayed_upto``); skip it, then stop checking.
        replayed_upto = self._last
        while not self._stopping.is_set():
            event = stream.fetchone()
            failpoint("binlog.read")
            if event is None:  # the server ended the dump (not in blocking mode)
                raise pymysql.err.OperationalError(2013, "the server ended the binlog dump")
            if isinstance(event, QueryEvent) and not is_transaction_marker(_text(event.query)):
                stream.table_map.clear()
            items = decoder.feed(event)
            if items and replayed_upto is not None:
                items, replayed_upto = _after(items, replayed_upto)
            batch.extend(items)
            if batch and (not decoder.in_transaction or len(batch) >= _BATCH):
                boundary = _boundary_of(batch)
                for item in reversed(batch):
                    pos = _position(item)
                    if pos is not None:
                        last = pos
                        break
                self._put(batch)
                self._last = last
                if boundary is not None:
                    self._boundary = boundary
                batch = []

    def _close_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            with contextlib.suppress(Exception):  # closing a dead connection
                stream.close()


def _text(query: str | bytes) -> str:
    return query if isinstance(query, str) else bytes(query).decode("utf-8", "replace")


def _after(items: list[LogItem], upto: Position) -> tuple[list[LogItem], Position | None]:
    """The items positioned after ``upto``, and the unpositioned ones; with ``upto`` again,
    or None once an item past it shows that the rest of the stream is new (positions only
    grow)."""
    for index, item in enumerate(items):
        pos = _position(item)
        if pos is not None and pos > upto:
            return [i for i in items[:index] if _position(i) is None] + items[index:], None
    return [i for i in items if _position(i) is None], upto


def _position(item: LogItem) -> Position | None:
    if isinstance(item, Change):
        return item.event.position
    if isinstance(item, Commit):
        return item.position
    return None


def _boundary_of(batch: list[LogItem]) -> dict[str, Any] | None:
    for item in reversed(batch):
        if isinstance(item, Commit | Progress):
            return dict(item.resume)
        if isinstance(item, TableShape):
            continue
    return None


def _shutdown(stream: BinLogStreamReader) -> None:
    """Wake the thread blocked in the stream's socket read."""
    conn = getattr(stream, "_stream_connection", None)
    sock = getattr(conn, "_sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

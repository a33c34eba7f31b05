"""PostgreSQL's log, read by streaming logical replication (pgoutput), with bounded memory.

This module only moves bytes: it opens a replication connection, starts streaming from the
slot, hands each XLogData payload to the pure ``PgOutputDecoder`` and answers keepalives.
psycopg has no replication API of its own (its issue #71), so this speaks the protocol at the
libpq level: ``START_REPLICATION`` puts the connection in COPY BOTH mode, frames arrive with
``get_copy_data`` and standby status updates go back with ``put_copy_data``.

Memory: pgoutput (protocol 1) sends a transaction's changes one message at a time after its
commit; each ``read`` returns at most ``max_items`` items, and the engine writes them on before
reading more, so a large transaction is never held whole (the server spills it to disk).

Lost connections (a server restart, a failover of the network): ``read`` reconnects, with a
backoff from 0.5 s doubling to 5 s, for up to ``reconnect_for`` seconds, and streams again
from the end of the last transaction it handed over completely. The server then sends the
transaction that was being handed over again from its start; positions are stable and
totally ordered, so the items already handed over (up to the newest position handed over)
are dropped and the engine sees every item exactly once. What no reconnect can fix (the slot
or the publication is missing or invalid, authentication, permissions) raises a
``LogReaderError`` with the server's message at once; so does an outage past the bound.
"""

from __future__ import annotations

import logging
import os
import select
import struct
import time
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import pq, sql
from psycopg.conninfo import conninfo_to_dict

from snapshotter.core.position import Position
from snapshotter.dialects.postgres import pg_error_is_transient
from snapshotter.logs.base import Change, Commit, LogItem, Progress
from snapshotter.logs.pg_decoder import PgOutputDecoder

log = logging.getLogger(__name__)

_PG_EPOCH_US = 946_684_800_000_000  # 2000-01-01 in Unix microseconds
_XLOG_DATA = struct.Struct("!QQq")  # after b"w": WAL start, WAL end, send time
_KEEPALIVE = struct.Struct("!QqB")  # after b"k": WAL end, send time, reply requested
_STATUS = struct.Struct("!QQQqB")  # after b"r": written, flushed, applied, time, reply
_FEEDBACK_INTERVAL_S = 10.0  # well inside the default wal_sender_timeout of 60 s

# How long a lost replication connection is retried (the ``reconnect_for`` parameter; this
# default when it is None), and the backoff between attempts.
RECONNECT_FOR_S = 60.0
# At the first START_REPLICATION: the slot is still active for a gone client's walsender
# (55006), the server is starting up (57P03).
_WAIT_AT_START = frozenset({"55006", "57P03"})
RECONNECT_FIRST_S = 0.5
RECONNECT_MAX_S = 5.0
_CONNECT_TIMEOUT_S = 10  # per attempt, unless the URL or PGCONNECT_TIMEOUT says otherwise
# The slot is still held by the walsender of a connection that died without the server
# noticing yet (it does within wal_sender_timeout): worth waiting for.
_SLOT_IN_USE = "55006"


# pgoutput sends values as text made in this session's backend: pin every setting that shapes
# that text to what the chunk reader's session uses, so both paths load identical values.
SESSION_OPTIONS = (
    "-c TimeZone=UTC -c DateStyle=ISO,MDY -c IntervalStyle=postgres -c bytea_output=hex "
    "-c extra_float_digits=1"
)


class LogReaderError(RuntimeError):
    """The replication stream failed; the message says why and what to check."""


def lsn_to_int(text: str) -> int:
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


def int_to_lsn(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


class PgLogReader:
    """Streams ``slot`` through ``decoder``; implements ``snapshotter.logs.base.LogReader``."""

    def __init__(
        self,
        conninfo: str,
        *,
        slot: str,
        publication: str,
        decoder: PgOutputDecoder,
        start_lsn: int = 0,
        max_items: int = 5000,
        reconnect_for: float | None = None,
    ) -> None:
        self._conninfo = conninfo
        self._slot = slot
        self._publication = publication
        self._decoder = decoder
        self._max_items = max_items
        self._reconnect_for = RECONNECT_FOR_S if reconnect_for is None else reconnect_for
        self._received = start_lsn  # highest WAL end seen in a frame
        self._flushed = start_lsn  # what state has made durable (sent as flush/apply)
        self._in_txn = False
        self._last_feedback = 0.0
        # Where a new connection streams from: the end of the last transaction handed over
        # completely (or a keepalive's WAL end between transactions).
        self._restart_lsn = start_lsn
        self._last: Position | None = None  # the newest position handed over
        self._skip_upto: Position | None = None  # after a reconnect: handed over already
        self._lost_since: float | None = None  # the current outage began
        self._retry_at = 0.0
        self._delay = RECONNECT_FIRST_S
        self._last_error = ""
        # What outages cost (for logs and tests): losses, seconds without a stream, items the
        # server sent again and that were dropped.
        self.reconnects = 0
        self.outage_seconds = 0.0
        self.dropped_again = 0
        self._dropped_now = 0
        self._server = _server_name(conninfo)
        self._conn: psycopg.Connection[Any] | None = None
        self._pgconn: pq.abc.PGconn | None = None
        self._open_first()

    def _open_first(self) -> None:
        """The first START_REPLICATION. Waits (up to ``reconnect_for``) only while the slot is
        still held by a walsender whose client is gone (a killed engine's: the server notices
        within moments, or at wal_sender_timeout) or the server is starting up; any other
        error is the configuration's, said at once."""
        began = time.monotonic()
        delay = RECONNECT_FIRST_S
        while True:
            try:
                conn = self._connect()
            except psycopg.Error as exc:
                if (
                    exc.sqlstate in _WAIT_AT_START
                    and time.monotonic() - began < self._reconnect_for
                ):
                    time.sleep(delay)
                    delay = min(delay * 2, RECONNECT_MAX_S)
                    continue
                raise LogReaderError(
                    f"cannot open a replication connection to {self._server}: {_text(exc)}"
                ) from None
            try:
                self._start(conn)
                return
            except psycopg.Error as exc:
                if (
                    exc.sqlstate in _WAIT_AT_START
                    and time.monotonic() - began < self._reconnect_for
                ):
                    log.info("slot %s is still in use (%s); waiting", self._slot, _text(exc))
                    time.sleep(delay)
                    delay = min(delay * 2, RECONNECT_MAX_S)
                    continue
                raise LogReaderError(
                    f"cannot stream slot {self._slot!r} with publication "
                    f"{self._publication!r} from {self._server}: {_text(exc)}; run "
                    "`snapshotter init` to create them"
                ) from None

    # -- connecting ------------------------------------------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        extra: dict[str, Any] = {}
        if "connect_timeout" not in conninfo_to_dict(self._conninfo) and not os.environ.get(
            "PGCONNECT_TIMEOUT"
        ):
            extra["connect_timeout"] = _CONNECT_TIMEOUT_S
        return psycopg.connect(
            self._conninfo,
            replication="database",
            autocommit=True,
            options=SESSION_OPTIONS,
            **extra,
        )

    def _start(self, conn: psycopg.Connection[Any]) -> None:
        """START_REPLICATION from ``_restart_lsn`` on ``conn`` (closed if that fails)."""
        command = sql.SQL(
            "START_REPLICATION SLOT {} LOGICAL {} "
            "(proto_version '1', publication_names {}, messages 'true')"
        ).format(
            sql.Identifier(self._slot),
            sql.SQL(int_to_lsn(self._restart_lsn)),
            sql.Literal(sql.Identifier(self._publication).as_string(conn)),
        )
        try:
            conn.cursor().execute(command)
            if conn.pgconn.transaction_status is pq.TransactionStatus.UNKNOWN:
                raise psycopg.OperationalError("the replication connection was lost at start")
        except BaseException:
            conn.close()
            raise
        self._conn, self._pgconn = conn, conn.pgconn

    def _lost(self, message: str, sqlstate: str | None) -> None:
        """The stream broke: raise if no reconnect can fix it, else plan the reconnect."""
        self._drop_connection()
        message = " ".join(message.split()) or "the server ended the stream"
        if not self._retryable(sqlstate, message):
            raise LogReaderError(
                f"the replication stream from {self._server} (slot {self._slot!r}, "
                f"publication {self._publication!r}) failed: {message}"
            )
        now = time.monotonic()
        self._last_error = message
        if self._lost_since is None:
            self._lost_since = now
            self._delay = RECONNECT_FIRST_S
            log.warning(
                "replication connection to %s (slot %s) lost: %s; reconnecting for up to %.0f s",
                self._server,
                self._slot,
                message,
                self._reconnect_for,
            )
        self._retry_at = now + self._delay

    def _reconnect(self, deadline: float) -> bool:
        """One attempt, when the backoff allows (waiting for it at most until ``deadline``);
        whether the stream is back."""
        now = time.monotonic()
        if now < self._retry_at:
            wait = min(deadline, self._retry_at) - now
            if wait > 0:
                time.sleep(wait)
            if time.monotonic() < self._retry_at:
                return False
        lost_since = self._lost_since if self._lost_since is not None else now
        try:
            conn = self._connect()
            self._start(conn)
        except psycopg.Error as exc:
            message = _text(exc)
            if not self._retryable(exc.sqlstate, message):
                raise LogReaderError(
                    f"cannot stream slot {self._slot!r} with publication "
                    f"{self._publication!r} from {self._server} again after the connection "
                    f"was lost: {message}"
                ) from None
            now = time.monotonic()
            self._last_error = message
            if now - lost_since >= self._reconnect_for:
                raise LogReaderError(
                    f"the replication connection to {self._server} (slot {self._slot!r}) "
                    f"was lost and the server did not come back within "
                    f"{self._reconnect_for:.0f} s ({message}). Nothing is lost: the state is "
                    "saved and the slot keeps the log from there; run `snapshotter resume` "
                    "once the server is up"
                ) from None
            log.debug("reconnecting to %s failed: %s", self._server, message)
            self._delay = min(self._delay * 2, RECONNECT_MAX_S)
            self._retry_at = now + self._delay
            return False
        took = time.monotonic() - lost_since
        self.reconnects += 1
        self.outage_seconds += took
        self._lost_since = None
        self._delay = RECONNECT_FIRST_S
        # The server sends again from the start of the transaction that was being handed
        # over (if one was): the decoder starts over, and what was handed over is dropped.
        self._decoder.restart()
        self._skip_upto = self._last
        self._dropped_now = 0
        self._last_feedback = 0.0  # tell the new walsender at once what state has saved
        log.warning(
            "replication connection to %s restored after %.1f s; streaming slot %s again from %s",
            self._server,
            took,
            self._slot,
            int_to_lsn(self._restart_lsn),
        )
        return True

    def _retryable(self, sqlstate: str | None, message: str) -> bool:
        return sqlstate == _SLOT_IN_USE or pg_error_is_transient(sqlstate, message)

    def _drop_connection(self) -> None:
        conn, self._conn, self._pgconn = self._conn, None, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # closing a broken connection
                log.debug("closing the lost replication connection failed", exc_info=True)

    # -- reading ---------------------------------------------------------------------------

    def read(self, timeout: float) -> list[LogItem]:
        items: list[LogItem] = []
        deadline = time.monotonic() + timeout
        while len(items) < self._max_items:
            pgconn = self._pgconn
            if pgconn is None:
                # Hand over what came before the loss first; then reconnect.
                if items or not self._reconnect(deadline):
                    break
                continue
            try:
                nbytes, data = pgconn.get_copy_data(1)
                if nbytes == 0:
                    if items:
                        break
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    ready, _, _ = select.select([pgconn.socket], [], [], remaining)
                    if ready:
                        pgconn.consume_input()
                    continue
            except (psycopg.Error, OSError) as exc:
                self._lost(_text(exc), getattr(exc, "sqlstate", None))
                continue
            if nbytes < 0:
                self._ended(pgconn)
                continue
            self._frame(bytes(data), items)
        if self._pgconn is not None and time.monotonic() - self._last_feedback > (
            _FEEDBACK_INTERVAL_S
        ):
            self._feedback(reply=False)
        return items

    def _ended(self, pgconn: pq.abc.PGconn) -> None:
        """The server ended the COPY: its error (if it sent one) says whether to retry."""
        message, sqlstate = "", None
        try:
            result = pgconn.get_result()
            if result is not None and result.status == pq.ExecStatus.FATAL_ERROR:
                message = (result.error_message or b"").decode("utf-8", "replace")
                field = result.error_field(pq.DiagnosticField.SQLSTATE)
                sqlstate = field.decode() if field else None
        except psycopg.Error as exc:
            message = _text(exc)
        if not message:
            message = pgconn.get_error_message() or "the server ended the stream"
        self._lost(message, sqlstate)

    def _frame(self, frame: bytes, items: list[LogItem]) -> None:
        kind = frame[:1]
        if kind == b"w":
            wal_start, wal_end, _ = _XLOG_DATA.unpack_from(frame, 1)
            payload = frame[1 + _XLOG_DATA.size :]
            self._received = max(self._received, wal_end)
            tag = payload[:1]
            if tag == b"B":
                self._in_txn = True
            decoded = self._decoder.feed(payload, wal_start)
            if tag == b"C":
                self._in_txn = False
            for item in decoded:
                if isinstance(item, Change | Commit):
                    position = item.event.position if isinstance(item, Change) else item.position
                    if self._skip_upto is not None:
                        if position <= self._skip_upto:
                            self.dropped_again += 1
                            self._dropped_now += 1
                            continue
                        self._skip_upto = None  # positions only grow: the rest is new
                        if self._dropped_now:
                            log.info(
                                "after the reconnect the server sent %d items again that "
                                "were handed over already: dropped",
                                self._dropped_now,
                            )
                    self._last = position
                    if isinstance(item, Commit):
                        self._restart_lsn = max(self._restart_lsn, int(item.resume["lsn"]))
                items.append(item)
        elif kind == b"k":
            wal_end, _, reply = _KEEPALIVE.unpack_from(frame, 1)
            self._received = max(self._received, wal_end)
            # Not while a transaction is open, nor while one handed over in part before a
            # reconnect is being sent again (_in_txn stays set until its Commit).
            # Nor below where this stream started: while the walsender re-reads WAL from the
            # slot's restart_lsn its keepalives report positions before the saved one, and
            # saving one of those would move the state back behind the slot.
            if not self._in_txn and wal_end >= self._restart_lsn:
                # Everything committed before wal_end has been sent: restarting from here
                # loses nothing, and `--until-caught-up` may compare it with the log end.
                items.append(Progress(resume={"lsn": wal_end}, log_offset=wal_end))
                self._restart_lsn = max(self._restart_lsn, wal_end)
            if reply:
                self._feedback(reply=False)

    def _feedback(self, *, reply: bool) -> None:
        pgconn = self._pgconn
        if pgconn is None:
            return  # sent on the next connection
        now_us = time.time_ns() // 1000 - _PG_EPOCH_US
        message = b"r" + _STATUS.pack(self._received, self._flushed, self._flushed, now_us, reply)
        try:
            pgconn.put_copy_data(message)
            pgconn.flush()
        except psycopg.Error as exc:
            self._lost(_text(exc), exc.sqlstate)  # the next read reconnects
            return
        self._last_feedback = time.monotonic()

    def confirm(self, resume: Mapping[str, Any]) -> None:
        lsn = int(resume["lsn"])
        if lsn > self._flushed:
            self._flushed = lsn
            self._feedback(reply=False)

    def request_progress(self) -> None:
        self._feedback(reply=True)

    def close(self) -> None:
        conn = self._conn
        try:
            if conn is not None and not conn.closed and self._flushed:
                self._feedback(reply=False)
        except (psycopg.Error, LogReaderError):
            pass  # closing anyway; the slot keeps the last position it was told
        self._drop_connection()


def _text(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _server_name(conninfo: str) -> str:
    """host:port/database of a libpq URL or DSN, without credentials (for messages)."""
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.Error:
        return "the PostgreSQL server"
    host = str(params.get("host") or os.environ.get("PGHOST") or "localhost")
    port = str(params.get("port") or os.environ.get("PGPORT") or "5432")
    database = str(params.get("dbname") or os.environ.get("PGDATABASE") or "")
    return f"{host}:{port}/{database}"

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
``PgReaderError`` with the server's message at once; so does an outage past the bound.
"""

from __future__ import annotations

import logging
import os
import select
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import pq, sql
from psycopg.conninfo import conninfo_to_dict

from snapshotter.core.position import Position
from snapshotter.sources.log import Change, Commit, LogItem, LogReaderError, Progress
from snapshotter.sources.postgres.decoder import PgOutputDecoder
from snapshotter.sources.postgres.slots import lsn_text
from snapshotter.sources.postgres.transient import pg_error_is_transient

log = logging.getLogger(__name__)

_PG_EPOCH_US = 946_684_800_000_000  # 2000-01-01 in Unix microseconds
_XLOG_DATA = struct.Struct("!QQq")  # after b"w": WAL start, WAL end, send time
_KEEPALIVE = struct.Struct("!QqB")  # after b"k": WAL end, send time, reply requested
_STATUS = struct.Struct("!QQQqB")  # after b"r": written, flushed, applied, time, reply
_FEEDBACK_INTERVAL_S = 10.0  # well inside the default wal_sender_timeout of 60 s

# How long a lost replication connection is retried (the ``reconnect_for`` parameter; this
# default when it is None), and the backoff between attempts.
RECONNECT_FOR_S = 60.0
_STARTING_UP = "57P03"  # the server is starting up: worth waiting for at the first start
_UNDEFINED_OBJECT = "42704"  # the slot (or publication) does not exist
# A slot held by another walsender: its client may be gone (a killed engine), so it is
# always waited for this long; after it, a holder is judged live unless it has been silent
# for longer than SILENT_S (see slot_holder_may_be_dying).
BUSY_GRACE_S = 5.0
SILENT_S = 15.0
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


class PgReaderError(LogReaderError):
    """The replication stream failed; the message says why and what to check."""


@dataclass(frozen=True, slots=True)
class SlotHolder:
    """The walsender that holds a slot (from pg_replication_slots / pg_stat_replication)."""

    pid: int
    application: str | None
    client: str | None  # its client's address
    last_reply: float | None  # when its client last replied (epoch seconds)
    silent_s: float | None  # seconds since then (or since it started, if never)


class PgLogReader:
    """Streams ``slot`` through ``decoder``; implements ``snapshotter.sources.log.LogReader``."""

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
        """The first START_REPLICATION. Waits (up to ``reconnect_for``) only while the server
        is starting up, or while the slot is held by a walsender whose client is gone (a
        killed engine's: the server notices within moments, or at wal_sender_timeout after
        a network loss); a slot another live client streams from is said at once (see
        ``_slot_in_use``), and any other error is the configuration's, said at once."""
        began = time.monotonic()
        delay = RECONNECT_FIRST_S
        first_reply: float | None = None  # the holder's last reply when first seen
        while True:
            waited = time.monotonic() - began
            try:
                conn = self._connect()
            except psycopg.Error as exc:
                if exc.sqlstate == _STARTING_UP and waited < self._reconnect_for:
                    time.sleep(delay)
                    delay = min(delay * 2, RECONNECT_MAX_S)
                    continue
                raise PgReaderError(
                    f"cannot open a replication connection to {self._server}: {_text(exc)}"
                    f"{_connect_fix(exc)}"
                ) from None
            try:
                self._start(conn)
                return
            except psycopg.Error as exc:
                if exc.sqlstate == _SLOT_IN_USE:
                    holder = self._slot_holder()
                    if holder is not None and first_reply is None:
                        first_reply = holder.last_reply
                    if slot_holder_may_be_dying(holder, first_reply, waited, self._reconnect_for):
                        log.info("slot %s is still in use (%s); waiting", self._slot, _text(exc))
                        time.sleep(min(delay, 1.0))
                        delay = min(delay * 2, RECONNECT_MAX_S)
                        continue
                    raise PgReaderError(self._in_use(holder, exc)) from None
                if exc.sqlstate == _STARTING_UP and waited < self._reconnect_for:
                    time.sleep(delay)
                    delay = min(delay * 2, RECONNECT_MAX_S)
                    continue
                missing = exc.sqlstate == _UNDEFINED_OBJECT
                raise PgReaderError(
                    f"cannot stream slot {self._slot!r} with publication "
                    f"{self._publication!r} from {self._server}: {_text(exc)}"
                    + ("; run `snapshotter init` to create them" if missing else "")
                ) from None

    # -- a slot another client holds ---------------------------------------------------------

    def _slot_holder(self) -> SlotHolder | None:
        """Who holds the slot now (None: nobody, or it cannot be told)."""
        try:
            with psycopg.connect(self._conninfo, autocommit=True, connect_timeout=10) as conn:
                row = conn.execute(
                    "SELECT s.active_pid, r.application_name, r.client_addr::text, "
                    "EXTRACT(EPOCH FROM r.reply_time)::float8, "
                    "EXTRACT(EPOCH FROM now() - COALESCE(r.reply_time, r.backend_start))::float8 "
                    "FROM pg_replication_slots s "
                    "LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid "
                    "WHERE s.slot_name = %s AND s.active",
                    (self._slot,),
                ).fetchone()
        except psycopg.Error as exc:
            log.debug("cannot tell who holds slot %s: %s", self._slot, _text(exc))
            return None
        if row is None or row[0] is None:
            return None
        return SlotHolder(
            pid=row[0], application=row[1], client=row[2], last_reply=row[3], silent_s=row[4]
        )

    def _in_use(self, holder: SlotHolder | None, exc: psycopg.Error) -> str:
        if holder is None:
            who = _text(exc)
        else:
            parts = [f"walsender pid {holder.pid}"]
            if holder.application:
                parts.append(f"client {holder.application!r}")
            if holder.client:
                parts.append(f"from {holder.client}")
            if holder.silent_s is not None:
                parts.append(f"last heard from {holder.silent_s:.0f} s ago")
            who = ", ".join(parts)
        return (
            f"replication slot {self._slot!r} on {self._server} is in use by another process "
            f"({who}): another engine or client streams from it. Stop that process, or give "
            "this engine its own slot ([source] slot) and state directory"
        )

    # -- connecting ------------------------------------------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        extra: dict[str, Any] = {}
        given = conninfo_to_dict(self._conninfo)
        if "connect_timeout" not in given and not os.environ.get("PGCONNECT_TIMEOUT"):
            extra["connect_timeout"] = _CONNECT_TIMEOUT_S
        if "application_name" not in given and not os.environ.get("PGAPPNAME"):
            # Named in pg_stat_replication, so a second engine can say who holds the slot.
            extra["application_name"] = "snapshotter"
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
            sql.SQL(lsn_text(self._restart_lsn)),
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
            raise PgReaderError(
                f"the replication stream from {self._server} (slot {self._slot!r}, "
                f"publication {self._publication!r}) failed: {message}"
            )
        now = time.monotonic()
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
                raise PgReaderError(
                    f"cannot stream slot {self._slot!r} with publication "
                    f"{self._publication!r} from {self._server} again after the connection "
                    f"was lost: {message}"
                ) from None
            now = time.monotonic()
            if now - lost_since >= self._reconnect_for and exc.sqlstate == _SLOT_IN_USE:
                raise PgReaderError(self._in_use(self._slot_holder(), exc)) from None
            if now - lost_since >= self._reconnect_for:
                raise PgReaderError(
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
            lsn_text(self._restart_lsn),
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
        except (psycopg.Error, PgReaderError):
            pass  # closing anyway; the slot keeps the last position it was told
        self._drop_connection()


def slot_holder_may_be_dying(
    holder: SlotHolder | None, first_reply: float | None, waited: float, wait_for: float
) -> bool:
    """Whether to wait on for a slot another walsender holds: it may be one whose client is
    gone. ``first_reply``: the holder's last reply when we first found the slot in use;
    ``waited``: seconds since then; ``wait_for``: the most to wait.

    A killed client's walsender ends within moments (its socket closes): the first
    ``BUSY_GRACE_S`` are always waited. After that, a live client gives itself away by
    replying (snapshotter's reader does every ``_FEEDBACK_INTERVAL_S``): a holder that replied
    lately or since we began waiting is live, and waiting would only delay the error. One
    silent for longer may be a walsender whose client vanished without closing the
    connection (a network loss): the server ends it at wal_sender_timeout, so that is waited
    for, up to ``wait_for``."""
    if waited >= wait_for:
        return False
    if waited < BUSY_GRACE_S or holder is None:
        return True
    if holder.last_reply is None or holder.silent_s is None:
        return False  # cannot be told (another role's walsender): say it at once
    advanced = first_reply is not None and holder.last_reply > first_reply
    return not advanced and holder.silent_s > SILENT_S


def _connect_fix(exc: psycopg.Error) -> str:
    """What to do about a replication connection the server refused."""
    text = str(exc)
    if exc.sqlstate == "28P01" or "password authentication failed" in text:
        return "; check the user and password in source.url"
    if "must be superuser or replication role" in text or exc.sqlstate == "42501":
        return (
            "; the role needs REPLICATION (ALTER ROLE ... REPLICATION, as a superuser); "
            "`snapshotter init` checks every prerequisite"
        )
    if "pg_hba.conf" in text:
        return "; pg_hba.conf must allow this user replication connections to the database"
    if exc.sqlstate is None:
        return "; check host and port in source.url and that the server is up"
    return ""


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

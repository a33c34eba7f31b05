"""PostgreSQL's log, read by streaming logical replication (pgoutput), with bounded memory.

This module only moves bytes: it opens a replication connection, starts streaming from the
slot, hands each XLogData payload to the pure ``PgOutputDecoder`` and answers keepalives.
psycopg has no replication API of its own (its issue #71), so this speaks the protocol at the
libpq level: ``START_REPLICATION`` puts the connection in COPY BOTH mode, frames arrive with
``get_copy_data`` and standby status updates go back with ``put_copy_data``.

Memory: pgoutput (protocol 1) sends a transaction's changes one message at a time after its
commit; each ``read`` returns at most ``max_items`` items, and the engine writes them on before
reading more, so a large transaction is never held whole (the server spills it to disk).
"""

from __future__ import annotations

import select
import struct
import time
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import pq, sql

from snapshotter.logs.base import LogItem, Progress
from snapshotter.logs.pg_decoder import PgOutputDecoder

_PG_EPOCH_US = 946_684_800_000_000  # 2000-01-01 in Unix microseconds
_XLOG_DATA = struct.Struct("!QQq")  # after b"w": WAL start, WAL end, send time
_KEEPALIVE = struct.Struct("!QqB")  # after b"k": WAL end, send time, reply requested
_STATUS = struct.Struct("!QQQqB")  # after b"r": written, flushed, applied, time, reply
_FEEDBACK_INTERVAL_S = 10.0  # well inside the default wal_sender_timeout of 60 s


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
    ) -> None:
        self._decoder = decoder
        self._max_items = max_items
        self._received = start_lsn  # highest WAL end seen in a frame
        self._flushed = start_lsn  # what state has made durable (sent as flush/apply)
        self._in_txn = False
        self._last_feedback = 0.0
        try:
            self._conn = psycopg.connect(
                conninfo, replication="database", autocommit=True, options=SESSION_OPTIONS
            )
        except psycopg.Error as exc:
            raise LogReaderError(f"cannot open a replication connection: {exc}") from None
        command = sql.SQL(
            "START_REPLICATION SLOT {} LOGICAL {} "
            "(proto_version '1', publication_names {}, messages 'true')"
        ).format(
            sql.Identifier(slot),
            sql.SQL(int_to_lsn(start_lsn)),
            sql.Literal(sql.Identifier(publication).as_string(self._conn)),
        )
        try:
            self._conn.cursor().execute(command)
        except psycopg.Error as exc:
            self._conn.close()
            raise LogReaderError(
                f"cannot stream slot {slot!r} with publication {publication!r}: {exc}; "
                "run `snapshotter init` to create them"
            ) from None
        self._pgconn = self._conn.pgconn
        if self._pgconn.transaction_status is pq.TransactionStatus.UNKNOWN:
            raise LogReaderError("the replication connection was lost at start")

    def read(self, timeout: float) -> list[LogItem]:
        items: list[LogItem] = []
        deadline = time.monotonic() + timeout
        while len(items) < self._max_items:
            nbytes, data = self._pgconn.get_copy_data(1)
            if nbytes == 0:
                if items:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                ready, _, _ = select.select([self._pgconn.socket], [], [], remaining)
                if ready:
                    self._pgconn.consume_input()
                continue
            if nbytes < 0:
                message = self._pgconn.get_error_message() or "the server ended the stream"
                raise LogReaderError(f"replication stream failed: {message.strip()}")
            self._frame(bytes(data), items)
        if time.monotonic() - self._last_feedback > _FEEDBACK_INTERVAL_S:
            self._feedback(reply=False)
        return items

    def _frame(self, frame: bytes, items: list[LogItem]) -> None:
        kind = frame[:1]
        if kind == b"w":
            wal_start, wal_end, _ = _XLOG_DATA.unpack_from(frame, 1)
            payload = frame[1 + _XLOG_DATA.size :]
            self._received = max(self._received, wal_end)
            tag = payload[:1]
            if tag == b"B":
                self._in_txn = True
            items.extend(self._decoder.feed(payload, wal_start))
            if tag == b"C":
                self._in_txn = False
        elif kind == b"k":
            wal_end, _, reply = _KEEPALIVE.unpack_from(frame, 1)
            self._received = max(self._received, wal_end)
            if not self._in_txn:
                # Everything committed before wal_end has been sent: restarting from here
                # loses nothing, and `--until-caught-up` may compare it with the log end.
                items.append(Progress(resume={"lsn": wal_end}, log_offset=wal_end))
            if reply:
                self._feedback(reply=False)

    def _feedback(self, *, reply: bool) -> None:
        now_us = time.time_ns() // 1000 - _PG_EPOCH_US
        message = b"r" + _STATUS.pack(self._received, self._flushed, self._flushed, now_us, reply)
        self._pgconn.put_copy_data(message)
        self._pgconn.flush()
        self._last_feedback = time.monotonic()

    def confirm(self, resume: Mapping[str, Any]) -> None:
        lsn = int(resume["lsn"])
        if lsn > self._flushed:
            self._flushed = lsn
            self._feedback(reply=False)

    def request_progress(self) -> None:
        self._feedback(reply=True)

    def close(self) -> None:
        try:
            if not self._conn.closed and self._flushed:
                self._feedback(reply=False)
        except psycopg.Error:
            pass  # closing anyway; the slot keeps the last position it was told
        self._conn.close()

"""pgoutput logical replication messages (protocol version 1), parsed without any IO.

The format is PostgreSQL's "Logical Replication Message Formats" (protocol chapter): one
message per ``XLogData`` payload, or per row of ``pg_logical_slot_peek_binary_changes``.
:func:`parse_message` turns one such payload into a frozen dataclass; turning those into
change events is :mod:`snapshotter.sources.postgres.decoder`'s job.

Column values stay raw here: ``None`` for SQL NULL, :data:`UNCHANGED_TOAST` for a TOASTed
value the update did not touch (the log does not carry it), or the value's text output as
``bytes``. We always ask for text tuples, so a binary value (``'b'``) is an error rather than
something to guess about.

This runs on every change, so the parser indexes the message directly with ``struct``
(precompiled formats, ``unpack_from``) and only checks bounds where a length comes from the
message; a short read anywhere else surfaces as ``struct.error``/``IndexError`` and becomes a
:class:`PgOutputError` naming the message type and the offset where the message stops short.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "COLUMN_IS_KEY",
    "TRUNCATE_CASCADE",
    "TRUNCATE_RESTART_IDENTITY",
    "UNCHANGED_TOAST",
    "Begin",
    "Commit",
    "Delete",
    "Insert",
    "Message",
    "Origin",
    "PgOutputError",
    "PgOutputMessage",
    "Relation",
    "RelationColumn",
    "Truncate",
    "TupleData",
    "TupleValue",
    "Type",
    "UnchangedToast",
    "Update",
    "parse_message",
]


class PgOutputError(ValueError):
    """A pgoutput message that is malformed, truncated, or not protocol version 1 text."""


class UnchangedToast(enum.Enum):
    """The ``'u'`` marker: a TOASTed value the update left alone, so the log omits it."""

    UNCHANGED_TOAST = "u"

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST = UnchangedToast.UNCHANGED_TOAST

TupleValue = bytes | None | Literal[UnchangedToast.UNCHANGED_TOAST]
TupleData = tuple[TupleValue, ...]

# Truncate option bits.
TRUNCATE_CASCADE = 1
TRUNCATE_RESTART_IDENTITY = 2

# RelationColumn.flags bit: the column is part of the replica identity ("key").
COLUMN_IS_KEY = 1


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int  # the transaction's commit LSN
    commit_ts_us: int  # microseconds since 2000-01-01 00:00 UTC
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int  # the LSN just past the commit record: where a restart resumes
    commit_ts_us: int


@dataclass(frozen=True, slots=True)
class Origin:
    commit_lsn: int  # the commit LSN on the origin server
    name: str


@dataclass(frozen=True, slots=True)
class RelationColumn:
    flags: int  # bit COLUMN_IS_KEY: part of the replica identity
    name: str
    type_oid: int
    type_modifier: int

    @property
    def is_key(self) -> bool:
        return bool(self.flags & COLUMN_IS_KEY)


@dataclass(frozen=True, slots=True)
class Relation:
    oid: int
    namespace: str  # "" stands for pg_catalog
    name: str
    replica_identity: str  # pg_class.relreplident: 'd'efault, 'n'othing, 'f'ull, 'i'ndex
    columns: tuple[RelationColumn, ...]


@dataclass(frozen=True, slots=True)
class Type:
    oid: int
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Insert:
    relation_oid: int
    new: TupleData


@dataclass(frozen=True, slots=True)
class Update:
    relation_oid: int
    old: TupleData | None  # the old key ('K') or whole old row ('O'), when logged
    old_kind: Literal["K", "O"] | None
    new: TupleData


@dataclass(frozen=True, slots=True)
class Delete:
    relation_oid: int
    old: TupleData
    old_kind: Literal["K", "O"]


@dataclass(frozen=True, slots=True)
class Truncate:
    options: int  # TRUNCATE_CASCADE | TRUNCATE_RESTART_IDENTITY
    relation_oids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Message:
    flags: int  # 1: transactional
    lsn: int
    prefix: str
    content: bytes


PgOutputMessage = (
    Begin | Commit | Origin | Relation | Type | Insert | Update | Delete | Truncate | Message
)

_BEGIN = struct.Struct(">QqI")
_COMMIT = struct.Struct(">BQQq")
_MESSAGE = struct.Struct(">BQ")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_U64 = struct.Struct(">Q")
_OID_KIND = struct.Struct(">Ic")  # relation OID, then the first tuple's kind byte
_TRUNCATE = struct.Struct(">IB")
_COLUMN = struct.Struct(">Ii")  # type OID, type modifier

_NAMES = {
    "B": "Begin",
    "C": "Commit",
    "O": "Origin",
    "R": "Relation",
    "Y": "Type",
    "I": "Insert",
    "U": "Update",
    "D": "Delete",
    "T": "Truncate",
    "M": "Message",
}
# What newer protocol versions add; named, so the error says what went wrong.
_NEWER = {
    "S": "Stream Start",
    "E": "Stream Stop",
    "c": "Stream Commit",
    "A": "Stream Abort",
    "b": "Begin Prepare",
    "P": "Prepare",
    "K": "Commit Prepared",
    "r": "Rollback Prepared",
    "p": "Stream Prepare",
}


class _Malformed(Exception):
    """Raised inside the parser with the offset; parse_message adds the message name."""

    def __init__(self, offset: int, problem: str) -> None:
        super().__init__(problem)
        self.offset = offset
        self.problem = problem


def _cstring(data: bytes, pos: int) -> tuple[str, int]:
    end = data.find(b"\0", pos)
    if end < 0:
        raise _Malformed(pos, "string without its terminating NUL byte")
    try:
        return data[pos:end].decode(), end + 1
    except UnicodeDecodeError:
        raise _Malformed(pos, "string is not valid UTF-8") from None


def _tuple(data: bytes, pos: int) -> tuple[TupleData, int]:
    """TupleData at ``pos``: Int16 column count, then per column a kind byte and maybe a value."""
    (count,) = _I16.unpack_from(data, pos)
    if count < 0:
        raise _Malformed(pos, f"negative column count {count}")
    pos += 2
    values: list[TupleValue] = []
    append = values.append
    size = len(data)
    for _ in range(count):
        kind = data[pos]
        if kind == 0x74:  # 't': text value
            (length,) = _I32.unpack_from(data, pos + 1)
            start = pos + 5
            pos = start + length
            if length < 0 or pos > size:
                raise _Malformed(start - 4, f"text value of length {length} overruns the message")
            append(data[start:pos])
        elif kind == 0x6E:  # 'n': NULL
            append(None)
            pos += 1
        elif kind == 0x75:  # 'u': unchanged TOAST
            append(UNCHANGED_TOAST)
            pos += 1
        elif kind == 0x62:  # 'b'
            raise _Malformed(
                pos,
                "binary column value ('b'): the decoder only handles text tuples "
                "(do not start replication with the 'binary' option)",
            )
        else:
            raise _Malformed(pos, f"unknown column value kind {bytes([kind])!r}")
    return tuple(values), pos


def _parse_relation(data: bytes) -> tuple[Relation, int]:
    (oid,) = _U32.unpack_from(data, 1)
    namespace, pos = _cstring(data, 5)
    name, pos = _cstring(data, pos)
    identity = chr(data[pos])
    if identity not in "dnfi":
        raise _Malformed(pos, f"unknown replica identity {identity!r}")
    (count,) = _I16.unpack_from(data, pos + 1)
    if count < 0:
        raise _Malformed(pos + 1, f"negative column count {count}")
    pos += 3
    columns = []
    for _ in range(count):
        flags = data[pos]
        column, pos = _cstring(data, pos + 1)
        type_oid, modifier = _COLUMN.unpack_from(data, pos)
        pos += 8
        columns.append(RelationColumn(flags, column, type_oid, modifier))
    return Relation(oid, namespace, name, identity, tuple(columns)), pos


def _parse_update(data: bytes) -> tuple[Update, int]:
    oid, kind = _OID_KIND.unpack_from(data, 1)
    old: TupleData | None = None
    old_kind: Literal["K", "O"] | None = None
    pos = 6
    if kind == b"K" or kind == b"O":
        old_kind = "K" if kind == b"K" else "O"
        old, pos = _tuple(data, pos)
        kind = data[pos : pos + 1]
        pos += 1
    if kind != b"N":
        raise _Malformed(pos - 1, f"expected the new tuple ('N'), found {kind!r}")
    new, pos = _tuple(data, pos)
    return Update(oid, old, old_kind, new), pos


def _parse_delete(data: bytes) -> tuple[Delete, int]:
    oid, kind = _OID_KIND.unpack_from(data, 1)
    if kind != b"K" and kind != b"O":
        raise _Malformed(5, f"expected the old key ('K') or old row ('O'), found {kind!r}")
    old, pos = _tuple(data, 6)
    return Delete(oid, old, "K" if kind == b"K" else "O"), pos


def _parse_insert(data: bytes) -> tuple[Insert, int]:
    oid, kind = _OID_KIND.unpack_from(data, 1)
    if kind != b"N":
        raise _Malformed(5, f"expected the new tuple ('N'), found {kind!r}")
    new, pos = _tuple(data, 6)
    return Insert(oid, new), pos


def _parse_truncate(data: bytes) -> tuple[Truncate, int]:
    count, options = _TRUNCATE.unpack_from(data, 1)
    end = 6 + 4 * count
    if end > len(data):
        raise _Malformed(6, f"{count} relation OIDs overrun the message")
    oids = struct.unpack_from(f">{count}I", data, 6)
    return Truncate(options, oids), end


def _parse_message_message(data: bytes) -> tuple[Message, int]:
    flags, lsn = _MESSAGE.unpack_from(data, 1)
    prefix, pos = _cstring(data, 10)
    (length,) = _I32.unpack_from(data, pos)
    start = pos + 4
    end = start + length
    if length < 0 or end > len(data):
        raise _Malformed(pos, f"content of length {length} overruns the message")
    return Message(flags, lsn, prefix, data[start:end]), end


def _parse_other(data: bytes, tag: str) -> tuple[PgOutputMessage, int]:
    if tag == "B":
        final_lsn, ts, xid = _BEGIN.unpack_from(data, 1)
        return Begin(final_lsn, ts, xid), 1 + _BEGIN.size
    if tag == "C":
        flags, commit_lsn, end_lsn, ts = _COMMIT.unpack_from(data, 1)
        return Commit(flags, commit_lsn, end_lsn, ts), 1 + _COMMIT.size
    if tag == "O":
        (lsn,) = _U64.unpack_from(data, 1)
        name, pos = _cstring(data, 9)
        return Origin(lsn, name), pos
    if tag == "Y":
        (oid,) = _U32.unpack_from(data, 1)
        namespace, pos = _cstring(data, 5)
        name, pos = _cstring(data, pos)
        return Type(oid, namespace, name), pos
    if tag == "R":
        return _parse_relation(data)
    if tag == "T":
        return _parse_truncate(data)
    if tag == "M":
        return _parse_message_message(data)
    if tag in _NEWER:
        raise _Malformed(0, f"{_NEWER[tag]} messages are not part of protocol version 1")
    raise _Malformed(0, f"unknown message type {tag!r}")


def parse_message(data: bytes | bytearray | memoryview) -> PgOutputMessage:
    """Parse one pgoutput message; raises :class:`PgOutputError` if it is not a valid one."""
    if not isinstance(data, bytes):
        data = bytes(data)
    if not data:
        raise PgOutputError("empty pgoutput message")
    tag = chr(data[0])
    message: PgOutputMessage
    try:
        # The three row messages first: they are nearly all of the traffic.
        if tag == "I":
            message, end = _parse_insert(data)
        elif tag == "U":
            message, end = _parse_update(data)
        elif tag == "D":
            message, end = _parse_delete(data)
        else:
            message, end = _parse_other(data, tag)
    except _Malformed as exc:
        raise _error(tag, exc.offset, exc.problem) from None
    except (struct.error, IndexError):
        # A fixed-size read ran past the end: the message stops short of a field.
        raise _error(tag, len(data), "truncated, a field is missing") from None
    if end != len(data):
        raise _error(tag, end, f"{len(data) - end} unexpected bytes after the message")
    return message


def _error(tag: str, offset: int, problem: str) -> PgOutputError:
    name = _NAMES.get(tag, f"type {tag!r}")
    return PgOutputError(f"pgoutput {name} message, offset {offset}: {problem}")

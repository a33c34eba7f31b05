"""MySQL and MariaDB column types: one value model for chunk rows and binlog rows.

A chunk SELECT (pymysql, text protocol) and the binlog (mysql-replication, binary row
images) hand over the same stored value in different Python shapes. This module says, per
column, what the engine's value model is and what each side needs to reach it, so a READ
row and a log row of the same stored row are equal, key values included:

==================  =======================  ============================  =====================
type                chunk side (pymysql)      binlog side                   value model
==================  =======================  ============================  =====================
integers            int                       int (signedness from the      int
                                              table map's full metadata)
FLOAT               ``CAST(c AS DOUBLE)``     float32 widened               the float32's exact
                                                                            double
DECIMAL             Decimal                   Decimal                       Decimal (scale kept)
DATETIME            naive datetime            naive datetime                naive datetime
TIMESTAMP           naive, session UTC        naive UTC                     aware UTC datetime
DATE, DATETIME      a str (pymysql cannot     None                          None
with a zero part    make a date of it)
TIME                timedelta                 timedelta (a negative one     timedelta
                                              with a fraction corrected)
YEAR                int (0 for 0000)          int, 1900 for 0000            int (0 for 0000)
CHAR, VARCHAR,      str (utf8mb4 session)     str, decoded by the column's  exact stored text:
TEXT, ENUM                                    charset                       no casefold, no pad
SET                 "a,b"                     a Python set                  "a,b" (definition
                                                                            order)
BINARY(n)           bytes, 0x00-padded        bytes, trailing 0x00 cut      bytes, 0x00-padded
VARBINARY, BLOB     bytes                     bytes (str '' when empty)     bytes
BIT                 bytes                     a "0101" string               bytes (big-endian)
UUID, INET6,        text                      the stored bytes, trailing    text, as MariaDB
INET4 (MariaDB)                               0x00 cut                      prints it
JSON (MySQL)        text                      parsed document               RawJson (text)
==================  =======================  ============================  =====================

Key columns under a case-insensitive or PAD SPACE collation keep the exact stored value on
both sides ('abc', 'ABC' and 'abc ' stay three different Python strings): the database
compares them its way in the chunk predicate, the engine matches exact values.

Chunk bounds are compared by the database in the key index's own order, which for some
types is not the order of the value model's text (:func:`key_binding`): an ENUM is ordered
by member index (a bound becomes the list of members on its side), a SET by its bit mask
and a BIT by its number (bound as integers).

Shapes are compared between the catalog and the binlog's table maps by a *type family* code
(``family_code``): both sides reduce to the declared type's MySQL field-type number.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from snapshotter.core.values import RawJson

# MySQL field-type numbers (include/mysql_com.h), as the binlog's table maps carry them.
TINY, SHORT, LONG, FLOAT, DOUBLE, TIMESTAMP, LONGLONG, INT24 = 1, 2, 3, 4, 5, 7, 8, 9
DATE, TIME, DATETIME, YEAR, NEWDATE, VARCHAR, BIT = 10, 11, 12, 13, 14, 15, 16
TIMESTAMP2, DATETIME2, TIME2 = 17, 18, 19
JSON, NEWDECIMAL, ENUM, SET = 245, 246, 247, 248
TINY_BLOB, MEDIUM_BLOB, LONG_BLOB, BLOB, VAR_STRING, STRING, GEOMETRY = (
    249,
    250,
    251,
    252,
    253,
    254,
    255,
)

# information_schema.COLUMNS.DATA_TYPE -> the family code.
_DATA_TYPE_FAMILY = {
    "tinyint": TINY,
    "bool": TINY,
    "boolean": TINY,
    "smallint": SHORT,
    "mediumint": INT24,
    "int": LONG,
    "integer": LONG,
    "bigint": LONGLONG,
    "float": FLOAT,
    "double": DOUBLE,
    "real": DOUBLE,
    "decimal": NEWDECIMAL,
    "numeric": NEWDECIMAL,
    "date": DATE,
    "datetime": DATETIME,
    "timestamp": TIMESTAMP,
    "time": TIME,
    "year": YEAR,
    "char": STRING,
    "binary": STRING,
    "varchar": VARCHAR,
    "varbinary": VARCHAR,
    "tinytext": BLOB,
    "text": BLOB,
    "mediumtext": BLOB,
    "longtext": BLOB,
    "tinyblob": BLOB,
    "blob": BLOB,
    "mediumblob": BLOB,
    "longblob": BLOB,
    "enum": ENUM,
    "set": SET,
    "bit": BIT,
    "json": JSON,
    # MariaDB's own string-stored types travel as fixed-length strings in the binlog.
    "uuid": STRING,
    "inet6": STRING,
    "inet4": STRING,
    "geometry": GEOMETRY,
    "point": GEOMETRY,
    "linestring": GEOMETRY,
    "polygon": GEOMETRY,
    "multipoint": GEOMETRY,
    "multilinestring": GEOMETRY,
    "multipolygon": GEOMETRY,
    "geometrycollection": GEOMETRY,
}

# Binlog field types -> the family code (the binlog uses newer encodings of some types).
_BINLOG_FAMILY = {
    TIMESTAMP2: TIMESTAMP,
    DATETIME2: DATETIME,
    TIME2: TIME,
    NEWDATE: DATE,
    TINY_BLOB: BLOB,
    MEDIUM_BLOB: BLOB,
    LONG_BLOB: BLOB,
    VAR_STRING: VARCHAR,
}

_BINARY_TYPES = frozenset(
    {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob", "bit", "geometry"}
)
_SIGNED_INTS = frozenset({"tinyint", "bool", "boolean", "smallint", "mediumint", "int", "integer"})


def family_code(data_type: str) -> int:
    """The family code of a catalog ``DATA_TYPE`` (0 when unknown)."""
    return _DATA_TYPE_FAMILY.get(data_type.lower(), 0)


def binlog_family(field_type: int) -> int:
    """The family code of a binlog table map's column type."""
    return _BINLOG_FAMILY.get(field_type, field_type)


def arrow_type(
    data_type: str,
    column_type: str,
    precision: int | None,
    scale: int | None,
) -> pa.DataType:
    """How chunk rows of a column are buffered in Arrow."""
    data_type = data_type.lower()
    unsigned = "unsigned" in column_type.lower()
    if data_type == "bigint":
        return pa.uint64() if unsigned else pa.int64()
    if data_type in _SIGNED_INTS or data_type == "year":
        return pa.int64()
    if data_type in ("float", "double", "real"):
        return pa.float64()
    if data_type in ("decimal", "numeric"):
        p, s = precision or 10, scale or 0
        return pa.decimal128(p, s) if p <= 38 else pa.decimal256(p, s)
    if data_type == "date":
        return pa.date32()
    if data_type == "datetime":
        return pa.timestamp("us")
    if data_type == "timestamp":
        return pa.timestamp("us", tz="UTC")
    if data_type == "time":
        return pa.duration("us")
    if data_type in _BINARY_TYPES or family_code(data_type) == GEOMETRY:
        return pa.binary()
    return pa.string()  # text types, json, enum, set, MariaDB uuid/inet


def selects_as_double(data_type: str) -> bool:
    """FLOAT columns are read as ``CAST(c AS DOUBLE)``: the text protocol rounds a float32
    to 6 digits, the binlog carries it exactly."""
    return data_type.lower() == "float"


def is_json(data_type: str) -> bool:
    return data_type.lower() == "json"


# --- the binlog side -------------------------------------------------------------------------

_UTC = dt.UTC


def _timestamp(value: Any) -> Any:
    return value.replace(tzinfo=_UTC) if isinstance(value, dt.datetime) else value


def _bits(width: int) -> Callable[[Any], Any]:
    size = (width + 7) // 8

    def convert(value: Any) -> Any:
        if isinstance(value, str):
            return int(value, 2).to_bytes(size, "big") if value else b"\x00" * size
        return value

    return convert


def _set(members: tuple[str, ...]) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if isinstance(value, set | frozenset):
            return ",".join(m for m in members if m in value)
        return value

    return convert


def _json(value: Any) -> Any:
    if isinstance(value, RawJson):
        return value
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    if isinstance(value, str):
        return RawJson(value)
    # mysql-replication parses MySQL's binary JSON; MySQL prints documents the way
    # json.dumps does by default (", " and ": ").
    return RawJson(json.dumps(_json_plain(value), ensure_ascii=False))


def _json_plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {_json_plain(k): _json_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_plain(v) for v in value]
    return value


def _year(value: Any) -> Any:
    # mysql-replication decodes YEAR as 1900 + the stored byte, and 0000 is stored as 0;
    # 1900 itself cannot be stored (YEAR holds 0000 and 1901..2155).
    return 0 if value == 1900 else value


_SECOND_US = 1_000_000


def _negative_time2(value: Any) -> Any:
    """A negative TIME with a fraction as stored. mysql-replication (1.0.17) decodes the
    integer part of -S.f as S and adds the fraction bytes as stored, 1 - f: -01:02:03.25
    arrives as -01:02:03.75. Undo it: -(S + f) from -(S + (1 - f))."""
    if not isinstance(value, dt.timedelta) or value >= dt.timedelta(0):
        return value
    micros = -(value // dt.timedelta(microseconds=1))
    whole, fraction = divmod(micros, _SECOND_US)
    if not fraction:
        return value
    return -dt.timedelta(microseconds=whole * _SECOND_US + _SECOND_US - fraction)


def _binary(width: int) -> Callable[[Any], Any]:
    """Binary strings: mysql-replication hands over bytes, but str '' for an empty value;
    a fixed-width BINARY(n) arrives with its trailing 0x00 cut (the binlog packs it so),
    the chunk SELECT returns it padded."""

    def convert(value: Any) -> Any:
        if isinstance(value, str):
            value = value.encode("latin-1")
        if width and len(value) < width:
            value = bytes(value) + b"\x00" * (width - len(value))
        return value

    return convert


def _mariadb_text(width: int, text: Callable[[bytes], str]) -> Callable[[Any], Any]:
    pad = _binary(width)
    return lambda value: text(pad(value))


def inet6_text(packed: bytes) -> str:
    """An INET6 value as MariaDB prints it (``Inet6::to_string``, like MySQL's
    ``INET6_NTOA``): the longest run of zero groups - the first of equally long ones, even
    a single group - becomes ``::``; an IPv4-compatible (``::a.b.c.d``) or IPv4-mapped
    (``::ffff:a.b.c.d``) address ends in dotted quad. Python's ipaddress differs (it keeps
    a lone zero group, and prints ``::ffff:102:304``)."""
    if len(packed) != 16:
        raise ValueError(f"an INET6 value is 16 bytes, not {len(packed)}")
    words = [int.from_bytes(packed[i : i + 2], "big") for i in range(0, 16, 2)]
    gap_pos, gap_len = -1, 0
    run_pos, run_len = -1, 0
    for i, word in enumerate([*words, 1]):  # a sentinel ends a trailing run
        if word == 0:
            if run_pos < 0:
                run_pos, run_len = i, 0
            run_len += 1
        elif run_pos >= 0:
            if run_len > gap_len:
                gap_pos, gap_len = run_pos, run_len
            run_pos = -1
    out = ""
    i = 0
    while i < 8:
        if i == gap_pos:
            out += "::" if i == 0 else ":"
            i += gap_len
            continue
        if i == 6 and gap_pos == 0 and (gap_len == 6 or (gap_len == 5 and words[5] == 0xFFFF)):
            return out + inet4_text(packed[12:])
        out += f"{words[i]:x}" + (":" if i != 7 else "")
        i += 1
    return out


def inet4_text(packed: bytes) -> str:
    if len(packed) != 4:
        raise ValueError(f"an INET4 value is 4 bytes, not {len(packed)}")
    return ".".join(str(b) for b in packed)


def _uuid_text(packed: bytes) -> str:
    # The binlog carries MariaDB's UUID in its text order (the index-friendly byte swap of
    # some versions is in the index only).
    return str(uuid.UUID(bytes=packed))


_BINARY_STRINGS = (STRING, VARCHAR, VAR_STRING, BLOB, TINY_BLOB, MEDIUM_BLOB, LONG_BLOB)
_MARIADB_BINARY_TEXT: dict[str, tuple[int, Callable[[bytes], str]]] = {
    "inet6": (16, inet6_text),
    "inet4": (4, inet4_text),
    "uuid": (16, _uuid_text),
}


def binlog_converter(
    field_type: int,
    *,
    bits: int = 0,
    set_values: tuple[str, ...] = (),
    binary: bool = False,
    max_length: int = 0,
    data_type: str | None = None,
) -> Callable[[Any], Any] | None:
    """What turns a mysql-replication value of this column type into the value model;
    None when it already is (the common case, kept free of per-value calls).

    ``binary``: the table map says the column's charset is ``binary``; ``max_length``: its
    declared length (a BINARY(n)'s n); ``data_type``: the catalog's DATA_TYPE when known,
    which alone tells MariaDB's UUID / INET6 / INET4 from a BINARY(16) / BINARY(4)."""
    if data_type is not None and data_type.lower() in _MARIADB_BINARY_TEXT:
        width, text = _MARIADB_BINARY_TEXT[data_type.lower()]
        return _mariadb_text(width, text)
    if field_type in (TIMESTAMP, TIMESTAMP2):
        return _timestamp
    if field_type == BIT:
        return _bits(bits)
    if field_type == SET:
        return _set(set_values)
    if field_type == JSON:
        return _json
    if field_type == YEAR:
        return _year
    if field_type == TIME2:
        return _negative_time2
    if binary and field_type in _BINARY_STRINGS:
        return _binary(max_length if field_type == STRING else 0)
    return None


def chunk_converter(data_type: str) -> Callable[[Any], Any] | None:
    """What turns a buffered chunk value (Arrow's Python value) into the value model."""
    if is_json(data_type):
        return lambda v: None if v is None else RawJson(v)
    return None


class KeyTypeError(ValueError):
    """A key column or key value the chunk predicate cannot page by in the database's
    order."""


# --- what the chunk side cannot build --------------------------------------------------------

# pymysql returns a date with a zero part ('0000-00-00', '2024-00-10', allowed without
# NO_ZERO_DATE / NO_ZERO_IN_DATE) as its text; the binlog decoder makes None of it.
_ZERO_DATED = frozenset({"date", "datetime"})


def zero_dates_to_none(
    columns: Sequence[tuple[str, str]],
    rows: list[tuple[Any, ...]],
    key_columns: Sequence[str] = (),
) -> list[tuple[Any, ...]]:
    """``rows`` (of ``columns``: name and DATA_TYPE, in order) with the text pymysql returns
    for a DATE or DATETIME with a zero part made None, as the binlog has it; a zero
    TIMESTAMP (stored as 0) becomes the epoch, as the binlog has it too (1970-01-01
    00:00:00 itself cannot be stored in a TIMESTAMP). KeyTypeError when a column of
    ``key_columns`` holds a zero date: no value can stand for it in a key."""
    fixes = [
        (i, name, data_type.lower())
        for i, (name, data_type) in enumerate(columns)
        if data_type.lower() in _ZERO_DATED or data_type.lower() == "timestamp"
    ]
    if not fixes:
        return rows
    out = []
    for row in rows:
        if any(isinstance(row[i], str) for i, _, _ in fixes):
            fixed = list(row)
            for i, name, data_type in fixes:
                if not isinstance(fixed[i], str):
                    continue
                if data_type in _ZERO_DATED and name in key_columns:
                    raise KeyTypeError(
                        f"key column {name!r} holds the date {fixed[i]!r}, which has a zero "
                        "part and is no date; snapshotter cannot page by it: update those "
                        "rows to real dates, or name a unique NOT NULL column to page by "
                        'with "surrogate-key"'
                    )
                fixed[i] = None if data_type in _ZERO_DATED else _EPOCH
            row = tuple(fixed)
        out.append(row)
    return out


_EPOCH = dt.datetime(1970, 1, 1)  # naive: the chunk side's TIMESTAMP values are (UTC)


# --- key bounds in the index's order ---------------------------------------------------------


_MEMBER = re.compile(r"'((?:[^'\\]|''|\\.)*)'", re.S)
_MEMBER_ESCAPES = {"0": "\0", "n": "\n", "r": "\r", "Z": "\x1a", "t": "\t", "b": "\b"}


def type_members(column_type: str) -> tuple[str, ...]:
    """The members of an ``enum(...)`` / ``set(...)`` COLUMN_TYPE, in definition order.

    The catalog writes each member as a quoted SQL string: ``''`` for a quote, a
    backslash escape for a backslash, NUL, newline, CR and Ctrl-Z (a tab stays as is)."""
    head, sep, body = column_type.partition("(")
    if not sep or head.strip().lower() not in ("enum", "set"):
        raise ValueError(f"{column_type!r} is not an ENUM or SET type")
    return tuple(_ESCAPE.sub(_unescape, quoted.group(1)) for quoted in _MEMBER.finditer(body))


_ESCAPE = re.compile(r"''|\\(.)", re.S)


def _unescape(match: re.Match[str]) -> str:
    char = match.group(1)
    return "'" if char is None else _MEMBER_ESCAPES.get(char, char)


def _bit_number(value: Any) -> Any:
    return int.from_bytes(value, "big") if isinstance(value, bytes | bytearray) else value


def _set_mask(members: tuple[str, ...]) -> Callable[[Any], Any]:
    bit = {m.lower(): 1 << i for i, m in enumerate(members)}

    def mask(value: Any) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return sum(bit[m.lower()] for m in value.split(",")) if value else 0
        except KeyError as missing:
            raise KeyTypeError(f"{missing} is not a member of the SET") from None

    return mask


# A bound on an ENUM column is written as the list of members on its side of the bound:
# these name the list parameters, ``<param><suffix>``, by comparison.
ENUM_LISTS = {">": "_gt", ">=": "_ge", "<": "_lt", "<=": "_le"}
# ENUMs longer than this are compared by index (correct, but not an index range scan).
MAX_ENUM_LIST = 1000


@dataclass(frozen=True, slots=True)
class KeyBinding:
    """How bounds on one key column are compared in the key index's order.

    ``members``: an ENUM's members: the chunk predicate compares with lists of members
    (``e IN (...)``), which MariaDB and MySQL range-scan, where ``e > 'b'`` would compare
    text and ``e > 2`` is never an index range. ``to_param``: what a bound in the value
    model is bound as (a BIT's number, a SET's bit mask, an ENUM's index when it is too
    long for lists): both order like the index."""

    members: tuple[str, ...] | None = None
    to_param: Callable[[Any], Any] | None = None

    def enum_params(self, name: str, value: Any) -> dict[str, Any]:
        """The parameters of a bound ``value`` on an ENUM column: ``name`` the member
        itself (for ``=``), ``name`` + a suffix of :data:`ENUM_LISTS` the members on each
        side. An empty list is ``(None,)``: ``e IN (NULL)`` holds for no row."""
        assert self.members is not None
        index = enum_index(self.members, value)
        below = ("", *self.members[: max(index - 1, 0)]) if index else ()
        lists = {
            ">": self.members[index:],
            ">=": self.members[max(index - 1, 0) :] if index else ("", *self.members),
            "<": below,
            "<=": ("", *self.members[:index]),
        }
        params: dict[str, Any] = {name: value}
        for op, members in lists.items():
            params[name + ENUM_LISTS[op]] = tuple(members) or (None,)
        return params


def enum_index(members: tuple[str, ...], value: Any) -> int:
    """The 1-based index of an ENUM member, 0 for the error value ''."""
    if value == "":
        return 0
    try:
        return members.index(value) + 1
    except ValueError:
        raise KeyTypeError(
            f"{value!r} is not a member of the ENUM ({', '.join(map(repr, members))}); "
            "was the column altered?"
        ) from None


def key_binding(name: str, data_type: str, column_type: str) -> KeyBinding:
    """How bounds on the key column ``name`` are compared (:class:`KeyBinding`);
    KeyTypeError, saying why, for a column that cannot be paged in the index's order."""
    data_type = data_type.lower()
    if data_type == "bit":
        return KeyBinding(to_param=_bit_number)
    if data_type == "set":
        return KeyBinding(to_param=_set_mask(type_members(column_type)))
    if data_type == "enum":
        members = type_members(column_type)
        if "" in members:
            raise KeyTypeError(
                f"key column {name!r} is an ENUM with the empty string as a member, which "
                "the database cannot tell apart from the ENUM error value '' (index 0), so "
                "chunks cannot be paged by it; drop the '' member, or name a unique NOT NULL "
                'column to page by with "surrogate-key"'
            )
        if len(members) > MAX_ENUM_LIST:
            return KeyBinding(to_param=lambda v: enum_index(members, v))
        return KeyBinding(members=members)
    return KeyBinding()

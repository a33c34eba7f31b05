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
DATE / TIME / YEAR  date / timedelta / int    the same                      the same
CHAR, VARCHAR,      str (utf8mb4 session)     str, decoded by the column's  exact stored text:
TEXT, ENUM                                    charset                       no casefold, no pad
SET                 "a,b"                     a Python set                  "a,b" (definition
                                                                            order)
BINARY, VARBINARY,  bytes                     bytes                         bytes
BLOB, BIT                                     (BIT: a "0101" string)
JSON (MySQL)        text                      parsed document               RawJson (text)
==================  =======================  ============================  =====================

Key columns under a case-insensitive or PAD SPACE collation keep the exact stored value on
both sides ('abc', 'ABC' and 'abc ' stay three different Python strings): the database
compares them its way in the chunk predicate, the engine matches exact values.

Shapes are compared between the catalog and the binlog's table maps by a *type family* code
(``family_code``): both sides reduce to the declared type's MySQL field-type number.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
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

_TEXT_TYPES = frozenset(
    {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set"}
)
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


def binlog_converter(
    field_type: int, *, bits: int = 0, set_values: tuple[str, ...] = ()
) -> Callable[[Any], Any] | None:
    """What turns a mysql-replication value of this column type into the value model;
    None when it already is (the common case, kept free of per-value calls)."""
    if field_type in (TIMESTAMP, TIMESTAMP2):
        return _timestamp
    if field_type == BIT:
        return _bits(bits)
    if field_type == SET:
        return _set(set_values)
    if field_type == JSON:
        return _json
    return None


def chunk_converter(data_type: str) -> Callable[[Any], Any] | None:
    """What turns a buffered chunk value (Arrow's Python value) into the value model."""
    if is_json(data_type):
        return lambda v: None if v is None else RawJson(v)
    return None

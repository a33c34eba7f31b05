"""Landed types, end to end: the real engine with the Spark sink (Spark local mode) on
PostgreSQL and MySQL/MariaDB.

One test per source, over a wide type matrix. Rows with edge values are snapshotted (READ
rows, ``__op = 'r'``); then the *same* SQL literals are inserted under new keys (log rows,
``'c'``) and rows are updated (``'u'``), one update to all NULLs in a batch of its own.
Read back with Spark:

1. every column of the current state and of the changelog has the Spark type the source
   catalog calls for (a table of expectations per database), and so has each landed batch
   read alone, the one holding only a row of NULLs included: the schema comes from the
   catalog, not from the values of a batch;
2. a READ row and the log row of the same values land equal, column by column, Python
   types included (and an update lands like the READ row of the values it wrote);
3. values survive exactly: decimals with their digits and scale, timestamps with time zone
   as the right UTC instant, bytes (0x00, 0xff) exact, JSON text that parses to the
   document written (nested, unicode, big numbers), and the current state equals what was
   written.

Inputs that mysql-replication decodes wrongly (tests/integration/test_mysql_dialect.py:
empty VARBINARY/BLOB, negative TIME with a fraction, BINARY(n) with trailing 0x00, YEAR
0000, zero dates) are left out: READ and log rows of them differ before landing.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    LongType,
    StringType,
    TimestampNTZType,
    TimestampType,
)

from snapshotter.sinks.spark.types import RESERVED_COLUMNS
from tests.integration.engine_harness import Capture, CaptureFactory, mysql_connect

pytestmark = pytest.mark.integration

TABLE = "matrix"
LOG_KEY_OFFSET = 100  # the log rows of a snapshotted row's values: its key + 100
UTC = dt.UTC


@dataclass(frozen=True)
class Json:
    """An expected JSON column: landed text that parses to ``doc`` (floats as Decimal, so
    no digit is lost in the comparison); ``text``, when given, is the exact landed text."""

    doc: Any
    text: str | None = None


@dataclass(frozen=True)
class Matrix:
    """One source's type matrix: DDL, rows as SQL literals, what lands."""

    # SQL type and Spark type of every column (the key "id" included), in table order.
    columns: Mapping[str, tuple[str, DataType]]
    ddl_suffix: str
    # Row name -> column -> SQL literal; columns not named are NULL.
    rows: Mapping[str, Mapping[str, str]]
    # Row name -> column -> the landed value, as Spark's Arrow gives it back.
    landed: Mapping[str, Mapping[str, Any]]
    quote: Callable[[str], str]
    # Runs statements in one transaction (in a session zone that is not UTC).
    run: Callable[[Capture, list[str]], None]
    # The columns whose types the server does not have (older versions).
    unsupported: Callable[[Capture], set[str]] = lambda cap: set()

    @property
    def types(self) -> dict[str, DataType]:
        return {name: spark for name, (_, spark) in self.columns.items()}

    def ddl(self, table: str) -> str:
        columns = ", ".join(f"{self.quote(n)} {sql}" for n, (sql, _) in self.columns.items())
        return f"CREATE TABLE {table} ({columns}){self.ddl_suffix}"

    def without(self, dropped: set[str]) -> Matrix:
        return replace(
            self,
            columns={n: t for n, t in self.columns.items() if n not in dropped},
            rows={
                r: {c: v for c, v in row.items() if c not in dropped}
                for r, row in self.rows.items()
            },
            landed={
                r: {c: v for c, v in row.items() if c not in dropped}
                for r, row in self.landed.items()
            },
        )


def _f32(value: float) -> float:
    """The float32 nearest ``value``, as a double (what a MySQL FLOAT holds exactly)."""
    result: float = struct.unpack("<f", struct.pack("<f", value))[0]
    return result


def _utc(*args: int) -> dt.datetime:
    return dt.datetime(*args).replace(tzinfo=UTC)  # type: ignore[arg-type]


# --- PostgreSQL -------------------------------------------------------------------------------

PG_TYPES: dict[str, tuple[str, DataType]] = {
    "id": ("bigint PRIMARY KEY", LongType()),
    "i2": ("smallint", LongType()),  # every integer type is read as int64
    "i4": ("integer", LongType()),
    "i8": ("bigint", LongType()),
    "n38": ("numeric(38,10)", DecimalType(38, 10)),
    "n12": ("numeric(12,2)", DecimalType(12, 2)),
    "n": ("numeric", StringType()),  # unconstrained: its exact text
    "n50": ("numeric(50,5)", StringType()),  # beyond Spark's 38 digits: its exact text
    "n35": ("numeric(3,5)", DecimalType(5, 5)),  # PostgreSQL 15+: a scale above the precision
    "nneg": ("numeric(5,-2)", StringType()),  # PostgreSQL 15+: a negative scale, its text
    "f4": ("real", DoubleType()),
    "f8": ("double precision", DoubleType()),
    "ok": ("boolean", BooleanType()),
    "t": ("text", StringType()),
    "vc": ("varchar(20)", StringType()),
    "bp": ("char(5)", StringType()),
    "by": ("bytea", BinaryType()),
    "d": ("date", DateType()),
    "tm": ("time", StringType()),  # Spark has no time of day: HH:MM:SS.ffffff
    "ttz": ("timetz", StringType()),
    "ts": ("timestamp", TimestampNTZType()),
    "tz": ("timestamptz", TimestampType()),
    "iv": ("interval", StringType()),
    "u": ("uuid", StringType()),
    "js": ("json", StringType()),
    "jb": ("jsonb", StringType()),
    "arr": ("integer[]", StringType()),
}

_PG_DOC = (
    '{"b":  [1, 2.50, null], "ü": "😀 \\u00e9", "n": {"deep": {"x": [true, {}]}}, '
    '"big": 123456789012345678901234567890.000000000000000000001}'
)
_PG_DOC_PARSED = {
    "b": [1, Decimal("2.50"), None],
    "ü": "😀 é",
    "n": {"deep": {"x": [True, {}]}},
    "big": Decimal("123456789012345678901234567890.000000000000000000001"),
}

PG_ROWS: dict[str, dict[str, str]] = {
    "typical": {
        "i2": "-7",
        "i4": "2147483647",
        "i8": "-9223372036854775808",
        "n38": "1234567890123456789012345678.1234567890",
        "n12": "-9999999999.99",
        "n": "-12345678901234567890.000000000000000000001",
        "n50": "123456789012345678901234567890123456789012345.12345",
        "n35": "0.00123",
        "nneg": "-9999949",
        "f4": "0.1",
        "f8": "1e-300",
        "ok": "true",
        "t": "E'ünïcødé 😀 tab\\t\"q\" back\\\\slash\\nline'",
        "vc": "'abc  '",
        "bp": "'ab'",
        "by": "'\\x00ff1000'::bytea",
        "d": "'2024-02-29'",
        "tm": "'13:14:15.000016'",
        "ttz": "'13:14:15.5+02'",
        "ts": "'2024-02-29 23:59:59.123456'",
        "tz": "'2024-02-29 23:59:59.123456+05:30'",
        "iv": "'1 year 2 mons 3 days 04:05:06.789'",
        "u": "'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'",
        "js": f"'{_PG_DOC}'",
        "jb": f"'{_PG_DOC}'",
        "arr": "'{1,NULL,3}'",
    },
    "edges": {
        "i2": "-32768",
        "i4": "-2147483648",
        "i8": "9223372036854775807",
        "n38": "-9999999999999999999999999999.9999999999",
        "n12": "0.00",
        "n": "'NaN'",
        "n50": "-0.00001",
        "n35": "-0.00999",
        "nneg": "0",
        "f4": "-3.4e38",
        "f8": "-1.7976931348623157e308",
        "ok": "false",
        "t": "''",
        "vc": "''",
        "bp": "''",
        "by": "''::bytea",
        "d": "'0001-01-01'",
        "tm": "'00:00:00'",
        "ttz": "'23:59:59.999999-14:59'",
        "ts": "'0001-01-01 00:00:00'",
        "tz": "'1969-12-31 23:59:59.999999-08:00'",
        "iv": "'-1 days -00:00:00.000001'",
        "u": "'00000000-0000-0000-0000-000000000000'",
        "js": "'[]'",
        "jb": "'{}'",
        "arr": "'{}'",
    },
    "more": {
        "i2": "32767",
        "n38": "0.0000000001",
        "n12": "'NaN'",  # a numeric(p,s) NaN lands as NULL (Spark decimals have none)
        "n": "'Infinity'",
        "n50": "0",
        "n35": "0",
        "nneg": "150",
        "f4": "1.17549435e-38",
        "f8": "'-0'",
        "t": "'x'",
        "by": "'\\xff'::bytea",
        "d": "'9999-12-31'",
        "tm": "'23:59:59.999999'",
        "ts": "'9999-12-31 23:59:59.999999'",
        "tz": "'0001-01-01 00:00:00+00'",
        "iv": "'0'",
        "js": "'\"\\ud83d\\ude00 text\"'",
        "jb": "'[1e400, -0.0, 18446744073709551616]'",
        "arr": "'{{1,2},{3,4}}'",
    },
    "nulls": {},
}

PG_LANDED: dict[str, dict[str, Any]] = {
    "typical": {
        "i2": -7,
        "i4": 2147483647,
        "i8": -9223372036854775808,
        "n38": Decimal("1234567890123456789012345678.1234567890"),
        "n12": Decimal("-9999999999.99"),
        "n": "-12345678901234567890.000000000000000000001",
        "n50": "123456789012345678901234567890123456789012345.12345",
        "n35": Decimal("0.00123"),
        "nneg": "-9999900",
        "f4": 0.1,  # float4's shortest text, read as a double
        "f8": 1e-300,
        "ok": True,
        "t": 'ünïcødé 😀 tab\t"q" back\\slash\nline',
        "vc": "abc  ",
        "bp": "ab   ",  # char(n) keeps its padding
        "by": b"\x00\xff\x10\x00",
        "d": dt.date(2024, 2, 29),
        "tm": "13:14:15.000016",
        "ttz": "13:14:15.5+02",
        "ts": dt.datetime(2024, 2, 29, 23, 59, 59, 123456),
        "tz": _utc(2024, 2, 29, 18, 29, 59, 123456),
        "iv": "1 year 2 mons 3 days 04:05:06.789",
        "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        "js": Json(_PG_DOC_PARSED, _PG_DOC),  # json keeps its text as written
        "jb": Json(_PG_DOC_PARSED),
        "arr": "{1,NULL,3}",
    },
    "edges": {
        "i2": -32768,
        "i4": -2147483648,
        "i8": 9223372036854775807,
        "n38": Decimal("-9999999999999999999999999999.9999999999"),
        "n12": Decimal("0.00"),
        "n": "NaN",
        "n50": "-0.00001",
        "n35": Decimal("-0.00999"),
        "nneg": "0",
        "f4": -3.4e38,
        "f8": -1.7976931348623157e308,
        "ok": False,
        "t": "",
        "vc": "",
        "bp": "     ",
        "by": b"",
        "d": dt.date(1, 1, 1),
        "tm": "00:00:00.000000",
        "ttz": "23:59:59.999999-14:59",
        "ts": dt.datetime(1, 1, 1),
        "tz": _utc(1970, 1, 1, 7, 59, 59, 999999),
        "iv": "-1 days -00:00:00.000001",
        "u": "00000000-0000-0000-0000-000000000000",
        "js": Json([], "[]"),
        "jb": Json({}),
        "arr": "{}",
    },
    "more": {
        "i2": 32767,
        "n38": Decimal("0.0000000001"),
        "n12": None,
        "n": "Infinity",
        "n50": "0.00000",
        "n35": Decimal("0.00000"),
        "nneg": "200",  # rounded to hundreds
        "f4": 1.1754944e-38,  # float4's shortest text: 1.1754944e-38
        "f8": -0.0,
        "t": "x",
        "by": b"\xff",
        "d": dt.date(9999, 12, 31),
        "tm": "23:59:59.999999",
        "ts": dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
        "tz": _utc(1, 1, 1),
        "iv": "00:00:00",
        "js": Json("😀 text", '"\\ud83d\\ude00 text"'),
        # jsonb keeps numerics exact: 1e400 and 2**64 are no doubles.
        "jb": Json([Decimal("1e400"), Decimal("-0.0"), 18446744073709551616]),
        "arr": "{{1,2},{3,4}}",
    },
    "nulls": {},
}


def _pg_quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _pg_run(cap: Capture, statements: list[str]) -> None:
    with psycopg.connect(cap.url) as conn:
        # A session zone far from UTC: timestamptz literals carry their offsets anyway.
        conn.execute("SET TimeZone = 'America/St_Johns'")
        for statement in statements:
            conn.execute(statement.encode())  # bytes: no placeholders, no '%' processing
        conn.commit()


def _pg_unsupported(cap: Capture) -> set[str]:
    """numeric scales outside 0..precision are PostgreSQL 15+."""
    version = int(cap.sql("SHOW server_version_num")[0][0])
    return set() if version >= 150000 else {"n35", "nneg"}


POSTGRES = Matrix(
    columns=PG_TYPES,
    ddl_suffix="",
    rows=PG_ROWS,
    landed=PG_LANDED,
    quote=_pg_quote,
    run=_pg_run,
    unsupported=_pg_unsupported,
)


# --- MySQL / MariaDB --------------------------------------------------------------------------

MY_TYPES: dict[str, tuple[str, DataType]] = {
    "id": ("bigint NOT NULL PRIMARY KEY", LongType()),
    "ti": ("tinyint", LongType()),
    "i": ("int", LongType()),
    "ub": ("bigint unsigned", DecimalType(20, 0)),  # Spark has no unsigned 64-bit integer
    "d38": ("decimal(38,10)", DecimalType(38, 10)),
    "d12": ("decimal(12,2)", DecimalType(12, 2)),
    "d65": ("decimal(65,30)", StringType()),  # beyond Spark's 38 digits: text
    "fl": ("float", DoubleType()),
    "db": ("double", DoubleType()),
    "bt": ("bit(8)", BinaryType()),
    "ch": ("char(5)", StringType()),
    "vc": ("varchar(20)", StringType()),
    "tx": ("text", StringType()),
    "bn": ("binary(4)", BinaryType()),
    "vb": ("varbinary(16)", BinaryType()),
    "bl": ("blob", BinaryType()),
    "da": ("date", DateType()),
    "tm": ("time(6)", StringType()),  # Spark has no time of day nor reads a duration
    "dt": ("datetime(6)", TimestampNTZType()),
    "ts": ("timestamp(6) NULL DEFAULT NULL", TimestampType()),
    "yr": ("year", LongType()),
    "js": ("json", StringType()),
    "en": ("enum('x','y','z')", StringType()),
    "st": ("set('a','b','c')", StringType()),
}

# MySQL 8 keeps integers up to 2**64 - 1 in JSON exactly (MariaDB keeps the text).
_MY_DOC = (
    '{"a": [1, 2.5, null], "b": "é 😀", "n": {"deep": {"x": [true, {}]}}, '
    '"big": 18446744073709551615, "neg": -9223372036854775808}'
)
_MY_DOC_PARSED = {
    "a": [1, Decimal("2.5"), None],
    "b": "é 😀",
    "n": {"deep": {"x": [True, {}]}},
    "big": 18446744073709551615,
    "neg": -9223372036854775808,
}

MY_ROWS: dict[str, dict[str, str]] = {
    "typical": {
        "ti": "-128",
        "i": "-42",
        "ub": "18446744073709551615",
        "d38": "1234567890123456789012345678.1234567890",
        "d12": "-9999999999.99",
        "d65": "-12345678901234567890123456789012345.123456789012345678901234567891",
        "fl": "1.1",
        "db": "0.1",
        "bt": "b'10000001'",
        "ch": "'ab'",
        "vc": "'Grüße 😀  '",
        "tx": "'line1\\nline2\\ttab \"q\" back\\\\slash'",
        "bn": "X'00FF0001'",
        "vb": "X'00FF10'",
        "bl": "X'DEADBEEF00FF'",
        "da": "'2024-02-29'",
        "tm": "'-838:59:59'",
        "dt": "'2024-02-29 23:59:59.123456'",
        "ts": "'2024-06-01 12:00:00.5'",  # session zone +05:30
        "yr": "2155",
        "js": f"'{_MY_DOC}'",
        "en": "'y'",
        "st": "'c,a'",
    },
    "edges": {
        "ti": "127",
        "i": "2147483647",
        "ub": "0",
        "d38": "-9999999999999999999999999999.9999999999",
        "d12": "0.00",
        "d65": "99999999999999999999999999999999999.999999999999999999999999999999",
        "fl": "-3.4e38",
        "db": "5e-324",
        "bt": "b'0'",
        "ch": "'a  '",
        "vc": "''",
        "tx": "''",
        "bn": "'abcd'",
        "vb": "X'00'",
        "bl": "X'FF00'",
        "da": "'1000-01-01'",
        "tm": "'838:59:59.999999'",
        "dt": "'1000-01-01 00:00:00'",
        "ts": "'1970-01-01 05:30:01'",  # +05:30: the first second TIMESTAMP holds
        "yr": "1901",
        "js": "'[]'",
        "en": "'x'",
        "st": "''",
    },
    "more": {
        "ti": "0",
        "i": "-2147483648",
        "ub": "9223372036854775808",
        "d38": "0.0000000001",
        "d12": "-0.01",
        "d65": "0.000000123",
        "fl": "16777217",
        "db": "-1.7976931348623157e308",
        "bt": "b'11111111'",
        "ch": "'ÄÖÜ'",
        "bn": "X'FF000001'",
        "vb": "X'FF'",
        "bl": "X'00'",
        "da": "'9999-12-31'",
        "tm": "'12:34:56.000001'",
        "dt": "'9999-12-31 23:59:59.999999'",
        "ts": "'2038-01-19 08:44:07.999999'",  # +05:30: the last instant TIMESTAMP holds
        "yr": "2000",
        "js": "'\"\\\\ud83d\\\\ude00 text\"'",
        "en": "'z'",
        "st": "'a,b,c'",
    },
    "nulls": {},
}

MY_LANDED: dict[str, dict[str, Any]] = {
    "typical": {
        "ti": -128,
        "i": -42,
        "ub": Decimal(18446744073709551615),
        "d38": Decimal("1234567890123456789012345678.1234567890"),
        "d12": Decimal("-9999999999.99"),
        "d65": "-12345678901234567890123456789012345.123456789012345678901234567891",
        "fl": _f32(1.1),  # the float32 exactly, not its 6 digits
        "db": 0.1,
        "bt": b"\x81",
        "ch": "ab",
        "vc": "Grüße 😀  ",
        "tx": 'line1\nline2\ttab "q" back\\slash',
        "bn": b"\x00\xff\x00\x01",
        "vb": b"\x00\xff\x10",
        "bl": b"\xde\xad\xbe\xef\x00\xff",
        "da": dt.date(2024, 2, 29),
        "tm": "-838:59:59.000000",
        "dt": dt.datetime(2024, 2, 29, 23, 59, 59, 123456),
        "ts": _utc(2024, 6, 1, 6, 30, 0, 500000),
        "yr": 2155,
        "js": Json(_MY_DOC_PARSED),
        "en": "y",
        "st": "a,c",  # definition order
    },
    "edges": {
        "ti": 127,
        "i": 2147483647,
        "ub": Decimal(0),
        "d38": Decimal("-9999999999999999999999999999.9999999999"),
        "d12": Decimal("0.00"),
        "d65": "99999999999999999999999999999999999.999999999999999999999999999999",
        "fl": _f32(-3.4e38),
        "db": 5e-324,
        "bt": b"\x00",
        "ch": "a",  # CHAR pads are not stored
        "vc": "",
        "tx": "",
        "bn": b"abcd",
        "vb": b"\x00",
        "bl": b"\xff\x00",
        "da": dt.date(1000, 1, 1),
        "tm": "838:59:59.999999",
        "dt": dt.datetime(1000, 1, 1),
        "ts": _utc(1970, 1, 1, 0, 0, 1),
        "yr": 1901,
        "js": Json([]),
        "en": "x",
        "st": "",
    },
    "more": {
        "ti": 0,
        "i": -2147483648,
        "ub": Decimal(9223372036854775808),
        "d38": Decimal("0.0000000001"),
        "d12": Decimal("-0.01"),
        "d65": "0.000000123000000000000000000000",
        "fl": 16777216.0,  # float32 rounds 2**24 + 1
        "db": -1.7976931348623157e308,
        "bt": b"\xff",
        "ch": "ÄÖÜ",
        "bn": b"\xff\x00\x00\x01",
        "vb": b"\xff",
        "bl": b"\x00",
        "da": dt.date(9999, 12, 31),
        "tm": "12:34:56.000001",
        "dt": dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
        "ts": _utc(2038, 1, 19, 3, 14, 7, 999999),
        "yr": 2000,
        "js": Json("😀 text"),
        "en": "z",
        "st": "a,b,c",
    },
    "nulls": {},
}


def _my_quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _my_run(cap: Capture, statements: list[str]) -> None:
    conn = mysql_connect(cap.url)
    try:
        with conn.cursor() as cur:
            # TIMESTAMP literals are read in the session zone and stored as UTC instants.
            cur.execute("SET time_zone = '+05:30'")
            cur.execute("START TRANSACTION")
            for statement in statements:
                cur.execute(statement)
            cur.execute("COMMIT")
    finally:
        conn.close()


MYSQL = Matrix(
    columns=MY_TYPES,
    ddl_suffix=" DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci",
    rows=MY_ROWS,
    landed=MY_LANDED,
    quote=_my_quote,
    run=_my_run,
)


# --- the test ---------------------------------------------------------------------------------


def _same(got: Any, want: Any) -> bool:
    """Equal, and of the same Python type: decimals with the same digits and exponent,
    datetimes with the same offset, JSON text parsing to the same document."""
    if isinstance(want, Json):
        if not isinstance(got, str):
            return False
        if want.text is not None and got != want.text:
            return False
        return bool(json.loads(got, parse_float=Decimal) == want.doc)
    if type(got) is not type(want):
        return False
    if isinstance(want, Decimal):
        return bool(got.as_tuple() == want.as_tuple())
    if isinstance(want, dt.datetime):
        return bool(got == want and got.utcoffset() == want.utcoffset())
    if isinstance(want, float):
        return struct.pack("<d", got) == struct.pack("<d", want)  # -0.0 is not 0.0
    return bool(got == want)


def _differences(got: Mapping[str, Any], want: Mapping[str, Any]) -> dict[str, Any]:
    return {
        c: (got.get(c), want.get(c)) for c in want.keys() | got.keys() if not _same(got[c], want[c])
    }


def _insert(matrix: Matrix, table: str, key: int, literals: Mapping[str, str]) -> str:
    columns = [c for c in matrix.types if c != "id"]
    values = [str(key), *(literals.get(c, "NULL") for c in columns)]
    names = ", ".join(matrix.quote(c) for c in ["id", *columns])
    return f"INSERT INTO {table} ({names}) VALUES ({', '.join(values)})"


def _update(matrix: Matrix, table: str, key: int, literals: Mapping[str, str]) -> str:
    columns = [c for c in matrix.types if c != "id"]
    sets = ", ".join(f"{matrix.quote(c)} = {literals.get(c, 'NULL')}" for c in columns)
    return f"UPDATE {table} SET {sets} WHERE id = {key}"


SOURCES = {"postgres": POSTGRES, "mysql": MYSQL}


# Every format on both databases with SNAPSHOTTER_CONVERGENCE_MATRIX=full; in CI Parquet on
# both, Delta on PostgreSQL, Iceberg on MariaDB (Delta's and Iceberg's appends are written
# from Arrow outside Spark: formats/delta_arrow.py, formats/iceberg_files.py).
FORMAT_CASES = [
    pytest.param(db, fmt, id=f"{db}-{fmt}")
    for fmt in ("parquet", "delta", "iceberg")
    for db in SOURCES
    if os.environ.get("SNAPSHOTTER_CONVERGENCE_MATRIX") == "full"
    or (db, fmt) in {("postgres", "parquet"), ("mysql", "parquet"), ("postgres", "delta")}
    or (db, fmt) == ("mysql", "iceberg")
]


@pytest.fixture
def source(request: pytest.FixtureRequest, db: str) -> tuple[Matrix, CaptureFactory]:
    fixture = "capture" if db == "postgres" else "mysql_capture"
    return SOURCES[db], request.getfixturevalue(fixture)


@pytest.mark.parametrize(("db", "fmt"), FORMAT_CASES)
def test_read_rows_and_log_rows_land_with_the_catalog_types_and_exact_values(
    source: tuple[Matrix, CaptureFactory], fmt: str
) -> None:
    matrix, make_capture = source
    cap = make_capture(sink="spark", sink_format=fmt)
    matrix = matrix.without(matrix.unsupported(cap))
    table = f"{matrix.quote(cap.schema)}.{matrix.quote(TABLE)}"
    names = list(matrix.rows)  # row name -> key: its position, from 1
    keys = {name: i for i, name in enumerate(names, 1)}
    assert set(matrix.landed) == set(names)
    for landed in matrix.landed.values():
        assert set(landed) <= set(matrix.types) - {"id"}

    # Snapshotted rows: READ rows.
    cap.sql(matrix.ddl(table))
    if cap.kind == "postgres":  # TOAST-able columns: a snapshot needs FULL
        cap.sql(f"ALTER TABLE {table} REPLICA IDENTITY FULL")
    matrix.run(cap, [_insert(matrix, table, keys[n], matrix.rows[n]) for n in names])
    cap.init()
    cap.execute(f"{cap.schema}.{TABLE}")
    assert cap.run() == 0
    # The same literals under new keys (log 'c' rows); "edges" updated to the values of
    # "typical" (a log 'u' row).
    matrix.run(
        cap,
        [
            *(_insert(matrix, table, keys[n] + LOG_KEY_OFFSET, matrix.rows[n]) for n in names),
            _update(matrix, table, keys["edges"], matrix.rows["typical"]),
        ],
    )
    assert cap.run() == 0
    # "more" updated to all NULLs, alone in its batch.
    matrix.run(cap, [_update(matrix, table, keys["more"], {})])
    assert cap.run() == 0

    lander = cap.lander()
    table_id = cap.table_id(TABLE)
    state = lander.current_state(table_id)
    changelog = lander.changelog(table_id)
    assert state is not None and changelog is not None

    # 1. The landed types are the catalog's, in the changelog, the current state and each
    # landed batch read alone (the last holds one row of NULLs only).
    def data_types(df: Any) -> dict[str, DataType]:
        return {f.name: f.dataType for f in df.schema.fields if f.name not in RESERVED_COLUMNS}

    assert data_types(state) == dict(matrix.types)
    assert data_types(changelog) == dict(matrix.types)
    # The changelog's before-images: the same columns, the same types.
    before = changelog.schema["__before"].dataType
    assert {f.name: f.dataType for f in before.fields} == dict(matrix.types)
    assert [f.name for f in state.schema.fields][: len(matrix.types)] == list(matrix.types)
    if fmt == "parquet":
        changelog_dir = Path(lander.table_path(table_id), "changelog")
        batches = sorted(changelog_dir.glob("batch-*.parquet"))  # one file per batch
        assert len(batches) >= 3, batches
        for batch in batches:
            assert data_types(lander.spark.read.parquet(str(batch))) == dict(matrix.types), batch
        (nulls,) = lander.spark.read.parquet(str(batches[-1])).toArrow().to_pylist()
        assert nulls["id"] == keys["more"]
        assert all(nulls[c] is None for c in matrix.types if c != "id")

    # 2. READ rows and log rows of the same values land equal, Python types included.
    events = changelog.toArrow().to_pylist()
    by_op: dict[str, dict[int, dict[str, Any]]] = {}
    for event in events:
        by_op.setdefault(event["__op"], {})[event["id"]] = event
    assert {op: sorted(rows) for op, rows in by_op.items()} == {
        "r": sorted(keys.values()),
        "c": sorted(k + LOG_KEY_OFFSET for k in keys.values()),
        "u": sorted([keys["edges"], keys["more"]]),
    }
    columns = [c for c in matrix.types if c != "id"]

    def data(row: Mapping[str, Any]) -> dict[str, Any]:
        return {c: row[c] for c in columns}

    for name, key in keys.items():
        read, logged = data(by_op["r"][key]), data(by_op["c"][key + LOG_KEY_OFFSET])
        assert not _differences(logged, read), (name, _differences(logged, read))
    updates = [(keys["edges"], "typical"), (keys["more"], "nulls")]
    for key, like in updates:
        updated, read = data(by_op["u"][key]), data(by_op["r"][keys[like]])
        assert not _differences(updated, read), (key, _differences(updated, read))

    # 3. The values survive exactly: the current state is what was written.
    current = {row["id"]: data(row) for row in state.toArrow().to_pylist()}
    expected_rows = {keys[n]: n for n in names}
    expected_rows.update({keys[n] + LOG_KEY_OFFSET: n for n in names})
    expected_rows.update({keys["edges"]: "typical", keys["more"]: "nulls"})
    assert sorted(current) == sorted(expected_rows)
    for key, name in sorted(expected_rows.items()):
        want = {c: matrix.landed[name].get(c) for c in columns}
        assert not _differences(current[key], want), (key, name, _differences(current[key], want))

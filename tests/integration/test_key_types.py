"""The key-type matrix: a table per primary-key column type each database allows, every one
snapshotted under a writer and checked row for row (issue 15, item 2).

One suite for PostgreSQL and MySQL (MariaDB here): a ``KeyCase`` names the key column's
type and its edge values (min/max, empty strings, NaN, infinities, YEAR 0000, the first
ENUM member, BIT 0x00/0x01/0xFF, case and trailing-space variants, ...) as SQL literals.
Each database runs its whole matrix once (a module-scoped run): every table is created and
seeded, one execute-snapshot signal names them all, and the engine pages them with chunks
of 2 rows, so every chunk boundary falls on an edge value, while a writer, called at each
step of each chunk (before the open watermark, in the window before and after the SELECT,
after the close watermark), inserts, updates, deletes and changes keys in that table. After
the snapshots end, every row is updated once more and the engine catches up.

Per case, then:

* the snapshot is ``done`` (or, for a type that cannot be paged in the database's order or
  represented, ``failed`` with the reason, the engine going on with the others);
* the materialized output equals the table, row for row (``Capture.verify``), once when the
  snapshots and the writer's changes have reached the sink (a row the snapshot missed is
  missing then: the final updates below would bring it in as a log event), and again at the
  end;
* READ key == log key for the same row: every row carries an id (``rid``) outside the key,
  and along each row's events in output order, every event's key equals the key of the
  row's event before it (a create, after a key change's delete, starts a new key); the
  final update of each row follows its READ, so a READ key and a log key are compared for
  every row READ and not re-keyed since.

Values in a slot (a list) are equal under the key's own equality (``'abc'`` and ``'ABC'``
under a case-insensitive collation, ``1.0`` and ``1.00`` as numeric, ``X'01'`` and
``X'0100'`` as BINARY(4)): only one of them is in the table at a time, and the writer
changes a row's key between them too (a case-only key change).
"""

from __future__ import annotations

import json
import random
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from signals.names import TableId
from snapshotter.engine.workers import ChunkTask, PhaseHooks
from snapshotter.sources.postgres import setup as pg_setup
from snapshotter.verify.rows import Verdict
from tests.integration.engine_harness import Capture, mysql_connect
from tests.integration.test_convergence import events, progress, wait_for

pytestmark = pytest.mark.integration

CHUNK = 2  # every chunk boundary falls on an edge value
SEED = 15

Variant = tuple[str, ...]  # one SQL literal per key column


@dataclass(frozen=True)
class KeyCase:
    name: str
    columns: tuple[str, ...]  # the key columns' SQL types, in key order ({s}: the schema)
    slots: tuple[tuple[Variant, ...], ...]  # each: values equal under the key's equality
    setup: tuple[str, ...] = ()  # statements before the table ({s}: the quoted schema)
    refused: str | None = None  # the snapshot fails at once, its error holding this
    loose: bool = False  # MySQL: written with sql_mode = '' (legacy values: zero dates...)
    primary_key: str | None = None  # MySQL: the PRIMARY KEY clause (prefix keys)
    extra: tuple[str, ...] = ()  # more column definitions (generated columns)

    @property
    def table(self) -> str:
        return f"k_{self.name}"


def case(name: str, column: str, *values: str | Sequence[str], **kwargs: Any) -> KeyCase:
    """A one-column key: each value a literal, or a list of literals equal as keys."""
    slots = tuple(
        ((v,),) if isinstance(v, str) else tuple((variant,) for variant in v) for v in values
    )
    return KeyCase(name, (column,), slots, **kwargs)


def composite(
    name: str, columns: Sequence[str], *slots: Variant | Sequence[Variant], **kwargs: Any
) -> KeyCase:
    """A key of several columns: each slot one tuple of literals, or a list of tuples
    equal as keys."""
    shaped: list[tuple[Variant, ...]] = []
    for slot in slots:
        if slot and isinstance(slot[0], str):
            shaped.append((tuple(str(v) for v in slot),))
        else:
            shaped.append(tuple(tuple(v) for v in slot))
    return KeyCase(name, tuple(columns), tuple(shaped), **kwargs)


TEXTS = ("''", "' '", "'a'", "'a '", "'A'", "'b'", "'é'", "'Z'", "'z'", "E'\\t'")

PG_CASES = [
    case("int2", "int2", "-32768", "-1", "0", "1", "2", "32767"),
    case("int4", "int4", "-2147483648", "0", "9", "10", "2147483647"),
    case("int8", "int8", "-9223372036854775808", "0", "1", "42", "9223372036854775807"),
    case(
        "numeric",
        "numeric",
        "'NaN'",
        "'-Infinity'",
        "'Infinity'",
        "'-1e20'",
        ["'0'", "'0.0'", "'-0.00'"],
        ["'1.0'", "'1.00'", "'1'"],
        "'0.000001'",
        "'1e20'",
    ),
    case(
        "numeric_scaled",
        "numeric(12,4)",
        "'-99999999.9999'",
        "'0'",
        "'NaN'",
        "'1.5'",
        "'99999999.9999'",
    ),
    case(
        "float8",
        "float8",
        "'NaN'",
        "'Infinity'",
        "'-Infinity'",
        ["'0'", "'-0'"],
        "'5e-324'",
        "'-1.5'",
        "'0.1'",
        "'1.7976931348623157e308'",
    ),
    # The case: NaN sorts above every number, so it is the maximum key, kept in state
    # (which used to fail validation and kill the engine, at every restart again).
    case("float8_nan_max", "float8", "'-1'", "'1'", "'NaN'"),
    case(
        "float4",
        "float4",
        "'NaN'",
        "'Infinity'",
        "'-Infinity'",
        "'0'",
        "'1.1'",
        "'-3.4e38'",
        "'1e-45'",
    ),
    case("text", "text", *TEXTS),
    case("text_c", 'text COLLATE "C"', *TEXTS),
    case("text_icu", 'text COLLATE "und-x-icu"', *TEXTS),
    case(
        "text_icu_ci",
        "text COLLATE {s}.ci",
        ["'abc'", "'ABC'", "'Abc'"],
        ["'é'", "'É'"],
        "''",
        "'b'",
        "'abd'",
        setup=(
            "CREATE COLLATION {s}.ci (provider = icu, locale = 'und-u-ks-level2', "
            "deterministic = false)",
        ),
    ),
    case("varchar", "varchar(10)", "''", "'a'", "'a '", "'a  '", "'A'"),
    case("bpchar", "char(3)", ["'a'", "'a '"], ["''", "' '", "'   '"], "'ab'", "'abc'", "'A'"),
    case("name", "name", "''", "'a'", "'B'", "'b'"),
    case("char1", '"char"', "'a'", "'b'", "'A'"),
    case(
        "bytea",
        "bytea",
        "'\\x'",
        "'\\x00'",
        "'\\x0000'",
        "'\\x01'",
        "'\\x7f'",
        "'\\xff'",
        "'\\xff00'",
    ),
    case(
        "uuid",
        "uuid",
        "'00000000-0000-0000-0000-000000000000'",
        "'ffffffff-ffff-ffff-ffff-ffffffffffff'",
        "'123e4567-e89b-12d3-a456-426614174000'",
        ["'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'"],
    ),
    case("bool", "bool", "false", "true"),
    case("date", "date", "'0001-01-01'", "'1970-01-01'", "'2024-02-29'", "'9999-12-31'"),
    case("time", "time", "'00:00'", "'00:00:00.000001'", "'12:00:00.5'", "'23:59:59.999999'"),
    case(
        "timetz",
        "timetz",
        "'00:00+14'",
        "'00:00-12'",
        "'12:00+00'",
        "'11:00-01'",
        "'23:59:59.999999-05'",
    ),
    case(
        "timestamp",
        "timestamp",
        "'0001-01-01 00:00:00'",
        "'1999-12-31 23:59:59'",
        "'2024-01-01 00:00:00.000001'",
        "'9999-12-31 23:59:59.999999'",
    ),
    case(
        "timestamptz",
        "timestamptz",
        "'0001-01-01 00:00:00+00'",
        ["'2024-01-01 00:00:00+00'", "'2024-01-01 05:30:00+05:30'"],
        "'2024-01-01 00:00:00.000001+00'",
        "'9999-12-31 23:59:59.999999+00'",
    ),
    case(
        "interval",
        "interval",
        ["'1 day'", "'24 hours'"],
        ["'1 mon'", "'30 days'"],
        "'-1 year'",
        "'0'",
        "'00:00:00.000001'",
        "'1 year 2 mons 3 days 04:05:06.789'",
    ),
    case(
        "inet",
        "inet",
        "'0.0.0.0'",
        "'10.0.0.1'",
        "'10.0.0.1/8'",
        "'192.168.0.0/16'",
        "'::1'",
        "'::ffff:1.2.3.4'",
    ),
    case("cidr", "cidr", "'0.0.0.0/0'", "'10.0.0.0/8'", "'10.0.0.0/16'", "'::/0'"),
    case(
        "macaddr",
        "macaddr",
        "'00:00:00:00:00:00'",
        "'08:00:2b:01:02:03'",
        "'ff:ff:ff:ff:ff:ff'",
        ["'08-00-2b-01-02-04'", "'08002b010204'"],
    ),
    case(
        "macaddr8",
        "macaddr8",
        "'00:00:00:00:00:00:00:00'",
        "'08:00:2b:01:02:03:04:05'",
        "'ff:ff:ff:ff:ff:ff:ff:ff'",
    ),
    case("money", "money", "'-92233720368547758.08'", "'0'", "'1.5'", "'92233720368547758.07'"),
    case("bit", "bit(8)", "B'00000000'", "B'00000001'", "B'10000000'", "B'11111111'"),
    case("varbit", "varbit", "B''", "B'0'", "B'00'", "B'1'", "B'10'"),
    case("oid", "oid", "0", "1", "4294967295"),
    case("pg_lsn", "pg_lsn", "'0/0'", "'1/1'", "'FFFFFFFF/FFFFFFFF'"),
    case(
        "enum",  # declaration order, not text order
        "{s}.mood",
        "'zz'",
        "'mm'",
        "'aa'",
        "'Zz'",
        setup=("CREATE TYPE {s}.mood AS ENUM ('zz', 'mm', 'aa', 'Zz')",),
    ),
    case(
        "domain",  # numeric order, not text order ('10' < '9' as text)
        "{s}.posint",
        "1",
        "2",
        "9",
        "10",
        "100",
        setup=("CREATE DOMAIN {s}.posint AS int CHECK (VALUE > 0)",),
    ),
    # A domain's values come in a SELECT as its base type, whose cast to text is not its
    # output function for these (which the log has): 'true' for 't', '10.0.0.1/32' for
    # '10.0.0.1', no trailing blanks.
    case("domain_bool", "{s}.dbool", "false", "true", setup=("CREATE DOMAIN {s}.dbool AS bool",)),
    case(
        "domain_bpchar",
        "{s}.dchar",
        "''",
        "'a'",
        "'ab'",
        "'A'",
        setup=("CREATE DOMAIN {s}.dchar AS char(3)",),
    ),
    case(
        "domain_inet",
        "{s}.dinet",
        "'10.0.0.1'",
        "'10.0.0.1/8'",
        "'::1'",
        setup=("CREATE DOMAIN {s}.dinet AS inet",),
    ),
    case(
        "int_array",
        "int[]",
        "'{}'",
        "'{1}'",
        "'{1,2}'",
        "'{2}'",
        "'{-1}'",
        "'{NULL}'",
        "'{{1,2},{3,4}}'",
    ),
    case("text_array", "text[]", "'{}'", "'{\"\"}'", "'{a}'", "'{\"a b\"}'", "'{A,b}'"),
    case(
        "composite_type",
        "{s}.pair",
        "'(1,a)'",
        "'(1,b)'",
        "'(2,)'",
        "'(,)'",
        "'(-1,\"x y\")'",
        setup=("CREATE TYPE {s}.pair AS (a int, b text)",),
    ),
    case(
        "int4range",
        "int4range",
        "'empty'",
        "'[1,5)'",
        "'[1,)'",
        "'(,)'",
        ["'[-10,-5)'", "'[-10,-6]'"],
    ),
    case("daterange", "daterange", "'empty'", "'[2024-01-01,2024-02-01)'", "'[,2024-01-01)'"),
    case(
        "jsonb",
        "jsonb",
        "'null'",
        "'true'",
        "'1'",
        "'\"a\"'",
        "'[]'",
        "'{}'",
        "'[1, 2]'",
        ["'{\"a\": 1}'", "'{\"a\":1}'"],
        '\'{"b": [1, {"c": null}]}\'',
    ),
    case("tsvector", "tsvector", "''", "'a'", "'a b'", "'b:1'", "'b:1A'"),
    composite(
        "composite_mix",
        ("float8", 'text COLLATE "C"', "bytea", "{s}.mood2", "timestamptz"),
        ("'NaN'", "'a'", "'\\x00'", "'zz'", "'-infinity'"),
        ("'NaN'", "'a'", "'\\x00'", "'aa'", "'2024-01-01 00:00:00+00'"),
        ("'NaN'", "'b'", "'\\x'", "'mm'", "'2024-01-01 00:00:00+00'"),
        ("'-Infinity'", "''", "'\\xff'", "'zz'", "'2024-01-01 00:00:00+00'"),
        [
            ("'0'", "'a'", "'\\x01'", "'mm'", "'2024-01-01 00:00:00+00'"),
            ("'-0'", "'a'", "'\\x01'", "'mm'", "'2024-01-01 01:00:00+01'"),
        ],
        ("'1'", "'a'", "'\\x01'", "'mm'", "'2024-01-01 00:00:00+00'"),
        ("'1'", "'a'", "'\\x01'", "'mm'", "'2024-01-01 00:00:00.000001+00'"),
        setup=("CREATE TYPE {s}.mood2 AS ENUM ('zz', 'mm', 'aa')",),
        refused="cannot represent",  # -infinity, in the first chunk
    ),
    composite(
        "composite_mix_finite",
        ("float8", 'text COLLATE "C"', "bytea", "{s}.mood3", "numeric"),
        ("'NaN'", "'a'", "'\\x00'", "'zz'", "'NaN'"),
        ("'NaN'", "'a'", "'\\x00'", "'aa'", "'1'"),
        ("'NaN'", "'b'", "'\\x'", "'mm'", "'-Infinity'"),
        ("'-Infinity'", "''", "'\\xff'", "'zz'", "'0'"),
        [
            ("'0'", "'a'", "'\\x01'", "'mm'", "'1.0'"),
            ("'-0'", "'a'", "'\\x01'", "'mm'", "'1.00'"),
        ],
        ("'1'", "'a'", "'\\x01'", "'mm'", "'1'"),
        ("'1'", "'a'", "'\\x01'", "'mm'", "'2'"),
        setup=("CREATE TYPE {s}.mood3 AS ENUM ('zz', 'mm', 'aa')",),
    ),
    case(
        # Not a key type: READ rows and log rows both leave it out (PostgreSQL 18, whose
        # publications init creates publishing stored generated columns: both carry it).
        "generated_column",
        "int4",
        "1",
        "2",
        "3",
        "4",
        extra=("g int GENERATED ALWAYS AS (v * 2) STORED",),
    ),
    # Values Python has no type for: the snapshot fails with the reason, never the engine.
    case(
        "date_infinity",
        "date",
        "'-infinity'",
        "'2024-01-01'",
        "'infinity'",
        refused="cannot represent",
    ),
    case(
        "timestamptz_infinity",
        "timestamptz",
        "'-infinity'",
        "'2024-01-01 00:00:00+00'",
        "'2024-06-01 00:00:00+00'",
        refused="cannot represent",
    ),
    case("time_24", "time", "'00:00'", "'12:00'", "'24:00:00'", refused="cannot represent"),
]

# An ENUM of 1001 members: compared by index (too long for member lists).
_LONG_ENUM = "enum(" + ",".join(f"'m{i:04d}'" for i in range(1001)) + ")"

MY_CASES = [
    case("tinyint", "tinyint", "-128", "0", "1", "127"),
    case("tinyint_unsigned", "tinyint unsigned", "0", "1", "255"),
    case("smallint", "smallint", "-32768", "0", "32767"),
    case("mediumint_unsigned", "mediumint unsigned", "0", "5", "16777215"),
    case("int", "int", "-2147483648", "0", "9", "10", "2147483647"),
    case("int_unsigned", "int unsigned", "0", "1", "4294967295"),
    case("bigint", "bigint", "-9223372036854775808", "0", "9223372036854775807"),
    case("bigint_unsigned", "bigint unsigned", "0", "9223372036854775808", "18446744073709551615"),
    case(
        "decimal",
        "decimal(10,3)",
        "-9999999.999",
        ["0", "0.000", "-0"],
        ["1.5", "1.50"],
        "0.001",
        "9999999.999",
    ),
    case(
        "decimal_65",
        "decimal(65,30)",
        "-99999999999999999999999999999999999.999999999999999999999999999999",
        "0",
        "0.000000000000000000000000000001",
    ),
    case("float", "float", "-3.4e38", ["0", "-0"], "1e-45", "1.1", "16777217", "3.4e38"),
    case(
        "double",
        "double",
        "-1.7976931348623157e308",
        ["0", "-0"],
        "5e-324",
        "0.1",
        "1.7976931348623157e308",
    ),
    case("date", "date", "'1000-01-01'", "'1970-01-01'", "'2024-02-29'", "'9999-12-31'"),
    case(
        "datetime",
        "datetime",
        "'1000-01-01 00:00:00'",
        "'2024-01-01 12:00:00'",
        "'9999-12-31 23:59:59'",
    ),
    case(
        "datetime6",
        "datetime(6)",
        "'1000-01-01 00:00:00'",
        "'2024-01-01 00:00:00'",
        "'2024-01-01 00:00:00.000001'",
        "'9999-12-31 23:59:59.999999'",
    ),
    case(
        "timestamp",
        "timestamp",
        "'1970-01-01 00:00:01'",
        "'2000-01-01 00:00:00'",
        "'2038-01-19 03:14:07'",
    ),
    case(
        "timestamp6",
        "timestamp(6)",
        "'1970-01-01 00:00:01'",
        "'2000-01-01 00:00:00.5'",
        "'2038-01-19 03:14:07.999999'",
    ),
    case(
        "timestamp_zero",
        "timestamp",
        "'0000-00-00 00:00:00'",
        "'1970-01-01 00:00:01'",
        "'2000-01-01 00:00:00'",
        loose=True,
    ),
    case("time", "time", "'-838:59:59'", "'-00:00:01'", "'00:00:00'", "'12:00:00'", "'838:59:59'"),
    case(
        "time6",
        "time(6)",
        "'-838:59:59'",
        "'-01:02:03.25'",
        "'-00:00:00.000001'",
        "'00:00:00'",
        "'12:00:00.5'",
        "'838:59:59'",
    ),
    case("time2", "time(2)", "'-01:00:00.5'", "'-00:00:00.01'", "'00:00:00.99'"),
    case("year", "year", "0", "1901", "1970", "2000", "2155"),
    case(
        "char_ci",
        "char(5) COLLATE utf8mb4_general_ci",
        ["'abc'", "'ABC'", "'abc '"],
        ["'é'", "'É'", "'e'"],
        "''",
        "'b'",
        "'Z'",
    ),
    case(
        "varchar_ci",
        "varchar(10) COLLATE utf8mb4_general_ci",
        ["'a'", "'A'", "'a '"],
        ["''", "' '"],
        "'b'",
        "'Z'",
        "'é'",
    ),
    case(
        "varchar_unicode_ci",
        "varchar(10) COLLATE utf8mb4_unicode_ci",
        ["'a'", "'A'"],
        "'b'",
        "'ß'",
        "''",
    ),
    case(
        "varchar_bin",
        "varchar(10) COLLATE utf8mb4_bin",
        ["'a'", "'a '"],
        "'A'",
        ["''", "' '"],
        "'b'",
    ),
    case(
        "varchar_nopad", "varchar(10) COLLATE utf8mb4_nopad_bin", "'a'", "'a '", "'A'", "''", "' '"
    ),
    case("varchar_latin1", "varchar(10) CHARACTER SET latin1", "''", "'a'", "'é'", "'Z'"),
    case(
        "binary",
        "binary(4)",
        ["X''", "X'00'", "X'00000000'"],
        ["X'01'", "X'0100'"],
        "X'00000001'",
        "X'FF'",
        "X'FFFFFFFF'",
    ),
    case("varbinary", "varbinary(8)", "X''", "X'00'", "X'0000'", "X'01'", "X'20'", "X'FF'"),
    case(
        "blob_prefix",
        "blob",
        ["X'00000000AA'", "X'00000000BB'"],
        "X''",
        "X'00'",
        "X'01'",
        "X'FFFFFFFF'",
        primary_key="PRIMARY KEY (k0(4))",
    ),
    case(
        "text_prefix",
        "text COLLATE utf8mb4_general_ci",
        ["'abcX'", "'ABCy'"],
        "''",
        "'b'",
        "'é'",
        primary_key="PRIMARY KEY (k0(3))",
    ),
    case(
        "enum",  # the case: the lowest index was never emitted
        "enum('zz','b''q','a\\\\b','É','x y','m') COLLATE utf8mb4_general_ci",
        "'nope'",  # not a member: stored as the error value '' (index 0) without strict mode
        ["'zz'", "'ZZ'"],
        "'b''q'",
        "'a\\\\b'",
        "'É'",
        "'x y'",
        "'m'",
        loose=True,
    ),
    # Text order against index order: the highest member sorts first as text.
    case("enum_first", "enum('z','b','a')", "'z'", "'b'", "'a'"),
    case("enum_long", _LONG_ENUM, "'m0000'", "'m0001'", "'m0500'", "'m1000'"),
    case(
        "set",
        "set('a','b','c','d')",
        "''",
        "'a'",
        "'b'",
        ["'a,b'", "'b,a'"],
        "'c'",
        "'a,b,c,d'",
        "'d'",
    ),
    case("bit8", "bit(8)", "b'0'", "b'1'", "b'10'", "b'10000000'", "b'11111111'"),
    case("bit1", "bit(1)", "b'0'", "b'1'"),
    case("bit12", "bit(12)", "b'0'", "b'1'", "b'100000000000'", "b'111111111111'"),
    case("bit64", "bit(64)", "0", "1", "9223372036854775808", "18446744073709551615"),
    case(
        "uuid",  # MariaDB's index order is not the text order
        "uuid",
        "'00000000-0000-0000-0000-000000000000'",
        "'ffffffff-ffff-ffff-ffff-ffffffffffff'",
        "'123e4567-e89b-12d3-a456-426614174000'",
        "'223e4567-e89b-12d3-a456-426614174000'",
        "'123e4567-e89c-12d3-a456-426614174000'",
        "'123e4567-e89b-42d3-a456-426614174000'",
        "'12345678-0000-1000-8000-000000000000'",
        ["'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'"],
    ),
    case(
        "inet6",
        "inet6",
        "'::'",
        "'::1'",
        "'1::'",
        "'::ffff:1.2.3.4'",
        "'::1.2.3.4'",
        "'2001:db8::1'",
        ["'1:0:0:1:0:0:0:1'", "'1:0:0:1::1'"],
        "'1:0:1:1:1:1:1:1'",
        "'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff'",
    ),
    case(
        "inet4", "inet4", "'0.0.0.0'", "'0.0.0.1'", "'1.0.0.0'", "'10.0.0.1'", "'255.255.255.255'"
    ),
    composite(
        "composite_mix",
        ("enum('b','a','c')", "bit(8)", "year", "varchar(5) COLLATE utf8mb4_general_ci"),
        ("'b'", "b'0'", "0", "'x'"),
        ("'b'", "b'0'", "0", "'y'"),
        [("'b'", "b'1'", "2000", "'x'"), ("'b'", "b'1'", "2000", "'X'")],
        ("'a'", "b'0'", "0", "''"),
        ("'a'", "b'11111111'", "2155", "'z'"),
        ("'c'", "b'1'", "1901", "'a'"),
        ("'c'", "b'1'", "1901", "'a b'"),
    ),
    composite(
        "composite_mix2",
        ("uuid", "time(6)", "decimal(5,2)", "inet6", "set('x','y')"),
        ("'00000000-0000-0000-0000-000000000000'", "'-00:00:00.5'", "0", "'::'", "''"),
        ("'00000000-0000-0000-0000-000000000000'", "'-00:00:00.5'", "0", "'::1'", "'x'"),
        ("'00000000-0000-0000-0000-000000000000'", "'00:00:00'", "-999.99", "'1::'", "'y'"),
        ("'123e4567-e89b-12d3-a456-426614174000'", "'00:00:00'", "1.5", "'::'", "'x,y'"),
        ("'223e4567-e89b-12d3-a456-426614174000'", "'-838:59:59'", "999.99", "'::'", "''"),
    ),
    case(
        "generated_columns",  # not a key type: the binlog carries them, READ rows too
        "int",
        "1",
        "2",
        "3",
        "4",
        extra=("g int AS (v * 2) VIRTUAL", "p int AS (v * 3) PERSISTENT"),
    ),
    # Refused when the snapshot starts or reaches the value, with the reason.
    case("enum_empty_member", "enum('','a','b')", "'a'", "'b'", refused="empty string"),
    case(
        "zero_date",
        "date",
        "'0000-00-00'",
        "'2024-01-01'",
        "'2024-06-01'",
        loose=True,
        refused="zero part",
    ),
]


# --- the databases ----------------------------------------------------------------------------


@dataclass
class Database:
    """How the suite talks to one server."""

    kind: str  # "postgres" or "mysql"
    cap: Capture
    quote: Callable[[str], str]
    connect: Callable[[], Any]  # an autocommit DB-API connection

    def qualified(self, name: str) -> str:
        return f"{self.quote(self.cap.schema)}.{self.quote(name)}"

    def format(self, text: str) -> str:
        return text.replace("{s}", self.quote(self.cap.schema))

    def create(self, key: KeyCase) -> None:
        columns = [f"k{i} {self.format(t)} NOT NULL" for i, t in enumerate(key.columns)]
        names = ", ".join(f"k{i}" for i in range(len(key.columns)))
        primary = key.primary_key or f"PRIMARY KEY ({names})"
        body = ", ".join([*columns, "rid int NOT NULL", "v int NOT NULL", *key.extra, primary])
        statements = [self.format(s) for s in key.setup]
        if self.kind == "postgres":
            statements.append(f"CREATE TABLE {self.qualified(key.table)} ({body})")
            # The whole old row in the log: every event of a row carries its rid.
            statements.append(f"ALTER TABLE {self.qualified(key.table)} REPLICA IDENTITY FULL")
        else:
            statements.append(
                f"CREATE TABLE {self.qualified(key.table)} ({body}) DEFAULT CHARSET=utf8mb4"
            )
        conn = self.connect()
        try:
            for statement in statements:
                _execute(conn, statement)
        finally:
            conn.close()


def _execute(conn: Any, statement: str) -> None:
    with conn.cursor() as cur:
        cur.execute(statement)  # no parameters: a '%' is literal


def _pg_quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _my_quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


# --- the writer -------------------------------------------------------------------------------


@dataclass
class _Table:
    key: KeyCase
    rows: dict[int, tuple[int, int]] = field(default_factory=dict)  # rid -> (slot, variant)
    free: set[int] = field(default_factory=set)  # slots without a row


class EdgeWriter:
    """Inserts, updates, deletes and key changes by row id (``rid``), values from each
    case's slots; called by the chunk worker at every step of a chunk (``hooks``)."""

    def __init__(self, db: Database, cases: Sequence[KeyCase], seed: int) -> None:
        self.db = db
        self.rng = random.Random(seed)
        self.tables = {c.table: _Table(c) for c in cases}
        self.next_rid = 1
        self.counts: dict[str, int] = {}
        self.errors: list[str] = []
        self._conn: Any = None
        self._lock = threading.Lock()

    def _sql(self, key: KeyCase, *statements: str) -> None:
        if self._conn is None:
            self._conn = self.db.connect()
        if self.db.kind == "mysql":
            mode = "''" if key.loose else "DEFAULT"
            _execute(self._conn, f"SET SESSION sql_mode = {mode}")
        for statement in statements:
            _execute(self._conn, statement)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _set(self, key: KeyCase, variant: Variant) -> str:
        return ", ".join(f"k{i} = {self.db.format(v)}" for i, v in enumerate(variant))

    def seed(self) -> None:
        """Every slot but one or two (of cases with more than three) gets a row."""
        for table in self.tables.values():
            slots = list(range(len(table.key.slots)))
            self.rng.shuffle(slots)
            keep_free = 2 if len(slots) > 5 else 1 if len(slots) > 3 else 0
            if table.key.refused is not None:
                keep_free = 0  # every value is there for the snapshot to meet
            table.free = set(slots[:keep_free])
            values = []
            for slot in slots[keep_free:]:
                variant = self.rng.randrange(len(table.key.slots[slot]))
                rid = self._new_rid()
                table.rows[rid] = (slot, variant)
                literals = [self.db.format(v) for v in table.key.slots[slot][variant]]
                values.append(f"({', '.join(literals)}, {rid}, 0)")
            self._sql(table.key, f"{self._insert(table.key)} VALUES {', '.join(values)}")

    def _insert(self, key: KeyCase) -> str:
        names = ", ".join(f"k{i}" for i in range(len(key.columns)))
        return f"INSERT INTO {self.db.qualified(key.table)} ({names}, rid, v)"

    def _new_rid(self) -> int:
        rid = self.next_rid
        self.next_rid += 1
        return rid

    def change(self, table_name: str) -> None:
        """One random change in ``table_name``, committed."""
        table = self.tables[table_name]
        key = table.key
        if key.refused is not None:
            return  # its values stay as they are, for the snapshot to meet them
        target = self.db.qualified(key.table)
        kinds = ["update", "update", "insert", "insert", "key_change", "key_change"]
        if len(table.rows) > 2:  # a table never empties: its rows are READ, then logged
            kinds.append("delete")
        kind = self.rng.choice(kinds if table.rows else ["insert"])
        if kind == "insert" and not table.free:
            kind = "update" if table.rows else "none"
        if kind == "none":
            return
        if kind == "insert":
            slot = self.rng.choice(sorted(table.free))
            variant = self.rng.randrange(len(key.slots[slot]))
            rid = self._new_rid()
            literals = [self.db.format(v) for v in key.slots[slot][variant]]
            self._sql(key, f"{self._insert(key)} VALUES ({', '.join(literals)}, {rid}, 0)")
            table.free.discard(slot)
            table.rows[rid] = (slot, variant)
        else:
            rid = self.rng.choice(sorted(table.rows))
            slot, variant = table.rows[rid]
            if kind == "update":
                self._sql(key, f"UPDATE {target} SET v = v + 1 WHERE rid = {rid}")
            elif kind == "delete":
                self._sql(key, f"DELETE FROM {target} WHERE rid = {rid}")
                del table.rows[rid]
                table.free.add(slot)
            else:  # to a free slot, or to another value equal to its own (a case change)
                choices = [(s, v) for s in table.free for v in range(len(key.slots[s]))]
                choices += [(slot, v) for v in range(len(key.slots[slot])) if v != variant]
                if not choices:
                    self._sql(key, f"UPDATE {target} SET v = v + 1 WHERE rid = {rid}")
                    kind = "update"
                else:
                    new_slot, new_variant = self.rng.choice(sorted(choices))
                    assignment = self._set(key, key.slots[new_slot][new_variant])
                    self._sql(key, f"UPDATE {target} SET {assignment} WHERE rid = {rid}")
                    table.free.discard(new_slot)
                    if new_slot != slot:
                        table.free.add(slot)
                    table.rows[rid] = (new_slot, new_variant)
        self.counts[kind] = self.counts.get(kind, 0) + 1

    def hook(self, share: float, in_window: bool = False) -> Callable[[ChunkTask], None]:
        """A hook making a change in the chunk's table, in a ``share`` of the chunks (of
        all but the first, ``in_window``: the first chunk's rows are always READ)."""

        def hook(task: ChunkTask) -> None:
            with self._lock:
                if (in_window and task.number == 1) or self.rng.random() >= share:
                    return
                try:
                    self.change(task.table.table)
                except Exception as exc:  # kept for the test: a hook's error fails the chunk
                    self.errors.append(f"{task.table}: {type(exc).__name__}: {exc}")

        return hook

    def hooks(self) -> PhaseHooks:
        # A change before every chunk and after it (after its READ rows), and sometimes one
        # inside the window, before or after the SELECT: a chunk of two rows then still
        # emits READ rows, mostly, which the test compares with later log events.
        return PhaseHooks(
            before_open=self.hook(1.0),
            after_open=self.hook(0.3, in_window=True),
            after_read=self.hook(0.3, in_window=True),
            after_close=self.hook(1.0),
        )

    def touch_all(self) -> None:
        """Update every row once (a log event after each row's READ)."""
        for table in self.tables.values():
            if table.key.refused is None:
                self._sql(table.key, f"UPDATE {self.db.qualified(table.key.table)} SET v = v + 1")


# --- one run per database ---------------------------------------------------------------------


@dataclass
class MatrixRun:
    db: Database
    writer: EdgeWriter
    statuses: dict[str, dict[str, Any]]  # table -> its snapshot record in status
    # table -> the convergence check once the snapshot and its writer's changes reached the
    # sink, before the final update of every row (which alone would bring a row the
    # snapshot missed into the output, as a log event)
    after_snapshot: dict[str, Verdict]


def _run_matrix(db: Database, cases: Sequence[KeyCase]) -> MatrixRun:
    for key in cases:
        db.create(key)
    writer = EdgeWriter(db, cases, SEED)
    try:
        writer.seed()
        db.cap.init()
        db.cap.execute(*(f"{db.cap.schema}.{c.table}" for c in cases))
        engine = db.cap.start(hooks=writer.hooks())
        wait_for(
            lambda: all(
                progress(db.cap, c.table).get("state") in ("done", "failed", "stopped")
                for c in cases
            ),
            "every snapshot of the matrix to end",
            timeout=240,
            engine=engine,
        )
        # 2: a snapshot failed (the refused cases); the engine went on with the others.
        expected = 2 if any(c.refused for c in cases) else 0
        assert engine.stop(timeout=120) == expected
        assert db.cap.run(timeout=120) == 0  # every change so far reaches the sink
        verdicts = {c.table: db.cap.verify(c.table) for c in cases if c.refused is None}
        # A table of three rows can lose every READ row to the writer's in-window changes
        # (more so with chunk SELECTs in flight on two connections, the writer called from
        # both): legitimate DBLog, but then no READ key met a log key. Such tables are
        # snapshotted once more without the writer, so each case compares them.
        unread = [
            f"{db.cap.schema}.{c.table}"
            for c in cases
            if c.refused is None
            and not any(e["value"]["op"] == "r" for e in events(db.cap, c.table))
        ]
        if unread:
            db.cap.execute(*unread)
            assert db.cap.run(timeout=120) == 0
        writer.touch_all()
        assert db.cap.run(timeout=120) == 0
    finally:
        writer.close()
    statuses = {c.table: progress(db.cap, c.table) for c in cases}
    return MatrixRun(db, writer, statuses, verdicts)


@pytest.fixture(scope="module")
def matrix(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str], MatrixRun]]:
    """The matrix run of a database (``postgres`` or ``mysql``), run once, on first use."""
    runs: dict[str, MatrixRun] = {}
    cleanups: list[Callable[[], None]] = []

    def get(kind: str) -> MatrixRun:
        if kind not in runs:
            db = (
                _postgres(request, tmp_path_factory, cleanups)
                if kind == "postgres"
                else (_mysql(request, tmp_path_factory, cleanups))
            )
            runs[kind] = _run_matrix(db, PG_CASES if kind == "postgres" else MY_CASES)
        return runs[kind]

    yield get
    for cleanup in reversed(cleanups):
        cleanup()


def _postgres(
    request: pytest.FixtureRequest,
    tmp: pytest.TempPathFactory,
    cleanups: list[Callable[[], None]],
) -> Database:
    url: str = request.getfixturevalue("pg_url")
    engine: sa.Engine = request.getfixturevalue("pg_engine")
    schema = f"t_keys_{uuid.uuid4().hex[:10]}"
    with engine.begin() as conn:
        conn.execute(sa.schema.CreateSchema(schema))

    def drop() -> None:
        with engine.begin() as conn:
            conn.execute(sa.schema.DropSchema(schema, cascade=True))

    cleanups.append(drop)
    cap = Capture(url, schema, Path(tmp.mktemp("keys_pg")), chunk_size=CHUNK)
    cleanups.append(cap.cleanup)
    return Database("postgres", cap, _pg_quote, lambda: psycopg.connect(url, autocommit=True))


def _mysql(
    request: pytest.FixtureRequest,
    tmp: pytest.TempPathFactory,
    cleanups: list[Callable[[], None]],
) -> Database:
    server_url: str = request.getfixturevalue("mysql_url")
    engine: sa.Engine = request.getfixturevalue("mysql_engine")
    name = f"t_keys_{uuid.uuid4().hex[:10]}"
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f"CREATE DATABASE {_my_quote(name)} CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci"
        )

    def drop() -> None:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {_my_quote(name)}")

    cleanups.append(drop)
    url = sa.make_url(server_url).set(database=name).render_as_string(hide_password=False)
    cap = Capture(url, name, Path(tmp.mktemp("keys_mysql")), chunk_size=CHUNK, kind="mysql")
    return Database("mysql", cap, _my_quote, lambda: mysql_connect(url))


# --- the checks -------------------------------------------------------------------------------


def _row_of(event: dict[str, Any]) -> dict[str, Any]:
    value = event["value"]
    row: dict[str, Any] = value["after"] if value["after"] is not None else value["before"]
    return row


def key_chain_problems(table_events: Sequence[dict[str, Any]]) -> tuple[list[str], int]:
    """Along each row's events (by ``rid``) in output order: every event's key must be the
    key of the row's event before it, unless it is a create (a key change's delete, then
    create, as Debezium writes it). Returns the breaks and how many times a log event
    followed the row's READ (each one a READ key compared with a log key)."""
    last: dict[int, tuple[str, str]] = {}  # rid -> (op, canonical key) of its last event
    problems: list[str] = []
    read_then_log = 0
    for event in table_events:
        op = event["value"]["op"]
        rid = _row_of(event)["rid"]
        key = json.dumps(event["key"], sort_keys=True)
        before = last.get(rid)
        if op != "c" and before is not None and before[1] != key:
            problems.append(f"rid {rid}: {before[0]!r} event key {before[1]}, then {op!r} {key}")
        if before is not None and before[0] == "r" and op in ("u", "d"):
            read_then_log += 1
        if op == "d":
            last.pop(rid, None)
        else:
            last[rid] = (op, key)
    return problems, read_then_log


def _cases() -> list[Any]:
    return [
        *(pytest.param("postgres", c, id=f"postgres-{c.name}") for c in PG_CASES),
        *(pytest.param("mysql", c, id=f"mysql-{c.name}") for c in MY_CASES),
    ]


@pytest.mark.parametrize(("kind", "key"), _cases())
def test_key_type_snapshots_converge_and_read_keys_equal_log_keys(
    matrix: Callable[[str], MatrixRun], kind: str, key: KeyCase
) -> None:
    run = matrix(kind)
    assert not run.writer.errors, run.writer.errors
    status = run.statuses[key.table]
    if key.refused is not None:
        assert status.get("state") == "failed", status
        assert key.refused in (status.get("error") or ""), status
        return
    assert status.get("state") == "done", status
    assert status["chunks"] >= 1, status
    if key.name == "float8_nan_max":  # all three seeded: NaN was the maximum at the start
        # status --json writes a non-finite float as its text (strict JSON has no NaN)
        assert status["max_key"][0] == "nan", status
    verdict = run.after_snapshot[key.table]
    assert verdict.ok, verdict.render()
    cap = run.db.cap
    verdict = cap.verify(key.table)  # after every row's last update
    assert verdict.ok, verdict.render()
    table_events = events(cap, key.table)
    ops = {e["value"]["op"] for e in table_events}
    assert "r" in ops and "u" in ops, ops
    problems, read_then_log = key_chain_problems(table_events)
    assert not problems, problems[:5]
    # The final update of every row that was READ and not changed since follows its READ.
    assert read_then_log > 0
    if key.extra:
        version = int(cap.sql("SHOW server_version_num")[0][0]) if kind == "postgres" else 0
        _check_generated_columns(kind, table_events, version)


def _check_generated_columns(
    kind: str, table_events: Sequence[dict[str, Any]], pg_version: int
) -> None:
    for event in table_events:
        for row in (event["value"]["before"], event["value"]["after"]):
            if row is None:
                continue
            if kind == "postgres" and pg_version < 180000:
                assert "g" not in row, event  # the log cannot carry it: READ rows leave it out
            elif kind == "postgres":  # 18 publishes it: READ and log rows, with its values
                assert row["g"] == row["v"] * 2, event
            else:  # the binlog carries them: so do READ rows, with their values
                assert (row["g"], row["p"]) == (row["v"] * 2, row["v"] * 3), event


def _pg_version(pg_url: str) -> int:
    with psycopg.connect(pg_url) as conn:
        row = conn.execute("SHOW server_version_num").fetchone()
    assert row is not None
    return int(row[0])


def test_init_warns_about_generated_columns_the_log_does_not_carry(
    pg_url: str, pg_schema: str
) -> None:
    version = _pg_version(pg_url)
    virtual = ", tripled int GENERATED ALWAYS AS (x * 3) VIRTUAL" if version >= 180000 else ""
    unpublished = f"p_{uuid.uuid4().hex[:10]}"  # created as before PostgreSQL 18
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {_pg_quote(pg_schema)}.gen (id int PRIMARY KEY, x int, "
            f"doubled int GENERATED ALWAYS AS (x * 2) STORED{virtual})"
        )
        conn.execute(f"CREATE PUBLICATION {unpublished} FOR TABLE {_pg_quote(pg_schema)}.gen")
    try:
        for publication in (f"p_{uuid.uuid4().hex[:10]}", unpublished):  # init's, then not
            problems = pg_setup.check_prerequisites(
                pg_url, [TableId(pg_schema, "gen")], f"s_{uuid.uuid4().hex[:10]}", publication
            )
            (problem,) = [p for p in problems if "generated" in p.what]
            assert problem.severity == "warning"
            assert f"{pg_schema}.gen" in problem.what and "pgoutput" in problem.what
            # 18: the publication init creates publishes the stored one (never a virtual one).
            carried = version >= 180000 and publication != unpublished
            assert ("doubled" in problem.what) is not carried, problem
            assert ("tripled" in problem.what) is bool(virtual), problem
            republish = f"ALTER PUBLICATION {publication} SET (publish_generated_columns"
            assert (republish in problem.fix) is (version >= 180000 and not carried), problem
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"DROP PUBLICATION {unpublished}")


def test_a_generated_primary_key_the_log_does_not_carry_is_refused_when_the_snapshot_starts(
    pg_url: str, pg_schema: str
) -> None:
    from snapshotter.sources.base import TableError
    from snapshotter.sources.postgres.dialect import PostgresDialect

    version = _pg_version(pg_url)
    unpublished = f"p_{uuid.uuid4().hex[:10]}"  # publishes no generated column
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {_pg_quote(pg_schema)}.genkey (x int NOT NULL, "
            "k int GENERATED ALWAYS AS (x + 1) STORED PRIMARY KEY, v int)"
        )
        conn.execute(f"CREATE PUBLICATION {unpublished} FOR TABLE {_pg_quote(pg_schema)}.genkey")
    try:
        dialect = PostgresDialect(pg_url, TableId(pg_schema, "sig"), unpublished)
        try:
            schema = dialect.describe(TableId(pg_schema, "genkey"))
            assert schema.column_names == ("x", "v")  # as the log has the row
            with pytest.raises(TableError, match=r"generated column\(s\) k.*surrogate-key"):
                dialect.snapshot_key(schema, None)
        finally:
            dialect.close()
        if version < 180000:
            return
        # 18: init's publication (not created yet here) publishes k: a key like another.
        dialect = PostgresDialect(pg_url, TableId(pg_schema, "sig"), f"p_{uuid.uuid4().hex[:10]}")
        try:
            schema = dialect.describe(TableId(pg_schema, "genkey"))
            assert schema.column_names == ("x", "k", "v")
            assert dialect.snapshot_key(schema, None) == ("k",)
        finally:
            dialect.close()
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"DROP PUBLICATION {unpublished}")

"""Convergence: replayed in file order, the engine's output equals the table, row for row.

Every test builds tables, runs the real engine (``engine_harness.Capture``) while something
writes to them, and checks the output with ``Capture.verify``: materialized by key in file
order (deletes remove, a truncate clears), it must equal the table, and no key's
``source.pos`` may go back.

The suite is written once for every source database: what differs per database (DDL, the
SQL that seeds rows, the writer's value generators, how to connect) lives in a ``Source``
built by the ``source`` fixture, parametrized over PostgreSQL and MySQL (MariaDB here).
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import signal
import string
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from signals.names import TableId
from snapshotter.engine.workers import ChunkTask, PhaseHooks
from snapshotter.sources.postgres import types as pg_types
from snapshotter.sources.postgres.dialect import PostgresDialect
from snapshotter.sources.postgres.scan import read_table_rows
from snapshotter.verify.rows import Verdict, compare, materialize
from tests.integration.engine_harness import Capture, CaptureFactory, EngineThread, mysql_connect
from tests.integration.writer import KINDS, RandomWriter

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
Key = tuple[Any, ...]
Row = dict[str, Any]
Hook = Callable[[ChunkTask], None]

# CI's slice runs every scenario at half the volume (its 45-minute budget: 25 windows or more
# per snapshot, thousands of changes inside them); SNAPSHOTTER_CONVERGENCE_MATRIX=full at the
# whole.
_IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
_FULL_VOLUME = os.environ.get("SNAPSHOTTER_CONVERGENCE_MATRIX") == "full" or not _IN_CI
ROWS = 50_000 if _FULL_VOLUME else 25_000  # rows in each convergence table
CHANGES = 5_000 if _FULL_VOLUME else 2_500  # changes the writer commits while the snapshot runs
CHUNK = 1_000
# The parted tables' range bounds: seeded keys (10 apart) fill the first three partitions and
# some of the last, new keys (up to 12 x ROWS) all four, whatever the volume.
PART_BOUNDS = (ROWS * 3, ROWS * 6, ROWS * 9)


# --- what differs per source database ---------------------------------------------------------


@dataclass(frozen=True)
class Table:
    """One scenario's table on one source: DDL, seed rows, the writer's value generators."""

    name: str
    ddl: Sequence[str]  # statements; {s} is the quoted schema
    seed: str  # fills the table with {n} rows
    key: tuple[str, ...]
    new_key: Callable[[random.Random, int], Key]  # (rng, seeded rows) -> a key
    new_row: Callable[[random.Random, Key], Row]  # non-key columns (a subset is fine)


@dataclass
class Source:
    name: str
    schema: str  # the test's schema, where every capture works
    make_capture: CaptureFactory
    tables: Mapping[str, Table]
    quote: Callable[[str], str]  # an identifier, quoted
    connect: Callable[[Capture], Any]  # a DB-API connection in autocommit mode
    other_schema: Callable[[Capture], Any]  # context manager: a schema outside the capture
    # Capture.verify with a chosen key: the harness keys a table without a primary key by
    # all its columns, a surrogate-key snapshot keys its events by the surrogate key.
    verify_by: Callable[[Capture, str, Sequence[str]], Verdict]
    logged: Callable[[Capture, str], bool]  # whether the log carries a table now
    # Whether the log carries every table without setup (MySQL's binlog) or only those
    # added to the capture (PostgreSQL's publication).
    logs_every_table: bool = False
    # What the error for a table without a primary key must say.
    no_key_phrases: Sequence[str] = ("no primary key", "surrogate-key")

    def capture(self, **kwargs: Any) -> Capture:
        return self.make_capture(**kwargs)

    def sql(
        self, cap: Capture, template: str, params: Sequence[Any] = (), schema: str | None = None
    ) -> list[tuple[Any, ...]]:
        """Run ``template`` with ``{s}`` replaced by the quoted schema (the test's)."""
        text = template.format(s=self.quote(schema or cap.schema))
        # No parameters: None, so that a '%' operator is not taken for a placeholder.
        return cap.sql(text, params or None)  # type: ignore[arg-type]

    def create(
        self, cap: Capture, table: Table | str, rows: int, schema: str | None = None
    ) -> Table:
        spec = self.tables[table] if isinstance(table, str) else table
        for statement in spec.ddl:
            self.sql(cap, statement, schema=schema)
        if rows:
            self.sql(cap, spec.seed.replace("{n}", str(rows)), schema=schema)
        return spec

    def insert(self, cap: Capture, table: str, rows: Sequence[tuple[Any, ...]]) -> None:
        """Insert ``rows`` (every column, in order) into ``table``, one transaction."""
        marks = ", ".join(["%s"] * len(rows[0]))
        conn = self.connect(cap)
        try:
            conn.autocommit = False
            with conn.cursor() as cur:
                cur.executemany(
                    f"INSERT INTO {self.quote(cap.schema)}.{self.quote(table)} VALUES ({marks})",
                    list(rows),
                )
            conn.commit()
        finally:
            conn.close()

    def writer(
        self, cap: Capture, table: Table, rows: int, schema: str | None = None, **kwargs: Any
    ) -> RandomWriter:
        rng = random.Random(kwargs.pop("seed", None))
        return RandomWriter(
            cap.url,
            TableId(schema or cap.schema, table.name),
            table.key,
            new_key=lambda: table.new_key(rng, rows),
            new_row=lambda key: table.new_row(rng, key),
            seed=rng.randrange(2**32),
            **kwargs,
        )


def _maybe(rng: random.Random, value: Any, share: float = 0.1) -> Any:
    return None if rng.random() < share else value


def _letters(rng: random.Random, k: int) -> str:
    return "".join(rng.choices(string.ascii_letters + string.digits, k=k))


TEXTS = ("plain", 'quote " and \\ backslash', "tab\tcr\r\nlf", "ünïcødé ß é", "emoji 🐘", "")
BIG_KEY = 10**12  # keys of the bigint scenario start here
T0 = datetime(2024, 1, 1, tzinfo=UTC)
HOUR = timedelta(hours=1, microseconds=123)
IST = timezone(timedelta(hours=5, minutes=30))


def _items_row(rng: random.Random, key: Key) -> Row:
    return {
        "a": rng.randrange(10),
        "name": rng.choice(TEXTS) + _letters(rng, 8),
        "n": _maybe(rng, rng.randint(-1000, 1000)),
    }


def _wide_row(rng: random.Random, key: Key) -> Row:
    if rng.random() < 0.3:  # small columns only: TOASTed values stay unchanged in updates
        return {"i": _maybe(rng, rng.randint(-(2**31), 2**31 - 1)), "f": rng.random() < 0.5}
    big = _letters(rng, 10_000) if rng.random() < 0.2 else "short"
    doc = {"r": rng.random(), "s": rng.choice(TEXTS), "l": [1, None, True, 2.5], "n": {"k": 1}}
    return {
        "i": _maybe(rng, rng.randint(-(2**31), 2**31 - 1)),
        "b": _maybe(rng, rng.randint(-(2**63), 2**63 - 1)),
        "n": _maybe(rng, Decimal(rng.randint(-(10**12), 10**12)).scaleb(-rng.randint(0, 6))),
        "t": _maybe(rng, rng.choice(TEXTS) + _letters(rng, 5)),
        "v": _maybe(rng, "v" + _letters(rng, rng.randint(0, 30))),
        "f": _maybe(rng, rng.random() < 0.5),
        "u": _maybe(rng, uuid.UUID(int=rng.getrandbits(128), version=4)),
        "d": _maybe(rng, date(1900, 1, 1) + timedelta(days=rng.randint(0, 80_000))),
        "ts": _maybe(
            rng, T0.astimezone(IST) + timedelta(microseconds=rng.randint(-(10**15), 10**15))
        ),
        "raw": _maybe(rng, rng.randbytes(rng.choice((0, 1, 16, 9_000)))),
        "doc": _maybe(rng, Jsonb(doc)),
        "big": _maybe(rng, big),
    }


def postgres_tables() -> dict[str, Table]:
    def full(name: str) -> str:
        return f"ALTER TABLE {{s}}.{name} REPLICA IDENTITY FULL"

    tables = [
        Table(
            "items",  # (a) a bigint key; also the plain table of the functional tests
            [
                "CREATE TABLE {s}.items (id bigint PRIMARY KEY, a int NOT NULL, name text, n int)",
                full("items"),
            ],
            f"INSERT INTO {{s}}.items SELECT {BIG_KEY} + g * 10, g % 10, 'item ' || g, g "
            "FROM generate_series(1, {n}) g",
            ("id",),
            lambda rng, n: (BIG_KEY + rng.randint(1, n * 12),),  # a sixth beyond the maximum
            _items_row,
        ),
        Table(
            "composite",  # (b) a composite (int, text) key
            [
                "CREATE TABLE {s}.composite (region int, code text, payload text, "
                "amount numeric, PRIMARY KEY (region, code))",
                full("composite"),
            ],
            "INSERT INTO {s}.composite SELECT g % 40, chr(65 + g % 26) || chr(97 + g / 26 % 26)"
            " || CASE WHEN g % 7 = 0 THEN 'é' WHEN g % 7 = 1 THEN ' ' ELSE '-' END || g, "
            "'payload ' || g, g / 100.0 FROM generate_series(1, {n}) g",
            ("region", "code"),
            lambda rng, n: (
                rng.randint(0, 44),
                rng.choice("AbéZß 0-") + _letters(rng, rng.randint(1, 8)),
            ),
            lambda rng, key: {
                "payload": rng.choice(TEXTS) + _letters(rng, 6),
                "amount": _maybe(rng, Decimal(rng.randint(-(10**8), 10**8)).scaleb(-2)),
            },
        ),
        Table(
            "typed",  # (c) timestamptz, numeric and uuid in one key; ties on the first two
            [
                "CREATE TABLE {s}.typed (ts timestamptz, n numeric, u uuid, note text, "
                "PRIMARY KEY (ts, n, u))",
                full("typed"),
            ],
            "INSERT INTO {s}.typed SELECT TIMESTAMPTZ '2024-01-01 00:00:00+00' + g % 20 * "
            "INTERVAL '1 hour 0.000123 second', round(g / 20 % 100 / 4.0 - 10, 2), "
            "md5(g::text)::uuid, 'note ' || g FROM generate_series(1, {n}) g",
            ("ts", "n", "u"),
            lambda rng, n: (
                (T0 + rng.randint(0, 24) * HOUR).astimezone(IST),
                Decimal(rng.randint(-1_200, 1_800)).scaleb(-2),
                uuid.UUID(int=rng.getrandbits(128), version=4),
            ),
            lambda rng, key: {"note": _maybe(rng, rng.choice(TEXTS) + _letters(rng, 4))},
        ),
        Table(
            "wide",  # (d) every common type, NULLs, values over 8 KB (TOAST)
            [
                "CREATE TABLE {s}.wide (id int PRIMARY KEY, i int, b bigint, n numeric, t text,"
                " v varchar(40), f bool, u uuid, d date, ts timestamptz, raw bytea, doc jsonb,"
                " big text)",
                full("wide"),
            ],
            "INSERT INTO {s}.wide SELECT g, CASE WHEN g % 17 <> 0 THEN g * 7919 % 2000000 - "
            "1000000 END, CASE WHEN g % 19 <> 0 THEN g * 1000000007::bigint END, "
            "CASE WHEN g % 23 <> 0 THEN round(g / 7.0, 6) END, 'text ' || g || E' é\\t\"q\"',"
            " 'v' || g, CASE WHEN g % 29 <> 0 THEN g % 2 = 0 END, md5(g::text)::uuid, "
            "DATE '2000-01-01' + g, TIMESTAMPTZ '2020-01-01 00:00:00+00' + g * INTERVAL "
            "'61.5 seconds', CASE WHEN g % 31 <> 0 THEN decode(md5(g::text), 'hex') END, "
            "CASE WHEN g % 37 <> 0 THEN jsonb_build_object('g', g, 'tags', "
            "jsonb_build_array('a', g % 3, null), 'ü', g % 2 = 0) END, "
            "CASE WHEN g % 50 = 0 THEN (SELECT string_agg(md5(g || ':' || i), '') "
            "FROM generate_series(1, 320) i) END FROM generate_series(1, {n}) g",
            ("id",),
            lambda rng, n: (rng.randint(1, n * 3),),
            _wide_row,
        ),
        Table(
            "parted",  # (e) range-partitioned on the key, with a default partition
            [
                "CREATE TABLE {s}.parted (id bigint NOT NULL, grp int, payload text, "
                "PRIMARY KEY (id)) PARTITION BY RANGE (id)",
                "CREATE TABLE {s}.parted_0 PARTITION OF {s}.parted "
                f"FOR VALUES FROM (MINVALUE) TO ({PART_BOUNDS[0]})",
                "CREATE TABLE {s}.parted_1 PARTITION OF {s}.parted "
                f"FOR VALUES FROM ({PART_BOUNDS[0]}) TO ({PART_BOUNDS[1]})",
                "CREATE TABLE {s}.parted_2 PARTITION OF {s}.parted "
                f"FOR VALUES FROM ({PART_BOUNDS[1]}) TO ({PART_BOUNDS[2]})",
                "CREATE TABLE {s}.parted_3 PARTITION OF {s}.parted DEFAULT",
                *(full(f"parted_{i}") for i in range(4)),
            ],
            "INSERT INTO {s}.parted SELECT g * 10, g % 13, 'payload ' || g "
            "FROM generate_series(1, {n}) g",
            ("id",),
            lambda rng, n: (rng.randint(1, n * 12),),  # key changes move rows across partitions
            lambda rng, key: {"grp": rng.randrange(13), "payload": _letters(rng, 12)},
        ),
        Table(
            "nopk",  # no primary key: a unique NOT NULL column to page by (surrogate key)
            [
                "CREATE TABLE {s}.nopk (uid bigint NOT NULL UNIQUE, label text)",
                full("nopk"),
            ],
            "INSERT INTO {s}.nopk SELECT g * 3, 'row ' || g FROM generate_series(1, {n}) g",
            ("uid",),
            lambda rng, n: (rng.randint(1, n * 4),),
            lambda rng, key: {"label": _letters(rng, 6)},
        ),
    ]
    return {t.name: t for t in tables}


def _pg_quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@contextmanager
def _pg_other_schema(cap: Capture) -> Iterator[str]:
    name = f"other_{uuid.uuid4().hex[:10]}"
    cap.sql(f"CREATE SCHEMA {_pg_quote(name)}")
    try:
        yield name
    finally:
        cap.sql(f"DROP SCHEMA {_pg_quote(name)} CASCADE")


def _pg_verify_by(cap: Capture, table: str, key: Sequence[str]) -> Verdict:
    """``Capture.verify`` with a chosen key (the harness keys a table without a primary key
    by all its columns; a surrogate-key snapshot keys its events by the surrogate key)."""
    dialect = PostgresDialect(
        cap.url, signal_table=cap.table_id("debezium_signal"), publication=cap.publication
    )
    try:
        schema = dialect.describe(cap.table_id(table))
    finally:
        dialect.close()
    columns = [(c.name, c.type_code) for c in schema.columns]
    with psycopg.connect(cap.url, context=pg_types.LoadContext()) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        rows = list(read_table_rows(conn, cap.table_id(table), columns))
    return compare(materialize(cap.sink_path, cap.topic(table)), rows, key)


def _pg_logged(cap: Capture, table: str) -> bool:
    """Whether the log carries ``table``: it is in the publication (by its root's name)."""
    found = cap.sql(
        "SELECT 1 FROM pg_publication_tables WHERE pubname = %s AND schemaname = %s "
        "AND tablename = %s",
        (cap.publication, cap.schema, table),
    )
    via_root = cap.sql(
        "SELECT pubviaroot FROM pg_publication WHERE pubname = %s", (cap.publication,)
    )
    return bool(found) and via_root == [(True,)]


def postgres_source(capture: CaptureFactory, schema: str) -> Source:
    return Source(
        name="postgres",
        schema=schema,
        make_capture=capture,
        tables=postgres_tables(),
        quote=_pg_quote,
        connect=lambda cap: psycopg.connect(cap.url, autocommit=True),
        other_schema=_pg_other_schema,
        verify_by=_pg_verify_by,
        logged=_pg_logged,
        no_key_phrases=("no primary key", "surrogate-key", "REPLICA IDENTITY FULL"),
    )


# MySQL has no generate_series: numbers 1..{n} from five cross-joined digit tables.
_DIGITS = "(SELECT 0 d UNION ALL " + " UNION ALL ".join(f"SELECT {i}" for i in range(1, 10)) + ")"
NUMS = (
    "(SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d + 1 AS g FROM "
    + " CROSS JOIN ".join(f"{_DIGITS} {x}" for x in "abcef")
    + ") nums WHERE g <= {n}"
)
NAIVE_T0 = datetime(2024, 1, 1)


def _my_wide_row(rng: random.Random, key: Key) -> Row:
    if rng.random() < 0.3:
        return {"i": _maybe(rng, rng.randint(-(2**31), 2**31 - 1)), "e": rng.choice("rgb")}
    big = _letters(rng, 10_000) if rng.random() < 0.2 else "short"
    doc = {"r": rng.random(), "s": rng.choice(TEXTS), "l": [1, None, True, 2.5], "n": {"k": 1}}
    return {
        "i": _maybe(rng, rng.randint(-(2**31), 2**31 - 1)),
        "ub": _maybe(rng, rng.choice((0, 2**64 - 1, rng.randint(0, 2**64 - 1)))),
        "n": _maybe(rng, Decimal(rng.randint(-(10**13), 10**13)).scaleb(-6)),
        "v": _maybe(rng, rng.choice(TEXTS[:4]) + _letters(rng, 5) + rng.choice(("", " "))),
        "c": _maybe(rng, rng.choice(("", "x", "Ab c", "é"))),
        "dt": _maybe(rng, NAIVE_T0 + timedelta(microseconds=rng.randint(-(10**15), 10**15))),
        "ts": _maybe(rng, NAIVE_T0 + timedelta(microseconds=rng.randint(-(10**14), 10**14))),
        "d": _maybe(rng, date(1900, 1, 1) + timedelta(days=rng.randint(0, 80_000))),
        "vb": _maybe(rng, rng.randbytes(rng.choice((0, 1, 16, 64)))),
        "bl": _maybe(rng, rng.randbytes(rng.choice((0, 1, 16, 9_000)))),
        "j": _maybe(rng, doc),
        "e": _maybe(rng, rng.choice(("r", "g", "b"))),
        "f": _maybe(rng, rng.random() * 1e6),
        "big": _maybe(rng, big),
    }


def mysql_tables() -> dict[str, Table]:
    tables = [
        Table(
            "items",
            ["CREATE TABLE {s}.items (id bigint PRIMARY KEY, a int NOT NULL, name text, n int)"],
            f"INSERT INTO {{s}}.items SELECT {BIG_KEY} + g * 10, g % 10, CONCAT('item ', g), g "
            f"FROM {NUMS}",
            ("id",),
            lambda rng, n: (BIG_KEY + rng.randint(1, n * 12),),
            _items_row,
        ),
        Table(
            "composite",  # (int, varchar) under a case- and accent-insensitive PAD SPACE key
            [
                "CREATE TABLE {s}.composite (region int, code varchar(40) COLLATE "
                "utf8mb4_general_ci, payload text, amount decimal(12,2), "
                "PRIMARY KEY (region, code))"
            ],
            "INSERT INTO {s}.composite SELECT g % 40, CONCAT(CHAR(65 + g % 26 USING utf8mb4), "
            "CHAR(97 + g DIV 26 % 26 USING utf8mb4), CASE WHEN g % 7 = 0 THEN 'é' "
            "WHEN g % 7 = 1 THEN ' ' ELSE '-' END, g), CONCAT('payload ', g), g / 100 "
            f"FROM {NUMS}",
            ("region", "code"),
            lambda rng, n: (
                rng.randint(0, 44),
                # Case variants, accents and trailing spaces of existing keys collide under
                # the collation (the writer retries); the survivors are stored exactly.
                rng.choice("AbéZß 0-") + _letters(rng, rng.randint(1, 3)) + rng.choice(("", " ")),
            ),
            lambda rng, key: {
                "payload": rng.choice(TEXTS) + _letters(rng, 6),
                "amount": _maybe(rng, Decimal(rng.randint(-(10**8), 10**8)).scaleb(-2)),
            },
        ),
        Table(
            "typed",  # datetime(6), decimal and a case-insensitive char in one key
            [
                "CREATE TABLE {s}.typed (dt datetime(6), n decimal(8,2), "
                "u char(12) COLLATE utf8mb4_unicode_ci, note varchar(60), "
                "PRIMARY KEY (dt, n, u))"
            ],
            "INSERT INTO {s}.typed SELECT TIMESTAMP('2024-01-01 00:00:00') + INTERVAL "
            "(g % 20) * 3600000123 MICROSECOND, ROUND(g DIV 20 % 100 / 4.0 - 10, 2), "
            f"LEFT(MD5(g), 12), CONCAT('note ', g) FROM {NUMS}",
            ("dt", "n", "u"),
            lambda rng, n: (
                NAIVE_T0 + rng.randint(0, 24) * HOUR,
                Decimal(rng.randint(-1_200, 1_800)).scaleb(-2),
                "".join(rng.choice("0123456789abcdefABCDEF") for _ in range(12)),
            ),
            lambda rng, key: {"note": _maybe(rng, rng.choice(TEXTS) + _letters(rng, 4))},
        ),
        Table(
            "wide",  # the MySQL type matrix, NULLs, values over 8 KB
            [
                "CREATE TABLE {s}.wide (id int PRIMARY KEY, i int, ub bigint unsigned, "
                "n decimal(20,6), v varchar(40) COLLATE utf8mb4_general_ci, c char(10), "
                "dt datetime(6), ts timestamp(6) NULL, d date, vb varbinary(64), bl blob, "
                "j json, e enum('r','g','b'), f double, big mediumtext)"
            ],
            "INSERT INTO {s}.wide SELECT g, CASE WHEN g % 17 <> 0 THEN g * 7919 % 2000000 - "
            "1000000 END, CASE WHEN g % 19 <> 0 THEN g * 1000000007 * 1000 END, "
            "CASE WHEN g % 23 <> 0 THEN ROUND(g / 7.0, 6) END, CONCAT('v', g, "
            "CASE WHEN g % 5 = 0 THEN ' ' ELSE '' END), CASE WHEN g % 3 = 0 THEN 'Ab' END, "
            "TIMESTAMP('2020-01-01') + INTERVAL g * 61500123 MICROSECOND, "
            "CASE WHEN g % 11 <> 0 THEN TIMESTAMP('2021-01-01') + INTERVAL g * 61 SECOND END, "
            "DATE('2000-01-01') + INTERVAL g DAY, CASE WHEN g % 31 <> 0 THEN UNHEX(MD5(g)) END,"
            " CASE WHEN g % 29 <> 0 THEN UNHEX(REPEAT(MD5(g), 2)) END, CASE WHEN g % 37 <> 0 "
            "THEN JSON_OBJECT('g', g, 'tags', JSON_ARRAY('a', g % 3, NULL), 'ü', g % 2 = 0) END,"
            " ELT(1 + g % 3, 'r', 'g', 'b'), g / 3, CASE WHEN g % 50 = 0 THEN REPEAT(MD5(g), "
            f"320) END FROM {NUMS}",
            ("id",),
            lambda rng, n: (rng.randint(1, n * 3),),
            _my_wide_row,
        ),
        Table(
            "parted",
            [
                "CREATE TABLE {s}.parted (id bigint NOT NULL, grp int, payload text, "
                "PRIMARY KEY (id)) PARTITION BY RANGE (id) (PARTITION p0 VALUES LESS THAN "
                f"({PART_BOUNDS[0]}), PARTITION p1 VALUES LESS THAN ({PART_BOUNDS[1]}), "
                f"PARTITION p2 VALUES LESS THAN ({PART_BOUNDS[2]}), "
                "PARTITION p3 VALUES LESS THAN MAXVALUE)"
            ],
            f"INSERT INTO {{s}}.parted SELECT g * 10, g % 13, CONCAT('payload ', g) FROM {NUMS}",
            ("id",),
            lambda rng, n: (rng.randint(1, n * 12),),
            lambda rng, key: {"grp": rng.randrange(13), "payload": _letters(rng, 12)},
        ),
        Table(
            "nopk",
            ["CREATE TABLE {s}.nopk (uid bigint NOT NULL UNIQUE, label text)"],
            f"INSERT INTO {{s}}.nopk SELECT g * 3, CONCAT('row ', g) FROM {NUMS}",
            ("uid",),
            lambda rng, n: (rng.randint(1, n * 4),),
            lambda rng, key: {"label": _letters(rng, 6)},
        ),
    ]
    return {t.name: t for t in tables}


def _my_quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


@contextmanager
def _my_other_schema(cap: Capture) -> Iterator[str]:
    name = f"other_{uuid.uuid4().hex[:10]}"
    cap.sql(f"CREATE DATABASE {_my_quote(name)} CHARACTER SET utf8mb4")
    try:
        yield name
    finally:
        cap.sql(f"DROP DATABASE {_my_quote(name)}")


def _my_verify_by(cap: Capture, table: str, key: Sequence[str]) -> Verdict:
    from snapshotter.sources.mysql.dialect import MySqlDialect

    dialect = MySqlDialect(cap.url, signal_table=cap.table_id("debezium_signal"))
    try:
        schema = dialect.describe(cap.table_id(table))
        rows = list(dialect.scan(schema))
    finally:
        dialect.close()
    return compare(materialize(cap.sink_path, cap.topic(table)), rows, key)


def mysql_source(capture: CaptureFactory, database: str) -> Source:
    return Source(
        name="mysql",
        schema=database,
        make_capture=lambda **kw: capture(kind="mysql", **kw),
        tables=mysql_tables(),
        quote=_my_quote,
        connect=lambda cap: mysql_connect(cap.url),
        other_schema=_my_other_schema,
        verify_by=_my_verify_by,
        logged=lambda cap, table: True,  # the binlog carries every table
        logs_every_table=True,
    )


def source_named(request: pytest.FixtureRequest, name: str) -> Source:
    """The source ``name`` (postgres or mysql) on the test's own schema or database."""
    if name == "postgres":
        return postgres_source(
            request.getfixturevalue("capture"), request.getfixturevalue("pg_schema")
        )
    if name == "mysql":
        return mysql_source(
            request.getfixturevalue("mysql_capture"), request.getfixturevalue("mysql_db")
        )
    raise AssertionError(f"unknown source {name}")


@pytest.fixture(params=["postgres", "mysql"])
def source(request: pytest.FixtureRequest) -> Source:
    return source_named(request, request.param)


# --- helpers ----------------------------------------------------------------------------------


def qualified(cap: Capture, table: str) -> str:
    return f"{cap.schema}.{table}"


def wait_for(
    predicate: Callable[[], bool],
    what: str,
    timeout: float = 60.0,
    engine: EngineThread | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if engine is not None and not engine.thread.is_alive():
            code = engine.join(1)  # re-raises the engine's error, if any
            raise AssertionError(f"the engine ended (exit code {code}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def report(cap: Capture) -> dict[str, Any]:
    """``status()``, or an empty report before the engine saved its first state."""
    try:
        return cap.status()
    except FileNotFoundError:
        return {"snapshots": [], "signal_problems": [], "paused": False}


def progress(cap: Capture, table: str) -> dict[str, Any]:
    """The newest snapshot record of ``table`` in the saved state ({} if none yet)."""
    found = [s for s in report(cap)["snapshots"] if s["table"] == qualified(cap, table)]
    return found[-1] if found else {}


def state_of(cap: Capture, table: str) -> str | None:
    state: str | None = progress(cap, table).get("state")
    return state


def events(cap: Capture, table: str) -> list[dict[str, Any]]:
    """The sink's events of ``table``; a last line the sink is still writing is left out."""
    if not cap.sink_path.exists():
        return []
    topic = cap.topic(table)
    data = cap.sink_path.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]
    out = []
    for line in complete.decode("utf-8").splitlines():
        record = json.loads(line)
        if record["topic"] == topic:
            out.append(record)
    return out


def op(event: Mapping[str, Any]) -> str:
    value: str = event["value"]["op"]
    return value


def key_of(event: Mapping[str, Any]) -> str:
    return json.dumps(event["key"], sort_keys=True)


def reads(cap: Capture, table: str) -> Counter[str]:
    """READ events per key (canonical key JSON)."""
    return Counter(key_of(e) for e in events(cap, table) if op(e) == "r")


def ops(cap: Capture, table: str) -> Counter[str]:
    return Counter(op(e) for e in events(cap, table))


def assert_converged(cap: Capture, table: str) -> Verdict:
    verdict = cap.verify(table)
    assert verdict.ok, verdict.render()
    return verdict


def catch_up(cap: Capture, phase_hooks: PhaseHooks | None = None) -> int:
    """``snapshotter run --until-caught-up``, failing fast if it hangs."""
    return cap.run(hooks=phase_hooks, timeout=120)


def at_chunk(number: int, action: Callable[[], None]) -> Hook:
    """A hook that runs ``action`` once, in the chunk numbered ``number`` (1-based)."""
    done = threading.Event()

    def hook(task: ChunkTask) -> None:
        if task.number == number and not done.is_set():
            done.set()
            action()

    return hook


def sleep_hook(seconds: float) -> Hook:
    def hook(task: ChunkTask) -> None:
        time.sleep(seconds)

    return hook


class InFlight:
    """How many chunk SELECTs run at once (between ``after_open`` and ``after_read``, on the
    chunk workers' threads), and the most seen. Until two have overlapped, a SELECT that
    starts alone waits up to ``rendezvous`` seconds for a second one: on 2 shared cores a
    1,000-row SELECT can finish before the other worker opens its window, so without the
    wait a parallel engine may never show an overlap; a serial engine still shows none
    (every wait times out)."""

    def __init__(self, rendezvous: float = 0.0) -> None:
        self._changed = threading.Condition()
        self.rendezvous = rendezvous
        self.now = 0
        self.most = 0

    def enter(self, task: ChunkTask) -> None:
        with self._changed:
            self.now += 1
            self.most = max(self.most, self.now)
            self._changed.notify_all()
            if self.most == 1:
                self._changed.wait_for(lambda: self.most > 1, timeout=self.rendezvous)

    def leave(self, task: ChunkTask) -> None:
        with self._changed:
            self.now -= 1


class Pacer:
    """Phase hooks that spread a writer's changes over the whole snapshot: before its open
    watermark, chunk k waits until the writer has committed k/``chunks`` of ``target``
    changes since the first chunk began. ``during`` is what the writer had committed
    since then when the newest close watermark was written; ``reading`` counts the chunk
    SELECTs in flight."""

    def __init__(
        self, writer: RandomWriter, target: int, chunks: int, rendezvous: float = 0.0
    ) -> None:
        self.writer = writer
        self.target = target
        self.chunks = max(1, chunks)
        self.start: int | None = None
        self.during = 0
        self.waited = 0.0
        self.reading = InFlight(rendezvous)

    def before_open(self, task: ChunkTask) -> None:
        if self.start is None:
            self.start = self.writer.total
        want = min(self.target, math.ceil(task.number * self.target / self.chunks))
        began = time.monotonic()
        deadline = began + 60
        while (
            self.writer.total - self.start < want
            and self.writer.running
            and time.monotonic() < deadline
        ):
            time.sleep(0.005)
        self.waited += time.monotonic() - began

    def after_close(self, task: ChunkTask) -> None:
        assert self.start is not None
        self.during = self.writer.total - self.start

    def hooks(self) -> PhaseHooks:
        return PhaseHooks(
            before_open=self.before_open,
            after_open=self.reading.enter,
            after_read=self.reading.leave,
            after_close=self.after_close,
        )


@dataclass
class Timer:
    marks: list[tuple[str, float]] = field(default_factory=list)
    last: float = field(default_factory=time.monotonic)

    def mark(self, label: str) -> None:
        now = time.monotonic()
        self.marks.append((label, now - self.last))
        self.last = now

    def __str__(self) -> str:
        return ", ".join(f"{label} {seconds:.1f} s" for label, seconds in self.marks)


def no_partial_lines(path: Path) -> None:
    data = path.read_bytes()
    assert data.endswith(b"\n"), "the JSONL file ends with a partial line"
    for number, line in enumerate(data.split(b"\n")[:-1], 1):
        assert line, f"line {number} is empty"
        json.loads(line)  # raises on a partial or corrupt line


# --- 1. convergence under a concurrent random writer ------------------------------------------


def snapshot_under_writer(
    source: Source,
    cap: Capture,
    scenario: str,
    timer: Timer,
    timeout: float = 180,
    rendezvous: float = 0.0,
) -> tuple[Table, RandomWriter, Pacer]:
    """Create the scenario's table, snapshot it while the random writer changes it, then
    catch up with the log: everything the writer committed has reached the sink.
    ``rendezvous``: see InFlight (for tests that assert reads overlapped)."""
    table = source.create(cap, scenario, ROWS)
    cap.init()
    timer.mark("setup")
    writer = source.writer(cap, table, ROWS, changes=None, seed=sum(map(ord, scenario)))
    # Pace on three quarters of the chunks the table has now: the writer reaches the target
    # before the last chunk even if deletes and key changes make fewer chunks.
    pacer = Pacer(writer, CHANGES, chunks=ROWS * 3 // (4 * CHUNK), rendezvous=rendezvous)
    with writer:
        wait_for(lambda: writer.total >= 100, "the writer to get going")
        cap.execute(qualified(cap, table.name))
        engine = cap.start(hooks=pacer.hooks())
        wait_for(
            lambda: state_of(cap, table.name) not in (None, "pending", "running"),
            "the snapshot to finish",
            timeout=timeout,
            engine=engine,
        )
    timer.mark("snapshot")
    assert engine.stop(timeout=timeout) == 0
    assert cap.run(timeout=timeout) == 0  # read the log to its end
    timer.mark("catch-up")
    return table, writer, pacer


# CI runs a slice of the convergence matrix (its 45-minute budget); the whole matrix runs with
# SNAPSHOTTER_CONVERGENCE_MATRIX=full scripts/test tests/integration/test_convergence.py.
# Cases outside the slice are not collected in CI (never skipped).
FULL_MATRIX = os.environ.get("SNAPSHOTTER_CONVERGENCE_MATRIX") == "full"


def _matrix(cases: list[Any], ci: set[str]) -> list[Any]:
    """``cases`` (pytest.param with ids) with FULL_MATRIX; else those whose id is in ``ci``."""
    return cases if FULL_MATRIX else [c for c in cases if c.id in ci]


def _on_each_source(cases: list[Any], ci: set[str]) -> list[Any]:
    """``cases`` on each database (the ``source`` fixture's value first, ids
    ``<db>-<case id>``), sliced by ``_matrix``: a sink's path past the decoder is the same
    for both, so CI may run a case on one of them (each still runs on both with JSONL)."""
    return _matrix(
        [
            pytest.param(db, *case.values, id=f"{db}-{case.id}")
            for db in ("postgres", "mysql")
            for case in cases
        ],
        ci,
    )


# [source] read_parallelism: the default (2, closed key ranges read by overlapping windows) on
# every scenario; 1 (open chunks, one read at a time) and 3 on the key shapes chunk bounds
# depend on most (a bigint, a composite with text, a three-column typed key). CI: every
# scenario at the default, 1 and 3 on the composite and typed keys.
PARALLEL_CASES = _on_each_source(
    [
        *(pytest.param(s, 2, id=s) for s in ("items", "composite", "typed", "wide", "parted")),
        *(
            pytest.param(s, n, id=f"{s}-reads{n}")
            for n in (1, 3)
            for s in ("items", "composite", "typed")
        ),
    ],
    {
        *(f"{db}-{s}" for db in ("postgres", "mysql") for s in ("items", "composite", "typed")),
        # the wide table: in the Spark and Kafka cases in CI
        *(f"{db}-parted" for db in ("postgres", "mysql")),
        "postgres-composite-reads1",
        "mysql-typed-reads3",
    },
)


@pytest.mark.parametrize(("source", "scenario", "parallel"), PARALLEL_CASES, indirect=["source"])
def test_converges_under_a_concurrent_random_writer(
    source: Source, scenario: str, parallel: int
) -> None:
    timer = Timer()
    cap = source.capture(chunk_size=CHUNK, extra_config=f"read_parallelism = {parallel}")
    table, writer, pacer = snapshot_under_writer(
        source, cap, scenario, timer, rendezvous=0.5 if parallel > 1 else 0.0
    )
    verdict = assert_converged(cap, table.name)
    timer.mark("verify")
    done = progress(cap, table.name)
    counts = ops(cap, table.name)
    print(
        f"\n{source.name}/{scenario} ({parallel} reads): {timer}; {verdict.table_rows} rows, "
        f"{done['chunks']} chunks, up to {pacer.reading.most} read at once; writer "
        f"{pacer.during} changes during the snapshot, {dict(writer.counts)}; pacer waited "
        f"{pacer.waited:.1f} s; events {dict(counts)}"
    )
    assert pacer.reading.most <= parallel
    if parallel > 1:
        assert pacer.reading.most > 1, "no two chunk SELECTs ever ran at once"
    assert done["state"] == "done", done
    assert done["chunks"] >= ROWS // CHUNK // 2, done  # many windows
    assert pacer.during >= CHANGES, f"only {pacer.during} changes while the snapshot ran"
    assert all(writer.counts[k] > 0 for k in KINDS), writer.counts
    assert all(counts[k] > 0 for k in "rcud"), counts
    if scenario == "wide":  # values over 8 KB went through both the chunks and the log
        big = [
            e
            for e in events(cap, "wide")
            if len((e["value"]["after"] or {}).get("big") or "") > 8192
        ]
        assert {"r", "c", "u"} <= {op(e) for e in big}
    if scenario == "parted":
        assert source.logged(cap, "parted")
        # Changes are named by the root: no event lands under a partition's topic.
        assert not any(events(cap, f"parted_{i}") for i in range(4))


@pytest.mark.parametrize(
    ("source", "scenario"),
    _on_each_source(
        [pytest.param(s, id=s) for s in ("items", "composite", "typed", "wide")],
        # typed keys: the JSONL and Kafka cases in CI; the wide table's types on MariaDB
        # (PostgreSQL's: test_landing_types.py and the Kafka case)
        {"postgres-items", "mysql-composite", "mysql-wide"},
    ),
    indirect=["source"],
)
def test_the_spark_sink_converges_under_a_concurrent_random_writer(
    source: Source, scenario: str
) -> None:
    """The same run landed by Spark: the landed current state equals the table (read back
    with Spark, and checked by ``verify``), and the changelog holds every kind of event."""
    spark_converges(source, scenario)


def spark_converges(
    source: Source,
    scenario: str,
    spark: str = "",
    executors: int = 0,
    fmt: str = "parquet",
    timeout: float = 240,
) -> None:
    """``scenario`` snapshotted under the random writer into the spark sink on ``spark`` (a
    master or Spark Connect URL; unset: local mode), landed state checked against the table.
    ``executors``: chunks read on Spark executors, each window in that many sub-ranges.
    ``fmt``: the landing format. ``timeout``: for the snapshot to finish."""
    timer = Timer()
    chunk = CHUNK // executors if executors else CHUNK
    cap = source.capture(
        chunk_size=chunk, sink="spark", spark=spark, executors=executors, sink_format=fmt
    )
    table, _, pacer = snapshot_under_writer(source, cap, scenario, timer, timeout=timeout)
    verdict = cap.verify_landed(table.name)
    assert verdict.ok, verdict.render()
    timer.mark("verify")
    landed = cap.landed_rows(table.name)
    expected = cap.source_rows(table.name)
    timer.mark("read back")
    assert landed.keys() == expected.keys(), (
        f"{len(expected.keys() - landed.keys())} missing, "
        f"{len(landed.keys() - expected.keys())} extra"
    )
    differing = [k for k, row in expected.items() if landed[k] != row]
    assert not differing, (differing[:3], [(expected[k], landed[k]) for k in differing[:1]])
    changelog = cap.lander().changelog(cap.table_id(table.name))
    counts = {r["__op"]: r["count"] for r in changelog.groupBy("__op").count().collect()}
    print(
        f"\n{source.name}/{scenario} (spark {spark or 'local'}, executors {executors}): {timer}; "
        f"{len(expected)} rows; "
        f"writer "
        f"{pacer.during} changes during the snapshot; changelog {counts}"
    )
    assert state_of(cap, table.name) == "done"
    assert pacer.during >= CHANGES
    assert all(counts.get(k, 0) > 0 for k in "rcud"), counts
    if scenario == "items":
        tampered = tamper_with_a_landed_row(cap, table.name)
        verdict = cap.verify_landed(table.name)
        assert not verdict.ok
        v = verdict.verdict
        assert (v.missing, v.extra, v.differing) == (0, 0, 1), verdict.render()
        assert dict(v.differing_examples[0].key) == tampered
        assert f"differ: key {json.dumps(tampered)}" in verdict.render()
        # Plain readers of current/ read the tampered base too.
        assert verdict.plain is not None and "1 row differing" in verdict.render()


@pytest.mark.parametrize(
    ("source", "scenario", "client"),
    _on_each_source(
        [
            pytest.param(s, c, id=f"{s}-{c}")
            for s, c in (
                ("items", "kafka-python"),
                ("composite", "kafka-python"),
                ("typed", "kafka-python"),
                ("wide", "kafka-python"),
                # the confluent-kafka producer (SNAPSHOTTER_KAFKA_CLIENT=confluent runs them all)
                ("typed", "confluent"),
                ("composite", "confluent"),
            )
        ],
        {
            "postgres-items-kafka-python",
            "mysql-typed-kafka-python",
            "postgres-wide-kafka-python",
            "mysql-wide-kafka-python",
            "mysql-typed-confluent",
        },
    ),
    indirect=["source"],
)
def test_the_kafka_sink_converges_under_a_concurrent_random_writer(
    source: Source, scenario: str, client: str, kafka_bootstrap: str
) -> None:
    """The same run sent to Kafka (3 partitions; "typed" with JsonConverter schemas): every
    message of the table's topic, consumed from the beginning and replayed by key (a
    tombstone deletes), equals the table; each key stays on one partition, each delete is
    followed by its tombstone; and ``verify`` agrees."""
    if client == "confluent":
        pytest.importorskip("confluent_kafka")
    timer = Timer()
    schemas = scenario == "typed"
    cap = source.capture(
        chunk_size=CHUNK,
        sink="kafka",
        kafka_bootstrap=kafka_bootstrap,
        kafka_schemas=schemas,
        kafka_client=client if client == "confluent" else "",
    )
    table, _, pacer = snapshot_under_writer(source, cap, scenario, timer)
    messages = consume_all(kafka_bootstrap, cap.topic(table.name))
    timer.mark("consume")
    key_columns = cap.key_of(table.name)
    replayed, counts = replay_by_key(messages)
    expected = table_as_json(cap, table.name, key_columns, json_as_text=schemas)
    timer.mark("replay")
    assert replayed.keys() == expected.keys(), (
        f"{len(expected.keys() - replayed.keys())} missing, "
        f"{len(replayed.keys() - expected.keys())} extra"
    )
    differing = [k for k, row in expected.items() if replayed[k] != row]
    assert not differing, (differing[:3], [(expected[k], replayed[k]) for k in differing[:1]])
    verdict = cap.verify(table.name)
    assert verdict.ok, verdict.render()
    timer.mark("verify")
    partitions: dict[bytes, set[int]] = {}
    for partition, _, key, _ in messages:
        if key is not None:
            partitions.setdefault(key, set()).add(partition)
    print(
        f"\n{source.name}/{scenario} (kafka{', schemas' if schemas else ''}): {timer}; "
        f"{len(expected)} rows; writer {pacer.during} changes during the snapshot; "
        f"{len(messages)} messages over {len({m[0] for m in messages})} partitions {counts}"
    )
    assert state_of(cap, table.name) == "done"
    assert pacer.during >= CHANGES
    assert all(counts.get(k, 0) > 0 for k in "rcud"), counts
    assert all(len(p) == 1 for p in partitions.values())  # a key keeps its partition
    assert len({m[0] for m in messages}) == 3
    # every delete is followed, in its partition, by a tombstone of the same key
    by_partition: dict[int, list[tuple[bytes | None, bytes | None]]] = {}
    for partition, _, key, value in messages:
        by_partition.setdefault(partition, []).append((key, value))
    for stream in by_partition.values():
        for i, (key, value) in enumerate(stream):
            if value is not None and _payload(value)["op"] == "d":
                assert stream[i + 1] == (key, None), f"no tombstone after a delete of {key!r}"


def consume_all(bootstrap: str, topic: str) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """Every message of ``topic`` from the beginning to its current end: (partition, offset,
    key, value), each partition in offset order (a plain consumer, not snapshotter's)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        ends = consumer.end_offsets(parts)
        out: list[tuple[int, int, bytes | None, bytes | None]] = []
        deadline = time.monotonic() + 120
        while any(consumer.position(tp) < ends[tp] for tp in parts):
            assert time.monotonic() < deadline, "the topic could not be read to its end"
            for tp, records in consumer.poll(timeout_ms=1000).items():
                out.extend(
                    (tp.partition, r.offset, r.key, r.value) for r in records if r.offset < ends[tp]
                )
        return sorted(out, key=lambda m: (m[0], m[1]))
    finally:
        consumer.close()


def _payload(data: bytes) -> Any:
    decoded = json.loads(data)
    if isinstance(decoded, dict) and set(decoded) == {"schema", "payload"}:
        return decoded["payload"]
    return decoded


def replay_by_key(
    messages: Sequence[tuple[int, int, bytes | None, bytes | None]],
) -> tuple[dict[str, dict[str, Any]], Counter[str]]:
    """What a consumer that upserts by key ends with: c/u/r put ``after``, d and a tombstone
    delete; returns canonical key -> row, and the count of each op (and of tombstones)."""
    UNAVAILABLE = "__debezium_unavailable_value"
    rows: dict[str, dict[str, Any]] = {}
    counts: Counter[str] = Counter()
    for _, _, key, value in messages:
        if key is None:
            raise AssertionError("a keyless message (no truncate happened)")
        ck = json.dumps(_payload(key), sort_keys=True)
        if value is None:
            counts["tombstone"] += 1
            rows.pop(ck, None)
            continue
        envelope = _payload(value)
        counts[envelope["op"]] += 1
        if envelope["op"] == "d":
            rows.pop(ck, None)
            continue
        after, before = envelope["after"], rows.get(ck, {})
        # PostgreSQL's unchanged TOAST value: the key's previous value stands
        rows[ck] = {c: before.get(c, v) if v == UNAVAILABLE else v for c, v in after.items()}
    return rows, counts


def table_as_json(
    cap: Capture, table: str, key: Sequence[str], *, json_as_text: bool
) -> dict[str, dict[str, Any]]:
    """The table at the source as the sink encodes rows: canonical key -> JSON row."""
    from snapshotter.app.runner import open_dialect
    from snapshotter.sinks.encoding import json_as_text as with_json_text
    from snapshotter.verify.rows import as_json_row

    dialect = open_dialect(cap.config)
    try:
        schema = dialect.describe(cap.table_id(table))
        out = {}
        for row in dialect.scan(schema):
            encoded = as_json_row((with_json_text(row) or row) if json_as_text else row)
            out[json.dumps({c: encoded[c] for c in key}, sort_keys=True)] = encoded
        return out
    finally:
        dialect.close()


def _tamper_with_sql(cap: Capture, table: str) -> dict[str, Any]:
    """An UPDATE of one row of the landed current state: through the catalog (Iceberg), or by
    path (Delta)."""
    lander = cap.lander()
    if lander.format == "iceberg":
        name = lander.iceberg.current_name(cap.table_id(table))
    else:
        name = f"delta.`{lander.table_path(cap.table_id(table))}/current`"
    row = lander.spark.sql(f"SELECT * FROM {name} LIMIT 1").collect()[0].asDict()
    key = cap.key_of(table)
    column = next(
        c
        for c, v in row.items()
        if c not in key and not c.startswith("__") and isinstance(v, str) and v
    )
    # Literals: Iceberg's row-level UPDATE takes no parameter markers.
    where = " AND ".join(
        f"`{k}` = {row[k]}" if isinstance(row[k], int) else f"`{k}` = '{row[k]}'" for k in key
    )
    lander.spark.sql(f"UPDATE {name} SET `{column}` = concat(`{column}`, '!') WHERE {where}")
    return {k: row[k] for k in key}


def tamper_with_a_landed_row(cap: Capture, table: str) -> dict[str, Any]:
    """Fold the landed changelog into the current state's base (parquet), then change one
    value of one row in a base file behind the lander's back (iceberg: an UPDATE through the
    catalog); returns that row's key."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from snapshotter.sinks.spark.lander import base_name

    lander = cap.lander()
    table_id = cap.table_id(table)
    if lander.format in ("iceberg", "delta"):
        return _tamper_with_sql(cap, table)
    lander.compact(table_id)
    meta = lander.meta(table_id)
    current = Path(lander.table_path(table_id)) / "current"  # base files: <base>.<file>
    files = current.glob(f"{base_name(meta)}.*.parquet")
    path = sorted(p for p in files if pq.read_metadata(p).num_rows)[0]
    data = pq.read_table(path)
    rows = data.to_pylist()
    key = cap.key_of(table)
    column = next(
        c
        for c in data.column_names
        if c not in key
        and not c.startswith("__")
        and isinstance(rows[0][c], str | int)
        and not isinstance(rows[0][c], bool)
    )
    value = rows[0][column]
    rows[0][column] = value + "!" if isinstance(value, str) else value + 1
    pq.write_table(pa.Table.from_pylist(rows, schema=data.schema), path)
    # Hadoop's local file system keeps a checksum beside each file: the tamperer drops it.
    (path.parent / f".{path.name}.crc").unlink(missing_ok=True)
    return {k: rows[0][k] for k in key}


# --- 2. hot keys ------------------------------------------------------------------------------


class Hammer:
    """Updates a few hot keys in a loop, one committed statement at a time, until stopped."""

    def __init__(self, source: Source, cap: Capture, statement: str, keys: Sequence[Key]):
        self.source, self.cap, self.keys = source, cap, list(keys)
        self.statement = statement.format(s=source.quote(cap.schema))
        self.count = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hammer", daemon=True)

    def _run(self) -> None:
        try:
            conn = self.source.connect(self.cap)
            try:
                cur = conn.cursor()
                for key in self._cycle():
                    if self._stop.is_set():
                        return
                    cur.execute(self.statement, (f"hot {self.count}", *key))
                    self.count += 1
            finally:
                conn.close()
        except BaseException as exc:
            self.error = exc

    def _cycle(self) -> Iterator[Key]:
        while True:
            yield from self.keys

    def __enter__(self) -> Hammer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        if self.error is not None:
            raise AssertionError("the hot-key writer failed") from self.error


def test_hot_keys_updated_continuously_do_not_stop_the_snapshot(source: Source) -> None:
    rows = 20_000
    cap = source.capture(chunk_size=500)
    source.create(cap, "items", rows)
    cap.init()
    # Five hot rows: the first, three in the middle and the maximum key.
    hot = [(BIG_KEY + g * 10,) for g in (1, rows // 4, rows // 2, 3 * rows // 4, rows)]
    statement = "UPDATE {s}.items SET name = %s, n = n + 1 WHERE id = %s"
    with Hammer(source, cap, statement, hot) as hammer:
        wait_for(lambda: hammer.count >= 100, "the hot-key writer to get going")
        before = hammer.count

        def pace(task: ChunkTask) -> None:
            # Each chunk waits for a few more hot updates, so every window races them
            # whatever the machine's speed (no timing assumption).
            target = hammer.count + 15
            deadline = time.monotonic() + 10
            while hammer.count < target and time.monotonic() < deadline:
                time.sleep(0.002)

        cap.execute(qualified(cap, "items"))
        engine = cap.start(hooks=PhaseHooks(before_open=pace))
        wait_for(
            lambda: state_of(cap, "items") not in (None, "pending", "running"),
            "the snapshot to finish",
            timeout=120,
            engine=engine,
        )
        during = hammer.count - before
    assert engine.stop() == 0
    assert catch_up(cap) == 0
    assert_converged(cap, "items")
    done = progress(cap, "items")
    read = reads(cap, "items")
    hot_read = sum(read[json.dumps({"id": k[0]})] for k in hot)
    print(f"\n{during} hot updates during the snapshot; hot keys read {hot_read} times; {done}")
    assert done["state"] == "done"
    assert during >= 500, f"only {during} hot updates while the snapshot ran"
    assert max(read.values()) == 1
    assert len(read) >= rows - len(hot)  # only hot rows may have been dropped by windows


# --- 3. TRUNCATE ------------------------------------------------------------------------------


@pytest.mark.parametrize("phase", ["before_open", "after_open", "after_read"])
def test_truncate_during_the_snapshot_converges(source: Source, phase: str) -> None:
    rows = 10_000
    cap = source.capture(chunk_size=500)
    table = source.create(cap, "items", rows)
    cap.init()

    def truncate_and_refill() -> None:
        source.sql(cap, "TRUNCATE {s}.items")
        # New rows across the old key range and beyond its maximum.
        refill = [(BIG_KEY + g * 35 + 3, g % 10, "after", g) for g in range(1, rows // 3)]
        source.insert(cap, "items", refill)

    writer = source.writer(cap, table, rows, changes=None, rate=400, seed=3)
    with writer:
        wait_for(lambda: writer.total >= 50, "the writer to get going")
        cap.execute(qualified(cap, "items"))
        engine = cap.start(hooks=PhaseHooks(**{phase: at_chunk(6, truncate_and_refill)}))
        wait_for(
            lambda: state_of(cap, "items") not in (None, "pending", "running"),
            "the snapshot to finish",
            timeout=120,
            engine=engine,
        )
        time.sleep(0.5)  # writes after the snapshot too
    assert engine.stop() == 0
    assert catch_up(cap) == 0
    assert_converged(cap, "items")
    counts = ops(cap, "items")
    print(f"\ntruncate at {phase} of chunk 6: events {dict(counts)}; writer {writer.counts}")
    assert counts["t"] == 1
    assert state_of(cap, "items") == "done"


# --- 4. a filter with OR ----------------------------------------------------------------------


def test_a_filter_with_or_reads_only_matching_rows_once_within_the_key_range(
    source: Source,
) -> None:
    rows = 5_000
    cap = source.capture(chunk_size=100)
    source.create(cap, "items", rows)
    cap.init()
    maximum = BIG_KEY + 10 * max(g for g in range(1, rows + 1) if g % 10 in (1, 2))
    # Beyond the table's last row, matching the filter (a in (1, 2)).
    beyond = [BIG_KEY + rows * 10 + 1 + i for i in range(0, 300, 3)]

    def insert_beyond_the_maximum() -> None:
        source.insert(cap, "items", [(k, 1 + i % 2, "beyond", 0) for i, k in enumerate(beyond)])

    cap.execute(qualified(cap, "items"), filters=[f"{qualified(cap, 'items')}=a = 1 OR a = 2"])
    assert catch_up(cap, PhaseHooks(before_open=at_chunk(2, insert_beyond_the_maximum))) == 0
    done = progress(cap, "items")
    assert done["state"] == "done"
    assert done["max_key"] == [maximum]
    read_events = [e for e in events(cap, "items") if op(e) == "r"]
    assert all(e["value"]["after"]["a"] in (1, 2) for e in read_events)
    per_key = Counter(e["key"]["id"] for e in read_events)
    assert max(per_key.values()) == 1, [k for k, n in per_key.items() if n > 1][:5]
    matching = {
        r[0]
        for r in source.sql(
            cap, "SELECT id FROM {s}.items WHERE a IN (1, 2) AND id <= %s", (maximum,)
        )
    }
    assert set(per_key) == matching  # every matching row within the range, nothing else
    assert not set(per_key) & set(beyond)  # beyond the maximum: log events only
    created = {e["key"]["id"] for e in events(cap, "items") if op(e) == "c"}
    assert created == set(beyond)
    assert done["rows"] == len(matching)


# --- 5. two tables in one signal --------------------------------------------------------------


def test_two_tables_in_one_signal_both_finish_and_converge(source: Source) -> None:
    cap = source.capture(chunk_size=500)
    items = source.create(cap, "items", 8_000)
    composite = source.create(cap, "composite", 8_000)
    cap.init()
    with (
        source.writer(cap, items, 8_000, changes=None, rate=300, seed=5),
        source.writer(cap, composite, 8_000, changes=None, rate=300, seed=6),
    ):
        cap.execute(qualified(cap, "items"), qualified(cap, "composite"))
        engine = cap.start()
        wait_for(
            lambda: all(state_of(cap, t) == "done" for t in ("items", "composite")),
            "both snapshots to finish",
            timeout=120,
            engine=engine,
        )
    assert engine.stop() == 0
    assert catch_up(cap) == 0
    for name in ("items", "composite"):
        assert_converged(cap, name)
        assert progress(cap, name)["rows"] > 0
    signal_ids = {s["signal_id"] for s in report(cap)["snapshots"]}
    assert len(signal_ids) == 1


# --- 6. an empty table ------------------------------------------------------------------------


def test_an_empty_table_is_done_at_once(source: Source) -> None:
    cap = source.capture()
    source.create(cap, "items", 0)
    cap.init()
    cap.execute(qualified(cap, "items"))
    assert catch_up(cap) == 0
    done = progress(cap, "items")
    assert (done["state"], done["rows"], done["max_key"]) == ("done", 0, None)
    assert not [e for e in events(cap, "items") if op(e) == "r"]
    assert_converged(cap, "items")


# --- 7. rows inserted beyond the maximum key --------------------------------------------------


def test_rows_inserted_beyond_the_maximum_key_arrive_as_log_events(source: Source) -> None:
    rows = 5_000
    cap = source.capture(chunk_size=500)
    source.create(cap, "items", rows)
    cap.init()
    maximum = BIG_KEY + rows * 10
    first = [maximum + i for i in range(1, 101)]
    second = [maximum + i for i in range(101, 201)]

    def insert(keys: list[int]) -> Callable[[], None]:
        def run() -> None:
            source.insert(cap, "items", [(k, 1, "new", 0) for k in keys])
            source.sql(cap, "UPDATE {s}.items SET n = 1 WHERE id = %s", (keys[0],))

        return run

    cap.execute(qualified(cap, "items"))
    run_hooks = PhaseHooks(
        before_open=at_chunk(2, insert(first)), after_read=at_chunk(5, insert(second))
    )
    assert catch_up(cap, run_hooks) == 0
    assert_converged(cap, "items")
    done = progress(cap, "items")
    assert done["max_key"] == [maximum]
    read = reads(cap, "items")
    new = {json.dumps({"id": k}) for k in first + second}
    assert not new & set(read)
    assert len(read) == rows and max(read.values()) == 1
    created = {key_of(e) for e in events(cap, "items") if op(e) == "c"}
    assert created == new


# --- 8. stop, pause and resume mid-snapshot ---------------------------------------------------


def test_stop_mid_snapshot(source: Source) -> None:
    cap = source.capture(chunk_size=50)
    source.create(cap, "items", 5_000)
    cap.init()
    cap.execute(qualified(cap, "items"))
    engine = cap.start(until_caught_up=True, hooks=PhaseHooks(after_read=sleep_hook(0.05)))
    wait_for(lambda: progress(cap, "items").get("chunks", 0) >= 3, "a few chunks", engine=engine)
    assert cap.cli("signal", "stop-snapshot", qualified(cap, "items")) == 0
    assert engine.join(60) == 2
    stopped = progress(cap, "items")
    assert stopped["state"] == "stopped"
    assert 3 <= stopped["chunks"] < 100
    read = reads(cap, "items")
    assert sum(read.values()) == stopped["rows"] < 5_000


def test_pause_holds_reads_and_resume_finishes(source: Source) -> None:
    cap = source.capture(chunk_size=50)
    source.create(cap, "items", 5_000)
    cap.init()
    cap.execute(qualified(cap, "items"))
    engine = cap.start(hooks=PhaseHooks(after_read=sleep_hook(0.03)))
    wait_for(lambda: progress(cap, "items").get("chunks", 0) >= 3, "a few chunks", engine=engine)
    assert cap.cli("signal", "pause-snapshot") == 0
    wait_for(lambda: report(cap)["paused"], "the pause", engine=engine)
    time.sleep(1.5)  # windows in flight close; the sink flushes
    held = sum(reads(cap, "items").values())
    chunks = progress(cap, "items")["chunks"]
    # The stream goes on while paused: an update arrives, READ rows do not.
    source.sql(cap, f"UPDATE {{s}}.items SET name = 'while paused' WHERE id = {BIG_KEY + 10}")
    wait_for(
        lambda: any(op(e) == "u" for e in events(cap, "items")),
        "the update made while paused",
        timeout=15,
        engine=engine,
    )
    time.sleep(1.0)
    paused = progress(cap, "items")
    assert paused["state"] == "paused"
    assert sum(reads(cap, "items").values()) == held
    assert paused["chunks"] == chunks and held < 5_000
    assert cap.cli("signal", "resume-snapshot") == 0
    wait_for(lambda: state_of(cap, "items") == "done", "the snapshot to finish", engine=engine)
    assert engine.stop() == 0
    assert not report(cap)["paused"]
    assert_converged(cap, "items")
    assert max(reads(cap, "items").values()) == 1


# --- 9. a table created while the engine runs -------------------------------------------------


def test_a_table_created_after_init_is_added_to_the_capture_and_snapshotted(
    source: Source,
) -> None:
    cap = source.capture(chunk_size=200)
    source.create(cap, "items", 100)
    cap.init()
    late = source.create(cap, "composite", 2_000)

    if not source.logs_every_table:
        assert not source.logged(cap, "composite")

    def write() -> None:
        source.sql(cap, "INSERT INTO {s}.composite VALUES (99, 'late row', 'x', 1)")
        source.sql(cap, "UPDATE {s}.composite SET payload = 'changed' WHERE region = 1")
        source.sql(cap, "DELETE FROM {s}.composite WHERE region = 2")

    engine = cap.start(hooks=PhaseHooks(before_open=at_chunk(2, write)))
    cap.execute(qualified(cap, late.name))
    wait_for(lambda: state_of(cap, "composite") == "done", "the snapshot", engine=engine)
    source.sql(cap, "UPDATE {s}.composite SET payload = 'after' WHERE region = 3")
    assert engine.stop() == 0
    assert catch_up(cap) == 0
    assert source.logged(cap, "composite")
    counts = ops(cap, "composite")
    assert counts["c"] >= 1 and counts["u"] >= 50 and counts["d"] >= 1, counts
    assert_converged(cap, "composite")


# --- 10. bad signals --------------------------------------------------------------------------


def test_bad_signals_are_reported_while_the_stream_goes_on(
    source: Source, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="snapshotter")
    schema = source.schema
    cap = source.capture(
        chunk_size=200,
        tables=[f"{schema}.items", f"{schema}.nopk", f"{schema}.ghost.*"],
    )
    source.create(cap, "items", 500)
    source.create(cap, "nopk", 3_000)
    source.sql(cap, "CREATE TABLE {s}.outside (id int PRIMARY KEY)")
    cap.init()
    engine = cap.start()
    bad_id = f"bad-json-{uuid.uuid4().hex[:6]}"
    source.sql(
        cap,
        "INSERT INTO {s}.debezium_signal (id, type, data) VALUES (%s, 'execute-snapshot', %s)",
        (bad_id, '{"data-collections": ["x"'),
    )
    # `snapshotter signal` refuses tables it can tell are wrong (test_signal_limits covers
    # that): these go in as rows, as any client may insert them, for the engine's side.
    for name in ("ghost_table", "outside"):
        source.sql(
            cap,
            "INSERT INTO {s}.debezium_signal (id, type, data) VALUES (%s, 'execute-snapshot', %s)",
            (f"raw-{name}", json.dumps({"data-collections": [f"{schema}.{name}"]})),
        )
    cap.execute(f"{schema}.nopk")
    expected = {
        "ghost_table": ["does not exist"],
        "nopk": list(source.no_key_phrases),
    }
    wait_for(
        lambda: (
            all(state_of(cap, t) == "failed" for t in expected)
            and any(p["signal_id"] == bad_id for p in report(cap)["signal_problems"])
        ),
        "the bad signals in status",
        timeout=30,
        engine=engine,
    )
    for table, phrases in expected.items():
        error = progress(cap, table)["error"]
        print(f"\n{table}: {error}")
        assert all(p in error for p in phrases), (table, error)
        assert error in caplog.text
    # A table that exists outside source.tables is another pipeline's (several may read one
    # signal table): skipped with a note, not a failed snapshot (issue 26).
    assert state_of(cap, "outside") is None
    assert f"raw-outside (execute-snapshot) ignored: {schema}.outside not captured" in caplog.text
    problem = next(p for p in report(cap)["signal_problems"] if p["signal_id"] == bad_id)
    print(f"\nbad JSON: {problem['error']}")
    assert "json" in problem["error"].lower(), problem
    assert bad_id in caplog.text
    # The stream goes on: a change to a captured table still reaches the sink.
    source.sql(cap, f"UPDATE {{s}}.items SET name = 'still streaming' WHERE id = {BIG_KEY + 10}")
    wait_for(
        lambda: any(
            op(e) == "u" and e["value"]["after"]["name"] == "still streaming"
            for e in events(cap, "items")
        ),
        "the update after the bad signals",
        timeout=15,
        engine=engine,
    )
    assert engine.stop() == 2  # the run worked on snapshots that failed

    # A surrogate key makes the table without a primary key snapshottable.
    def write() -> None:
        source.sql(cap, "INSERT INTO {s}.nopk VALUES (1, 'new'), (100000, 'beyond')")
        source.sql(cap, "UPDATE {s}.nopk SET label = 'changed' WHERE uid % 7 = 0")
        source.sql(cap, "DELETE FROM {s}.nopk WHERE uid % 11 = 0")
        source.sql(cap, "UPDATE {s}.nopk SET uid = uid + 100000 WHERE uid % 13 = 0")

    cap.execute(f"{schema}.nopk", surrogate="uid")
    assert catch_up(cap, PhaseHooks(after_open=at_chunk(3, write))) == 0
    done = progress(cap, "nopk")
    assert done["state"] == "done", done
    verdict = source.verify_by(cap, "nopk", ["uid"])
    assert verdict.ok, verdict.render()


def test_a_surrogate_key_snapshot_converges_under_a_writer(source: Source) -> None:
    """The table without a primary key, written to before and while its surrogate-key
    snapshot runs (the same engine session sees its changes before the signal)."""
    rows = 5_000
    cap = source.capture(chunk_size=250)
    table = source.create(cap, "nopk", rows)
    cap.init()
    with source.writer(cap, table, rows, changes=None, rate=300, seed=10) as writer:
        engine = cap.start()
        wait_for(lambda: writer.total >= 200, "the writer to get going", engine=engine)
        time.sleep(1.0)  # the engine streams some of the table's changes first
        cap.execute(qualified(cap, "nopk"), surrogate="uid")
        wait_for(
            lambda: state_of(cap, "nopk") not in (None, "pending", "running"),
            "the snapshot to finish",
            timeout=120,
            engine=engine,
        )
    assert engine.stop() == 0
    assert catch_up(cap) == 0
    assert progress(cap, "nopk")["state"] == "done"
    # Changes streamed before the signal are keyed by the whole row (the table has no key
    # yet); from the snapshot on, by the surrogate key. A consumer that knows the surrogate
    # key replays by it:
    replayed: dict[int, str] = {}
    for record in cap.events("nopk"):
        value = record["value"]
        if value["op"] == "t":
            replayed.clear()
        elif value["op"] == "d":
            replayed.pop(value["before"]["uid"], None)
        else:
            replayed[value["after"]["uid"]] = value["after"]["label"]
    assert replayed == dict(cap.sql(f"SELECT uid, label FROM {qualified(cap, 'nopk')}", None))
    after_signal = [r for r in cap.events("nopk") if r["value"]["op"] == "r"]
    assert after_signal and all(set(r["key"]) == {"uid"} for r in after_signal)


def test_changes_after_a_restart_keep_the_surrogate_key(source: Source) -> None:
    """After a surrogate-key snapshot, a later run must key the table's events as its READ
    rows were keyed, or a consumer cannot apply a delete to the row it read."""
    cap = source.capture(chunk_size=250)
    source.create(cap, "nopk", 1_000)
    cap.init()
    cap.execute(qualified(cap, "nopk"), surrogate="uid")
    assert catch_up(cap) == 0
    source.sql(cap, "UPDATE {s}.nopk SET label = 'changed' WHERE uid = 3")
    source.sql(cap, "DELETE FROM {s}.nopk WHERE uid = 6")
    assert catch_up(cap) == 0
    keys = {key_of(e) for e in events(cap, "nopk") if op(e) in "ud"}
    assert keys == {json.dumps({"uid": 3}), json.dumps({"uid": 6})}
    verdict = source.verify_by(cap, "nopk", ["uid"])
    assert verdict.ok, verdict.render()


# --- 11. --until-caught-up returns ------------------------------------------------------------


def test_until_caught_up_returns_on_an_idle_database(source: Source) -> None:
    cap = source.capture()
    source.create(cap, "items", 10)
    cap.init()
    started = time.monotonic()
    assert catch_up(cap) == 0
    assert time.monotonic() - started < 15


def test_until_caught_up_returns_with_traffic_only_in_other_tables(source: Source) -> None:
    cap = source.capture()
    source.create(cap, "items", 10)
    cap.init()
    items = source.tables["items"]
    with source.other_schema(cap) as other:
        source.create(cap, items, 1_000, schema=other)
        with source.writer(cap, items, 1_000, schema=other, changes=None, seed=11) as writer:
            wait_for(lambda: writer.total >= 100, "the writer to get going")
            started = time.monotonic()
            assert catch_up(cap) == 0
            took = time.monotonic() - started
            assert writer.running
        print(f"\nreturned after {took:.1f} s with {writer.total} changes elsewhere")
        assert took < 30
    assert not events(cap, "items")


# --- 12. restart mid-snapshot -----------------------------------------------------------------


def test_a_restart_mid_snapshot_resumes_after_the_last_read_key(source: Source) -> None:
    rows, chunk = 20_000, 200
    cap = source.capture(chunk_size=chunk)
    table = source.create(cap, "items", rows)
    cap.init()
    with source.writer(cap, table, rows, changes=None, rate=300, seed=12):
        cap.execute(qualified(cap, "items"))
        # 50 ms per chunk: the 100 chunks take 5 s at least, so the stop after the tenth comes
        # while the snapshot runs (CI: at 10 ms per chunk the snapshot once finished between
        # the check below and the stop, and the engine exited 0).
        engine = cap.start(hooks=PhaseHooks(after_read=sleep_hook(0.05)))
        wait_for(lambda: progress(cap, "items").get("chunks", 0) >= 10, "ten chunks", engine=engine)
        assert engine.stop() == 2  # stopped with the snapshot unfinished
        first = progress(cap, "items")
        assert first["state"] == "running" and first["last_key"] is not None
        no_partial_lines(cap.sink_path)
        assert catch_up(cap) == 0
    assert catch_up(cap) == 0  # the writer's last changes
    done = progress(cap, "items")
    assert done["state"] == "done"
    assert done["chunks"] > first["chunks"]
    read = reads(cap, "items")
    twice = [k for k, n in read.items() if n > 1]
    print(f"\nstopped after {first['chunks']} chunks; {len(twice)} keys read twice")
    assert max(read.values()) <= 2
    assert len(twice) <= 2 * chunk  # at most the chunks in flight
    no_partial_lines(cap.sink_path)
    assert_converged(cap, "items")


def _cli(cap: Capture, command: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "snapshotter.app.cli", command, "-c", str(cap.config_path), *args]


def test_the_cli_resumes_after_sigterm(source: Source) -> None:
    rows, chunk = 40_000, 100
    cap = source.capture(chunk_size=chunk)
    table = source.create(cap, "items", rows)
    cap.init()
    cap.execute(qualified(cap, "items"))
    with source.writer(cap, table, rows, changes=None, rate=200, seed=13):
        run = subprocess.Popen(
            _cli(cap, "run", "--until-caught-up"),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            wait_for(
                lambda: progress(cap, "items").get("chunks", 0) >= 5 or run.poll() is not None,
                "five chunks in the subprocess",
            )
            assert run.poll() is None, run.communicate()[0]
            run.send_signal(signal.SIGTERM)
            output, _ = run.communicate(timeout=60)
        finally:
            if run.poll() is None:
                run.kill()
        assert run.returncode == 2, output  # ended with the snapshot unfinished
        first = progress(cap, "items")
        assert first["state"] == "running", (first, output)
        no_partial_lines(cap.sink_path)
        resume = subprocess.run(
            _cli(cap, "resume", "--until-caught-up"),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    assert resume.returncode == 0, resume.stdout + resume.stderr
    said = resume.stdout
    print(f"\nresume said:\n{said}")
    assert "stream position" in said
    assert qualified(cap, "items") in said
    assert f"{first['chunks']} chunks" in said
    assert "after key" in said and str(first["last_key"][0]) in said
    assert catch_up(cap) == 0  # the writer's last changes
    status = subprocess.run(
        _cli(cap, "status", "--json"), cwd=REPO, capture_output=True, text=True, check=True
    )
    snapshot = json.loads(status.stdout)["snapshots"][-1]
    assert snapshot["table"] == qualified(cap, "items")
    assert snapshot["state"] == "done"
    assert snapshot["rows"] > 0 and snapshot["chunks"] > first["chunks"]
    read = reads(cap, "items")
    assert max(read.values()) <= 2
    assert sum(n > 1 for n in read.values()) <= 2 * chunk
    no_partial_lines(cap.sink_path)
    assert_converged(cap, "items")


# --- 13. keys under a case-insensitive, PAD SPACE collation (MySQL) ---------------------------


def test_case_only_key_changes_inside_windows_converge_on_a_ci_key(
    mysql_capture: CaptureFactory,
) -> None:
    """'abc', 'ABC' and 'abc ' are one key to utf8mb4_general_ci and three to the engine,
    which matches exact stored values: a case-only or trailing-space key change inside a
    window drops the old and the new spelling from the chunk, and the output holds exactly
    the stored spellings."""
    cap = mysql_capture(chunk_size=50)
    cap.sql(
        f"CREATE TABLE {_my_quote(cap.schema)}.ci (k varchar(20) COLLATE utf8mb4_general_ci "
        "PRIMARY KEY, v int)"
    )
    cap.sql(
        f"INSERT INTO {_my_quote(cap.schema)}.ci SELECT CONCAT('a', LPAD(g - 1, 3, '0')), g FROM "
        + NUMS.replace("{n}", "1000")
    )
    cap.init()
    table = f"{_my_quote(cap.schema)}.ci"

    def rename(old: str, new: str) -> Callable[[], None]:
        return lambda: cap.sql(f"UPDATE {table} SET k = %s WHERE k = %s", (new, old))

    hooks = PhaseHooks(
        # Before the chunk's SELECT: it reads the new spelling, the log deletes the old.
        after_open=at_chunk(3, rename("a120", "A120")),
        # After the SELECT read the old spelling: the log's delete must drop it.
        after_read=at_chunk(5, lambda: (rename("a230", "A230")(), rename("a231", "a231 ")())),
    )
    cap.execute(qualified(cap, "ci"))
    assert catch_up(cap, hooks) == 0
    assert state_of(cap, "ci") == "done"
    verdict = assert_converged(cap, "ci")
    stored = {r[0] for r in cap.sql(f"SELECT k FROM {table}")}
    assert {"A120", "A230", "a231 "} <= stored and not {"a120", "a230", "a231"} & stored
    final: dict[str, str] = {}
    for e in events(cap, "ci"):
        final[e["key"]["k"]] = op(e)
    assert {k for k, o in final.items() if o != "d"} == stored
    read = reads(cap, "ci")
    for old in ("a120", "a230", "a231"):
        assert final[old] == "d"
        assert read[json.dumps({"k": old})] == 0 or old == "a120", old
    print(f"\n{verdict.render()}; events {dict(ops(cap, 'ci'))}")


# --- Kafka: the broker fails during a snapshot -------------------------------------------------


class PrivateKafka:
    """A broker of this test's own (scripts/services in local mode, its own directory and
    ports), so it can be killed and restarted without touching the shared one."""

    def __init__(self, directory: Path) -> None:
        import socket

        def free_port() -> int:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port: int = s.getsockname()[1]
                return port

        self.directory = directory
        self.env = {
            **{k: v for k, v in os.environ.items() if k != "SNAPSHOTTER_KAFKA_BOOTSTRAP"},
            "SNAPSHOTTER_SERVICES_MODE": "local",
            "SNAPSHOTTER_SERVICES_DIR": str(directory),
            "SNAPSHOTTER_KAFKA_PORT": str(free_port()),
            "SNAPSHOTTER_KAFKA_CONTROLLER_PORT": str(free_port()),
            "KAFKA_HEAP_OPTS": "-Xmx384m -Xms384m",
        }
        self.bootstrap = f"127.0.0.1:{self.env['SNAPSHOTTER_KAFKA_PORT']}"

    def _services(self, *args: str) -> None:
        done = subprocess.run(
            [str(REPO / "scripts" / "services"), *args, "kafka"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, f"scripts/services {args} kafka: {done.stderr[-3000:]}"

    def start(self) -> None:
        self._services("up")

    def stop(self) -> None:
        self._services("down")

    def kill(self) -> None:
        """SIGKILL: no controlled shutdown, no flush."""
        pid = int((self.directory / "kafka" / "kafka.pid").read_text().strip())
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)


@pytest.fixture
def private_kafka(tmp_path: Path, kafka_bootstrap: str) -> Iterator[PrivateKafka]:
    # kafka_bootstrap: the shared broker answers, so Java and the jars are there
    kafka = PrivateKafka(tmp_path / "kafka-services")
    kafka.start()
    try:
        yield kafka
    finally:
        kafka.stop()


def assert_kafka_converged(cap: Capture, table: str, bootstrap: str) -> Verdict:
    """The topic replayed by a plain consumer equals the table, and ``verify`` agrees."""
    messages = consume_all(bootstrap, cap.topic(table))
    replayed, counts = replay_by_key(messages)
    expected = table_as_json(cap, table, cap.key_of(table), json_as_text=False)
    missing, extra = expected.keys() - replayed.keys(), replayed.keys() - expected.keys()
    assert not missing and not extra, (len(missing), len(extra), sorted(missing)[:3])
    differing = [k for k, row in expected.items() if replayed[k] != row]
    assert not differing, (differing[:3], [(expected[k], replayed[k]) for k in differing[:1]])
    verdict = cap.verify(table)
    assert verdict.ok, verdict.render()
    assert all(counts.get(k, 0) > 0 for k in "rcud"), counts
    return verdict


FAULT_ROWS = 20_000


@contextmanager
def kafka_snapshot_under_way(
    source: Source, kafka: PrivateKafka, seed: int, settings: str = ""
) -> Iterator[tuple[Capture, Table, RandomWriter, EngineThread]]:
    """A snapshot to ``kafka`` of FAULT_ROWS items under the random writer, five chunks in;
    the writer keeps going until the block ends."""
    cap = source.capture(
        chunk_size=500, sink="kafka", kafka_bootstrap=kafka.bootstrap, kafka_settings=settings
    )
    table = source.create(cap, "items", FAULT_ROWS)
    cap.init()
    writer = source.writer(cap, table, FAULT_ROWS, changes=None, seed=seed, rate=400)
    with writer:
        wait_for(lambda: writer.total >= 100, "the writer to get going")
        cap.execute(qualified(cap, table.name))
        engine = cap.start(hooks=PhaseHooks(before_open=lambda task: time.sleep(0.1)))
        wait_for(
            lambda: progress(cap, table.name).get("chunks", 0) >= 5,
            "five chunks",
            engine=engine,
        )
        yield cap, table, writer, engine


# CI: MariaDB (the broker's restart is the sink's, whatever the source); both with the full
# matrix.
@pytest.mark.parametrize(
    "source", ["postgres", "mysql"] if FULL_MATRIX else ["mysql"], indirect=True
)
def test_a_kafka_broker_restart_mid_snapshot_loses_nothing(
    source: Source, private_kafka: PrivateKafka
) -> None:
    """The broker is killed (SIGKILL) while the snapshot runs under the random writer and
    started again a few seconds later; the engine rides it out (the idempotent producer
    retries in order), and the topic still converges to the table."""
    with kafka_snapshot_under_way(source, private_kafka, seed=7) as (cap, table, writer, engine):
        private_kafka.kill()
        killed_at = writer.total
        time.sleep(3)
        private_kafka.start()
        wait_for(
            lambda: state_of(cap, table.name) not in (None, "pending", "running"),
            "the snapshot to finish",
            timeout=240,
            engine=engine,
        )
        during = writer.total - killed_at
    assert engine.stop(timeout=120) == 0
    assert cap.run(timeout=180) == 0
    verdict = assert_kafka_converged(cap, table.name, private_kafka.bootstrap)
    print(
        f"\n{source.name}: broker killed and restarted mid-snapshot; writer {during} changes "
        f"since; {verdict.table_rows} rows converged, {verdict.repeats} events repeated"
    )
    assert state_of(cap, table.name) == "done"


@pytest.mark.parametrize(
    ("source", "client"),
    _matrix(
        [
            pytest.param(db, client, id=f"{db}-{client}")
            for db in ("postgres", "mysql")
            for client in ("kafka-python", "confluent")
        ],
        {"postgres-confluent"},  # CI: one (the broker restart case runs kafka-python)
    ),
    indirect=["source"],
)
def test_a_kafka_outage_past_the_delivery_timeout_stops_the_engine_and_resume_converges(
    source: Source, private_kafka: PrivateKafka, client: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker stays down past the producer's delivery timeout: the engine stops with an
    error that says Kafka did not acknowledge, the state keeps only what was acknowledged,
    and once the broker is back a new run resends what followed and converges (messages
    may repeat: at least once). With either client (librdkafka fails the deliveries itself
    at its delivery timeout; kafka-python keeps retrying and the sink's own timer fires)."""
    from snapshotter.sinks.kafka.sink import KafkaSinkError

    if client == "confluent":
        pytest.importorskip("confluent_kafka")
    monkeypatch.setenv("SNAPSHOTTER_KAFKA_CLIENT", client)
    fast_failing = {
        "kafka-python": (
            "{delivery_timeout_ms = 6000, request_timeout_ms = 2000, max_block_ms = 6000, "
            "linger_ms = 5}"
        ),
        "confluent": (
            '{"delivery.timeout.ms" = 6000, "request.timeout.ms" = 2000, "linger.ms" = 5, '
            '"socket.timeout.ms" = 6000}'
        ),
    }[client]
    with kafka_snapshot_under_way(source, private_kafka, seed=11, settings=fast_failing) as (
        cap,
        table,
        _,
        engine,
    ):
        private_kafka.kill()
        with pytest.raises(KafkaSinkError) as failure:
            engine.join(timeout=120)
        saved = progress(cap, table.name)
        time.sleep(1)  # the writer goes on while nothing runs
    message = str(failure.value)
    assert "Kafka did not acknowledge" in message or "took no messages" in message, message
    assert saved.get("state") == "running", saved
    private_kafka.start()
    assert cap.run(timeout=240) == 0
    verdict = assert_kafka_converged(cap, table.name, private_kafka.bootstrap)
    print(
        f"\n{source.name}: engine stopped by the outage ({message[:120]}...) at chunk "
        f"{saved.get('chunks')}; resumed: {verdict.table_rows} rows converged, "
        f"{verdict.repeats} events repeated"
    )
    assert state_of(cap, table.name) == "done"

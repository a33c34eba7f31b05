"""How fast one chunk SELECT becomes an Arrow table, per client library (issue 16, item 4).

    python bench/read_bench.py chunk [--source postgres|mysql|both] [--rows 200000]
                                     [--chunk-sizes 4096,10240] [--rounds 5]
                                     [--pg-url URL] [--mysql-url URL]

One run creates, per database, a table of ``--rows`` rows with a composite key and six
columns: ``k1 bigint, k2 int, amount numeric(12,2), created timestamptz (MySQL:
timestamp(6)), name text, score float8 (double)``, PRIMARY KEY (k1, k2). It then reads the
whole table in keyset chunks of each ``--chunk-sizes``, every chunk as the engine reads it
(its own read-only transaction, the visibility snapshot on PostgreSQL, the key bounds bound
as parameters), each way below, and a plain whole-table read as the baseline; ``--rounds``
interleaved rounds (every way once per round, in turn), medians of wall and CPU time
(``time.process_time``: this process only, the server's CPU is not counted; C code in this
process is).

Before timing, every way's table is checked against the dialect's: same Arrow types, same
values (a way that differs is reported, not timed).

PostgreSQL ways:

* ``dialect``: ``PostgresDialect.read_chunk``, what the engine runs;
* ``psycopg text (before)``: the chunk read before issue 16: psycopg, text format, the log
  decoder's loaders (``pg_types.LoadContext``), prepared, tuples, then one ``pa.array`` per
  column (``rows_to_arrow``);
* ``psycopg binary``: the same with binary results and psycopg's C binary loaders;
* ``psycopg COPY binary``: ``COPY (SELECT ...) TO STDOUT (FORMAT BINARY)`` in the same
  transaction, key bounds as ``sql.Literal`` (COPY takes no parameters), rows loaded by
  psycopg (``copy.rows()``), then ``rows_to_arrow``;
* ``ADBC literal (COPY)``: adbc-driver-postgresql with the bounds as literals: the driver
  runs ``COPY ... (FORMAT binary)`` and parses it into Arrow in C;
* ``ADBC bound``: the same with bound parameters (a prepared statement, binary results);
* baseline ``ADBC whole table``: one ``SELECT`` of the table into Arrow.

MySQL / MariaDB ways:

* ``dialect``: ``MySqlDialect.read_chunk`` (mysqlclient when importable, else pymysql);
* ``pymysql``: the dialect's chunk SQL through pymysql (pure Python), ``START TRANSACTION
  READ ONLY``, then ``rows_to_arrow``;
* ``mysqlclient``: the same through mysqlclient (``MySQLdb``, C);
* baselines: ``mysqlclient whole table`` and ``pymysql whole table`` into Arrow.

With ``--engine``, MySQL also end to end: ``--engine-rounds`` interleaved snapshots of the
same table into a counting sink (``run_engine(until_caught_up=True)``, as
``bench/lib/inprocess.py`` runs them), the chunk connection on mysqlclient and on pymysql in turn;
wall and CPU time (this process: the engine's threads) from the signal to the engine's return.

Prints one markdown table per database. The tables are dropped at the end, also on error.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pymysql
import sqlalchemy as sa
from psycopg import sql
from psycopg.adapt import PyFormat

from bench.lib import inprocess as inproc
from bench.lib.mysql import connect_args, execute
from signals.names import TableId
from snapshotter.sources.base import ChunkSpec, TableSchema
from snapshotter.sources.mysql.dialect import MySqlDialect
from snapshotter.sources.postgres import types as pg_types
from snapshotter.sources.postgres.dialect import PostgresDialect
from snapshotter.sources.sql_common import rows_to_arrow

DEFAULT_PG_URL = "postgresql://snapshotter:snapshotter@127.0.0.1:25432/snapshotter"
DEFAULT_MYSQL_URL = "mysql://snapshotter:snapshotter@127.0.0.1:23306/snapshotter"
TABLE = "items"
KEYS = ("k1", "k2")

Reader = Callable[[int], pa.Table]  # chunk size -> the whole table, read in chunks


@dataclass
class Way:
    name: str
    read: Reader | None  # None: not available (note says why)
    baseline: bool = False  # reads the whole table at once; timed once per round
    note: str = ""
    wall: dict[int, list[float]] = field(default_factory=dict)
    cpu: dict[int, list[float]] = field(default_factory=dict)


# --------------------------------------------------------------------------- timing


def timed(way: Way, chunk: int) -> None:
    assert way.read is not None
    wall, cpu = time.perf_counter(), time.process_time()
    table = way.read(chunk)
    way.cpu.setdefault(chunk, []).append(time.process_time() - cpu)
    way.wall.setdefault(chunk, []).append(time.perf_counter() - wall)
    del table


def check(ways: list[Way], reference: pa.Table, chunk: int) -> None:
    """Every way's table must equal the dialect's (types and values); a way that differs is
    dropped from the timing with the first difference as its note."""
    for way in ways:
        if way.read is None:
            continue
        try:
            got = way.read(chunk)
        except Exception as exc:
            way.read, way.note = None, f"failed: {type(exc).__name__}: {str(exc)[:120]}"
            continue
        if got.schema != reference.schema:
            way.read, way.note = None, f"other Arrow types: {got.schema}"
        elif not got.equals(reference):
            way.read, way.note = None, f"other values: {first_difference(got, reference)}"


def first_difference(got: pa.Table, want: pa.Table) -> str:
    if got.num_rows != want.num_rows:
        return f"{got.num_rows} rows, not {want.num_rows}"
    for name in want.column_names:
        a, b = got.column(name), want.column(name)
        if not a.equals(b):
            for i in range(len(b)):
                if a[i] != b[i]:
                    return f"{name}[{i}]: {a[i].as_py()!r} vs {b[i].as_py()!r}"
    return "?"


def run_rounds(ways: list[Way], chunks: list[int], rounds: int) -> None:
    for r in range(rounds):
        print(f"  round {r + 1}/{rounds}", file=sys.stderr)
        for way in ways:
            if way.read is not None and way.baseline:
                timed(way, 0)
            for chunk in chunks:
                if way.read is not None and not way.baseline:
                    timed(way, chunk)


def render(title: str, ways: list[Way], chunks: list[int], rows: int) -> str:
    base = next((w for w in ways if w.baseline and w.read is not None), None)
    base_wall = statistics.median(base.wall[0]) if base else None
    base_cpu = statistics.median(base.cpu[0]) if base else None
    lines = [
        f"### {title}: {rows:,} rows, medians of interleaved rounds",
        "",
        "| way | chunk | wall s | rows/s (wall) | CPU s | rows/s (CPU) | wall / baseline's "
        "| CPU / baseline's |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for way in ways:
        if way.read is None:
            lines.append(f"| {way.name} | – | – | – | – | – | skipped | {way.note} |")
            continue
        for chunk in [0] if way.baseline else chunks:
            wall = statistics.median(way.wall[chunk])
            cpu = statistics.median(way.cpu[chunk])
            size = "whole" if way.baseline else f"{chunk:,}"
            ratios = (
                f"{base_wall / wall:.2f} | {base_cpu / cpu:.2f}"
                if base_wall and base_cpu
                else "– | –"
            )
            lines.append(
                f"| {way.name} | {size} | {wall:.3f} | {rows / wall:,.0f} | {cpu:.3f} "
                f"| {rows / cpu:,.0f} | {ratios} |"
            )
    lines.append("")
    lines.append(
        "(ratios: the baseline's time over the way's, so 0.50 = half the baseline's speed; "
        "CPU: this process only)"
    )
    return "\n".join(lines)


def keyset(read_chunk: Callable[[tuple[Any, ...] | None, int], pa.Table]) -> Reader:
    """A reader paging by (k1, k2) with ``read_chunk(after, limit)``."""

    def read(limit: int) -> pa.Table:
        after: tuple[Any, ...] | None = None
        tables = []
        while True:
            table = read_chunk(after, limit)
            if table.num_rows == 0:
                break
            tables.append(table)
            last = table.slice(table.num_rows - 1)
            after = (last.column("k1")[0].as_py(), last.column("k2")[0].as_py())
            if table.num_rows < limit:
                break
        return pa.concat_tables(tables)

    return read


# --------------------------------------------------------------------------- PostgreSQL


def pg_load(url: str, schema: str, rows: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(
            f'CREATE TABLE "{schema}".{TABLE} (k1 bigint, k2 int, amount numeric(12,2), '
            "created timestamptz, name text, score float8, PRIMARY KEY (k1, k2))"
        )
        conn.execute(
            f'INSERT INTO "{schema}".{TABLE} SELECT g / 4, g %% 4, (g * 1.37)::numeric(12,2), '
            "timestamptz '2024-01-01 00:00:00+00' + g * interval '1.000001 second', "
            "'name-' || md5(g::text), g * 0.25 FROM generate_series(0, %s) g",
            (rows - 1,),
        )
        conn.execute(f'VACUUM ANALYZE "{schema}".{TABLE}')
        conn.execute(f'SELECT count(*), sum(score) FROM "{schema}".{TABLE}').fetchall()


def pg_drop(url: str, schema: str) -> None:
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    except psycopg.Error as exc:
        print(f"warning: dropping schema {schema}: {exc}", file=sys.stderr)


_PG_COLUMNS = (
    "k1, k2, CASE WHEN num_nonnulls(amount) = 1 THEN concat(amount) END AS amount, "
    "created, name, score"
)
_PG_TYPES = ["int8", "int4", "text", "timestamptz", "text", "float8"]


def pg_chunk_sql(schema: str, after: bool, param: str) -> str:
    """The chunk SELECT of the bench table, as the dialect writes it: numeric as its output
    text, row comparisons on the key, ``param`` the placeholder style ("%s" or "$")."""
    marks = [f"${i}" for i in range(1, 6)] if param == "$" else ["%s"] * 5
    where = f"(k1, k2) <= ({marks[0]}::int8, {marks[1]}::int4)"
    limit = marks[2]
    if after:
        where = f"(k1, k2) > ({marks[0]}::int8, {marks[1]}::int4) AND " + where.replace(
            marks[0], marks[2]
        ).replace(marks[1], marks[3])
        limit = marks[4]
    return (
        f'SELECT {_PG_COLUMNS} FROM "{schema}".{TABLE} WHERE {where} '
        f"ORDER BY k1, k2 LIMIT {limit}::int8"
    )


def pg_params(after: tuple[Any, ...] | None, upto: tuple[Any, ...], limit: int) -> tuple[Any, ...]:
    return (*(after or ()), *upto, limit)


def pg_psycopg(url: str, schema: str, table: TableSchema, upto: Any, binary: bool) -> Reader:
    """The chunk read before issue 16 (text, the log decoder's loaders, prepared), or the
    same with binary results and psycopg's own (C) binary loaders."""
    context = None if binary else pg_types.LoadContext()
    conn = psycopg.connect(url, autocommit=True, context=context)
    if context is not None:  # the loaders only: key values dumped as text, as before
        conn.adapters.register_dumper(int, psycopg.adapters.get_dumper(int, PyFormat.TEXT))
    conn.execute("SET TimeZone TO 'UTC'")
    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    conn.read_only = True
    arrow = table.arrow_schema()

    def read_chunk(after: tuple[Any, ...] | None, limit: int) -> pa.Table:
        query = pg_chunk_sql(schema, after is not None, "%s")
        with conn.transaction():
            conn.execute("SELECT pg_current_snapshot()::text").fetchone()
            cur = conn.cursor(binary=binary)
            rows = cur.execute(query, pg_params(after, upto, limit), prepare=True).fetchall()
        return rows_to_arrow(table, rows, arrow)

    return keyset(read_chunk)


def pg_copy(url: str, schema: str, table: TableSchema, upto: Any) -> Reader:
    conn = psycopg.connect(url, autocommit=True)
    conn.execute("SET TimeZone TO 'UTC'")
    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    conn.read_only = True
    arrow = table.arrow_schema()

    def read_chunk(after: tuple[Any, ...] | None, limit: int) -> pa.Table:
        query = sql.SQL(pg_chunk_sql(schema, after is not None, "%s").replace("%s", "{}"))
        literal = query.format(*(sql.Literal(v) for v in pg_params(after, upto, limit)))
        copy = sql.SQL("COPY ({}) TO STDOUT (FORMAT BINARY)").format(literal)
        with conn.transaction():
            conn.execute("SELECT pg_current_snapshot()::text").fetchone()
            with conn.cursor().copy(copy) as cp:
                cp.set_types(_PG_TYPES)
                rows = list(cp.rows())
        return rows_to_arrow(table, rows, arrow)

    return keyset(read_chunk)


def pg_adbc(url: str, schema: str, table: TableSchema, upto: Any, bound: bool) -> Reader:
    import adbc_driver_postgresql.dbapi as adbc

    conn = adbc.connect(url, autocommit=True)
    cur = conn.cursor()
    cur.executescript("SET TimeZone TO 'UTC'")
    arrow = table.arrow_schema()

    def read_chunk(after: tuple[Any, ...] | None, limit: int) -> pa.Table:
        query = pg_chunk_sql(schema, after is not None, "$")
        params: tuple[Any, ...] | None = pg_params(after, upto, limit)
        if not bound:
            assert params is not None
            for i, value in reversed(list(enumerate(params, 1))):
                query = query.replace(f"${i}", str(int(value)))  # the bench's keys: ints
            params = None
        cur.executescript("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        cur.execute("SELECT pg_current_snapshot()::text AS s")
        cur.fetch_arrow_table()
        cur.execute(query, params)
        got = cur.fetch_arrow_table()
        cur.executescript("COMMIT")
        return pa.Table.from_arrays(
            [c.cast(f.type) for c, f in zip(got.columns, arrow, strict=True)], schema=arrow
        )

    return keyset(read_chunk)


def pg_adbc_whole(url: str, schema: str) -> Reader:
    import adbc_driver_postgresql.dbapi as adbc

    conn = adbc.connect(url, autocommit=True)
    cur = conn.cursor()

    def read(_: int) -> pa.Table:
        cur.execute(f'SELECT {_PG_COLUMNS} FROM "{schema}".{TABLE}')
        return cur.fetch_arrow_table()

    return read


def adbc_installed() -> bool:
    try:
        import adbc_driver_postgresql.dbapi  # noqa: F401
    except ImportError:
        return False
    return True


def measure_postgres(url: str, rows: int, chunks: list[int], rounds: int) -> str:
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    print(f"PostgreSQL: loading {rows:,} rows into {schema}.{TABLE} ...", file=sys.stderr)
    pg_load(url, schema, rows)
    dialect = PostgresDialect(url, TableId(schema, "signal"), "unused")
    try:
        table = dialect.describe(TableId(schema, TABLE))
        upto = dialect.max_key(table, KEYS, None)
        assert upto is not None

        def dialect_chunk(after: tuple[Any, ...] | None, limit: int) -> pa.Table:
            return dialect.read_chunk(ChunkSpec(table, KEYS, after, upto, None, limit)).rows

        adbc = adbc_installed()
        missing = "adbc-driver-postgresql is not installed"
        ways = [
            Way("dialect (PostgresDialect.read_chunk)", keyset(dialect_chunk)),
            Way("psycopg text (before)", pg_psycopg(url, schema, table, upto, binary=False)),
            Way("psycopg binary", pg_psycopg(url, schema, table, upto, binary=True)),
            Way("psycopg COPY binary", pg_copy(url, schema, table, upto)),
            Way(
                "ADBC literal (COPY)",
                pg_adbc(url, schema, table, upto, bound=False) if adbc else None,
                note="" if adbc else missing,
            ),
            Way(
                "ADBC bound",
                pg_adbc(url, schema, table, upto, bound=True) if adbc else None,
                note="" if adbc else missing,
            ),
            Way(
                "ADBC whole table (baseline)",
                pg_adbc_whole(url, schema) if adbc else None,
                baseline=True,
                note="" if adbc else missing,
            ),
        ]
        reference = keyset(dialect_chunk)(chunks[0])
        check([w for w in ways if not w.baseline], reference, chunks[0])
        run_rounds(ways, chunks, rounds)
        return render("PostgreSQL", ways, chunks, rows)
    finally:
        dialect.close()
        pg_drop(url, schema)


# --------------------------------------------------------------------------- MySQL


def mysql_load(url: str, database: str, rows: int) -> None:
    name = f"`{database}`.`{TABLE}`"
    gen = (
        "WITH RECURSIVE s(g) AS (SELECT {0} UNION ALL SELECT g + 1 FROM s WHERE g < {1}) "
        "SELECT g FROM s"
    )
    conn = pymysql.connect(**connect_args(url), autocommit=True)
    try:
        with conn.cursor() as cur:
            # The load need not be in the log; deep recursive CTEs (MariaDB's, MySQL's limit).
            for setting in (
                "sql_log_bin = 0",
                "max_recursive_iterations = 100000000",
                "cte_max_recursion_depth = 100000000",
            ):
                with contextlib.suppress(pymysql.err.Error):
                    cur.execute(f"SET SESSION {setting}")
            cur.execute("SET time_zone = '+00:00'")
            cur.execute(f"CREATE DATABASE `{database}` CHARACTER SET utf8mb4")
            cur.execute(
                f"CREATE TABLE {name} (k1 bigint, k2 int, amount decimal(12,2), "
                "created timestamp(6) NULL, name text, score double, PRIMARY KEY (k1, k2)) "
                "ENGINE=InnoDB"
            )
            step = 50_000
            for first in range(0, rows, step):
                last = min(first + step, rows) - 1
                cur.execute(
                    f"INSERT INTO {name} SELECT g DIV 4, g MOD 4, g * 1.37, "
                    "timestamp'2024-01-01 00:00:00' + INTERVAL g * 1000001 MICROSECOND, "
                    f"concat('name-', md5(g)), g * 0.25 FROM ({gen.format(first, last)}) AS gen"
                )
            for statement in (f"ANALYZE TABLE {name}", f"SELECT count(*), sum(score) FROM {name}"):
                cur.execute(statement)
                cur.fetchall()
    finally:
        conn.close()


def mysqldb_module() -> Any:
    try:
        import MySQLdb
    except ImportError:
        return None
    return MySQLdb


def mysql_driver_reader(
    url: str, dialect: MySqlDialect, table: TableSchema, upto: Any, driver: str
) -> Reader:
    """The dialect's chunk SQL through ``driver`` (pymysql or mysqlclient) on a connection of
    the bench's own, each chunk in ``START TRANSACTION READ ONLY``, then ``rows_to_arrow``
    (after the dialect's zero-date fix)."""
    args = dialect.connect_args()
    if driver == "pymysql":
        conn: Any = pymysql.connect(**args, autocommit=True)
    else:
        mysqldb = mysqldb_module()
        kwargs = {k: v for k, v in args.items() if k in ("host", "port", "user", "charset")}
        kwargs.update(passwd=args.get("password", ""), db=args.get("database", ""))
        conn = mysqldb.connect(**kwargs, autocommit=True)
    cur = conn.cursor()
    cur.execute("SET time_zone = '+00:00'")
    arrow = table.arrow_schema()

    def read_chunk(after: tuple[Any, ...] | None, limit: int) -> pa.Table:
        query, params = dialect._statement(
            ChunkSpec(table, tuple(KEYS), after, upto, None, limit), False
        )
        cur.execute("START TRANSACTION READ ONLY")
        cur.execute(query, params)
        rows = list(cur.fetchall())
        cur.execute("COMMIT")
        rows = dialect._model_rows(table, table.column_names, rows, KEYS)
        return rows_to_arrow(table, rows, arrow)

    return keyset(read_chunk)


def mysql_whole(url: str, dialect: MySqlDialect, table: TableSchema, driver: str) -> Reader:
    args = dialect.connect_args()
    if driver == "pymysql":
        conn: Any = pymysql.connect(**args, autocommit=True)
    else:
        kwargs = {k: v for k, v in args.items() if k in ("host", "port", "user", "charset")}
        kwargs.update(passwd=args.get("password", ""), db=args.get("database", ""))
        conn = mysqldb_module().connect(**kwargs, autocommit=True)
    cur = conn.cursor()
    cur.execute("SET time_zone = '+00:00'")
    arrow = table.arrow_schema()
    name = f"`{table.table.schema}`.`{table.table.table}`"

    def read(_: int) -> pa.Table:
        cur.execute(f"SELECT * FROM {name}")
        return rows_to_arrow(table, list(cur.fetchall()), arrow)

    return read


def engine_snapshots(db_url: str, database: str, rows: int, chunk: int, rounds: int) -> str:
    """MySQL snapshots into a counting sink, end to end, per chunk client library."""
    import logging
    import tempfile

    from bench.lib.counting import CountingSink
    from snapshotter.sources.mysql import client as my_client

    logging.getLogger("pymysqlreplication").setLevel(logging.ERROR)
    clients = my_client.available()
    times: dict[str, list[tuple[float, float]]] = {c: [] for c in clients}
    preferred = my_client.default
    with tempfile.TemporaryDirectory(prefix="chunk-read-bench-") as tmp:
        for r in range(rounds):
            for client in clients:
                print(f"  engine round {r + 1}/{rounds}: {client}", file=sys.stderr)
                my_client.default = lambda c=client: c  # type: ignore[misc]
                try:
                    capture = inproc.MySqlCapture(
                        db_url, database, Path(tmp) / f"{client}{r}", chunk
                    )
                    cpu = time.process_time()
                    result = inproc.snapshot(capture, rows, CountingSink(), client)
                    times[client].append((result.seconds or 0.0, time.process_time() - cpu))
                finally:
                    my_client.default = preferred
    lines = [
        f"### MySQL / MariaDB end to end: snapshot of {rows:,} rows -> counting sink, chunk "
        f"{chunk:,}, medians of {rounds} interleaved rounds",
        "",
        "| chunk client | wall s | rows/s (wall) | CPU s (engine process) | rows/s (CPU) |",
        "|---|---:|---:|---:|---:|",
    ]
    for client, runs in times.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        lines.append(
            f"| {client} | {wall:.2f} | {rows / wall:,.0f} | {cpu:.2f} | {rows / cpu:,.0f} |"
        )
    return "\n".join(lines)


def measure_mysql(
    url: str, rows: int, chunks: list[int], rounds: int, engine_rounds: int = 0
) -> str:
    database = f"bench_{uuid.uuid4().hex[:10]}"
    print(f"MySQL: loading {rows:,} rows into {database}.{TABLE} ...", file=sys.stderr)
    try:
        mysql_load(url, database, rows)
        db_url = sa.make_url(url).set(database=database).render_as_string(hide_password=False)
        dialect = MySqlDialect(db_url, TableId(database, "signal"))
        try:
            table = dialect.describe(TableId(database, TABLE))
            upto = dialect.max_key(table, KEYS, None)
            assert upto is not None

            def dialect_chunk(after: tuple[Any, ...] | None, limit: int) -> pa.Table:
                return dialect.read_chunk(ChunkSpec(table, KEYS, after, upto, None, limit)).rows

            have = mysqldb_module() is not None
            missing = "mysqlclient is not installed"
            ways = [
                Way("dialect (MySqlDialect.read_chunk)", keyset(dialect_chunk)),
                Way("pymysql", mysql_driver_reader(url, dialect, table, upto, "pymysql")),
                Way(
                    "mysqlclient",
                    mysql_driver_reader(url, dialect, table, upto, "mysqlclient") if have else None,
                    note="" if have else missing,
                ),
                Way(
                    "mysqlclient whole table (baseline)",
                    mysql_whole(url, dialect, table, "mysqlclient") if have else None,
                    baseline=True,
                    note="" if have else missing,
                ),
                Way(
                    "pymysql whole table",
                    mysql_whole(url, dialect, table, "pymysql"),
                    baseline=True,
                ),
            ]
            reference = keyset(dialect_chunk)(chunks[0])
            check([w for w in ways if not w.baseline], reference, chunks[0])
            run_rounds(ways, chunks, rounds)
            out = render("MySQL / MariaDB", ways, chunks, rows)
        finally:
            dialect.close()
        if engine_rounds:
            out += "\n\n" + engine_snapshots(db_url, database, rows, chunks[0], engine_rounds)
        return out
    finally:
        with contextlib.suppress(pymysql.err.Error):
            execute(url, f"DROP DATABASE IF EXISTS `{database}`")


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--source", choices=("postgres", "mysql", "both"), default="both")
    parser.add_argument("--rows", type=int, default=200_000, help="table rows (200,000)")
    parser.add_argument("--chunk-sizes", default="4096,10240", help="(4096,10240)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (5)")
    parser.add_argument("--engine", action="store_true", help="MySQL snapshots end to end too")
    parser.add_argument("--engine-rounds", type=int, default=3, help="(3)")
    parser.add_argument("--pg-url", help="default: $SNAPSHOTTER_PG_URL")
    parser.add_argument("--mysql-url", help="default: $SNAPSHOTTER_MYSQL_URL")
    args = parser.parse_args(argv)
    try:
        args.chunks = [int(s) for s in args.chunk_sizes.split(",") if s.strip()]
    except ValueError:
        parser.error("--chunk-sizes: comma-separated integers")
    if args.rows < 1 or args.rounds < 1 or not args.chunks or min(args.chunks) < 1:
        parser.error("--rows, --rounds and the chunk sizes must be positive")
    return args


def versions() -> str:
    import importlib.metadata as md

    def version(name: str) -> str:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return "not installed"

    names = ("psycopg", "adbc-driver-postgresql", "PyMySQL", "mysqlclient", "pyarrow")
    return (
        f"{platform.platform()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        + ", ".join(f"{n} {version(n)}" for n in names)
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = [f"## Chunk read bench\n\n{versions()}\n"]
    if args.source in ("postgres", "both"):
        url = args.pg_url or os.environ.get("SNAPSHOTTER_PG_URL", DEFAULT_PG_URL)
        out.append(measure_postgres(url, args.rows, args.chunks, args.rounds))
    if args.source in ("mysql", "both"):
        url = args.mysql_url or os.environ.get("SNAPSHOTTER_MYSQL_URL", DEFAULT_MYSQL_URL)
        engine_rounds = args.engine_rounds if args.engine else 0
        out.append(measure_mysql(url, args.rows, args.chunks, args.rounds, engine_rounds))
    print("\n\n".join(out))
    return 0

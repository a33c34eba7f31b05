"""How fast chunk rows come out of MySQL / MariaDB, per client library, and how faithfully.

    python bench/read_bench.py mysql [--rows N] [--url URL] [--chunk-sizes 4096,10000]
                                     [--no-fidelity] [--repeat R]

One run loads N rows into ``items`` in a fresh database ``bench_<random>`` (the PostgreSQL
bench's table shape: ``id bigint primary key, k int, name varchar(40), amount double,
created datetime(6)``), warms the buffer pool, then measures, each from the query to an
Arrow table in hand:

1. pymysql, buffered ``Cursor``, ``SELECT *``, ``fetchall``, Arrow built column by column
   with the dialect's Arrow types (as ``MySqlDialect`` builds a chunk): **the baseline**;
2. the same without the Arrow build (tuples only: what the protocol and row parsing cost),
   then pymysql unbuffered (``SSCursor``, ``fetchmany(5000)`` batches to Arrow, concatenated);
3. ``MySqlDialect.read_chunk`` keyset chunks (what the engine runs: ``START TRANSACTION
   READ ONLY``, the chunk SELECT, ``COMMIT``, Arrow), for each ``--chunk-sizes``;
4. connectorx (``read_sql(..., return_type="arrow")``), when installed (not a dependency):
   the whole table on one connection, on two partitions (``partition_on="id"``), and keyset
   chunks with literal bounds (each call opens its own connection);
5. mysqlclient (``MySQLdb``, the C client), when installed (not a dependency): the whole
   table, and keyset chunks with the dialect's own SQL inside ``START TRANSACTION READ ONLY``
   on one connection of ours.

Then (unless ``--no-fidelity``) it checks types: a small table with DECIMAL, DATETIME,
TIMESTAMP, JSON, BIGINT UNSIGNED, utf8mb4 VARCHAR, FLOAT, TIME, ... is written after a
recorded binlog position, its rows are decoded from the binlog by ``BinlogLogReader`` +
``BinlogDecoder`` (the log side of the engine's value model), and each reader's values are
compared with them: a chunk row must equal the binlog row of the same stored row exactly.

Prints two markdown tables (rates with the ratio to the baseline; fidelity per column and
reader). The database is dropped at the end, also on error.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import decimal
import functools
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import pyarrow as pa
import pymysql
import sqlalchemy as sa

from bench.lib.mysql import (
    TABLE,
    bench_database,
    connect_args,
    drop_database,
    execute,
    load_items,
    machine,
    pymysql_buffered,
    rows_to_arrow,
    select_all,
    with_database,
)
from bench.lib.stats import Result, best_of, render_table
from signals.names import TableId
from snapshotter.sources.base import ChunkSpec, TableSchema
from snapshotter.sources.mysql.dialect import MySqlDialect

TYPES_TABLE = "types"
SIGNAL_TABLE = "debezium_signal"
DEFAULT_MYSQL_URL = "mysql://snapshotter:snapshotter@127.0.0.1:23306/snapshotter"


# --------------------------------------------------------------------------- results


# --------------------------------------------------------------------------- server


# --------------------------------------------------------------------------- readers


def pymysql_fetch_only(url: str, database: str, schema: TableSchema) -> Result:
    """The baseline without its Arrow build: what the protocol and row parsing cost."""
    started = time.perf_counter()
    conn = pymysql.connect(**connect_args(url), autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("SET time_zone = '+00:00'")
            cur.execute(select_all(database, schema))
            rows = len(cur.fetchall())
    finally:
        conn.close()
    return Result(
        "pymysql buffered `SELECT *`, tuples only (no Arrow)", rows, time.perf_counter() - started
    )


def pymysql_unbuffered(url: str, database: str, schema: TableSchema, batch: int = 5000) -> Result:
    started = time.perf_counter()
    conn = pymysql.connect(
        **connect_args(url), autocommit=True, cursorclass=pymysql.cursors.SSCursor
    )
    tables = []
    try:
        with conn.cursor() as cur:
            cur.execute("SET time_zone = '+00:00'")
            cur.execute("START TRANSACTION READ ONLY")
            cur.execute(select_all(database, schema))
            while rows := cur.fetchmany(batch):
                tables.append(rows_to_arrow(schema, list(rows)))
            cur.execute("COMMIT")
    finally:
        conn.close()
    table = pa.concat_tables(tables)
    return Result(
        f"pymysql unbuffered (SSCursor, fetchmany {batch}) → Arrow",
        table.num_rows,
        time.perf_counter() - started,
    )


def dialect_chunks(dialect: MySqlDialect, schema: TableSchema, chunk: int) -> Result:
    """The engine's chunk loop without the engine: max key, then ``read_chunk`` after the
    previous chunk's last key until a chunk comes back short."""
    started = time.perf_counter()
    keys = schema.primary_key
    upto = dialect.max_key(schema, keys, None)
    assert upto is not None
    after = None
    total = 0
    chunks = 0
    while True:
        read = dialect.read_chunk(ChunkSpec(schema, keys, after, upto, None, chunk))
        total += read.rows.num_rows
        chunks += 1
        if read.rows.num_rows < chunk or read.last_key is None:
            break
        after = read.last_key
    return Result(
        f"MySqlDialect.read_chunk, chunks of {chunk:,} (pymysql)",
        total,
        time.perf_counter() - started,
        f"{chunks:,} chunks, each in its own START TRANSACTION READ ONLY",
    )


def connectorx_url(url: str, database: str) -> str:
    parsed = sa.make_url(url)
    return (
        f"mysql://{parsed.username}:{parsed.password}@{parsed.host or '127.0.0.1'}:"
        f"{parsed.port or 3306}/{database}"
    )


def connectorx_full(url: str, database: str, schema: TableSchema, partitions: int) -> Result:
    what = (
        "connectorx `SELECT *` → Arrow, one connection"
        if partitions == 1
        else f"connectorx `SELECT *` → Arrow, {partitions} partitions on id"
    )
    try:
        import connectorx as cx
    except ImportError:
        return Result(what, None, None, "skipped: connectorx is not installed")
    started = time.perf_counter()
    options: dict[str, Any] = {}
    if partitions > 1:
        options = {"partition_on": "id", "partition_num": partitions}
    table = cx.read_sql(
        connectorx_url(url, database), select_all(database, schema), return_type="arrow", **options
    )
    note = ""
    if partitions > 1:
        note = "one connection per partition, each its own snapshot: not one consistent read"
    return Result(what, table.num_rows, time.perf_counter() - started, note)


def connectorx_chunks(url: str, database: str, schema: TableSchema, chunk: int) -> Result:
    what = f"connectorx keyset chunks of {chunk:,} (literal bounds)"
    try:
        import connectorx as cx
    except ImportError:
        return Result(what, None, None, "skipped: connectorx is not installed")
    conn_str = connectorx_url(url, database)
    columns = ", ".join(f"`{c.name}`" for c in schema.columns)
    started = time.perf_counter()
    upto = execute(url, f"SELECT max(id) FROM `{database}`.`{TABLE}`")[0][0]
    after: int | None = None
    total = 0
    chunks = 0
    while True:
        lower = "" if after is None else f"`id` > {int(after)} AND "
        query = (
            f"SELECT {columns} FROM `{database}`.`{TABLE}` WHERE {lower}`id` <= {int(upto)} "
            f"ORDER BY `id` LIMIT {chunk}"
        )
        table = cx.read_sql(conn_str, query, return_type="arrow")
        total += table.num_rows
        chunks += 1
        if table.num_rows < chunk:
            break
        after = table.column("id")[-1].as_py()
    return Result(
        what,
        total,
        time.perf_counter() - started,
        f"{chunks:,} chunks; each read_sql call opens its own connection (autocommit, no "
        "READ ONLY transaction of ours)",
    )


def _mysqldb() -> Any:
    try:
        import MySQLdb
    except ImportError:
        return None
    return MySQLdb


def mysqldb_connect(url: str) -> Any:
    MySQLdb = _mysqldb()
    args = connect_args(url)
    return MySQLdb.connect(
        host=args["host"],
        port=args["port"],
        user=args["user"],
        password=args["password"],
        charset="utf8mb4",
        autocommit=True,
    )


def mysqldb_full(url: str, database: str, schema: TableSchema) -> Result:
    what = "mysqlclient buffered `SELECT *` → Arrow"
    if _mysqldb() is None:
        return Result(what, None, None, "skipped: mysqlclient (MySQLdb) is not installed")
    started = time.perf_counter()
    conn = mysqldb_connect(url)
    try:
        cur = conn.cursor()
        cur.execute("SET time_zone = '+00:00'")
        cur.execute("START TRANSACTION READ ONLY")
        cur.execute(select_all(database, schema))
        rows = list(cur.fetchall())
        cur.execute("COMMIT")
        cur.close()
    finally:
        conn.close()
    table = rows_to_arrow(schema, rows)
    return Result(what, table.num_rows, time.perf_counter() - started)


def mysqldb_chunks(url: str, dialect: MySqlDialect, schema: TableSchema, chunk: int) -> Result:
    """The dialect's own chunk SQL and parameters (pyformat, which MySQLdb also takes), run
    like ``MySqlDialect._read`` on one MySQLdb connection."""
    what = f"mysqlclient keyset chunks of {chunk:,} (dialect SQL, READ ONLY txn)"
    if _mysqldb() is None:
        return Result(what, None, None, "skipped: mysqlclient (MySQLdb) is not installed")
    keys = schema.primary_key
    positions = [schema.column_names.index(k) for k in keys]
    started = time.perf_counter()
    conn = mysqldb_connect(url)
    total = 0
    chunks = 0
    try:
        cur = conn.cursor()
        cur.execute("SET time_zone = '+00:00'")
        upto = dialect.max_key(schema, keys, None)
        assert upto is not None
        after = None
        while True:
            sql, params = dialect._statement(
                ChunkSpec(schema, tuple(keys), after, upto, None, chunk), False
            )
            cur.execute("START TRANSACTION READ ONLY")
            cur.execute(sql, params)
            rows = list(cur.fetchall())
            cur.execute("COMMIT")
            table = rows_to_arrow(schema, rows)
            total += table.num_rows
            chunks += 1
            if len(rows) < chunk:
                break
            after = tuple(rows[-1][i] for i in positions)
        cur.close()
    finally:
        conn.close()
    return Result(what, total, time.perf_counter() - started, f"{chunks:,} chunks")


# --------------------------------------------------------------------------- fidelity

# (column, DDL type, values in rows 1, 2, 3 as SQL literals); row 4 is all NULL.
Columns = list[tuple[str, str, tuple[str, str, str]]]
FIDELITY_COLUMNS: Columns = [
    ("dec", "decimal(20,6)", ("12345678901234.123456", "-0.000001", "0")),
    (
        "dec65",
        "decimal(65,30)",
        ("12345678901234567890123456789012345.123456789012345678901234567891", "1.5", "0"),
    ),
    (
        "dt",
        "datetime(6)",
        ("'9999-12-31 23:59:59.999999'", "'1000-01-01 00:00:00'", "'2024-02-29 12:00:00.5'"),
    ),
    (
        "ts",
        "timestamp(6) NULL",
        ("'2038-01-19 03:14:07.999999'", "'1970-01-01 00:00:01'", "'2024-06-01 12:00:00.000001'"),
    ),
    ("js", "json", ('\'{"a": [1, 2.50, "x"], "b": null}\'', "'[]'", "'{\"k\":1}'")),
    ("ubig", "bigint unsigned", ("18446744073709551615", "0", "9223372036854775808")),
    ("vc", "varchar(40) CHARACTER SET utf8mb4", ("'héllo 😀 ✓'", "''", "'abc  '")),
    ("flt", "float", ("3.14159", "0.1", "-1e30")),
    ("tm", "time(6)", ("'-838:59:59'", "'00:00:00.000001'", "'25:00:00'")),
    ("en", "enum('a','b')", ("'b'", "'a'", "'a'")),
    ("st", "set('x','y')", ("'x,y'", "''", "'y'")),
    ("bits", "bit(5)", ("b'10101'", "b'0'", "b'11111'")),
]
# Zero and partly-zero dates: legal where sql_mode lacks NO_ZERO_DATE / NO_ZERO_IN_DATE (old
# schemas are full of them); written with sql_mode=''.
ZERO_DATE_COLUMNS: Columns = [
    (
        "zdt",
        "datetime",
        ("'0000-00-00 00:00:00'", "'2024-02-00 00:00:00'", "'2024-01-01 00:00:00'"),
    ),
    ("zd", "date", ("'0000-00-00'", "'2024-00-10'", "'2024-01-01'")),
    (
        "zts",
        "timestamp NULL",
        ("'0000-00-00 00:00:00'", "'2024-01-01 00:00:00'", "'2024-01-01 00:00:00'"),
    ),
]
# table name -> (columns, sql_mode for the INSERT or None for the server's)
FIDELITY_TABLES: dict[str, tuple[Columns, str | None]] = {
    TYPES_TABLE: (FIDELITY_COLUMNS, None),
    "zero_dates": (ZERO_DATE_COLUMNS, ""),
}


@dataclass
class Reading:
    """One reader's rows of a fidelity table, in id order, as value-model dicts."""

    rows: list[dict[str, Any]] | None
    types: dict[str, str]  # column -> what the reader buffered it as
    errors: dict[str, str]  # column -> the reader's error for that column


def create_fidelity_table(url: str, database: str, table: str, columns: Columns) -> None:
    ddl = ", ".join(f"`{n}` {t}" for n, t, _ in columns)
    execute(
        url,
        f"CREATE TABLE `{database}`.`{table}` (id bigint PRIMARY KEY, {ddl}) CHARACTER SET utf8mb4",
    )


def fill_fidelity_table(
    url: str, database: str, table: str, columns: Columns, sql_mode: str | None
) -> None:
    names = ", ".join(f"`{n}`" for n, _, _ in columns)
    rows = []
    for i in range(3):
        rows.append(f"({i + 1}, {', '.join(v[i] for _, _, v in columns)})")
    rows.append(f"(4, {', '.join('NULL' for _ in columns)})")
    setup = ["SET time_zone = '+00:00'"]
    if sql_mode is not None:
        setup.append(f"SET sql_mode = '{sql_mode}'")
    execute(
        url,
        *setup,
        f"INSERT INTO `{database}`.`{table}` (id, {names}) VALUES {', '.join(rows)}",
    )


def binlog_reading(dialect: MySqlDialect, table: TableId, start: dict[str, Any], n: int) -> Reading:
    """The rows as the engine's log side decodes them (after values of the n inserts)."""
    from snapshotter.sources.log import Change
    from snapshotter.sources.mysql.decoder import BinlogDecoder
    from snapshotter.sources.mysql.reader import BinlogLogReader

    decoder = BinlogDecoder("bench", captured=lambda t: t == table, key_columns=lambda t: ("id",))
    reader = BinlogLogReader(dialect.connect_args(), server_id=6198, decoder=decoder, start=start)
    rows: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 30
        while len(rows) < n and time.monotonic() < deadline:
            for item in reader.read(0.5):
                if isinstance(item, Change) and item.event.table == table:
                    assert item.event.after is not None
                    rows.append(dict(item.event.after))
    finally:
        reader.close()
    rows.sort(key=itemgetter("id"))
    return Reading(rows, {}, {})


def dialect_reading(dialect: MySqlDialect, schema: TableSchema) -> Reading:
    """``read_chunk`` then ``row_converter``, as the engine buffers and emits READ rows."""
    upto = dialect.max_key(schema, schema.primary_key, None)
    assert upto is not None
    try:
        read = dialect.read_chunk(ChunkSpec(schema, schema.primary_key, None, upto, None, 1000))
    except Exception as exc:  # one bad value fails the whole chunk
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:90]}"
        return Reading(None, {}, {c: f"whole chunk: {error}" for c in schema.column_names})
    convert = dialect.row_converter(schema)
    rows = read.rows.to_pylist()
    if convert is not None:
        rows = [convert(r) for r in rows]
    types = {f.name: str(f.type) for f in read.rows.schema}
    return Reading(rows, types, {})


def mysqldb_reading(url: str, dialect: MySqlDialect, schema: TableSchema) -> Reading | None:
    """The dialect's SQL through MySQLdb into the dialect's Arrow types."""
    if _mysqldb() is None:
        return None
    keys = schema.primary_key
    upto = dialect.max_key(schema, keys, None)
    if upto is None:  # an empty table
        return None
    sql, params = dialect._statement(ChunkSpec(schema, tuple(keys), None, upto, None, 1000), False)
    conn = mysqldb_connect(url)
    try:
        cur = conn.cursor()
        cur.execute("SET time_zone = '+00:00'")
        cur.execute(sql, params)
        raw = list(cur.fetchall())
    finally:
        conn.close()
    types: dict[str, str] = {}
    errors: dict[str, str] = {}
    columns: dict[str, list[Any]] = {}
    for i, c in enumerate(schema.columns):
        values = [r[i] for r in raw]
        try:
            columns[c.name] = pa.array(values, type=c.arrow_type).to_pylist()
            types[c.name] = f"{type(next((v for v in values if v is not None), None)).__name__}"
        except (pa.ArrowException, TypeError, ValueError) as exc:
            errors[c.name] = f"{type(exc).__name__}: {str(exc)[:80]}"
            columns[c.name] = values
    rows = [{name: columns[name][j] for name in columns} for j in range(len(raw))]
    convert = dialect.row_converter(schema)
    if convert is not None:
        rows = [convert(r) for r in rows]
    return Reading(rows, types, errors)


def connectorx_reading(
    url: str, database: str, dialect: MySqlDialect, schema: TableSchema
) -> Reading | None:
    """connectorx's own Arrow types, column by column (a column it cannot read panics in
    Rust, which surfaces as a Python exception), then the dialect's ``row_converter``."""
    try:
        import connectorx as cx
    except ImportError:
        return None

    conn_str = connectorx_url(url, database)
    columns: dict[str, list[Any]] = {}
    types: dict[str, str] = {}
    errors: dict[str, str] = {}
    n = 0
    for c in schema.columns:
        query = f"SELECT `{c.name}` FROM `{database}`.`{schema.table.table}` ORDER BY id"
        try:
            with quiet_stderr():  # a Rust panic prints its backtrace on fd 2
                table = cx.read_sql(conn_str, query, return_type="arrow")
        except BaseException as exc:  # pyo3's PanicException derives from BaseException
            if isinstance(exc, KeyboardInterrupt):
                raise
            errors[c.name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:90]}"
            continue
        types[c.name] = str(table.schema.field(0).type)
        values = table.column(0).to_pylist()
        columns[c.name] = values
        n = len(values)
    rows = [{name: columns[name][j] for name in columns} for j in range(n)]
    convert = dialect.row_converter(schema)
    if convert is not None:
        rows = [convert({**{k: None for k in schema.column_names}, **r}) for r in rows]
        rows = [{k: v for k, v in r.items() if k in columns} for r in rows]
    return Reading(rows, types, errors)


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """File descriptor 2 to /dev/null for the block (native code writes there directly)."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def same(a: Any, b: Any) -> bool:
    """Exactly the same value model: equal, same Python type, a Decimal's digits and exponent
    (its scale), a datetime's awareness and UTC offset."""
    if type(a) is not type(b):
        return False
    if isinstance(a, decimal.Decimal):
        return bool(a.as_tuple() == b.as_tuple())
    if isinstance(a, dt.datetime):
        # zoneinfo's UTC and datetime.UTC are different objects but the same offset.
        return bool(a == b and a.utcoffset() == b.utcoffset())
    return bool(a == b)


def compare(column: str, log: Reading, other: Reading | None) -> str:
    if other is None:
        return "not installed"
    if column in other.errors:
        return f"**error** ({other.errors[column]})"
    assert log.rows is not None and other.rows is not None
    if len(log.rows) != len(other.rows):
        return f"{len(other.rows)} rows, log {len(log.rows)}"
    diffs = []
    for lrow, orow in zip(log.rows, other.rows, strict=True):
        lv, ov = lrow.get(column), orow.get(column)
        if not same(lv, ov):
            equal = "equal but " if lv == ov else ""
            diffs.append(f"{equal}{ov!r} vs log {lv!r}")
    kind = other.types.get(column, "")
    prefix = f"`{kind}` " if kind else ""
    if not diffs:
        return f"{prefix}exact"
    return f"{prefix}**differs**: " + "; ".join(diffs[:2])


def fidelity(url: str, database: str) -> str:
    """Write each fidelity table after a recorded binlog position, decode them from the
    binlog, read them with each reader; a markdown table of what matches."""
    # The dialect's chunk reads on pymysql (the rows below are named so); mysqlclient is
    # measured as its own reader.
    dialect = MySqlDialect(
        with_database(url, database), signal_table=TableId(database, SIGNAL_TABLE), client="pymysql"
    )
    lines: list[str] = []
    try:
        for name, (columns, sql_mode) in FIDELITY_TABLES.items():
            create_fidelity_table(url, database, name, columns)
            table = TableId(database, name)
            start = dialect.binlog_start()
            fill_fidelity_table(url, database, name, columns, sql_mode)
            schema = dialect.describe(table)
            log = binlog_reading(dialect, table, start, 4)
            readers = {
                "pymysql (MySqlDialect.read_chunk)": dialect_reading(dialect, schema),
                "mysqlclient (dialect SQL → dialect Arrow types)": mysqldb_reading(
                    url, dialect, schema
                ),
                "connectorx (its Arrow types)": connectorx_reading(url, database, dialect, schema),
            }
            names = list(readers)
            if not lines:
                lines = [
                    "| column | type | binlog value (row 1) | " + " | ".join(names) + " |",
                    "|---|---|---|" + "---|" * len(names),
                ]
            assert log.rows is not None
            for column, ddl, _ in columns:
                first = log.rows[0].get(column) if log.rows else None
                cells = [compare(column, log, readers[n]) for n in names]
                ddl = ddl.split(" CHARACTER")[0]
                lines.append(f"| {column} | {ddl} | `{first!r}` | " + " | ".join(cells) + " |")
    finally:
        dialect.close()
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="table rows (1,000,000)")
    parser.add_argument("--url", help="MySQL URL (default: $SNAPSHOTTER_MYSQL_URL or services)")
    parser.add_argument(
        "--chunk-sizes", default="4096,10000", help="comma-separated chunk sizes (4096,10000)"
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per row, best kept (1)")
    parser.add_argument("--no-fidelity", action="store_true", help="skip the type check")
    args = parser.parse_args(argv)
    try:
        args.chunks = [int(s) for s in args.chunk_sizes.split(",") if s.strip()]
    except ValueError:
        parser.error("--chunk-sizes: comma-separated integers")
    if args.rows < 1 or args.repeat < 1 or not args.chunks or min(args.chunks) < 1:
        parser.error("--rows, --repeat and the chunk sizes must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    url, database = bench_database(args.url)
    results: list[Result] = []
    fidelity_text = ""
    try:
        print(f"loading {args.rows:,} rows into {database}.{TABLE} ...", file=sys.stderr)
        load_seconds = load_items(url, database, args.rows)
        print(f"loaded in {load_seconds:.1f} s; measuring ...", file=sys.stderr)
        dialect = MySqlDialect(  # on pymysql, as the rows are named
            with_database(url, database),
            signal_table=TableId(database, SIGNAL_TABLE),
            client="pymysql",
        )
        try:
            schema = dialect.describe(TableId(database, TABLE))
            r = args.repeat
            baseline = best_of(r, lambda: pymysql_buffered(url, database, schema))
            results.append(baseline)
            results.append(best_of(r, lambda: pymysql_fetch_only(url, database, schema)))
            results.append(best_of(r, lambda: pymysql_unbuffered(url, database, schema)))
            for chunk in args.chunks:
                results.append(
                    best_of(r, functools.partial(dialect_chunks, dialect, schema, chunk))
                )
            results.append(best_of(r, lambda: connectorx_full(url, database, schema, 1)))
            results.append(best_of(r, lambda: connectorx_full(url, database, schema, 2)))
            for chunk in args.chunks:
                results.append(
                    best_of(r, functools.partial(connectorx_chunks, url, database, schema, chunk))
                )
            results.append(best_of(r, lambda: mysqldb_full(url, database, schema)))
            for chunk in args.chunks:
                results.append(
                    best_of(r, functools.partial(mysqldb_chunks, url, dialect, schema, chunk))
                )
        finally:
            dialect.close()
        if not args.no_fidelity:
            print("type fidelity against the binlog ...", file=sys.stderr)
            fidelity_text = fidelity(url, database)
    finally:
        drop_database(url, database)

    print(f"## MySQL chunk read bench: {args.rows:,} rows\n")
    print("\n".join(machine(url)))
    print()
    print(render_table(results, baseline, "pymysql buffered"))
    notes = [f"- {r.what}: {r.note}" for r in results if r.note]
    if notes:
        print()
        print("\n".join(notes))
    if fidelity_text:
        print()
        print("### values against the binlog's (BinlogLogReader + BinlogDecoder)\n")
        print(fidelity_text)
    return 0

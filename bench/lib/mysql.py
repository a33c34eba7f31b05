"""MySQL / MariaDB for the older benches: connections, a bench database and its ``items``
table (bigint key), the server's description, ``SELECT *`` into Arrow with the dialect's types."""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import sys
import time
import uuid
from collections.abc import Iterator
from operator import itemgetter
from typing import Any

import pyarrow as pa
import pymysql
import sqlalchemy as sa

from bench.lib.servers import mysql_url, package_version
from bench.lib.stats import Result
from snapshotter.sources.base import TableSchema

TABLE = "items"


def with_database(url: str, database: str) -> str:
    return sa.make_url(url).set(database=database).render_as_string(hide_password=False)


def connect_args(url: str) -> dict[str, Any]:
    """pymysql.connect() keyword arguments for ``url`` (no database: the server)."""
    parsed = sa.make_url(url)
    return {
        "host": parsed.host or "127.0.0.1",
        "port": parsed.port or 3306,
        "user": parsed.username or "",
        "password": parsed.password or "",
        "charset": "utf8mb4",
    }


@contextlib.contextmanager
def server(url: str) -> Iterator[pymysql.connections.Connection[Any]]:
    conn = pymysql.connect(**connect_args(url), autocommit=True)
    try:
        yield conn
    finally:
        conn.close()


def execute(url: str, *statements: str) -> list[tuple[Any, ...]]:
    """Run ``statements`` on one autocommit connection; the last one's rows."""
    rows: list[tuple[Any, ...]] = []
    with server(url) as conn, conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)
            rows = list(cur.fetchall()) if cur.description else []
    return rows


def create_database(url: str, database: str) -> None:
    execute(url, f"CREATE DATABASE `{database}` CHARACTER SET utf8mb4")


def drop_database(url: str, database: str) -> None:
    try:
        execute(url, f"DROP DATABASE IF EXISTS `{database}`")
    except Exception as exc:
        print(f"warning: dropping database {database}: {exc}", file=sys.stderr)


def load_items(url: str, database: str, rows: int, table: str = TABLE) -> float:
    """Create ``database.table`` with ``rows`` rows (the PostgreSQL bench's values); not
    binlogged when the user may turn that off. ANALYZE it and scan it once to warm the
    buffer pool. Returns the load time."""
    started = time.perf_counter()
    name = f"`{database}`.`{table}`"
    with server(url) as conn, conn.cursor() as cur:
        with contextlib.suppress(pymysql.err.Error):
            cur.execute("SET SESSION sql_log_bin = 0")  # a 1M-row load need not be in the log
        cur.execute(
            f"CREATE TABLE {name} (id bigint PRIMARY KEY, k int, name varchar(40), "
            "amount double, created datetime(6)) ENGINE=InnoDB"
        )
        values = (
            "{g}, MOD({g} * 7919, 100003), concat('name-', md5({g})), {g} * 0.25, "
            "timestamp'2024-01-01 00:00:00' + INTERVAL {g} SECOND"
        )
        try:  # MariaDB's SEQUENCE engine: one statement
            cur.execute(
                f"INSERT INTO {name} SELECT {values.format(g='seq')} "
                f"FROM `{database}`.seq_1_to_{rows}"
            )
        except pymysql.err.Error:  # MySQL: batches from here
            step = 10_000
            for first in range(1, rows + 1, step):
                last = min(first + step - 1, rows)
                cur.execute(
                    f"INSERT INTO {name} SELECT {values.format(g='g')} FROM "
                    "(WITH RECURSIVE s(g) AS (SELECT %s UNION ALL SELECT g + 1 FROM s "
                    "WHERE g < %s) SELECT g FROM s) AS gen",
                    (first, last),
                )
        cur.execute(f"ANALYZE TABLE {name}")
        cur.fetchall()
        cur.execute(f"SELECT count(*), sum(amount), max(length(name)) FROM {name}")
        cur.fetchall()
    return time.perf_counter() - started


def machine(url: str) -> list[str]:
    rows = execute(
        url,
        "SELECT version(), @@innodb_buffer_pool_size, @@sync_binlog, "
        "@@innodb_flush_log_at_trx_commit, @@binlog_format, @@binlog_row_image",
    )
    version, pool, sync_binlog, flush, fmt, image = rows[0]
    return [
        f"- machine: {platform.platform()}, {os.cpu_count()} cores",
        f"- Python {platform.python_version()} ({platform.python_implementation()}), "
        f"pymysql {package_version('PyMySQL')}, connectorx {package_version('connectorx')}, "
        f"mysqlclient {package_version('mysqlclient')}, pyarrow {pa.__version__}",
        f"- server {version} (innodb_buffer_pool_size={int(pool) // 2**20}MB, "
        f"sync_binlog={sync_binlog}, innodb_flush_log_at_trx_commit={flush}, "
        f"binlog_format={fmt}, binlog_row_image={image})",
    ]


def rows_to_arrow(schema: TableSchema, rows: list[tuple[Any, ...]]) -> pa.Table:
    """As ``snapshotter.sources.mysql.dialect._to_arrow``: one ``pa.array`` per column."""
    arrays = [
        pa.array(list(map(itemgetter(i), rows)), type=c.arrow_type)
        for i, c in enumerate(schema.columns)
    ]
    return pa.Table.from_arrays(arrays, schema=schema.arrow_schema())


def select_all(database: str, schema: TableSchema, table: str = TABLE) -> str:
    return f"SELECT {', '.join(f'`{c.name}`' for c in schema.columns)} FROM `{database}`.`{table}`"


def pymysql_buffered(url: str, database: str, schema: TableSchema) -> Result:
    started = time.perf_counter()
    table = pymysql_table(url, database, schema)
    return Result(
        "pymysql buffered `SELECT *` → Arrow", table.num_rows, time.perf_counter() - started
    )


def pymysql_table(url: str, database: str, schema: TableSchema) -> pa.Table:
    """``SELECT *`` through pymysql (buffered, in a read-only transaction), into Arrow with
    the dialect's types as ``MySqlDialect`` builds a chunk."""
    conn = pymysql.connect(**connect_args(url), autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("SET time_zone = '+00:00'")
            cur.execute("START TRANSACTION READ ONLY")
            cur.execute(select_all(database, schema))
            rows = list(cur.fetchall())
            cur.execute("COMMIT")
    finally:
        conn.close()
    return rows_to_arrow(schema, rows)


def bench_database(given: str | None) -> tuple[str, str]:
    """The server's URL (``given``, else ``$SNAPSHOTTER_MYSQL_URL`` or ``scripts/services``)
    and a database ``bench_<random>`` created on it for one run (the caller drops it);
    mysql-replication's warning on every reconnect (closing a reader included) silenced."""
    logging.getLogger("pymysqlreplication").setLevel(logging.ERROR)
    url = mysql_url(given)
    database = f"bench_{uuid.uuid4().hex[:10]}"
    create_database(url, database)
    return url, database

"""The two sources of the end-to-end bench: the table, its load, the plain read A, the ticker.

The table (``items``, also ``items_big`` for the scale runs), the same on both servers:

    tenant int, id bigint, name text, amount numeric(14,2) / decimal(14,2),
    created timestamptz / timestamp(6), score float8 / double (NULL every 10th row),
    PRIMARY KEY (tenant, id)

filled by one ``INSERT ... SELECT`` over ``generate_series`` / MariaDB's ``seq_1_to_N``:
``id`` = 1..N, ``tenant`` = 1 + (id - 1) / 100000, so key order is insertion order (the
snapshot's keyset pages and A's sequential scan read the table in the same order). The
ticker table, ``ticker (slot int PRIMARY KEY, seq bigint)``, has 8 rows; the ticker updates
one of them every 20 ms.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pymysql
import sqlalchemy as sa

from bench.lib.mysql import connect_args
from bench.lib.servers import package_version

TABLE = "items"
BIG_TABLE = "items_big"
TICKER_TABLE = "ticker"
TICKER_SLOTS = 8
TENANT_ROWS = 100_000  # rows per tenant: the first key column's run length

# The Arrow types A writes for MariaDB (ADBC gives PostgreSQL's its own way).
MYSQL_ARROW = pa.schema(
    [
        ("tenant", pa.int32()),
        ("id", pa.int64()),
        ("name", pa.string()),
        ("amount", pa.decimal128(14, 2)),
        ("created", pa.timestamp("us", tz="UTC")),
        ("score", pa.float64()),
    ]
)


@dataclass
class PlainRead:
    """What A did: rows, its time split into read and Parquet write, what read it."""

    rows: int
    read_s: float
    write_s: float
    cpu_s: float  # this process's CPU seconds (the server's are not counted)
    reader: str
    parquet_mb: float

    @property
    def seconds(self) -> float:
        return self.read_s + self.write_s


@dataclass
class Ticker:
    """A thread that commits one single-row UPDATE of the ticker table every ``interval``
    seconds on its own autocommit connection (a late tick is not made up for by a burst);
    ``commits`` maps each ``seq`` to the monotonic times the UPDATE was sent and returned
    (its commit lies in between)."""

    execute: Callable[[int], None]  # commits the tick with this seq
    close: Callable[[], None]
    interval: float
    commits: dict[int, tuple[float, float]] = field(default_factory=dict)
    error: BaseException | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="bench-ticker", daemon=True)
        self._thread.start()

    def stop(self) -> dict[int, tuple[float, float]]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        self.close()
        if self.error is not None:
            raise RuntimeError(f"the ticker failed: {self.error}") from self.error
        return self.commits

    def _run(self) -> None:
        seq = 0
        due = time.monotonic()
        try:
            while not self._stop.wait(max(0.0, due - time.monotonic())):
                seq += 1
                sent = time.monotonic()
                self.execute(seq)
                self.commits[seq] = (sent, time.monotonic())
                due = max(due + self.interval, time.monotonic())
        except BaseException as exc:  # re-raised by stop()
            self.error = exc


class SourceDb(ABC):
    """One server: a schema (PostgreSQL) or database (MariaDB) of its own for the run."""

    kind: str  # the [source] kind
    label: str  # in the report
    url: str  # the engine's [source] url
    schema: str

    @abstractmethod
    def create(self) -> None: ...

    @abstractmethod
    def load(self, table: str, rows: int) -> float:
        """Create and fill ``table`` (the shape above); returns seconds."""

    @abstractmethod
    def drop_table(self, table: str) -> None: ...

    @abstractmethod
    def create_ticker(self) -> None: ...

    @abstractmethod
    def ticker(self, interval: float) -> Ticker: ...

    @abstractmethod
    def plain_read(self, table: str, out: Path) -> PlainRead:
        """A: the whole table read in one go, written with ``pyarrow.parquet.write_table``."""

    @abstractmethod
    def drop(self) -> None:
        """Drop the schema / database (also what engines left); never raises."""

    @abstractmethod
    def machine(self) -> list[str]: ...


def _write_parquet(table: pa.Table, out: Path) -> tuple[float, float]:
    started = time.perf_counter()
    pq.write_table(table, out)
    return time.perf_counter() - started, out.stat().st_size / 1e6


# --------------------------------------------------------------------------- PostgreSQL


class Postgres(SourceDb):
    kind = "postgres"
    label = "PostgreSQL"

    def __init__(self, url: str, schema: str) -> None:
        self.url = url
        self.schema = schema
        self.slots: list[str] = []  # every engine's slot and publication: dropped by drop()

    def sql(self, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def name(self, table: str) -> str:
        return f'"{self.schema}"."{table}"'

    def create(self) -> None:
        self.sql(f'CREATE SCHEMA "{self.schema}"')

    def load(self, table: str, rows: int) -> float:
        started = time.perf_counter()
        name = self.name(table)
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(
                f"CREATE TABLE {name} (tenant int NOT NULL, id bigint NOT NULL, "
                "name text NOT NULL, amount numeric(14,2) NOT NULL, created timestamptz NOT NULL, "
                "score float8, PRIMARY KEY (tenant, id))"
            )
            # `snapshotter init` demands it of a table with TOAST-able (text) columns.
            conn.execute(f"ALTER TABLE {name} REPLICA IDENTITY FULL")
            conn.execute(
                f"INSERT INTO {name} SELECT 1 + (g - 1) / {TENANT_ROWS}, g, "
                "'name-' || md5(g::text), ((g * 7919) %% 10000019) / 100.0, "
                "timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second', "
                "CASE WHEN g %% 10 = 0 THEN NULL ELSE g * 0.25 END "
                "FROM generate_series(1::bigint, %s::bigint) AS g",
                (rows,),
            )
            # No later read pays for hint bits; one scan warms the cache.
            conn.execute(f"VACUUM ANALYZE {name}")
            conn.execute(f"SELECT count(*) FROM {name}").fetchone()
        return time.perf_counter() - started

    def drop_table(self, table: str) -> None:
        self.sql(f"DROP TABLE IF EXISTS {self.name(table)}")

    def create_ticker(self) -> None:
        name = self.name(TICKER_TABLE)
        self.sql(f"CREATE TABLE {name} (slot int PRIMARY KEY, seq bigint NOT NULL)")
        self.sql(f"INSERT INTO {name} SELECT g, 0 FROM generate_series(0, {TICKER_SLOTS - 1}) g")

    def ticker(self, interval: float) -> Ticker:
        conn = psycopg.connect(self.url, autocommit=True)
        statement = f"UPDATE {self.name(TICKER_TABLE)} SET seq = %s WHERE slot = %s"

        def execute(seq: int) -> None:
            conn.execute(statement, (seq, seq % TICKER_SLOTS))

        return Ticker(execute, conn.close, interval)

    def plain_read(self, table: str, out: Path) -> PlainRead:
        """ADBC (``adbc_driver_postgresql``: libpq, binary COPY-like protocol, straight into
        Arrow, C all the way) ``SELECT *``; else psycopg (binary, C loaders) ``fetchall`` and
        one ``pa.array`` per column."""
        cpu = time.process_time()
        started = time.perf_counter()
        try:
            import adbc_driver_postgresql.dbapi as adbc
        except ImportError:
            reader = f"psycopg {psycopg.__version__} fetchall (binary) → pa.array per column"
            with psycopg.connect(self.url) as conn, conn.cursor(binary=True) as cur:
                cur.execute(f"SELECT * FROM {self.name(table)}")
                names = [c.name for c in cur.description or ()]
                rows = cur.fetchall()
            columns = [pa.array(col) for col in zip(*rows, strict=True)] if rows else []
            data = pa.Table.from_arrays(columns, names=names) if rows else pa.table({})
        else:
            reader = (
                f"ADBC (adbc-driver-postgresql {package_version('adbc-driver-postgresql')}) "
                "SELECT * → fetch_arrow_table"
            )
            with adbc.connect(self.url) as conn, conn.cursor() as cur:
                cur.execute(f"SELECT * FROM {self.name(table)}")
                data = numeric_as_decimal(cur.fetch_arrow_table())
            reader += ", numeric cast to decimal128"
        read_s = time.perf_counter() - started
        write_s, mb = _write_parquet(data, out)
        return PlainRead(data.num_rows, read_s, write_s, time.process_time() - cpu, reader, mb)

    def drop(self) -> None:
        """Also the slots and publications an engine run left (teardown drops them when all
        goes well): a forgotten slot holds WAL on the server for good."""
        for name in self.slots:
            try:
                self.sql(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    "WHERE slot_name = %s AND NOT active",
                    (name,),
                )
                self.sql(f'DROP PUBLICATION IF EXISTS "{name}"')
            except psycopg.Error as exc:
                print(f"warning: dropping slot/publication {name}: {exc}", file=sys.stderr)
        try:
            self.sql(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
        except psycopg.Error as exc:
            print(f"warning: dropping schema {self.schema}: {exc}", file=sys.stderr)

    def machine(self) -> list[str]:
        version = self.sql("SHOW server_version")[0][0]
        settings = dict(
            self.sql(
                "SELECT name, setting || coalesce(unit, '') FROM pg_settings WHERE name IN "
                "('shared_buffers', 'synchronous_commit', 'fsync', 'wal_level')"
            )
        )
        shown = ", ".join(f"{k}={v}" for k, v in sorted(settings.items()))
        return [f"- PostgreSQL {version} ({shown}), psycopg {psycopg.__version__}"]


def numeric_as_decimal(table: pa.Table) -> pa.Table:
    """ADBC hands ``numeric(p,s)`` over as text (an opaque extension type): cast it to
    ``decimal128(p, s)`` (from the column's typmod), as MariaDB's A and the landing hold it."""
    for i, f in enumerate(table.schema):
        meta = f.metadata or {}
        typmod = int(meta.get(b"POSTGRESQL:typmod", b"-1"))
        if meta.get(b"POSTGRESQL:type") != b"numeric" or typmod < 4:
            continue
        precision, scale = (typmod - 4) >> 16, (typmod - 4) & 0xFFFF
        column = table.column(i)
        if isinstance(column.type, pa.ExtensionType):
            column = pa.chunked_array([c.storage for c in column.chunks], column.type.storage_type)
        table = table.set_column(i, f.name, pc.cast(column, pa.decimal128(precision, scale)))
    return table


# --------------------------------------------------------------------------- MariaDB / MySQL


class MySql(SourceDb):
    kind = "mysql"
    label = "MariaDB"

    def __init__(self, server_url: str, database: str) -> None:
        self.server_url = server_url
        self.schema = database
        self.url = sa.make_url(server_url).set(database=database).render_as_string(False)

    @contextlib.contextmanager
    def conn(self) -> Iterator[pymysql.connections.Connection[Any]]:
        conn = pymysql.connect(**connect_args(self.server_url), autocommit=True)
        try:
            with conn.cursor() as cur:
                cur.execute("SET time_zone = '+00:00'")
            yield conn
        finally:
            conn.close()

    def sql(self, *statements: str) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = []
        with self.conn() as conn, conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
                rows = list(cur.fetchall())
        return rows

    def name(self, table: str) -> str:
        return f"`{self.schema}`.`{table}`"

    def create(self) -> None:
        self.sql(f"CREATE DATABASE `{self.schema}` CHARACTER SET utf8mb4")

    def load(self, table: str, rows: int) -> float:
        started = time.perf_counter()
        name = self.name(table)
        with self.conn() as conn, conn.cursor() as cur:
            with contextlib.suppress(pymysql.err.Error):
                cur.execute("SET SESSION sql_log_bin = 0")  # a big load need not be logged
            cur.execute(
                f"CREATE TABLE {name} (tenant int NOT NULL, id bigint NOT NULL, "
                "name text NOT NULL, amount decimal(14,2) NOT NULL, "
                "created timestamp(6) NOT NULL DEFAULT '2000-01-01 00:00:00', score double, "
                "PRIMARY KEY (tenant, id)) ENGINE=InnoDB"
            )
            # MariaDB's SEQUENCE engine: one statement, no client round trips.
            cur.execute(
                f"INSERT INTO {name} SELECT 1 + (seq - 1) DIV {TENANT_ROWS}, seq, "
                "concat('name-', md5(seq)), ((seq * 7919) MOD 10000019) / 100, "
                "timestamp'2024-01-01 00:00:00' + INTERVAL seq SECOND, "
                f"IF(seq MOD 10 = 0, NULL, seq * 0.25) FROM `{self.schema}`.seq_1_to_{rows}"
            )
            cur.execute(f"ANALYZE TABLE {name}")
            cur.fetchall()
            cur.execute(f"SELECT count(*), sum(amount), max(length(name)) FROM {name}")
            cur.fetchall()
        return time.perf_counter() - started

    def drop_table(self, table: str) -> None:
        self.sql(f"DROP TABLE IF EXISTS {self.name(table)}")

    def create_ticker(self) -> None:
        name = self.name(TICKER_TABLE)
        self.sql(
            f"CREATE TABLE {name} (slot int PRIMARY KEY, seq bigint NOT NULL) ENGINE=InnoDB",
            f"INSERT INTO {name} SELECT seq, 0 FROM `{self.schema}`.seq_0_to_{TICKER_SLOTS - 1}",
        )

    def ticker(self, interval: float) -> Ticker:
        conn = pymysql.connect(**connect_args(self.server_url), autocommit=True)
        cur = conn.cursor()
        statement = f"UPDATE {self.name(TICKER_TABLE)} SET seq = %s WHERE slot = %s"

        def execute(seq: int) -> None:
            cur.execute(statement, (seq, seq % TICKER_SLOTS))

        return Ticker(execute, conn.close, interval)

    def plain_read(self, table: str, out: Path) -> PlainRead:
        """mysqlclient (libmariadb, C) ``SELECT *`` buffered, DECIMAL and TIMESTAMP left as
        text by the C converters and parsed by Arrow casts, one ``pa.array`` per column;
        else the same through pymysql (pure Python)."""
        cpu = time.process_time()
        started = time.perf_counter()
        statement = f"SELECT * FROM {self.name(table)}"
        try:
            import MySQLdb
            from MySQLdb.constants import FIELD_TYPE
            from MySQLdb.converters import conversions
        except ImportError:
            reader = f"pymysql {package_version('PyMySQL')} fetchall → pa.array per column"
            with self.conn() as conn, conn.cursor() as cur:
                cur.execute(statement)
                rows = list(cur.fetchall())
            columns = [
                pa.array(col, type=f.type)
                for col, f in zip(zip(*rows, strict=True), MYSQL_ARROW, strict=True)
            ]
        else:
            reader = (
                f"mysqlclient {package_version('mysqlclient')} fetchall (C; DECIMAL and "
                "TIMESTAMP as text, cast by Arrow) → pa.array per column"
            )
            conv = dict(conversions)
            for t in (FIELD_TYPE.NEWDECIMAL, FIELD_TYPE.DECIMAL, FIELD_TYPE.TIMESTAMP):
                conv[t] = str  # skip Decimal / datetime objects: Arrow parses the text
            db = MySQLdb.connect(**connect_args(self.server_url), conv=conv)
            try:
                cur = db.cursor()
                cur.execute("SET time_zone = '+00:00'")
                cur.execute(statement)
                rows = list(cur.fetchall())
            finally:
                db.close()
            columns = []
            for col, f in zip(zip(*rows, strict=True), MYSQL_ARROW, strict=True):
                if pa.types.is_decimal(f.type):
                    columns.append(pc.cast(pa.array(col, pa.string()), f.type))
                elif pa.types.is_timestamp(f.type):  # the session's zone is UTC
                    naive = pc.cast(pa.array(col, pa.string()), pa.timestamp("us"))
                    columns.append(naive.cast(f.type))
                else:
                    columns.append(pa.array(col, type=f.type))
        data = pa.Table.from_arrays(columns, schema=MYSQL_ARROW)
        read_s = time.perf_counter() - started
        write_s, mb = _write_parquet(data, out)
        return PlainRead(data.num_rows, read_s, write_s, time.process_time() - cpu, reader, mb)

    def drop(self) -> None:
        try:
            self.sql(f"DROP DATABASE IF EXISTS `{self.schema}`")
        except pymysql.err.Error as exc:
            print(f"warning: dropping database {self.schema}: {exc}", file=sys.stderr)

    def machine(self) -> list[str]:
        version, pool, sync_binlog, flush = self.sql(
            "SELECT version(), @@innodb_buffer_pool_size, @@sync_binlog, "
            "@@innodb_flush_log_at_trx_commit"
        )[0]
        return [
            f"- MariaDB/MySQL {version} (innodb_buffer_pool_size={int(pool) // 2**20}MB, "
            f"sync_binlog={sync_binlog}, innodb_flush_log_at_trx_commit={flush}), PyMySQL "
            f"{package_version('PyMySQL')}, mysqlclient {package_version('mysqlclient')}"
        ]

"""The engine in this process, for the older benches: a capture (its own slot, publication,
state directory and config) on PostgreSQL or MySQL, a snapshot or a stream run in a thread
into a given sink, the PostgreSQL ``items`` table (bigint key) and its plain read into Arrow,
a profiled snapshot, the cleanup."""

from __future__ import annotations

import contextlib
import cProfile
import io
import os
import platform
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import sqlalchemy as sa

from bench.lib import mysql as mydb
from bench.lib.counting import CountingSink
from bench.lib.profiling import per_thread, profile_threads
from bench.lib.servers import package_version
from bench.lib.stats import Result
from signals.names import TableId
from signals.table import create_signal_table
from snapshotter.app.cli import main as cli_main
from snapshotter.app.runner import StopFlag, run_engine
from snapshotter.config import Config, load_config
from snapshotter.config.source import SourceBase
from snapshotter.core.events import Op
from snapshotter.core.state import EngineState, StreamState
from snapshotter.engine.state_store import StateStore, state_path
from snapshotter.engine.workers import PhaseHooks
from snapshotter.sinks.base import Sink
from snapshotter.sources.base import TableSchema
from snapshotter.sources.mysql.dialect import MySqlDialect, mysql_url
from snapshotter.sources.postgres import setup as pg_setup
from snapshotter.sources.postgres import types as pg_types

TABLE = "items"
TICKER_TABLE = "ticker"
SIGNAL_TABLE = "debezium_signal"
DEFAULT_CHUNK_SIZE: int = SourceBase.model_fields["chunk_size"].default
ENGINE_TIMEOUT_S = 3600.0
MYSQL_SERVER_ID = 6101
MYSQL_PREFIX = "MySQL: "  # the MySQL rows' names in the table
JSONL_SINK = '[sink]\nkind = "jsonl"\npath = "events.jsonl"\n'  # a capture's default sink


def sql(url: str, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


def load_table(url: str, schema: str, rows: int) -> float:
    """Create ``schema.items`` with ``rows`` rows; VACUUM ANALYZE it (so no later read pays
    for hint bits), and read it once to warm the caches. Returns the load time."""
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(
            f'CREATE TABLE "{schema}"."{TABLE}" ('
            "id bigint PRIMARY KEY, k int, name text, amount float8, created timestamptz)"
        )
        # snapshotter init insists on it for a table with TOAST-able columns (text): an
        # UPDATE logs the whole old row, which the log stream measurement pays for.
        conn.execute(f'ALTER TABLE "{schema}"."{TABLE}" REPLICA IDENTITY FULL')
        conn.execute(
            f'INSERT INTO "{schema}"."{TABLE}" '
            "SELECT g, (g::bigint * 7919) %% 100003, 'name-' || md5(g::text), g * 0.25, "
            "timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second' "
            "FROM generate_series(1, %s) AS g",
            (rows,),
        )
        conn.execute(f'VACUUM ANALYZE "{schema}"."{TABLE}"')
        conn.execute(f'SELECT count(*) FROM "{schema}"."{TABLE}"').fetchone()
    return time.perf_counter() - started


def machine(url: str) -> list[str]:
    version = sql(url, "SHOW server_version")[0][0]
    settings = dict(
        sql(
            url,
            "SELECT name, setting || coalesce(unit, '') FROM pg_settings "
            "WHERE name IN ('shared_buffers', 'synchronous_commit', 'fsync')",
        )
    )
    return [
        f"- machine: {platform.platform()}, {os.cpu_count()} cores",
        f"- Python {platform.python_version()} ({platform.python_implementation()}), "
        f"psycopg {psycopg.__version__}, pyarrow {pa.__version__}",
        f"- PostgreSQL {version} ({', '.join(f'{k}={v}' for k, v in sorted(settings.items()))})",
    ]


def plain_read(url: str, schema: str) -> Result:
    """``SELECT *`` with the engine's loaders, into Arrow as ``postgres._to_arrow`` does."""
    started = time.perf_counter()
    table = pg_table(url, schema)
    seconds = time.perf_counter() - started
    return Result("plain read (psycopg → Arrow)", table.num_rows, seconds)


def pg_table(url: str, schema: str) -> pa.Table:
    """``schema.items`` read with ``SELECT *`` and the engine's loaders, into Arrow column by
    column as the PostgreSQL dialect builds a chunk."""
    with psycopg.connect(url, context=pg_types.LoadContext()) as conn:
        conn.execute("SET TimeZone TO 'UTC'")
        cur = conn.execute(f'SELECT * FROM "{schema}"."{TABLE}"')
        assert cur.description is not None
        types = [(c.name, pg_types.arrow_type(c.type_code)) for c in cur.description]
        rows = cur.fetchall()
    arrays = [
        pa.array(list(map(itemgetter(i), rows)), type=arrow) for i, (_, arrow) in enumerate(types)
    ]
    return pa.Table.from_arrays(arrays, names=[name for name, _ in types])


@dataclass
class Capture:
    """One engine setup: its own slot, publication, state directory and config file; the
    ``[sink]`` section is ``sink`` (TOML text: the JSONL sink unless given), the source's
    ``name`` (the Kafka sink's topic prefix) ``name``."""

    url: str
    schema: str
    directory: Path
    chunk_size: int
    tables: tuple[str, ...] = (TABLE,)  # captured (in the publication); TABLE is snapshotted
    slot: str = ""
    publication: str = ""
    cli_output: list[str] = field(default_factory=list)
    sink: str = JSONL_SINK
    name: str = "bench"

    def __post_init__(self) -> None:
        tag = uuid.uuid4().hex[:10]
        self.slot = f"bench_{tag}"
        self.publication = f"bench_{tag}"
        self.write_config("postgres", f'slot = "{self.slot}"\npublication = "{self.publication}"')

    def write_config(self, kind: str, source_keys: str) -> None:
        """The config file: ``[source]`` of ``kind`` with ``source_keys`` (TOML lines) after
        the common keys, the sink, state in ``state/``."""
        self.directory.mkdir(parents=True)
        self.config_path = self.directory / "snapshotter.toml"
        tables = ", ".join(f'"{self.schema}.{t}"' for t in self.tables)
        self.config_path.write_text(
            f"""
[source]
kind = "{kind}"
name = "{self.name}"
url = "{self.url}"
tables = [{tables}]
signal_table = "{self.schema}.{SIGNAL_TABLE}"
chunk_size = {self.chunk_size}
{source_keys}

{self.sink}
[state]
dir = "state"
""",
            encoding="utf-8",
        )

    @property
    def config(self) -> Config:
        return load_config(self.config_path)

    @property
    def sink_path(self) -> Path:
        return self.config.sink.local_path

    def cli(self, *args: str) -> None:
        """``snapshotter <args>``; its chatter is kept, and shown only if it fails."""
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            code = cli_main([args[0], "-c", str(self.config_path), *args[1:]])
        self.cli_output.append(buffer.getvalue())
        if code != 0:
            raise RuntimeError(f"snapshotter {args[0]} exited {code}:\n{buffer.getvalue()}")

    def init(self) -> None:
        self.cli("init")

    def signal_snapshot(self) -> None:
        self.cli("signal", "execute-snapshot", f"{self.schema}.{TABLE}")

    def run_snapshot(
        self, sink: Sink | None = None, profiles: dict[str, cProfile.Profile] | None = None
    ) -> tuple[int, float]:
        """``init``, the ``execute-snapshot`` signal, then ``run_engine(until_caught_up=True)``
        into ``sink`` (None: the configured one), with every thread under cProfile into
        ``profiles`` when given; the exit code and the seconds from the committed signal to
        the engine's return."""
        self.init()
        config = self.config
        self.signal_snapshot()
        profiling: contextlib.AbstractContextManager[dict[str, cProfile.Profile]]
        profiling = profile_threads() if profiles is not None else contextlib.nullcontext({})
        with profiling as got:
            started = time.perf_counter()
            code = run_engine(config, until_caught_up=True, sink=sink)
            seconds = time.perf_counter() - started
        if profiles is not None:
            profiles.update(got)
        return code, seconds

    def drop(self) -> None:
        """Drop the slot and the publication (both may be missing)."""
        try:
            pg_setup.drop_slot(self.url, self.slot)
        finally:
            sql(self.url, f'DROP PUBLICATION IF EXISTS "{self.publication}"')


def snapshot(capture: Capture, rows: int, sink: Sink | None, what: str) -> Result:
    """Signal, then ``run_engine(until_caught_up=True)``; timed from the committed signal to
    the engine's return. ``sink=None``: the configured JSONL sink."""
    code, seconds = capture.run_snapshot(sink)
    if code != 0:
        raise RuntimeError(f"{what}: the engine exited {code}")
    if isinstance(sink, CountingSink):
        got = sink.counts[Op.READ]
        extra = sink.total - got
    else:
        with capture.sink_path.open("rb") as f:
            got = sum(1 for _ in f)
        extra = 0
    if got != rows or extra:
        raise RuntimeError(f"{what}: {got} READ events (+{extra} others) for {rows} rows")
    note = ""
    if sink is None:
        note = f"{capture.sink_path.stat().st_size / 1e6:,.0f} MB written"
    return Result(what, rows, seconds, note)


@dataclass
class EngineThread:
    thread: threading.Thread
    stop_flag: StopFlag
    outcome: dict[str, Any]

    def stop(self, timeout: float = 120.0) -> int:
        self.stop_flag.set()
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise RuntimeError(f"the engine did not stop within {timeout} s")
        if "error" in self.outcome:
            raise self.outcome["error"]
        code: int = self.outcome["code"]
        return code


def start_engine(config: Config, sink: Sink, hooks: PhaseHooks | None = None) -> EngineThread:
    flag = StopFlag()
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["code"] = run_engine(config, stop=flag, sink=sink, hooks=hooks)
        except BaseException as exc:  # re-raised by stop()
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="bench-engine", daemon=True)
    thread.start()
    return EngineThread(thread, flag, outcome)


def wait_for(engine: EngineThread, done: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll (1 ms) until ``done()``; returns the perf_counter time it first held."""
    deadline = time.perf_counter() + timeout
    while not done():
        if not engine.thread.is_alive():
            engine.stop()  # raises the engine's error, if any
            raise RuntimeError(f"the engine ended while waiting for {what}")
        if time.perf_counter() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.001)
    return time.perf_counter()


@dataclass
class MySqlCapture(Capture):
    """One MySQL engine setup: its own state directory and config file; ``url`` names the
    bench database on the MySQL server, ``schema`` is that database. ``Capture``'s config,
    CLI and signal helpers as they are (so ``snapshot`` and ``profiled_snapshot`` run it
    unchanged); no slot or publication."""

    def __post_init__(self) -> None:
        self.write_config("mysql", f"server_id = {MYSQL_SERVER_ID}")

    @property
    def signal_table(self) -> TableId:
        return TableId(self.schema, SIGNAL_TABLE)

    def init(self) -> None:
        """What ``snapshotter init`` would do for MySQL: the signal table, and a state that
        starts the binlog reader at the binlog's current end (before the signal)."""
        engine = sa.create_engine(mysql_url(self.url), connect_args={"charset": "utf8mb4"})
        try:
            with engine.begin() as conn:
                create_signal_table(conn, self.signal_table)
        finally:
            engine.dispose()
        dialect = MySqlDialect(self.url, signal_table=self.signal_table)
        try:
            start = dialect.binlog_start()
        finally:
            dialect.close()
        StateStore(state_path(self.config)).save(EngineState(stream=StreamState(resume=start)))

    def drop(self) -> None:
        """Nothing on the server: the binlog needs no slot (the database is dropped last)."""


def mysql_plain_read(url: str, database: str) -> Result:
    """``SELECT *`` through pymysql (buffered), into Arrow with the dialect's types as
    ``MySqlDialect`` builds a chunk: ``read_bench.py mysql``'s baseline."""
    read = mydb.pymysql_buffered(url, database, mysql_schema(url, database))
    return Result(f"{MYSQL_PREFIX}plain read (pymysql → Arrow)", read.rows, read.seconds)


def mysql_schema(url: str, database: str) -> TableSchema:
    """``database.items`` as ``MySqlDialect`` describes it."""
    dialect = MySqlDialect(url, signal_table=TableId(database, SIGNAL_TABLE))
    try:
        return dialect.describe(TableId(database, TABLE))
    finally:
        dialect.close()


def mysql_machine(url: str) -> list[str]:
    """The machine line (the same as PostgreSQL's), the MySQL client libraries, the server."""
    lines = mydb.machine(url)
    return [
        lines[0],
        f"- PyMySQL {package_version('PyMySQL')}, mysql-replication "
        f"{package_version('mysql-replication')}",
        lines[-1].replace("- server", "- MySQL server", 1),
    ]


def profiled_snapshot(capture: Capture, rows: int, top: int, title: str = "") -> str:
    sink = CountingSink()
    profiles: dict[str, cProfile.Profile] = {}
    code, seconds = capture.run_snapshot(sink, profiles)
    if code != 0 or sink.counts[Op.READ] != rows:
        raise RuntimeError(f"profiled snapshot: exit {code}, counted {dict(sink.counts)}")
    out = [
        f"### {title}cProfile: snapshot → counting sink, {rows:,} rows, {seconds:.2f} s under the "
        f"profiler ({rows / seconds:,.0f} rows/s); top {top} by cumulative time per thread"
    ]
    return "\n".join(out + per_thread(profiles, top))


def cleanup(url: str, schema: str, captures: list[Capture]) -> None:
    """Drop every slot, publication and the schema; report, never raise, what fails."""
    for capture in captures:
        try:
            capture.drop()
        except Exception as exc:
            print(f"warning: dropping {capture.slot}/{capture.publication}: {exc}", file=sys.stderr)
    try:
        sql(url, f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    except Exception as exc:
        print(f"warning: dropping schema {schema}: {exc}", file=sys.stderr)

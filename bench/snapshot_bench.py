"""How fast the engine snapshots and streams, against a plain read measured in the same run.

    python bench/snapshot_bench.py [--rows N] [--chunk-size C] [--url URL] [--profile]
                                   [--source postgres|mysql|both] [--mysql-url URL]

One run loads N rows into a fresh schema, then measures, in this order:

1. a plain ``SELECT *`` through psycopg with the project's loaders, built into an Arrow table
   column by column the way the PostgreSQL dialect builds a chunk (the baseline);
2. the same read through ADBC, when ``adbc_driver_postgresql`` is installed (not a dependency);
3. the engine's incremental snapshot of the table (``run_engine(until_caught_up=True)``)
   into a counting sink, then into the JSONL sink: from the moment the ``execute-snapshot``
   signal is committed to the moment ``run_engine`` returns;
4. the log path: the engine runs in a thread with a counting sink while a writer commits
   single-row UPDATEs in batches; from the first write to the last event counted;
5. whether the log stalls while chunks are read: a ticker thread commits one INSERT into a
   small ``ticker`` table every 20 ms while the engine streams, first idle, then while it
   snapshots the table; each ticker event's arrival at the sink minus its commit time and,
   for comparison, per chunk, the chunk read's duration on the worker thread (``PhaseHooks``)
   and the time the engine's thread took to build and hand over its READ events.

It prints a markdown table whose last column divides each row's rate by the plain read's
rate (see bench/README.md), then a table of the stream's latency (item 5). Every measurement
gets its own slot, publication and state directory; the slots, the publications and the
schema are dropped at the end, also on error.
With ``--profile`` it then runs one more snapshot into a counting sink under cProfile (not
timed in the table) and prints the top entries per thread.

``--source mysql`` (or ``both``) measures a MySQL / MariaDB source the same way, in its own
database ``bench_<random>`` with the same table (``name varchar(40)``, ``created
datetime(6)``): the plain read (pymysql, the dialect's Arrow types, as ``MySqlDialect`` builds
a chunk) and the two snapshots (items 1 and 3), engine config ``kind = "mysql"`` with
``server_id = 6101``. "init" for MySQL creates the signal table and saves a state whose
``stream.resume`` is the binlog's current end, so the engine reads the binlog from before
the signal. Its rows go into the same table, prefixed ``MySQL:``, their ratio taken to the
MySQL plain read. The log stream, backlog and latency measurements are PostgreSQL only.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import itertools
import logging
import math
import os
import platform
import pstats
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from types import FrameType
from typing import Any

import psycopg
import pyarrow as pa
import sqlalchemy as sa

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run from a checkout without installing, like the tests
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench modules

import mysql_read_bench as my  # noqa: E402

from signals.names import TableId  # noqa: E402
from signals.table import create_signal_table  # noqa: E402
from snapshotter.chunk_worker import ChunkTask, PhaseHooks  # noqa: E402
from snapshotter.cli import main as cli_main  # noqa: E402
from snapshotter.config import Config, SourceConfig, load_config  # noqa: E402
from snapshotter.core.events import ChangeEvent, Op  # noqa: E402
from snapshotter.core.state import EngineState, StreamState  # noqa: E402
from snapshotter.dialects import pg_setup, pg_types  # noqa: E402
from snapshotter.dialects.mysql import MySqlDialect, mysql_url  # noqa: E402
from snapshotter.runner import StopFlag, run_engine, state_path  # noqa: E402
from snapshotter.sinks.base import Sink  # noqa: E402
from snapshotter.sinks.counting import CountingSink  # noqa: E402
from snapshotter.state_store import StateStore  # noqa: E402

TABLE = "items"
TICKER_TABLE = "ticker"
SIGNAL_TABLE = "debezium_signal"
DEFAULT_CHUNK_SIZE: int = SourceConfig.model_fields["chunk_size"].default
ENGINE_TIMEOUT_S = 3600.0
MYSQL_SERVER_ID = 6101
MYSQL_PREFIX = "MySQL: "  # the MySQL rows' names in the table


# --------------------------------------------------------------------------- results


@dataclass
class Result:
    what: str
    rows: int | None  # None: not measured (note says why)
    seconds: float | None
    note: str = ""

    @property
    def rate(self) -> float | None:
        if self.rows is None or not self.seconds:
            return None
        return self.rows / self.seconds


def render_table(results: list[Result], baselines: Sequence[Result]) -> str:
    """One row per result; the ratio divides by the plain read of the same source (a MySQL
    row's by the MySQL plain read)."""
    lines = [
        "| what | rows | seconds | rows/s | ratio to plain read |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in results:
        baseline = next(
            (
                b
                for b in baselines
                if b.what.startswith(MYSQL_PREFIX) == r.what.startswith(MYSQL_PREFIX)
            ),
            None,
        )
        base = baseline.rate if baseline is not None else None
        rate = r.rate
        if rate is None:
            lines.append(f"| {r.what} | – | – | – | skipped |")
            continue
        ratio = f"{rate / base:.2f}" if base else "–"
        lines.append(f"| {r.what} | {r.rows:,} | {r.seconds:.2f} | {rate:,.0f} | {ratio} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- setup


def resolve_url(given: str | None) -> str:
    """``--url``, else ``$SNAPSHOTTER_PG_URL``, else what ``scripts/services up postgres``
    prints last on stdout (it starts the server when needed, and is idempotent)."""
    if given:
        return given
    env = os.environ.get("SNAPSHOTTER_PG_URL")
    if env:
        return env
    proc = subprocess.run(
        [str(REPO / "scripts" / "services"), "up", "postgres"],
        check=False,
        capture_output=True,
        text=True,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        sys.exit(f"scripts/services up postgres failed ({proc.returncode}):\n{proc.stderr}")
    return lines[-1].strip()


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


# --------------------------------------------------------------------------- baselines


def plain_read(url: str, schema: str) -> Result:
    """``SELECT *`` with the engine's loaders, into Arrow as ``postgres._to_arrow`` does."""
    started = time.perf_counter()
    with psycopg.connect(url, context=pg_types.LoadContext()) as conn:
        conn.execute("SET TimeZone TO 'UTC'")
        cur = conn.execute(f'SELECT * FROM "{schema}"."{TABLE}"')
        assert cur.description is not None
        types = [(c.name, pg_types.arrow_type(c.type_code)) for c in cur.description]
        rows = cur.fetchall()
    arrays = [
        pa.array(list(map(itemgetter(i), rows)), type=arrow) for i, (_, arrow) in enumerate(types)
    ]
    table = pa.Table.from_arrays(arrays, names=[name for name, _ in types])
    seconds = time.perf_counter() - started
    return Result("plain read (psycopg → Arrow)", table.num_rows, seconds)


def adbc_read(url: str, schema: str) -> Result:
    what = "ADBC read (adbc_driver_postgresql → Arrow)"
    try:
        import adbc_driver_postgresql.dbapi as adbc
    except ImportError:
        return Result(what, None, None, "skipped: adbc_driver_postgresql is not installed")
    started = time.perf_counter()
    with adbc.connect(url) as conn, conn.cursor() as cur:
        cur.execute(f'SELECT * FROM "{schema}"."{TABLE}"')
        table = cur.fetch_arrow_table()
    return Result(what, table.num_rows, time.perf_counter() - started)


# --------------------------------------------------------------------------- engine runs


@dataclass
class Capture:
    """One engine setup: its own slot, publication, state directory and config file."""

    url: str
    schema: str
    directory: Path
    chunk_size: int
    tables: tuple[str, ...] = (TABLE,)  # captured (in the publication); TABLE is snapshotted
    slot: str = ""
    publication: str = ""
    cli_output: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        tag = uuid.uuid4().hex[:10]
        self.slot = f"bench_{tag}"
        self.publication = f"bench_{tag}"
        self.directory.mkdir(parents=True)
        self.config_path = self.directory / "snapshotter.toml"
        tables = ", ".join(f'"{self.schema}.{t}"' for t in self.tables)
        self.config_path.write_text(
            f"""
[source]
kind = "postgres"
name = "bench"
url = "{self.url}"
tables = [{tables}]
signal_table = "{self.schema}.{SIGNAL_TABLE}"
chunk_size = {self.chunk_size}
slot = "{self.slot}"
publication = "{self.publication}"

[sink]
kind = "jsonl"
path = "events.jsonl"

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

    def drop(self) -> None:
        """Drop the slot and the publication (both may be missing)."""
        try:
            pg_setup.drop_slot(self.url, self.slot)
        finally:
            sql(self.url, f'DROP PUBLICATION IF EXISTS "{self.publication}"')


def snapshot(capture: Capture, rows: int, sink: Sink | None, what: str) -> Result:
    """Signal, then ``run_engine(until_caught_up=True)``; timed from the committed signal to
    the engine's return. ``sink=None``: the configured JSONL sink."""
    capture.init()
    config = capture.config
    capture.signal_snapshot()
    started = time.perf_counter()
    code = run_engine(config, until_caught_up=True, sink=sink)
    seconds = time.perf_counter() - started
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


def update_statement(schema: str) -> str:
    return f'UPDATE "{schema}"."{TABLE}" SET amount = amount + 1 WHERE id = %s'


def write_updates(
    conn: psycopg.Connection[Any], schema: str, rows: int, n: int, batch: int
) -> None:
    """``n`` single-row UPDATEs (ids spread over the table), ``batch`` per transaction,
    pipelined by ``executemany``."""
    statement = update_statement(schema)
    with conn.cursor() as cur:
        for first in range(0, n, batch):
            ids = [((i * 7919) % rows) + 1 for i in range(first, min(first + batch, n))]
            with conn.transaction():
                cur.executemany(statement, [(i,) for i in ids])


def check_counts(what: str, sink: CountingSink, updates: int, code: int) -> None:
    if code != 0:
        raise RuntimeError(f"{what}: the engine exited {code}")
    if sink.counts[Op.UPDATE] != updates or sink.total != updates:
        raise RuntimeError(f"{what}: counted {dict(sink.counts)}, wanted {updates} updates")


def log_stream(capture: Capture, table_rows: int, updates: int, batch: int) -> Result:
    """The engine streams into a counting sink while the writer commits; from the first
    write to the last event counted. The note gives the writer's own rate: the engine
    cannot be faster than the writer here (the backlog row shows how fast it can go)."""
    what = "log stream → counting sink"
    capture.init()
    sink = CountingSink()
    engine = start_engine(capture.config, sink)
    code = -1
    try:
        with psycopg.connect(capture.url) as conn:
            # One warm-up change proves the engine is streaming before the clock starts.
            with conn.transaction():
                conn.execute(update_statement(capture.schema), (1,))
            wait_for(engine, lambda: sink.total >= 1, 120.0, "the warm-up event")
            sink.counts.clear()
            started = time.perf_counter()
            write_updates(conn, capture.schema, table_rows, updates, batch)
            written = time.perf_counter()
        last = wait_for(engine, lambda: sink.total >= updates, ENGINE_TIMEOUT_S, "log events")
    finally:
        code = engine.stop()
    check_counts(what, sink, updates, code)
    write_s = written - started
    note = (
        f"{updates:,} single-row UPDATEs, {batch} per commit; the writer alone took "
        f"{write_s:.2f} s ({updates / write_s:,.0f}/s), the last event arrived "
        f"{last - written:.2f} s after the last commit"
    )
    return Result(what, updates, last - started, note)


def log_backlog(capture: Capture, table_rows: int, updates: int, batch: int) -> Result:
    """The same UPDATEs committed before the engine starts; from the engine's start to the
    last event counted: the log path's own speed, with no writer to wait for."""
    what = "log backlog → counting sink"
    capture.init()
    with psycopg.connect(capture.url) as conn:
        write_updates(conn, capture.schema, table_rows, updates, batch)
    sink = CountingSink()
    started = time.perf_counter()
    engine = start_engine(capture.config, sink)
    code = -1
    try:
        last = wait_for(engine, lambda: sink.total >= updates, ENGINE_TIMEOUT_S, "log events")
    finally:
        code = engine.stop()
    check_counts(what, sink, updates, code)
    note = "the same UPDATEs, committed before the engine started (includes its start-up)"
    return Result(what, updates, last - started, note)


# --------------------------------------------------------------------------- MySQL


@dataclass
class MySqlCapture(Capture):
    """One MySQL engine setup: its own state directory and config file; ``url`` names the
    bench database on the MySQL server, ``schema`` is that database. ``Capture``'s config,
    CLI and signal helpers as they are (so ``snapshot`` and ``profiled_snapshot`` run it
    unchanged); no slot or publication."""

    def __post_init__(self) -> None:
        self.directory.mkdir(parents=True)
        self.config_path = self.directory / "snapshotter.toml"
        tables = ", ".join(f'"{self.schema}.{t}"' for t in self.tables)
        self.config_path.write_text(
            f"""
[source]
kind = "mysql"
name = "bench"
url = "{self.url}"
tables = [{tables}]
signal_table = "{self.schema}.{SIGNAL_TABLE}"
chunk_size = {self.chunk_size}
server_id = {MYSQL_SERVER_ID}

[sink]
kind = "jsonl"
path = "events.jsonl"

[state]
dir = "state"
""",
            encoding="utf-8",
        )

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
    ``MySqlDialect`` builds a chunk: ``mysql_read_bench``'s baseline."""
    dialect = MySqlDialect(url, signal_table=TableId(database, SIGNAL_TABLE))
    try:
        schema = dialect.describe(TableId(database, TABLE))
    finally:
        dialect.close()
    read = my.pymysql_buffered(url, database, schema)
    return Result(f"{MYSQL_PREFIX}plain read (pymysql → Arrow)", read.rows, read.seconds)


def mysql_machine(url: str) -> list[str]:
    """The machine line (the same as PostgreSQL's), the MySQL client libraries, the server."""
    lines = my.machine(url)
    return [
        lines[0],
        f"- PyMySQL {my.package_version('PyMySQL')}, mysql-replication "
        f"{my.package_version('mysql-replication')}",
        lines[-1].replace("- server", "- MySQL server", 1),
    ]


# --------------------------------------------------------------------------- stream latency


Tick = tuple[float, int]  # a ticker event: (arrival ms, commit ms)


def now_ms() -> float:
    """Wall-clock milliseconds: the clock PostgreSQL stamps commits with (same machine)."""
    return time.time() * 1000.0


def create_ticker(url: str, schema: str) -> None:
    """The small table the ticker writes to, beside ``items`` in the same schema."""
    sql(url, f'CREATE TABLE "{schema}"."{TICKER_TABLE}" (id bigint PRIMARY KEY)')


class LatencySink(CountingSink):
    """Counts like ``CountingSink``; also notes, for every log event of ``ticker``, when it
    arrived and when it was committed (``source.ts_ms``), when READ events last arrived, and,
    per chunk, how long after the engine started building its READ events they arrived: a
    chunk's READ events carry that start as ``ts_ms`` (taken at its close watermark, on the
    engine's thread), and all arrive in one write (two chunks built within the same
    millisecond would count as one)."""

    def __init__(self, ticker: TableId) -> None:
        super().__init__()
        self.ticker = ticker
        self.ticks: list[Tick] = []  # in arrival order
        self.last_read_ms = 0.0
        self.builds_ms: list[float] = []  # per chunk: READ events' build start → arrival

    def write(self, events: Sequence[ChangeEvent]) -> None:
        arrived = now_ms()
        super().write(events)
        chunk_started: int | None = None
        for event in events:
            if event.op is Op.READ:
                if event.ts_ms != chunk_started:  # the first READ event of a chunk
                    chunk_started = event.ts_ms
                    self.builds_ms.append(arrived - chunk_started)
                    self.last_read_ms = arrived
            elif event.table == self.ticker:
                self.ticks.append((arrived, event.source.ts_ms))


@dataclass
class ChunkTimer:
    """Phase hooks that time each chunk read on the worker thread, from its open watermark
    committed (``after_open``) to its rows buffered in the window (``after_read``): the
    chunk SELECT and its Arrow build, which a stream reading chunks itself would wait for."""

    durations_ms: list[float] = field(default_factory=list)
    started: dict[str, float] = field(default_factory=dict)  # by window id

    def hooks(self) -> PhaseHooks:
        return PhaseHooks(after_open=self.opened, after_read=self.read)

    def opened(self, task: ChunkTask) -> None:
        self.started[task.window.window_id] = time.perf_counter()

    def read(self, task: ChunkTask) -> None:
        started = self.started.pop(task.window.window_id)
        self.durations_ms.append((time.perf_counter() - started) * 1000.0)


class Ticker:
    """A thread that commits one single-row INSERT into ``ticker`` every ``interval`` s, on
    its own autocommit connection. A late tick is not made up for by a burst."""

    def __init__(self, url: str, schema: str, interval: float) -> None:
        self.url = url
        self.interval = interval
        self.statement = f'INSERT INTO "{schema}"."{TICKER_TABLE}" (id) VALUES (%s)'
        self.committed = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-ticker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> int:
        """Stop ticking; returns how many INSERTs were committed."""
        self._stop.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError(f"the ticker did not stop within {timeout} s")
        if self.error is not None:
            raise self.error
        return self.committed

    def _run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                due = time.perf_counter()
                while not self._stop.wait(max(0.0, due - time.perf_counter())):
                    conn.execute(self.statement, (self.committed + 1,))
                    self.committed += 1
                    due = max(due + self.interval, time.perf_counter())
        except BaseException as exc:  # re-raised by stop()
            self.error = exc


@dataclass
class StreamLatency:
    rows: int
    interval_ms: float
    idle: list[Tick]
    during: list[Tick]
    snapshot_s: float
    chunk_ms: list[float]
    build_ms: list[float]


def stream_latency(capture: Capture, rows: int, interval_ms: float, idle_s: float) -> StreamLatency:
    """The engine streams into a ``LatencySink`` while the ticker commits: ``idle_s`` of
    ticks with no snapshot, then the ``execute-snapshot`` signal and ticks until the last
    READ events arrived. A tick belongs to the phase its commit falls in."""
    what = "stream latency"
    capture.init()
    sink = LatencySink(TableId(capture.schema, TICKER_TABLE))
    timer = ChunkTimer()
    engine = start_engine(capture.config, sink, timer.hooks())
    ticker = Ticker(capture.url, capture.schema, interval_ms / 1000.0)
    code = -1
    try:
        ticker.start()
        try:
            # The first ticker event proves the engine streams before the idle phase starts.
            wait_for(engine, lambda: bool(sink.ticks), 120.0, "the first ticker event")
            idle_from = now_ms()
            time.sleep(idle_s)
            idle_to = now_ms()
            capture.signal_snapshot()
            snapshot_from = now_ms()
            wait_for(engine, lambda: sink.counts[Op.READ] >= rows, ENGINE_TIMEOUT_S, "READ events")
            snapshot_to = sink.last_read_ms
        finally:
            committed = ticker.stop()
        wait_for(engine, lambda: len(sink.ticks) >= committed, 120.0, "the last ticker events")
    finally:
        code = engine.stop()
    if code != 0:
        raise RuntimeError(f"{what}: the engine exited {code}")
    reads = sink.counts[Op.READ]
    if reads != rows or len(sink.ticks) != committed or sink.total != rows + committed:
        raise RuntimeError(
            f"{what}: counted {dict(sink.counts)} with {len(sink.ticks)} ticker events, "
            f"wanted {rows} READ events and {committed} ticker events"
        )
    return StreamLatency(
        rows=rows,
        interval_ms=interval_ms,
        idle=[t for t in sink.ticks if idle_from <= t[1] < idle_to],
        during=[t for t in sink.ticks if snapshot_from <= t[1] <= snapshot_to],
        snapshot_s=(snapshot_to - snapshot_from) / 1000.0,
        chunk_ms=timer.durations_ms,
        build_ms=sink.builds_ms,
    )


def percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of non-empty, sorted ``ordered``."""
    return ordered[max(1, math.ceil(q / 100.0 * len(ordered))) - 1]


def longest_gap(times: Sequence[float]) -> float:
    ordered = sorted(times)
    return max((b - a for a, b in itertools.pairwise(ordered)), default=0.0)


def distribution(what: str, values_ms: Sequence[float]) -> str:
    """A note line: p50 and max of per-chunk times, with their count and sum."""
    ordered = sorted(values_ms)
    if not ordered:
        return f"- {what}: none timed"
    return (
        f"- {what}: p50 {percentile(ordered, 50):.1f} ms, max {ordered[-1]:.1f} ms, over "
        f"{len(ordered):,} chunks ({sum(ordered) / 1000:.2f} s in all)"
    )


def render_latency(m: StreamLatency) -> str:
    lines = [
        "| stream latency | p50 ms | p95 ms | p99 ms | max ms | events |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    gaps = []
    for what, ticks in (("idle", m.idle), ("during snapshot", m.during)):
        if not ticks:
            lines.append(f"| {what} | – | – | – | – | 0 |")
            continue
        ordered = sorted(arrived - committed for arrived, committed in ticks)
        cells = [percentile(ordered, q) for q in (50, 95, 99)] + [ordered[-1]]
        lines.append(f"| {what} | {' | '.join(f'{c:.1f}' for c in cells)} | {len(ticks):,} |")
        gaps.append(
            f"{longest_gap([a for a, _ in ticks]):.0f} ms {what} (between their commits: "
            f"{longest_gap([float(c) for _, c in ticks]):.0f} ms)"
        )
    per_chunk = [
        distribution(
            "chunk read (`after_open` → `after_read`, worker thread, beside the stream)",
            m.chunk_ms,
        ),
        distribution(
            "READ events of a chunk, build start → arrival at the sink (engine thread: the "
            "stream waits for it)",
            m.build_ms,
        ),
    ]
    notes = [
        f"- one single-row INSERT into `{TICKER_TABLE}` committed every {m.interval_ms:g} ms; "
        "latency = arrival at the sink − commit time (`source.ts_ms`, whole ms), both wall "
        "clock on this machine",
        f"- snapshot of {m.rows:,} rows: {m.snapshot_s:.2f} s from the signal to the last "
        "READ events",
        f"- longest gap between ticker events received: {'; '.join(gaps)}",
        *per_chunk,
    ]
    return "\n".join([*lines, "", *notes])


# --------------------------------------------------------------------------- profile


@contextlib.contextmanager
def profile_threads() -> Iterator[dict[str, cProfile.Profile]]:
    """cProfile in this thread and in every thread started inside the block (Python 3.11
    has no ``threading.setprofile_all_threads``: each new thread enables its own profiler
    from its first profile event)."""
    profiles: dict[str, cProfile.Profile] = {}

    def bootstrap(frame: FrameType, event: str, arg: object) -> None:
        profiler = cProfile.Profile()
        profiles[threading.current_thread().name] = profiler
        sys.setprofile(None)
        profiler.enable()

    main = cProfile.Profile()
    profiles[threading.current_thread().name] = main
    threading.setprofile(bootstrap)
    main.enable()
    try:
        yield profiles
    finally:
        main.disable()
        threading.setprofile(None)


def shorten_paths(text: str) -> str:
    """pstats prints absolute file names: make them relative to the repo or site-packages."""
    text = text.replace(str(REPO) + os.sep, "")
    for entry in sorted(set(sys.path), key=len, reverse=True):
        if entry and entry.rstrip(os.sep) != str(REPO) and os.path.isdir(entry):
            text = text.replace(entry.rstrip(os.sep) + os.sep, "")
    return text


def profiled_snapshot(capture: Capture, rows: int, top: int, title: str = "") -> str:
    sink = CountingSink()
    capture.init()
    config = capture.config
    capture.signal_snapshot()
    with profile_threads() as profiles:
        started = time.perf_counter()
        code = run_engine(config, until_caught_up=True, sink=sink)
        seconds = time.perf_counter() - started
    if code != 0 or sink.counts[Op.READ] != rows:
        raise RuntimeError(f"profiled snapshot: exit {code}, counted {dict(sink.counts)}")
    out = [
        f"### {title}cProfile: snapshot → counting sink, {rows:,} rows, {seconds:.2f} s under the "
        f"profiler ({rows / seconds:,.0f} rows/s); top {top} by cumulative time per thread"
    ]
    for name, profiler in profiles.items():
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        if not stats.stats:  # type: ignore[attr-defined]
            continue
        stats.sort_stats("cumulative").print_stats(top)
        body = shorten_paths(text.getvalue()).strip().splitlines()
        # Drop pstats' header lines down to the column titles.
        start = next((i for i, line in enumerate(body) if "ncalls" in line), 0)
        total = stats.total_tt  # type: ignore[attr-defined]
        out += [f"\nthread {name} ({total:.2f} s profiled):", "```", *body[start:], "```"]
    return "\n".join(out)


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="table rows (1,000,000)")
    parser.add_argument(
        "--chunk-size",
        type=int,
        default=None,
        help=f"engine chunk size (default: the config's default, {DEFAULT_CHUNK_SIZE})",
    )
    parser.add_argument("--url", help="PostgreSQL URL (default: $SNAPSHOTTER_PG_URL or services)")
    parser.add_argument(
        "--source",
        choices=("postgres", "mysql", "both"),
        default="postgres",
        help="which source(s) to measure (postgres)",
    )
    parser.add_argument(
        "--mysql-url", help="MySQL URL (default: $SNAPSHOTTER_MYSQL_URL or services)"
    )
    parser.add_argument("--updates", type=int, default=50_000, help="log stream UPDATEs (50,000)")
    parser.add_argument("--batch", type=int, default=1000, help="UPDATEs per commit (1000)")
    parser.add_argument(
        "--tick-ms", type=float, default=20.0, help="ticker commit interval, ms (20)"
    )
    parser.add_argument(
        "--idle-seconds", type=float, default=5.0, help="ticks before the snapshot signal (5)"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="afterwards, profile one more snapshot → counting sink with cProfile",
    )
    parser.add_argument("--profile-top", type=int, default=15, help="entries per thread (15)")
    args = parser.parse_args(argv)
    counts = [args.rows, args.updates, args.batch]
    if args.chunk_size is not None:
        counts.append(args.chunk_size)
    if min(counts) < 1:
        parser.error("--rows, --chunk-size, --updates and --batch must be positive")
    if args.tick_ms <= 0 or args.idle_seconds <= 0:
        parser.error("--tick-ms and --idle-seconds must be positive")
    return args


@dataclass
class Measured:
    """What one source's part of a run measured."""

    results: list[Result]
    baseline: Result
    machine: list[str]
    latency: StreamLatency | None = None
    profile_text: str = ""


def measure_postgres(args: argparse.Namespace, chunk_size: int, tmp: Path) -> Measured:
    url = resolve_url(args.url)
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    captures: list[Capture] = []
    results: list[Result] = []
    profile_text = ""

    def new_capture(name: str, tables: tuple[str, ...] = (TABLE,)) -> Capture:
        capture = Capture(url, schema, tmp / name, chunk_size, tables)
        captures.append(capture)
        return capture

    try:
        print(f"loading {args.rows:,} rows into {schema}.{TABLE} ...", file=sys.stderr)
        load_seconds = load_table(url, schema, args.rows)
        print(f"loaded in {load_seconds:.1f} s; measuring ...", file=sys.stderr)
        baseline = plain_read(url, schema)
        results += [baseline, adbc_read(url, schema)]
        for name, what, sink in (
            ("counting", "snapshot → counting sink", CountingSink()),
            ("jsonl", "snapshot → JSONL sink", None),
        ):
            print(f"{what} ...", file=sys.stderr)
            capture = new_capture(name)
            results.append(snapshot(capture, args.rows, sink, what))
            capture.drop()
        for name, measure in (("stream", log_stream), ("backlog", log_backlog)):
            print(f"log {name} ...", file=sys.stderr)
            capture = new_capture(name)
            results.append(measure(capture, args.rows, args.updates, args.batch))
            capture.drop()
        print("stream latency during a snapshot ...", file=sys.stderr)
        create_ticker(url, schema)
        capture = new_capture("latency", (TABLE, TICKER_TABLE))
        latency = stream_latency(capture, args.rows, args.tick_ms, args.idle_seconds)
        capture.drop()
        if args.profile:
            print("profiled snapshot ...", file=sys.stderr)
            capture = new_capture("profile")
            profile_text = profiled_snapshot(capture, args.rows, args.profile_top)
            capture.drop()
    finally:
        cleanup(url, schema, captures)
    return Measured(results, baseline, machine(url), latency, profile_text)


def measure_mysql(args: argparse.Namespace, chunk_size: int, tmp: Path) -> Measured:
    """The plain read and the two snapshots against MySQL / MariaDB, in a database of
    their own, dropped at the end."""
    server = my.resolve_mysql_url(args.mysql_url)
    database = f"bench_{uuid.uuid4().hex[:10]}"
    url = my.with_database(server, database)
    results: list[Result] = []
    profile_text = ""
    my.create_database(server, database)
    try:
        print(f"MySQL: loading {args.rows:,} rows into {database}.{TABLE} ...", file=sys.stderr)
        load_seconds = my.load_items(server, database, args.rows)
        print(f"MySQL: loaded in {load_seconds:.1f} s; measuring ...", file=sys.stderr)
        baseline = mysql_plain_read(url, database)
        results.append(baseline)
        for name, what, sink in (
            ("mysql-counting", "snapshot → counting sink", CountingSink()),
            ("mysql-jsonl", "snapshot → JSONL sink", None),
        ):
            what = MYSQL_PREFIX + what
            print(f"{what} ...", file=sys.stderr)
            capture = MySqlCapture(url, database, tmp / name, chunk_size)
            results.append(snapshot(capture, args.rows, sink, what))
        if args.profile:
            print("MySQL: profiled snapshot ...", file=sys.stderr)
            capture = MySqlCapture(url, database, tmp / "mysql-profile", chunk_size)
            profile_text = profiled_snapshot(capture, args.rows, args.profile_top, MYSQL_PREFIX)
    finally:
        my.drop_database(server, database)
    return Measured(results, baseline, mysql_machine(server), None, profile_text)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # mysql-replication warns on every reconnect, closing the binlog stream included.
    logging.getLogger("pymysqlreplication").setLevel(logging.ERROR)
    chunk_size = args.chunk_size or DEFAULT_CHUNK_SIZE
    parts: list[Measured] = []

    with tempfile.TemporaryDirectory(prefix="snapshotter-bench-") as tmp:
        if args.source in ("postgres", "both"):
            parts.append(measure_postgres(args, chunk_size, Path(tmp)))
        if args.source in ("mysql", "both"):
            parts.append(measure_mysql(args, chunk_size, Path(tmp)))

    results = [r for part in parts for r in part.results]
    print(f"## snapshotter bench: {args.rows:,} rows, chunk size {chunk_size}\n")
    lines = [line for part in parts for line in part.machine]
    print("\n".join(dict.fromkeys(lines)))  # the machine and Python lines once
    print()
    print(render_table(results, [part.baseline for part in parts]))
    notes = [f"- {r.what}: {r.note}" for r in results if r.note]
    if notes:
        print()
        print("\n".join(notes))
    for part in parts:
        if part.latency is not None:
            print()
            print(f"### log stream while the engine snapshots {args.rows:,} rows\n")
            print(render_latency(part.latency))
    for part in parts:
        if part.profile_text:
            print()
            print(part.profile_text)
    return 0


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


if __name__ == "__main__":
    sys.exit(main())

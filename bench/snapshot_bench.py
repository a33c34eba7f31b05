"""The log path's speed (stream and backlog) and a cProfile of one snapshot; and the engine
helpers (captures, snapshots, plain reads) the other bench scripts build on.

    python bench/snapshot_bench.py [--rows N] [--updates U] [--batch B] [--chunk-size C]
                                   [--url URL] [--profile] [--profile-top K]

The end-to-end comparison (a plain read against snapshots into every sink, both sources,
peak RSS, stream latency during a snapshot) is ``bench/e2e_bench.py``. This script loads N
rows into a fresh schema (``items``, bigint key), then measures:

1. the log stream: the engine runs in a thread with a counting sink while a writer commits
   ``--updates`` single-row UPDATEs, ``--batch`` per transaction; from the first write to the
   last event counted (it cannot beat the writer: the note gives the writer's own rate);
2. the log backlog: the same UPDATEs committed before the engine starts; from its start to
   the last event counted: the log path's own speed;
3. with ``--profile``: one snapshot of the table into a counting sink under cProfile
   (``run_engine(until_caught_up=True)``), the top entries per thread.

Every measurement gets its own slot, publication and state directory; slots, publications
and the schema are dropped at the end, also on error.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import platform
import pstats
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
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
from snapshotter.app.cli import main as cli_main  # noqa: E402
from snapshotter.app.runner import StopFlag, run_engine  # noqa: E402
from snapshotter.config import Config, SourceConfig, load_config  # noqa: E402
from snapshotter.core.events import Op  # noqa: E402
from snapshotter.core.state import EngineState, StreamState  # noqa: E402
from snapshotter.engine.state_store import StateStore, state_path  # noqa: E402
from snapshotter.engine.workers import PhaseHooks  # noqa: E402
from snapshotter.sinks.base import Sink  # noqa: E402
from snapshotter.sinks.counting import CountingSink  # noqa: E402
from snapshotter.sources.mysql.dialect import MySqlDialect, mysql_url  # noqa: E402
from snapshotter.sources.postgres import setup as pg_setup  # noqa: E402
from snapshotter.sources.postgres import types as pg_types  # noqa: E402

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
    parser.add_argument("--updates", type=int, default=50_000, help="log stream UPDATEs (50,000)")
    parser.add_argument("--batch", type=int, default=1000, help="UPDATEs per commit (1000)")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="afterwards, profile one snapshot → counting sink with cProfile",
    )
    parser.add_argument("--profile-top", type=int, default=15, help="entries per thread (15)")
    args = parser.parse_args(argv)
    counts = [args.rows, args.updates, args.batch]
    if args.chunk_size is not None:
        counts.append(args.chunk_size)
    if min(counts) < 1:
        parser.error("--rows, --chunk-size, --updates and --batch must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    chunk_size = args.chunk_size or DEFAULT_CHUNK_SIZE
    url = resolve_url(args.url)
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    captures: list[Capture] = []
    results: list[Result] = []
    profile_text = ""
    with tempfile.TemporaryDirectory(prefix="snapshotter-bench-") as tmp_name:
        tmp = Path(tmp_name)

        def new_capture(name: str) -> Capture:
            capture = Capture(url, schema, tmp / name, chunk_size)
            captures.append(capture)
            return capture

        try:
            print(f"loading {args.rows:,} rows into {schema}.{TABLE} ...", file=sys.stderr)
            load_table(url, schema, args.rows)
            for name, measure in (("stream", log_stream), ("backlog", log_backlog)):
                print(f"log {name} ...", file=sys.stderr)
                capture = new_capture(name)
                results.append(measure(capture, args.rows, args.updates, args.batch))
                capture.drop()
            if args.profile:
                print("profiled snapshot ...", file=sys.stderr)
                capture = new_capture("profile")
                profile_text = profiled_snapshot(capture, args.rows, args.profile_top)
                capture.drop()
        finally:
            cleanup(url, schema, captures)

    print(f"## snapshotter log path: {args.updates:,} UPDATEs on a {args.rows:,}-row table\n")
    print("\n".join(machine(url)))
    print()
    lines = ["| what | events | seconds | events/s |", "|---|---:|---:|---:|"]
    for r in results:
        assert r.rows is not None and r.seconds is not None
        lines.append(f"| {r.what} | {r.rows:,} | {r.seconds:.2f} | {r.rows / r.seconds:,.0f} |")
    print("\n".join(lines))
    print()
    print("\n".join(f"- {r.what}: {r.note}" for r in results if r.note))
    if profile_text:
        print()
        print(profile_text)
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

"""A source database restarted mid-snapshot: nothing lost, no snapshot failed.

Each test runs a PostgreSQL or MariaDB server of this module's own (``scripts/services`` in
local mode, its own directory and port: the shared servers are never restarted), snapshots a
table while the random writer changes it, and kills the server from inside a chunk (its open
watermark committed, its SELECT next), so the log reader, the chunk worker and the writer all
lose their connections at once:

* back within a few seconds, the engine rides it out: the failed chunk is read again, the log
  reader reconnects and drops what it had handed over already, the snapshot finishes
  ``done`` and the output converges;
* down for longer than the bound (made small here), the engine stops with an error that says
  the database is unreachable and that ``snapshotter resume`` continues; the snapshot is
  still ``running`` in the state, and once the server is back ``resume`` finishes it and the
  output converges.

Besides: a table's start that loses its connection is retried too (simulated), and the
PostgreSQL log reader alone, on the private server, hands over each change of a transaction
cut by a lost connection exactly once, and stops at once, with the server's message, when
the slot is gone after a reconnect.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest
import sqlalchemy as sa

from snapshotter.engine import SourceUnavailableError
from snapshotter.engine import retry as engine_retry
from snapshotter.engine.workers import ChunkTask, PhaseHooks
from snapshotter.sources.log import Change, Commit, LogItem
from snapshotter.sources.mysql import reader as binlog_reader
from snapshotter.sources.mysql.reader import BinlogReaderError
from snapshotter.sources.postgres import reader as pg_reader
from snapshotter.sources.postgres.decoder import PgOutputDecoder
from snapshotter.sources.postgres.reader import PgLogReader, PgReaderError
from tests.integration.engine_harness import Capture, mysql_connect
from tests.integration.test_convergence import (
    Source,
    assert_converged,
    at_chunk,
    events,
    mysql_source,
    postgres_source,
    progress,
    qualified,
    state_of,
    wait_for,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ROWS = 20_000
CHUNK = 500
KILL_IN_CHUNK = 6
BOUND_S = 3.0  # the retry bounds of the "longer than the bound" test


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class PrivateServer:
    """A PostgreSQL or MariaDB of this module's own (scripts/services in local mode, its own
    directory and port), so it can be killed and restarted without touching the shared
    ones."""

    def __init__(self, service: str, directory: Path) -> None:
        self.service = service
        self.directory = directory
        port_variable = "SNAPSHOTTER_PG_PORT" if service == "postgres" else "SNAPSHOTTER_MYSQL_PORT"
        self.env = {
            **{
                k: v
                for k, v in os.environ.items()
                if k not in ("SNAPSHOTTER_PG_URL", "SNAPSHOTTER_MYSQL_URL")
            },
            "SNAPSHOTTER_SERVICES_MODE": "local",
            "SNAPSHOTTER_SERVICES_DIR": str(directory),
            port_variable: str(_free_port()),
        }
        self.url = ""

    def _services(self, action: str) -> str:
        done = subprocess.run(
            [str(REPO / "scripts" / "services"), action, self.service],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == 0, (
            f"scripts/services {action} {self.service}: {done.stderr[-3000:]}"
        )
        lines = done.stdout.strip().splitlines()
        return lines[-1] if lines else ""

    def up(self) -> str:
        """Start it (idempotent); its URL."""
        self.url = self._services("up")
        return self.url

    def down(self) -> None:
        self._services("down")

    def _server_dir(self) -> Path:
        """Where scripts/services keeps this server: ``postgres-18`` for a version other than
        the default one (SNAPSHOTTER_PG_VERSION, SNAPSHOTTER_MYSQL_VERSION: scripts/matrix)."""
        variable, default = (
            ("SNAPSHOTTER_PG_VERSION", "15")
            if self.service == "postgres"
            else ("SNAPSHOTTER_MYSQL_VERSION", "10.11")
        )
        version = self.env.get(variable, "")
        suffix = f"-{version}" if version not in ("", default) else ""
        return self.directory / f"{self.service}{suffix}"

    def _pid(self) -> int:
        if self.service == "postgres":
            pidfile = self._server_dir() / "data" / "postmaster.pid"
            return int(pidfile.read_text().splitlines()[0])
        return int((self._server_dir() / "run" / "mysqld.pid").read_text().strip())

    def kill(self) -> None:
        """PostgreSQL: an immediate shutdown (SIGQUIT to the postmaster: every backend dies at
        once, no checkpoint, crash recovery at the next start; a SIGKILL of the postmaster
        would leave its backends behind). MariaDB: SIGKILL. Returns once the process is
        gone."""
        pid = self._pid()
        os.kill(pid, signal.SIGQUIT if self.service == "postgres" else signal.SIGKILL)
        deadline = time.monotonic() + 30
        while _alive(pid):
            assert time.monotonic() < deadline, f"{self.service} (pid {pid}) did not die"
            time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status  # a zombie nobody reaps is dead too


class Servers:
    """The module's private servers, each started the first time a test asks for it, in a
    short directory (MariaDB's socket path is limited) under /tmp, which the postgres user
    can reach when the tests run as root."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="snr-", dir="/tmp"))
        self.directory.chmod(0o711)  # mkdtemp's 700 would keep the postgres user out
        self.started: dict[str, PrivateServer] = {}

    def get(self, service: str) -> PrivateServer:
        server = self.started.get(service)
        if server is None:
            server = self.started[service] = PrivateServer(service, self.directory / service)
        return server

    def close(self) -> None:
        for server in self.started.values():
            try:
                server.down()
            except AssertionError as exc:
                logging.getLogger(__name__).warning("%s", exc)
        shutil.rmtree(self.directory, ignore_errors=True)


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    made = Servers()
    try:
        yield made
    finally:
        made.close()


@dataclass
class Restartable:
    server: PrivateServer
    source: Source


@pytest.fixture(params=["postgres", "mysql"])
def restartable(
    request: pytest.FixtureRequest, servers: Servers, tmp_path: Path
) -> Iterator[Restartable]:
    kind = request.param
    server = servers.get(kind)
    server.up()
    name = f"t_{uuid.uuid4().hex[:12]}"
    made: list[Capture] = []

    def factory(url: str) -> Callable[..., Capture]:
        def make(**kwargs: Any) -> Capture:
            directory = tmp_path / f"capture{len(made)}"
            directory.mkdir(parents=True, exist_ok=True)
            cap = Capture(url, name, directory, **kwargs)
            made.append(cap)
            return cap

        return make

    if kind == "postgres":
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{name}"')
        source = postgres_source(factory(server.url), name)
    else:
        conn = mysql_connect(server.url)
        try:
            with conn.cursor() as cur:
                cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        finally:
            conn.close()
        url = sa.make_url(server.url).set(database=name).render_as_string(hide_password=False)
        source = mysql_source(factory(url), name)
    yield Restartable(server, source)
    server.up()  # a failed test may have left it down
    for cap in made:
        cap.cleanup()


# --- what the engine said ---------------------------------------------------------------------


@dataclass
class Outage:
    """What the engine and its readers logged about an outage (measured numbers)."""

    records: list[logging.LogRecord]

    def messages(self, logger: str, contains: str = "") -> list[str]:
        return [
            r.getMessage()
            for r in self.records
            if r.name.startswith(logger) and contains in r.getMessage()
        ]

    @property
    def failed_chunk_reads(self) -> list[str]:
        """Engine warnings of chunk tasks that failed for a transient reason (each one a
        voided window and a read submitted again)."""
        return [
            m
            for m in self.messages("snapshotter.engine", "the source database is unreachable")
            if m.startswith("chunk ")
        ]

    @property
    def reread_chunks(self) -> set[str]:
        return {m.split(":")[0] for m in self.failed_chunk_reads}

    @property
    def log_losses(self) -> list[str]:
        return self.messages("snapshotter.sources.postgres.reader", "lost") + self.messages(
            "snapshotter.sources.mysql.reader", "lost"
        )

    def summary(self) -> str:
        parts = [
            f"{len(self.failed_chunk_reads)} chunk read(s) failed "
            f"({', '.join(sorted(self.reread_chunks)) or 'none'} read again)",
            f"log reader: {len(self.log_losses)} loss message(s)",
        ]
        parts += self.messages("snapshotter.engine", "answers again")
        parts += self.messages("snapshotter.sources.postgres.reader", "restored after")
        parts += self.messages("snapshotter.sources.postgres.reader", "sent again")
        return "; ".join(parts)


def _no_event_twice(cap: Capture, table: str) -> None:
    """Exactly once in the file: no source position appears twice (a log event handed over
    again after a reconnect would repeat its position; a chunk read again gets new ones)."""
    positions = Counter(e["value"]["source"]["pos"] for e in events(cap, table))
    twice = [p for p, n in positions.items() if n > 1]
    assert not twice, f"{len(twice)} positions repeated, e.g. {twice[:3]}"


@dataclass
class Worker:
    """Phase hooks: a little pacing (so the snapshot is still running when the server dies),
    the kill inside chunk KILL_IN_CHUNK after its open watermark committed, and the time of
    every close watermark written (to see when reading went on)."""

    server: PrivateServer
    killed_at: float = 0.0
    closes: list[float] = field(default_factory=list)
    killed: threading.Event = field(default_factory=threading.Event)
    # Whether the saved state already holds what the test reads after the kill: the engine
    # that stops saves its last checkpoint's state, which on a slow machine may not hold the
    # snapshot yet; the kill waits for one that does (bounded).
    saved: Callable[[], bool] | None = None

    def kill(self) -> None:
        if self.saved is not None:
            deadline = time.monotonic() + 30
            while not self.saved() and time.monotonic() < deadline:
                time.sleep(0.05)
        self.server.kill()
        self.killed_at = time.monotonic()
        self.killed.set()

    def hooks(self) -> PhaseHooks:
        return PhaseHooks(
            before_open=lambda task: time.sleep(0.05),
            after_open=at_chunk(KILL_IN_CHUNK, self.kill),
            after_close=self._closed,
        )

    def _closed(self, task: ChunkTask) -> None:
        self.closes.append(time.monotonic())

    def first_close_after(self, moment: float) -> float | None:
        later = [t for t in self.closes if t > moment]
        return later[0] if later else None


def _start_under_writer(r: Restartable, seed: int) -> tuple[Capture, Any]:
    """The items table seeded, init done, and a random writer (not started yet)."""
    cap = r.source.capture(chunk_size=CHUNK)
    table = r.source.create(cap, "items", ROWS)
    cap.init()
    writer = r.source.writer(cap, table, ROWS, changes=None, seed=seed, rate=300)
    return cap, writer


def test_a_server_restart_mid_snapshot_is_ridden_out(
    restartable: Restartable, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    r, began = restartable, time.monotonic()
    worker = Worker(r.server)
    cap, writer = _start_under_writer(r, seed=31)
    with writer:
        wait_for(lambda: writer.total >= 100, "the writer to get going")
        cap.execute(qualified(cap, "items"))
        engine = cap.start(hooks=worker.hooks())
        wait_for(worker.killed.is_set, f"the kill in chunk {KILL_IN_CHUNK}", engine=engine)
        time.sleep(2)
        r.server.up()
        back_at = time.monotonic()
        written_at_restart = writer.total
        wait_for(
            lambda: state_of(cap, "items") not in (None, "pending", "running"),
            "the snapshot to finish",
            timeout=60,
            engine=engine,
        )
        assert writer.total > written_at_restart  # the writer survived the outage
        reconnects = writer.counts["reconnects"]
    assert engine.stop(timeout=60) == 0
    assert cap.run(timeout=60) == 0  # read the log to its end
    verdict = assert_converged(cap, "items")
    _no_event_twice(cap, "items")
    done = progress(cap, "items")
    assert done["state"] == "done", done
    outage = Outage(list(caplog.records))
    resumed = worker.first_close_after(worker.killed_at)
    assert resumed is not None
    print(
        f"\n{r.source.name}: server down {back_at - worker.killed_at:.1f} s (kill to up); "
        f"chunk reading stalled {resumed - worker.killed_at:.1f} s (kill to the next close "
        f"watermark); {outage.summary()}; writer reconnected {reconnects} times, "
        f"{writer.total} changes; {verdict.table_rows} rows converged in {done['chunks']} "
        f"chunks; test {time.monotonic() - began:.1f} s"
    )
    assert outage.failed_chunk_reads, "the chunk killed mid-read was not retried"
    # The killed chunk is read again, and with read_parallelism = 2 (the default) the one
    # read on the other worker at that moment, if any: the chunks in flight, no others.
    killed = f"chunk {KILL_IN_CHUNK} of {qualified(cap, 'items')}"
    neighbours = {f"chunk {KILL_IN_CHUNK + d} of {qualified(cap, 'items')}" for d in (-1, 1)}
    assert killed in outage.reread_chunks, outage.reread_chunks
    assert outage.reread_chunks - {killed} <= neighbours, outage.reread_chunks
    assert len(outage.reread_chunks) <= cap.config.source.read_parallelism
    assert outage.log_losses, "the log reader did not notice the outage"
    assert not any("failed" in m for m in outage.messages("snapshotter.engine", "snapshot of"))


@pytest.mark.parametrize("first", ["engine", "log reader"])
def test_an_outage_past_the_bound_stops_the_engine_and_resume_converges(
    restartable: Restartable,
    first: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``first``: whose bound is the smaller (the other's is three times as long), so each
    of the two errors is the one that stops the engine in one run."""
    caplog.set_level(logging.INFO)
    # Small bounds: the engine's retries of chunk reads and both log readers' reconnects.
    engine_bound = BOUND_S if first == "engine" else 3 * BOUND_S
    reader_bound = BOUND_S if first == "log reader" else 3 * BOUND_S
    monkeypatch.setattr(engine_retry, "SOURCE_RETRY_FOR_S", engine_bound)
    monkeypatch.setattr(pg_reader, "RECONNECT_FOR_S", reader_bound)
    monkeypatch.setattr(
        binlog_reader,
        "BinlogLogReader",
        functools.partial(binlog_reader.BinlogLogReader, reconnect_for=reader_bound),
    )
    r, began = restartable, time.monotonic()
    cap, writer = _start_under_writer(r, seed=37)
    worker = Worker(r.server, saved=lambda: bool(progress(cap, "items")))
    with writer:
        wait_for(lambda: writer.total >= 100, "the writer to get going")
        cap.execute(qualified(cap, "items"))
        engine = cap.start(hooks=worker.hooks())
        wait_for(worker.killed.is_set, f"the kill in chunk {KILL_IN_CHUNK}", engine=engine)
        expected: type[Exception] = SourceUnavailableError
        if first == "log reader":
            expected = PgReaderError if r.source.name == "postgres" else BinlogReaderError
        with pytest.raises(expected) as stopped:
            engine.join(timeout=60)
        gave_up = time.monotonic() - worker.killed_at
        assert gave_up < 3 * BOUND_S  # the smaller bound, not the other
        message = str(stopped.value)
        assert "snapshotter resume" in message, message
        assert "unreachable" in message or "did not come back" in message, message
        assert "127.0.0.1" in message, message  # names the server
        assert "password" not in message and "snapshotter:snapshotter@" not in message
        saved = progress(cap, "items")
        assert saved["state"] == "running", saved  # not failed: resume continues it
        assert not saved.get("error"), saved
        r.server.up()
        # `snapshotter resume --until-caught-up`, the CLI, while the writer goes on.
        assert cap.cli("resume", "--until-caught-up") == 0
        reconnects = writer.counts["reconnects"]
    assert cap.run(timeout=60) == 0  # the writer has stopped: read the log to its end
    verdict = assert_converged(cap, "items")
    _no_event_twice(cap, "items")
    done = progress(cap, "items")
    assert done["state"] == "done", done
    print(
        f"\n{r.source.name} ({first} first): the engine gave up {gave_up:.1f} s after the "
        f"kill ({type(stopped.value).__name__}: {message}); saved at chunk {saved['chunks']}; "
        f"resumed and converged: {verdict.table_rows} rows in {done['chunks']} chunks; "
        f"writer reconnected {reconnects} times; {Outage(list(caplog.records)).summary()}; "
        f"test {time.monotonic() - began:.1f} s"
    )


def test_a_table_start_that_loses_its_connection_is_retried(
    restartable: Restartable, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start of a snapshot (describe, maximum key) is retried like a chunk read: here
    the maximum-key query loses its connection twice (simulated, on the worker thread only),
    and the snapshot starts on the third try and converges."""
    from snapshotter.sources.mysql.dialect import MySqlDialect
    from snapshotter.sources.postgres.dialect import PostgresDialect

    caplog.set_level(logging.INFO)
    r = restartable
    cls: Any = PostgresDialect if r.source.name == "postgres" else MySqlDialect
    lost: Exception = (
        psycopg.OperationalError("consuming input failed: server closed the connection")
        if r.source.name == "postgres"
        else pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query")
    )
    real = cls.max_key
    failures = iter(range(2))

    def flaky(self: Any, *args: Any) -> Any:
        on_worker = threading.current_thread().name == "snapshotter-chunks"
        if on_worker and next(failures, None) is not None:
            raise lost
        return real(self, *args)

    monkeypatch.setattr(cls, "max_key", flaky)
    cap = r.source.capture(chunk_size=CHUNK)
    r.source.create(cap, "items", 2_000)
    cap.init()
    cap.execute(qualified(cap, "items"))
    assert cap.run(timeout=60) == 0
    assert state_of(cap, "items") == "done"
    assert_converged(cap, "items")
    retried = Outage(list(caplog.records)).messages("snapshotter.engine", "starting the snapshot")
    assert len(retried) == 2, retried
    assert all("unreachable" in m for m in retried)


# --- the PostgreSQL log reader alone ----------------------------------------------------------


@dataclass
class Stream:
    url: str
    table: str  # quoted schema.table
    slot: str
    publication: str

    def reader(self, **kwargs: Any) -> PgLogReader:
        decoder = PgOutputDecoder(name="t", database="snapshotter", key_columns=lambda t: ("id",))
        return PgLogReader(
            self.url, slot=self.slot, publication=self.publication, decoder=decoder, **kwargs
        )

    def sql(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            cur = conn.execute(statement, params)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []

    def terminate(self, reader: PgLogReader, *, wait: bool = True) -> None:
        """Kill the reader's walsender (as a server restart or a network cut would end it)
        and (``wait``) wait until the slot is free."""
        assert reader._conn is not None
        pid = reader._conn.info.backend_pid
        assert self.sql("SELECT pg_terminate_backend(%s)", (pid,)) == [(True,)]
        if not wait:
            return
        wait_for(
            lambda: (
                self.sql(
                    "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (self.slot,)
                )
                == [(False,)]
            ),
            "the slot to be released",
            # A walsender stopped in the middle of sending a large transaction to a reader
            # that is not reading took over 30 s to go once in CI (a loaded machine).
            timeout=120,
        )


@pytest.fixture
def stream(servers: Servers) -> Iterator[Stream]:
    server = servers.get("postgres")
    url = server.up()
    tag = uuid.uuid4().hex[:10]
    schema = f"t_{tag}"
    made = Stream(url, f'"{schema}".t', f"s_{tag}", f"p_{tag}")
    made.sql(f'CREATE SCHEMA "{schema}"')
    made.sql(f"CREATE TABLE {made.table} (id int PRIMARY KEY, pad text NOT NULL)")
    made.sql(f'CREATE PUBLICATION "{made.publication}" FOR TABLE {made.table}')
    made.sql("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (made.slot,))
    yield made
    server.up()
    made.sql(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
        "WHERE slot_name = %s AND NOT active",
        (made.slot,),
    )
    made.sql(f'DROP PUBLICATION IF EXISTS "{made.publication}"')
    made.sql(f'DROP SCHEMA "{schema}" CASCADE')


def _read_until(
    reader: PgLogReader, items: list[LogItem], done: Callable[[], bool], timeout: float = 60
) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "timed out reading the stream"
        items.extend(reader.read(0.2))


def test_a_stream_lost_inside_a_transaction_hands_over_every_change_once(
    stream: Stream,
) -> None:
    """The walsender dies while a large transaction is being handed over, small batches at
    a time: the reader reconnects from the commit before it, the server sends the whole
    transaction again, and the part already handed over is dropped by position."""
    rows = 60_000
    reader = stream.reader(max_items=200)
    try:
        stream.sql(  # one transaction of ~12 MB of pgoutput: more than socket buffers hold
            f"INSERT INTO {stream.table} SELECT g, repeat('x', 150) FROM generate_series(1, %s) g",
            (rows,),
        )
        items: list[LogItem] = []

        def changes() -> list[Change]:
            return [i for i in items if isinstance(i, Change)]

        _read_until(reader, items, lambda: len(changes()) >= 2_000)
        # Not waiting for the slot: a walsender killed while the socket to a reader that is
        # not reading is full cannot send its FATAL message, and lingered past 120 s in CI.
        # The reader drains it, sees the loss, and retries while the slot is still held.
        stream.terminate(reader, wait=False)
        stream.sql(f"INSERT INTO {stream.table} VALUES (%s, 'after')", (rows + 1,))
        _read_until(reader, items, lambda: sum(isinstance(i, Commit) for i in items) >= 2)
    finally:
        reader.close()
    ids = [c.event.key[0] for c in changes() if c.event.key is not None]
    assert ids == list(range(1, rows + 2))
    positions = [
        i.event.position if isinstance(i, Change) else i.position
        for i in items
        if isinstance(i, Change | Commit)
    ]
    assert all(a < b for a, b in itertools.pairwise(positions))
    assert reader.reconnects == 1
    assert reader.dropped_again >= 2_000, reader.dropped_again  # handed over before the loss
    print(
        f"\nreconnected after {reader.outage_seconds:.2f} s; {reader.dropped_again} items "
        "sent again and dropped"
    )


def test_a_slot_dropped_while_the_stream_was_lost_is_an_error_at_once(stream: Stream) -> None:
    """What no reconnect can fix is not retried: the server's message, at once."""
    reader = stream.reader(reconnect_for=60)
    try:
        reader.read(0.2)
        stream.terminate(reader)
        stream.sql("SELECT pg_drop_replication_slot(%s)", (stream.slot,))
        began = time.monotonic()
        with pytest.raises(PgReaderError, match=r"does not exist") as error:
            _read_until(reader, [], lambda: False, timeout=30)
        assert time.monotonic() - began < 5  # not after the 60 s bound
    finally:
        reader.close()
    assert stream.slot in str(error.value)

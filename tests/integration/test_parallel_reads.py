"""Parallel chunk reads (``[source] read_parallelism``, ``snapshotter.core.spans``) on the real
servers: the chunk bound query (a key range scan of the index, composite keys included, on
both databases; paging by bounds returns every key once), and the engine with several reads
in flight: a stop reaches every read, a pause lets the reads in flight finish and holds the
rest, a resume after spans completed out of order reads again what progress had not
recorded, and a lost connection under one of several reads re-reads that span only.

Convergence under the random writer with 1, 2 and 3 reads is in ``test_convergence``
(``PARALLEL_CASES``); the crash suite (``test_faults``) runs with the default, 2.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pymysql
import pytest
import sqlalchemy as sa

from signals.names import TableId
from snapshotter.core.keys import Key, decode_key, encode_key
from snapshotter.core.spans import range_read_limit
from snapshotter.engine.workers import ChunkTask, PhaseHooks
from snapshotter.sources.base import ChunkSpec, ReadCancelled, TableSchema
from snapshotter.sources.mysql.dialect import MySqlDialect
from snapshotter.sources.postgres.dialect import PostgresDialect
from tests.integration.test_convergence import (
    assert_converged,
    progress,
    qualified,
    reads,
    report,
    source_named,
    state_of,
    wait_for,
)
from tests.integration.test_mysql_key_bounds import KEYS, UTF8, fetch, run

pytestmark = pytest.mark.integration

BOTH = pytest.mark.parametrize("name", ["postgres", "mysql"])

Dialect = PostgresDialect | MySqlDialect


def page_by_bounds(
    dialect: Dialect, schema: TableSchema, keys: tuple[str, ...], rows: int
) -> list[tuple[Any, ...]]:
    """Every key, paged as parallel reads page: find each range's end with ``chunk_bound``,
    then read the closed range whole (bounds through the state file's codec)."""
    upto = dialect.max_key(schema, keys, None)
    assert upto is not None
    out: list[tuple[Any, ...]] = []
    after: Key | None = None
    while True:
        bound = dialect.chunk_bound(ChunkSpec(schema, keys, after, upto, None, rows))
        end = upto if bound is None else decode_key(encode_key(bound))
        chunk = dialect.read_chunk(
            ChunkSpec(schema, keys, after, end, None, range_read_limit(rows))
        )
        assert chunk.rows.num_rows <= rows  # nobody writes: a range holds `rows` rows
        out.extend(tuple(r[k] for k in keys) for r in chunk.rows.to_pylist())
        if bound is None or bound == upto:
            return out
        after = end


# --- the bound query: PostgreSQL ---------------------------------------------------------------


@pytest.fixture
def pg_dialect(pg_url: str, pg_schema: str) -> Iterator[PostgresDialect]:
    out = PostgresDialect(pg_url, signal_table=TableId(pg_schema, "sig"), publication="unused")
    yield out
    out.close()


@pytest.fixture
def pg_composite(pg_url: str, pg_schema: str, pg_dialect: PostgresDialect) -> TableSchema:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            f'CREATE TABLE "{pg_schema}".big (k1 int, k2 text COLLATE "C", v int, '
            "PRIMARY KEY (k1, k2))"
        )
        conn.execute(
            f'INSERT INTO "{pg_schema}".big SELECT g / 50, md5(g::text), g '
            "FROM generate_series(1, 20000) g"
        )
        conn.execute(f'VACUUM ANALYZE "{pg_schema}".big')
    return pg_dialect.describe(TableId(pg_schema, "big"))


# (A filter the planner thinks very selective may make it sort a sequential scan instead, as
# it would for the chunk query itself: a cost choice, not a missing range.)
@pytest.mark.parametrize("condition", [None, "v > 0"])
def test_pg_bound_query_is_an_index_range_scan_of_the_composite_key(
    pg_dialect: PostgresDialect, pg_composite: TableSchema, condition: str | None
) -> None:
    keys = pg_composite.primary_key
    for after in ((40, "8"), None):
        plan = pg_dialect.explain_bound(
            ChunkSpec(pg_composite, keys, after, (300, "f"), condition, 1000)
        )
        assert "Index Only Scan using big_pkey" in plan or "Index Scan using big_pkey" in plan
        cond = next(line for line in plan.splitlines() if "Index Cond" in line)
        assert "ROW(k1, k2) <=" in cond, plan
        if after is not None:
            assert "ROW(k1, k2) >" in cond, plan
        assert "Seq Scan" not in plan and "Sort" not in plan, plan
        if condition is None:
            assert "Index Only Scan" in plan, plan  # no row fetched for a bound


def test_pg_bound_is_the_key_rows_rows_on_under_the_filter(
    pg_dialect: PostgresDialect, pg_composite: TableSchema, pg_url: str, pg_schema: str
) -> None:
    keys = pg_composite.primary_key
    with psycopg.connect(pg_url) as conn:
        expected = conn.execute(
            f"SELECT k1, k2 FROM \"{pg_schema}\".big WHERE (k1, k2) > (10, '5') AND v % 3 = 0 "
            "ORDER BY k1, k2 OFFSET 99 LIMIT 1"
        ).fetchone()
    upto = (399, "z")
    assert pg_dialect.chunk_bound(
        ChunkSpec(pg_composite, keys, (10, "5"), upto, "v % 3 = 0", 100)
    ) == (expected)
    # Fewer rows left than asked: no bound (the range ends at the maximum key).
    assert (
        pg_dialect.chunk_bound(ChunkSpec(pg_composite, keys, (399, "0"), upto, None, 1000)) is None
    )
    rows = page_by_bounds(pg_dialect, pg_composite, keys, 777)
    with psycopg.connect(pg_url) as conn:
        every = conn.execute(f'SELECT k1, k2 FROM "{pg_schema}".big ORDER BY k1, k2').fetchall()
    assert rows == every


# --- the bound query: MySQL / MariaDB -----------------------------------------------------------


@pytest.fixture
def my_dialect(mysql_url: str, mysql_db: str) -> Iterator[MySqlDialect]:
    out = MySqlDialect(sa.make_url(mysql_url).set(database=mysql_db), TableId(None, "sig"))
    yield out
    out.close()


@pytest.fixture
def my_composite(my_dialect: MySqlDialect, mysql_engine: sa.Engine, mysql_db: str) -> TableSchema:
    run(
        mysql_engine,
        mysql_db,
        "CREATE TABLE comp (a int NOT NULL, b varchar(20) NOT NULL, c datetime NOT NULL, "
        f"f float, v int, PRIMARY KEY (a, b, c)) {UTF8}",
        "INSERT INTO comp SELECT seq DIV 20, CONCAT('k', (seq * 7) MOD 13), "
        "'2024-01-01' + INTERVAL seq MINUTE, seq / 7, seq FROM seq_1_to_5000",
        "ANALYZE TABLE comp",
    )
    return my_dialect.describe(TableId(mysql_db, "comp"))


@pytest.mark.parametrize("condition", [None, "v % 3 = 0", "b LIKE 'k1%' OR v > 100"])
def test_mysql_bound_query_is_a_range_scan_of_the_composite_key(
    my_dialect: MySqlDialect, my_composite: TableSchema, condition: str | None
) -> None:
    keys = my_composite.primary_key
    upto = (200, "k5", dt.datetime(2024, 1, 3))
    for after in ((40, "k3", dt.datetime(2024, 1, 1, 13, 20)), None):
        plan = my_dialect.explain_bound(ChunkSpec(my_composite, keys, after, upto, condition, 500))
        rows = [json.loads(line) for line in plan.splitlines()]  # one JSON object per plan row
        assert rows and all(r["type"] == "range" and r["key"] == "PRIMARY" for r in rows), plan
        assert "filesort" not in plan


def test_mysql_paging_by_bounds_returns_every_key_once_in_order(
    my_dialect: MySqlDialect, my_composite: TableSchema, mysql_engine: sa.Engine, mysql_db: str
) -> None:
    keys = my_composite.primary_key
    every = fetch(mysql_engine, mysql_db, "SELECT a, b, c FROM comp ORDER BY a, b, c")
    assert page_by_bounds(my_dialect, my_composite, keys, 333) == every
    # A FLOAT key is bounded by its exact value (read as DOUBLE, as chunks read it).
    run(
        mysql_engine,
        mysql_db,
        f"CREATE TABLE fl (k float NOT NULL PRIMARY KEY, n int) {UTF8}",
        "INSERT INTO fl SELECT seq / 7 + 0.1, seq FROM seq_1_to_500",
    )
    floats = my_dialect.describe(TableId(mysql_db, "fl"))
    assert len(page_by_bounds(my_dialect, floats, ("k",), 7)) == 500


@pytest.mark.parametrize("rows", [1, 2, 4])
@pytest.mark.parametrize("kind", ["enum", "set", "bit", "year", "uuid", "inet6"])
def test_mysql_bounds_page_odd_key_types_in_the_index_order(
    kind: str, rows: int, my_dialect: MySqlDialect, mysql_engine: sa.Engine, mysql_db: str
) -> None:
    column, literals = KEYS[kind]
    values = ", ".join(f"({v}, {i})" for i, v in enumerate(literals))
    run(
        mysql_engine,
        mysql_db,
        f"CREATE TABLE t (k {column} NOT NULL PRIMARY KEY, n int) {UTF8}",
        "SET SESSION sql_mode = ''",
        f"INSERT INTO t VALUES {values}",
    )
    schema = my_dialect.describe(TableId(mysql_db, "t"))
    in_order = [(r[0],) for r in fetch(mysql_engine, mysql_db, "SELECT k FROM t ORDER BY k")]
    assert page_by_bounds(my_dialect, schema, ("k",), rows) == in_order


# --- the engine with several reads in flight ----------------------------------------------------


class Gate:
    """A phase hook that holds chosen chunks (by number) until ``open``; ``held`` says
    which are waiting (or waited), ``read`` which chunk SELECTs completed. Once ``stopping``
    says so, a held chunk's read is cancelled instead (as the workers' stop would)."""

    def __init__(
        self, table: str, numbers: set[int], stopping: Callable[[], bool] | None = None
    ) -> None:
        self.table = table
        self.numbers = numbers
        self.stopping = stopping
        self._event = threading.Event()
        self._lock = threading.Lock()
        self.held: list[int] = []
        self.read: list[int] = []

    def hold(self, task: ChunkTask) -> None:
        if task.table.table != self.table or task.number not in self.numbers:
            return
        with self._lock:
            self.held.append(task.number)
        deadline = time.monotonic() + 60
        while not self._event.wait(0.05) and time.monotonic() < deadline:
            if self.stopping is not None and self.stopping():
                raise ReadCancelled("the engine is stopping (test)")

    def done(self, task: ChunkTask) -> None:
        if task.table.table == self.table:
            with self._lock:
                self.read.append(task.number)

    def open(self) -> None:
        self._event.set()

    def hooks(self) -> PhaseHooks:
        # Held after the open watermark: the window is open, its SELECT about to run.
        return PhaseHooks(after_open=self.hold, after_read=self.done)


@BOTH
def test_stop_snapshot_reaches_every_read_in_flight(
    request: pytest.FixtureRequest, name: str
) -> None:
    """Three chunks of ``items`` wait to run their SELECTs, one on each worker; stop-snapshot
    cancels them all (each worker's statement guard refuses the read), nothing of ``items``
    is emitted, and the next table is snapshotted."""
    src = source_named(request, name)
    cap = src.capture(chunk_size=20, extra_config="read_parallelism = 3")
    src.create(cap, "items", 1_000)
    src.create(cap, "composite", 300)
    cap.init()
    gate = Gate("items", {1, 2, 3})
    cap.execute(qualified(cap, "items"), qualified(cap, "composite"))
    engine = cap.start(until_caught_up=True, hooks=gate.hooks())
    wait_for(lambda: len(gate.held) == 3, "three reads in flight", engine=engine)
    assert cap.cli("signal", "stop-snapshot", qualified(cap, "items")) == 0
    wait_for(lambda: state_of(cap, "items") == "stopped", "the stop", engine=engine)
    gate.open()
    assert engine.join(60) == 2  # items stopped
    assert sorted(gate.held) == [1, 2, 3]
    assert gate.read == [], "a read of the stopped table ran after the stop"
    stopped = progress(cap, "items")
    assert stopped["chunks"] == 0 and stopped["rows"] == 0
    assert not reads(cap, "items")
    assert state_of(cap, "composite") == "done"
    assert_converged(cap, "composite")


@BOTH
def test_pause_lets_the_reads_in_flight_finish_and_holds_the_rest(
    request: pytest.FixtureRequest, name: str
) -> None:
    src = source_named(request, name)
    cap = src.capture(chunk_size=20, extra_config="read_parallelism = 3")
    src.create(cap, "items", 1_000)
    cap.init()
    gate = Gate("items", {1, 2, 3})
    cap.execute(qualified(cap, "items"))
    engine = cap.start(hooks=gate.hooks())
    wait_for(lambda: len(gate.held) == 3, "three reads in flight", engine=engine)
    assert cap.cli("signal", "pause-snapshot") == 0
    wait_for(lambda: report(cap)["paused"], "the pause", engine=engine)
    gate.open()
    # The three windows complete (their batches are emitted and recorded while paused)...
    wait_for(lambda: progress(cap, "items").get("chunks") == 3, "the three chunks", engine=engine)
    assert sum(reads(cap, "items").values()) == 60
    # ... and no new chunk starts.
    time.sleep(1.5)
    paused = progress(cap, "items")
    assert paused["state"] == "paused" and paused["chunks"] == 3
    assert sorted(gate.read) == [1, 2, 3]
    assert cap.cli("signal", "resume-snapshot") == 0
    wait_for(lambda: state_of(cap, "items") == "done", "the snapshot to finish", engine=engine)
    assert engine.stop() == 0
    assert_converged(cap, "items")
    assert max(reads(cap, "items").values()) == 1
    assert progress(cap, "items")["chunks"] == 50


@BOTH
def test_progress_waits_for_a_slow_chunk_and_a_restart_reads_the_rest_again(
    request: pytest.FixtureRequest, name: str
) -> None:
    """Chunk 1 is held while later chunks complete and are emitted: saved progress stays
    before chunk 1 (contiguous spans only), and reads run at most ``max_ahead`` spans ahead.
    The engine stops there; the restart reads everything after the saved key again (some
    READ rows twice, none missing) and converges."""
    src = source_named(request, name)
    cap = src.capture(
        chunk_size=20,
        extra_config="read_parallelism = 2",
        state_config="checkpoint_interval_ms = 100",
    )
    src.create(cap, "items", 1_000)  # 50 chunks
    cap.init()
    gate = Gate("items", {1})
    cap.execute(qualified(cap, "items"))
    engine = cap.start(hooks=gate.hooks())
    gate.stopping = engine.stop_flag
    wait_for(lambda: len(set(gate.read)) >= 5, "chunks after the held one", engine=engine)
    # 3 windows in flight: at most 12 spans not yet recorded (chunk 1 and 11 after it).
    wait_for(lambda: len(set(gate.read)) == 11, "the reads to stop ahead", engine=engine)
    # Emitted at their own close watermarks, out of key order...
    wait_for(lambda: sum(reads(cap, "items").values()) == 11 * 20, "their READ rows")
    time.sleep(1.0)
    assert len(set(gate.read)) == 11  # ... and no more
    emitted = sum(reads(cap, "items").values())
    assert emitted == 11 * 20
    saved = progress(cap, "items")
    assert saved["state"] == "running" and saved["chunks"] == 0, saved
    assert saved["last_key"] is None, saved
    assert engine.stop() == 2  # unfinished; chunk 1's read is cancelled by the stop
    assert progress(cap, "items")["chunks"] == 0
    assert cap.run(timeout=120) == 0
    assert state_of(cap, "items") == "done"
    assert_converged(cap, "items")
    counts = reads(cap, "items")
    assert len(counts) == 1_000 and max(counts.values()) == 2
    assert sum(counts.values()) == 1_000 + emitted


@BOTH
def test_a_lost_connection_under_one_of_several_reads_reads_that_span_again(
    request: pytest.FixtureRequest,
    name: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The third chunk SELECT loses its connection (simulated) while other reads run on the
    other workers: that chunk alone is read again after the backoff; every row once."""
    caplog.set_level(logging.INFO)
    src = source_named(request, name)
    cls: Any = PostgresDialect if name == "postgres" else MySqlDialect
    lost: Exception = (
        psycopg.OperationalError("consuming input failed: server closed the connection")
        if name == "postgres"
        else pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query")
    )
    real = cls.read_chunk
    calls = iter(range(1_000_000))

    def flaky(self: Any, *args: Any) -> Any:
        if next(calls) == 2:
            raise lost
        return real(self, *args)

    monkeypatch.setattr(cls, "read_chunk", flaky)
    cap = src.capture(chunk_size=50, extra_config="read_parallelism = 3")
    src.create(cap, "items", 2_000)
    cap.init()
    cap.execute(qualified(cap, "items"))
    assert cap.run(timeout=120) == 0
    assert state_of(cap, "items") == "done"
    assert_converged(cap, "items")
    counts = reads(cap, "items")
    assert len(counts) == 2_000 and max(counts.values()) == 1
    retried = [r.getMessage() for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(retried) == 1 and "chunk" in retried[0], retried

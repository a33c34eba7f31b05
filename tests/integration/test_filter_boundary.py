"""The filter trust boundary on the real servers (issue 15).

An ``additional-conditions`` filter is SQL from the signal table, run on the engine's chunk
connection. What it does to that connection's session must not reach later reads (settings,
advisory locks / GET_LOCK, variables), and no filter may hold the snapshot side or the
engine's shutdown: every max-key and chunk query runs under ``chunk_timeout_s``, and
stop-snapshot and SIGTERM cancel it.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import pymysql
import pytest
import sqlalchemy as sa

from signals.names import TableId
from snapshotter.sources.mysql import setup as my_setup
from snapshotter.sources.mysql.dialect import MySqlDialect
from snapshotter.sources.postgres import arrow as pg_arrow
from snapshotter.sources.postgres import dialect as postgres
from snapshotter.sources.postgres import setup as pg_setup
from snapshotter.sources.query_guard import Outcome, QueryGuard
from tests.conftest import REPO
from tests.integration.engine_harness import Capture, mysql_connect
from tests.integration.test_convergence import (
    Source,
    _cli,
    events,
    op,
    progress,
    qualified,
    reads,
    source_named,
    wait_for,
)

BOTH = pytest.mark.parametrize("name", ["postgres", "mysql"])

# A filter that sleeps for an hour (per row), per database.
SLEEP = {"postgres": "pg_sleep(3600) IS NOT NULL", "mysql": "SLEEP(3600) = 0"}


def _tables(src: Source, cap: Capture, *names: str, rows: int = 3) -> None:
    for name in names:
        src.sql(cap, f"CREATE TABLE {{s}}.{name} (id int PRIMARY KEY, v int)")
        values = ", ".join(f"({i}, {i * 10})" for i in range(1, rows + 1))
        src.sql(cap, f"INSERT INTO {{s}}.{name} VALUES {values}")


def _sleeping(src: Source, cap: Capture) -> int:
    """How many of this test's sleeping filter queries the server is running now."""
    if src.name == "postgres":
        found = cap.sql(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
            "AND pid <> pg_backend_pid() AND query LIKE %s AND query LIKE %s",
            ("%pg_sleep(3600)%", f"%{cap.schema}%"),
        )
    else:
        found = cap.sql(
            "SELECT count(*) FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID() "
            "AND COMMAND = 'Query' AND INFO LIKE %s AND INFO LIKE %s",
            ("%SLEEP(3600)%", f"%{cap.schema}%"),
        )
    return int(found[0][0])


# --- session state ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "value"), [("extra_float_digits", "-15"), ("IntervalStyle", "sql_standard")]
)
def test_a_filter_changing_how_values_are_written_fails_its_snapshot_only(
    request: pytest.FixtureRequest, setting: str, value: str
) -> None:
    """Issue 15: set_config('extra_float_digits', '-15', false) in a filter made the reused
    chunk connection emit 7.1234567890123 as 7.0 for every later snapshot (IntervalStyle:
    intervals in another style). Now the filtered snapshot fails with the setting named
    (its own rows would differ from the log's) and later snapshots read as the log does."""
    src = source_named(request, "postgres")
    cap = src.capture()
    for name in ("a", "b"):
        src.sql(cap, f"CREATE TABLE {{s}}.{name} (id int PRIMARY KEY, f float8, iv interval)")
        src.sql(cap, f"INSERT INTO {{s}}.{name} VALUES (1, 7.1234567890123, '1 day 02:03:04.5')")
    cap.init()
    # After init: the log carries this row too, so its READ and its log event can be compared.
    src.sql(cap, "INSERT INTO {s}.b VALUES (2, 7.1234567890123, '-3 years 1 day 00:00:01')")
    a, b = qualified(cap, "a"), qualified(cap, "b")
    cap.execute(a, b, filters=[f"{a}=set_config('{setting}', '{value}', false) IS NOT NULL"])
    assert cap.run(timeout=60) == 2  # a failed
    failed = progress(cap, "a")
    assert failed["state"] == "failed"
    assert f"changed the session setting {setting}" in failed["error"], failed
    assert progress(cap, "b")["state"] == "done"
    by_op = {(op(e), e["key"]["id"]): e["value"]["after"] for e in events(cap, "b")}
    assert by_op[("r", 1)]["f"] == 7.1234567890123
    assert by_op[("r", 2)] == by_op[("c", 2)]  # READ row == log row, value for value


def test_a_mysql_filter_changing_time_zone_fails_its_snapshot_only(
    request: pytest.FixtureRequest,
) -> None:
    """A MySQL filter can change session variables only through a function it calls, and
    that function's SET @@session.time_zone outlives the read (session variables are not
    transactional): the filtered snapshot fails with the variable named, and the session is
    reset before the next table's TIMESTAMPs are read."""
    src = source_named(request, "mysql")
    cap = src.capture()
    src.sql(
        cap,
        "CREATE FUNCTION {s}.shift_zone() RETURNS int DETERMINISTIC NO SQL "
        "BEGIN SET @@session.time_zone = '+05:00'; RETURN 1; END",
    )
    for name in ("a", "b"):
        src.sql(cap, f"CREATE TABLE {{s}}.{name} (id int PRIMARY KEY, ts timestamp(6) NULL)")
        src.sql(cap, f"INSERT INTO {{s}}.{name} VALUES (1, '2024-01-02 03:04:05.5')")
    cap.init()
    src.sql(cap, "INSERT INTO {s}.b VALUES (2, '2024-06-07 08:09:10.25')")  # also a log row
    a, b = qualified(cap, "a"), qualified(cap, "b")
    cap.execute(a, b, filters=[f"{a}=`{cap.schema}`.shift_zone() = 1"])
    assert cap.run(timeout=60) == 2  # a failed
    failed = progress(cap, "a")
    assert failed["state"] == "failed"
    assert "changed the session variable time_zone" in failed["error"], failed
    assert progress(cap, "b")["state"] == "done"
    by_op = {(op(e), e["key"]["id"]): e["value"]["after"] for e in events(cap, "b")}
    assert by_op[("r", 2)] == by_op[("c", 2)]  # READ row == log row, in UTC both


FILTERS = {
    # a leaves a session variable, a session-level advisory lock / GET_LOCK lock and a user
    # variable behind; b's filter matches no row while any of them is still there.
    "postgres": (
        "set_config('snapshotter.leak', 'a', false) IS NOT NULL AND pg_try_advisory_lock({lock})",
        "coalesce(current_setting('snapshotter.leak', true), '') = '' AND NOT EXISTS ("
        "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objid = {lock})",
    ),
    "mysql": (
        "GET_LOCK('{tag}', 0) = 1 AND (@snapshotter_leak := 1) = 1",
        "@snapshotter_leak IS NULL AND IS_FREE_LOCK('{tag}') = 1",
    ),
}


def _lock_free(src: Source, cap: Capture, lock: int, tag: str) -> bool:
    """From another session: nobody holds the test's advisory lock / GET_LOCK lock."""
    if src.name == "postgres":
        held = cap.sql(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = %s", (lock,)
        )
        return int(held[0][0]) == 0
    return cap.sql("SELECT IS_FREE_LOCK(%s)", (tag,)) == [(1,)]


@BOTH
def test_a_filters_session_state_does_not_reach_later_reads(
    request: pytest.FixtureRequest, name: str
) -> None:
    """Issue 15: pg_advisory_lock / GET_LOCK in a filter stayed held for the engine's life,
    and settings and variables stayed on the reused chunk connection. After a filtered chunk
    (and max-key query) the session is reset: the next table's filter sees none of it, and
    another session sees the lock free while the engine still runs."""
    src = source_named(request, name)
    # One chunk connection: a's filter takes a lock with GET_LOCK(..., 0) /
    # pg_try_advisory_lock, which a second connection reading a's next chunk at the same
    # moment could not get (its rows would not match).
    cap = src.capture(chunk_size=2, extra_config="read_parallelism = 1")
    _tables(src, cap, "a", "b", rows=5)
    cap.init()
    lock, tag = int(time.time_ns() % 1_000_000_000), f"snap_{cap.schema}"
    leave, check = (f.format(lock=lock, tag=tag) for f in FILTERS[name])
    a, b = qualified(cap, "a"), qualified(cap, "b")
    cap.execute(a, b, filters=[f"{a}={leave}", f"{b}={check}"])
    free_between: list[bool] = []

    def before_b(task: Any) -> None:
        if task.table.table == "b" and not free_between:
            free_between.append(_lock_free(src, cap, lock, tag))

    from snapshotter.engine.workers import PhaseHooks

    assert cap.run(hooks=PhaseHooks(before_open=before_b), timeout=60) == 0
    assert progress(cap, "a")["rows"] == 5
    assert sorted(reads(cap, "b")) == sorted(f'{{"id": {i}}}' for i in range(1, 6))
    assert free_between == [True]


# --- time limits and cancellation ------------------------------------------------------------


@BOTH
def test_a_slow_filter_fails_its_snapshot_at_chunk_timeout_and_the_stream_goes_on(
    request: pytest.FixtureRequest, name: str
) -> None:
    """Issue 15: a filter with pg_sleep(3600) / SLEEP(3600) ran without a statement timeout.
    Now the query is cancelled at chunk_timeout_s, that snapshot fails with the reason and the
    fix, the next table is snapshotted and the log keeps flowing."""
    src = source_named(request, name)
    cap = src.capture(extra_config="chunk_timeout_s = 1")
    _tables(src, cap, "a", "b")
    cap.init()
    src.sql(cap, "INSERT INTO {s}.b VALUES (100, 1000)")  # a log event, read while a waits
    a, b = qualified(cap, "a"), qualified(cap, "b")
    cap.execute(a, b, filters=[f"{a}={SLEEP[name]}"])
    started = time.monotonic()
    assert cap.run(timeout=60) == 2
    assert time.monotonic() - started < 30
    failed = progress(cap, "a")
    assert failed["state"] == "failed"
    assert f"on table {a} ran longer than chunk_timeout_s = 1 s" in failed["error"], failed
    assert "raise [source] chunk_timeout_s" in failed["error"]
    assert progress(cap, "b")["state"] == "done"
    assert {op(e) for e in events(cap, "b")} == {"r", "c"}
    assert _sleeping(src, cap) == 0


@BOTH
def test_stop_snapshot_cancels_a_sleeping_filter(request: pytest.FixtureRequest, name: str) -> None:
    """Issue 15: stop-snapshot did not cancel a filter's running query. Now the query is
    cancelled within seconds, the snapshot is stopped (not failed), the next table runs."""
    src = source_named(request, name)
    cap = src.capture()  # chunk_timeout_s: the default 300 s
    _tables(src, cap, "a", "b")
    cap.init()
    a, b = qualified(cap, "a"), qualified(cap, "b")
    cap.execute(a, b, filters=[f"{a}={SLEEP[name]}"])
    engine = cap.start(until_caught_up=True)
    wait_for(lambda: _sleeping(src, cap) == 1, "the filter's query", timeout=30, engine=engine)
    stopped_at = time.monotonic()
    assert cap.cli("signal", "stop-snapshot", a) == 0
    assert engine.join(30) == 2  # a stopped
    assert time.monotonic() - stopped_at < 10
    stopped = progress(cap, "a")
    assert stopped["state"] == "stopped" and not stopped.get("error"), stopped
    assert progress(cap, "b")["state"] == "done"
    assert _sleeping(src, cap) == 0


@BOTH
def test_sigterm_stops_the_engine_within_seconds_with_a_sleeping_filter(
    request: pytest.FixtureRequest, name: str
) -> None:
    """Issue 15: SIGTERM was ignored until the filter's query ended. Now `snapshotter run`
    cancels it and exits within seconds, state saved, the snapshot left to resume (not
    failed, not counted as a source outage)."""
    src = source_named(request, name)
    cap = src.capture()
    _tables(src, cap, "a")
    cap.init()
    a = qualified(cap, "a")
    cap.execute(a, filters=[f"{a}={SLEEP[name]}"])
    run = subprocess.Popen(
        _cli(cap, "run"), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        wait_for(
            lambda: _sleeping(src, cap) == 1 or run.poll() is not None,
            "the filter's query",
            timeout=60,
        )
        assert run.poll() is None, run.communicate()[0]
        time.sleep(0.5)
        signalled = time.monotonic()
        run.send_signal(signal.SIGTERM)
        output, _ = run.communicate(timeout=30)
        took = time.monotonic() - signalled
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert took < 10, output
    assert run.returncode == 2, output  # ended with the snapshot unfinished
    left = progress(cap, "a")
    assert left["state"] == "pending" and not left.get("error"), (left, output)
    assert "unreachable" not in output and "failed" not in output, output
    assert _sleeping(src, cap) == 0


# --- the client-side watchdog (a query the server's timeout does not stop) ---------------------


def test_the_watchdog_cancels_a_postgres_query_without_a_server_timeout(pg_url: str) -> None:
    """The chunk connection's own cancel (the ADBC driver's cancel request)."""
    guard = QueryGuard(grace_s=0.2)
    dialect = postgres.PostgresDialect(pg_url, TableId("x", "y"), "unused")
    try:
        conn = dialect._connection()
        conn.script("SET statement_timeout = 0")
        started = time.monotonic()
        with (
            pytest.raises(pg_arrow.AdbcError) as error,
            guard.running(0.3, conn.cancel) as query,
        ):
            conn.fetch("SELECT pg_sleep(30)")
        assert error.value.sqlstate == "57014"  # query_canceled
        assert time.monotonic() - started < 5
        assert query.outcome is Outcome.TIMED_OUT
        assert conn.fetch("SELECT 1 AS one").column(0).to_pylist() == [1]  # still works
    finally:
        dialect.close()
        guard.close()


def test_the_watchdog_kills_a_mysql_query_without_a_server_timeout(mysql_url: str) -> None:
    """KILL QUERY from a connection of its own. MariaDB fails the statement (1317); MySQL
    lets a bare SLEEP return 1 without an error: the outcome, not the driver, says the query
    was cancelled, and the dialect fails the read either way."""
    dialect = MySqlDialect(mysql_url, signal_table=TableId("x", "y"))
    guard = QueryGuard(grace_s=0.2)
    conn = mysql_connect(mysql_url)
    try:
        started = time.monotonic()
        kill = partial(dialect._kill_query, conn.thread_id())
        with guard.running(0.3, kill) as query, conn.cursor() as cur:
            try:
                cur.execute("SELECT SLEEP(30)")
                assert cur.fetchall() == ((1,),)
            except pymysql.err.OperationalError as exc:
                assert exc.args[0] == 1317
        assert time.monotonic() - started < 5
        assert query.outcome is Outcome.TIMED_OUT
    finally:
        conn.close()
        dialect.close()
        guard.close()


# --- init warnings --------------------------------------------------------------------------


@pytest.fixture
def dblink(pg_engine: sa.Engine, pg_schema: str) -> Iterator[None]:
    with pg_engine.begin() as conn:
        conn.exec_driver_sql(f'CREATE EXTENSION dblink SCHEMA "{pg_schema}"')
    try:
        yield
    finally:
        with pg_engine.begin() as conn:
            conn.exec_driver_sql("DROP EXTENSION IF EXISTS dblink")


def test_init_warns_of_a_superuser_and_of_dblink(
    pg_engine: sa.Engine, dblink: None, request: pytest.FixtureRequest
) -> None:
    """Issue 15: a dblink call in a filter wrote despite READ ONLY, and nothing warned that
    the engine's role (a superuser on the test server) lends its powers to filters."""
    with pg_engine.connect() as conn:
        problems = pg_setup.check_filter_reach(conn)
    assert [p.severity for p in problems] == ["warning", "warning"], problems
    superuser, reach = problems
    assert "is a superuser" in superuser.what and "signal table" in superuser.what
    assert "pg_read_file" in superuser.what
    assert "dblink is installed" in reach.what and "READ ONLY" in reach.what
    assert "not a superuser" in superuser.fix and "DROP EXTENSION dblink" in reach.fix
    # And `init` shows them, as warnings: it still succeeds.
    src = source_named(request, "postgres")
    cap = src.capture()
    assert cap.cli("init") == 0


def test_init_warns_of_a_mysql_user_with_file_or_all_privileges(
    mysql_engine: sa.Engine, capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest
) -> None:
    problems = my_setup.check_prerequisites(mysql_engine, client_server_id=None)
    (reach,) = [p for p in problems if "snapshot filters" in p.what]
    assert reach.severity == "warning"
    assert "holds ALL PRIVILEGES on *.*" in reach.what and "LOAD_FILE" in reach.what
    src = source_named(request, "mysql")
    cap = src.capture()
    assert cap.cli("init") == 0
    assert "snapshot filters (SQL from the signal table)" in capsys.readouterr().err

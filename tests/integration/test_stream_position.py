"""Stream-position health against the real servers: a saved slot or binlog position that is
gone stops `run` with the way out (never a silent start elsewhere), `reset-stream` plus a new
snapshot converge again, `status` warns before it comes to that, and `teardown` drops what
`init` created.

Purging binlogs would break the other tests that share the MariaDB server, so the purge test
starts a MariaDB of its own (scripts/services in local mode, its own directory and port).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from snapshotter.engine.workers import PhaseHooks
from snapshotter.sources.postgres import setup as pg_setup
from tests.integration.engine_harness import Capture, CaptureFactory, EngineThread, mysql_connect

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ROWS = 300


# --- helpers ---------------------------------------------------------------------------------


def cli(
    cap: Capture, *args: str, env: dict[str, str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """``python -m snapshotter.app.cli COMMAND -c CONF ARGS...`` as a user runs it (no terminal:
    stdin is /dev/null)."""
    environ = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "snapshotter.app.cli",
            args[0],
            "-c",
            str(cap.config_path),
            *args[1:],
        ],
        cwd=REPO,
        env=environ,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def state(cap: Capture) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(
        (cap.directory / "state" / "state.json").read_text(encoding="utf-8")
    )
    return loaded


def status_json(cap: Capture, env: dict[str, str] | None = None, code: int = 0) -> dict[str, Any]:
    """``status --json``'s report; ``code`` the exit expected (1: the source does not answer)."""
    done = cli(cap, "status", "--json", env=env)
    assert done.returncode == code, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def wait_for(
    predicate: Callable[[], bool],
    what: str,
    timeout: float = 60,
    engine: EngineThread | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if engine is not None and not engine.thread.is_alive():
            engine.join()  # raises the engine's error
            raise AssertionError(f"the engine ended while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def create_items(cap: Capture, rows: int = ROWS) -> str:
    """``items (id, v)`` with ``rows`` rows; returns its qualified name."""
    if cap.kind == "mysql":
        cap.sql(f"CREATE TABLE `{cap.schema}`.items (id int PRIMARY KEY, v varchar(40))")
        for start in range(1, rows + 1, 1000):
            values = ", ".join(f"({i}, 'v{i}')" for i in range(start, min(start + 1000, rows + 1)))
            cap.sql(f"INSERT INTO `{cap.schema}`.items VALUES {values}")
    else:
        cap.sql(f'CREATE TABLE "{cap.schema}".items (id int PRIMARY KEY, v text)')
        cap.sql(f'ALTER TABLE "{cap.schema}".items REPLICA IDENTITY FULL')  # TOAST-able v
        cap.sql(
            f"INSERT INTO \"{cap.schema}\".items SELECT g, 'v' || g "
            f"FROM generate_series(1, {rows}) g"
        )
    return f"{cap.schema}.items"


def change_items(cap: Capture, first: int, last: int, tag: str) -> None:
    """Insert ids first..last and update a few older rows (no deletes: a new snapshot
    re-emits rows that exist, it cannot delete rows deleted meanwhile)."""
    q = f"`{cap.schema}`" if cap.kind == "mysql" else f'"{cap.schema}"'
    values = ", ".join(f"({i}, '{tag}{i}')" for i in range(first, last + 1))
    cap.sql(f"INSERT INTO {q}.items VALUES {values}")
    cap.sql(f"UPDATE {q}.items SET v = '{tag}' WHERE id <= 20")


def snapshot_and_converge(cap: Capture, table: str) -> None:
    cap.execute(table)
    assert cap.run() == 0
    verdict = cap.verify("items")
    assert verdict.ok, verdict.render()


def slot_row(cap: Capture) -> tuple[Any, ...] | None:
    rows = cap.sql(
        "SELECT active, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
        (cap.slot,),
    )
    return rows[0] if rows else None


def assert_lost_message(output: str, cap: Capture, table: str, *what: str) -> None:
    assert "error: " in output, output
    for phrase in what:
        assert phrase in output, (phrase, output)
    assert "cannot be read any more" in output, output
    assert f"snapshotter reset-stream -c {cap.config_path}" in output, output
    assert f"snapshotter signal -c {cap.config_path} execute-snapshot {table}" in output, output


def recover(cap: Capture, table: str, after_reset: tuple[int, int]) -> str:
    """reset-stream: refused without --yes off a terminal, done with it; then changes, and
    the log alone misses what happened before the reset, a new snapshot converges."""
    refused = cli(cap, "reset-stream")
    assert refused.returncode == 2, refused.stderr
    assert "pass --yes" in refused.stderr and "nothing was changed" in refused.stderr
    reset = cli(cap, "reset-stream", "--yes")
    assert reset.returncode == 0, reset.stderr
    assert f"execute-snapshot {table}" in reset.stdout, reset.stdout
    change_items(cap, *after_reset, tag="after")
    assert cap.run() == 0
    missing = cap.verify("items")
    assert not missing.ok, "the changes made while the position was lost cannot be in the output"
    signal = cli(cap, "signal", "execute-snapshot", table)
    assert signal.returncode == 0, signal.stderr
    assert cap.run() == 0
    verdict = cap.verify("items")
    assert verdict.ok, verdict.render()
    return reset.stdout


# --- PostgreSQL: the slot ------------------------------------------------------------------------


def test_pg_a_dropped_slot_stops_run_and_reset_stream_with_a_new_snapshot_converges(
    capture: CaptureFactory,
) -> None:
    cap = capture()
    table = create_items(cap)
    cap.init()
    snapshot_and_converge(cap, table)
    saved = state(cap)["stream"]
    change_items(cap, ROWS + 1, ROWS + 100, tag="gap")  # while nothing runs
    pg_setup.drop_slot(cap.url, cap.slot)

    run = cli(cap, "run", "--until-caught-up")
    assert run.returncode == 1, run.stderr
    assert_lost_message(
        run.stderr, cap, table, f"replication slot '{cap.slot}' does not exist", "LSN "
    )
    assert state(cap)["stream"] == saved  # nothing moved
    resume = cli(cap, "resume", "--until-caught-up")
    assert resume.returncode == 1 and "does not exist" in resume.stderr, resume.stderr
    assert slot_row(cap) is None  # and no slot was created behind the user's back

    out = recover(cap, table, (ROWS + 101, ROWS + 150))
    assert f"replication slot {cap.slot}: created at LSN" in out
    assert state(cap)["stream"]["resume"]["lsn"] > saved["resume"]["lsn"]
    print(f"\nreset-stream printed:\n{out}")


def test_pg_a_slot_created_again_by_init_is_ahead_of_the_state(capture: CaptureFactory) -> None:
    """The slot is dropped mid-snapshot and init creates it again: its position is later
    than the state's, so PostgreSQL would skip what lies between; run refuses, and
    reset-stream stops the unfinished snapshot."""
    cap = capture(chunk_size=200)
    table = create_items(cap, 4000)
    cap.init()
    cap.execute(table)
    # Slow chunks (0.3 s each, two in flight: about 3 s for the 20): the snapshot is still
    # running when the state file first shows two chunks done.
    engine = cap.start(hooks=PhaseHooks(before_open=lambda task: time.sleep(0.3)))
    wait_for(
        lambda: (
            (cap.directory / "state" / "state.json").exists()
            and any(s["chunk_id"] >= 2 for s in state(cap)["snapshots"])
        ),
        "two chunks",
        engine=engine,
    )
    engine.stop()
    assert state(cap)["snapshots"][0]["status"] == "running"
    change_items(cap, 4001, 4100, tag="gap")
    pg_setup.drop_slot(cap.url, cap.slot)

    init = cli(cap, "init")
    assert init.returncode == 0, init.stderr
    assert f"replication slot {cap.slot}: created" in init.stdout
    assert "cannot resume" in init.stderr and "after the state's position" in init.stderr

    resume = cli(cap, "resume", "--until-caught-up")
    assert resume.returncode == 1, resume.stderr
    assert_lost_message(resume.stderr, cap, table, "after the state's position", "created again")
    report = status_json(cap)
    assert any("after the state's position" in w for w in report["warnings"]), report

    recover(cap, table, (4101, 4120))
    first = state(cap)["snapshots"][0]
    assert first["status"] == "stopped"
    assert "reset-stream" in first["error"], first


def test_pg_status_warns_of_retained_wal_a_missing_slot_and_an_unreachable_server(
    capture: CaptureFactory,
) -> None:
    cap = capture(extra_config="backlog_warn_mb = 0")
    table = create_items(cap)
    cap.init()
    snapshot_and_converge(cap, table)
    assert status_json(cap)["stream"]["lag_bytes"] is not None
    change_items(cap, ROWS + 1, ROWS + 500, tag="behind")

    text = cli(cap, "status")
    assert text.returncode == 0, text.stderr
    assert "warning: replication slot" in text.stdout and "of WAL" in text.stdout, text.stdout
    (warning,) = status_json(cap)["warnings"]
    assert "source.backlog_warn_mb = 0" in warning and "engine is not running" in warning
    assert f"snapshotter run -c {cap.config_path}" in warning

    down = {"SNAPSHOTTER_SOURCE_URL": "postgresql://snapshotter:x@127.0.0.1:1/snapshotter"}
    report = status_json(cap, env=down, code=1)  # the report, and exit 1
    (warning,) = report["warnings"]
    assert warning.startswith("could not check the replication slot at"), warning
    assert report["stream"]["lag_bytes"] is None and report["snapshots"]
    assert report["source_reachable"] is False

    pg_setup.drop_slot(cap.url, cap.slot)
    (warning,) = status_json(cap)["warnings"]
    assert "does not exist" in warning and "reset-stream" in warning, warning


def test_pg_teardown_drops_slot_publication_and_signal_table_but_never_under_an_engine(
    capture: CaptureFactory, tmp_path: Path
) -> None:
    cap = capture()
    create_items(cap)
    cap.init()
    engine = cap.start()
    wait_for(lambda: (slot_row(cap) or (False,))[0] is True, "the slot to be streamed")

    # This state directory: the engine holds its lock (reset-stream is refused as well).
    assert cap.cli("teardown", "--yes") == 1
    assert cap.cli("reset-stream", "--yes") == 1
    # Another state directory, the same slot: the slot is active.
    busy = cli(cap, "teardown", "--yes", env={"SNAPSHOTTER_STATE_DIR": str(tmp_path / "other")})
    assert busy.returncode == 1, busy.stderr
    assert "is in use" in busy.stderr and "nothing was dropped" in busy.stderr, busy.stderr
    assert slot_row(cap) is not None
    assert engine.stop() == 0

    refused = cli(cap, "teardown")
    assert refused.returncode == 2 and "pass --yes" in refused.stderr, refused.stderr
    assert slot_row(cap) is not None

    done = cli(cap, "teardown", "--yes")
    assert done.returncode == 0, done.stderr
    signal_table = f"{cap.schema}.debezium_signal"
    assert f"replication slot {cap.slot}: dropped" in done.stdout, done.stdout
    assert f"publication {cap.publication}: dropped" in done.stdout
    assert f"signal table {signal_table}: dropped" in done.stdout
    assert "still refers to the old stream position" in done.stdout
    assert slot_row(cap) is None
    assert not cap.sql("SELECT 1 FROM pg_publication WHERE pubname = %s", (cap.publication,))
    assert cap.sql("SELECT to_regclass(%s)", (signal_table,)) == [(None,)]

    again = cli(cap, "teardown", "--yes")
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("already gone") == 3, again.stdout
    print(f"\nteardown printed:\n{done.stdout}\nand again:\n{again.stdout}")


# --- MySQL / MariaDB (shared server: nothing purged) -------------------------------------------


def test_mysql_status_warns_of_binlog_backlog_with_the_retention(
    mysql_capture: CaptureFactory,
) -> None:
    cap = mysql_capture(extra_config="backlog_warn_mb = 0")
    table = create_items(cap)
    cap.init()
    snapshot_and_converge(cap, table)
    change_items(cap, ROWS + 1, ROWS + 500, tag="behind")

    text = cli(cap, "status")
    assert text.returncode == 0, text.stderr
    assert "warning:" in text.stdout and "of binlog after the saved position" in text.stdout
    (warning,) = status_json(cap)["warnings"]
    assert "source.backlog_warn_mb = 0" in warning, warning
    assert "binlog_expire_logs_seconds" in warning or "expire_logs_days" in warning, warning
    assert f"snapshotter run -c {cap.config_path}" in warning

    down = {"SNAPSHOTTER_SOURCE_URL": f"mysql://snapshotter:x@127.0.0.1:1/{cap.schema}"}
    report = status_json(cap, env=down, code=1)  # the report, and exit 1
    (warning,) = report["warnings"]
    assert warning.startswith("could not check the binlog at"), warning
    assert report["stream"]["lag_bytes"] is None


def test_mysql_teardown_drops_the_signal_table_but_never_under_an_engine(
    mysql_capture: CaptureFactory,
) -> None:
    cap = mysql_capture()
    create_items(cap)
    cap.init()
    engine = cap.start()
    wait_for(lambda: (cap.directory / "state" / "state.json.lock").exists(), "the engine")
    time.sleep(0.5)
    assert cap.cli("teardown", "--yes") == 1  # the engine holds the state's lock
    assert engine.stop() == 0

    refused = cli(cap, "teardown")
    assert refused.returncode == 2 and "pass --yes" in refused.stderr, refused.stderr
    done = cli(cap, "teardown", "--yes")
    assert done.returncode == 0, done.stderr
    assert f"signal table {cap.schema}.debezium_signal: dropped" in done.stdout, done.stdout
    assert "replication slot" not in done.stdout
    tables = cap.sql(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
        (cap.schema,),
    )
    assert [t[0] for t in tables] == ["items"]
    again = cli(cap, "teardown", "--yes")
    assert again.returncode == 0 and again.stdout.count("already gone") == 1, again.stdout


# --- MySQL / MariaDB: a purged binlog (a server of this test's own) ------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def private_mariadb() -> Iterator[str]:
    """A MariaDB of this test's own: its binlogs can be purged without touching the
    server other tests share. Its directory is outside pytest's (mode 700) tmp directory,
    because mariadbd runs as the mysql user."""
    directory = Path(tempfile.mkdtemp(prefix="snapshotter-mariadb-"))
    env = {
        **{k: v for k, v in os.environ.items() if k != "SNAPSHOTTER_MYSQL_URL"},
        "SNAPSHOTTER_SERVICES_MODE": "local",
        "SNAPSHOTTER_SERVICES_DIR": str(directory),
        "SNAPSHOTTER_MYSQL_PORT": str(_free_port()),
    }

    def services(action: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(REPO / "scripts" / "services"), action, "mysql"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    up = services("up")
    try:
        assert up.returncode == 0, f"scripts/services up mysql: {up.stderr[-3000:]}"
        yield up.stdout.strip().splitlines()[-1]
    finally:
        down = services("down")
        shutil.rmtree(directory, ignore_errors=True)
        assert down.returncode == 0, down.stderr[-3000:]


def test_mysql_a_purged_binlog_stops_run_and_reset_stream_with_a_new_snapshot_converges(
    private_mariadb: str, tmp_path: Path
) -> None:
    from snapshotter.sources.mysql.decoder import BinlogDecoder
    from snapshotter.sources.mysql.dialect import MySqlDialect
    from snapshotter.sources.mysql.reader import BinlogLogReader, BinlogReaderError
    from snapshotter.sources.positions import StreamPositionLost

    database = f"t_{uuid.uuid4().hex[:12]}"
    admin = mysql_connect(private_mariadb)
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{database}` CHARACTER SET utf8mb4")
    url = sa.make_url(private_mariadb).set(database=database).render_as_string(False)
    (tmp_path / "cap").mkdir()
    cap = Capture(url, database, tmp_path / "cap", kind="mysql")
    table = create_items(cap)
    cap.init()
    snapshot_and_converge(cap, table)
    saved = state(cap)["stream"]
    change_items(cap, ROWS + 1, ROWS + 100, tag="gap")  # while nothing runs
    gone = saved["resume"]["file"]
    with admin.cursor() as cur:
        cur.execute("FLUSH BINARY LOGS")
        cur.execute("SHOW BINARY LOGS")
        newest = cur.fetchall()[-1][0]
        assert gone != newest

        def purged() -> bool:
            # A file a binlog dump thread still reads is kept (with a warning): the last
            # run's reader may not have been seen to leave yet.
            cur.execute(f"PURGE BINARY LOGS TO '{newest}'")
            cur.execute("SHOW BINARY LOGS")
            return gone not in [row[0] for row in cur.fetchall()]

        wait_for(purged, f"{gone} to be purged", timeout=60)

    run = cli(cap, "run", "--until-caught-up")
    assert run.returncode == 1, run.stderr
    assert_lost_message(run.stderr, cap, table, f"binlog file {gone} is no longer", "purged")
    assert state(cap)["stream"] == saved
    (warning,) = status_json(cap)["warnings"]
    assert "no longer on the server" in warning and "reset-stream" in warning, warning
    init = cli(cap, "init")
    assert init.returncode == 0 and "cannot resume" in init.stderr, init.stderr

    # What `run` would meet mid-stream: the reader's error carries the same advice.
    dialect = MySqlDialect(url, signal_table=cap.table_id("debezium_signal"))
    decoder = BinlogDecoder("test", captured=lambda t: True, key_columns=lambda t: None)
    reader = BinlogLogReader(
        dialect.connect_args(),
        server_id=random.randrange(100_000, 2_000_000_000),
        decoder=decoder,
        start=saved["resume"],
    )
    try:
        with pytest.raises(BinlogReaderError) as raised:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                reader.read(0.5)
    finally:
        reader.close()
        dialect.close()
    assert isinstance(raised.value.__cause__, StreamPositionLost)
    assert "snapshotter reset-stream -c CONF" in str(raised.value)

    out = recover(cap, table, (ROWS + 101, ROWS + 150))
    assert f"binlog position: the current end, {newest}" in out, out
    print(f"\nrun refused with:\n{run.stderr}\nreset-stream printed:\n{out}")

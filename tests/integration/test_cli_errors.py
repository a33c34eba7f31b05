"""Errors a user can cause, on the real servers: each is one or two lines on stderr naming
what, where and the fix; no traceback (only with -v); never the password.

The CLI runs as a subprocess, as a user runs it: what it prints is what is checked.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import REPO
from tests.integration.engine_harness import Capture

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Said:
    code: int
    stdout: str
    stderr: str

    @property
    def errors(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("error:")]


def cli(config: Path, *args: str, timeout: float = 120, verbose: bool = False) -> Said:
    """``snapshotter COMMAND -c CONFIG ARGS...`` as a subprocess (stdin not a terminal)."""
    command, *rest = args
    argv = [sys.executable, "-m", "snapshotter.app.cli", command, "-c", str(config)]
    if verbose:
        argv.append("-v")
    argv += rest
    env = {k: v for k, v in os.environ.items() if k != "SNAPSHOTTER_FAULTS"}
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    return Said(done.returncode, done.stdout, done.stderr)


def assert_clear(said: Said, secret: str, *, lines: int = 2) -> str:
    """A failure said in at most ``lines`` error lines, without a traceback or ``secret``."""
    everything = said.stdout + said.stderr
    assert said.code != 0, everything
    assert "Traceback" not in everything, everything
    assert secret not in everything, everything
    assert said.errors, everything
    said_lines = [line for line in said.stderr.strip().splitlines() if not _LOG_LINE.match(line)]
    assert 1 <= len(said_lines) <= lines, said.stderr
    return said.errors[-1]


# The engine's log lines (run, resume): the error is said apart from them.
_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO|WARNING|ERROR) ")


def write_config(directory: Path, kind: str, url: str, schema: str, extra: str = "") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:10]
    if kind == "mysql":
        capture = f"server_id = {random.randrange(100_000, 2_000_000_000)}"
    else:
        capture = f'slot = "s_{tag}"\npublication = "p_{tag}"'
    path = directory / "snapshotter.toml"
    path.write_text(
        f"""
[source]
kind = "{kind}"
url = "{url}"
tables = ["{schema}.*"]
signal_table = "{schema}.debezium_signal"
chunk_size = 100
{capture}
{extra}
[sink]
kind = "jsonl"
path = "events.jsonl"

[state]
dir = "state"
""",
        encoding="utf-8",
    )
    return path


def secret() -> str:
    return f"Pw{uuid.uuid4().hex[:12]}"


def closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def with_password(url: str, password: str, **changes: Any) -> str:
    return sa.make_url(url).set(password=password, **changes).render_as_string(hide_password=False)


# --- wrong password, unreachable port, malformed URL -------------------------------------------

COMMANDS: list[tuple[str, ...]] = [
    ("init",),
    ("run", "--until-caught-up"),
    ("resume", "--until-caught-up"),
    ("verify", "t"),
    ("verify",),
    ("reset-stream", "--yes"),
    ("teardown", "--yes"),
    ("signals",),
]


def _bad_urls(url: str, password: str) -> dict[str, str]:
    parsed = sa.make_url(url)
    return {
        "wrong password": with_password(url, password),
        "unreachable port": with_password(url, password, port=closed_port()),
        "malformed": f"{parsed.drivername}://{parsed.username}:{password}@{parsed.host}:notaport/x",
    }


@pytest.mark.parametrize("fault", ["wrong password", "unreachable port", "malformed"])
def test_postgres_connection_faults_are_one_line(
    pg_url: str, pg_schema: str, tmp_path: Path, fault: str
) -> None:
    password = secret()
    url = _bad_urls(pg_url, password)[fault]
    config = write_config(tmp_path, "postgres", url, pg_schema)
    for command in COMMANDS:
        said = cli(config, *command, timeout=60)
        line = assert_clear(said, password)
        if fault == "malformed":
            assert "source.url" in line and "cannot be parsed" in line, line
            assert "USER:PASSWORD@HOST:PORT/DATABASE" in line, line
        elif command[0] != "resume":  # resume without state says there is nothing to resume
            assert "cannot connect to the source at" in line, (command, line)
            assert "check source.url" in line, line
            assert "***" in line, line  # the URL is named, its password masked
    said = cli(config, "signal", "execute-snapshot", "t", timeout=60)
    assert_clear(said, password)
    status = cli(config, "status", timeout=60)  # the saved state, then the error: exit 1
    assert "Traceback" not in status.stderr + status.stdout
    assert password not in status.stderr + status.stdout
    if fault != "malformed":
        assert status.code == 1, status
        assert "cannot connect to the source at" in assert_clear(status, password)


@pytest.mark.parametrize("fault", ["wrong password", "unreachable port", "malformed"])
def test_mysql_connection_faults_are_one_line(
    mysql_url: str, mysql_db: str, tmp_path: Path, fault: str
) -> None:
    password = secret()
    url = _bad_urls(
        sa.make_url(mysql_url).set(database=mysql_db).render_as_string(hide_password=False),
        password,
    )
    config = write_config(tmp_path, "mysql", url[fault], mysql_db)
    for command in (("init",), ("run", "--until-caught-up"), ("verify", "t"), ("signals",)):
        line = assert_clear(cli(config, *command, timeout=60), password)
        if fault != "malformed":
            assert "cannot connect to the source at" in line, (command, line)


def test_a_password_in_the_url_query_is_masked_too(
    pg_url: str, pg_schema: str, tmp_path: Path
) -> None:
    """libpq takes ``?password=``; SQLAlchemy's own masking leaves it in the query."""
    password = secret()
    parsed = sa.make_url(pg_url)
    url = f"postgresql://{parsed.username}@{parsed.host}:{parsed.port}/{parsed.database}"
    config = write_config(tmp_path, "postgres", f"{url}?password={password}", pg_schema)
    for command in (("init",), ("run", "--until-caught-up"), ("verify", "t")):
        assert "password=***" in assert_clear(cli(config, *command), password)
    status = cli(config, "status")
    assert password not in status.stdout + status.stderr
    assert "password=***" in status.stdout + status.stderr


def test_verbose_shows_the_traceback_without_the_password(
    pg_url: str, pg_schema: str, tmp_path: Path
) -> None:
    password = secret()
    config = write_config(tmp_path, "postgres", with_password(pg_url, password), pg_schema)
    said = cli(config, "run", "--until-caught-up", verbose=True)
    assert said.code != 0
    assert "Traceback" in said.stderr, said.stderr
    assert password not in said.stderr + said.stdout


def test_a_mysql_url_without_a_database_does_not_print_the_password(
    mysql_url: str, tmp_path: Path
) -> None:
    password = secret()
    parsed = sa.make_url(mysql_url)
    url = f"mysql://{parsed.username}:{password}@{parsed.host}:{parsed.port}"
    config = write_config(tmp_path, "mysql", url, "db")
    for command in (("init",), ("run",), ("status",), ("verify", "t")):
        line = assert_clear(cli(config, *command), password)
        assert "names no database" in line and "source.url" in line, line


# --- users without the privileges ---------------------------------------------------------------


@pytest.fixture
def pg_role(pg_engine: sa.Engine, pg_schema: str) -> Iterator[tuple[str, str]]:
    """A login role that may use the test's schema but not create in it (and has no
    REPLICATION): (name, password)."""
    name, password = f"r_{uuid.uuid4().hex[:10]}", secret()
    with pg_engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'")
        conn.exec_driver_sql(f'GRANT USAGE ON SCHEMA "{pg_schema}" TO {name}')
    yield name, password
    with pg_engine.begin() as conn:
        conn.exec_driver_sql(f"DROP OWNED BY {name}")
        conn.exec_driver_sql(f"DROP ROLE {name}")


def test_init_as_a_postgres_role_without_create(
    pg_url: str, pg_schema: str, pg_role: tuple[str, str], tmp_path: Path
) -> None:
    name, password = pg_role
    url = with_password(pg_url, password, username=name)
    config = write_config(tmp_path, "postgres", url, pg_schema)
    said = cli(config, "init")
    # The signal table and the other prerequisites, each with its fix, then one error line.
    assert_clear(said, password, lines=12)
    assert f"cannot create the signal table {pg_schema}.debezium_signal" in said.stderr
    assert f'GRANT CREATE ON SCHEMA "{pg_schema}" TO "{name}"' in said.stderr
    assert "REPLICATION" in said.stderr  # the prerequisite check ran too
    assert said.errors[-1].endswith(
        "prerequisites not met; fix the errors above and run init again"
    )
    line = assert_clear(cli(config, "run", "--until-caught-up"), password)
    assert "REPLICATION" in line and "snapshotter init" in line, line


@pytest.fixture
def mysql_select_user(mysql_engine: sa.Engine, mysql_db: str) -> Iterator[tuple[str, str]]:
    """A user with SELECT on the test's database only: (name, password)."""
    name, password = f"u_{uuid.uuid4().hex[:10]}", secret()
    with mysql_engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE USER '{name}'@'%%' IDENTIFIED BY '{password}'")
        conn.exec_driver_sql(f"GRANT SELECT ON `{mysql_db}`.* TO '{name}'@'%%'")
    yield name, password
    with mysql_engine.begin() as conn:
        conn.exec_driver_sql(f"DROP USER IF EXISTS '{name}'@'%%'")


def test_init_and_run_as_a_select_only_mysql_user(
    mysql_url: str, mysql_db: str, mysql_select_user: tuple[str, str], tmp_path: Path
) -> None:
    name, password = mysql_select_user
    url = with_password(mysql_url, password, username=name, database=mysql_db)
    config = write_config(tmp_path, "mysql", url, mysql_db)
    said = cli(config, "init")
    assert_clear(said, password, lines=12)
    assert f"cannot create the signal table {mysql_db}.debezium_signal" in said.stderr
    assert f"GRANT CREATE, INSERT, SELECT ON `{mysql_db}`.* TO '{name}'@'%'" in said.stderr
    assert "REPLICATION SLAVE" in said.stderr  # the prerequisite check ran too
    line = assert_clear(cli(config, "run", "--until-caught-up"), password)
    assert "refused a privilege" in line and "grant it" in line, line


# --- a full disk ----------------------------------------------------------------------------------


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A directory on a small tmpfs, filled up (root may mount one; skipped where it cannot)."""
    mount = tmp_path / "full"
    mount.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("a tmpfs needs root and mount(8)")
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        (mount / "state").mkdir()
        fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            for size in (65536, 512):
                try:
                    while os.write(fd, b"\0" * size):
                        pass
                except OSError:
                    pass  # full, at this write size
        finally:
            os.close(fd)
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _table(cap: Capture, rows: int) -> None:
    cap.sql(f'CREATE TABLE "{cap.schema}".t (id int PRIMARY KEY, v text)')
    cap.sql(f'ALTER TABLE "{cap.schema}".t REPLICA IDENTITY FULL')
    cap.sql(
        f'INSERT INTO "{cap.schema}".t '
        f"SELECT g, repeat('x', 200) FROM generate_series(1, {rows}) g"
    )


def test_a_full_disk_under_the_state_names_the_state_file(capture: Any, full_disk: Path) -> None:
    cap: Capture = capture(state_config="")
    _table(cap, 10)
    cap.init()
    text = cap.config_path.read_text(encoding="utf-8")
    cap.config_path.write_text(
        text.replace('dir = "state"', f'dir = "{full_disk / "state"}"'), encoding="utf-8"
    )
    said = cli(cap.config_path, "run", "--until-caught-up")
    line = assert_clear(said, "snapshotter:snapshotter@")
    assert f"no space left on the device holding the state file {full_disk}/state/state.json" in (
        line
    ), line
    assert "[state] dir" in line and "snapshotter resume" in line, line


def test_a_full_disk_under_the_sink_names_the_sink_file(capture: Any, full_disk: Path) -> None:
    cap: Capture = capture()
    _table(cap, 2000)
    cap.init()
    text = cap.config_path.read_text(encoding="utf-8")
    cap.config_path.write_text(
        text.replace('path = "events.jsonl"', f'path = "{full_disk / "events.jsonl"}"'),
        encoding="utf-8",
    )
    cap.execute(f"{cap.schema}.t")
    said = cli(cap.config_path, "run", "--until-caught-up")
    line = assert_clear(said, "snapshotter:snapshotter@")
    assert f"no space left on the device holding the sink file {full_disk}/events.jsonl" in line
    assert "[sink] path" in line, line
    # Freed, the run resumes and converges: nothing acknowledged was lost.
    (full_disk / "filler").unlink()
    assert cli(cap.config_path, "resume", "--until-caught-up").code == 0
    verdict = cap.verify("t")
    assert verdict.ok, verdict.render()


# --- a second engine on the same slot -------------------------------------------------------------


def test_a_second_engine_on_an_active_slot_says_so_at_once(capture: Any, tmp_path: Path) -> None:
    cap: Capture = capture()
    _table(cap, 10)
    cap.init()
    first = cap.start()
    try:
        deadline = time.monotonic() + 60
        while not cap.sql(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active", (cap.slot,)
        ):
            assert time.monotonic() < deadline, "the first engine never took its slot"
            time.sleep(0.2)
        second = tmp_path / "second"
        second.mkdir()
        config = second / "snapshotter.toml"
        config.write_text(
            cap.config_path.read_text(encoding="utf-8").replace(
                'path = "events.jsonl"', f'path = "{second / "events.jsonl"}"'
            ),
            encoding="utf-8",
        )
        started = time.monotonic()
        said = cli(config, "run")
        took = time.monotonic() - started
    finally:
        first.stop()
    line = assert_clear(said, "snapshotter:snapshotter@", lines=3)
    assert f"replication slot '{cap.slot}'" in line and "is in use by another process" in line
    assert "walsender pid" in line and "client 'snapshotter'" in line, line
    assert "[source] slot" in line and "init" not in line, line
    assert took < 30, f"took {took:.0f} s"


def test_a_killed_engines_slot_is_taken_over(capture: Any) -> None:
    """The walsender of a SIGKILLed engine still holds the slot for a moment: the next run
    waits for it instead of failing (the case the wait at start exists for)."""
    cap: Capture = capture()
    _table(cap, 10)
    cap.init()
    env = {k: v for k, v in os.environ.items() if k != "SNAPSHOTTER_FAULTS"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "snapshotter.app.cli", "run", "-c", str(cap.config_path)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not cap.sql(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active", (cap.slot,)
        ):
            assert time.monotonic() < deadline, "the engine never took its slot"
            time.sleep(0.2)
    finally:
        proc.kill()
        proc.wait()
    cap.sql(f"INSERT INTO \"{cap.schema}\".t VALUES (11, 'after the kill')")
    said = cli(cap.config_path, "resume", "--until-caught-up")
    assert said.code == 0, said.stderr
    assert any(e["value"]["after"] == {"id": 11, "v": "after the kill"} for e in cap.events("t"))

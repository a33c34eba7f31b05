"""Starting Spark fails within a bound, naming the address and the fix, and SIGTERM/SIGINT stop
the engine within ``[state] shutdown_timeout_s`` whatever it waits for (issue 26).

Issue 26: ``[spark] remote = "sc://127.0.0.1:1"`` gave no error for 3+ minutes, the snapshot
was reported done, nothing landed, and SIGTERM and SIGINT were ignored (only SIGKILL ended
it); an unreachable master failed after ~60 s with a Py4J message naming no master; and
``verify`` against the standalone cluster waited forever for cores while the engine held
them. ``snapshotter run`` runs as a subprocess, as a user runs it, against the real servers:
PostgreSQL, the standalone cluster and the Connect server of ``scripts/services up spark``.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.integration.engine_harness import Capture
from tests.integration.test_cli_errors import cli, closed_port

pytestmark = pytest.mark.integration

ROWS = 300


def _spark_capture(
    capture: Any, spark: str, spark_extra: str = "", state_extra: str = "", table: str = "t"
) -> Capture:
    """A capture landing through ``spark`` (a master or Connect URL), a small table with a
    snapshot asked for; ``spark_extra``/``state_extra``: more [spark]/[state] settings."""
    cap: Capture = capture(sink="spark", spark=spark, state_config=state_extra)
    text = cap.config_path.read_text(encoding="utf-8")
    cap.config_path.write_text(text.replace("[spark]\n", f"[spark]\n{spark_extra}\n"), "utf-8")
    cap.sql(f'CREATE TABLE "{cap.schema}".{table} (id int PRIMARY KEY, v int)')
    cap.sql(f'INSERT INTO "{cap.schema}".{table} SELECT g, g FROM generate_series(1, {ROWS}) g')
    cap.init()
    cap.execute(f"{cap.schema}.{table}")
    return cap


@dataclass
class Running:
    """``snapshotter run`` as a subprocess; its stderr read as it comes."""

    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    def wait_for(self, pattern: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(re.search(pattern, line) for line in self.lines):
            if self.proc.poll() is not None:
                time.sleep(0.5)  # the reader thread takes the last lines
                raise AssertionError(f"exited {self.proc.returncode}:\n{self.stderr}")
            assert time.monotonic() < deadline, f"no {pattern!r} in {timeout} s:\n{self.stderr}"
            time.sleep(0.1)

    def ended_within(self, timeout: float) -> float:
        started = time.monotonic()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout} s:\n{self.stderr}") from None
        return time.monotonic() - started

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    @property
    def errors(self) -> list[str]:
        return [line.strip() for line in self.lines if line.startswith("error:")]


@contextmanager
def running(config: Path, *args: str) -> Iterator[Running]:
    env = {k: v for k, v in os.environ.items() if k != "SNAPSHOTTER_FAULTS"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "snapshotter.app.cli", "run", "-c", str(config), *args],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    run = Running(proc)
    assert proc.stderr is not None
    reader = threading.Thread(target=lambda: run.lines.extend(proc.stderr or ()), daemon=True)
    reader.start()
    try:
        yield run
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        reader.join(10)


@contextmanager
def silent_port() -> Iterator[int]:
    """A port that accepts connections (the kernel completes them from the backlog) and
    never answers: a Spark Connect client would retry it for ten minutes and more."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        yield int(server.getsockname()[1])


def _run_failing(cap: Capture, secret: str = "Traceback") -> tuple[str, float]:
    """``run --until-caught-up``, expected to fail (exit 1) with one error line, no
    traceback, nor ``secret`` (Spark's JVM may add lines of its own log): that line, and how
    long the run took."""
    started = time.monotonic()
    said = cli(cap.config_path, "run", "--until-caught-up", timeout=600)
    took = time.monotonic() - started
    everything = said.stdout + said.stderr
    assert said.code == 1, everything
    assert "Traceback" not in everything and secret not in everything, everything
    (line,) = said.errors
    return line, took


# --- a wrong address fails at once ------------------------------------------------------------


def test_an_unreachable_spark_connect_server_fails_at_once_naming_it(capture: Any) -> None:
    port = closed_port()
    token = "Tk" + os.urandom(6).hex()
    cap = _spark_capture(capture, f"sc://127.0.0.1:{port}/;token={token}")
    line, took = _run_failing(cap, secret=token)
    assert f"cannot reach the Spark Connect server at sc://127.0.0.1:{port} " in line, line
    assert "[spark] remote" in line and "start-connect-server" in line, line
    assert took < 60, f"took {took:.0f} s"  # no Spark to start: Python and PostgreSQL only


def test_an_unreachable_master_fails_at_once_naming_it(capture: Any) -> None:
    port = closed_port()
    cap = _spark_capture(capture, f"spark://127.0.0.1:{port}")
    line, took = _run_failing(cap, secret="Py4J")
    assert f"cannot reach the Spark master at spark://127.0.0.1:{port} " in line, line
    assert "[spark] master" in line, line
    assert took < 60, f"took {took:.0f} s"


def test_a_connect_address_that_never_answers_fails_within_start_timeout(capture: Any) -> None:
    with silent_port() as port:
        cap = _spark_capture(capture, f"sc://127.0.0.1:{port}", "start_timeout_s = 8")
        line, took = _run_failing(cap)
    assert f"Spark at sc://127.0.0.1:{port} did not start within 8 s" in line, line
    assert "[spark] start_timeout_s" in line and "[spark] remote" in line, line
    assert took < 8 + 60, f"took {took:.0f} s"


# --- SIGTERM / SIGINT -------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_spark_starts_stops_the_engine_within_shutdown_timeout(
    capture: Any, signum: signal.Signals
) -> None:
    """The issue's hang: Spark that never starts (here a Connect address that accepts and
    never answers, with a start bound far away), the snapshot staged, then a signal."""
    with silent_port() as port:
        cap = _spark_capture(
            capture, f"sc://127.0.0.1:{port}", "start_timeout_s = 900", "shutdown_timeout_s = 5"
        )
        with running(cap.config_path) as run:
            run.wait_for(r"connecting to Spark Connect at", timeout=120)
            run.wait_for(r"snapshot of \S+ done", timeout=120)
            run.proc.send_signal(signum)
            took = run.ended_within(5 + 30)
    assert run.proc.returncode == 1, run.stderr
    assert took >= 4, took  # it waited for Spark, up to the bound
    (error,) = run.errors
    assert error.startswith("error: the engine did not stop within 5 s of the stop"), error
    assert "[state] shutdown_timeout_s" in error and "snapshotter resume" in error, error
    assert "Traceback" not in run.stderr


def test_sigterm_with_local_spark_running_stops_within_the_bound_and_resume_converges(
    capture: Any,
) -> None:
    """A working Spark (local mode): SIGTERM once it has started ends the run within
    the bound, at a transaction boundary with state saved (exit 0), or at the bound."""
    cap = _spark_capture(capture, "local[1]", "", "shutdown_timeout_s = 40")
    with running(cap.config_path) as run:
        run.wait_for(r"Spark started at local\[1\]", timeout=300)
        run.proc.send_signal(signal.SIGTERM)
        took = run.ended_within(40 + 30)
    if run.proc.returncode != 0:  # the closing landing or compaction did not finish in time
        assert run.proc.returncode == 1, run.stderr
        (error,) = run.errors
        assert "did not stop within 40 s" in error, error
    assert took < 40 + 30
    said = cli(cap.config_path, "resume", "--until-caught-up", timeout=600)
    assert said.code == 0, said.stderr
    said = cli(cap.config_path, "verify", timeout=600)
    assert said.code == 0, said.stdout + said.stderr


# --- the standalone cluster, its cores held -----------------------------------------------------


def test_a_busy_cluster_fails_a_second_engine_in_time_and_verify_reads_locally(
    capture: Any, spark_master: str
) -> None:
    """An engine holds both cores of the test cluster (spark.cores.max = 2). A second engine
    on the cluster runs no task: it stops within start_timeout_s naming the master and the
    fix. verify beside the running engine reads with a local session and says so (it waited
    forever for cores before)."""
    holder = _spark_capture(capture, spark_master, "start_timeout_s = 600")
    text = holder.config_path.read_text(encoding="utf-8")
    holder.config_path.write_text(
        text.replace('"spark.cores.max" = "1"', '"spark.cores.max" = "2"')
    )
    with running(holder.config_path) as engine:
        engine.wait_for(r"Spark started at spark://", timeout=600)
        engine.wait_for(r"snapshot of \S+ done", timeout=300)

        # 25 s: Spark warns "Initial job has not accepted any resources" after 15 s (its
        # spark.starvation.timeout), which the message quotes.
        second = _spark_capture(capture, spark_master, "start_timeout_s = 25", table="t2")
        line, took = _run_failing(second)
        assert f"Spark at {spark_master} ran no task within 25 s" in line, line
        assert "spark.cores.max" in line and "Initial job has not accepted any resources" in line
        assert took < 25 + 120, f"took {took:.0f} s"

        verdict = _verify_until_converged(holder)
        assert "with a local Spark session (local[*]), not on the cluster" in verdict.stderr
        assert verdict.code == 0, verdict.stdout + verdict.stderr

        engine.proc.send_signal(signal.SIGTERM)
        engine.ended_within(60 + 30)
    assert engine.proc.returncode == 0, engine.stderr


def _verify_until_converged(cap: Capture, attempts: int = 3) -> Any:
    """``verify`` while the engine runs: the snapshot may still be landing at first."""
    for _ in range(attempts):
        said = cli(cap.config_path, "verify", timeout=600)
        if said.code == 0:
            return said
        time.sleep(5)
    return said

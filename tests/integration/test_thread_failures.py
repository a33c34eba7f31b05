"""No background thread dies silently (issue 26): a failure injected into each thread's work
(``SNAPSHOTTER_FAULTS=<point>@N:raise``, snapshotter/common/faults.py) is retried, or stops
the engine with the reason on stderr and exit code 1; a resume then finishes the work.

Issue 26: ``[sink] compact_idle_s = inf`` made the Spark lander thread die (OverflowError)
while the engine kept staging; nothing landed again, and nothing said so.

The threads and where their failures go (docs/operations.md#stopping):

* the Spark sink's lander: a landing retried (``test_a_landing_that_fails_once_is_retried``),
  anything else stops the engine (``test_the_lander_thread_dying_stops_the_engine``);
* the Spark sink's stager: stops the engine (``test_a_staging_failure_stops_the_engine``);
* the chunk workers: a task's error is the table's (tests/integration/test_engine_*), the
  thread itself dying stops the engine (``test_a_chunk_worker_that_dies_stops_the_engine``,
  through the engine's thread-failure hook, snapshotter.app.shutdown.ThreadFailures);
* MySQL's binlog reader: lost connections are retried (test_source_restart.py), anything else
  stops the engine (``test_a_binlog_reader_failure_stops_the_engine``);
* Spanner's partition queries: a transient error is retried for 300 s, anything else stops
  the engine (``test_a_spanner_partition_query_failure_stops_the_engine``);
* side channels recover: the notification table's writer retries
  (tests/unit/test_notifications.py::test_the_table_channel_writes_off_thread_and_retries),
  the metrics lag probe says it once
  (tests/unit/test_metrics.py::test_a_failing_lag_measurement_is_said_once_and_recovers).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.integration.engine_harness import Capture
from tests.integration.test_cli_errors import Said, cli
from tests.integration.test_spanner_source import spanner_case

__all__ = ["spanner_case"]  # the fixture, used by name

pytestmark = pytest.mark.integration

ROWS = 600


def faulty(config: Path, spec: str, *args: str, timeout: float = 600) -> Said:
    """``snapshotter ARGS -c CONFIG`` with ``SNAPSHOTTER_FAULTS=spec``."""
    command, *rest = args
    done = subprocess.run(
        [sys.executable, "-m", "snapshotter.app.cli", command, "-c", str(config), *rest],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, "SNAPSHOTTER_FAULTS": spec},
        stdin=subprocess.DEVNULL,
        check=False,
    )
    return Said(done.returncode, done.stdout, done.stderr)


def _table(cap: Capture) -> None:
    """A table of ROWS rows, a snapshot of it asked for."""
    name = f'"{cap.schema}".t' if cap.kind != "mysql" else f"`{cap.schema}`.t"
    cap.sql(f"CREATE TABLE {name} (id int PRIMARY KEY, v int)")
    values = ", ".join(f"({i}, {i})" for i in range(1, ROWS + 1))
    cap.sql(f"INSERT INTO {name} VALUES {values}")
    cap.init()
    cap.execute(f"{cap.schema}.t")


def _stopped_with(said: Said, reason: str) -> str:
    """Exit 1 with one error line that gives ``reason``, no traceback (the fault points'
    own lines aside)."""
    assert said.code == 1, said.stderr
    assert "Traceback" not in said.stdout + said.stderr, said.stderr
    (line,) = said.errors
    assert reason in line, said.stderr
    return line


def _resumed_and_converged(cap: Capture) -> None:
    said = cli(cap.config_path, "resume", "--until-caught-up", timeout=600)
    assert said.code == 0, said.stderr
    said = cli(cap.config_path, "verify", timeout=600)
    assert said.code == 0, said.stdout + said.stderr


# --- the Spark sink's threads ------------------------------------------------------------------


def test_the_lander_thread_dying_stops_the_engine(capture: Any) -> None:
    """Between two landings (where compact_idle_s = inf raised OverflowError): without the
    lander's guard the run went on and `--until-caught-up` exited 0 with nothing more
    landed."""
    cap: Capture = capture(sink="spark", spark="local[1]")
    _table(cap)
    said = faulty(cap.config_path, "spark.lander@2:raise", "run", "--until-caught-up")
    _stopped_with(
        said, "the Spark sink's lander stopped: InjectedFault: injected fault at spark.lander"
    )
    _resumed_and_converged(cap)


def test_a_landing_that_fails_once_is_retried(capture: Any) -> None:
    cap: Capture = capture(sink="spark", spark="local[1]")
    _table(cap)
    said = faulty(cap.config_path, "spark.land@1:raise", "run", "--until-caught-up")
    assert said.code == 0, said.stderr
    assert "failed (attempt 1 of 3), retrying: InjectedFault" in said.stderr
    said = cli(cap.config_path, "verify", timeout=600)
    assert said.code == 0, said.stdout + said.stderr


def test_a_staging_failure_stops_the_engine(capture: Any) -> None:
    cap: Capture = capture(sink="spark", spark="local[1]")
    _table(cap)
    said = faulty(cap.config_path, "sink.flush@1:raise", "run", "--until-caught-up")
    _stopped_with(said, "injected fault at sink.flush")
    _resumed_and_converged(cap)


# --- the engine's threads ----------------------------------------------------------------------


def test_a_chunk_worker_that_dies_stops_the_engine(capture: Any) -> None:
    """The worker's thread ends on an exception outside any task: without the engine's
    thread-failure hook the snapshot waited forever for that task's answer."""
    cap: Capture = capture()
    _table(cap)
    said = faulty(cap.config_path, "chunks.worker@1:raise", "run", "--until-caught-up")
    line = _stopped_with(
        said,
        "the snapshotter-chunks thread failed: InjectedFault: injected fault at chunks.worker",
    )
    assert "state saved" in line and "snapshotter resume" in line, line
    _resumed_and_converged(cap)


def test_a_binlog_reader_failure_stops_the_engine(mysql_capture: Any) -> None:
    cap: Capture = mysql_capture()
    _table(cap)
    said = faulty(cap.config_path, "binlog.read@3:raise", "run", "--until-caught-up")
    _stopped_with(said, "failed: InjectedFault: injected fault at binlog.read")
    assert "reading the binlog after " in said.stderr
    _resumed_and_converged(cap)


def test_a_spanner_partition_query_failure_stops_the_engine(spanner_case: Any) -> None:
    """A partition's thread hands its error to the engine's thread: not transient, so the
    engine stops naming the change stream (the emulator)."""
    cap: Capture = spanner_case("googlesql").capture
    cap.init()
    said = faulty(cap.config_path, "spanner.partition_query@1:raise", "run", "--until-caught-up")
    _stopped_with(
        said,
        "change stream cs: a partition query failed: injected fault at spanner.partition_query",
    )
    said = cli(cap.config_path, "resume", "--until-caught-up", timeout=600)
    assert said.code == 0, said.stderr

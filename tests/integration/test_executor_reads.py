"""Chunks read on Spark executors (``[snapshot] executors``): each window's key range is cut
into sub-ranges, read by Spark tasks on the standalone cluster of scripts/services up spark,
their rows written to staging by the executors and landed without passing through the
engine. Convergence under the random writer (key changes included) on PostgreSQL and
MariaDB, and a crash of the engine while the executors read, then ``resume``.

CI runs the "items" table on the cluster; the full matrix (every scenario, and through Spark
Connect):

    SNAPSHOTTER_CLUSTER_MATRIX=full scripts/test tests/integration/test_executor_reads.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from tests.integration.test_convergence import (
    Source,
    _cli,
    qualified,
    source,
    spark_converges,
    state_of,
    wait_for,
)

__all__ = ["source"]  # the fixture, used by name

pytestmark = pytest.mark.integration

FULL = os.environ.get("SNAPSHOTTER_CLUSTER_MATRIX") == "full"
SCENARIOS = ["items", "composite", "typed", "wide"] if FULL else ["items"]
EXECUTORS = 2
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# CI (its 45-minute budget): the convergence on PostgreSQL, the crash on MariaDB; both on
# both with SNAPSHOTTER_CLUSTER_MATRIX=full. (Indirect: overrides the source fixture's params,
# so CI never collects, and never skips, the other.)
CONVERGE_ON = ["postgres", "mysql"] if FULL else ["postgres"]
CRASH_ON = ["postgres", "mysql"] if FULL else ["mysql"]


@pytest.mark.parametrize("source", CONVERGE_ON, indirect=True)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_reads_on_executors_converge(source: Source, scenario: str, spark_master: str) -> None:
    spark_converges(source, scenario, spark=spark_master, executors=EXECUTORS)


if FULL:  # defined only for the full matrix, so CI never reports it skipped

    def test_reads_on_executors_through_spark_connect_converge(
        source: Source, spark_remote: str
    ) -> None:
        spark_converges(source, "items", spark=spark_remote, executors=EXECUTORS)


@pytest.mark.parametrize("source", CRASH_ON, indirect=True)
def test_a_crash_while_executors_read_then_resume_converges(
    source: Source, spark_master: str
) -> None:
    """The engine is killed (SIGKILL) while a window's sub-ranges are being read on the
    executors; ``snapshotter resume`` reads that window again and the landed table equals
    the source table."""
    rows = 20_000
    cap = source.capture(chunk_size=1000, sink="spark", spark=spark_master, executors=EXECUTORS)
    table = source.create(cap, "items", rows)
    cap.init()
    writer = source.writer(cap, table, rows, changes=None, seed=11, rate=200)
    with writer:
        wait_for(lambda: writer.total >= 50, "the writer to get going")
        cap.execute(qualified(cap, table.name))
        killed = subprocess.run(
            _cli(cap, "run", "--until-caught-up"),
            cwd=REPO,
            env={**os.environ, "SNAPSHOTTER_FAULTS": "executor.reads@3"},
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        said = killed.stdout + killed.stderr
        assert "fault executor.reads@3" in said, said[-3000:]
        assert killed.returncode == -signal.SIGKILL, said[-3000:]
        resumed = subprocess.run(
            _cli(cap, "resume", "--until-caught-up"),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
        time.sleep(0.5)
    assert cap.run(timeout=300) == 0  # the writer's last changes
    assert state_of(cap, table.name) == "done"
    landed = cap.verify_landed(table.name)
    assert landed.ok, landed.render()
    assert cap.landed_rows(table.name) == cap.source_rows(table.name)
    leftovers = list((cap.config.staging_dir / "reads").glob("*/*.parquet"))
    assert not leftovers, leftovers[:3]

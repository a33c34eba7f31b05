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

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_convergence import (
    Capture,
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


# CI (its 45-minute budget): the crash on MariaDB, whose resume reads on the executors and
# converges, and the first-snapshot appends on PostgreSQL; the plain convergence and both
# databases with SNAPSHOTTER_CLUSTER_MATRIX=full. (Indirect: overrides the source fixture's
# params, so CI never collects, and never skips, the other.)
CONVERGE_ON = ["postgres", "mysql"] if FULL else ["postgres"]
CRASH_ON = ["postgres", "mysql"] if FULL else ["mysql"]
# The table formats whose first snapshot appends what the executors wrote. CI: Delta, whose
# history tells an append (WRITE) from a MERGE; Iceberg's commits a MERGE of new keys only
# as an "append" too, so there the lander's account of merged rows tells.
APPEND_FORMATS = ["iceberg", "delta"] if FULL else ["delta"]


if FULL:  # defined only for the full matrix, so CI never reports it skipped

    @pytest.mark.parametrize("source", CONVERGE_ON, indirect=True)
    @pytest.mark.parametrize("scenario", SCENARIOS)
    def test_reads_on_executors_converge(source: Source, scenario: str, spark_master: str) -> None:
        spark_converges(source, scenario, spark=spark_master, executors=EXECUTORS)


if FULL:  # the table formats, whose first snapshot appends the executors' files

    @pytest.mark.parametrize("source", CONVERGE_ON, indirect=True)
    @pytest.mark.parametrize("fmt", ["delta", "iceberg"])
    def test_reads_on_executors_converge_into_table_formats(
        source: Source, fmt: str, spark_master: str
    ) -> None:
        # A MERGE per landing on the cluster's two 1-core workers: slower than Parquet.
        spark_converges(
            source, "items", spark=spark_master, executors=EXECUTORS, fmt=fmt, timeout=600
        )


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


def _current_commits(cap: Capture, table: str) -> list[tuple[str, int]]:
    """The current-state table's commits, oldest first: (operation, rows added), as Iceberg's
    snapshots or Delta's history name them."""
    lander = cap.lander()
    if lander.format == "iceberg":
        name = lander.iceberg.current_name(cap.table_id(table))
        found = lander.spark.sql(
            f"SELECT operation, summary FROM {name}.snapshots ORDER BY committed_at"
        ).collect()
        return [(r["operation"], int(r["summary"].get("added-records", 0))) for r in found]
    # Delta's log itself: per commit its operation and the rows of the files it adds (their
    # statistics' numRecords). Not DESCRIBE HISTORY's metrics: a commit of files added as
    # they are (formats/delta_links, a delta-rs transaction) carries none.
    log = Path(lander.table_path(cap.table_id(table))) / "current" / "_delta_log"
    commits = []
    for entry in sorted(log.glob("*.json")):
        operation, added = "", 0
        for line in entry.read_text(encoding="utf-8").splitlines():
            action: dict[str, Any] = json.loads(line)
            if "commitInfo" in action:
                operation = str(action["commitInfo"].get("operation", ""))
            elif "add" in action and action["add"].get("dataChange", True):
                added += int(json.loads(action["add"].get("stats") or "{}").get("numRecords", 0))
        commits.append((operation, added))
    return commits


@pytest.mark.parametrize("source", ["postgres"], indirect=True)
def test_a_first_snapshot_read_on_executors_is_appended_to_the_parquet_base(
    source: Source, spark_master: str
) -> None:
    """Parquet: the executors' READ rows of keys the table never had go into ``current/`` as
    they land, as files appended to the base (as the engine's own reads do), so the run ends
    with nothing to compact: no tail, every row in the base, no bucket file written; a later
    change is compacted into buckets, and plain readers read the source's rows."""
    import pyarrow.dataset as ds

    rows = 4000
    cap = source.capture(chunk_size=1000, sink="spark", spark=spark_master, executors=EXECUTORS)
    table = source.create(cap, "items", rows)
    cap.init()
    cap.execute(qualified(cap, table.name))
    assert cap.run(timeout=300) == 0
    lander = cap.lander()
    meta = lander.meta(cap.table_id(table.name))
    assert meta is not None and (meta.tail_rows, meta.base_rows) == (0, rows), meta
    current = Path(lander.table_path(cap.table_id(table.name))) / "current"
    names = sorted(p.name for p in current.glob("*.parquet"))
    assert names and all(".b0" in n for n in names), names  # appended files, not buckets
    assert ds.dataset(str(current), format="parquet").count_rows() == rows
    source.sql(
        cap,
        "UPDATE {s}.items SET name = name || '!' WHERE id IN "
        "(SELECT id FROM {s}.items ORDER BY id LIMIT 5)",
    )
    assert cap.run(timeout=300) == 0
    assert any(".bucket-" in p.name for p in current.glob("*.parquet"))
    landed = cap.verify_landed(table.name)
    assert landed.ok, landed.render()
    assert cap.landed_rows(table.name) == cap.source_rows(table.name)


@pytest.mark.parametrize("source", ["postgres"], indirect=True)
@pytest.mark.parametrize("fmt", APPEND_FORMATS)
def test_a_first_snapshot_read_on_executors_is_appended_not_merged(
    source: Source, fmt: str, spark_master: str
) -> None:
    """The executors' files of a table's first snapshot are READ rows of keys the table never
    had: they land as appends (no MERGE), as the executors wrote them; a later change is
    merged. Read back by the format's own readers (``verify``: pyiceberg / delta-rs)."""
    rows = 4000
    cap = source.capture(
        chunk_size=1000, sink="spark", spark=spark_master, executors=EXECUTORS, sink_format=fmt
    )
    table = source.create(cap, "items", rows)
    cap.init()
    cap.execute(qualified(cap, table.name))
    assert cap.run(timeout=300) == 0
    commits = _current_commits(cap, table.name)
    merges = [op for op, _ in commits if op.upper() not in ("APPEND", "WRITE", "CREATE TABLE")]
    assert not merges, commits
    assert sum(added for _, added in commits) == rows, commits
    meta = cap.lander().meta(cap.table_id(table.name))
    assert meta is not None and meta.tail_rows == 0, meta  # no row went through a merge
    source.sql(
        cap,
        "UPDATE {s}.items SET name = name || '!' WHERE id IN "
        "(SELECT id FROM {s}.items ORDER BY id LIMIT 5)",
    )
    assert cap.run(timeout=300) == 0
    later = _current_commits(cap, table.name)[len(commits) :]
    # Merged (Iceberg: "overwrite"; its maintenance, when idle, a "replace"); no append.
    assert {op.upper() for op, _ in later} & {"MERGE", "OVERWRITE"}, later
    assert all(op.upper() in ("MERGE", "OVERWRITE", "REPLACE") for op, _ in later), later
    landed = cap.verify_landed(table.name)
    assert landed.ok, landed.render()
    assert cap.landed_rows(table.name) == cap.source_rows(table.name)

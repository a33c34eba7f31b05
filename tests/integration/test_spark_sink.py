"""The Spark sink's durability: landing is idempotent, and a crash anywhere between staging
and landing re-lands on restart without duplicates or losses.

Real Spark (local mode) and, for the crash tests, the real engine against PostgreSQL in a
process of its own that is killed with SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from signals.names import TableId
from snapshotter.config import SparkConfig
from snapshotter.core.events import ChangeEvent, Op, SnapshotMarker, Source
from snapshotter.core.position import Position
from snapshotter.sinks.spark.formats import iceberg, merge
from snapshotter.sinks.spark.lander import Lander
from snapshotter.sinks.spark.session import spark_session
from snapshotter.sinks.spark.staging import StagingArea
from snapshotter.sinks.spark.types import events_to_landed
from snapshotter.sources.base import ColumnInfo, TableSchema
from tests.integration.engine_harness import SPARK_MASTER, Capture, data_columns

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TABLE = TableId("shop", "items")
SCHEMA = TableSchema(
    TABLE,
    (
        ColumnInfo("id", "bigint", 20, False, pa.int64()),
        ColumnInfo("name", "text", 25, True, pa.string()),
        ColumnInfo("price", "numeric(12,2)", 1700, True, pa.string()),
        ColumnInfo("at", "timestamptz", 1184, True, pa.timestamp("us", tz="UTC")),
    ),
    ("id",),
)


def event(op: str, key: int, pos: int, name: str = "x") -> ChangeEvent:
    source = Source(
        "postgresql",
        "shop",
        "shop",
        TABLE,
        Position(pos),
        1_700_000_000_000,
        SnapshotMarker.INCREMENTAL if op == "r" else SnapshotMarker.FALSE,
    )
    if op == "d":
        return ChangeEvent(Op.DELETE, source, 1, (key,), before={"id": key})
    if op == "t":
        return ChangeEvent(Op.TRUNCATE, source, 1, None)
    row = {"id": key, "name": name, "price": f"{key}.25", "at": datetime(2024, 5, 6, tzinfo=UTC)}
    return ChangeEvent(Op(op), source, 1, (key,), after=row)


def contents(lander: Lander) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    changelog = lander.changelog(TABLE)
    current = lander.current_state(TABLE)
    assert changelog is not None and current is not None
    return (
        sorted(changelog.toArrow().to_pylist(), key=lambda r: r["__pos"]),
        sorted(current.toArrow().to_pylist(), key=lambda r: r["id"]),
    )


@pytest.mark.parametrize("fmt", ["parquet", "delta", "iceberg"])
def test_landing_the_same_staged_batch_twice_changes_nothing(tmp_path: Path, fmt: str) -> None:
    _lands_once(tmp_path, fmt)


def test_changes_merged_split_by_presence_land_as_one_merge_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second batch's keys (1, 2, 7) lie close together, so one MERGE lands them; with
    SPREAD 0 every batch counts as spread: its present keys are merged (1 updated, 2
    deleted), its new one appended (7), and landing it again changes nothing."""
    monkeypatch.setattr(merge, "SPREAD", 0)
    monkeypatch.setattr(merge, "SPLIT_TARGET_BYTES", 0)
    split: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        split.append(1)
        return merge.split_by_presence(*args, **kwargs)

    monkeypatch.setattr(iceberg, "split_by_presence", counted)
    _lands_once(tmp_path, "iceberg")
    assert split, "the merge was not split by presence"


def _lands_once(tmp_path: Path, fmt: str) -> None:
    spark = spark_session(SparkConfig(master=SPARK_MASTER), delta=True, iceberg=True)
    staging = StagingArea(tmp_path / "staging")
    staging.open()
    lander = Lander(spark, str(tmp_path / "lake"), fmt, compact_min_rows=3)
    first = [event("r", k, 10 + k) for k in range(6)]
    second = [event("u", 1, 100, "y"), event("d", 2, 101), event("c", 7, 102)]
    b1 = staging.stage(1, [(TABLE, ["id"], events_to_landed(SCHEMA, ["id"], first, 1))])
    b2 = staging.stage(2, [(TABLE, ["id"], events_to_landed(SCHEMA, ["id"], second, 2))])
    lander.land([b1])
    lander.land([b2])
    once = contents(lander)
    lander.land([b2])  # again: a crash before the staged batch was removed
    assert contents(lander) == once
    lander.land([b1, b2])  # again, grouped differently
    assert contents(lander) == once
    changelog, current = once
    assert [r["__op"] for r in changelog] == ["r"] * 6 + ["u", "d", "c"]
    assert [(r["id"], r["name"]) for r in current] == [
        (0, "x"),
        (1, "y"),
        (3, "x"),
        (4, "x"),
        (5, "x"),
        (7, "x"),
    ]


# --- crashes with the real engine ---------------------------------------------------------

# Runs `snapshotter run` with the lander held at one point, so the test can kill the process
# there with SIGKILL: "stage" blocks every landing (batches are staged and recorded, never
# landed); "landed" lets the first landing finish and blocks before its staged batches are
# removed.
_CRASHING_RUN = """
import sys, time
from snapshotter.app.cli import main
from snapshotter.sinks.spark import lander
from snapshotter.sinks.spark import staging

where = sys.argv[1]
if where == "stage":
    lander.Lander.land = lambda self, batches: time.sleep(3600)
else:
    staging.StagingArea.remove = lambda self, batch: time.sleep(3600)
sys.exit(main(["run", "-c", sys.argv[2]]))
"""


def _saved(cap: Capture) -> dict[str, Any]:
    path = cap.directory / "state" / "state.json"
    if not path.exists():
        return {}
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


@pytest.mark.parametrize("where", ["stage", "landed"])
def test_a_crash_between_staging_and_landing_relands_without_duplicates(
    capture: Any, where: str
) -> None:
    cap: Capture = capture(chunk_size=500, sink="spark")
    cap.sql(f'CREATE TABLE "{cap.schema}".items (id bigint PRIMARY KEY, name text)')
    cap.sql(f'ALTER TABLE "{cap.schema}".items REPLICA IDENTITY FULL')  # TOAST-able name
    cap.sql(
        f"INSERT INTO \"{cap.schema}\".items SELECT g, 'n' || g FROM generate_series(1, 5000) g"
    )
    cap.init()
    cap.execute(f"{cap.schema}.items")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _CRASHING_RUN, where, str(cap.config_path)],
        cwd=cap.directory,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 180
        staged_dirs: list[Path] = []
        while time.monotonic() < deadline:
            cap.sql(f"UPDATE \"{cap.schema}\".items SET name = name || '+' WHERE id % 97 = 0", None)
            staged = _saved(cap).get("sink", {}).get("staged", 0)
            staged_dirs = sorted(cap.config.staging_dir.glob("batch-*"))
            if staged >= 3 and len(staged_dirs) >= 2:
                break
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            time.sleep(0.5)
        else:
            raise AssertionError("the engine staged no batches within 180 s")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    assert staged_dirs, "the crash left staged batches to land"
    # Restart: the staged batches land first, then the engine goes on to the end.
    assert cap.run(timeout=300) == 0
    assert not list(cap.config.staging_dir.glob("batch-*"))
    lander = cap.lander()
    changelog = lander.changelog(cap.table_id("items"))
    assert changelog is not None
    positions = [r["__pos"] for r in changelog.select("__pos").toArrow().to_pylist()]
    assert len(positions) == len(set(positions)), "an event landed twice"
    landed = cap.landed_rows("items")
    expected = cap.source_rows("items")
    assert landed == expected
    current = lander.current_state(cap.table_id("items"))
    assert current is not None and sorted(data_columns(current)) == ["id", "name"]


@pytest.mark.parametrize("fmt", ["parquet", "delta", "iceberg"])
def test_unchanged_toast_values_land_from_the_previous_state(capture: Any, fmt: str) -> None:
    cap: Capture = capture(chunk_size=100, sink="spark", sink_format=fmt)
    s = f'"{cap.schema}"'
    cap.sql(f"CREATE TABLE {s}.docs (id int PRIMARY KEY, n int, big text)")
    cap.sql(f"ALTER TABLE {s}.docs ALTER COLUMN big SET STORAGE EXTERNAL")  # out of line
    cap.init()
    # Streamed, not snapshotted: a snapshot of this table is refused without REPLICA
    # IDENTITY FULL (test_toast_identity), and the log's creates carry every value.
    cap.sql(
        f"INSERT INTO {s}.docs SELECT g, 0, repeat(md5(g::text), 400) "
        "FROM generate_series(1, 300) g"
    )
    assert cap.run(timeout=300) == 0
    # Updates that leave the large value alone: the log marks it unchanged, not its value.
    cap.sql(f"UPDATE {s}.docs SET n = n + 1 WHERE id <= 100")
    cap.sql(f"UPDATE {s}.docs SET n = n + 1 WHERE id <= 50")
    assert cap.run(timeout=300) == 0
    changelog = cap.lander().changelog(cap.table_id("docs"))
    assert changelog is not None
    marked = changelog.where("__op = 'u'").select("__unavailable").toArrow().to_pylist()
    assert len(marked) == 150 and all(r["__unavailable"] == ["big"] for r in marked)
    assert cap.landed_rows("docs") == cap.source_rows("docs")


def test_a_plain_reader_of_current_sees_the_exact_state_while_running_and_after(
    capture: Any,
) -> None:
    """``spark.read.parquet(<table>/current)``, by a reader that knows nothing of snapshotter:
    exact once the engine has been quiet for compact_idle_s (the engine still running), and
    after a run ends even when a crash left a half-done compaction behind."""
    from tests.integration.test_convergence import state_of, wait_for

    cap: Capture = capture(
        chunk_size=500,
        sink="spark",
        sink_config="compact_idle_s = 1",
        extra_config='[notifications]\nchannels = ["sink"]\n',  # Debezium's, into Spark
    )
    items = f'"{cap.schema}".items'
    cap.sql(f"CREATE TABLE {items} (id bigint PRIMARY KEY, name text)")
    cap.sql(f"ALTER TABLE {items} REPLICA IDENTITY FULL")
    cap.sql(f"INSERT INTO {items} SELECT g, 'n' || g FROM generate_series(1, 3000) g")
    cap.init()
    cap.execute(f"{cap.schema}.items")
    engine = cap.start()
    try:
        wait_for(lambda: state_of(cap, "items") == "done", "the snapshot", 180, engine)
        # Changes after the snapshot: they land in the changelog tail, below compact_ratio.
        cap.sql(f"UPDATE {items} SET name = name || '+' WHERE id % 7 = 0", None)
        cap.sql(f"DELETE FROM {items} WHERE id % 11 = 0", None)
        cap.sql(f"INSERT INTO {items} SELECT g, 'new' FROM generate_series(3001, 3100) g")
        expected = cap.source_rows("items")

        def plain_exact() -> bool:
            try:
                return cap.plain_landed_rows("items") == expected
            except Exception:  # read while a compaction swapped the base (files gone)
                return False

        wait_for(
            plain_exact,
            "a plain reader's current/ to equal the table while the engine runs",
            120,
            engine,
        )
    finally:
        assert engine.stop() == 0
    # The sink channel of notifications: a Parquet table beside the landed ones.
    notes = cap.lander().spark.read.parquet(str(cap.directory / "lake" / "_notifications"))
    records = notes.select("type", "additional_data").toArrow().to_pylist()
    kinds = [r["type"] for r in records]
    assert kinds.count("STARTED") == 1 and kinds.count("COMPLETED") == 1, kinds
    assert kinds.count("IN_PROGRESS") >= 1, kinds
    (done,) = [dict(r["additional_data"]) for r in records if r["type"] == "TABLE_SCAN_COMPLETED"]
    assert done["status"] == "SUCCEEDED" and done["total_rows_scanned"] == "3000", done
    # A compaction cut short by a crash: files of a base the metadata does not name.
    current = next((cap.directory / "lake").glob("*.items/current"))
    strays = []
    for f in current.glob("base-*.parquet"):
        strays.append(current / ("base-000099999999." + f.name.split(".", 1)[1]))
        strays[-1].write_bytes(f.read_bytes())
    assert strays
    cap.sql(f"UPDATE {items} SET name = 'last' WHERE id <= 10")
    assert cap.run(timeout=300) == 0
    assert not [f for f in strays if f.exists()]
    assert cap.landed_rows("items") == cap.source_rows("items")  # plain reader included


def test_pyarrow_and_pandas_read_current_after_a_run_as_the_table(capture: Any) -> None:
    """Issue 26: ``pyarrow.parquet.read_table(<table>/current)`` and ``pandas.read_parquet``
    read 0 rows of a base in ``current/__base=<batch>`` (a name starting with ``_``). After a
    run (a snapshot, then log changes compacted at its end), each plain reader reads the
    table's rows, no column the table lacks but the meta columns, and ``__batch`` of the
    type Spark reads in ``changelog/`` (bigint); and pyarrow and pandas read the changelog."""
    import pandas as pd
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    from snapshotter.sinks.spark.types import META_COLUMNS

    cap: Capture = capture(chunk_size=200, sink="spark")
    items = f'"{cap.schema}".items'
    cap.sql(
        f"CREATE TABLE {items} (id bigint PRIMARY KEY, name text, price numeric(12, 2), "
        "at timestamptz)"
    )
    cap.sql(f"ALTER TABLE {items} REPLICA IDENTITY FULL")
    cap.sql(
        f"INSERT INTO {items} SELECT g, 'n' || g, g * 1.25, "
        "timestamptz '2024-01-01 00:00:00+00' + g * interval '1 minute' "
        "FROM generate_series(1, 1000) g"
    )
    cap.init()
    cap.execute(f"{cap.schema}.items")
    assert cap.run(timeout=300) == 0
    cap.sql(f"UPDATE {items} SET name = name || '+', price = NULL WHERE id % 7 = 0", None)
    cap.sql(f"DELETE FROM {items} WHERE id % 11 = 0", None)
    cap.sql(f"INSERT INTO {items} SELECT g, 'new', NULL, NULL FROM generate_series(1001, 1050) g")
    assert cap.run(timeout=300) == 0
    expected = cap.source_rows("items")
    assert len(expected) == 1000 - 90 + 50
    table_dir = Path(cap.lander().table_path(cap.table_id("items")))
    current, changelog = str(table_dir / "current"), str(table_dir / "changelog")
    names = ["id", "name", "price", "at"]

    arrow = pq.read_table(current)
    assert sorted(arrow.column_names) == sorted([*names, *META_COLUMNS])
    assert sorted(arrow.select(names).to_pylist(), key=lambda r: r["id"]) == sorted(
        expected.values(), key=lambda r: r["id"]
    )
    frame = pd.read_parquet(current)
    assert len(frame) == len(expected) and not frame["id"].duplicated().any()
    assert sorted(frame["id"].tolist()) == sorted(r["id"] for r in expected.values())
    by_id = frame.set_index("id")
    assert by_id.loc[7, "name"] == "n7+" and by_id.loc[1001, "name"] == "new"
    assert 11 not in by_id.index

    # One type for __batch (issue 27): bigint, a column of the changelog's files as of
    # current/'s, never a partition directory's name; pyarrow and pandas read the changelog.
    spark = cap.lander().spark
    long_type = spark.read.parquet(changelog).schema["__batch"].dataType
    assert long_type.simpleString() == "bigint"
    assert spark.read.parquet(current).schema["__batch"].dataType == long_type
    assert arrow.schema.field("__batch").type == pa.int64()
    events = ds.dataset(changelog, format="parquet").to_table()
    assert events.schema.field("__batch").type == pa.int64()
    assert events.num_rows == spark.read.parquet(changelog).count() > len(expected)
    assert len(pd.read_parquet(changelog)) == events.num_rows

"""READ rows of keys a Parquet-landed table never had go straight into its current state's
base (no merge, no compaction); everything else still lands through the changelog tail.
Real Spark (local mode) reads what pyarrow wrote: the changelog, the merged current state,
and ``current/`` as a plain Parquet reader sees it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from signals.names import TableId
from snapshotter.config import SparkConfig
from snapshotter.core.events import ChangeEvent, Op, SnapshotMarker, Source
from snapshotter.core.position import Position
from snapshotter.core.window import ReadBatch
from snapshotter.sinks.spark.lander import Lander
from snapshotter.sinks.spark.session import spark_session
from snapshotter.sinks.spark.staging import StagedBatch, StagingArea
from snapshotter.sinks.spark.types import events_to_landed, read_batch_to_landed
from snapshotter.sources.base import ColumnInfo, TableSchema
from tests.integration.engine_harness import SPARK_MASTER, data_columns

pytestmark = pytest.mark.integration

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
KEYS = ["id"]
AT = datetime(2024, 5, 6, tzinfo=UTC)


def chunk(keys: range, close: int, name: str = "r") -> ReadBatch:
    rows = pa.Table.from_pylist(
        [{"id": k, "name": f"{name}{k}", "price": f"{k}.25", "at": AT} for k in keys],
        schema=SCHEMA.arrow_schema(),
    )
    batch = ReadBatch("w", TABLE, ("id",), rows, Position(close), len(keys), None, False)
    source = Source("postgresql", "shop", "shop", TABLE, Position(close), 1, SnapshotMarker.FALSE)
    return batch.stamped(source, 5, None)


def log(op: str, key: int, pos: int, name: str = "log") -> ChangeEvent:
    source = Source("postgresql", "shop", "shop", TABLE, Position(pos), 1, SnapshotMarker.FALSE)
    if op == "d":
        return ChangeEvent(Op.DELETE, source, 1, (key,), before={"id": key})
    row = {"id": key, "name": f"{name}{key}", "price": "1.00", "at": AT}
    return ChangeEvent(Op(op), source, 1, (key,), after=row)


class Lake:
    def __init__(self, tmp_path: Path) -> None:
        spark = spark_session(SparkConfig(master=SPARK_MASTER), delta=True)
        self.staging = StagingArea(tmp_path / "staging")
        self.staging.open()
        self.lander = Lander(spark, str(tmp_path / "lake"), "parquet", compact_min_rows=10**9)
        self.spark = spark

    def stage(self, seq: int, *pieces: ReadBatch | list[ChangeEvent]) -> StagedBatch:
        parts = [
            read_batch_to_landed(SCHEMA, p, seq)
            if isinstance(p, ReadBatch)
            else events_to_landed(SCHEMA, KEYS, p, seq)
            for p in pieces
        ]
        return self.staging.stage(seq, [(TABLE, KEYS, pa.concat_tables(parts))])

    def state(self) -> dict[int, str]:
        current = self.lander.current_state(TABLE)
        assert current is not None
        rows = current.select("id", "name").toArrow().to_pylist()
        state = {r["id"]: r["name"] for r in rows}
        assert len(state) == len(rows), "a key twice in the current state"
        return state

    def plain_current(self) -> list[dict[str, Any]]:
        """``current/`` read as any Parquet reader would (the base only)."""
        path = f"{self.lander.table_path(TABLE)}/current"
        df = self.spark.read.parquet(path)
        return sorted(df.select(*data_columns(df)).toArrow().to_pylist(), key=lambda r: r["id"])

    def changelog_positions(self) -> list[str]:
        changelog = self.lander.changelog(TABLE)
        assert changelog is not None
        return [r["__pos"] for r in changelog.select("__pos").toArrow().to_pylist()]


def test_a_fresh_snapshot_lands_as_appends_then_log_rows_merge(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    # Chunks closing out of key order (several reads in flight), two in one batch.
    b1 = lake.stage(1, chunk(range(10, 20), 100))
    b2 = lake.stage(2, chunk(range(0, 10), 101), chunk(range(30, 40), 102))
    b3 = lake.stage(3, chunk(range(20, 30), 103))
    lake.lander.land([b1])
    lake.lander.land([b2, b3])
    meta = lake.lander.meta(TABLE)
    assert meta is not None
    assert (meta.tail_rows, meta.base_through, meta.base_rows) == (0, 3, 40)
    assert not lake.lander.compaction_due(meta, idle=True)  # nothing to compact, ever
    snapshot = {k: f"r{k}" for k in range(40)}
    assert lake.state() == snapshot
    plain = lake.plain_current()
    assert [(r["id"], r["name"], r["price"]) for r in plain] == [
        (k, f"r{k}", pa.scalar(f"{k}.25").cast(pa.decimal128(12, 2)).as_py()) for k in range(40)
    ]
    assert len(lake.changelog_positions()) == 40  # the changelog has every READ row too

    # Log rows go through the tail; READ rows of keys never landed after them are still
    # appends (in the base and, the base no longer holding every batch whole, in the tail),
    # but not the READ row of key 100, which a log row created first.
    b4 = lake.stage(4, [log("u", 1, 200), log("d", 2, 201), log("c", 100, 202)])
    b5 = lake.stage(5, chunk(range(50, 55), 300), chunk(range(99, 102), 301))
    lake.lander.land([b4, b5])
    meta = lake.lander.meta(TABLE)
    assert meta is not None
    assert (meta.tail_rows, meta.base_through, meta.base_rows) == (3 + 1, 3, 47)
    expected = {**snapshot, 1: "log1", 100: "r100", **{k: f"r{k}" for k in range(50, 55)}}
    expected.update({99: "r99", 101: "r101"})
    del expected[2]
    assert lake.state() == expected
    # A plain reader sees the base: the snapshot and the appends, not yet the tail.
    in_base = {r["id"]: r["name"] for r in lake.plain_current()}
    assert in_base == {**snapshot, **{k: f"r{k}" for k in (*range(50, 55), 99, 101)}}
    lake.lander.compact(TABLE)
    meta = lake.lander.meta(TABLE)
    assert meta is not None and (meta.base, meta.base_through, meta.tail_rows) == (5, None, 0)
    assert lake.state() == expected
    assert {r["id"]: r["name"] for r in lake.plain_current()} == expected

    # A second snapshot of the table re-reads keys it has: merged, never appended.
    b6 = lake.stage(6, chunk(range(0, 5), 400, "again"))
    lake.lander.land([b6])
    meta = lake.lander.meta(TABLE)
    assert meta is not None and meta.tail_rows == 5 and meta.base_rows == len(expected)
    again = {**expected, **{k: f"again{k}" for k in range(0, 5)}}
    assert lake.state() == again


def test_batches_landed_again_with_other_rows_leave_no_appended_row_twice(
    tmp_path: Path,
) -> None:
    """Batches 2 and 3 were landed, then (a crash before the state recorded them) the log
    replayed their events, staged again as batch 2 with other contents: what the first
    landing appended from batch 2 on goes, and the new batch 2 lands in full."""
    lake = Lake(tmp_path)
    lake.lander.land([lake.stage(1, chunk(range(0, 10), 100))])
    b2 = lake.stage(2, chunk(range(10, 20), 101))
    b3 = lake.stage(3, chunk(range(20, 30), 102))
    lake.lander.land([b2, b3])
    for batch in (b2, b3):
        lake.staging.remove(batch)
    # The replay: the same chunks read again later (new positions), with a log row between.
    again = lake.stage(2, chunk(range(10, 25), 110, "new"), [log("u", 3, 111)])
    lake.lander.land([again])
    meta = lake.lander.meta(TABLE)
    assert meta is not None and meta.base_through == 1
    expected = {
        **{k: f"r{k}" for k in range(10)},
        **{k: f"new{k}" for k in range(10, 25)},
        # Batch 3's partition of the first landing is still in the changelog (the log
        # replays its events in a later batch, which overwrites it); its rows are events
        # that happened, merged by position like any other.
        **{k: f"r{k}" for k in range(25, 30)},
        3: "log3",
    }
    assert lake.state() == expected
    assert not [
        name
        # Appended files: base-<batch>.b<batch appended>-<uuid>.parquet
        for name in (Path(lake.lander.table_path(TABLE)) / "current").glob("base-*.b*")
        if int(name.name.split(".b", 1)[1][:12]) >= 2
    ]


def test_a_landing_retried_whole_appends_once(tmp_path: Path) -> None:
    lake = Lake(tmp_path)
    b1 = lake.stage(1, chunk(range(0, 10), 100))
    b2 = lake.stage(2, chunk(range(10, 20), 101))
    lake.lander.land([b1, b2])
    lake.lander.land([b1, b2])  # a crash before the staged batches were removed
    assert lake.state() == {k: f"r{k}" for k in range(20)}
    assert len(lake.plain_current()) == 20
    assert len(lake.changelog_positions()) == 20


@pytest.mark.parametrize("together", [False, True])
def test_log_rows_landed_before_the_first_read_rows_stay_in_the_state(
    tmp_path: Path, together: bool
) -> None:
    """A table whose log rows land before its snapshot's first READ rows (a writer busy
    before the signal): the base the READ rows start holds none of those earlier rows, so
    they are merged, never skipped (found by the Spanner convergence test)."""
    lake = Lake(tmp_path)
    b1 = lake.stage(1, [log("c", 100, 50), log("c", 101, 51)])
    b2 = lake.stage(2, chunk(range(0, 10), 100))
    if together:
        lake.lander.land([b1, b2])
    else:
        lake.lander.land([b1])
        lake.lander.land([b2])
    expected = {100: "log100", 101: "log101", **{k: f"r{k}" for k in range(10)}}
    assert lake.state() == expected
    lake.lander.compact(TABLE)
    assert lake.state() == expected
    assert {r["id"]: r["name"] for r in lake.plain_current()} == expected


def test_a_snapshot_chunk_is_linked_into_changelog_and_current_not_written_again(
    tmp_path: Path,
) -> None:
    """The staged file is the changelog's file of its batch, and the stager's copy without
    before-images the base's file (the same inodes: nothing read or encoded again); plain
    readers read both whole."""
    import os

    import pyarrow.parquet as pq

    lake = Lake(tmp_path)
    batch = lake.stage(1, chunk(range(0, 20), 100))
    part = batch.tables[0]
    assert part.current_file is not None
    assert "__before" not in pq.read_schema(part.current_file).names
    lake.lander.land([batch])
    root = Path(lake.lander.table_path(TABLE))
    changelog = [p for p in (root / "changelog").iterdir() if not p.name.startswith(".")]
    current = [p for p in (root / "current").iterdir() if not p.name.startswith((".", "_"))]
    assert [os.stat(p).st_ino for p in changelog] == [os.stat(part.file).st_ino]
    assert [os.stat(p).st_ino for p in current] == [os.stat(part.current_file).st_ino]
    assert [r["id"] for r in lake.plain_current()] == list(range(20))
    assert len(lake.changelog_positions()) == 20

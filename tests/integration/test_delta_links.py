"""Delta appends of a snapshot's chunks as the staged files themselves (``delta_links``):
the changelog's data file is the staged file and the current state's the stager's copy
without before-images (the same inodes: nothing read or encoded again), each with
statistics from its footer; judged by Spark's Delta reader and by deltalake (delta-rs), and
by a later MERGE narrowed to the batch's keys."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest

from signals.names import TableId
from snapshotter.config import SparkConfig
from snapshotter.core.events import ChangeEvent, Op, SnapshotMarker, Source
from snapshotter.core.position import Position
from snapshotter.core.window import ReadBatch
from snapshotter.sinks.spark.lander import Lander
from snapshotter.sinks.spark.session import spark_session
from snapshotter.sinks.spark.staging import StagingArea
from snapshotter.sinks.spark.types import events_to_landed, read_batch_to_landed
from snapshotter.sources.base import ColumnInfo, TableSchema
from tests.integration.engine_harness import SPARK_MASTER

pytestmark = pytest.mark.integration

TABLE = TableId("shop", "items")
KEYS = ["id"]
SCHEMA = TableSchema(
    TABLE,
    (
        ColumnInfo("id", "bigint", 20, False, pa.int64()),
        ColumnInfo("name", "text", 25, True, pa.string()),
    ),
    ("id",),
)


def _source(pos: int) -> Source:
    return Source("postgresql", "shop", "shop", TABLE, Position(pos), 1, SnapshotMarker.FALSE)


def chunk(keys: range, close: int) -> ReadBatch:
    rows = pa.Table.from_pylist(
        [{"id": k, "name": f"r{k}"} for k in keys], schema=SCHEMA.arrow_schema()
    )
    batch = ReadBatch("w", TABLE, ("id",), rows, Position(close), len(keys), None, False)
    return batch.stamped(_source(close), 5, None)


def test_snapshot_chunks_are_linked_into_both_delta_tables(tmp_path: Path) -> None:
    import deltalake

    spark = spark_session(SparkConfig(master=SPARK_MASTER), delta=True)
    staging = StagingArea(tmp_path / "staging")
    staging.open()
    lander = Lander(spark, str(tmp_path / "lake"), "delta")
    parts = []
    for seq, keys in ((1, range(0, 40)), (2, range(40, 80))):
        batch = staging.stage(
            seq, [(TABLE, KEYS, read_batch_to_landed(SCHEMA, chunk(keys, seq * 100), seq))]
        )
        lander.land([batch])
        parts.append(batch.tables[0])
    root = Path(lander.table_path(TABLE))

    def files(table: str) -> list[dict[str, object]]:
        actions = deltalake.DeltaTable(str(root / table)).get_add_actions(flatten=True)
        rows: list[dict[str, object]] = pa.table(actions).to_pylist()
        return rows

    changelog, current = files("changelog"), files("current")
    assert {os.stat(root / "changelog" / str(f["path"])).st_ino for f in changelog} == {
        os.stat(p.file).st_ino for p in parts
    }
    assert {os.stat(root / "current" / str(f["path"])).st_ino for f in current} == {
        os.stat(p.current_file).st_ino for p in parts if p.current_file is not None
    }
    # Statistics from the footers: what a MERGE skips files by.
    assert sorted(
        tuple(int(str(f[c])) for c in ("min.id", "max.id", "num_records")) for f in current
    ) == [
        (0, 39, 40),
        (40, 79, 40),
    ]
    assert sorted(int(str(f["max.__batch"])) for f in changelog) == [1, 2]
    # A log batch then merges into them: one key updated, one deleted.
    events = [
        ChangeEvent(Op.UPDATE, _source(300), 1, (5,), after={"id": 5, "name": "new"}),
        ChangeEvent(Op.DELETE, _source(301), 1, (60,), before={"id": 60}),
    ]
    lander.land([staging.stage(3, [(TABLE, KEYS, events_to_landed(SCHEMA, KEYS, events, 3))])])
    expected = {k: f"r{k}" for k in range(80) if k != 60} | {5: "new"}
    by_spark = spark.read.format("delta").load(str(root / "current")).collect()
    assert {r["id"]: r["name"] for r in by_spark} == expected
    assert len(by_spark) == len(expected)
    query = deltalake.QueryBuilder().register("t", deltalake.DeltaTable(str(root / "current")))
    by_rs = (
        pa.RecordBatchReader.from_stream(query.execute("SELECT * FROM t")).read_all().to_pylist()
    )
    assert {r["id"]: r["name"] for r in by_rs} == expected
    assert len(by_rs) == len(expected)
    log_rows = pa.table(deltalake.DeltaTable(str(root / "changelog")).to_pyarrow_table())
    assert log_rows.num_rows == 82
    assert json.loads(json.dumps(sorted(set(log_rows.column("__batch").to_pylist())))) == [1, 2, 3]

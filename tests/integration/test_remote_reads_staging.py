"""READ rows read on executors staged by pyarrow (``stage_remote_reads``) are the rows the
Spark job (``write_remote_reads``) staged: the window's dropped keys left out (a composite
key), the same ``__pos`` per row (the close position's token and the READ index in 16 hex
digits), ``__op``, ``__ts_ms``, ``__snapshot``, ``__batch``; in the landed schema."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from signals.model import WatermarkKind
from signals.names import TableId
from snapshotter.config import SparkConfig
from snapshotter.core.events import Source
from snapshotter.core.position import Position
from snapshotter.core.window import RAW_KEY_PREFIX, ROW_INDEX, ChunkWindow, StagedRows
from snapshotter.engine.executor_reads import INDEX_BITS
from snapshotter.sinks.spark.remote_reads import stage_remote_reads, write_remote_reads
from snapshotter.sinks.spark.session import spark_session
from snapshotter.sinks.spark.types import BEFORE, landed_schema
from snapshotter.sources.base import ColumnInfo, TableSchema
from tests.integration.engine_harness import SPARK_MASTER

pytestmark = pytest.mark.integration

TABLE = TableId("public", "items")
KEYS = ("a", "b")


def _col(name: str, arrow: pa.DataType) -> ColumnInfo:
    return ColumnInfo(name, "x", 0, True, arrow)


SCHEMA = TableSchema(
    TABLE, (_col("a", pa.int64()), _col("b", pa.string()), _col("n", pa.float64())), KEYS
)


def _file(directory: Path, index: int, keys: list[tuple[int, str]]) -> str:
    count = len(keys)
    first = index << INDEX_BITS
    table = pa.table(
        {
            "a": [k[0] for k in keys],
            "b": [k[1] for k in keys],
            "n": [k[0] / 3 for k in keys],
            RAW_KEY_PREFIX + "a": [k[0] for k in keys],
            RAW_KEY_PREFIX + "b": [k[1] for k in keys],
            ROW_INDEX: pa.array(range(first, first + count), pa.int64()),
        }
    )
    path = directory / f"part-{index:05d}.parquet"
    pq.write_table(table, path)
    return str(path)


def test_pyarrow_stages_the_rows_the_spark_job_staged(tmp_path: Path) -> None:
    reads = tmp_path / "reads"
    reads.mkdir()
    files = (
        _file(reads, 0, [(i, f"k{i % 3}") for i in range(0, 40)]),
        _file(reads, 1, [(i, f"k{i % 3}") for i in range(40, 90)]),
    )
    key_types = pa.schema([("a", pa.int64()), ("b", pa.string())])
    window = ChunkWindow("w", TABLE, list(KEYS))
    window.open(Position(10, 0))
    window.judge(window.watermark(WatermarkKind.CLOSE))
    window.fill_staged(StagedRows(files, 90, (89, "k2"), key_types, None))
    from tests.unit.test_executor_reads import change

    for at, key in enumerate([(3, "k0"), (50, "k2"), (51, "nope")], start=11):
        assert window.observe(_keyed(change(key[0], at), key))
    closed = window.close(Position(20, 1))
    source = Source("postgresql", "srv", "db", TABLE, Position(20, 1), ts_ms=5)
    batch = closed.stamped(source, 1234, None)  # type: ignore[union-attr]
    assert batch.dropped == 3

    spark = spark_session(SparkConfig(master=SPARK_MASTER))
    by_spark, by_arrow = tmp_path / "spark", tmp_path / "arrow"
    write_remote_reads(spark, SCHEMA, [batch], 7, str(by_spark))
    assert stage_remote_reads(SCHEMA, [batch], 7, str(by_arrow))

    def rows(directory: Path) -> list[tuple[object, ...]]:
        table = pq.read_table(directory).drop_columns(
            [c for c in (BEFORE,) if c in pq.read_schema(next(directory.glob("*.parquet"))).names]
        )
        return sorted(tuple(r.values()) for r in table.to_pylist())

    assert [n.name for n in by_arrow.iterdir()] == ["part-00000.parquet"]
    assert pq.read_schema(by_arrow / "part-00000.parquet") == landed_schema(SCHEMA)
    got, want = rows(by_arrow), rows(by_spark)
    assert len(got) == 88 and got == want
    assert not any(r[0] in (3, 50) for r in got)


def _keyed(event, key):  # type: ignore[no-untyped-def]
    """``event`` for the composite key ``key``."""
    from dataclasses import replace

    row = {"a": key[0], "b": key[1]}
    return replace(event, key=key, before=row, after=row)

"""A staged directory (READ rows read on executors beside the batch's log rows) lands into
the Parquet changelog as one table without Spark: every file's rows, in one schema (the
union: a file Spark staged lacks ``__before``), or the table's new schema when it changed;
a directory without files lands nothing."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from snapshotter.sinks.spark.formats.parquet_landing import _rows_of

BEFORE_TYPE = pa.struct([("id", pa.int64())])


def test_every_files_rows_in_the_union_of_their_schemas(tmp_path: Path) -> None:
    pq.write_table(
        pa.table({"id": [1], "__op": ["u"], "__before": pa.array([{"id": 1}], BEFORE_TYPE)}),
        tmp_path / "part-local.parquet",
    )
    pq.write_table(pa.table({"id": [2, 3], "__op": ["r", "r"]}), tmp_path / "part-w00000.parquet")
    rows = _rows_of(tmp_path, None)
    assert rows is not None
    assert rows.column_names == ["id", "__op", "__before"]
    assert sorted(rows.to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "__op": "u", "__before": {"id": 1}},
        {"id": 2, "__op": "r", "__before": None},
        {"id": 3, "__op": "r", "__before": None},
    ]


def test_the_tables_new_schema_when_it_changed(tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": pa.array([2], pa.int32())}), tmp_path / "part-w00000.parquet")
    target = pa.schema([("id", pa.int64()), ("added", pa.string())])
    rows = _rows_of(tmp_path, target)
    assert rows is not None and rows.schema == target
    assert rows.to_pylist() == [{"id": 2, "added": None}]


def test_a_directory_without_files_lands_nothing(tmp_path: Path) -> None:
    (tmp_path / "_SUCCESS").write_text("")
    assert _rows_of(tmp_path, None) is None

"""``delta_create``: a Delta table created by writing its first commit is the table Spark's
builder creates (the protocol Spark's Delta 4 records for the same properties, read back by
delta-rs, a reader no one here wrote), and a second create changes nothing."""

from __future__ import annotations

from pathlib import Path

import deltalake
import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
)

from snapshotter.sinks.spark.formats.delta import CURRENT_PROPERTIES
from snapshotter.sinks.spark.formats.delta_create import create_table, protocol

SCHEMA = StructType([StructField("id", LongType()), StructField("name", StringType())])


def test_the_current_states_protocol_is_the_one_spark_records() -> None:
    # Spark 4.1.4 / Delta 4.4.0's commit 0 for these properties, read from its _delta_log.
    assert protocol(CURRENT_PROPERTIES, SCHEMA) == {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": ["deletionVectors"],
        "writerFeatures": ["appendOnly", "changeDataFeed", "deletionVectors", "invariants"],
    }
    assert protocol({}, SCHEMA) == {"minReaderVersion": 1, "minWriterVersion": 2}
    # A timestamp without time zone, even nested, needs its feature to read and to write.
    nested = StructType([StructField("at", ArrayType(TimestampNTZType()))])
    assert protocol({}, StructType([StructField("s", nested)])) == {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": ["timestampNtz"],
        "writerFeatures": ["appendOnly", "invariants", "timestampNtz"],
    }


def test_a_created_table_is_read_by_delta_rs_and_created_once(tmp_path: Path) -> None:
    location = f"file:{tmp_path / 'current'}"
    assert create_table(location, SCHEMA, CURRENT_PROPERTIES)
    table = deltalake.DeltaTable(str(tmp_path / "current"))
    assert table.version() == 0
    assert table.metadata().configuration == CURRENT_PROPERTIES
    assert pa.schema(table.schema().to_arrow()).names == ["id", "name"]
    assert table.protocol().reader_features == ["deletionVectors"]
    query = deltalake.QueryBuilder().register("t", table)
    rows = pa.RecordBatchReader.from_stream(query.execute("SELECT * FROM t")).read_all()
    assert rows.num_rows == 0
    assert create_table(location, SCHEMA, {})  # there already: nothing written
    assert deltalake.DeltaTable(str(tmp_path / "current")).metadata().configuration == (
        CURRENT_PROPERTIES
    )
    assert [p.name for p in (tmp_path / "current" / "_delta_log").iterdir()] == [
        "00000000000000000000.json"
    ]


def test_a_remote_location_is_left_to_spark() -> None:
    assert not create_table("s3://bucket/current", SCHEMA, {})


def test_an_empty_log_left_by_a_crash_is_no_table_and_is_created_over(tmp_path: Path) -> None:
    """A crash between making ``_delta_log`` and linking commit 0 leaves the directory alone:
    that is no table (every landing would fail on it), and the next create writes it."""
    from typing import Any, cast

    from snapshotter.sinks.spark.formats.delta import DeltaTables

    (tmp_path / "current" / "_delta_log").mkdir(parents=True)
    tables = DeltaTables(cast(Any, None))  # the local check asks no Spark session
    assert tables.fresh(str(tmp_path))
    assert create_table(str(tmp_path / "current"), SCHEMA, CURRENT_PROPERTIES)
    assert not tables.fresh(str(tmp_path))
    assert deltalake.DeltaTable(str(tmp_path / "current")).version() == 0

"""formats.schema_changes without Spark or a server: what counts as a change, what "fail"
says, and the Parquet schema a landing writes in (columns added, widened, kept)."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa
import pytest
from pyspark.sql.types import DecimalType, IntegerType, LongType, StringType

from signals.names import TableId
from snapshotter.sinks.spark.formats.schema_changes import (
    SchemaChangeRefused,
    check,
    conform,
    diff,
    dropped,
    unified,
)
from snapshotter.sinks.spark.formats.staged import SchemaChangeError
from snapshotter.sinks.spark.lander import TableMeta

TABLE = TableId("public", "items")
LANDED = {"id": LongType(), "price": DecimalType(10, 2), "name": StringType()}


def _meta() -> TableMeta:
    return TableMeta("public", "items", "parquet", ["id"])


def test_added_widened_and_dropped_columns_are_told_apart() -> None:
    staged = {"id": LongType(), "price": DecimalType(20, 2), "note": StringType()}
    found = {(c.kind, c.column) for c in diff(LANDED, staged, set())}
    assert found == {("widen", "price"), ("drop", "name"), ("add", "note")}
    # A column already recorded as dropped is not dropped again; narrower staged types
    # (batches staged before a widening) are no change.
    staged_before = {"id": LongType(), "price": DecimalType(10, 2)}
    assert diff({**LANDED, "price": DecimalType(20, 2)}, staged_before, {"name"}) == []


def test_evolve_records_each_change_once_with_its_batch() -> None:
    meta = _meta()
    staged = [{"id": LongType(), "price": DecimalType(10, 2)}] * 2
    check(TABLE, meta, LANDED, staged, "evolve", 7)
    assert [(e["change"], e["column"], e["batch"]) for e in meta.schema_changes] == [
        ("drop", "name", 7)
    ]
    assert dropped(meta) == {"name"}
    assert check(TABLE, meta, LANDED, staged, "evolve", 8) == []  # kept, not dropped again


def test_fail_names_the_table_the_change_and_the_fix() -> None:
    meta = _meta()
    with pytest.raises(SchemaChangeRefused) as refused:
        check(TABLE, meta, LANDED, [{**LANDED, "note": StringType()}], "fail", 3)
    message = str(refused.value)
    assert "public.items: column note string added" in message
    assert '"evolve"' in message and meta.schema_changes == []


def test_a_type_change_that_is_no_widening_is_refused_either_way() -> None:
    with pytest.raises(SchemaChangeError, match="changed from decimal\\(10,2\\) to int"):
        check(TABLE, _meta(), LANDED, [{**LANDED, "price": IntegerType()}], "evolve", 3)


def test_parquet_rows_conform_to_the_unified_schema() -> None:
    landed = pa.schema([("id", pa.int64()), ("price", pa.decimal128(10, 2)), ("name", pa.string())])
    staged = pa.schema([("id", pa.int64()), ("price", pa.decimal128(20, 2)), ("note", pa.string())])
    target = unified(landed, staged)
    assert target.names == ["id", "price", "name", "note"]
    assert target.field("price").type == pa.decimal128(20, 2)
    old = pa.table({"id": [1], "price": [Decimal("1.50")], "name": ["a"]}, schema=landed)
    new = conform(old, target)
    assert new.schema == target
    assert new.to_pylist() == [{"id": 1, "price": Decimal("1.50"), "name": "a", "note": None}]
    # A struct (a before-image) gains the added field, NULL where the row was NULL.
    before = pa.struct([("id", pa.int64())])
    rows = pa.table({"b": pa.array([{"id": 1}, None], before)})
    wide = pa.schema([("b", pa.struct([("id", pa.int64()), ("note", pa.string())]))])
    assert conform(rows, wide).to_pylist() == [{"b": {"id": 1, "note": None}}, {"b": None}]


def test_a_value_past_its_column_raises_under_strict_values_else_lands_null() -> None:
    """The sink converts under ``strict_values`` and describes the table again when a value
    does not fit (a column widened at the source); outside it such a value lands NULL."""
    from snapshotter.sinks.spark.types import ValuesDoNotFit, rows_to_landed, strict_values
    from snapshotter.sources.base import ColumnInfo, TableSchema

    column = ColumnInfo("price", "decimal(10,2)", 246, True, pa.decimal128(10, 2))
    schema = TableSchema(TABLE, (column,), ())
    rows = [{"price": Decimal("1000000000000.00")}]
    with strict_values(), pytest.raises(ValuesDoNotFit, match="price"):
        rows_to_landed(schema, rows)
    assert rows_to_landed(schema, rows)[0].to_pylist() == [None]

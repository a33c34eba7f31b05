"""Events to landed Arrow tables (pure: no Spark, no database)."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from signals.names import TableId
from snapshotter.core.events import ChangeEvent, Op, SnapshotMarker, Source
from snapshotter.core.position import Position
from snapshotter.core.values import UNAVAILABLE_VALUE, RawJson
from snapshotter.sinks.spark.staging import StagingArea, StagingError
from snapshotter.sinks.spark.types import (
    LandingTypeError,
    events_to_landed,
    landed_schema,
    unknown_columns,
)
from snapshotter.sources.base import ColumnInfo, TableSchema

T = TableId("s", "t")


def col(name: str, arrow: pa.DataType, type_name: str = "x", code: int = 0) -> ColumnInfo:
    return ColumnInfo(name, type_name, code, True, arrow)


SCHEMA = TableSchema(
    T,
    (
        col("id", pa.int64()),
        col("price", pa.string(), "numeric(12,2)", 1700),
        col("free", pa.string(), "numeric", 1700),
        col("at", pa.timestamp("us", tz="UTC")),
        col("local", pa.timestamp("us")),
        col("t", pa.time64("us")),
        col("d", pa.duration("us")),
        col("u", pa.uint64()),
        col("wide", pa.decimal256(50, 2)),
        col("doc", pa.string(), "jsonb", 3802),
        col("raw", pa.binary()),
        col("day", pa.date32()),
    ),
    ("id",),
)


def src(pos: int) -> Source:
    return Source("postgresql", "db", "db", T, Position(pos), 5, SnapshotMarker.FALSE)


def upsert(op: Op, key: int, pos: int, **values: object) -> ChangeEvent:
    return ChangeEvent(op, src(pos), 7, (key,), after={"id": key, **values})


def test_types_follow_the_catalog() -> None:
    schema = landed_schema(SCHEMA)
    assert schema.field("price").type == pa.decimal128(12, 2)
    assert schema.field("free").type == pa.string()
    assert schema.field("at").type == pa.timestamp("us", tz="UTC")
    assert schema.field("local").type == pa.timestamp("us")
    assert schema.field("t").type == pa.string()
    assert schema.field("d").type == pa.string()
    assert schema.field("u").type == pa.decimal128(20, 0)
    assert schema.field("wide").type == pa.string()
    assert schema.names[-7:] == [
        "__op",
        "__pos",
        "__ts_ms",
        "__snapshot",
        "__unavailable",
        "__batch",
        "__before",
    ]
    # The before-image: a struct of the table's columns, typed as they land.
    before = schema.field("__before").type
    assert [f.name for f in before] == schema.names[:-7]
    assert [f.type for f in before] == [schema.field(n).type for n in schema.names[:-7]]


def test_values_land_exactly() -> None:
    event = upsert(
        Op.CREATE,
        1,
        10,
        price="12.30",
        free="1e-30",
        at=datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
        local=datetime(2024, 1, 2, 3, 4, 5),
        t=time(1, 2, 3, 4),
        d=-timedelta(hours=30, microseconds=5),
        u=2**64 - 1,
        wide=Decimal("123456789012345678901234567890123456789012345678.25"),
        doc=RawJson('{"a": [1, 2.50]}'),
        raw=b"\x00\xff",
        day=date(2024, 2, 29),
    )
    row = events_to_landed(SCHEMA, ["id"], [event], 3).to_pylist()[0]
    assert row["price"] == Decimal("12.30")
    assert row["free"] == "1e-30"
    assert row["at"] == datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    assert row["t"] == "01:02:03.000004"
    assert row["d"] == "-30:00:00.000005"
    assert row["u"] == Decimal(2**64 - 1)
    assert row["wide"] == "123456789012345678901234567890123456789012345678.25"
    assert row["doc"] == '{"a": [1, 2.50]}'
    assert row["raw"] == b"\x00\xff"
    assert (row["__op"], row["__pos"], row["__ts_ms"], row["__batch"]) == (
        "c",
        Position(10).token,
        7,
        3,
    )


def test_deletes_truncates_and_unavailable_values() -> None:
    events = [
        ChangeEvent(Op.DELETE, src(1), 7, (4,), before={"id": 4}),
        ChangeEvent(Op.TRUNCATE, src(2), 7, None),
        upsert(Op.UPDATE, 5, 3, price="1.00", doc=UNAVAILABLE_VALUE, raw=UNAVAILABLE_VALUE),
    ]
    rows = events_to_landed(SCHEMA, ["id"], events, 1).to_pylist()
    assert rows[0]["id"] == 4 and rows[0]["__op"] == "d"
    assert rows[1]["id"] is None and rows[1]["__op"] == "t"
    assert rows[2]["doc"] is None and rows[2]["raw"] is None
    assert rows[2]["__unavailable"] == ["doc", "raw"]
    assert rows[0]["__unavailable"] is None


def test_a_numeric_nan_lands_as_null() -> None:
    rows = events_to_landed(SCHEMA, ["id"], [upsert(Op.CREATE, 1, 1, price="NaN")], 1)
    assert rows.to_pylist()[0]["price"] is None


def test_a_value_python_cannot_hold_lands_as_null_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    events = [upsert(Op.CREATE, 1, 1, at="infinity"), upsert(Op.CREATE, 2, 2, at=None)]
    rows = events_to_landed(SCHEMA, ["id"], events, 1).to_pylist()
    assert [r["at"] for r in rows] == [None, None]
    assert "'at'" in caplog.text and "infinity" in caplog.text


def test_a_column_named_like_a_meta_column_is_refused() -> None:
    schema = TableSchema(T, (col("id", pa.int64()), col("__op", pa.string())), ("id",))
    with pytest.raises(LandingTypeError, match="__op"):
        landed_schema(schema)


def test_unknown_columns_are_found() -> None:
    event = upsert(Op.CREATE, 1, 1, added=3)
    assert unknown_columns(SCHEMA, [event]) == {"added"}


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("cud"), st.integers(0, 5), st.integers(0, 1000)), max_size=30
    )
)
def test_replaying_the_landed_rows_gives_the_oracle_state(
    changes: list[tuple[str, int, int]],
) -> None:
    """Per key the row with the highest __pos, deletes removed, equals applying the events in
    order (what the landing's current state keeps)."""
    schema = TableSchema(T, (col("id", pa.int64()), col("n", pa.int64())), ("id",))
    events = []
    oracle: dict[int, int] = {}
    for i, (op, key, n) in enumerate(changes):
        if op == "d":
            events.append(ChangeEvent(Op.DELETE, src(i), 1, (key,), before={"id": key}))
            oracle.pop(key, None)
        else:
            events.append(ChangeEvent(Op(op), src(i), 1, (key,), after={"id": key, "n": n}))
            oracle[key] = n
    landed = events_to_landed(schema, ["id"], events, 1).to_pylist()
    latest: dict[int, dict[str, object]] = {}
    for row in landed:
        key = row["id"]
        assert isinstance(key, int)
        if key not in latest or str(row["__pos"]) > str(latest[key]["__pos"]):
            latest[key] = row
    state = {k: r["n"] for k, r in latest.items() if r["__op"] != "d"}
    assert state == oracle


def test_staging_is_all_or_nothing(tmp_path: Path) -> None:
    area = StagingArea(tmp_path)
    area.open()
    data = events_to_landed(SCHEMA, ["id"], [upsert(Op.CREATE, 1, 1)], 1)
    batch = area.stage(1, [(T, ["id"], data)])
    assert pq.read_table(batch.tables[0].file).num_rows == 1
    (tmp_path / ".tmp-batch-000000000002-x").mkdir()  # what a crash mid-stage leaves
    area.stage(2, [(T, ["id"], data)])
    area.open()
    assert not list(tmp_path.glob(".tmp-*"))
    assert [b.seq for b in area.batches()] == [1, 2]
    assert area.discard_after(1) == [2]
    assert [b.seq for b in area.batches()] == [1]
    with pytest.raises(StagingError, match="twice"):
        area.stage(1, [(T, ["id"], data)])


def test_updates_and_deletes_keep_their_before_image_reads_and_creates_have_none() -> None:
    schema = TableSchema(T, (col("id", pa.int64()), col("name", pa.string())), ("id",))
    events = [
        upsert(Op.CREATE, 1, 1, name="a"),
        ChangeEvent(
            Op.UPDATE, src(2), 7, (1,), before={"id": 1, "name": "a"}, after={"id": 1, "name": "b"}
        ),
        # An unchanged TOAST value in a before-image: NULL, never the placeholder text.
        ChangeEvent(Op.DELETE, src(3), 7, (1,), before={"id": 1, "name": UNAVAILABLE_VALUE}),
        # No before-image (PostgreSQL's REPLICA IDENTITY DEFAULT): NULL.
        ChangeEvent(Op.UPDATE, src(4), 7, (2,), after={"id": 2, "name": "c"}),
    ]
    landed = events_to_landed(schema, ["id"], events, 1)
    assert landed.column("__before").to_pylist() == [
        None,
        {"id": 1, "name": "a"},
        {"id": 1, "name": None},
        None,
    ]
    assert landed.column("name").to_pylist() == ["a", "b", None, "c"]

"""READ batches land column-wise (``read_batch_to_landed``) as the same Arrow table as the same
rows arriving one by one: as the batch's own ``op: "r"`` events, and, apart from the meta
columns that say how a row came (``__op``, ``__pos``, ``__snapshot``, ``__ts_ms``), as log
creates of the same values. Pure: no Spark, no database.

The columns cover the Arrow storage types both dialects' chunk readers build (PostgreSQL:
int8, float8, numeric as text, bool, bytea, date, timestamp with and without zone, time,
json/jsonb text; MySQL/MariaDB: BIGINT UNSIGNED as uint64, DECIMAL as decimal128 and, past
38 digits, decimal256, TIME as duration, JSON text), with NULLs everywhere, NaN and
infinities, and numeric NaN (which lands as NULL on both paths).
"""

from __future__ import annotations

import json
import math
from datetime import UTC, timedelta
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from signals.names import TableId
from snapshotter.core.events import ChangeEvent, Op, SnapshotMarker, Source
from snapshotter.core.position import Position
from snapshotter.core.values import RawJson
from snapshotter.core.window import ReadBatch
from snapshotter.sinks.spark.types import (
    OP,
    POS,
    SNAPSHOT,
    TS_MS,
    events_to_landed,
    read_batch_to_landed,
    read_batch_unknown_columns,
)
from snapshotter.sources.base import ColumnInfo, TableSchema
from snapshotter.sources.mysql import types as my_types
from snapshotter.sources.postgres import types as pg_types
from snapshotter.sources.sql_common import columns_converter

T = TableId("s", "t")


def col(name: str, arrow: pa.DataType, type_name: str = "x", code: int = 0) -> ColumnInfo:
    return ColumnInfo(name, type_name, code, True, arrow)


SCHEMA = TableSchema(
    T,
    (
        col("id", pa.int64()),
        col("i", pa.int64()),
        col("u", pa.uint64()),  # MySQL BIGINT UNSIGNED
        col("dec", pa.decimal128(12, 2)),  # MySQL DECIMAL(12,2)
        col("wide", pa.decimal256(50, 2)),  # MySQL DECIMAL(50,2)
        col("num", pa.string(), "numeric(12,2)", 1700),  # PostgreSQL numeric(12,2) as text
        col("free", pa.string(), "numeric", 1700),  # PostgreSQL numeric as text
        col("f", pa.float64()),
        col("flag", pa.bool_()),
        col("s", pa.string()),
        col("raw", pa.binary()),
        col("day", pa.date32()),
        col("at", pa.timestamp("us", tz="UTC")),
        col("local", pa.timestamp("us")),
        col("clock", pa.time64("us")),  # PostgreSQL time
        col("span", pa.duration("us")),  # MySQL TIME
        col("pj", pa.string(), "jsonb", 3802),  # PostgreSQL jsonb text
        col("mj", pa.string(), "json", 245),  # MySQL JSON text
    ),
    ("id",),
)
KEYS = ("id",)
JSON_COLUMNS = ("pj", "mj")

# The dialects' own converters from a chunk row to the value model (JSON text -> RawJson).
_pg_json = pg_types.finish_value
_my_json = my_types.chunk_converter("json")
assert _my_json is not None
CONVERT = columns_converter({"pj": lambda v: _pg_json(3802, v), "mj": _my_json})

_MYSQL_TIME = timedelta(hours=838, minutes=59, seconds=59)


def _nullable(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


_json_doc = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)
_json_text = _json_doc.map(lambda d: json.dumps(d, ensure_ascii=False))


def _decimal_text(digits: int, places: int) -> st.SearchStrategy[str]:
    bound = 10 ** (digits - places) - 1
    return st.decimals(
        min_value=-bound, max_value=bound, places=places, allow_nan=False, allow_infinity=False
    ).map(str)


# Each column's values as the value model holds them (what a log reader emits), minus JSON,
# whose documents are text here and RawJson in the value model.
VALUES: dict[str, st.SearchStrategy[Any]] = {
    "i": st.integers(-(2**63), 2**63 - 1),
    "u": st.integers(0, 2**64 - 1),
    "dec": st.decimals(min_value=-(10**10) + 1, max_value=10**10 - 1, places=2, allow_nan=False),
    "wide": st.decimals(min_value=-(10**48) + 1, max_value=10**48 - 1, places=2, allow_nan=False),
    "num": _decimal_text(12, 2) | st.just("NaN"),
    "free": _decimal_text(30, 12) | st.sampled_from(["NaN", "1e-30", "0.000000000000000001"]),
    "f": st.floats(allow_nan=True, allow_infinity=True),
    "flag": st.booleans(),
    "s": st.text(max_size=12),
    "raw": st.binary(max_size=12),
    "day": st.dates(),
    "at": st.datetimes(timezones=st.just(UTC)),
    "local": st.datetimes(),
    "clock": st.times(),
    "span": st.timedeltas(min_value=-_MYSQL_TIME, max_value=_MYSQL_TIME),
    "pj": _json_text,
    "mj": _json_text,
}

rows_strategy = st.lists(
    st.fixed_dictionaries({name: _nullable(values) for name, values in VALUES.items()}),
    max_size=12,
)


def _chunk_rows(rows: list[dict[str, Any]]) -> pa.Table:
    """The rows as a chunk reader buffers them: Arrow, catalog types, key order."""
    return pa.Table.from_arrays(
        [pa.array([r[c.name] for r in rows], type=c.arrow_type) for c in SCHEMA.columns],
        schema=SCHEMA.arrow_schema(),
    )


def _read_batch(rows: list[dict[str, Any]], close: Position) -> ReadBatch:
    chunk = _chunk_rows(rows)
    batch = ReadBatch(
        window_id="w",
        table=T,
        key_columns=KEYS,
        rows=chunk,
        position=close,
        selected=len(rows),
        last_key=(rows[-1]["id"],) if rows else None,
        truncated=False,
    )
    source = Source("postgresql", "db", "db", T, close, 1_700_000_000_000, SnapshotMarker.FALSE)
    return batch.stamped(source, 1_700_000_000_123, CONVERT)


def _log_creates(rows: list[dict[str, Any]]) -> list[ChangeEvent]:
    """The same rows as a log reader emits them: creates, JSON as RawJson."""
    events = []
    for i, row in enumerate(rows):
        after = {
            c: RawJson(v) if c in JSON_COLUMNS and v is not None else v for c, v in row.items()
        }
        source = Source(
            "postgresql", "db", "db", T, Position(5, i), 1_700_000_000_000, SnapshotMarker.FALSE
        )
        events.append(ChangeEvent(Op.CREATE, source, 42, (row["id"],), after=after))
    return events


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def assert_same_table(got: pa.Table, want: pa.Table) -> None:
    assert got.schema == want.schema
    assert got.num_rows == want.num_rows
    for name in want.column_names:
        got_values = got.column(name).to_pylist()
        want_values = want.column(name).to_pylist()
        for i, (g, w) in enumerate(zip(got_values, want_values, strict=True)):
            assert _same(g, w), f"column {name!r}, row {i}: {g!r} != {w!r}"


def _keyed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"id": i, **row} for i, row in enumerate(rows)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows_strategy)
def test_a_read_batch_lands_as_its_events_and_as_log_creates(rows: list[dict[str, Any]]) -> None:
    rows = _keyed(rows)
    batch = _read_batch(rows, Position(7, 3))
    landed = read_batch_to_landed(SCHEMA, batch, 9)

    # Exactly the batch's own READ events through the row-by-row path, meta columns included.
    assert_same_table(landed, events_to_landed(SCHEMA, KEYS, batch.events(), 9))

    # The same values arriving as log creates land the same, but for how they came.
    how = [OP, POS, SNAPSHOT, TS_MS]
    from_log = events_to_landed(SCHEMA, KEYS, _log_creates(rows), 9)
    assert_same_table(landed.drop_columns(how), from_log.drop_columns(how))
    assert landed.column(OP).to_pylist() == ["r"] * len(rows)
    assert landed.column(SNAPSHOT).to_pylist() == ["incremental"] * len(rows)
    assert landed.column(TS_MS).to_pylist() == [1_700_000_000_123] * len(rows)
    assert landed.column(POS).to_pylist() == [
        Position(7, 3).read_row(i).token for i in range(len(rows))
    ]


def test_durations_land_as_mysql_time_text() -> None:
    spans = [
        timedelta(0),
        -timedelta(microseconds=1),
        timedelta(hours=838, minutes=59, seconds=59),
        -timedelta(hours=838, minutes=59, seconds=59),
        -timedelta(hours=30, microseconds=5),
        timedelta(minutes=1, seconds=2, microseconds=300_000),
        None,
    ]
    rows = _keyed([{**dict.fromkeys(VALUES), "span": s} for s in spans])
    landed = read_batch_to_landed(SCHEMA, _read_batch(rows, Position(1)), 1)
    assert landed.column("span").to_pylist() == [
        "0:00:00.000000",
        "-0:00:00.000001",
        "838:59:59.000000",
        "-838:59:59.000000",
        "-30:00:00.000005",
        "0:01:02.300000",
        None,
    ]


def test_a_numeric_nan_lands_as_null_from_a_read_batch(caplog: pytest.LogCaptureFixture) -> None:
    rows = _keyed([{**dict.fromkeys(VALUES), "num": v} for v in ["NaN", "1.50", None]])
    landed = read_batch_to_landed(SCHEMA, _read_batch(rows, Position(1)), 1)
    assert landed.column("num").to_pylist() == [None, Decimal("1.50"), None]
    assert "'num'" in caplog.text


def test_columns_the_chunk_lacks_land_null_and_extra_ones_are_found() -> None:
    rows = _keyed([dict.fromkeys(VALUES)])
    batch = _read_batch(rows, Position(1))
    narrow = TableSchema(T, (col("id", pa.int64()), col("s", pa.string())), KEYS)
    assert read_batch_unknown_columns(narrow, batch) == set(VALUES) - {"s"}
    wide = TableSchema(T, (*SCHEMA.columns, col("added", pa.int64())), KEYS)
    landed = read_batch_to_landed(wide, batch, 1)
    assert landed.column("added").to_pylist() == [None]
    assert read_batch_unknown_columns(wide, batch) == set()


def test_a_chunk_column_of_another_type_lands_as_the_log_row_would() -> None:
    """Not what a chunk reader should build, but the landing stays the same anyway."""
    rows = _keyed([{**dict.fromkeys(VALUES), "i": 5, "u": 2**64 - 1}])
    batch = _read_batch(rows, Position(1))
    odd = batch.rows.set_column(1, "i", pa.array([5], type=pa.int32()))
    landed = read_batch_to_landed(SCHEMA, _replace_rows(batch, odd), 1)
    assert landed.column("i").type == pa.int64() and landed.column("i").to_pylist() == [5]


def _replace_rows(batch: ReadBatch, rows: pa.Table) -> ReadBatch:
    from dataclasses import replace

    return replace(batch, rows=rows)

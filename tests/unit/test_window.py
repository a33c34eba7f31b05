"""The DBLog chunk window, scenario by scenario."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from signals.names import TableId
from snapshotter.core.events import ChangeEvent, Op, SnapshotMarker, Source
from snapshotter.core.position import Position
from snapshotter.core.window import (
    ChunkWindow,
    ReadBatch,
    WindowKeyError,
    WindowOrderError,
    WindowPhase,
)
from snapshotter.sinks.encoding import encode_value

TABLE = TableId("public", "items")
OTHER = TableId("public", "other")
SIGNALS = TableId("public", "debezium_signal")
OPEN_AT = Position(10, 0)
CLOSE_AT = Position(20, 5)
ID = ("id",)
K1K2 = ("k1", "k2")

_seq = iter(range(11, 10**9))


def src(table: TableId = TABLE, position: Position | None = None) -> Source:
    return Source(
        "postgresql",
        "srv",
        "db",
        table,
        position if position is not None else Position(next(_seq), 0),
        ts_ms=1,
    )


def as_row(key: tuple[Any, ...], cols: tuple[str, ...] = ID) -> dict[str, Any]:
    """A log row holding ``key`` in the key columns ``cols``, plus a non-key column."""
    return {**dict(zip(cols, key, strict=True)), "v": "log"}


def create(key: tuple[Any, ...], table: TableId = TABLE, cols: tuple[str, ...] = ID) -> ChangeEvent:
    return ChangeEvent(Op.CREATE, src(table), 0, key, after=as_row(key, cols))


def update(
    key: tuple[Any, ...], cols: tuple[str, ...] = ID, *, old: tuple[Any, ...] | None = None
) -> ChangeEvent:
    """An update of the row at ``key``; ``old`` is the before row's key if the key changed in
    place (one binlog row image pair; readers split it, but the window must not rely on it)."""
    before = as_row(key if old is None else old, cols)
    return ChangeEvent(Op.UPDATE, src(), 0, key, before=before, after=as_row(key, cols))


def delete(key: tuple[Any, ...], cols: tuple[str, ...] = ID) -> ChangeEvent:
    return ChangeEvent(Op.DELETE, src(), 0, key, before=as_row(key, cols))


def truncate() -> ChangeEvent:
    return ChangeEvent(Op.TRUNCATE, src(), 0, None)


def chunk(ids: list[int]) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, type=pa.int64()),
            "name": pa.array([f"row{i}" for i in ids], type=pa.string()),
        }
    )


def window(key_columns: tuple[str, ...] = ("id",)) -> ChunkWindow:
    return ChunkWindow("w1", TABLE, key_columns)


def open_window(key_columns: tuple[str, ...] = ("id",)) -> ChunkWindow:
    w = window(key_columns)
    w.open(OPEN_AT)
    return w


def ids(batch: ReadBatch) -> list[int]:
    return batch.rows.column("id").to_pylist()


# --- the life of a window ------------------------------------------------------------------


def test_no_events_all_rows_survive_in_key_order() -> None:
    w = window()
    assert w.phase is WindowPhase.REGISTERED and not w.filled and w.opened_at is None
    w.open(OPEN_AT)
    assert w.phase is WindowPhase.OPEN and w.opened_at == OPEN_AT
    w.fill(chunk([1, 2, 3, 5, 8]))
    assert w.filled
    batch = w.close(CLOSE_AT)
    assert w.phase is WindowPhase.CLOSED
    assert ids(batch) == [1, 2, 3, 5, 8]
    assert batch.rows.equals(chunk([1, 2, 3, 5, 8]))
    assert (batch.selected, batch.dropped, batch.last_key) == (5, 0, (8,))
    assert batch.position == CLOSE_AT
    assert batch.truncated is False
    assert (batch.window_id, batch.table, batch.key_columns) == ("w1", TABLE, ("id",))


@pytest.mark.parametrize("make", [create, update, delete], ids=["insert", "update", "delete"])
def test_event_for_a_buffered_key_inside_the_window_drops_it(make: Any) -> None:
    w = open_window()
    w.fill(chunk([1, 2, 3]))
    assert w.observe(make((2,))) is True
    batch = w.close(CLOSE_AT)
    assert ids(batch) == [1, 3]
    assert (batch.selected, batch.dropped) == (3, 1)


def test_event_before_the_open_watermark_does_not_drop() -> None:
    w = window()
    assert w.observe(update((2,))) is False
    assert w.observe(truncate()) is False
    w.open(OPEN_AT)
    w.fill(chunk([1, 2, 3]))
    batch = w.close(CLOSE_AT)
    assert ids(batch) == [1, 2, 3]
    assert batch.truncated is False


def test_events_for_keys_outside_the_chunk_are_harmless() -> None:
    w = open_window()
    w.fill(chunk([10, 20, 30]))
    for event in (create((5,)), update((15,)), delete((99,)), create((-1,))):
        assert w.observe(event) is True
    batch = w.close(CLOSE_AT)
    assert ids(batch) == [10, 20, 30]
    assert batch.dropped == 0


def test_events_seen_before_the_fill_still_drop_their_keys() -> None:
    w = open_window()
    w.observe(update((1,)))
    w.observe(delete((3,)))
    w.fill(chunk([1, 2, 3, 4]))
    w.observe(update((4,)))
    batch = w.close(CLOSE_AT)
    assert ids(batch) == [2]
    assert batch.dropped == 3


def test_an_update_whose_rows_have_different_keys_drops_both() -> None:
    w = open_window()
    w.fill(chunk([1, 2, 3, 4]))
    w.observe(update((3,), old=(1,)))
    batch = w.close(CLOSE_AT)
    assert ids(batch) == [2, 4]


def test_key_change_as_delete_then_create_drops_both() -> None:
    w = open_window()
    w.fill(chunk([1, 2, 3, 4]))
    w.observe(delete((4,)))
    w.observe(create((2,)))
    assert ids(w.close(CLOSE_AT)) == [1, 3]


def test_repeated_events_for_one_key_drop_it_once() -> None:
    w = open_window()
    w.fill(chunk([1, 2]))
    for _ in range(5):
        w.observe(update((1,)))
    batch = w.close(CLOSE_AT)
    assert ids(batch) == [2]
    assert batch.dropped == 1


def test_truncate_drops_everything_and_later_events_do_not_resurrect() -> None:
    w = open_window()
    w.fill(chunk([1, 2, 3]))
    w.observe(update((1,)))
    assert w.observe(truncate()) is True
    w.observe(create((2,)))
    w.observe(create((7,)))
    batch = w.close(CLOSE_AT)
    assert batch.rows.num_rows == 0
    assert batch.truncated is True
    assert (batch.selected, batch.dropped, batch.last_key) == (3, 3, (3,))
    assert batch.rows.schema == chunk([]).schema
    assert batch.stamped(src(SIGNALS, CLOSE_AT), 0, None).events() == []


def test_truncate_before_the_fill_drops_everything() -> None:
    w = open_window()
    w.observe(truncate())
    w.fill(chunk([1, 2]))
    batch = w.close(CLOSE_AT)
    assert batch.rows.num_rows == 0 and batch.truncated


def test_empty_chunk() -> None:
    w = open_window()
    w.observe(update((1,)))
    w.fill(chunk([]))
    batch = w.close(CLOSE_AT)
    assert (batch.selected, batch.dropped, batch.last_key) == (0, 0, None)
    assert batch.rows.num_rows == 0


def test_last_key_is_the_last_selected_key_even_when_dropped() -> None:
    w = open_window()
    w.fill(chunk([1, 2, 3]))
    w.observe(delete((3,)))
    batch = w.close(CLOSE_AT)
    assert ids(batch) == [1, 2]
    assert batch.last_key == (3,)
    assert (batch.selected, batch.dropped) == (3, 1)


def test_every_row_dropped_keeps_last_key() -> None:
    w = open_window()
    w.fill(chunk([4, 5]))
    w.observe(update((4,)))
    w.observe(update((5,)))
    batch = w.close(CLOSE_AT)
    assert batch.rows.num_rows == 0
    assert (batch.selected, batch.dropped, batch.last_key) == (2, 2, (5,))
    assert batch.truncated is False


def test_multi_chunk_arrow_table_keeps_its_order() -> None:
    rows = pa.concat_tables([chunk([1, 2, 3]), chunk([4, 5, 6]), chunk([7, 8, 9])])
    assert rows.column("id").num_chunks == 3
    w = open_window()
    w.fill(rows)
    for k in (2, 4, 6, 9):
        w.observe(update((k,)))
    batch = w.close(CLOSE_AT)
    assert ids(batch) == [1, 3, 5, 7, 8]
    assert batch.rows.column("name").to_pylist() == ["row1", "row3", "row5", "row7", "row8"]
    assert batch.last_key == (9,)


# --- keys come from the event's rows, by the window's key columns ---------------------------


def test_keys_are_read_from_the_rows_not_from_the_event_key() -> None:
    w = open_window()
    w.fill(chunk([1, 2, 3]))
    # event.key says 99, the row says 2: the row decides.
    w.observe(ChangeEvent(Op.UPDATE, src(), 0, (99,), after={"id": 2, "v": "x"}))
    assert ids(w.close(CLOSE_AT)) == [1, 3]


def test_an_update_with_only_an_after_row_drops_its_key() -> None:
    # PostgreSQL with the default replica identity sends no old row for an update.
    w = open_window()
    w.fill(chunk([1, 2, 3]))
    w.observe(ChangeEvent(Op.UPDATE, src(), 0, (2,), after={"id": 2, "v": "x"}))
    assert ids(w.close(CLOSE_AT)) == [1, 3]


def test_a_delete_whose_before_row_holds_only_the_key_drops_it() -> None:
    w = open_window()
    w.fill(chunk([1, 2, 3]))
    w.observe(ChangeEvent(Op.DELETE, src(), 0, (3,), before={"id": 3}))
    assert ids(w.close(CLOSE_AT)) == [1, 2]


def test_an_update_with_equal_before_and_after_keys_drops_one_key() -> None:
    w = open_window()
    w.fill(chunk([1, 2, 3]))
    w.observe(update((2,), old=(2,)))
    batch = w.close(CLOSE_AT)
    assert ids(batch) == [1, 3] and batch.dropped == 1


def test_a_key_change_into_and_out_of_the_chunk_range_drops_what_is_in_it() -> None:
    w = open_window()
    w.fill(chunk([10, 20, 30]))
    w.observe(update((99,), old=(20,)))  # a chunk row moves away
    w.observe(update((30,), old=(-5,)))  # a row moves onto a chunk key
    assert ids(w.close(CLOSE_AT)) == [10]


def test_a_composite_key_change_drops_both_keys() -> None:
    rows = pa.table({"k1": [1, 1, 2], "k2": ["a", "b", "a"], "v": [0, 1, 2]})
    w = open_window(K1K2)
    w.fill(rows)
    w.observe(update((2, "a"), K1K2, old=(1, "a")))
    assert w.close(CLOSE_AT).rows.column("v").to_pylist() == [1]


def surrogate_chunk(codes: list[str]) -> pa.Table:
    return pa.table({"code": codes, "id": list(range(100, 100 + len(codes)))})


def test_a_surrogate_key_window_drops_by_the_surrogate_column() -> None:
    # The table's primary key is id; the snapshot is chunked by the unique column code.
    w = open_window(("code",))
    w.fill(surrogate_chunk(["a", "b", "c", "d"]))
    w.observe(ChangeEvent(Op.UPDATE, src(), 0, (101,), after={"id": 101, "code": "b"}))
    w.observe(ChangeEvent(Op.DELETE, src(), 0, (103,), before={"id": 103, "code": "d"}))
    w.observe(ChangeEvent(Op.CREATE, src(), 0, (100,), after={"id": 100, "code": "zz"}))
    batch = w.close(CLOSE_AT)
    assert batch.rows.column("code").to_pylist() == ["a", "c"]
    assert batch.last_key == ("d",)


def test_a_surrogate_key_change_with_the_same_primary_key_drops_both_values() -> None:
    w = open_window(("code",))
    w.fill(surrogate_chunk(["a", "b", "c"]))
    w.observe(
        ChangeEvent(
            Op.UPDATE,
            src(),
            0,
            (100,),
            before={"id": 100, "code": "a"},
            after={"id": 100, "code": "c"},
        )
    )
    assert w.close(CLOSE_AT).rows.column("code").to_pylist() == ["b"]


def test_a_surrogate_key_equal_to_another_rows_primary_key_is_not_confused() -> None:
    w = open_window(("code",))
    w.fill(pa.table({"code": [1, 2, 3], "id": [3, 2, 1]}))
    w.observe(ChangeEvent(Op.UPDATE, src(), 0, (3,), after={"id": 3, "code": 1}))
    assert w.close(CLOSE_AT).rows.column("code").to_pylist() == [2, 3]


MISSING_COLUMN = [
    # window key columns, event, the side that lacks a column, the column
    (
        ("code",),
        ChangeEvent(Op.DELETE, src(), 0, (1,), before={"id": 1}),  # PK-only old row
        "before",
        "code",
    ),
    (("code",), ChangeEvent(Op.CREATE, src(), 0, (1,), after={"id": 1}), "after", "code"),
    (
        ("code",),
        ChangeEvent(Op.UPDATE, src(), 0, (1,), before={"id": 1}, after={"id": 1, "code": "a"}),
        "before",
        "code",
    ),
    (
        ("code",),
        ChangeEvent(Op.UPDATE, src(), 0, (1,), before={"id": 1, "code": "a"}, after={"id": 1}),
        "after",
        "code",
    ),
    (K1K2, ChangeEvent(Op.UPDATE, src(), 0, (1,), after={"k1": 1, "v": 0}), "after", "k2"),
    (ID, ChangeEvent(Op.CREATE, src(), 0, (1,), after={"ID": 1}), "after", "id"),
]


@pytest.mark.parametrize(
    ("key_columns", "event", "side", "column"),
    MISSING_COLUMN,
    ids=["delete-pk-only", "create", "update-before", "update-after", "composite", "case"],
)
def test_a_row_lacking_a_key_column_raises(
    key_columns: tuple[str, ...], event: ChangeEvent, side: str, column: str
) -> None:
    w = open_window(key_columns)
    w.fill(pa.table({c: pa.array([], type=pa.int64()) for c in key_columns}))
    with pytest.raises(WindowKeyError) as info:
        w.observe(event)
    message = str(info.value)
    assert str(TABLE) in message
    assert f"{side} row" in message
    assert repr(column) in message
    assert "REPLICA IDENTITY FULL" in message


NULL_KEY = [
    (ID, ChangeEvent(Op.CREATE, src(), 0, (1,), after={"id": None}), "after", "id"),
    (ID, ChangeEvent(Op.DELETE, src(), 0, (1,), before={"id": None}), "before", "id"),
    (
        ("code",),
        # Some decoders fill the columns missing from a PK-only old row with NULLs.
        ChangeEvent(Op.DELETE, src(), 0, (1,), before={"id": 1, "code": None}),
        "before",
        "code",
    ),
    (
        K1K2,
        ChangeEvent(
            Op.UPDATE, src(), 0, (1,), before={"k1": 1, "k2": 2}, after={"k1": 1, "k2": None}
        ),
        "after",
        "k2",
    ),
]


@pytest.mark.parametrize(
    ("key_columns", "event", "side", "column"),
    NULL_KEY,
    ids=["after", "before", "surrogate", "composite"],
)
def test_a_null_key_value_raises(
    key_columns: tuple[str, ...], event: ChangeEvent, side: str, column: str
) -> None:
    w = open_window(key_columns)
    with pytest.raises(WindowKeyError) as info:
        w.observe(event)
    message = str(info.value)
    assert str(TABLE) in message
    assert f"{side} row" in message
    assert "NULL" in message
    assert column in message


def test_an_event_with_no_row_raises() -> None:
    w = open_window()
    event = ChangeEvent(Op.DELETE, src(), 0, (1,))  # a delete that carries only its key
    with pytest.raises(WindowKeyError, match="no row") as info:
        w.observe(event)
    assert str(TABLE) in str(info.value) and "'d'" in str(info.value)


def test_a_bad_row_is_not_checked_before_the_window_opens() -> None:
    w = window(("code",))
    assert w.observe(ChangeEvent(Op.DELETE, src(), 0, (1,), before={"id": 1})) is False
    assert w.observe(ChangeEvent(Op.DELETE, src(), 0, (1,))) is False


# --- key shapes and types ------------------------------------------------------------------


def test_composite_text_and_int_keys() -> None:
    rows = pa.table(
        {
            "k1": pa.array([1, 1, 1, 2, 2], type=pa.int64()),
            "k2": pa.array(["B", "a", "b", "a", "ä"], type=pa.string()),
            "v": [10, 11, 12, 13, 14],
        }
    )
    w = open_window(("k1", "k2"))
    w.fill(rows)
    w.observe(update((1, "b"), K1K2))
    w.observe(delete((2, "ä"), K1K2))
    w.observe(create((2, "b"), cols=K1K2))  # not in the chunk
    batch = w.close(CLOSE_AT)
    assert batch.rows.column("v").to_pylist() == [10, 11, 13]
    assert batch.last_key == (2, "ä")
    assert batch.key_columns == ("k1", "k2")


def test_key_columns_in_a_different_order_than_the_table() -> None:
    rows = pa.table({"v": [1, 2, 3], "b": ["x", "x", "y"], "a": [1, 2, 1]})
    w = open_window(("a", "b"))
    w.fill(rows)
    w.observe(update((2, "x"), ("a", "b")))
    batch = w.close(CLOSE_AT)
    assert batch.rows.column("v").to_pylist() == [1, 3]
    assert batch.last_key == (1, "y")


EAST = timezone(timedelta(hours=2))

TYPED_CASES: list[tuple[str, pa.DataType, list[Any], Any, Any]] = [
    # name, arrow type, chunk values, log key value (equal to values[1]), a log value not in it
    (
        "decimal128",
        pa.decimal128(10, 2),
        [Decimal("1.10"), Decimal("12.30"), Decimal("99.99")],
        Decimal("12.3"),
        Decimal("12.31"),
    ),
    ("binary", pa.binary(), [b"\x00", b"\x00\x01", b"\xff"], bytearray(b"\x00\x01"), b"\x00\x02"),
    ("binary-memoryview", pa.binary(), [b"a", b"b", b"c"], memoryview(b"b"), b"B"),
    (
        "timestamp-tz-utc",
        pa.timestamp("us", tz="UTC"),
        [
            datetime(2024, 1, 1, tzinfo=UTC),
            datetime(2024, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
            datetime(2024, 1, 2, tzinfo=UTC),
        ],
        datetime(2024, 1, 1, 2, 0, 0, 1, tzinfo=EAST),  # the same instant, another offset
        datetime(2024, 1, 1, 0, 0, 0, 2, tzinfo=UTC),
    ),
    (
        "date32",
        pa.date32(),
        [date(2024, 1, 1), date(2024, 2, 29), date(2025, 1, 1)],
        date(2024, 2, 29),
        date(2024, 3, 1),
    ),
    ("large_string", pa.large_string(), ["a", "é", "z"], "é", "e"),
    ("uint64", pa.uint64(), [0, 2**63, 2**64 - 1], 2**63, 2**63 + 1),
]


@pytest.mark.parametrize(
    ("arrow_type", "values", "log_value", "absent"),
    [c[1:] for c in TYPED_CASES],
    ids=[c[0] for c in TYPED_CASES],
)
def test_typed_keys_are_matched(
    arrow_type: pa.DataType, values: list[Any], log_value: Any, absent: Any
) -> None:
    rows = pa.table({"k": pa.array(values, type=arrow_type), "v": [0, 1, 2]})
    w = open_window(("k",))
    w.fill(rows)
    w.observe(update((log_value,), ("k",)))
    w.observe(update((absent,), ("k",)))
    batch = w.close(CLOSE_AT)
    assert batch.rows.column("v").to_pylist() == [0, 2]
    assert batch.rows.schema == rows.schema
    assert batch.last_key == (rows.column("k")[2].as_py(),)


# --- READ events ---------------------------------------------------------------------------


def test_read_events() -> None:
    w = open_window()
    w.fill(chunk([1, 2, 3, 4]))
    w.observe(delete((2,)))
    batch = w.close(CLOSE_AT)
    close_source = Source(
        "postgresql", "srv", "db", SIGNALS, CLOSE_AT, ts_ms=77, details={"lsn": 5}
    )
    events = batch.stamped(close_source, 1234, None).events()
    assert [e.key for e in events] == [(1,), (3,), (4,)]
    assert [e.after for e in events] == [
        {"id": 1, "name": "row1"},
        {"id": 3, "name": "row3"},
        {"id": 4, "name": "row4"},
    ]
    assert [e.position for e in events] == [Position(20, 5, i) for i in range(3)]
    assert [e.position for e in events] == [CLOSE_AT.read_row(i) for i in range(3)]
    assert [batch.position.read_row(i) for i in range(3)] == [e.position for e in events]
    next_event = Position(20, 6)
    for e in events:
        assert e.op is Op.READ
        assert e.before is None
        assert e.ts_ms == 1234
        assert e.table == TABLE
        assert e.source.snapshot is SnapshotMarker.INCREMENTAL
        assert CLOSE_AT < e.position < next_event
        env = json.loads(encode_value(e))  # as the sinks write it
        assert env["op"] == "r"
        assert env["source"]["snapshot"] == "incremental"
        assert (env["source"]["schema"], env["source"]["table"]) == ("public", "items")
        assert env["source"]["pos"] == e.position.token
        assert (env["source"]["connector"], env["source"]["lsn"]) == ("postgresql", 5)


def test_read_event_keys_of_composite_keys_follow_key_column_order() -> None:
    rows = pa.table({"b": ["x", "y"], "a": [1, 2]})
    w = open_window(("a", "b"))
    w.fill(rows)
    events = w.close(CLOSE_AT).stamped(src(SIGNALS, CLOSE_AT), 0, None).events()
    assert [e.key for e in events] == [(1, "x"), (2, "y")]


# --- misuse --------------------------------------------------------------------------------


def test_close_before_open() -> None:
    w = window()
    w.fill(chunk([1]))
    with pytest.raises(WindowOrderError, match="open watermark"):
        w.close(CLOSE_AT)


def test_close_before_fill() -> None:
    w = open_window()
    with pytest.raises(WindowOrderError, match="before the chunk rows"):
        w.close(CLOSE_AT)


def test_close_twice() -> None:
    w = open_window()
    w.fill(chunk([1]))
    w.close(CLOSE_AT)
    with pytest.raises(WindowOrderError):
        w.close(CLOSE_AT)


def test_fill_twice() -> None:
    w = open_window()
    w.fill(chunk([1]))
    with pytest.raises(WindowOrderError, match="second chunk"):
        w.fill(chunk([2]))


def test_open_twice() -> None:
    w = open_window()
    with pytest.raises(WindowOrderError, match="opened twice"):
        w.open(OPEN_AT)
    w.fill(chunk([1]))
    w.close(CLOSE_AT)
    with pytest.raises(WindowOrderError):
        w.open(OPEN_AT)


def test_observe_after_close() -> None:
    w = open_window()
    w.fill(chunk([1]))
    w.close(CLOSE_AT)
    with pytest.raises(WindowOrderError, match="after it closed"):
        w.observe(update((1,)))


def test_fill_after_close() -> None:
    w = open_window()
    w.fill(chunk([1]))
    w.close(CLOSE_AT)
    with pytest.raises(WindowOrderError):
        w.fill(chunk([2]))


def test_window_order_error_is_a_runtime_error() -> None:
    assert issubclass(WindowOrderError, RuntimeError)


def test_event_of_another_table_raises_value_error() -> None:
    w = window()
    with pytest.raises(ValueError, match="other"):
        w.observe(create((1,), table=OTHER))
    w.open(OPEN_AT)
    with pytest.raises(ValueError, match="other"):
        w.observe(create((1,), table=OTHER))


def test_window_needs_key_columns() -> None:
    with pytest.raises(ValueError, match="key columns"):
        ChunkWindow("w", TABLE, [])


def test_chunk_without_the_key_columns_raises() -> None:
    w = open_window(("id", "tenant"))
    with pytest.raises(ValueError, match="tenant"):
        w.fill(chunk([1]))
    assert not w.filled


@pytest.mark.parametrize(
    ("arrow_type", "values", "bad"),
    [
        (pa.int64(), [1, 2], "abc"),
        (pa.int64(), [1, 2], 2**70),
        (pa.decimal128(5, 2), [Decimal("1.00")], Decimal("1.234")),
        (pa.date32(), [date(2024, 1, 1)], "2024-01-01"),
        (pa.binary(), [b"a"], Decimal("1")),
    ],
    ids=["text-in-int", "overflow", "decimal-scale", "text-in-date", "decimal-in-binary"],
)
def test_key_value_that_does_not_fit_the_arrow_type_raises(
    arrow_type: pa.DataType, values: list[Any], bad: Any
) -> None:
    w = open_window(("code",))
    w.fill(pa.table({"code": pa.array(values, type=arrow_type)}))
    assert w.observe(update((bad,), ("code",))) is True  # types are only checked at close
    with pytest.raises(WindowKeyError) as info:
        w.close(CLOSE_AT)
    message = str(info.value)
    assert str(TABLE) in message
    assert "'code'" in message
    assert f"{type(bad).__name__} value" in message


def test_window_key_error_is_a_value_error() -> None:
    assert issubclass(WindowKeyError, ValueError)


# --- the window against a model ------------------------------------------------------------


log_keys = st.integers(0, 60)
log_items = st.one_of(
    st.tuples(st.sampled_from(["c", "u", "d"]), log_keys),
    st.tuples(st.just("k"), log_keys, log_keys),  # an update whose rows have different keys
    st.just(("t",)),
)


def log_event(item: tuple[Any, ...]) -> ChangeEvent:
    match item:
        case ("c", k):
            return create((k,))
        case ("u", k):
            return update((k,))
        case ("d", k):
            return delete((k,))
        case ("k", old, new):
            return update((new,), old=(old,))
    return truncate()


def keys_of(item: tuple[Any, ...]) -> set[int]:
    return set(item[1:]) if item[0] != "t" else set()


@settings(max_examples=150, deadline=None)
@given(
    chunk_ids=st.lists(st.integers(0, 60), unique=True, max_size=30).map(sorted),
    before_open=st.lists(log_items, max_size=10),
    in_window=st.lists(log_items, max_size=20),
    fill_at=st.integers(0, 20),
)
def test_survivors_are_the_chunk_minus_keys_touched_in_the_window(
    chunk_ids: list[int],
    before_open: list[tuple[Any, ...]],
    in_window: list[tuple[Any, ...]],
    fill_at: int,
) -> None:
    w = window()
    for item in before_open:
        assert w.observe(log_event(item)) is False
    w.open(OPEN_AT)
    for i, item in enumerate(in_window):
        if i == fill_at:  # the chunk SELECT's rows arrive somewhere among the log events
            w.fill(chunk(chunk_ids))
        assert w.observe(log_event(item)) is True
    if not w.filled:
        w.fill(chunk(chunk_ids))
    batch = w.close(CLOSE_AT)
    truncated = ("t",) in in_window
    touched = set().union(*map(keys_of, in_window))
    expected = [] if truncated else [k for k in chunk_ids if k not in touched]
    assert ids(batch) == expected
    assert batch.selected == len(chunk_ids)
    assert batch.dropped == len(chunk_ids) - len(expected)
    assert batch.last_key == ((chunk_ids[-1],) if chunk_ids else None)
    assert batch.truncated is truncated


def test_misfit_message_names_the_offending_value_type() -> None:
    w = open_window(("code",))
    w.fill(pa.table({"code": pa.array([1, 2], type=pa.int64())}))
    w.observe(update((1,), ("code",)))
    w.observe(update(("seven",), ("code",)))
    with pytest.raises(WindowKeyError, match="str value"):
        w.close(CLOSE_AT)


# --- stale keys and READ events ------------------------------------------------------------


def test_drop_removes_stale_keys_only_while_open() -> None:
    w = window()
    with pytest.raises(WindowOrderError):
        w.drop({(1,)})  # before the open watermark: the engine has nothing to decide yet
    w.open(OPEN_AT)
    w.fill(chunk([1, 2, 3]))
    w.drop({(2,), (99,)})
    batch = w.close(CLOSE_AT)
    assert ids(batch) == [1, 3]
    assert batch.dropped == 1
    with pytest.raises(WindowOrderError):
        w.drop({(1,)})


def test_read_events_share_the_close_source_and_convert_rows() -> None:
    w = open_window()
    w.fill(chunk([4, 5, 6]))
    w.observe(update((5,)))
    close_source = src(SIGNALS, CLOSE_AT)
    batch = w.close(CLOSE_AT).stamped(
        close_source, 77, lambda row: {**row, "name": row["name"].upper()}
    )
    assert batch.position_tokens().to_pylist() == [
        CLOSE_AT.read_row(0).token,
        CLOSE_AT.read_row(1).token,
    ]
    events = batch.events()
    assert [e.source.position for e in events] == [CLOSE_AT.read_row(0), CLOSE_AT.read_row(1)]
    assert all(e.source.table == TABLE for e in events)
    assert all(e.source.snapshot is SnapshotMarker.INCREMENTAL for e in events)
    assert all(e.op is Op.READ and e.before is None and e.ts_ms == 77 for e in events)
    assert [e.after["name"] for e in events if e.after] == ["ROW4", "ROW6"]
    assert [e.key for e in events] == [(4,), (6,)]
    assert events[0].source.to_dict()["pos"] == CLOSE_AT.read_row(0).token
    assert events[0] == ChangeEvent(
        Op.READ,
        replace(
            close_source,
            table=TABLE,
            position=CLOSE_AT.read_row(0),
            snapshot=SnapshotMarker.INCREMENTAL,
        ),
        77,
        (4,),
        after={"id": 4, "name": "ROW4"},
    )

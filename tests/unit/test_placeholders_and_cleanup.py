"""Debezium's unavailable-value placeholder is never landed or materialized as data, and which
signal-table rows the watermark cleanup may delete (pure: no Spark, no database)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from signals.model import SignalType, Watermark, WatermarkKind
from signals.names import TableId
from snapshotter.core.events import ChangeEvent, Op, SnapshotMarker, Source
from snapshotter.core.position import Position
from snapshotter.core.values import UNAVAILABLE_VALUE, RawJson
from snapshotter.engine.signal_cleanup import window_of
from snapshotter.sinks.spark.types import events_to_landed
from snapshotter.sources.base import ColumnInfo, TableSchema
from snapshotter.verify.rows import PLACEHOLDER_TEXT_OR_BASE64, Materialized, canonical, materialize

T = TableId("s", "docs")
SCHEMA = TableSchema(
    T,
    (
        ColumnInfo("id", "integer", 23, False, pa.int32()),
        ColumnInfo("doc", "jsonb", 3802, True, pa.string()),
        ColumnInfo("big", "text", 25, True, pa.string()),
        ColumnInfo("raw", "bytea", 17, True, pa.binary()),
    ),
    ("id",),
)


def event(op: Op, key: int, pos: int, row: dict[str, Any]) -> ChangeEvent:
    marker = SnapshotMarker.INCREMENTAL if op is Op.READ else SnapshotMarker.FALSE
    source = Source("postgresql", "db", "db", T, Position(pos), 5, marker)
    if op is Op.DELETE:
        return ChangeEvent(op, source, 7, (key,), before={"id": key, **row})
    return ChangeEvent(op, source, 7, (key,), after={"id": key, **row})


# --- landing ---------------------------------------------------------------------------------


def test_a_create_with_a_placeholder_lands_null_and_unavailable() -> None:
    """A key change's create carries the placeholder like an update: never landed as text."""
    events = [
        event(Op.CREATE, 1, 1, {"doc": RawJson('{"a": 1}'), "big": UNAVAILABLE_VALUE}),
        event(Op.UPDATE, 1, 2, {"doc": UNAVAILABLE_VALUE, "big": "x", "raw": UNAVAILABLE_VALUE}),
        event(Op.DELETE, 1, 3, {"big": UNAVAILABLE_VALUE}),
        event(Op.CREATE, 2, 4, {"doc": None, "big": "plain", "raw": b"\x00"}),
    ]
    rows = events_to_landed(SCHEMA, ["id"], events, 1).to_pylist()
    assert [(r["doc"], r["big"], r["raw"], r["__unavailable"]) for r in rows] == [
        ('{"a": 1}', None, None, ["big"]),
        (None, "x", None, ["doc", "raw"]),
        (None, None, None, ["big"]),
        (None, "plain", b"\x00", None),
    ]
    assert UNAVAILABLE_VALUE not in json.dumps(rows, default=str)


def test_a_read_row_is_data_whatever_it_holds() -> None:
    """READ rows come from a SELECT: a stored text equal to the placeholder is the value."""
    (row,) = events_to_landed(
        SCHEMA, ["id"], [event(Op.READ, 1, 1, {"big": UNAVAILABLE_VALUE})], 1
    ).to_pylist()
    assert (row["big"], row["__unavailable"]) == (UNAVAILABLE_VALUE, None)


# --- the JSONL materializer ------------------------------------------------------------------


def _line(op: str, key: int, pos: int, after: dict[str, Any] | None) -> str:
    value = {"before": None, "after": after, "op": op, "source": {"pos": f"{pos:08d}"}}
    return json.dumps({"topic": "t", "key": {"id": key}, "value": value}) + "\n"


def test_a_placeholder_beside_a_json_object_resolves(tmp_path: Path) -> None:
    """It crashed with "unhashable type: 'dict'" (an object column met the placeholder set)."""
    path = tmp_path / "events.jsonl"
    path.write_text(
        _line("c", 1, 1, {"id": 1, "doc": {"a": [1]}, "big": "v1", "l": [1, {"b": 2}]})
        + _line("u", 1, 2, {"id": 1, "doc": {"a": [2]}, "big": UNAVAILABLE_VALUE, "l": []})
        + _line("u", 1, 3, {"id": 1, "doc": UNAVAILABLE_VALUE, "big": "v2", "l": None}),
        encoding="utf-8",
    )
    rows = materialize(path, "t").rows
    assert rows[canonical({"id": 1})] == {"id": 1, "doc": {"a": [2]}, "big": "v2", "l": None}


def test_a_new_or_deleted_key_keeps_the_placeholder(tmp_path: Path) -> None:
    """Nothing to resolve from: the row keeps the placeholder (verify shows it differing),
    and never takes the value of the key's row from before a delete."""
    path = tmp_path / "events.jsonl"
    path.write_text(
        _line("c", 1, 1, {"id": 1, "big": "old"})
        + _line("d", 1, 2, None)
        + _line("c", 1, 3, {"id": 1, "big": UNAVAILABLE_VALUE})
        + _line("c", 2, 4, {"id": 2, "big": UNAVAILABLE_VALUE, "doc": {"x": 1}}),
        encoding="utf-8",
    )
    rows = materialize(path, "t").rows
    assert rows[canonical({"id": 1})]["big"] == UNAVAILABLE_VALUE
    assert rows[canonical({"id": 2})] == {"id": 2, "big": UNAVAILABLE_VALUE, "doc": {"x": 1}}


def test_kafka_placeholders_with_objects_and_lists_resolve() -> None:
    out = Materialized("t")
    out.put("k", {"id": 1}, {"id": 1, "doc": {"a": 1}, "raw": "cmF3"})
    b64 = next(p for p in PLACEHOLDER_TEXT_OR_BASE64 if p != UNAVAILABLE_VALUE)
    out.put("k", {"id": 1}, {"id": 1, "doc": [1, {}], "raw": b64}, PLACEHOLDER_TEXT_OR_BASE64)
    assert out.rows["k"] == {"id": 1, "doc": [1, {}], "raw": "cmF3"}


# --- which rows the watermark cleanup may delete ---------------------------------------------


@given(st.uuids(), st.sampled_from(list(WatermarkKind)))
def test_the_engine_s_own_watermark_rows_are_recognised(window: uuid.UUID, kind: Any) -> None:
    mark = Watermark(str(window), kind)
    assert window_of(mark.id, mark.type.value) == str(window)


@given(st.uuids(), st.sampled_from(list(WatermarkKind)), st.sampled_from(list(SignalType)))
def test_a_row_of_another_type_is_never_a_watermark(
    window: uuid.UUID, kind: Any, row_type: SignalType
) -> None:
    mark = Watermark(str(window), kind)
    expected = str(window) if row_type is mark.type else None
    assert window_of(mark.id, row_type.value) == expected


@given(st.text(max_size=50), st.sampled_from([t.value for t in SignalType]))
def test_user_signal_ids_are_never_watermarks(row_id: str, row_type: str) -> None:
    """Only ``<lowercase uuid>-open`` / ``-close`` ids are: any other id stays."""
    window = window_of(row_id, row_type)
    if window is not None:
        assert row_id in (f"{window}-open", f"{window}-close")
        assert str(uuid.UUID(window)) == window


def test_near_watermark_ids_stay() -> None:
    w = str(uuid.uuid4())
    for row_id, row_type in [
        (f"{w}-open", "execute-snapshot"),
        (f"{w}-open\n", "snapshot-window-open"),
        (f"x{w}-close", "snapshot-window-close"),
        (f"{w.upper()}-close", "snapshot-window-close"),
        (f"{w}-close", "snapshot-window-open"),
        ("ad-hoc-1", "snapshot-window-open"),
        ("-open", "snapshot-window-open"),
    ]:
        assert window_of(row_id, row_type) is None, row_id

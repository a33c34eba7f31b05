"""Change-stream records to Debezium events: what each value capture type gives in ``before``
and ``after``, keys, positions in merged order, the emulator's commit-timestamp stand-in, and
the PostgreSQL dialect's JSON records parsed to the same records."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from signals.names import TableId
from snapshotter.core.events import Op
from snapshotter.core.values import UNAVAILABLE_VALUE
from snapshotter.sources.spanner.decoder import SpannerDecoder, table_id
from snapshotter.sources.spanner.records import (
    ChildPartitions,
    ColumnType,
    DataChange,
    Heartbeat,
    Mod,
    micros,
    postgresql_records,
    transaction_order,
)
from snapshotter.sources.spanner.types import SpannerType

COLUMNS = ("id", "region", "qty", "note", "made")
TYPES = (
    ColumnType("id", SpannerType("INT64"), True),
    ColumnType("region", SpannerType("STRING"), True),
    ColumnType("qty", SpannerType("INT64"), False),
    ColumnType("note", SpannerType("STRING"), False),
    ColumnType("made", SpannerType("TIMESTAMP"), False),
)
KEYS = {"id": "7", "region": "eu"}
COMMIT_US = micros("2026-11-27T08:00:00.123456Z")


def _decoder(captured: bool = True) -> SpannerDecoder:
    return SpannerDecoder(
        "app",
        "db1",
        captured=lambda t: captured,
        key_columns=lambda t: None,
        columns_of=lambda t: COLUMNS,
        clock_ms=lambda: 42,
    )


def _record(mod_type: str, capture: str, *mods: Mod, sequence: int = 0) -> DataChange:
    return DataChange(
        commit_us=COMMIT_US,
        transaction="tx-1",
        sequence=sequence,
        table="items",
        columns=TYPES,
        mods=mods,
        mod_type=mod_type,
        value_capture_type=capture,
        records_in_transaction=1,
        partitions_in_transaction=1,
    )


NEW = {"qty": "3", "note": "new", "made": "2026-01-01T00:00:00Z"}
OLD = {"qty": "2", "note": "old", "made": "2025-01-01T00:00:00Z"}
MADE = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def test_an_insert_is_a_create_with_the_whole_row() -> None:
    (change,) = _decoder().changes(_record("INSERT", "NEW_ROW", Mod(KEYS, NEW, {})), "p1")
    event = change.event
    assert event.op is Op.CREATE and event.before is None
    assert event.after == {"id": 7, "region": "eu", "qty": 3, "note": "new", "made": MADE}
    assert event.key == (7, "eu")
    assert event.table == TableId("public", "items")
    assert event.source.details["partition"] == "p1"


@pytest.mark.parametrize(
    ("capture", "before"),
    [
        ("NEW_ROW", None),
        (
            "NEW_ROW_AND_OLD_VALUES",
            {"id": 7, "region": "eu", "qty": 2, "note": "new", "made": MADE},
        ),
    ],
)
def test_an_update_with_whole_new_rows(capture: str, before: dict[str, Any] | None) -> None:
    # A mutation that changed only qty: NEW_ROW* report the whole new row, old values of qty.
    mod = Mod(KEYS, NEW, {"qty": "2"} if "OLD" in capture else {})
    (change,) = _decoder().changes(_record("UPDATE", capture, mod), "p1")
    assert change.event.op is Op.UPDATE
    assert change.event.after == {"id": 7, "region": "eu", "qty": 3, "note": "new", "made": MADE}
    assert change.event.before == before


def test_old_and_new_values_mark_the_unchanged_columns_unavailable() -> None:
    mod = Mod(KEYS, {"qty": "3"}, {"qty": "2"})
    (change,) = _decoder().changes(_record("UPDATE", "OLD_AND_NEW_VALUES", mod), "p1")
    u = UNAVAILABLE_VALUE
    assert change.event.after == {"id": 7, "region": "eu", "qty": 3, "note": u, "made": u}
    assert change.event.before == {"id": 7, "region": "eu", "qty": 2, "note": u, "made": u}


def test_a_delete_without_old_values_keeps_the_key() -> None:
    (change,) = _decoder().changes(_record("DELETE", "NEW_ROW", Mod(KEYS, {}, {})), "p1")
    assert change.event.op is Op.DELETE and change.event.after is None
    assert change.event.before == {"id": 7, "region": "eu", "qty": None, "note": None, "made": None}
    assert change.event.key == (7, "eu")


def test_the_emulators_commit_timestamp_stand_in_is_the_commit_timestamp() -> None:
    new = dict(NEW, made="9999-12-31T23:59:59Z")
    (change,) = _decoder().changes(_record("INSERT", "NEW_ROW", Mod(KEYS, new, {})), "p1")
    assert change.event.after is not None
    made = change.event.after["made"]
    assert made == dt.datetime(2026, 11, 27, 8, 0, 0, 123456, tzinfo=dt.UTC)


def test_positions_follow_the_merged_order() -> None:
    mods = [Mod({"id": str(i), "region": "eu"}, NEW, {}) for i in range(3)]
    first = _decoder().changes(_record("INSERT", "NEW_ROW", *mods, sequence=0), "p1")
    second = _decoder().changes(_record("INSERT", "NEW_ROW", *mods, sequence=1), "p2")
    positions = [c.event.position for c in first + second]
    assert positions == sorted(positions) and len(set(positions)) == 6
    assert positions[0].parts == (COMMIT_US, transaction_order("tx-1"), 0, 0)


def test_tables_outside_the_capture_give_nothing() -> None:
    record = _record("INSERT", "NEW_ROW", Mod(KEYS, NEW, {}))
    assert _decoder(captured=False).changes(record, "p1") == []


def test_table_names_with_a_schema() -> None:
    assert table_id("items") == TableId("public", "items")
    assert table_id("sales.items") == TableId("sales", "items")


def test_the_postgresql_dialects_json_records() -> None:
    data = {
        "data_change_record": {
            "commit_timestamp": "2026-11-27T08:28:23.593716+00:00",
            "record_sequence": "00000001",
            "server_transaction_id": "14",
            "is_last_record_in_transaction_in_partition": True,
            "table_name": "items",
            "column_types": [
                {"name": "id", "type": {"code": "INT64"}, "is_primary_key": True},
                {
                    "name": "tags",
                    "type": {"code": "ARRAY", "array_element_type": {"code": "INT64"}},
                    "is_primary_key": False,
                },
                {
                    "name": "n",
                    "type": {"code": "NUMERIC", "type_annotation": "PG_NUMERIC"},
                    "is_primary_key": False,
                },
            ],
            "mods": [
                {"keys": {"id": "1"}, "new_values": {"tags": ["1", "NULL"]}, "old_values": {}}
            ],
            "mod_type": "INSERT",
            "value_capture_type": "NEW_ROW",
            "number_of_records_in_transaction": 2,
            "number_of_partitions_in_transaction": 1,
        }
    }
    (record,) = postgresql_records([data])
    assert isinstance(record, DataChange)
    assert record.sequence == 1 and record.transaction == "14"
    assert record.commit_us == micros("2026-11-27T08:28:23.593716Z")
    assert record.columns[1].type == SpannerType("ARRAY", SpannerType("INT64"))
    assert record.columns[2].type == SpannerType("NUMERIC")
    (heartbeat,) = postgresql_records(
        [{"heartbeat_record": {"timestamp": "2026-11-27T08:28:23.9Z"}}]
    )
    assert heartbeat == Heartbeat(micros("2026-11-27T08:28:23.9Z"))
    child = {
        "child_partitions_record": {
            "start_timestamp": "2026-11-27T08:28:21.121215+00:00",
            "record_sequence": "00000000",
            "child_partitions": [{"token": "c1", "parent_partition_tokens": ["a", "b"]}],
        }
    }
    (children,) = postgresql_records([child])
    assert isinstance(children, ChildPartitions)
    assert children.children[0].parents == frozenset({"a", "b"})
    assert children.children[0].start_us == children.start_us

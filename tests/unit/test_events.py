"""Change events: Debezium's envelope and validation."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest

from signals.names import TableId
from snapshotter.core.events import ENVELOPE_VERSION, ChangeEvent, Op, SnapshotMarker, Source
from snapshotter.core.position import Position
from snapshotter.sinks.encoding import encode_value

TABLE = TableId("public", "orders")
POS = Position(0x1A2B, 3)


def source(**changes: Any) -> Source:
    fields: dict[str, Any] = {
        "connector": "postgresql",
        "name": "server1",
        "db": "shop",
        "table": TABLE,
        "position": POS,
        "ts_ms": 1_700_000_000_000,
    }
    fields.update(changes)
    return Source(**fields)


def envelope(event: ChangeEvent) -> dict[str, Any]:
    """The event's envelope as the sinks write it (a JSONL line's and a Kafka message's
    value), read back."""
    value: dict[str, Any] = json.loads(encode_value(event))
    return value


def test_op_and_marker_values_are_debeziums() -> None:
    assert [o.value for o in Op] == ["c", "u", "d", "r", "t"]
    assert SnapshotMarker.FALSE.value == "false"
    assert SnapshotMarker.INCREMENTAL.value == "incremental"


def test_update_envelope_shape() -> None:
    event = ChangeEvent(
        Op.UPDATE,
        source(details={"lsn": 123, "txId": 9}),
        ts_ms=1_700_000_000_500,
        key=(1,),
        before={"id": 1, "amount": Decimal("1.00")},
        after={"id": 1, "amount": Decimal("2.50")},
    )
    env = envelope(event)
    assert list(env) == ["before", "after", "source", "op", "ts_ms"]  # no transaction block
    assert env["op"] == "u"
    assert env["ts_ms"] == 1_700_000_000_500
    assert env["before"] == {"id": 1, "amount": "1.00"}  # a Decimal as its text
    assert env["after"] == {"id": 1, "amount": "2.50"}
    assert env["source"] == {
        "version": ENVELOPE_VERSION,
        "connector": "postgresql",
        "name": "server1",
        "ts_ms": 1_700_000_000_000,
        "snapshot": "false",
        "db": "shop",
        "schema": "public",
        "table": "orders",
        "lsn": 123,
        "txId": 9,
        "pos": POS.token,
    }


def test_details_add_fields_but_never_redefine_envelope_fields() -> None:
    d = source(details={"file": "mysql-bin.000042", "gtid": "0-1-7"}).to_dict()
    assert d["pos"] == POS.token
    assert (d["file"], d["gtid"]) == ("mysql-bin.000042", "0-1-7")
    for field in ("pos", "table", "schema", "snapshot"):
        with pytest.raises(ValueError, match="may not redefine"):
            source(details={field: "x"})


def test_create_delete_read_and_truncate_envelopes() -> None:
    create = envelope(ChangeEvent(Op.CREATE, source(), 5, (1,), after={"id": 1}))
    assert (create["op"], create["before"], create["after"]) == ("c", None, {"id": 1})

    delete = envelope(ChangeEvent(Op.DELETE, source(), 5, (1,), before={"id": 1}))
    assert (delete["op"], delete["before"], delete["after"]) == ("d", {"id": 1}, None)

    read = envelope(
        ChangeEvent(Op.READ, source(snapshot=SnapshotMarker.INCREMENTAL), 5, (1,), after={"id": 1})
    )
    assert (read["op"], read["after"], read["source"]["snapshot"]) == (
        "r",
        {"id": 1},
        "incremental",
    )

    truncate = envelope(ChangeEvent(Op.TRUNCATE, source(), 5, None))
    assert (truncate["op"], truncate["before"], truncate["after"]) == ("t", None, None)


def test_event_exposes_table_and_position_of_its_source() -> None:
    event = ChangeEvent(Op.CREATE, source(), 0, (1,), after={"id": 1})
    assert event.table == TABLE
    assert event.position == POS


def test_delete_without_before_is_allowed() -> None:
    # The envelope allows it (Debezium's does); a chunk window refuses it, having no key row.
    event = ChangeEvent(Op.DELETE, source(), 0, (1,))
    assert envelope(event)["before"] is None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"op": Op.TRUNCATE, "key": (1,)}, "truncate"),
        ({"op": Op.TRUNCATE, "key": None, "before": {"id": 1}}, "truncate"),
        ({"op": Op.TRUNCATE, "key": None, "after": {"id": 1}}, "truncate"),
        ({"op": Op.DELETE, "key": (1,), "before": {"id": 1}, "after": {"id": 1}}, "after"),
        ({"op": Op.CREATE, "key": (1,)}, "after"),
        ({"op": Op.UPDATE, "key": (1,), "before": {"id": 1}}, "after"),
        ({"op": Op.READ, "key": (1,)}, "after"),
        ({"op": Op.CREATE, "key": None, "after": {"id": 1}}, "key"),
        ({"op": Op.UPDATE, "key": None, "after": {"id": 1}}, "key"),
        ({"op": Op.DELETE, "key": None, "before": {"id": 1}}, "key"),
        ({"op": Op.READ, "key": None, "after": {"id": 1}}, "key"),
    ],
)
def test_invalid_events_raise(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ChangeEvent(source=source(), ts_ms=0, **kwargs)


def test_a_key_change_is_a_delete_of_the_old_key_then_a_create_of_the_new() -> None:
    # What readers emit for UPDATE ... SET id = 2 WHERE id = 1, as Debezium does: each event
    # carries the key of its own row, so a sink that upserts and deletes by key stays right.
    src = source()
    delete = ChangeEvent(Op.DELETE, src, 0, (1,), before={"id": 1, "v": "x"})
    create = ChangeEvent(
        Op.CREATE, source(position=POS.read_row(0)), 0, (2,), after={"id": 2, "v": "x"}
    )
    assert (delete.key, envelope(delete)["before"]) == ((1,), {"id": 1, "v": "x"})
    assert (create.key, envelope(create)["after"]) == ((2,), {"id": 2, "v": "x"})
    assert delete.position < create.position


def test_an_event_carries_no_old_key() -> None:
    with pytest.raises(TypeError, match="old_key"):
        ChangeEvent(  # type: ignore[call-arg]
            Op.UPDATE, source(), 0, (2,), before={"id": 1}, after={"id": 2}, old_key=(1,)
        )
    event = ChangeEvent(Op.UPDATE, source(), 0, (2,), before={"id": 1}, after={"id": 2})
    assert not hasattr(event, "old_key") and not hasattr(event, "touched_keys")


def test_pos_is_the_token_of_a_position_of_any_arity() -> None:
    for position in (Position(5), Position(5, 6), Position(5, 6).read_row(3)):
        assert source(position=position).to_dict()["pos"] == position.token


def test_events_are_frozen() -> None:
    event = ChangeEvent(Op.CREATE, source(), 0, (1,), after={"id": 1})
    with pytest.raises(AttributeError):
        event.op = Op.DELETE  # type: ignore[misc]

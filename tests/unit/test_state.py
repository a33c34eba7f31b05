"""Snapshot state: readable versioned JSON, and the rules that keep a snapshot moving."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from signals.names import TableId
from snapshotter.core.position import Position
from snapshotter.core.state import (
    STATE_VERSION,
    EngineState,
    SnapshotStatus,
    StateError,
    StreamState,
    TableProgress,
)

ORDERS = TableId("public", "orders")
STREAM_AT = Position(5, 6, 7)
RESUME = {"file": "mysql-bin.000042", "pos": 4, "gtid_set": "3e11fa47-71ca:1-5", "xs": [1, None]}
ITEMS = TableId("shop", "items")
TZ = timezone(timedelta(hours=-3, minutes=-30))


def progress(
    table: TableId = ORDERS, key_columns: tuple[str, ...] = ("id",), signal_id: str = "sig-1"
) -> TableProgress:
    return TableProgress(table=table, signal_id=signal_id, key_columns=list(key_columns))


def running(max_key: tuple[Any, ...] = (100,)) -> TableProgress:
    p = progress(key_columns=tuple(f"k{i}" for i in range(len(max_key))))
    p.start(max_key)
    return p


def sample_state() -> EngineState:
    state = EngineState(stream=StreamState(position=STREAM_AT.token, resume=RESUME))
    a = progress(ORDERS, ("region", "amount", "blob", "at"), signal_id="sig-a")
    a.filter = "amount > 10"
    a.start(("eu-west", Decimal("1200.50"), b"\x00\xff", datetime(2024, 5, 1, 12, tzinfo=TZ)))
    a.chunk_done(
        last_key=(
            "eu",
            Decimal("12.30"),
            bytearray(b"\x01"),
            datetime(2024, 1, 1, 0, 0, 0, 5, tzinfo=UTC),
        ),
        selected=10,
        emitted=8,
        chunk_size=10,
    )
    state.snapshots.append(a)
    b = progress(ITEMS, ("id",), signal_id="sig-b")  # queued behind a
    state.snapshots.append(b)
    c = progress(TableId("public", 'Weird.Name "x"'), ("id",), signal_id="sig-c")
    c.fail("boom: the source went away")
    state.snapshots.append(c)
    state.mark_processed("sig-a", Position(5, 1))
    state.mark_processed("sig-b", Position(5, 2))
    return state


# --- JSON ----------------------------------------------------------------------------------


def test_json_round_trip_keeps_everything() -> None:
    state = sample_state()
    back = EngineState.from_json(state.to_json())
    assert back == state
    a, b, c = back.snapshots
    assert a.status is SnapshotStatus.RUNNING
    assert b.status is SnapshotStatus.PENDING
    assert c.status is SnapshotStatus.FAILED and c.error == "boom: the source went away"
    assert c.table == TableId("public", 'Weird.Name "x"')
    assert a.filter == "amount > 10"
    assert (a.chunk_id, a.rows_emitted) == (1, 8)
    assert back.stream.position == STREAM_AT.token
    assert back.stream.resume == RESUME
    assert back.paused is False
    assert back.processed_signals == {
        "sig-a": Position(5, 1).token,
        "sig-b": Position(5, 2).token,
    }


def test_json_round_trip_keeps_key_types() -> None:
    a = EngineState.from_json(sample_state().to_json()).snapshots[0]
    assert a.max_key is not None and a.last_read_key is not None
    region, amount, blob, at = a.max_key
    assert (type(region), type(amount), type(blob), type(at)) == (str, Decimal, bytes, datetime)
    assert str(amount) == "1200.50"
    assert at.utcoffset() == timedelta(hours=-3, minutes=-30)
    last = a.last_read_key
    assert str(last[1]) == "12.30"
    assert last[2] == b"\x01" and type(last[2]) is bytes
    assert last[3] == datetime(2024, 1, 1, 0, 0, 0, 5, tzinfo=UTC)
    assert last[3].utcoffset() == timedelta(0)


def test_json_is_readable() -> None:
    text = sample_state().to_json()
    assert text.endswith("\n")
    assert "\n  " in text  # indented
    raw = json.loads(text)
    assert raw["version"] == 1 == STATE_VERSION
    a = raw["snapshots"][0]
    assert a["table"] == "public.orders"
    assert a["status"] == "running"
    assert a["max_key"] == [
        {"type": "text", "value": "eu-west"},
        {"type": "decimal", "value": "1200.50"},
        {"type": "bytes", "value": "AP8="},
        {"type": "timestamptz", "value": "2024-05-01T12:00:00-03:30"},
    ]
    assert a["last_read_key"][1] == {"type": "decimal", "value": "12.30"}
    assert raw["snapshots"][1]["max_key"] is None
    assert raw["stream"] == {"position": STREAM_AT.token, "resume": RESUME}
    assert raw["paused"] is False
    assert raw["processed_signals"] == {
        "sig-a": "0000000000000005-0000000000000001",
        "sig-b": "0000000000000005-0000000000000002",
    }


def test_non_ascii_is_written_as_is() -> None:
    p = progress()
    p.start(("Grüße",))
    state = EngineState(snapshots=[p])
    assert "Grüße" in state.to_json()
    assert EngineState.from_json(state.to_json()) == state


def test_empty_state_round_trips() -> None:
    state = EngineState()
    assert EngineState.from_json(state.to_json()) == state
    assert json.loads(state.to_json()) == {
        "version": 1,
        "stream": {"position": None, "resume": {}},
        "paused": False,
        "snapshots": [],
        "processed_signals": {},
        "signal_problems": [],
        "signal_channels": {},
        "sink": {},
    }


def test_a_state_from_before_the_signal_channels_loads() -> None:
    older = json.loads(EngineState().to_json())
    del older["signal_channels"]
    assert EngineState.from_json(json.dumps(older)).signal_channels == {}


text_keys = st.tuples(st.text(), st.decimals(allow_nan=False, allow_infinity=False), st.binary())


@settings(max_examples=50, deadline=None)
@given(max_key=text_keys, last_key=text_keys)
def test_typed_keys_survive_json(max_key: tuple[Any, ...], last_key: tuple[Any, ...]) -> None:
    p = progress(key_columns=("a", "b", "c"))
    p.start(max_key)
    p.last_read_key = last_key
    back = EngineState.from_json(EngineState(snapshots=[p]).to_json()).snapshots[0]
    assert back.max_key == max_key and back.last_read_key == last_key
    assert str(back.max_key[1]) == str(max_key[1])
    assert str(back.last_read_key[1]) == str(last_key[1])


@pytest.mark.parametrize("text", ["", "not json", "{", "{'version': 1}"])
def test_from_json_rejects_non_json(text: str) -> None:
    with pytest.raises(StateError, match="JSON"):
        EngineState.from_json(text)


@pytest.mark.parametrize(
    "text", ["{}", "[]", "null", "1", '{"version": "1"}', '{"version": null}', '{"snapshots": []}']
)
def test_from_json_rejects_state_without_version(text: str) -> None:
    with pytest.raises(StateError, match="version"):
        EngineState.from_json(text)


def test_from_json_rejects_a_newer_version() -> None:
    with pytest.raises(StateError, match="upgrade"):
        EngineState.from_json(json.dumps({"version": STATE_VERSION + 1}))


@pytest.mark.parametrize("version", [0, -1])
def test_from_json_rejects_versions_before_the_first(version: int) -> None:
    with pytest.raises(StateError, match="version"):
        EngineState.from_json(json.dumps({"version": version}))


def _with_first_snapshot(**changes: Any) -> str:
    raw = json.loads(sample_state().to_json())
    raw["snapshots"][0].update(changes)
    return json.dumps(raw)


@pytest.mark.parametrize(
    "text",
    [
        '{"version": 1, "unknown": true}',
        '{"version": 1, "snapshots": {}}',
        '{"version": 1, "processed_signals": [1]}',
        '{"version": 1, "processed_signals": ["sig-a"]}',  # the old list of ids
        '{"version": 1, "processed_signals": {"s": null}}',
        '{"version": 1, "processed_signals": {"s": 5}}',
        '{"version": 1, "processed_signals": {"s": "nope"}}',
        '{"version": 1, "processed_signals": {"s": "0000000000000001-0000000000000002-00000003"}}',
        '{"version": 1, "processed_signals": {"s": "000000000000000A"}}',
        '{"version": 1, "stream": {"position": 5}}',
        '{"version": 1, "stream": {"position": ""}}',
        '{"version": 1, "stream": {"position": "0000000000000005-0000000000000006-00000007"}}',
        '{"version": 1, "stream": {"position": "5-6"}}',
        '{"version": 1, "stream": {"resume": []}}',
        '{"version": 1, "stream": {"resume": "lsn"}}',
        '{"version": 1, "stream": {"extra": 1}}',
        '{"version": 1, "paused": null}',
        '{"version": 1, "paused": "maybe"}',
        _with_first_snapshot(status="sleeping"),
        _with_first_snapshot(table="orders"),  # not schema-qualified
        _with_first_snapshot(table="public.ord.ers"),
        _with_first_snapshot(table="public.*"),  # a pattern
        _with_first_snapshot(table=5),
        _with_first_snapshot(max_key=[]),
        _with_first_snapshot(max_key=[{"type": "int", "value": "1"}]),
        _with_first_snapshot(max_key=[{"type": "nope", "value": 1}]),
        _with_first_snapshot(max_key=[{"type": ["int"], "value": 1}]),
        _with_first_snapshot(max_key=[{"type": "uuid", "value": 5}]),
        _with_first_snapshot(last_read_key=[{"type": "timestamptz", "value": "2024-01-01"}]),
        _with_first_snapshot(last_read_key=[{"type": "float", "value": "-nan"}]),
        _with_first_snapshot(max_key=[5]),
        _with_first_snapshot(extra="field"),
        _with_first_snapshot(signal_id=None),
    ],
)
def test_from_json_rejects_invalid_content(text: str) -> None:
    with pytest.raises(StateError, match="validate"):
        EngineState.from_json(text)


def test_state_error_is_a_value_error() -> None:
    assert issubclass(StateError, ValueError)


# --- TableProgress -------------------------------------------------------------------------


def test_new_progress_is_pending() -> None:
    p = progress()
    assert p.status is SnapshotStatus.PENDING
    assert (p.max_key, p.last_read_key, p.chunk_id, p.rows_emitted, p.error) == (
        None,
        None,
        0,
        0,
        None,
    )


def test_start_with_a_max_key_runs() -> None:
    p = progress()
    p.start((100,))
    assert p.status is SnapshotStatus.RUNNING
    assert p.max_key == (100,)


def test_start_with_no_max_key_is_done() -> None:
    p = progress()
    p.start(None)
    assert p.status is SnapshotStatus.DONE
    assert p.status.finished


def test_start_with_a_wrong_width_max_key_raises() -> None:
    with pytest.raises(StateError, match=re.escape("public.orders")):
        progress().start((1, 2))


def test_start_normalizes_bytes_likes() -> None:
    p = progress()
    p.start((bytearray(b"zz"),))
    assert p.max_key == (b"zz",) and type(p.max_key[0]) is bytes


def test_chunk_done_advances_and_counts() -> None:
    p = running((100,))
    p.chunk_done(last_key=(10,), selected=10, emitted=9, chunk_size=10)
    assert (p.status, p.last_read_key, p.chunk_id, p.rows_emitted) == (
        SnapshotStatus.RUNNING,
        (10,),
        1,
        9,
    )
    p.chunk_done(last_key=(20,), selected=10, emitted=10, chunk_size=10)
    assert (p.status, p.last_read_key, p.chunk_id, p.rows_emitted) == (
        SnapshotStatus.RUNNING,
        (20,),
        2,
        19,
    )


def test_chunk_done_advances_even_when_nothing_was_emitted() -> None:
    # Hot keys: the log dropped every row of the chunk; the next chunk must still move on.
    p = running((100,))
    p.chunk_done(last_key=(10,), selected=10, emitted=0, chunk_size=10)
    assert p.last_read_key == (10,)
    assert (p.chunk_id, p.rows_emitted, p.status) == (1, 0, SnapshotStatus.RUNNING)
    p.chunk_done(last_key=(20,), selected=10, emitted=0, chunk_size=10)
    assert p.last_read_key == (20,)


def test_short_chunk_finishes() -> None:
    p = running((100,))
    p.chunk_done(last_key=(50,), selected=3, emitted=3, chunk_size=10)
    assert p.status is SnapshotStatus.DONE
    assert p.last_read_key == (50,)


def test_empty_chunk_finishes_and_keeps_the_last_key() -> None:
    p = running((100,))
    p.chunk_done(last_key=(10,), selected=10, emitted=10, chunk_size=10)
    p.chunk_done(last_key=None, selected=0, emitted=0, chunk_size=10)
    assert p.status is SnapshotStatus.DONE
    assert p.last_read_key == (10,)
    assert p.chunk_id == 2


def test_reaching_the_max_key_finishes_a_full_chunk() -> None:
    p = running((Decimal("12.30"), b"k"))
    p.chunk_done(
        last_key=(Decimal("12.30"), memoryview(b"k")), selected=10, emitted=0, chunk_size=10
    )
    assert p.status is SnapshotStatus.DONE


def test_chunk_done_while_paused_is_allowed() -> None:
    p = running((100,))
    p.pause()
    p.chunk_done(last_key=(10,), selected=10, emitted=10, chunk_size=10)
    assert p.status is SnapshotStatus.PAUSED and p.last_read_key == (10,)
    p.chunk_done(last_key=(11,), selected=1, emitted=1, chunk_size=10)
    assert p.status is SnapshotStatus.DONE


def test_chunk_done_rejects_inconsistent_counts() -> None:
    p = running()
    with pytest.raises(StateError):
        p.chunk_done(last_key=None, selected=3, emitted=0, chunk_size=10)
    with pytest.raises(StateError):
        p.chunk_done(last_key=(3,), selected=3, emitted=4, chunk_size=10)
    assert (p.chunk_id, p.rows_emitted, p.last_read_key) == (0, 0, None)


def test_pause_and_resume_a_running_snapshot() -> None:
    p = running()
    p.pause()
    assert p.status is SnapshotStatus.PAUSED and not p.status.finished
    p.resume()
    assert p.status is SnapshotStatus.RUNNING


def test_resume_goes_back_to_pending_when_paused_before_start() -> None:
    p = progress()
    p.pause()
    p.resume()
    assert p.status is SnapshotStatus.PENDING
    p.start((5,))
    assert p.status is SnapshotStatus.RUNNING


@pytest.mark.parametrize("setup", ["pending", "running", "paused"])
def test_stop(setup: str) -> None:
    p = progress()
    if setup != "pending":
        p.start((1,))
    if setup == "paused":
        p.pause()
    p.stop()
    assert p.status is SnapshotStatus.STOPPED and p.status.finished


def test_fail_records_the_error() -> None:
    p = running()
    p.fail("connection lost")
    assert p.status is SnapshotStatus.FAILED and p.status.finished
    assert p.error == "connection lost"


def _in_status(status: SnapshotStatus) -> TableProgress:
    p = progress()
    match status:
        case SnapshotStatus.RUNNING:
            p.start((1,))
        case SnapshotStatus.PAUSED:
            p.start((1,))
            p.pause()
        case SnapshotStatus.DONE:
            p.start(None)
        case SnapshotStatus.STOPPED:
            p.stop()
        case SnapshotStatus.FAILED:
            p.fail("x")
    assert p.status is status
    return p


ACTIONS: dict[str, Any] = {
    "start": lambda p: p.start((1,)),
    "chunk_done": lambda p: p.chunk_done(last_key=(1,), selected=1, emitted=1, chunk_size=5),
    "pause": lambda p: p.pause(),
    "resume": lambda p: p.resume(),
    "stop": lambda p: p.stop(),
}
S = SnapshotStatus
FORBIDDEN = [
    ("start", S.RUNNING),
    ("start", S.PAUSED),
    ("start", S.DONE),
    ("start", S.STOPPED),
    ("start", S.FAILED),
    ("chunk_done", S.PENDING),
    ("chunk_done", S.DONE),
    ("chunk_done", S.STOPPED),
    ("chunk_done", S.FAILED),
    ("pause", S.PAUSED),
    ("pause", S.DONE),
    ("pause", S.STOPPED),
    ("pause", S.FAILED),
    ("resume", S.PENDING),
    ("resume", S.RUNNING),
    ("resume", S.DONE),
    ("resume", S.STOPPED),
    ("resume", S.FAILED),
    ("stop", S.DONE),
    ("stop", S.STOPPED),
    ("stop", S.FAILED),
]


@pytest.mark.parametrize(
    ("action", "status"), FORBIDDEN, ids=[f"{a}-{s.value}" for a, s in FORBIDDEN]
)
def test_forbidden_transitions_raise(action: str, status: SnapshotStatus) -> None:
    p = _in_status(status)
    before = p.model_copy(deep=True)
    with pytest.raises(StateError) as info:
        ACTIONS[action](p)
    message = str(info.value)
    assert "public.orders" in message
    assert status.value in message
    assert p == before


def test_finished_statuses() -> None:
    assert {s for s in SnapshotStatus if s.finished} == {S.DONE, S.STOPPED, S.FAILED}


def test_assignment_is_validated() -> None:
    p = progress()
    with pytest.raises(ValueError):
        p.status = "sleeping"  # type: ignore[assignment]


# --- EngineState ---------------------------------------------------------------------------


def test_active_skips_paused_and_finished() -> None:
    done, stopped, failed, paused = (_in_status(s) for s in (S.DONE, S.STOPPED, S.FAILED, S.PAUSED))
    nxt = progress(ITEMS, signal_id="next")
    later = progress(ITEMS, signal_id="later")
    state = EngineState(snapshots=[done, stopped, failed, paused, nxt, later])
    assert state.active() is nxt
    nxt.start((1,))
    assert state.active() is nxt
    nxt.pause()
    assert state.active() is later
    later.stop()
    assert state.active() is None
    assert EngineState().active() is None


def test_progress_returns_the_newest_record_of_a_table() -> None:
    old = _in_status(S.DONE)
    other = progress(ITEMS)
    new = progress(signal_id="sig-2")
    state = EngineState(snapshots=[old, other, new])
    assert state.progress(ORDERS) is new
    assert state.progress(ITEMS) is other
    assert state.progress(TableId("public", "missing")) is None
    assert state.progress(TableId(None, "orders")) is None


# --- processed signals ---------------------------------------------------------------------


def test_a_replayed_signal_is_processed_and_a_reused_id_is_not() -> None:
    state = EngineState()
    at = Position(100, 3)
    assert not state.was_processed("ad-hoc-1", at)
    state.mark_processed("ad-hoc-1", at)
    assert state.processed_signals == {"ad-hoc-1": at.token}
    # A restart replays the log from before the signal: the same row comes back at `at`.
    assert state.was_processed("ad-hoc-1", at)
    assert state.was_processed("ad-hoc-1", Position(90, 0))
    assert not state.was_processed("ad-hoc-2", at)
    # Debezium's docs reuse ids: the same id inserted again later is a new signal.
    later = Position(250, 0)
    assert not state.was_processed("ad-hoc-1", later)
    assert not state.was_processed("ad-hoc-1", Position(100, 4))
    state.mark_processed("ad-hoc-1", later)
    assert state.processed_signals == {"ad-hoc-1": later.token}
    assert state.was_processed("ad-hoc-1", later)
    assert state.was_processed("ad-hoc-1", at)  # a replay from further back


def test_was_processed_compares_positions_of_different_arity() -> None:
    state = EngineState()
    state.mark_processed("s", Position(7, 1))
    assert state.was_processed("s", Position(7))
    assert state.was_processed("s", Position(7, 0, 9))
    assert not state.was_processed("s", Position(7, 1, 0))  # sorts after (7, 1)
    assert not state.was_processed("s", Position(8))


def test_prune_drops_only_signals_before_the_replay_point() -> None:
    state = EngineState()
    state.mark_processed("old", Position(1, 9))
    state.mark_processed("at", Position(2, 0))
    state.mark_processed("new", Position(3, 0))
    state.mark_processed("prefix", Position(2))
    state.prune_processed(Position(2, 0))
    assert state.processed_signals == {"at": Position(2, 0).token, "new": Position(3, 0).token}
    state.prune_processed(Position(0))
    assert set(state.processed_signals) == {"at", "new"}
    state.prune_processed(Position(9))
    assert state.processed_signals == {}


def test_processed_signals_survive_json() -> None:
    state = EngineState()
    state.mark_processed("s1", Position(4, 2))
    state.mark_processed("s2", Position(4, 2).read_row(0))
    back = EngineState.from_json(state.to_json())
    assert back.processed_signals == state.processed_signals
    assert back.was_processed("s1", Position(4, 2)) and back.was_processed("s2", Position(4, 2))
    assert not back.was_processed("s1", Position(4, 3))
    assert not back.was_processed("s3", Position(0))


signal_ids = st.sampled_from(["a", "b", "ad-hoc-1"])
small_positions = st.lists(st.integers(0, 3), min_size=1, max_size=3).map(tuple)
signal_ops = st.lists(
    st.one_of(
        st.tuples(st.just("mark"), signal_ids, small_positions),
        st.tuples(st.just("check"), signal_ids, small_positions),
        st.tuples(st.just("prune"), st.just(""), small_positions),
        st.tuples(st.just("reload"), st.just(""), st.just((0,))),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(ops=signal_ops)
def test_processed_signals_follow_a_simple_model(
    ops: list[tuple[str, str, tuple[int, ...]]],
) -> None:
    state = EngineState()
    model: dict[str, tuple[int, ...]] = {}  # id -> where it was last processed
    for op, sid, parts in ops:
        at = Position(*parts)
        match op:
            case "mark":
                state.mark_processed(sid, at)
                model[sid] = parts
            case "check":
                assert state.was_processed(sid, at) == (sid in model and parts <= model[sid])
            case "prune":
                state.prune_processed(at)
                model = {k: v for k, v in model.items() if v >= parts}
            case "reload":
                state = EngineState.from_json(state.to_json())
        assert state.processed_signals == {k: Position(*v).token for k, v in model.items()}


# --- engine-wide pause ---------------------------------------------------------------------


def engine_with_every_status() -> tuple[EngineState, dict[str, TableProgress]]:
    snaps = {
        "done": _in_status(S.DONE),
        "stopped": _in_status(S.STOPPED),
        "failed": _in_status(S.FAILED),
        "running": progress(ITEMS, signal_id="running"),
        "pending": progress(ITEMS, signal_id="pending"),
    }
    snaps["running"].start((9,))
    state = EngineState()
    for p in snaps.values():
        state.add(p)
    return state, snaps


def test_add_appends_a_pending_snapshot() -> None:
    state = EngineState()
    a, b = progress(signal_id="a"), progress(ITEMS, signal_id="b")
    state.add(a)
    state.add(b)
    assert state.snapshots == [a, b]
    assert a.status is b.status is SnapshotStatus.PENDING
    assert state.active() is a


def test_pause_pauses_every_unfinished_snapshot_and_resume_restores_them() -> None:
    state, snaps = engine_with_every_status()
    assert state.active() is snaps["running"]
    state.pause()
    assert state.paused
    assert {k: p.status for k, p in snaps.items()} == {
        "done": S.DONE,
        "stopped": S.STOPPED,
        "failed": S.FAILED,
        "running": S.PAUSED,
        "pending": S.PAUSED,
    }
    assert state.active() is None
    state.resume()
    assert not state.paused
    assert snaps["running"].status is S.RUNNING  # it had a maximum key
    assert snaps["pending"].status is S.PENDING  # it had not started
    assert (snaps["done"].status, snaps["stopped"].status, snaps["failed"].status) == (
        S.DONE,
        S.STOPPED,
        S.FAILED,
    )
    assert state.active() is snaps["running"]


def test_a_snapshot_added_while_paused_waits_for_resume() -> None:
    state = EngineState()
    state.pause()
    assert state.paused and state.snapshots == []
    p = progress()
    state.add(p)
    assert state.snapshots == [p]
    assert p.status is S.PAUSED
    assert state.active() is None
    state.resume()
    assert p.status is S.PENDING
    assert state.active() is p


def test_active_is_none_while_paused() -> None:
    state, _ = engine_with_every_status()
    state.pause()
    assert state.active() is None
    # Even a snapshot that slipped in as pending (not through add) is not read while paused.
    state.snapshots.append(progress(signal_id="sneaky"))
    assert state.active() is None


def test_pause_twice_and_resume_when_not_paused_raise() -> None:
    state, _ = engine_with_every_status()
    with pytest.raises(StateError, match="not paused"):
        state.resume()
    assert not state.paused
    state.pause()
    before = state.model_copy(deep=True)
    with pytest.raises(StateError, match="already paused"):
        state.pause()
    assert state == before
    state.resume()
    with pytest.raises(StateError, match="not paused"):
        state.resume()


def test_a_chunk_in_flight_may_finish_while_paused() -> None:
    state = EngineState()
    p = running((100,))
    state.add(p)
    state.pause()
    p.chunk_done(last_key=(100,), selected=10, emitted=10, chunk_size=10)
    assert p.status is S.DONE
    state.resume()
    assert p.status is S.DONE and state.active() is None


def test_pause_survives_json() -> None:
    state, _ = engine_with_every_status()
    state.pause()
    text = state.to_json()
    assert json.loads(text)["paused"] is True
    back = EngineState.from_json(text)
    assert back == state and back.paused and back.active() is None
    back.resume()
    assert back.active() is back.snapshots[3]
    assert back.snapshots[3].status is S.RUNNING


engine_ops = st.lists(
    st.sampled_from(["add", "pause", "resume", "start", "chunk", "stop", "reload"]), max_size=25
)


@settings(max_examples=150, deadline=None)
@given(ops=engine_ops)
def test_pause_is_engine_wide_whatever_happens(ops: list[str]) -> None:
    state = EngineState()
    for n, op in enumerate(ops):
        active = state.active()
        match op:
            case "add":
                state.add(progress(signal_id=f"s{n}"))
            case "pause" | "resume":
                if state.paused == (op == "pause"):
                    with pytest.raises(StateError):
                        getattr(state, op)()
                else:
                    getattr(state, op)()
            case "start" if active is not None and active.status is S.PENDING:
                active.start((n,))
            case "chunk":  # the running one, or one paused with a window in flight
                target = next(
                    (p for p in state.snapshots if p.status in (S.RUNNING, S.PAUSED) and p.max_key),
                    None,
                )
                if target is not None:
                    target.chunk_done(last_key=(n,), selected=5, emitted=5, chunk_size=5)
            case "stop" if active is not None:
                active.stop()
            case "reload":
                state = EngineState.from_json(state.to_json())
        statuses = [p.status for p in state.snapshots]
        if state.paused:
            assert state.active() is None
            assert S.PENDING not in statuses and S.RUNNING not in statuses
        else:
            assert S.PAUSED not in statuses
            for p in state.snapshots:
                if p.status is S.RUNNING:
                    assert p.max_key is not None
                if p.status is S.PENDING:
                    assert p.max_key is None


# --- stream state --------------------------------------------------------------------------


@pytest.mark.parametrize("position", [Position(1), Position(0x16B3748, 2), Position(3, 4, 5, 6)])
def test_stream_position_is_a_token_of_any_arity(position: Position) -> None:
    stream = StreamState(position=position.token)
    back = EngineState.from_json(EngineState(stream=stream).to_json()).stream
    assert back.position == position.token
    assert Position.from_token(back.position) == position


@pytest.mark.parametrize(
    "bad", ["", "nope", "0000000000000005-0000000000000006-00000007", "000000000000000A", 5]
)
def test_stream_position_is_validated(bad: Any) -> None:
    with pytest.raises(ValueError):
        StreamState(position=bad)
    stream = StreamState()
    with pytest.raises(ValueError):
        stream.position = bad
    assert stream.position is None


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=12,
)


@settings(max_examples=75, deadline=None)
@given(resume=st.dictionaries(st.text(max_size=10), json_values, max_size=5))
def test_stream_resume_round_trips_as_is(resume: dict[str, Any]) -> None:
    state = EngineState(stream=StreamState(position=Position(1, 2).token, resume=resume))
    text = state.to_json()
    assert json.loads(text)["stream"]["resume"] == resume
    back = EngineState.from_json(text)
    assert back.stream.resume == resume
    assert back == state


def test_table_given_as_string_is_parsed() -> None:
    p = TableProgress(table='public."Odd Name"', signal_id="s", key_columns=["id"])
    assert p.table == TableId("public", "Odd Name")
    with pytest.raises(ValueError):
        TableProgress(table="orders", signal_id="s", key_columns=["id"])


def test_a_boolean_version_is_not_a_version() -> None:
    with pytest.raises(StateError, match="version"):
        EngineState.from_json('{"version": true}')


@pytest.mark.parametrize("finish", ["done", "stopped", "failed"])
def test_a_finished_snapshot_cannot_fail(finish: str) -> None:
    p = running()
    if finish == "done":
        p.chunk_done(last_key=(100,), selected=1, emitted=1, chunk_size=10)
    elif finish == "stopped":
        p.stop()
    else:
        p.fail("boom")
    with pytest.raises(StateError, match="cannot fail"):
        p.fail("again")


def test_a_state_that_contradicts_itself_is_refused() -> None:
    paused_table = json.loads(sample_state().to_json())
    paused_table["snapshots"][0]["status"] = "paused"
    with pytest.raises(StateError, match="paused but the engine is not"):
        EngineState.from_json(json.dumps(paused_table))
    paused_engine = json.loads(sample_state().to_json())
    paused_engine["paused"] = True
    with pytest.raises(StateError, match="pending or running"):
        EngineState.from_json(json.dumps(paused_engine))
    with pytest.raises(StateError):
        EngineState.from_json(json.dumps({"version": 1, "paused": "yes"}))


def test_start_needs_key_columns() -> None:
    p = TableProgress(table=ORDERS, signal_id="s")
    with pytest.raises(StateError, match="key columns"):
        p.start((1,))


def test_signal_problems_keep_the_newest() -> None:
    from snapshotter.core.state import MAX_SIGNAL_PROBLEMS, SignalProblem

    state = EngineState()
    for i in range(MAX_SIGNAL_PROBLEMS + 5):
        state.add_problem(SignalProblem(signal_id=str(i), signal_type="x", message="bad"))
    assert len(state.signal_problems) == MAX_SIGNAL_PROBLEMS
    assert state.signal_problems[-1].signal_id == str(MAX_SIGNAL_PROBLEMS + 4)
    assert EngineState.from_json(state.to_json()) == state

"""Debezium notifications derived from state changes (core.notifications), and the log
channel: examples, then a property test of random snapshot histories against an oracle."""

from __future__ import annotations

import json
import logging
import re
from collections import defaultdict
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapshotter.app.notifications import LogChannel, Notifier, SinkChannel
from snapshotter.core.notifications import (
    Notification,
    NotificationType,
    ScanStatus,
    View,
    diff,
    failure_status,
    render_key,
)
from snapshotter.core.state import EngineState, SnapshotStatus, TableProgress

T = NotificationType


class Watch:
    """A state and its notifications, diffed whenever asked (as the engine's observer)."""

    def __init__(self, state: EngineState | None = None) -> None:
        self.state = state or EngineState()
        self.view = View.of(self.state)
        # Records are told apart by object: those the view knows stay alive (as the
        # engine's observer keeps them), so no new record can take a dropped one's id.
        self.alive = list(self.state.snapshots)
        self.sent: list[Notification] = []

    def look(self) -> list[Notification]:
        notes, self.view = diff(self.view, self.state, connector="test", now_ms=len(self.sent))
        self.alive = list(self.state.snapshots)
        self.sent.extend(notes)
        return notes

    def restart(self) -> None:
        """The engine stops and starts again: the state as saved, a fresh first view."""
        self.state = EngineState.from_json(self.state.to_json())
        self.view = View.of(self.state)
        self.alive = list(self.state.snapshots)

    def queue(self, signal: str, *tables: str) -> list[TableProgress]:
        added = [TableProgress(table=t, signal_id=signal) for t in tables]
        for progress in added:
            self.state.add(progress)
        return added


def kinds(notes: list[Notification]) -> list[str]:
    return [n.type.value for n in notes]


def start(progress: TableProgress, max_key: int | None) -> None:
    progress.key_columns = ["id"]
    progress.start(None if max_key is None else (max_key,))


def chunk(progress: TableProgress, last: int, rows: int, size: int = 10) -> None:
    progress.chunk_done(last_key=(last,), selected=rows, emitted=rows, chunk_size=size)


def test_a_snapshot_from_start_to_completed() -> None:
    w = Watch()
    a, b = w.queue("sig-1", "public.a", "public.b")
    assert [n.to_dict() for n in w.look()] == [
        {
            "id": "sig-1",
            "aggregate_type": "Incremental Snapshot",
            "type": "STARTED",
            "additional_data": {"data_collections": "public.a,public.b", "connector_name": "test"},
            "timestamp": 0,
        }
    ]
    start(a, 25)
    assert w.look() == []  # starting reads no chunk
    chunk(a, 10, 10)
    (progress,) = w.look()
    assert progress.type is T.IN_PROGRESS
    assert progress.additional_data == {
        "data_collections": "public.a,public.b",
        "current_collection_in_progress": "public.a",
        "maximum_key": "25",
        "last_processed_key": "10",
        "connector_name": "test",
    }
    chunk(a, 20, 10)
    chunk(a, 25, 5)  # two chunks between looks: one IN_PROGRESS, the newest keys
    notes = w.look()
    assert kinds(notes) == ["IN_PROGRESS", "TABLE_SCAN_COMPLETED"]
    assert notes[0].additional_data["last_processed_key"] == "25"
    assert notes[1].additional_data == {
        "data_collections": "public.a,public.b",
        "scanned_collection": "public.a",
        "total_rows_scanned": "25",
        "status": "SUCCEEDED",
        "connector_name": "test",
    }
    start(b, None)  # an empty table: done at once
    notes = w.look()
    assert kinds(notes) == ["TABLE_SCAN_COMPLETED", "COMPLETED"]
    assert notes[0].additional_data["status"] == "EMPTY"
    assert notes[0].additional_data["data_collections"] == "public.b"
    assert notes[1].additional_data == {"connector_name": "test"}
    assert w.look() == []  # nothing new, nothing sent


def test_pause_resume_and_stop() -> None:
    w = Watch()
    (a,) = w.queue("sig-1", "public.a")
    start(a, 100)
    w.look()
    w.state.pause()
    assert kinds(w.look()) == ["PAUSED"]
    w.state.resume()
    chunk(a, 10, 10)
    notes = w.look()
    assert kinds(notes) == ["RESUMED", "IN_PROGRESS"]
    assert notes[0].additional_data["data_collections"] == "public.a"
    a.stop()
    notes = w.look()
    assert kinds(notes) == ["ABORTED"]  # stopped: no COMPLETED after it
    assert notes[0].additional_data["data_collections"] == "public.a"


def test_a_snapshot_queued_while_paused_starts_without_a_pause_notice() -> None:
    w = Watch()
    w.state.pause()
    w.queue("sig-1", "public.a")
    assert kinds(w.look()) == ["STARTED"]
    w.state.resume()
    assert kinds(w.look()) == ["RESUMED"]


def test_a_partial_stop_then_the_rest_done_is_completed() -> None:
    w = Watch()
    a, b = w.queue("sig-1", "public.a", "public.b")
    w.look()
    b.stop()
    assert kinds(w.look()) == ["ABORTED"]
    start(a, None)
    assert kinds(w.look()) == ["TABLE_SCAN_COMPLETED", "COMPLETED"]


@pytest.mark.parametrize(
    ("error", "status"),
    [
        ("table public.t has no primary key: name a NOT NULL column ...", "NO_PRIMARY_KEY"),
        ("table public.t does not exist (or the user cannot see it)", "UNKNOWN_SCHEMA"),
        ("public.v is a view: only tables can be snapshotted (snapshot ...)", "SKIPPED"),
        ("table public.x is not captured: add it ...", "SKIPPED"),
        (
            "snapshot of public.t refused: it has TOAST-able columns (v) and REPLICA "
            "IDENTITY DEFAULT, not FULL; ...",
            "SKIPPED",
        ),
        ("chunk query on table public.t failed: division by zero", "SQL_EXCEPTION"),
        (None, "SQL_EXCEPTION"),
    ],
)
def test_failure_status(error: str | None, status: str) -> None:
    assert failure_status(error) is ScanStatus(status)


def test_a_refused_table_is_started_and_completed_at_once() -> None:
    w = Watch()
    refused = TableProgress(table="public.v", signal_id="sig-1")
    refused.fail("public.v is a view: only tables can be snapshotted")
    w.state.snapshots.append(refused)
    notes = w.look()
    assert kinds(notes) == ["STARTED", "TABLE_SCAN_COMPLETED", "COMPLETED"]
    assert notes[1].additional_data["status"] == "SKIPPED"
    assert notes[1].additional_data["total_rows_scanned"] == "0"


def test_a_restart_sends_nothing_twice() -> None:
    w = Watch()
    a, _ = w.queue("sig-1", "public.a", "public.b")
    start(a, 30)
    chunk(a, 10, 10)
    assert kinds(w.look()) == ["STARTED", "IN_PROGRESS"]
    w.restart()
    assert w.look() == []  # no second STARTED
    a = w.state.snapshots[0]
    chunk(a, 30, 5)
    assert kinds(w.look()) == ["IN_PROGRESS", "TABLE_SCAN_COMPLETED"]
    w.restart()
    w.state.snapshots[1].key_columns = ["id"]
    w.state.snapshots[1].start(None)
    assert kinds(w.look()) == ["TABLE_SCAN_COMPLETED", "COMPLETED"]


def test_a_finished_request_in_the_loaded_state_is_not_completed_again() -> None:
    state = EngineState()
    (a,) = [TableProgress(table="public.a", signal_id="old")]
    state.add(a)
    start(a, None)
    w = Watch(state)
    assert w.look() == []


def test_a_signal_id_sent_again_is_a_new_snapshot() -> None:
    w = Watch()
    (first,) = w.queue("ad-hoc-1", "public.a")
    start(first, None)
    assert kinds(w.look()) == ["STARTED", "TABLE_SCAN_COMPLETED", "COMPLETED"]
    (second,) = w.queue("ad-hoc-1", "public.a")
    assert kinds(w.look()) == ["STARTED"]
    start(second, None)
    assert kinds(w.look()) == ["TABLE_SCAN_COMPLETED", "COMPLETED"]


def test_keys_as_debezium_renders_them() -> None:
    assert render_key(None) == "<null>"
    assert render_key((1001,)) == "1001"
    assert render_key(("eu", 7)) == "eu,7"
    assert render_key(("eu", None)) == "eu,<null>"


# --- property: random histories against an oracle -----------------------------------------

TABLES = ("s.a", "s.b", "s.c")

# "step" is the engine's usual day: start the active table (its size from the number; 0:
# empty), or read its next chunk (that many rows, of at most 12).
_NAMES = ["step"] * 8 + ["look"] * 3 + ["queue"] * 2 + ["resume"] * 2
_NAMES += ["pause", "stop", "stop_all", "fail", "refuse", "restart", "prune"]
op = st.tuples(st.sampled_from(_NAMES), st.integers(0, 40))


def _apply(w: Watch, name: str, n: int, signals: list[str]) -> None:
    state = w.state
    active = state.active()
    if name == "queue":
        n = n % 3 + 1
        busy = {p.table for p in state.snapshots if not p.status.finished}
        free = [t for t in TABLES if t not in busy][:n]
        if free:
            signals.append(f"sig-{len(signals)}")
            w.queue(signals[-1], *free)
    elif name == "step" and active is not None and active.status is SnapshotStatus.PENDING:
        start(active, n or None)
    elif name == "step" and active is not None and active.status is SnapshotStatus.RUNNING:
        assert active.max_key is not None
        rows = n % 12 + 1
        last = min(int((active.last_read_key or (0,))[0]) + rows, int(active.max_key[0]))
        chunk(active, last, rows, size=12)
    elif name == "pause" and not state.paused:
        state.pause()
    elif name == "resume" and state.paused:
        state.resume()
    elif name == "stop":
        unfinished = [p for p in state.snapshots if not p.status.finished]
        if unfinished:
            unfinished[n % len(unfinished)].stop()
    elif name == "stop_all":
        for p in state.snapshots:
            if not p.status.finished:
                p.stop()
    elif name == "fail" and active is not None:
        active.fail("table s.x has no primary key")
    elif name == "refuse":
        signals.append(f"sig-{len(signals)}")
        refused = TableProgress(table="s.v", signal_id=signals[-1])
        refused.fail("s.v does not exist")
        state.snapshots.append(refused)
    elif name == "look":
        w.look()
    elif name == "restart":
        w.look()  # the engine observed its last step before it stopped
        w.restart()
    elif name == "prune":
        # The engine prunes when a signal comes in, in a step after the one that finished
        # a table, which it observed (a record finished and dropped unseen is not news).
        w.look()
        state.prune_history()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, min_size=10, max_size=80))
def test_random_histories_against_the_oracle(ops: list[tuple[str, int]]) -> None:
    w = Watch()
    signals: list[str] = []
    finished_as: dict[tuple[str, str], SnapshotStatus] = {}
    rows: dict[tuple[str, str], int] = {}
    for name, n in ops:
        _apply(w, name, n, signals)
        for p in w.state.snapshots:
            if p.status.finished:
                finished_as[(p.signal_id, str(p.table))] = p.status
                rows[(p.signal_id, str(p.table))] = p.rows_read
    w.look()
    for p in w.state.snapshots:
        if p.status.finished:
            finished_as[(p.signal_id, str(p.table))] = p.status
            rows[(p.signal_id, str(p.table))] = p.rows_read

    by_signal: dict[str, list[Notification]] = defaultdict(list)
    for note in w.sent:
        assert note.additional_data["connector_name"] == "test"
        assert note.aggregate_type == "Incremental Snapshot"
        by_signal[note.id].append(note)
    assert set(by_signal) == set(signals)  # every signal was noticed, and nothing else

    for signal, notes in by_signal.items():
        # STARTED first and once.
        assert notes[0].type is T.STARTED and kinds(notes).count("STARTED") == 1
        # COMPLETED at most once, and last.
        assert kinds(notes).count("COMPLETED") <= 1
        if T.COMPLETED in [n.type for n in notes]:
            assert notes[-1].type is T.COMPLETED
        # A signal whose tables all finished ends with COMPLETED or ABORTED.
        tables = notes[0].additional_data["data_collections"].split(",")
        ends = [finished_as.get((signal, t)) for t in tables]
        if all(e is not None for e in ends):
            assert notes[-1].type in (T.COMPLETED, T.ABORTED)
            if all(e is SnapshotStatus.STOPPED for e in ends):
                assert T.COMPLETED not in [n.type for n in notes]
        # One TABLE_SCAN_COMPLETED per table done or failed, none for a stopped one.
        scanned = [
            n.additional_data["scanned_collection"]
            for n in notes
            if n.type is T.TABLE_SCAN_COMPLETED
        ]
        assert sorted(scanned) == sorted(
            t
            for t, e in zip(tables, ends, strict=True)
            if e in (SnapshotStatus.DONE, SnapshotStatus.FAILED)
        )
        for n in notes:
            if n.type is T.TABLE_SCAN_COMPLETED:
                table = n.additional_data["scanned_collection"]
                assert n.additional_data["total_rows_scanned"] == str(rows[(signal, table)])
        # IN_PROGRESS keys never go back, and none after the table's scan completed.
        last: dict[str, int] = {}
        done: set[str] = set()
        for n in notes:
            if n.type is T.IN_PROGRESS:
                table = n.additional_data["current_collection_in_progress"]
                assert table not in done
                key = int(n.additional_data["last_processed_key"])
                assert key >= last.get(table, 0)
                last[table] = key
            elif n.type is T.TABLE_SCAN_COMPLETED:
                done.add(n.additional_data["scanned_collection"])
        # PAUSED and RESUMED alternate (RESUMED may come first: queued while paused).
        switches = [n.type for n in notes if n.type in (T.PAUSED, T.RESUMED)]
        assert all(a is not b for a, b in pairwise(switches))


# --- the observer and the log channel -------------------------------------------------------


class _FakeEngine:
    def __init__(self, state: EngineState, sink: Any) -> None:
        self.state = state
        self.sink = sink
        self.observer: Any = None

    def observe_saves(self, observer: Any) -> None:
        self.observer = observer


class _NotifiedSink:
    def __init__(self) -> None:
        self.got: list[tuple[str, dict[str, Any]]] = []

    def notify(self, records: Any, topic: str) -> None:
        self.got.extend((topic, dict(r)) for r in records)


def test_the_log_channel_and_the_sink_channel(caplog: pytest.LogCaptureFixture) -> None:
    state = EngineState()
    state.add(TableProgress(table="public.old", signal_id="before"))
    sink = _NotifiedSink()
    notifier = Notifier([LogChannel(), SinkChannel("test.notifications")], connector="test")
    notifier.start(_FakeEngine(state, sink))  # type: ignore[arg-type]
    caplog.set_level(logging.INFO, logger="snapshotter.notifications")
    notifier(state)
    assert caplog.records == [] and sink.got == []  # the loaded state is no news
    (a,) = [TableProgress(table="public.a", signal_id="sig-1")]
    state.add(a)
    start(a, None)
    notifier(state)
    notifier.close()
    lines = [r for r in caplog.records if r.name == "snapshotter.notifications"]
    assert [json.loads(r.getMessage())["type"] for r in lines] == [
        "STARTED",
        "TABLE_SCAN_COMPLETED",
        "COMPLETED",
    ]
    assert all(r.levelno == logging.INFO for r in lines)
    assert [t for t, _ in sink.got] == ["test.notifications"] * 3
    assert [r for _, r in sink.got] == [json.loads(r.getMessage()) for r in lines]


def test_only_saved_states_are_notified_so_a_resume_never_goes_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 26: IN_PROGRESS followed the engine's live state, ahead of the state saved at
    the last acknowledged checkpoint; after a crash the resumed run read those chunks again
    and sent ``last_processed_key`` going back (7607 -> 2027). Saved states only: the live
    records run ahead unseen, and copies of them (as the checkpointer takes) are what is
    sent, told apart by the live records they were copied from (no second STARTED)."""
    caplog.set_level(logging.INFO, logger="snapshotter.notifications")
    saved: list[str] = []  # the state file, as the engine saves it

    def run(state: EngineState) -> tuple[Callable[[], None], _FakeEngine]:
        notifier = Notifier([LogChannel()], connector="test")
        engine = _FakeEngine(state, None)
        notifier.start(engine)  # type: ignore[arg-type]

        def save() -> None:  # a checkpoint acknowledged: its copy saved, then observed
            copy = state.model_copy(deep=True)
            saved.append(copy.to_json())
            engine.observer(copy, list(state.snapshots))

        return save, engine

    def sent() -> list[str]:
        records = [json.loads(r.getMessage()) for r in caplog.records]
        return [
            r["type"] + " " + r["additional_data"].get("last_processed_key", "") for r in records
        ]

    live = EngineState()
    save, _ = run(live)
    (a,) = [TableProgress(table="public.a", signal_id="sig")]
    live.add(a)
    start(a, 100)
    for last in (20, 40):
        chunk(a, last, 10)
    save()
    for last in (60, 80):  # read, not yet acknowledged: not said
        chunk(a, last, 10)
    assert sent() == ["STARTED ", "IN_PROGRESS 40"]
    save()
    chunk(a, 100, 10)  # the last chunk: killed before the next save
    assert sent() == ["STARTED ", "IN_PROGRESS 40", "IN_PROGRESS 80"]

    resumed = EngineState.from_json(saved[-1])  # the resumed run loads the newest save
    save, _ = run(resumed)
    (b,) = resumed.snapshots
    chunk(b, 100, 10)  # read again
    save()
    assert sent() == [
        "STARTED ",
        "IN_PROGRESS 40",
        "IN_PROGRESS 80",
        "IN_PROGRESS 100",
        "TABLE_SCAN_COMPLETED ",
        "COMPLETED ",
    ]


def test_a_failing_channel_never_stops_the_engine(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def notify(self, records: Any, topic: str) -> None:
            raise OSError("disk full")

    state = EngineState()
    notifier = Notifier([SinkChannel("t")], connector="test")
    notifier.start(_FakeEngine(state, Broken()))  # type: ignore[arg-type]
    for signal in ("s1", "s2"):
        state.add(TableProgress(table=f"public.{signal}", signal_id=signal))
        notifier(state)  # no exception
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "disk full" in errors[0].getMessage()  # said once


# --- the sinks' notification streams -----------------------------------------------------

RECORD = Notification(
    "sig-1",
    T.TABLE_SCAN_COMPLETED,
    {"scanned_collection": "public.a", "status": "SUCCEEDED", "connector_name": "test"},
    1795760000123,
).to_dict()


def test_the_jsonl_sink_writes_a_file_beside_the_events(tmp_path: Any) -> None:
    from snapshotter.sinks.jsonl import JsonlSink, notifications_path

    sink = JsonlSink(tmp_path / "events.jsonl", "test", key_columns=lambda table: ["id"])
    sink.notify([RECORD, RECORD], "test.notifications")
    path = notifications_path(tmp_path / "events.jsonl")
    assert path == tmp_path / "events.notifications.jsonl"
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert lines == [{"topic": "test.notifications", "key": {"id": "sig-1"}, "value": RECORD}] * 2


def test_the_spark_sink_writes_parquet_files_under_the_landing_root(tmp_path: Any) -> None:
    import pyarrow.parquet as pq

    from snapshotter.sinks.spark.notifications import notifications_dir, write_notifications

    root = str(tmp_path / "lake")
    write_notifications(root, [RECORD])
    write_notifications(root, [RECORD, RECORD])
    table = pq.read_table(notifications_dir(root))  # what spark.read.parquet reads
    rows = table.to_pylist()
    assert len(rows) == 3
    assert {r["id"] for r in rows} == {"sig-1"}
    assert dict(rows[0]["additional_data"]) == RECORD["additional_data"]
    assert rows[0]["timestamp"] == RECORD["timestamp"]
    assert not [
        p for p in (tmp_path / "lake" / "_notifications").iterdir() if p.name.startswith(".")
    ]


# --- configuration ---------------------------------------------------------------------------

_SOURCE = '[source]\nkind = "postgres"\nurl = "postgresql://u@h/db"\nname = "inv"\n'


def test_the_notifications_section() -> None:
    from snapshotter.app.notifications import sink_topic
    from snapshotter.config import parse_config

    config = parse_config(_SOURCE, environ={})
    assert config.notifications.channels == []  # off by default, as in Debezium
    assert str(config.notification_table_id) == "public.debezium_notification"
    assert sink_topic(config) == "inv.notifications"
    config = parse_config(
        _SOURCE + '[notifications]\nchannels = ["log", "table"]\ntable = "ops.notes"\n'
        'topic = "inv.snapshots"\n',
        environ={"SNAPSHOTTER_NOTIFICATIONS_CHANNELS": '["sink", "log", "sink"]'},
    )
    assert config.notifications.channels == ["sink", "log"]  # the environment wins; once each
    assert str(config.notification_table_id) == "ops.notes"
    assert sink_topic(config) == "inv.snapshots"


@pytest.mark.parametrize(
    ("section", "says"),
    [
        ('channels = ["jmx"]', "notifications.channels.0"),
        ('chanels = ["log"]', "did you mean channels"),
        ('channels = ["table"]\ntable = "debezium_signal"', "is the signal table"),
        ('table = "a.b.c"', "notifications.table"),
    ],
)
def test_a_wrong_notifications_section_is_refused(section: str, says: str) -> None:
    from snapshotter.config import ConfigError, parse_config

    with pytest.raises(ConfigError, match=re.escape(says)):
        parse_config(_SOURCE + f"[notifications]\n{section}\n", environ={})


def test_the_table_channel_writes_off_thread_and_retries(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import sqlalchemy as sa

    import snapshotter.app.notifications as channels
    from signals.names import TableId

    monkeypatch.setattr(channels, "RETRY_FIRST_S", 0.01)
    name = TableId("main", "debezium_notification")
    db = sa.create_engine(f"sqlite:///{tmp_path / 'source.db'}")
    attempts: list[int] = []

    def connect() -> sa.Engine:
        attempts.append(1)
        if len(attempts) == 1:  # the database is down at first; later the table exists
            with db.begin() as conn:
                channels.create_notification_table(conn, name)
            raise OSError("connection refused")
        return db

    channel = channels.TableChannel(connect, name)
    channel.send([RECORD])
    channel.send([RECORD, RECORD])
    channel.close()
    with db.connect() as conn:
        rows = conn.execute(sa.text("SELECT id, type, additional_data FROM debezium_notification"))
        got = [(r[0], r[1], json.loads(r[2])) for r in rows]
    assert got == [("sig-1", "TABLE_SCAN_COMPLETED", RECORD["additional_data"])] * 3
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "connection refused" in errors[0]
    # Not a missing table: init would not help (the old message sent people there anyway).
    assert "snapshotter init" not in errors[0] and "source" in errors[0]

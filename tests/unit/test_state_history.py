"""Bounded state history (core/state.py prune_history), problem size, and what status shows
of untrusted text (status.py)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from signals.names import TableId
from snapshotter.app.status import TABLE_ROWS, status_report, table_rows
from snapshotter.core.state import (
    KEEP_FINISHED_PER_TABLE,
    MAX_FINISHED,
    MAX_PROBLEM_CHARS,
    EngineState,
    SignalProblem,
    SnapshotStatus,
    TableProgress,
)


def record(
    table: str, signal: str, status: SnapshotStatus, surrogate: bool = False
) -> TableProgress:
    progress = TableProgress(
        table=TableId("s", table),
        signal_id=signal,
        surrogate_key="uid" if surrogate else None,
        key_columns=["uid"] if surrogate else [],
    )
    if status is SnapshotStatus.FAILED:
        progress.fail("boom")
    elif status is SnapshotStatus.STOPPED:
        progress.stop()
    elif status is SnapshotStatus.DONE:
        progress.key_columns = ["uid"]
        progress.start(None)  # an empty table: done at once
    elif status is SnapshotStatus.RUNNING:
        progress.key_columns = ["uid"]
        progress.start((5,))
    return progress


def test_twenty_thousand_failed_records_are_pruned_to_the_cap():
    state = EngineState()
    state.snapshots = [record(f"nope_{i}", "big", SnapshotStatus.FAILED) for i in range(20_000)]
    dropped = state.prune_history()
    assert len(dropped) == 20_000 - MAX_FINISHED
    assert len(state.snapshots) == MAX_FINISHED
    # The newest are kept, in order.
    assert state.snapshots[-1].table == TableId("s", "nope_19999")
    assert state.snapshots[0].table == TableId("s", f"nope_{20_000 - MAX_FINISHED}")
    assert len(state.to_json()) < 600_000


def test_a_few_per_table_are_kept_and_unfinished_never_go():
    state = EngineState()
    state.snapshots = [record("t", f"old{i}", SnapshotStatus.FAILED) for i in range(10)]
    state.snapshots.append(record("t", "now", SnapshotStatus.PENDING))
    state.prune_history()
    assert [p.signal_id for p in state.snapshots] == ["old7", "old8", "old9", "now"]


def test_the_newest_surrogate_key_record_of_a_table_is_kept():
    state = EngineState()
    state.snapshots = [record("nopk", "sk", SnapshotStatus.DONE, surrogate=True)]
    state.snapshots += [record("nopk", f"f{i}", SnapshotStatus.FAILED) for i in range(5)]
    state.snapshots += [record(f"x{i}", "many", SnapshotStatus.FAILED) for i in range(MAX_FINISHED)]
    state.prune_history()
    assert state.snapshots[0].signal_id == "sk"  # it decides how nopk's events are keyed
    assert all(p.signal_id != "f0" for p in state.snapshots)


_statuses = st.sampled_from(list(SnapshotStatus))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcde"), _statuses, st.booleans()), max_size=60))
def test_pruning_properties(records):
    state = EngineState()
    state.snapshots = [
        record(t, f"sig{i}", status, surrogate) for i, (t, status, surrogate) in enumerate(records)
    ]
    before = list(state.snapshots)
    dropped = state.prune_history()
    kept = state.snapshots
    assert len(kept) + len(dropped) == len(before)
    # Order is kept; nothing unfinished is dropped.
    assert kept == [p for p in before if any(p is k for k in kept)]
    assert all(p.status.finished for p in dropped)
    for table in "abcde":
        finished = [p for p in kept if p.table.table == table and p.status.finished]
        assert len(finished) <= KEEP_FINISHED_PER_TABLE + 1  # + its surrogate-key record
        newest = [p for p in before if p.table.table == table and p.status.finished]
        if newest:
            assert any(p is newest[-1] for p in kept)
    assert state.prune_history() == []  # idempotent


def test_a_long_problem_message_is_cut():
    state = EngineState()
    state.add_problem(SignalProblem(signal_id="s", signal_type="log", message="m" * 100_000))
    message = state.signal_problems[0].message
    assert len(message) < MAX_PROBLEM_CHARS + 40 and message.endswith("more)")


def test_status_escapes_untrusted_text_and_stays_json():
    state = EngineState()
    progress = TableProgress(table=TableId("s", "evil\n\x1b[31mtable"), signal_id="id\u202e1")
    progress.fail("filter 'x\nERROR forged' refused")
    state.snapshots = [progress]
    state.add_problem(
        SignalProblem(signal_id="a\nb", signal_type="lo\x1bg", message="m\r\n\x85x\u2028y")
    )
    report = status_report(state, None, ["warn\nforged"])
    text = json.dumps(report, ensure_ascii=False)
    for bad in ("\n", "\r", "\x1b", "\x85", "\u202e", "\u2028"):
        assert bad not in text, repr(bad)
    assert json.loads(text) == report
    row = report["snapshots"][0]
    assert row["table"] == 's."evil\\n\\x1b[31mtable"'
    assert row["signal_id"] == "id\\u202e1"
    assert report["signal_problems"][0] == {
        "signal_id": "a\\nb",
        "type": "lo\\x1bg",
        "error": "m\\r\\n\\x85x\\u2028y",
    }
    assert report["warnings"] == ["warn\\nforged"]


def test_status_shows_a_bounded_history_of_an_old_state_file():
    state = EngineState()
    state.snapshots = [record(f"t{i}", "big", SnapshotStatus.FAILED) for i in range(5_000)]
    report = status_report(state, None)
    assert len(report["snapshots"]) == MAX_FINISHED
    assert len(state.snapshots) == 5_000  # the state itself is not changed by status


def test_the_status_table_shows_the_running_one_and_the_newest():
    rows = [{"state": "failed", "i": i} for i in range(TABLE_ROWS + 100)]
    rows[3] = {"state": "running", "i": 3}
    shown, hidden = table_rows(rows)
    assert len(shown) == TABLE_ROWS and hidden == 100
    assert shown[0]["i"] == 3 and shown[-1]["i"] == TABLE_ROWS + 99
    assert table_rows(rows[:10]) == (rows[:10], 0)

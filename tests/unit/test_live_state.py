"""A snapshot's end time (``finished_ms``): engine/live_state.py records it, by the engine's
wall clock, whichever way the snapshot finishes; a state file written before it was recorded
still reads."""

from __future__ import annotations

import json

from signals.names import TableId
from snapshotter.core.spans import SpanDone
from snapshotter.core.state import EngineState, SnapshotStatus, TableProgress
from snapshotter.engine.live_state import LiveState

WALL = 1_700_000_000_000


def live() -> tuple[LiveState, TableProgress]:
    progress = TableProgress(table=TableId("public", "orders"), signal_id="s")
    state = EngineState(snapshots=[progress])
    return LiveState(state, lambda: WALL), progress


def start(state: LiveState, progress: TableProgress, max_key: tuple[int, ...] | None) -> None:
    state.snapshot_started(
        progress, key_columns=["id"], max_key=max_key, estimated_rows=10, started_ms=WALL - 5
    )


def test_a_running_snapshot_has_no_end_time_and_a_done_one_has() -> None:
    state, progress = live()
    start(state, progress, (10,))
    assert progress.finished_ms is None
    state.spans_done(progress, [SpanDone(1, (5,), 5, 5, final=False)], chunk_size=5)
    assert progress.finished_ms is None
    state.spans_done(progress, [SpanDone(2, (10,), 5, 5, final=True)], chunk_size=5)
    assert progress.status is SnapshotStatus.DONE and progress.finished_ms == WALL


def test_an_empty_table_ends_at_its_start() -> None:
    state, progress = live()
    start(state, progress, None)
    assert progress.status is SnapshotStatus.DONE and progress.finished_ms == WALL


def test_a_failure_records_its_time_once() -> None:
    state, progress = live()
    start(state, progress, (10,))
    assert state.snapshot_failed(progress, "boom")
    assert progress.finished_ms == WALL
    state.wall_ms = lambda: WALL + 1_000
    assert not state.snapshot_failed(progress, "again")  # finished already: unchanged
    assert progress.finished_ms == WALL and progress.error == "boom"


def test_a_state_written_before_end_times_were_recorded_still_reads() -> None:
    """``finished_ms`` is optional: a version-1 file without it reads as "not recorded"."""
    state, progress = live()
    start(state, progress, None)
    raw = json.loads(state.state.to_json())
    assert raw["version"] == 1 and raw["snapshots"][0]["finished_ms"] == WALL
    del raw["snapshots"][0]["finished_ms"]
    assert EngineState.from_dict(raw).snapshots[0].finished_ms is None
    assert EngineState.from_json(state.state.to_json()) == state.state

"""Signal actions (``snapshotter.engine.signal_actions``) alone, through a context of fakes:
the registry maps each user signal type to its action, and each action changes the state
(and asks the engine) as the engine did when they were its methods."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import pytest

from signals import (
    USER_SIGNAL_TYPES,
    ExecuteSnapshot,
    LogSignal,
    PauseSnapshot,
    ResumeSnapshot,
    StopSnapshot,
)
from signals.model import Signal
from signals.names import TableId, parse_table_selector
from signals.plan import Selectors
from snapshotter.core.position import Position
from snapshotter.core.state import EngineState, SnapshotStatus
from snapshotter.engine.outcome import RunOutcome
from snapshotter.engine.retry import SourceUnavailableError
from snapshotter.engine.signal_actions import (
    ExecuteSnapshotAction,
    SignalActions,
    SignalContext,
)
from snapshotter.engine.workers import StartTask, Task

SIGNALS = TableId("s", "debezium_signal")
A, B, OUTSIDE = TableId("s", "a"), TableId("s", "b"), TableId("x", "c")
AT = Position(7)


@dataclass
class Engine:
    """What the actions ask of the engine, recorded."""

    tables: list[TableId] = field(default_factory=lambda: [A, B, SIGNALS, OUTSIDE])
    problems: list[tuple[str, str, str]] = field(default_factory=list)
    dropped: list[TableId] = field(default_factory=list)
    cancels: list[Callable[[Task], bool]] = field(default_factory=list)
    added: int = 0
    listing_error: Exception | None = None

    def problem(self, signal_id: str, kind: str, message: str, position: Position) -> None:
        assert position == AT
        self.problems.append((signal_id, kind, message))

    def list_tables(self) -> list[TableId]:
        if self.listing_error is not None:
            raise self.listing_error
        return self.tables

    def relation_kinds(self, tables: Sequence[TableId]) -> Mapping[TableId, str]:
        return {}

    def snapshots_added(self) -> None:
        self.added += 1


WALL_MS = 1_700_000_000_000  # the actions' wall clock (a snapshot's end time in state)


def context(engine: Engine, state: EngineState, outcome: RunOutcome) -> SignalContext:
    return SignalContext(
        state=state,
        outcome=outcome,
        problem=engine.problem,
        list_tables=engine.list_tables,
        relation_kinds=engine.relation_kinds,
        drop_run=lambda progress: engine.dropped.append(progress.table),
        cancel_tasks=engine.cancels.append,
        snapshots_added=engine.snapshots_added,
        captured=Selectors([parse_table_selector("s.*")], "s"),
        captured_text="['s.*']",
        signal_table=SIGNALS,
        default_schema="s",
        wall_ms=lambda: WALL_MS,
    )


@pytest.fixture
def setup() -> tuple[SignalActions, Engine, EngineState, RunOutcome]:
    engine, state, outcome = Engine(), EngineState(), RunOutcome()
    return SignalActions.default(context(engine, state, outcome)), engine, state, outcome


Setup = tuple[SignalActions, Engine, EngineState, RunOutcome]


def test_every_user_signal_type_has_an_action(setup: Setup) -> None:
    actions = setup[0]
    assert sorted(actions.types()) == sorted(t.value for t in USER_SIGNAL_TYPES)


def test_execute_snapshot_queues_the_named_captured_tables(setup: Setup) -> None:
    actions, engine, state, outcome = setup
    actions.dispatch(ExecuteSnapshot("e1", (parse_table_selector("s.*"),)), AT)
    assert [(p.table, p.signal_id, p.status) for p in state.snapshots] == [
        (A, "e1", SnapshotStatus.PENDING),
        (B, "e1", SnapshotStatus.PENDING),
    ]
    assert outcome.touched("e1") and engine.added == 1 and engine.problems == []
    assert outcome.exit_code(state) == 2  # not done yet


def test_execute_snapshot_skips_a_table_outside_the_capture(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    """Another pipeline reading the same signal table captures it: skipped with one note,
    as Debezium skips it; not a failed snapshot, not a signal problem."""
    actions, engine, state, outcome = setup
    caplog.set_level(logging.INFO, logger="snapshotter.engine")
    actions.dispatch(ExecuteSnapshot("e2", (A, OUTSIDE)), AT)
    assert {p.table: p.status for p in state.snapshots} == {A: SnapshotStatus.PENDING}
    assert engine.problems == [] and outcome.touched("e2")
    notes = [
        r.getMessage() for r in caplog.records if "not captured by this pipeline" in r.getMessage()
    ]
    assert len(notes) == 1 and "partly skipped: x.c" in notes[0], notes
    caplog.clear()
    actions.dispatch(ExecuteSnapshot("e3", (OUTSIDE,)), AT)
    assert len(state.snapshots) == 1 and engine.problems == [] and not outcome.touched("e3")
    notes = [
        r.getMessage() for r in caplog.records if "not captured by this pipeline" in r.getMessage()
    ]
    assert len(notes) == 1 and "e3 (execute-snapshot) ignored: x.c" in notes[0], notes
    caplog.clear()
    actions.dispatch(StopSnapshot("x9", (OUTSIDE,)), AT)
    assert state.snapshots[0].status is SnapshotStatus.PENDING  # only the named tables stop
    notes = [
        r.getMessage() for r in caplog.records if "not captured by this pipeline" in r.getMessage()
    ]
    assert len(notes) == 1 and "x9 (stop-snapshot) ignored" in notes[0], notes


def test_execute_snapshot_of_a_table_that_exists_nowhere_fails_it(setup: Setup) -> None:
    actions, _, state, outcome = setup
    ghost = TableId("x", "ghost")
    actions.dispatch(ExecuteSnapshot("e2", (ghost,)), AT)
    assert {p.table: p.status for p in state.snapshots} == {ghost: SnapshotStatus.FAILED}
    assert state.snapshots[0].finished_ms == WALL_MS  # status tells it from older ones
    assert outcome.touched("e2")


def test_execute_snapshot_of_nothing_known_is_a_problem(setup: Setup) -> None:
    actions, engine, state, outcome = setup
    actions.dispatch(ExecuteSnapshot("e3", (parse_table_selector("s.nothing_*"),)), AT)
    assert state.snapshots == []
    assert [(i, k) for i, k, _ in engine.problems] == [("e3", "execute-snapshot")]
    assert "matches no captured table, nor any other" in engine.problems[0][2]
    assert not outcome.touched("e3")


def test_a_listing_that_fails_is_a_problem_but_an_outage_stops_the_engine(setup: Setup) -> None:
    actions, engine, state, _ = setup
    engine.listing_error = RuntimeError("permission denied")
    actions.dispatch(ExecuteSnapshot("e4", (A,)), AT)
    assert "cannot resolve its tables: permission denied" in engine.problems[0][2]
    engine.listing_error = SourceUnavailableError("down for good")
    with pytest.raises(SourceUnavailableError):
        actions.dispatch(ExecuteSnapshot("e5", (A,)), AT)
    assert state.snapshots == []


def test_stop_snapshot_stops_the_named_tables_and_cancels_their_reads(setup: Setup) -> None:
    actions, engine, state, _ = setup
    actions.dispatch(ExecuteSnapshot("e1", (A, B)), AT)
    actions.dispatch(StopSnapshot("x1", (A,)), AT)
    statuses = {p.table: p.status for p in state.snapshots}
    assert statuses == {A: SnapshotStatus.STOPPED, B: SnapshotStatus.PENDING}
    assert [p.finished_ms for p in state.snapshots] == [WALL_MS, None]  # when it stopped
    assert engine.dropped == [A]
    (cancel,) = engine.cancels
    assert cancel(StartTask(A, "e1", None, None, known_max_key=False))
    assert not cancel(StartTask(B, "e1", None, None, known_max_key=False))
    assert not cancel(StartTask(A, "other signal", None, None, known_max_key=False))


def test_stop_snapshot_without_tables_stops_every_unfinished_one(setup: Setup) -> None:
    actions, engine, state, _ = setup
    actions.dispatch(ExecuteSnapshot("e1", (A, B)), AT)
    actions.dispatch(StopSnapshot("x1"), AT)
    assert {p.status for p in state.snapshots} == {SnapshotStatus.STOPPED}
    assert engine.dropped == [A, B]


def test_pause_and_resume(setup: Setup, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "snapshotter.engine")
    actions, engine, state, _ = setup
    actions.dispatch(ExecuteSnapshot("e1", (A,)), AT)
    actions.dispatch(PauseSnapshot("p1"), AT)
    assert state.paused and state.snapshots[0].status is SnapshotStatus.PAUSED
    actions.dispatch(PauseSnapshot("p2"), AT)  # already paused: a problem, not an error
    assert [(i, k) for i, k, _ in engine.problems] == [("p2", "pause-snapshot")]
    actions.dispatch(ResumeSnapshot("r1"), AT)
    assert not state.paused and state.snapshots[0].status is SnapshotStatus.PENDING
    actions.dispatch(ResumeSnapshot("r2"), AT)
    assert [k for _, k, _ in engine.problems] == ["pause-snapshot", "resume-snapshot"]
    assert "incremental snapshots paused by signal p1" in caplog.messages
    assert "incremental snapshots resumed by signal r1" in caplog.messages


def test_a_log_signal_is_written_to_the_engines_log_cut_short(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "snapshotter.engine")
    setup[0].dispatch(LogSignal("l1", "marker " + "x" * 10_000), AT)
    (line,) = [m for m in caplog.messages if m.startswith("log signal l1: marker")]
    assert len(line) < 5_000


def test_the_registry_takes_actions_by_type_and_refuses_the_rest(setup: Setup) -> None:
    engine, state, outcome = setup[1], setup[2], setup[3]
    seen: list[str] = []

    class Count:
        def arrived(self, signal: Signal, position: Position) -> None:
            seen.append(signal.id)

    only_log = SignalActions({"log": Count()})
    only_log.dispatch(LogSignal("l2", "hi"), AT)
    assert seen == ["l2"]
    with pytest.raises(LookupError, match="stop-snapshot"):
        only_log.dispatch(StopSnapshot("x2"), AT)
    # An action registered under the wrong type refuses the signal instead of misreading it.
    wrong = SignalActions({"log": ExecuteSnapshotAction(context(engine, state, outcome))})
    with pytest.raises(TypeError):
        wrong.dispatch(LogSignal("l3", "hi"), AT)

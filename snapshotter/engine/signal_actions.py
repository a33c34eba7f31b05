"""What each user signal does, registered by its type (as Debezium's SignalAction registry):
``execute-snapshot`` queues tables, ``stop-snapshot`` stops snapshots, ``pause-snapshot`` and
``resume-snapshot`` pause and resume them all, ``log`` writes a line to the engine's log.

The engine parses a signal row, handles its own watermark rows itself (they are the chunk
windows', not actions), and hands every other signal to ``SignalActions.dispatch``. An
action acts only through its ``SignalContext``: the state, the run's outcome, and a few
calls into the engine (listing tables, dropping a table's run, cancelling its reads), so
an action can be tried alone with a context of fakes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from signals import ExecuteSnapshot, LogSignal, PauseSnapshot, ResumeSnapshot, StopSnapshot
from signals.display import printable
from signals.model import Signal, SignalType
from signals.names import TableId, TableSelector, TableSet
from signals.plan import Selectors, listed, plan_snapshot
from snapshotter.core.position import Position
from snapshotter.core.state import EngineState, StateError, TableProgress
from snapshotter.engine.outcome import RunOutcome
from snapshotter.engine.retry import SourceUnavailableError
from snapshotter.engine.workers import Task

log = logging.getLogger("snapshotter.engine")

LOG_MESSAGE_CHARS = 4_000  # of a `log` signal's message, in the engine's log
SHOWN_TABLES = 20  # tables a log line about a signal names before "and N more"

# A signal the engine cannot act on, fully or in part: (signal id, signal type, message,
# where it is in the log); logged and kept in state for ``status``. The stream goes on.
KeepProblem = Callable[[str, str, str, Position], None]


@dataclass
class SignalContext:
    """What signal actions may read and do."""

    state: EngineState
    outcome: RunOutcome
    problem: KeepProblem
    # The source's tables (waits out a source that is restarting).
    list_tables: Callable[[], list[TableId]]
    # Why names that are not tables are not (a view, ...); for messages only.
    relation_kinds: Callable[[Sequence[TableId]], Mapping[TableId, str]]
    # Forget a snapshot's table run and its windows.
    drop_run: Callable[[TableProgress], None]
    # Cancel the running reads of the tasks that match.
    cancel_tasks: Callable[[Callable[[Task], bool]], None]
    # Snapshots were added: the engine refreshes the keys it compares.
    snapshots_added: Callable[[], None]
    captured: Selectors  # the tables the config captures
    captured_text: str  # ... as configured, for messages
    signal_table: TableId
    default_schema: str
    # The engine's own tables besides the signal table (the notification table) -> what it
    # is: never snapshotted.
    own_tables: Mapping[TableId, str] = field(default_factory=dict)
    # The epoch-ms clock of a snapshot's end time in state (``finished_ms``).
    wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000


class SignalAction(Protocol):
    def arrived(self, signal: Signal, position: Position) -> None:
        """Act on ``signal``, read at ``position`` in the log (once per signal id)."""


S = TypeVar("S", ExecuteSnapshot, StopSnapshot, PauseSnapshot, ResumeSnapshot, LogSignal)


class _Action(Generic[S]):
    """An action for the signals of one type (``handles``)."""

    handles: type[S]

    def __init__(self, context: SignalContext) -> None:
        self._context = context

    def arrived(self, signal: Signal, position: Position) -> None:
        if not isinstance(signal, self.handles):
            raise TypeError(f"{type(self).__name__} cannot act on a {signal.type.value} signal")
        self.act(signal, position)

    def act(self, signal: S, position: Position) -> None:
        raise NotImplementedError


class ExecuteSnapshotAction(_Action[ExecuteSnapshot]):
    """Queue the signal's tables (signals.plan): one catalog listing per signal, and a hash
    lookup per named table, so even a big signal costs little on the engine's thread."""

    handles = ExecuteSnapshot

    def act(self, signal: ExecuteSnapshot, position: Position) -> None:
        context = self._context
        state = context.state
        try:
            known = TableSet(context.list_tables())
            plan = plan_snapshot(
                signal,
                known=known,
                captured=context.captured,
                signal_table=context.signal_table,
                default_schema=context.default_schema,
                unfinished={
                    p.table: f"signal {p.signal_id}, {p.status.value}"
                    for p in state.snapshots
                    if not p.status.finished
                },
                describe_missing=context.relation_kinds,
                own_tables=context.own_tables,
            )
        except SourceUnavailableError:
            raise  # the state with the signal marked processed is never saved: read again
        except Exception as exc:
            context.problem(
                signal.id, signal.type.value, f"cannot resolve its tables: {exc}", position
            )
            return
        if plan.error is not None:
            context.problem(signal.id, signal.type.value, plan.error, position)
            return
        _note_skipped(context, signal, plan.skipped, nothing_else=not (plan.queue or plan.refused))
        for problem in plan.problems:
            context.problem(signal.id, signal.type.value, problem, position)
        if plan.queue or plan.refused:
            context.outcome.touch(signal.id)
        for table, condition in plan.queue:
            state.add(
                TableProgress(
                    table=table,
                    signal_id=signal.id,
                    surrogate_key=signal.surrogate_key,
                    filter=condition,
                )
            )
        if plan.queue:
            log.info(
                "snapshot of %s queued (signal %s)",
                listed([t for t, _ in plan.queue], SHOWN_TABLES),
                signal.id,
            )
        for table, reason in plan.refused:
            progress = TableProgress(
                table=table, signal_id=signal.id, surrogate_key=signal.surrogate_key
            )
            progress.fail(reason)
            progress.finished_ms = context.wall_ms()
            state.snapshots.append(progress)
        for table, reason in plan.refused[:SHOWN_TABLES]:
            log.error("snapshot of %s refused: %s", table, reason)
        if len(plan.refused) > SHOWN_TABLES:
            log.error(
                "signal %s: %d more tables refused (status shows each)",
                signal.id,
                len(plan.refused) - SHOWN_TABLES,
            )
        context.outcome.pruned(state.prune_history())
        context.snapshots_added()


def _note_skipped(
    context: SignalContext, signal: Signal, skipped: Sequence[TableSelector], *, nothing_else: bool
) -> None:
    """One log line for what a signal names that this pipeline does not capture: another
    pipeline reading the same signal table acts on it (as Debezium connectors skip tables
    they do not capture). Not a failed snapshot, not a signal problem."""
    if not skipped:
        return
    what = "ignored" if nothing_else else "partly skipped"
    log.info(
        "signal %s (%s) %s: %s not captured by this pipeline (source.tables = %s); another "
        "pipeline reading the signal table %s may act on it",
        signal.id,
        signal.type.value,
        what,
        listed([s if isinstance(s, TableId) else f"pattern {s}" for s in skipped], SHOWN_TABLES),
        context.captured_text,
        context.signal_table,
    )


class StopSnapshotAction(_Action[StopSnapshot]):
    """Stop the unfinished snapshots of the named tables (of every table, when none is
    named), and cancel their running reads."""

    handles = StopSnapshot

    def act(self, signal: StopSnapshot, position: Position) -> None:
        context = self._context
        named = [
            s.with_default_schema(context.default_schema)
            for s in signal.data_collections
            if isinstance(s, TableId)
        ]
        others: list[TableSelector] = [t for t in named if not context.captured.selects(t)]
        _note_skipped(context, signal, others, nothing_else=len(others) == len(named) > 0)
        stopped: set[tuple[str, TableId]] = set()
        for progress in self._matching(signal.data_collections):
            progress.stop()
            progress.finished_ms = context.wall_ms()
            context.drop_run(progress)
            stopped.add((progress.signal_id, progress.table))
            log.info("snapshot of %s stopped by signal %s", progress.table, signal.id)
        # A stopped table's max-key or chunk queries may run for long (a slow filter): cancel
        # them, so the workers are free for the next table at once.
        context.cancel_tasks(lambda task: (task.signal_id, task.table) in stopped)

    def _matching(self, selectors: Iterable[TableSelector]) -> list[TableProgress]:
        chosen = Selectors(selectors, self._context.default_schema)
        return [
            p
            for p in self._context.state.snapshots
            if not p.status.finished and (not chosen or chosen.selects(p.table))
        ]


class PauseSnapshotAction(_Action[PauseSnapshot]):
    handles = PauseSnapshot

    def act(self, signal: PauseSnapshot, position: Position) -> None:
        _switch(self._context, signal, self._context.state.pause, "paused", position)


class ResumeSnapshotAction(_Action[ResumeSnapshot]):
    handles = ResumeSnapshot

    def act(self, signal: ResumeSnapshot, position: Position) -> None:
        _switch(self._context, signal, self._context.state.resume, "resumed", position)


def _switch(
    context: SignalContext,
    signal: PauseSnapshot | ResumeSnapshot,
    change: Callable[[], None],
    done: str,
    position: Position,
) -> None:
    """Pause or resume all snapshots (``change``); one that cannot be is a problem."""
    try:
        change()
    except StateError as exc:
        context.problem(signal.id, signal.type.value, str(exc), position)
        return
    log.info("incremental snapshots %s by signal %s", done, signal.id)


class LogAction(_Action[LogSignal]):
    handles = LogSignal

    def act(self, signal: LogSignal, position: Position) -> None:
        log.info("log signal %s: %s", signal.id, printable(signal.message, LOG_MESSAGE_CHARS))


class SignalActions:
    """The registry: one action per signal type (its wire name, as in the signal row)."""

    def __init__(self, actions: Mapping[str, SignalAction]) -> None:
        self._actions = dict(actions)

    @classmethod
    def default(cls, context: SignalContext) -> SignalActions:
        """The engine's actions for the user signal types (signals.USER_SIGNAL_TYPES)."""
        return cls(
            {
                SignalType.EXECUTE_SNAPSHOT: ExecuteSnapshotAction(context),
                SignalType.STOP_SNAPSHOT: StopSnapshotAction(context),
                SignalType.PAUSE_SNAPSHOT: PauseSnapshotAction(context),
                SignalType.RESUME_SNAPSHOT: ResumeSnapshotAction(context),
                SignalType.LOG: LogAction(context),
            }
        )

    def types(self) -> list[str]:
        return list(self._actions)

    def dispatch(self, signal: Signal, position: Position) -> None:
        """Hand ``signal`` to the action of its type. A type without one is a bug (the
        parser accepts only types the engine acts on): LookupError."""
        action = self._actions.get(signal.type.value)
        if action is None:
            raise LookupError(f"no action for signal type {signal.type.value!r}")
        action.arrived(signal, position)

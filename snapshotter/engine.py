"""The engine: stream the log all the time, answer signals, run DBLog chunk windows.

One thread (the caller's) reads the log and does everything that touches state, windows and
the sink, in log order. The chunk workers (``chunk_worker``, ``[source] read_parallelism`` of
them) do the snapshot side's database calls beside it, so the stream never waits for a chunk
SELECT; which key range each chunk reads, and what progress records, is ``core.spans``.
Data flows one way:

    log items ──► windows (drop keys) ──► sink ──(acknowledged checkpoint)──► state file
    chunk rows ─┘ (READ rows at the close watermark, before any later log event)

Checkpoints are taken only at transaction boundaries, so the state saved for an acknowledged
checkpoint always names a point the log can restart from exactly: the sink is cut back to
that checkpoint, and the log replays whatever followed it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import sqlalchemy as sa

from signals import (
    ExecuteSnapshot,
    LogSignal,
    PauseSnapshot,
    ResumeSnapshot,
    SignalError,
    StopSnapshot,
    Watermark,
    parse_signal,
)
from signals.display import EscapeControls, printable
from signals.model import WatermarkKind
from signals.names import TableId, TableSelector, TableSet, parse_table_selector
from signals.plan import Selectors, listed, plan_snapshot
from snapshotter.chunk_worker import (
    ChunkBounded,
    ChunkRead,
    ChunkTask,
    ChunkWorkers,
    PhaseHooks,
    Result,
    StartTask,
    TableStarted,
    TaskFailed,
)
from snapshotter.config import Config
from snapshotter.core.events import ChangeEvent, Op
from snapshotter.core.keys import Key
from snapshotter.core.position import Position
from snapshotter.core.spans import SpanPlan, SpanRead
from snapshotter.core.state import (
    EngineState,
    SignalProblem,
    SnapshotStatus,
    StateError,
    TableProgress,
)
from snapshotter.core.visibility import RecentTransactions
from snapshotter.core.window import (
    ChunkWindow,
    Verdict,
    WindowOrderError,
    WindowPhase,
    buffer_key,
)
from snapshotter.faults import failpoint
from snapshotter.signal_cleanup import WatermarkCleanup
from snapshotter.sinks.base import Sink, SinkItem
from snapshotter.sources.base import Dialect, TableSchema
from snapshotter.sources.log import Change, Commit, LogItem, LogReader, Notice, Progress, TableShape
from snapshotter.state_store import StateStore

log = logging.getLogger("snapshotter.engine")
# Log lines carry text from signal rows (ids, messages, table names, filters): escaped, so
# that none can forge or hide a line (signals.display).
log.addFilter(EscapeControls())
logging.getLogger("snapshotter.chunks").addFilter(EscapeControls())

KeyColumns = Callable[[TableId], Sequence[str] | None]
OpenReader = Callable[[Mapping[str, Any], KeyColumns], LogReader]

# Windows waiting for their close watermark in the log, or being read: this many, or one
# more than the chunk reads that may run at once (read_parallelism), whichever is more.
WINDOWS_IN_FLIGHT = 3
# Chunks read beyond the durable progress (a slow read holds progress back while the windows
# after it go on), at most this many times the windows in flight: what a crash may cost in
# chunks read again (core.spans, 6.).
SPANS_AHEAD_PER_WINDOW = 4
# Watermark rows the engine did not write that took a window's id (core.window): the chunk
# is read again under a new id, up to this many times per table snapshot; then it fails.
FORGED_WINDOWS_MAX = 3
LOG_MESSAGE_CHARS = 4_000  # of a `log` signal's message, in the engine's log
SHOWN_TABLES = 20  # tables a log line about a signal names before "and N more"
RETIRED_WINDOWS = 256  # window ids remembered, so their late watermark rows stay quiet
READ_TIMEOUT_S = 0.05
REPORT_INTERVAL_S = 5.0
# The snapshot side's database calls failing for a transient reason (the dialect's
# ``is_transient``: connection lost, server restarting or unreachable) are retried, after
# RETRY_FIRST_S doubling up to RETRY_MAX_S, for up to SOURCE_RETRY_FOR_S of continuous
# failure (the ``retry_for`` parameter; this default when it is None); then the engine stops.
SOURCE_RETRY_FOR_S = 60.0
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 5.0
OUTAGE_GAP_S = 30.0


class EngineStop(Exception):
    """Raised by a stop callback to end ``run`` cleanly (state saved)."""


class SourceUnavailableError(ConnectionError):
    """The source database stayed unreachable past the retry bound. Nothing is failed or
    lost: the engine stopped with its state saved, and ``snapshotter resume`` continues."""


@dataclass
class _Flight:
    """A chunk window the engine holds, from registration to its close watermark."""

    task: ChunkTask


@dataclass
class _TableRun:
    """In-memory companion of an unfinished TableProgress."""

    progress: TableProgress
    schema: TableSchema | None = None
    starting: bool = False
    # The key ranges (spans) chunks read, from the last durable key; made once the table's
    # maximum key is known.
    plan: SpanPlan | None = None
    flights: list[str] = field(default_factory=list)  # window ids, oldest first
    convert: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    reported: float = 0.0  # when progress was last logged


@dataclass
class _Pending:
    state: EngineState
    resume: Mapping[str, Any]


class Engine:
    def __init__(
        self,
        *,
        config: Config,
        dialect: Dialect,
        open_reader: OpenReader,
        sink: Sink,
        store: StateStore,
        hooks: PhaseHooks | None = None,
        on_progress: Callable[[EngineState], None] | None = None,
        retry_for: float | None = None,
        open_dialect: Callable[[], Dialect] | None = None,
    ) -> None:
        self._config = config
        self._source = config.source
        self._dialect = dialect
        # A dialect of its own (connection, statement guard) for each chunk worker but the
        # first, which uses ``dialect``: needed when read_parallelism > 1.
        self._open_dialect = open_dialect
        self._parallelism = config.source.read_parallelism
        if self._parallelism > 1 and open_dialect is None:
            raise ValueError("read_parallelism > 1 needs open_dialect for the other workers")
        self._windows_in_flight = max(WINDOWS_IN_FLIGHT, self._parallelism + 1)
        self._open_reader = open_reader
        self._sink = sink
        self._store = store
        self._hooks = hooks
        self._on_progress = on_progress
        self._signal_table = config.source.signal_table_id
        self._patterns: list[TableSelector] = [
            _default_schema(parse_table_selector(t), config.source.default_schema)
            for t in config.source.tables
        ]
        self._captured_tables = Selectors(self._patterns, config.source.default_schema)
        self.state = store.load()
        self.state.prune_history()  # a state file from before history was bounded
        # A snapshot of this run that did not finish as done but whose record was pruned
        # from the history (the exit code must still say so).
        self._pruned_unsuccessful = False
        # Watermark rows that were not the engine's own, and cost a window, per table
        # snapshot (signal id + table): past FORGED_WINDOWS_MAX the snapshot fails.
        self._forged: dict[str, int] = {}
        self._warned_unknown_window = False
        self._retired: deque[str] = deque(maxlen=RETIRED_WINDOWS)  # ids this run registered
        self._runs: dict[str, _TableRun] = {}  # by signal id + table
        self._windows: dict[str, _Flight] = {}
        # Three kinds of key, kept apart: the primary key (the decoder's key for log events,
        # described once per table), the paging key of a table's current snapshot (what
        # windows and the visibility history compare), and, for a table without a primary
        # key snapshotted by a surrogate key, that surrogate as the key of all its events
        # (READ rows and log events must share one key shape, before and after a restart).
        self._primary_keys: dict[TableId, tuple[str, ...] | None] = {}
        self._paging_keys: dict[TableId, tuple[str, ...]] = {}
        self._unfinished_keys: dict[TableId, tuple[str, ...]] = {}
        self._surrogate_keys: dict[TableId, tuple[str, ...]] = {
            p.table: tuple(p.key_columns)
            for p in self.state.snapshots
            if p.surrogate_key and p.key_columns and p.status is not SnapshotStatus.FAILED
        }
        self._shapes: dict[TableId, TableShape] = {}
        self._history = RecentTransactions()
        # Only where a chunk's snapshot can miss a transaction logged before its open
        # watermark (PostgreSQL); MySQL commits in binlog order, so the log order suffices.
        self._keep_history = not dialect.commits_visible_in_log_order
        self._pending: dict[int, _Pending] = {}
        self._last_checkpoint = 0.0
        self._checkpoint_interval = config.state.checkpoint_interval_ms / 1000
        self._dirty = False  # something worth a checkpoint happened since the last one
        self._boundary: Mapping[str, Any] | None = None  # resume point of the last txn end
        self._boundary_offset = 0
        self._saved_position = (
            Position.from_token(self.state.stream.position) if self.state.stream.position else None
        )
        self._touched: set[str] = set()  # signal ids of snapshots this run worked on
        self._target: int | None = None  # the log end --until-caught-up waits for
        self._covering: int | None = None  # the checkpoint that covers it (0: none needed)
        self._last_progress_request = 0.0
        self._in_txn = False  # a transaction's changes are being handed over
        # Events on their way to the sink, in order; written in batches (one call per read).
        self._out: list[SinkItem] = []
        # Transient source failures of the snapshot side (see SOURCE_RETRY_FOR_S).
        self._retry_for = SOURCE_RETRY_FOR_S if retry_for is None else retry_for
        self._last_failure = 0.0
        self._failing_since: float | None = None  # first failure of the current outage
        self._retry_at = 0.0  # no database call of the snapshot side before this
        self._retry_delay = RETRY_FIRST_S
        self.retried_tasks = 0  # tasks submitted again after a transient failure (this run)
        # Deletes the watermark rows of windows that are over (signal_cleanup).
        self._cleanup = (
            WatermarkCleanup(
                dialect, self._signal_table, config.source.signal_cleanup_batch, sweep=True
            )
            if config.source.signal_cleanup
            else None
        )

    # ---------------------------------------------------------------- running

    def run(
        self, *, until_caught_up: bool = False, should_stop: Callable[[], bool] | None = None
    ) -> int:
        """Stream until ``should_stop`` (or, with ``until_caught_up``, until caught up).

        Returns the exit code: 0 when every snapshot this run worked on is done, 2 when one
        failed, was stopped or is paused (the CLI's contract for ``--until-caught-up``).
        """
        self._sink.open(self.state.sink or None)
        try:
            if not self.state.sink:
                self._save_first_checkpoint()
            self._resume_unfinished()
            self._refresh_unfinished_keys()
            reader = self._open_reader(self.state.stream.resume, self._key_columns_of)
        except BaseException:
            # Nothing was written: release the sink (its threads, a Spark session) and go.
            with contextlib.suppress(Exception):
                self._sink.close()
            self._dialect.close()
            raise
        self._reader = reader
        start = getattr(reader, "start_resume", None)
        if start and not self.state.stream.resume:
            # Where a stream without a saved position began (a binlog end, when `init` did
            # not save one): saved now, so a crash before the first checkpoint restarts there
            # and not at a later end, which would skip what came in between.
            self.state.stream.resume = dict(start)
            self._store.save(self.state)
        extra = (
            [self._open_dialect() for _ in range(self._parallelism - 1)]
            if self._open_dialect
            else []
        )
        worker = ChunkWorkers([self._dialect, *extra], self._hooks, self._cleanup)
        self._workers = worker
        try:
            while True:
                if should_stop is not None and should_stop():
                    self._finish_transaction()
                    break
                for item in reader.read(READ_TIMEOUT_S):
                    self._handle(item)
                self._flush_out()
                self._refresh_unfinished_keys()
                for result in worker.poll():
                    self._on_result(result)
                self._schedule()
                self._maybe_checkpoint()
                self._collect_acks()
                if until_caught_up and self._caught_up():
                    break
        finally:
            worker.stop()
            self._shutdown()
        return self._exit_code()

    def _finish_transaction(self, timeout: float = 30.0) -> None:
        """Read on to the end of the transaction being handed over, so the final checkpoint
        falls on a boundary (the rest of it is already on its way: the log sends committed
        transactions only)."""
        deadline = time.monotonic() + timeout
        while self._in_txn and time.monotonic() < deadline:
            for item in self._reader.read(READ_TIMEOUT_S):
                self._handle(item)

    def _save_first_checkpoint(self) -> None:
        """On a first start, save state naming the empty sink before writing anything: a
        crash before the first regular checkpoint then leaves state that cuts the sink back
        to nothing (else the next start would find output no state accounts for)."""
        checkpoint = self._sink.checkpoint()
        deadline = time.monotonic() + 30
        while not self.state.sink and time.monotonic() < deadline:
            for ack in self._sink.acknowledged():
                if ack.checkpoint == checkpoint:
                    self.state.sink = dict(ack.resume)
            if not self.state.sink:
                time.sleep(0.01)
        if self.state.sink:
            self._store.save(self.state)

    def _resume_unfinished(self) -> None:
        for progress in self.state.snapshots:
            if not progress.status.finished:
                self._touched.add(progress.signal_id)
                log.info(
                    "resuming snapshot of %s (%s) after key %s",
                    progress.table,
                    progress.status.value,
                    progress.last_read_key,
                )

    def _flush_out(self) -> None:
        if self._out:
            self._sink.write(self._out)
            self._out = []

    def _shutdown(self) -> None:
        """Checkpoint at the last transaction boundary, wait for the sink, save state."""
        try:
            # Never mid-transaction: the saved state must describe a point the log can
            # restart from exactly (the sink is cut back to it on the next start).
            if self._boundary is not None and self._dirty and not self._in_txn:
                self._checkpoint()
            self._sink.close()
            self._collect_acks()
        finally:
            self._reader.close()
            self._dialect.close()

    def _exit_code(self) -> int:
        touched = [p for p in self.state.snapshots if p.signal_id in self._touched]
        if self._pruned_unsuccessful or any(p.status is not SnapshotStatus.DONE for p in touched):
            return 2
        return 0

    # ---------------------------------------------------------------- log items

    def _handle(self, item: LogItem) -> None:
        if isinstance(item, Change):
            self._on_change(item)
        elif isinstance(item, Commit):
            self._on_commit(item)
        elif isinstance(item, TableShape):
            self._on_shape(item)
        elif isinstance(item, Progress):
            self._on_log_progress(item)
        elif isinstance(item, Notice):
            log.warning("%s%s", f"{item.table}: " if item.table else "", item.message)

    def _replayed(self, position: Position) -> bool:
        # After a restart the log resends from the slot's confirmed point, which may be
        # before what state saved: skip what the sink already has.
        return self._saved_position is not None and position <= self._saved_position

    def _on_change(self, change: Change) -> None:
        event = change.event
        self._in_txn = True
        if event.table != self._signal_table and self._keep_history:
            # Always, replayed changes included: a chunk's snapshot may miss a transaction
            # logged long before its open watermark (core.visibility).
            self._history.touch(change.xid, event.table, self._window_keys(event))
        if self._replayed(event.position):
            return
        if event.table == self._signal_table:
            if event.op is Op.CREATE and event.after is not None:
                self._on_signal_row(event)
            return
        for flight in self._flights_of(event.table):
            try:
                flight.task.window.observe(event)
            except ValueError as exc:  # WindowKeyError: the log's key does not fit the chunk's
                progress = self.state.progress(event.table)
                if progress is not None:
                    self._fail(self._run_of(progress), str(exc))
        surrogate = self._surrogate_keys.get(event.table)
        self._out.append(event if surrogate is None else self._rekey(event, surrogate))

    def _window_keys(self, event: ChangeEvent) -> list[Key]:
        """The event's keys as a window of its table compares them (the paging key)."""
        if event.op is Op.TRUNCATE:
            return []
        columns = self._snapshot_key_columns(event.table)
        keys = []
        for row in (event.before, event.after):
            if row is not None and columns is not None and all(c in row for c in columns):
                keys.append(buffer_key(tuple(row[c] for c in columns)))
        if columns is None and event.key is not None:
            keys.append(buffer_key(event.key))
        return keys

    def _on_commit(self, commit: Commit) -> None:
        self._in_txn = False
        self._history.commit(commit.xid, commit.position)
        if self._replayed(commit.position):
            return
        self._boundary = commit.resume
        self._boundary_offset = commit.log_offset
        self.state.stream.position = commit.position.token
        self.state.stream.resume = dict(commit.resume)
        self._dirty = True
        if self._due():
            self._checkpoint()

    def _on_log_progress(self, progress: Progress) -> None:
        self._in_txn = False
        if progress.log_offset <= self._boundary_offset:
            self._boundary_offset = max(self._boundary_offset, progress.log_offset)
            return
        # Idle log (or traffic only in tables we do not capture): move the restart point on,
        # so the slot is confirmed and the database can free WAL.
        self._boundary = progress.resume
        self._boundary_offset = progress.log_offset
        self.state.stream.resume = dict(progress.resume)
        self._dirty = True

    def _on_shape(self, shape: TableShape) -> None:
        previous = self._shapes.get(shape.table)
        self._shapes[shape.table] = shape
        for run in list(self._runs.values()):
            if run.progress.table != shape.table or run.schema is None:
                continue
            if run.progress.status.finished:
                continue
            if shape.columns != run.schema.signature():
                self._fail(
                    run,
                    "the table's columns changed while its snapshot ran "
                    f"({_shape_change(run.schema.signature(), shape.columns)}); chunk rows "
                    "would no longer match the log's. Send execute-snapshot again to "
                    "snapshot it with its new columns",
                )
        if previous is not None and previous.columns != shape.columns:
            log.info("%s: columns changed in the log", shape.table)

    # ---------------------------------------------------------------- signals

    def _on_signal_row(self, event: ChangeEvent) -> None:
        row = event.after or {}
        signal = parse_signal(
            row.get("id"),
            row.get("type"),
            row.get("data"),
            dollar_quotes=self._dialect.dollar_quotes,
        )
        if isinstance(signal, Watermark):
            self._on_watermark(signal, event)
            return
        if isinstance(signal, SignalError):
            self._problem(signal.signal_id, signal.signal_type, signal.problem, event.position)
            return
        if self.state.was_processed(signal.id, event.position):
            return
        self.state.mark_processed(signal.id, event.position)
        self._dirty = True
        log.info("signal %s (%s) received", signal.id, signal.type.value)
        try:
            if isinstance(signal, ExecuteSnapshot):
                self._execute(signal, event.position)
            elif isinstance(signal, StopSnapshot):
                self._stop(signal)
            elif isinstance(signal, PauseSnapshot):
                self._pause(signal, event.position)
            elif isinstance(signal, ResumeSnapshot):
                self._resume(signal, event.position)
            elif isinstance(signal, LogSignal):
                log.info(
                    "log signal %s: %s", signal.id, printable(signal.message, LOG_MESSAGE_CHARS)
                )
        except SourceUnavailableError:
            raise  # the engine stops with state saved; the signal is read again on resume
        except Exception as exc:
            # A bug met by one signal must not end the stream: the same row would be read
            # again, and end it again, after every restart.
            log.exception("signal %s could not be handled", signal.id)
            self._problem(signal.id, signal.type.value, f"internal error: {exc!r}", event.position)

    def _problem(
        self,
        signal_id: str,
        kind: str,
        message: str,
        position: Position,
        level: int = logging.ERROR,
    ) -> None:
        """A signal the engine cannot act on (fully or in part): logged and kept in state for
        ``status``; the stream goes on."""
        log.log(level, "signal %s (%s): %s", signal_id, kind, message)
        self.state.add_problem(
            SignalProblem(
                signal_id=signal_id, signal_type=kind, message=message, position=position.token
            )
        )
        self._dirty = True

    def _captured(self, table: TableId) -> bool:
        return self._captured_tables.selects(table)

    def _execute(self, signal: ExecuteSnapshot, position: Position) -> None:
        """Queue the signal's tables (signals.plan): one catalog listing per signal, and a
        hash lookup per named table, so even a big signal costs little on this thread."""
        try:
            known = TableSet(self._list_tables())
            plan = plan_snapshot(
                signal,
                known=known,
                captured=self._captured_tables,
                captured_text=repr(self._source.tables),
                signal_table=self._signal_table,
                default_schema=self._source.default_schema,
                unfinished={
                    p.table: f"signal {p.signal_id}, {p.status.value}"
                    for p in self.state.snapshots
                    if not p.status.finished
                },
                describe_missing=self._relation_kinds,
            )
        except SourceUnavailableError:
            raise  # the state with the signal marked processed is never saved: read again
        except Exception as exc:
            self._problem(
                signal.id, signal.type.value, f"cannot resolve its tables: {exc}", position
            )
            return
        if plan.error is not None:
            self._problem(signal.id, signal.type.value, plan.error, position)
            return
        for problem in plan.problems:
            self._problem(signal.id, signal.type.value, problem, position)
        if plan.queue or plan.refused:
            self._touched.add(signal.id)
        for table, condition in plan.queue:
            self.state.add(
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
            self.state.snapshots.append(progress)
        for table, reason in plan.refused[:SHOWN_TABLES]:
            log.error("snapshot of %s refused: %s", table, reason)
        if len(plan.refused) > SHOWN_TABLES:
            log.error(
                "signal %s: %d more tables refused (status shows each)",
                signal.id,
                len(plan.refused) - SHOWN_TABLES,
            )
        dropped = self.state.prune_history()
        done = SnapshotStatus.DONE
        if any(p.signal_id in self._touched and p.status is not done for p in dropped):
            self._pruned_unsuccessful = True
        self._refresh_unfinished_keys()

    def _relation_kinds(self, tables: Sequence[TableId]) -> Mapping[TableId, str]:
        """Why names the listing lacks are not tables (a view, ...): only for the message,
        so a failure here leaves the plain "does not exist"."""
        try:
            return self._dialect.relation_kinds(tables)
        except Exception:
            log.debug("could not look up the kinds of %d relations", len(tables), exc_info=True)
            return {}

    def _matching(self, selectors: Iterable[TableSelector]) -> list[TableProgress]:
        chosen = Selectors(selectors, self._source.default_schema)
        return [
            p
            for p in self.state.snapshots
            if not p.status.finished and (not chosen or chosen.selects(p.table))
        ]

    def _stop(self, signal: StopSnapshot) -> None:
        stopped: set[tuple[str, TableId]] = set()
        for progress in self._matching(signal.data_collections):
            progress.stop()
            self._drop_run(progress)
            stopped.add((progress.signal_id, progress.table))
            log.info("snapshot of %s stopped by signal %s", progress.table, signal.id)
        # A stopped table's max-key or chunk queries may run for long (a slow filter): cancel
        # them, so the workers are free for the next table at once.
        self._workers.cancel(lambda task: (task.signal_id, task.table) in stopped)

    def _pause(self, signal: PauseSnapshot, position: Position) -> None:
        try:
            self.state.pause()
        except StateError as exc:
            self._problem(signal.id, signal.type.value, str(exc), position)
            return
        log.info("incremental snapshots paused by signal %s", signal.id)

    def _resume(self, signal: ResumeSnapshot, position: Position) -> None:
        try:
            self.state.resume()
        except StateError as exc:
            self._problem(signal.id, signal.type.value, str(exc), position)
            return
        log.info("incremental snapshots resumed by signal %s", signal.id)

    # ---------------------------------------------------------------- windows

    def _run_of(self, progress: TableProgress) -> _TableRun:
        key = f"{progress.signal_id}\x00{progress.table}"
        run = self._runs.get(key)
        if run is None or run.progress is not progress:
            run = self._runs[key] = _TableRun(progress)
        return run

    def _drop_run(self, progress: TableProgress) -> None:
        run = self._runs.pop(f"{progress.signal_id}\x00{progress.table}", None)
        if run is not None:
            for window_id in run.flights:
                self._windows.pop(window_id, None)

    def _flights_of(self, table: TableId) -> list[_Flight]:
        return [f for f in self._windows.values() if f.task.table == table]

    def _fail(self, run: _TableRun, error: str) -> None:
        if not run.progress.status.finished:
            run.progress.fail(error)
        self._dirty = True
        self._drop_run(run.progress)
        log.error("snapshot of %s failed: %s", run.progress.table, error)

    def _schedule(self) -> None:
        """Give idle workers their next tasks: start the active table, or read its next
        spans (several at once with read_parallelism > 1, each in its own window)."""
        if time.monotonic() < self._retry_at:
            return
        while self._workers.idle and self._schedule_one():
            pass

    def _schedule_one(self) -> bool:
        """Submit one task if there is one to submit now; whether one was."""
        progress = self.state.active()
        if progress is None:
            return False
        run = self._run_of(progress)
        if run.schema is None:
            if run.starting:
                return False
            run.starting = True
            self._workers.submit(
                StartTask(
                    progress.table,
                    progress.signal_id,
                    progress.surrogate_key,
                    progress.filter,
                    known_max_key=progress.status is SnapshotStatus.RUNNING,
                )
            )
            return True
        if len(run.flights) >= self._windows_in_flight:
            return False
        assert progress.max_key is not None
        if run.plan is None:
            run.plan = SpanPlan(
                progress.last_read_key,
                progress.chunk_id + 1,
                progress.max_key,
                self._source.chunk_size,
                bound_ahead=self._parallelism > 1,
                max_ahead=SPANS_AHEAD_PER_WINDOW * self._windows_in_flight,
            )
        window_id = _new_window_id()
        span = run.plan.take(window_id)
        if span is None:
            return False
        closed = span.read is SpanRead.CLOSED
        assert not closed or span.upto is not None
        task = ChunkTask(
            table=progress.table,
            signal_id=progress.signal_id,
            number=span.number,
            window=ChunkWindow(window_id, progress.table, progress.key_columns),
            schema=run.schema,
            after=span.after,
            upto=span.upto if closed and span.upto is not None else progress.max_key,
            condition=progress.filter,
            limit=self._source.chunk_size,
            read=span.read,
        )
        # Rule 1: register the window before the worker writes its open watermark.
        self._windows[window_id] = _Flight(task)
        self._retired.append(window_id)  # known to this run from now on, even once gone
        if self._cleanup is not None:
            self._cleanup.opened(window_id)
        run.flights.append(window_id)
        self._workers.submit(task)
        return True

    def _on_result(self, result: Result) -> None:
        task = result.task
        if isinstance(result, TaskFailed) and isinstance(task, ChunkTask):
            self._window_over(task.window.window_id)  # never continued: a new window re-reads
        if not isinstance(result, TaskFailed):
            self._source_answers()
        progress = self.state.progress(task.table)
        if progress is None or progress.signal_id != task.signal_id or progress.status.finished:
            return  # stopped or failed meanwhile
        run = self._run_of(progress)
        if isinstance(task, ChunkTask) and (
            run.plan is None or run.plan.span_of(task.window.window_id) is None
        ):
            # A window given up meanwhile (a forged watermark row took its id, so its own
            # insert failed; or a re-read), or whose close was already handled (the log can
            # be faster than this answer): nothing to do.
            if isinstance(result, TaskFailed):
                log.debug(
                    "chunk %d of %s: a voided window's task failed: %s",
                    task.number,
                    task.table,
                    result.error,
                )
            elif isinstance(result, ChunkRead):
                log.debug(
                    "chunk %d of %s: %d rows selected", task.number, task.table, result.selected
                )
            return
        if isinstance(result, TaskFailed):
            if result.cancelled:
                # Cancelled for a stop that no longer applies: neither a failure nor an
                # outage; the task is simply submitted again.
                self._void(run, task)
            elif result.transient:
                self._retry(run, result)
            else:
                self._fail(run, result.error)
            return
        if isinstance(result, TableStarted):
            run.starting = False
            run.schema = result.schema
            run.convert = self._dialect.row_converter(result.schema)
            self._paging_keys[task.table] = result.key_columns
            if not result.schema.primary_key:
                self._surrogate_keys[task.table] = result.key_columns
            if progress.status is SnapshotStatus.PAUSED and not progress.key_columns:
                # Paused while being started: start over after resume-snapshot.
                self._drop_run(progress)
                return
            if progress.status is SnapshotStatus.PENDING:
                progress.key_columns = list(result.key_columns)
                progress.start(result.max_key)
                self._refresh_unfinished_keys()
                self._dirty = True
                done = progress.status.finished  # an empty table is done at once
                log.info(
                    "snapshot of %s started: key %s, maximum key %s",
                    task.table,
                    ", ".join(result.key_columns),
                    result.max_key,
                )
                if done:
                    log.info("snapshot of %s done: no rows to read", task.table)
                    self._drop_run(progress)
            elif tuple(progress.key_columns) != result.key_columns:
                self._fail(
                    run,
                    f"its key is now ({', '.join(result.key_columns)}) but the snapshot "
                    f"was paging by ({', '.join(progress.key_columns)})",
                )
            return
        assert isinstance(task, ChunkTask) and run.plan is not None
        window_id = task.window.window_id
        if isinstance(result, ChunkBounded):
            # The next span can be planned (on another worker) while this one is read.
            run.plan.bounded(window_id, result.upto, result.final)
            log.debug("chunk %d of %s: ends at key %s", task.number, task.table, result.upto)
            return
        if task.read is SpanRead.OPEN:
            # The read's last key ends the span (the close may have said so already).
            run.plan.read_open(window_id, result.selected, result.last_key)
        log.debug("chunk %d of %s: %d rows selected", task.number, task.table, result.selected)

    def _window_over(self, window_id: str) -> None:
        """The window's watermark rows may go from the signal table: nothing needs them
        (the engine sees watermarks in the log, never in the table; signal_cleanup)."""
        if self._cleanup is not None:
            self._cleanup.finished(window_id)

    def _on_watermark(self, watermark: Watermark, event: ChangeEvent) -> None:
        flight = self._windows.get(watermark.window_id)
        if flight is None:
            self._unknown_window(watermark)
            if watermark.kind is WatermarkKind.CLOSE:
                self._window_over(watermark.window_id)  # of a stopped snapshot, a failed task
            return
        window = flight.task.window
        # Anyone who can insert signals can insert watermark rows too: act only on the
        # window's own rows, in order (core.window explains why a forged close is never
        # safe to act on, even after the chunk rows were buffered).
        verdict, why = window.judge(watermark)
        if verdict is not Verdict.OWN:
            self._foreign_watermark(flight, watermark, verdict, why, event.position)
        elif watermark.kind is WatermarkKind.OPEN:
            window.open(event.position)
        else:
            self._close(flight, event)
            # Both rows of the window are in the log now (the open committed first).
            self._window_over(watermark.window_id)

    def _unknown_window(self, watermark: Watermark) -> None:
        """A watermark row of no window this run holds: ignored (harmless: no window acts on
        it). Expected for windows of a run before a restart and of stopped snapshots."""
        if watermark.window_id in self._retired or self._warned_unknown_window:
            log.debug("watermark row %s of no current window ignored", watermark.id)
            return
        self._warned_unknown_window = True
        log.warning(
            "watermark row %s ignored: no chunk window of this run has that id (a window of "
            "the run before a restart, a row of another engine sharing the signal table %s, "
            "or a row inserted by hand); further ones are logged at debug level",
            watermark.id,
            self._signal_table,
        )

    def _foreign_watermark(
        self, flight: _Flight, watermark: Watermark, verdict: Verdict, why: str, at: Position
    ) -> None:
        """A watermark row of a live window that is not its own, or out of order: never
        acted on. If the window cannot complete any more (BLOCKING: the row took the id of
        the window's own next row), the chunk is read again under a new window, up to
        FORGED_WINDOWS_MAX times per table snapshot; then that snapshot fails. The stream
        goes on either way."""
        task = flight.task
        what = f"{watermark.type.value} row ignored: {why} (chunk {task.number} of {task.table})"
        progress = self.state.progress(task.table)
        live = (
            progress is not None
            and progress.signal_id == task.signal_id
            and not progress.status.finished
        )
        if verdict is Verdict.STRAY or progress is None or not live:
            self._problem(watermark.id, watermark.type.value, what, at, level=logging.WARNING)
            return
        key = f"{task.signal_id}\x00{task.table}"
        count = self._forged[key] = self._forged.get(key, 0) + 1
        run = self._run_of(progress)
        if count > FORGED_WINDOWS_MAX:
            self._problem(watermark.id, watermark.type.value, what, at, level=logging.WARNING)
            self._fail(
                run,
                f"{count} watermark rows not written by the engine took the ids of its chunk "
                f"windows: something inserts snapshot-window rows into the signal table "
                f"{self._signal_table}; stop it, then send execute-snapshot again",
            )
            return
        self._problem(
            watermark.id,
            watermark.type.value,
            f"{what}; the chunk is read again under a new window",
            at,
            level=logging.WARNING,
        )
        self._read_again(run, task.window.window_id)

    def _close(self, flight: _Flight, event: ChangeEvent) -> None:
        task, window = flight.task, flight.task.window
        progress = self.state.progress(task.table)
        del self._windows[window.window_id]
        if progress is None or progress.signal_id != task.signal_id or progress.status.finished:
            return
        run = self._run_of(progress)
        if window.window_id in run.flights:
            run.flights.remove(window.window_id)
        stale: set[Key] | None = None
        if window.visibility is not None and window.opened_at is not None:
            # Rule 4 (PostgreSQL): transactions logged before the open watermark that the
            # chunk's snapshot did not see made some chunk rows stale: drop those keys.
            stale = self._history.stale_keys(task.table, window.visibility, window.opened_at)
            self._history.prune(window.visibility)
            if stale is None:
                log.info("chunk %d of %s: re-read (history too short)", task.number, task.table)
                self._read_again(run, window.window_id)
                return
        try:
            if stale:
                window.drop(stale)
            batch = window.close(event.position)
        except (ValueError, WindowOrderError) as exc:  # WindowKeyError: log keys that do not
            # fit the chunk's; an ordering error (a bug): that snapshot fails, not the engine
            self._fail(run, str(exc))
            return
        # Keep the workers busy: hand them the next chunks before building this one's events.
        # (This also takes in the span's bound or read answer, if the log was faster: both
        # were sent before the close watermark was written.)
        for result in self._workers.poll():
            self._on_result(result)
        if progress.status.finished:
            return  # the next chunk's failure (or a stop) just ended this snapshot
        self._schedule()
        failpoint("window.close")
        # Rule 5: the close watermark is an output barrier: the survivors go to the sink now,
        # before the engine handles any log item after the watermark.
        self._out.append(batch.stamped(event.source, _now_ms(), run.convert))
        assert run.plan is not None
        # Progress moves over the spans at the head of the plan whose batches are all out
        # (core.spans, 6.): none, when an earlier span is still being read.
        for done in run.plan.closed(
            window.window_id,
            selected=batch.selected,
            emitted=batch.rows.num_rows,
            last_key=batch.last_key,
        ):
            progress.chunk_done(
                last_key=done.last_key,
                selected=done.selected,
                emitted=done.emitted,
                chunk_size=task.limit,
                final=done.final,
            )
        self._dirty = True
        log.debug(
            "chunk %d of %s: close watermark seen, %d emitted, %d dropped by the log",
            task.number,
            task.table,
            batch.rows.num_rows,
            batch.dropped,
        )
        now = time.monotonic()
        if now - run.reported >= REPORT_INTERVAL_S and progress.status is not SnapshotStatus.DONE:
            run.reported = now
            log.info(
                "snapshot of %s: %d chunks, %d rows, next after key %s",
                task.table,
                progress.chunk_id,
                progress.rows_emitted,
                progress.last_read_key,
            )
        if progress.status is SnapshotStatus.DONE:
            log.info(
                "snapshot of %s done: %d rows in %d chunks",
                task.table,
                progress.rows_emitted,
                progress.chunk_id,
            )
            self._drop_run(progress)
        if self._on_progress is not None:
            self._on_progress(self.state)

    # ---------------------------------------------------------------- source outages

    def _retry(self, run: _TableRun, failed: TaskFailed) -> None:
        """A task failed because the database could not be reached: void its window (its
        watermarks, if any were written, are then ignored) and submit it again after a
        backoff. Past the bound, stop the engine (state saved, the snapshot not failed)."""
        task = failed.task
        self._void(run, task)
        what = (
            f"starting the snapshot of {task.table}"
            if isinstance(task, StartTask)
            else f"chunk {task.number} of {task.table}"
        )
        self._source_failed(what, failed.error)
        self.retried_tasks += 1

    def _void(self, run: _TableRun, task: StartTask | ChunkTask) -> None:
        """Forget a task that did not complete, so ``_schedule`` submits it again (a chunk:
        its window voided, its watermarks, if any were written, then ignored)."""
        if isinstance(task, StartTask):
            run.starting = False  # _schedule submits the StartTask again
        elif task.window.window_id in self._windows:
            self._read_again(run, task.window.window_id)
        # Else its close watermark committed (the answer was lost) and was handled: the chunk
        # is done and emitted; or the window was given up already.

    def _source_failed(self, what: str, error: str) -> None:
        """Note a transient failure of the snapshot side's database calls; raise
        SourceUnavailableError once they have failed for ``retry_for`` seconds in a row."""
        now = time.monotonic()
        if self._failing_since is None or now - self._last_failure > OUTAGE_GAP_S:
            # A failure long after the last one (nothing was retried in between: say the
            # snapshot was paused) starts a new outage.
            self._failing_since = now
            self._retry_delay = RETRY_FIRST_S
        self._last_failure = now
        failing = now - self._failing_since
        if failing >= self._retry_for:
            raise SourceUnavailableError(
                f"the source database ({self._server()}) has been unreachable for "
                f"{failing:.0f} s ({what}: {error}); stopping. Nothing is lost and no "
                "snapshot is marked failed: the state is saved, and `snapshotter resume` "
                "continues where it stopped once the database is up"
            )
        log.warning(
            "%s: the source database is unreachable (%s); retrying in %.1f s (for up to "
            "%.0f s more)",
            what,
            error,
            self._retry_delay,
            self._retry_for - failing,
        )
        self._retry_at = now + self._retry_delay
        self._retry_delay = min(self._retry_delay * 2, RETRY_MAX_S)

    def _list_tables(self) -> list[TableId]:
        """The source's tables, waiting out a source that is restarting (on this thread: the
        log cannot move on without the database either), so a signal read at that moment
        is not lost to a transient error."""
        while True:
            try:
                tables = self._dialect.list_tables()
            except Exception as exc:
                if not self._dialect.is_transient(exc):
                    raise
                self._source_failed("listing tables for execute-snapshot", str(exc))
                time.sleep(max(0.0, self._retry_at - time.monotonic()))
                continue
            self._source_answers()
            return tables

    def _source_answers(self) -> None:
        if self._failing_since is not None:
            log.info(
                "the source database answers again after %.1f s; the snapshot goes on",
                time.monotonic() - self._failing_since,
            )
            self._failing_since = None
            self._retry_at = 0.0

    def _server(self) -> str:
        """The source as host:port/database, without credentials (for messages)."""
        try:
            url = sa.make_url(self._source.url)
        except Exception:
            return "the configured source.url"
        return f"{url.host or 'localhost'}:{url.port or 'default port'}/{url.database or ''}"

    def _read_again(self, run: _TableRun, window_id: str) -> None:
        """Give the window up: its span is read again under a new window (or planned again
        from its start, if its end was not known yet); the table's other windows go on."""
        self._windows.pop(window_id, None)
        if window_id in run.flights:
            run.flights.remove(window_id)
        if run.plan is not None:
            run.plan.void(window_id)

    # ---------------------------------------------------------------- keys

    def _snapshot_key_columns(self, table: TableId) -> tuple[str, ...] | None:
        """The paging key of the table's unfinished snapshot: described, or recorded in
        state (after a restart, before the table is described again), or the signal's
        surrogate key; None: the primary key, which is the decoder's event key."""
        unfinished = self._unfinished_keys.get(table)
        if unfinished:
            return unfinished
        return self._paging_keys.get(table) or self._surrogate_keys.get(table)

    def _refresh_unfinished_keys(self) -> None:
        """Per-table paging keys of unfinished snapshots, computed once per read of the log
        and whenever a snapshot is added or described (not per event: state can hold many
        past snapshots)."""
        keys: dict[TableId, tuple[str, ...]] = {}
        for progress in self.state.snapshots:
            if progress.status.finished:
                continue
            if progress.key_columns:
                keys[progress.table] = tuple(progress.key_columns)
            elif progress.surrogate_key:
                keys[progress.table] = (progress.surrogate_key,)
        self._unfinished_keys = keys

    def _key_columns_of(self, table: TableId) -> Sequence[str] | None:
        """The decoder's key for a table's log events: its primary key (None: the decoder
        falls back to the log's identity columns)."""
        if table == self._signal_table:
            return ("id",)
        if table not in self._primary_keys:
            try:
                self._primary_keys[table] = self._dialect.describe(table).primary_key or None
            except Exception:
                return None  # not cached: asked again on the table's next Relation message
        return self._primary_keys[table]

    def key_names(self, table: TableId) -> Sequence[str]:
        """Column names of an event's ``key`` (for sinks that write a key object): the
        surrogate key the engine re-keys by, else exactly what the decoder keyed by."""
        if table in self._surrogate_keys:
            return self._surrogate_keys[table]
        shape = self._shapes.get(table)
        if shape is not None and shape.key:
            return shape.key
        return self._key_columns_of(table) or ()

    def _rekey(self, event: ChangeEvent, columns: tuple[str, ...]) -> ChangeEvent:
        """Key a log event of a table without a primary key by its surrogate key."""
        if event.op is Op.TRUNCATE:
            return event
        row = event.after if event.after is not None else event.before
        if row is None or any(c not in row for c in columns):
            return event  # cannot happen under REPLICA IDENTITY FULL, which snapshot_key checks
        return replace(event, key=tuple(row[c] for c in columns))

    # ---------------------------------------------------------------- checkpoints

    def _due(self) -> bool:
        return time.monotonic() - self._last_checkpoint >= self._checkpoint_interval

    def _maybe_checkpoint(self) -> None:
        if self._dirty and self._boundary is not None and not self._in_txn and self._due():
            self._checkpoint()

    def _checkpoint(self) -> None:
        """Ask the sink to make everything so far durable; keep the state that goes with it.

        Only called at a transaction boundary (after a Commit or an idle Progress), so the
        state's stream position and the sink's content describe the same point."""
        assert self._boundary is not None
        snapshot = self.state.model_copy(deep=True)
        self._flush_out()
        checkpoint = self._sink.checkpoint()
        self._pending[checkpoint] = _Pending(snapshot, dict(self._boundary))
        self._last_checkpoint = time.monotonic()
        self._dirty = False

    def _collect_acks(self) -> None:
        newest: _Pending | None = None
        for ack in self._sink.acknowledged():
            pending = self._pending.pop(ack.checkpoint, None)
            if pending is None:
                continue
            pending.state.sink = dict(ack.resume)
            newest = pending
        if newest is None:
            return
        if newest.state.stream.position:
            newest.state.prune_processed(Position.from_token(newest.state.stream.position))
        self._store.save(newest.state)
        self._reader.confirm(newest.resume)

    # ---------------------------------------------------------------- caught up

    def _caught_up(self) -> bool:
        if self.state.active() is not None or self._windows or self._workers.busy:
            self._target = None
            self._covering = None
            return False
        if self._target is None:
            if time.monotonic() < self._retry_at:
                return False
            try:
                self._target = self._dialect.log_end()
            except Exception as exc:
                if not self._dialect.is_transient(exc):
                    raise
                self._source_failed("reading the log end", " ".join(str(exc).split()))
                return False
            self._source_answers()
        if self._boundary_offset < self._target:
            now = time.monotonic()
            if now - self._last_progress_request > 0.2:
                self._reader.request_progress()
                self._last_progress_request = now
            return False
        # One checkpoint covering the target, then wait for its acknowledgement only: under
        # steady traffic later checkpoints keep coming (one per interval), and a sink that
        # acknowledges slower than that (Kafka under load) would never have none pending.
        if self._covering is None:
            if self._dirty and (self._boundary is None or self._in_txn):
                return False  # the next transaction boundary comes first
            if self._dirty:
                self._checkpoint()
            self._covering = max(self._pending, default=0)
        self._collect_acks()
        return self._covering not in self._pending and not self._in_txn


def _default_schema(selector: TableSelector, schema: str) -> TableSelector:
    return selector.with_default_schema(schema) if isinstance(selector, TableId) else selector


def _shape_change(old: Sequence[tuple[str, int]], new: Sequence[tuple[str, int]]) -> str:
    old_names, new_names = [n for n, _ in old], [n for n, _ in new]
    parts = []
    added = [n for n in new_names if n not in old_names]
    removed = [n for n in old_names if n not in new_names]
    if added:
        parts.append("added " + ", ".join(added))
    if removed:
        parts.append("removed " + ", ".join(removed))
    if not parts:
        parts.append("column types changed")
    return "; ".join(parts)


def _new_window_id() -> str:
    import uuid

    return str(uuid.uuid4())


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


__all__ = ["Engine", "EngineStop", "PhaseHooks", "WindowPhase"]

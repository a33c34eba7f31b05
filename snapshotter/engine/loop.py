"""The engine: stream the log all the time, answer signals, run DBLog chunk windows.

One thread (the caller's) reads the log and does everything that touches state, windows and
the sink, in log order. The chunk workers (``engine.workers``, ``[source] read_parallelism``
of them) do the snapshot side's database calls beside it, so the stream never waits for a
chunk SELECT; which key range each chunk reads, and what progress records, is
``core.spans``. Data flows one way:

    log items ──► windows (drop keys) ──► sink ──(acknowledged checkpoint)──► state file
    chunk rows ─┘ (READ rows at the close watermark, before any later log event)

This module holds the loop and the dispatch of log items. Its collaborators each hold one
job: ``window_close`` (windows from their opening to their close, and the output barrier: a
window's rows go to the sink at its close watermark, before any later log item), with
``scheduler`` (what to read next), ``task_answers`` (what a worker's answer changes) and
``watermarks`` (which watermark rows to act on); ``signal_rows`` (the signal table's rows)
with ``signal_actions`` (what a signal does); ``retry`` (source outages), ``key_catalog``
(which columns key each table's events), ``checkpointer`` (checkpoints and the state saved
with them), ``caught_up`` (``--until-caught-up``), ``outcome`` (the exit code).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence

from signals.display import EscapeControls
from signals.names import TableId
from snapshotter.core.events import Op
from snapshotter.core.position import Position
from snapshotter.engine.caught_up import CaughtUp
from snapshotter.engine.checkpointer import Checkpointer, SaveObserver
from snapshotter.engine.context import EngineContext, KeyColumns, OpenReader
from snapshotter.engine.failures import Failures
from snapshotter.engine.key_catalog import KeyCatalog
from snapshotter.engine.live_state import LiveState
from snapshotter.engine.outcome import RunOutcome
from snapshotter.engine.retry import SourceRetry, server_of
from snapshotter.engine.scheduler import Scheduler
from snapshotter.engine.signal_cleanup import WatermarkCleanup
from snapshotter.engine.signal_rows import SignalRows
from snapshotter.engine.stats import EngineStats
from snapshotter.engine.watchdog import log_watch, waiting_for_close
from snapshotter.engine.window_close import Output, Windows
from snapshotter.engine.workers import (
    WorkerPool,
)
from snapshotter.sinks.base import Sink
from snapshotter.sources.log import Change, Commit, LogItem, LogReader, Notice, Progress, TableShape

log = logging.getLogger("snapshotter.engine")
# Log lines carry text from signal rows (ids, messages, table names, filters): escaped, so
# that none can forge or hide a line (signals.display).
log.addFilter(EscapeControls())
logging.getLogger("snapshotter.chunks").addFilter(EscapeControls())

READ_TIMEOUT_S = 0.05
FINISH_TRANSACTION_S = 30.0  # how long a stop reads on to the end of a transaction


class EngineStop(Exception):
    """Raised by a stop callback to end ``run`` cleanly (state saved)."""


class Engine:
    def __init__(self, context: EngineContext) -> None:
        config, dialect, sink, store = context.config, context.dialect, context.sink, context.store
        clock, source = context.clock, config.source
        self._dialect = dialect
        # A dialect of its own for each chunk worker but the first, which uses ``dialect``.
        self._open_dialect = context.open_dialect
        self._parallelism = source.read_parallelism
        if self._parallelism > 1 and context.open_dialect is None:
            raise ValueError("read_parallelism > 1 needs open_dialect for the other workers")
        self._open_reader = context.open_reader
        self._sink = sink
        self._store = store
        self._hooks = context.hooks
        self._on_progress = context.on_progress
        self._clock = clock
        self._start_workers = context.start_workers
        self._workers: WorkerPool  # started by ``start``
        self._reader: LogReader  # opened by ``start``
        self._signal_table = source.signal_table_id
        # The notification table ([notifications] channels "table") is the engine's own
        # output: its rows never go to the sink, even when source.tables matches it.
        self._own_tables = config.own_tables
        # A stop reads on to the end of the transaction for at most this long: a share of
        # the time the whole stop may take ([state] shutdown_timeout_s).
        self._finish_s = min(FINISH_TRANSACTION_S, config.state.shutdown_timeout_s / 3)
        self.state = store.load()
        self.state.prune_history()  # a state file from before history was bounded
        # Every change worth a checkpoint goes through it, marked (engine.live_state).
        self._live = LiveState(self.state, context.wall_ms)
        self._outcome = RunOutcome()
        self._scheduler = Scheduler(
            chunk_size=source.chunk_size,
            parallelism=self._parallelism,
            new_window_id=context.new_window_id,
            remote=context.remote_reads,
        )
        keys = context.keys
        self._keys = keys if keys is not None else KeyCatalog(dialect.describe, self._signal_table)
        self._keys.remember_surrogates(self.state.snapshots)
        # Events on their way to the sink, in order (the output barrier: window_close).
        self._output = Output(sink)
        self._saved_position = (
            Position.from_token(self.state.stream.position) if self.state.stream.position else None
        )
        self._checkpoints = Checkpointer(
            live=self._live,
            sink=sink,
            store=store,
            interval_s=config.state.checkpoint_interval_ms / 1000,
            flush=self._output.flush,
            clock=clock,
            sleep=context.sleep,
        )
        # Transient source failures of the snapshot side (engine.retry).
        self._retry = SourceRetry(
            server=server_of(source.url),
            retry_for=context.retry_for,
            clock=clock,
            sleep=context.sleep,
        )
        self._caught_up = CaughtUp(
            log_end=lambda: self._dialect.log_end(),
            is_transient=lambda exc: self._dialect.is_transient(exc),
            retry=self._retry,
            checkpoints=self._checkpoints,
            live=self._live,
            clock=clock,
        )
        # Deletes the watermark rows of windows that are over (signal_cleanup).
        self._cleanup = (
            WatermarkCleanup(dialect, self._signal_table, source.signal_cleanup_batch, sweep=True)
            if source.signal_cleanup
            else None
        )
        self.stats = EngineStats()
        self._failures = Failures(self._live, self._scheduler, self.stats)
        self._signals = SignalRows(
            config=config,
            live=self._live,
            dialect=dialect,
            retry=self._retry,
            scheduler=self._scheduler,
            outcome=self._outcome,
            failures=self._failures,
            cancel_tasks=lambda matches: self._workers.cancel(matches),
            snapshots_added=self._refresh_unfinished_keys,
        )
        self._windows = Windows(
            live=self._live,
            scheduler=self._scheduler,
            keys=self._keys,
            dialect=dialect,
            retry=self._retry,
            cleanup=self._cleanup,
            output=self._output,
            failures=self._failures,
            signal_table=self._signal_table,
            stats=self.stats,
            clock=clock,
            wall_ms=context.wall_ms,
            on_progress=context.on_progress,
        )
        self._watch = log_watch(context.log_coverage, source.chunk_timeout_s)

    @property
    def keys(self) -> KeyCatalog:
        return self._keys

    @property
    def checkpoints(self) -> Checkpointer:
        """The checkpointer (observers read its ``saved_at`` and ``unacked``)."""
        return self._checkpoints

    @property
    def sink(self) -> Sink:
        return self._sink

    @property
    def retried_tasks(self) -> int:
        """Tasks submitted again after a transient failure (this run)."""
        return self._retry.retried_tasks

    @property
    def windows_in_flight(self) -> list[TableId]:
        """The table of each chunk window held now (being read, or waiting for its close
        watermark); a copy, so observers may read it from another thread."""
        return [flight.task.table for flight in self._scheduler.flights()]

    # ---------------------------------------------------------------- running

    def run(
        self,
        *,
        until_caught_up: bool = False,
        should_stop: Callable[[], bool] | None = None,
        on_error: Callable[[], None] | None = None,
    ) -> int:
        """Stream until ``should_stop`` (or, with ``until_caught_up``, until caught up).
        ``on_error``: called when a failure ends the run, before the engine closes (the CLI
        bounds that close as it bounds a stop).

        Returns the exit code: 0 when every snapshot this run worked on is done, 2 when one
        failed, was stopped or is paused (the CLI's contract for ``--until-caught-up``).
        """
        reader = self.start()
        try:
            while True:
                if should_stop is not None and should_stop():
                    self.finish_transaction(self._finish_s)
                    break
                if self.step(reader, until_caught_up=until_caught_up):
                    break
        except BaseException:
            if on_error is not None:
                on_error()
            raise
        finally:
            self.close()
        return self.exit_code()

    def start(self) -> LogReader:
        """What ``run`` does before its loop: open the sink (first checkpoint on a first
        start), take up unfinished snapshots, open the log reader, start the chunk workers.
        Returns the reader, for ``step``."""
        self._sink.open(self.state.sink or None)
        reader: LogReader | None = None
        try:
            if not self.state.sink:
                self._checkpoints.save_first()
            self._resume_unfinished()
            self._refresh_unfinished_keys()
            reader = self._open_reader(self.state.stream.resume, self._keys.primary_key)
            # Rule 4 across restarts: asked before any chunk is read, once the reader has
            # opened (so an unreachable source is the reader's prompt error, not a wait).
            self._windows.history_from_start()
        except BaseException:
            # Nothing was written: release the reader, the sink (its threads, a Spark
            # session) and the dialect, and go.
            if reader is not None:
                with contextlib.suppress(Exception):
                    reader.close()
            with contextlib.suppress(Exception):
                self._sink.close()
            self._dialect.close()
            self._watch.close()
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
        self._workers = self._start_workers([self._dialect, *extra], self._hooks, self._cleanup)
        self._windows.started(self._workers)
        return reader

    def step(self, reader: LogReader, *, until_caught_up: bool = False) -> bool:
        """One pass of ``run``'s loop: read what the log has (``reader``, from ``start``;
        waiting READ_TIMEOUT_S at most), hand it to the sink, take the workers' answers,
        give them new tasks, checkpoint, save acknowledged state. With ``until_caught_up``,
        whether the engine is caught up (``run`` then stops); else False."""
        for item in reader.read(READ_TIMEOUT_S):
            self._handle(item)
        self._signals.read_channels(self._clock())
        self._output.flush()
        self._refresh_unfinished_keys()
        self._windows.take_answers()
        self._windows.schedule()
        # Stops the engine (LogCoverageError) when the log no longer carries what it needs.
        self._watch.poll(self._clock(), waiting_for_close(self._scheduler.flights()))
        self._checkpoints.maybe_checkpoint()
        self._collect_acks()
        if self._on_progress is not None:
            self._on_progress(self.state)
        return until_caught_up and self._is_caught_up()

    def finish_transaction(self, timeout: float = FINISH_TRANSACTION_S) -> None:
        """Read on to the end of the transaction being handed over, so the final checkpoint
        falls on a boundary (the rest of it is already on its way: the log sends committed
        transactions only)."""
        deadline = self._clock() + timeout
        while self._live.in_transaction and self._clock() < deadline:
            for item in self._reader.read(READ_TIMEOUT_S):
                self._handle(item)

    def close(self) -> None:
        """Stop the workers; checkpoint at the last transaction boundary, wait for the sink,
        save state; close the reader and the dialect."""
        self._workers.stop()
        try:
            self._checkpoints.final_checkpoint()
            try:
                self._checkpoints.settle(self._reader.confirm)
            finally:
                self._sink.close()
            self._collect_acks()
        finally:
            self._reader.close()
            self._signals.close()
            self._dialect.close()
            self._watch.close()

    def observe_saves(self, observer: SaveObserver) -> None:
        """Call ``observer`` after each state save (the sink acknowledged what it covers)
        with the saved state and the live records it was copied from: the notifications
        report only what a crash cannot take back."""
        self._checkpoints.on_saved = observer

    def exit_code(self) -> int:
        return self._outcome.exit_code(self.state)

    def _resume_unfinished(self) -> None:
        for progress in self.state.snapshots:
            if not progress.status.finished:
                self._outcome.touch(progress.signal_id)
                log.info(
                    "resuming snapshot of %s (%s) after key %s",
                    progress.table,
                    progress.status.value,
                    progress.last_read_key,
                )

    def _collect_acks(self) -> None:
        self._checkpoints.collect_acks(self._reader.confirm)

    def _refresh_unfinished_keys(self) -> None:
        self._keys.refresh_unfinished(self.state.snapshots)

    def _is_caught_up(self) -> bool:
        settled = (
            self.state.active() is None
            and not self._scheduler.has_windows
            and not self._workers.busy
        )
        return self._caught_up.check(settled=settled, reader=self._reader)

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
        if event.table in self._own_tables:
            return
        self._live.transaction_began()
        if event.table != self._signal_table:
            # Always, replayed changes included: a chunk's snapshot may miss a transaction
            # logged long before its open watermark (core.visibility).
            self._windows.logged(change)
        if self._replayed(event.position):
            return
        if event.table == self._signal_table:
            if event.op is Op.CREATE and event.after is not None:
                watermark = self._signals.arrived(event)
                if watermark is not None:
                    self._windows.watermark(watermark, event)
            return
        self._windows.in_windows(event)
        self._output.append(self._keys.rekeyed(event))
        self.stats.log_changes += 1

    def _on_commit(self, commit: Commit) -> None:
        self._live.transaction_ended()
        self._windows.committed(commit)
        if self._replayed(commit.position):
            return
        self.stats.commit_seen(commit.ts_ms)
        self._live.at_boundary(commit.resume, commit.log_offset, commit.position)
        if self._checkpoints.due():
            self._checkpoints.checkpoint()

    def _on_log_progress(self, progress: Progress) -> None:
        self._live.transaction_ended()
        if progress.log_offset <= self._live.boundary_offset:
            return
        # Idle log (or traffic only in tables we do not capture): move the restart point on,
        # so the slot is confirmed and the database can free WAL.
        self._live.at_boundary(progress.resume, progress.log_offset)

    def _on_shape(self, shape: TableShape) -> None:
        previous = self._keys.shape_seen(shape)
        for run in self._scheduler.runs():
            if run.progress.table != shape.table or run.schema is None:
                continue
            if run.progress.status.finished:
                continue
            if shape.columns != run.schema.signature():
                self._failures.snapshot(
                    run,
                    "the table's columns changed while its snapshot ran "
                    f"({_shape_change(run.schema.signature(), shape.columns)}); chunk rows "
                    "would no longer match the log's. Send execute-snapshot again to "
                    "snapshot it with its new columns",
                )
        if previous is not None and previous.columns != shape.columns:
            log.info("%s: columns changed in the log", shape.table)

    # ---------------------------------------------------------------- snapshots


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


__all__ = ["Engine", "EngineContext", "EngineStop", "KeyColumns", "OpenReader"]

"""Chunk windows from their opening to their close, and the output barrier.

A window opens when the engine hands its chunk to an idle worker (``Windows.schedule``:
registered first, rule 1) and closes when the engine meets the window's own close
watermark in the log (``Windows.watermark``). At the close (``Windows._close``) the
transactions the chunk's snapshot missed drop their keys (rule 4, PostgreSQL), the log's
in-window events drop theirs (DBLog), and the surviving READ rows go to the sink at once:
the close watermark is an output barrier (rule 5, ``Output``), so no log event after the
watermark reaches the sink before them. Then progress moves over the spans whose batches
are all out (``core.spans``, 6.).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from signals import Watermark
from signals.names import TableId
from snapshotter.common.faults import failpoint
from snapshotter.core.eta import eta_note
from snapshotter.core.events import ChangeEvent
from snapshotter.core.keys import Key
from snapshotter.core.state import EngineState, SnapshotStatus
from snapshotter.core.visibility import RecentTransactions
from snapshotter.core.window import StagedReadBatch, WindowOrderError
from snapshotter.engine.context import epoch_ms
from snapshotter.engine.failures import Failures
from snapshotter.engine.key_catalog import KeyCatalog
from snapshotter.engine.live_state import LiveState
from snapshotter.engine.retry import SourceRetry
from snapshotter.engine.scheduler import Flight, Scheduler, TableRun
from snapshotter.engine.signal_cleanup import WatermarkCleanup
from snapshotter.engine.start_guard import StartGuardWait
from snapshotter.engine.stats import EngineStats
from snapshotter.engine.task_answers import TaskAnswers
from snapshotter.engine.watermarks import WatermarkRows
from snapshotter.engine.workers import ChunkTask, WorkerPool
from snapshotter.sinks.base import Sink, SinkItem
from snapshotter.sources.base import Dialect
from snapshotter.sources.log import Change, Commit

log = logging.getLogger("snapshotter.engine")

REPORT_INTERVAL_S = 5.0


class Output:
    """The events on their way to the sink, in the order the engine handed them over; written
    in batches (one sink call per read of the log). A window's READ batch joins them at its
    close watermark, after the log events before the watermark and before any after it."""

    def __init__(self, sink: Sink) -> None:
        self._sink = sink
        self._items: list[SinkItem] = []

    def append(self, item: SinkItem) -> None:
        self._items.append(item)

    def flush(self) -> None:
        """Hand everything so far to the sink, in order."""
        if self._items:
            self._sink.write(self._items)
            self._items = []


class Windows:
    """Opens chunk windows (hands idle workers their tasks), takes in the workers' answers
    (``task_answers``) and the windows' watermark rows (``watermarks``), and closes each
    window at its own close watermark; the output barrier is ``Output``."""

    def __init__(
        self,
        *,
        live: LiveState,
        scheduler: Scheduler,
        keys: KeyCatalog,
        dialect: Dialect,
        retry: SourceRetry,
        cleanup: WatermarkCleanup | None,
        output: Output,
        failures: Failures,
        signal_table: TableId,
        stats: EngineStats,
        clock: Callable[[], float],
        wall_ms: Callable[[], int],
        on_progress: Callable[[EngineState], None] | None,
    ) -> None:
        self._live = live
        self._state = state = live.state
        self._scheduler = scheduler
        self._dialect = dialect
        # The transactions a chunk's snapshot may have missed (rule 4).
        self._history = RecentTransactions()
        # Only where a chunk's snapshot can miss a transaction logged before its open
        # watermark (PostgreSQL); MySQL commits in binlog order, so the log order suffices.
        self._keep_history = not dialect.commits_visible_in_log_order
        self._keys = keys
        # Chunks read again because their snapshot missed a transaction open at the start.
        self._start_wait = StartGuardWait(clock)
        self._retry = retry
        self._cleanup = cleanup  # deletes the watermark rows of windows that are over
        self._answers = TaskAnswers(
            live=live,
            scheduler=scheduler,
            keys=keys,
            retry=retry,
            row_converter=dialect.row_converter,
            failures=failures,
            cleanup=cleanup,
            now_ms=wall_ms,
        )
        self._watermarks = WatermarkRows(
            state=state,
            scheduler=scheduler,
            failures=failures,
            cleanup=cleanup,
            signal_table=signal_table,
        )
        self._output = output
        self._failures = failures
        self._stats = stats
        self._clock = clock
        self._wall_ms = wall_ms
        self._on_progress = on_progress
        self._workers: WorkerPool | None = None  # from ``started``

    def started(self, workers: WorkerPool) -> None:
        """The chunk workers are running: windows may open."""
        self._workers = workers

    @property
    def workers(self) -> WorkerPool:
        assert self._workers is not None, "the chunk workers are not started"
        return self._workers

    def history_from_start(self) -> None:
        """Transactions open now may have committed before the log's resume point and still
        be invisible: a chunk that misses one is read again (core.visibility), after a wait
        (engine.start_guard)."""
        if not self._keep_history:
            return
        dialect = self._dialect
        what = "asking which transactions are open"
        asked = self._retry.wait_out(what, dialect.unfinished_xids, dialect.is_transient)
        if asked is not None:
            self._history.started(asked)

    def logged(self, change: Change) -> None:
        """A change of a captured table, replayed or not: its transaction touched its keys."""
        if self._keep_history:
            event = change.event
            self._history.touch(change.xid, event.table, self._keys.window_keys(event))

    def committed(self, commit: Commit) -> None:
        self._history.commit(commit.xid, commit.position)

    def in_windows(self, event: ChangeEvent) -> None:
        """A log event (not replayed) drops its key from the chunk rows of every window of
        its table that is open (DBLog)."""
        for flight in self._scheduler.flights_of(event.table):
            try:
                flight.task.window.observe(event)
            except ValueError as exc:  # WindowKeyError: the log's key does not fit the chunk's
                progress = self._state.progress(event.table)
                if progress is not None:
                    self._failures.snapshot(self._scheduler.run_of(progress), str(exc))

    def take_answers(self) -> None:
        """What the workers answered since last asked changes the plans (``task_answers``)."""
        for result in self.workers.poll():
            self._answers.answered(result)

    def schedule(self) -> None:
        """Give idle workers their next tasks: start the active table, or read its next
        spans (several at once with read_parallelism > 1, each in its own window)."""
        if self._retry.waiting() or self._start_wait.holding():
            return
        workers = self.workers
        while workers.idle:
            task = self._scheduler.next_task(self._state.active())
            if task is None:
                return
            if isinstance(task, ChunkTask) and self._cleanup is not None:
                self._cleanup.opened(task.window.window_id)
            workers.submit(task)

    def window_over(self, window_id: str) -> None:
        """The window's watermark rows may go from the signal table: nothing needs them
        (the engine sees watermarks in the log, never in the table; signal_cleanup)."""
        if self._cleanup is not None:
            self._cleanup.finished(window_id)

    def watermark(self, watermark: Watermark, event: ChangeEvent) -> None:
        """A watermark row read from the log (``event``): an own close row closes its window."""
        flight = self._watermarks.arrived(watermark, event.position)
        if flight is not None:  # the window's own close row
            self._close(flight, event)
            # Both rows of the window are in the log now (the open committed first).
            self.window_over(watermark.window_id)

    def _close(self, flight: Flight, event: ChangeEvent) -> None:
        task, window = flight.task, flight.task.window
        progress = self._state.progress(task.table)
        self._scheduler.closing(window.window_id)
        if progress is None or progress.signal_id != task.signal_id or progress.status.finished:
            return
        run = self._scheduler.run_of(progress)
        self._scheduler.leave(run, window.window_id)
        stale = self._stale_keys(flight, run)
        if stale is None:
            return  # read again
        try:
            if stale:
                window.drop(stale)
            batch = window.close(event.position)
        except (ValueError, WindowOrderError) as exc:  # WindowKeyError: log keys that do not
            # fit the chunk's; an ordering error (a bug): that snapshot fails, not the engine
            self._failures.snapshot(run, str(exc))
            return
        # Keep the workers busy: hand them the next chunks before building this one's events.
        # (This also takes in the span's bound or read answer, if the log was faster: both
        # were sent before the close watermark was written.)
        self.take_answers()
        if progress.status.finished:
            return  # the next chunk's failure (or a stop) just ended this snapshot
        self.schedule()
        failpoint("window.close")
        # Rule 5: the close watermark is an output barrier: the survivors go to the sink now,
        # before the engine handles any log item after the watermark.
        self._output.append(batch.stamped(event.source, epoch_ms(), run.convert))
        assert run.plan is not None
        # Progress moves over the spans at the head of the plan whose batches are all out
        # (core.spans, 6.): none, when an earlier span is still being read.
        done = run.plan.closed(
            window.window_id,
            selected=batch.selected,
            emitted=len(batch),
            last_key=batch.last_key,
            covered=batch.staged.covered if isinstance(batch, StagedReadBatch) else None,
        )
        self._live.spans_done(progress, done, task.limit)
        self._stats.chunks_closed += 1
        log.debug(
            "chunk %d of %s: close watermark seen, %d emitted, %d dropped by the log",
            task.number,
            task.table,
            len(batch),
            batch.dropped,
        )
        self._report(run)
        if progress.status is SnapshotStatus.DONE:
            self._scheduler.drop_run(progress)
        if self._on_progress is not None:
            self._on_progress(self._state)

    def _stale_keys(self, flight: Flight, run: TableRun) -> set[Key] | None:
        """Rule 4 (PostgreSQL): the keys of the transactions logged before the open watermark
        that the chunk's snapshot did not see (its rows of them are stale). None: the
        snapshot missed a transaction of unknown keys; the window is given up and its span
        read again."""
        task, window = flight.task, flight.task.window
        history = self._history
        if window.visibility is None or window.opened_at is None:
            return set()
        stale = history.stale_keys(task.table, window.visibility, window.opened_at)
        missed = [] if stale is not None else history.missed_at_start(window.visibility)
        # Forget only what every snapshot that can still ask sees: with parallel reads a
        # window that read earlier (an older snapshot) may close after this one, and the
        # snapshot of a window still reading is not known yet (nothing goes until then).
        others = [f.task.window for f in self._scheduler.flights()]
        if all(w.filled for w in others):
            history.prune(
                window.visibility, *(w.visibility for w in others if w.visibility is not None)
            )
        if stale is None:
            self._start_wait.read_again(task.table, task.number, missed)
            self._scheduler.read_again(run, window.window_id)
            return None
        self._start_wait.passed()
        return stale

    def _report(self, run: TableRun) -> None:
        """A progress line every REPORT_INTERVAL_S per table, and one when it is done."""
        progress = run.progress
        now = self._clock()
        if now - run.reported >= REPORT_INTERVAL_S and progress.status is not SnapshotStatus.DONE:
            run.reported = now
            log.info(
                "snapshot of %s: %d chunks, %d rows, next after key %s%s",
                progress.table,
                progress.chunk_id,
                progress.rows_emitted,
                progress.last_read_key,
                eta_note(progress, self._wall_ms()),
            )
        if progress.status is SnapshotStatus.DONE:
            log.info(
                "snapshot of %s done: %d rows in %d chunks",
                progress.table,
                progress.rows_emitted,
                progress.chunk_id,
            )

"""What the engine does with the chunk workers' answers.

A table described: its snapshot starts (paging key and maximum key recorded), or, on
resume, goes on if its key is still the one it paged by. A span bounded or read: its plan
learns where the span ends, so the next one can be handed out. A task failed: submitted
again after a cancel that no longer applies, retried after a backoff when the source could
not be reached (``engine.retry``), or else its table's snapshot fails. An answer for a
snapshot that ended meanwhile, or for a window given up, changes nothing.

The chunk's rows themselves are not in any answer: the worker buffered them in the window,
and they go to the sink when the engine meets the window's close watermark in the log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from snapshotter.core.spans import SpanRead
from snapshotter.core.state import SnapshotStatus
from snapshotter.engine.failures import Failures
from snapshotter.engine.key_catalog import KeyCatalog
from snapshotter.engine.live_state import LiveState
from snapshotter.engine.retry import SourceRetry
from snapshotter.engine.scheduler import Scheduler, TableRun
from snapshotter.engine.signal_cleanup import WatermarkCleanup
from snapshotter.engine.workers import (
    ChunkBounded,
    ChunkRead,
    ChunkTask,
    Result,
    StartTask,
    TableStarted,
    TaskFailed,
)
from snapshotter.sources.base import TableSchema

log = logging.getLogger("snapshotter.engine")

RowConverter = Callable[[dict[str, Any]], dict[str, Any]]


class TaskAnswers:
    def __init__(
        self,
        *,
        live: LiveState,
        scheduler: Scheduler,
        keys: KeyCatalog,
        retry: SourceRetry,
        row_converter: Callable[[TableSchema], RowConverter | None],
        failures: Failures,
        cleanup: WatermarkCleanup | None,
        now_ms: Callable[[], int],
    ) -> None:
        self._live = live
        self._state = live.state
        self._scheduler = scheduler
        self._keys = keys
        self._retry = retry
        self._row_converter = row_converter
        self._failures = failures
        self._cleanup = cleanup  # deletes the watermark rows of windows that are over
        self._now_ms = now_ms  # wall clock, epoch ms (a snapshot's start time in state)

    def answered(self, result: Result) -> None:
        task = result.task
        if (
            isinstance(result, TaskFailed)
            and isinstance(task, ChunkTask)
            and self._cleanup is not None
        ):
            self._cleanup.finished(task.window.window_id)  # never continued: a new window re-reads
        if not isinstance(result, TaskFailed):
            self._retry.answered()
        progress = self._state.progress(task.table)
        if progress is None or progress.signal_id != task.signal_id or progress.status.finished:
            return  # stopped or failed meanwhile
        run = self._scheduler.run_of(progress)
        if isinstance(task, ChunkTask) and not self._scheduler.knows_span(run, task):
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
                self._scheduler.void(run, task)
            elif result.transient:
                self._retry_task(run, result)
            else:
                self._failures.snapshot(run, result.error)
            return
        if isinstance(result, TableStarted):
            self._started(run, result)
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

    def _started(self, run: TableRun, result: TableStarted) -> None:
        task, progress = result.task, run.progress
        run.starting = False
        run.schema = result.schema
        run.convert = self._row_converter(result.schema)
        self._keys.table_started(task.table, result.schema, result.key_columns)
        if progress.status is SnapshotStatus.PAUSED and not progress.key_columns:
            # Paused while being started: start over after resume-snapshot.
            self._scheduler.drop_run(progress)
            return
        if progress.status is SnapshotStatus.PENDING:
            self._live.snapshot_started(
                progress,
                key_columns=result.key_columns,
                max_key=result.max_key,
                estimated_rows=result.estimated_rows,
                started_ms=self._now_ms(),
            )
            self._keys.refresh_unfinished(self._state.snapshots)
            done = progress.status.finished  # an empty table is done at once
            log.info(
                "snapshot of %s started: key %s, maximum key %s, estimated rows %s",
                task.table,
                ", ".join(result.key_columns),
                result.max_key,
                "unknown" if result.estimated_rows is None else result.estimated_rows,
            )
            if done:
                log.info("snapshot of %s done: no rows to read", task.table)
                self._scheduler.drop_run(progress)
        elif tuple(progress.key_columns) != result.key_columns:
            self._failures.snapshot(
                run,
                f"its key is now ({', '.join(result.key_columns)}) but the snapshot "
                f"was paging by ({', '.join(progress.key_columns)})",
            )

    def _retry_task(self, run: TableRun, failed: TaskFailed) -> None:
        """A task failed because the database could not be reached: void its window (its
        watermarks, if any were written, are then ignored) and submit it again after a
        backoff. Past the bound, stop the engine (state saved, the snapshot not failed)."""
        task = failed.task
        self._scheduler.void(run, task)
        what = (
            f"starting the snapshot of {task.table}"
            if isinstance(task, StartTask)
            else f"chunk {task.number} of {task.table}"
        )
        self._retry.failed(what, failed.error)
        self._retry.retried_tasks += 1

"""What the chunk workers read next, apart from the reading (as Flink CDC's split assigner is
apart from its fetcher): start the active table, or read its next key ranges (spans), each
in a window of its own, a bounded number of windows at once.

The scheduler holds the in-memory companion of each unfinished snapshot (``TableRun``: its
described schema, its span plan, its windows in flight) and every window the engine holds,
from registration to its close watermark (or until it is given up). It never calls the
database or the workers: ``next_task`` says what to submit, and the engine submits it.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from signals.names import TableId
from snapshotter.core.spans import SpanPlan, SpanRead
from snapshotter.core.state import SnapshotStatus, TableProgress
from snapshotter.core.window import ChunkWindow
from snapshotter.engine.workers import ChunkTask, RemoteReads, StartTask, Task
from snapshotter.sources.base import TableSchema

# Windows waiting for their close watermark in the log, or being read: this many, or one
# more than the chunk reads that may run at once (read_parallelism), whichever is more.
WINDOWS_IN_FLIGHT = 3
# Chunks read beyond the durable progress (a slow read holds progress back while the windows
# after it go on), at most this many times the windows in flight: what a crash may cost in
# chunks read again (core.spans, 6.).
SPANS_AHEAD_PER_WINDOW = 4
RETIRED_WINDOWS = 256  # window ids remembered, so their late watermark rows stay quiet


@dataclass
class Flight:
    """A chunk window the engine holds, from registration to its close watermark."""

    task: ChunkTask


@dataclass
class TableRun:
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


def random_window_id() -> str:
    return str(uuid.uuid4())


class Scheduler:
    def __init__(
        self,
        *,
        chunk_size: int,
        parallelism: int,
        new_window_id: Callable[[], str] = random_window_id,
        remote: RemoteReads | None = None,
    ) -> None:
        """``remote``: windows are read elsewhere, each cut into ``remote.tasks`` sub-ranges
        of ``chunk_size`` rows; a window then spans that many times ``chunk_size``."""
        self._remote = remote
        self._chunk_size = chunk_size * (remote.tasks if remote is not None else 1)
        self._parallelism = parallelism
        self.windows_in_flight = max(WINDOWS_IN_FLIGHT, parallelism + 1)
        self._new_window_id = new_window_id
        self._runs: dict[str, TableRun] = {}  # by signal id + table
        self._windows: dict[str, Flight] = {}
        self._retired: deque[str] = deque(maxlen=RETIRED_WINDOWS)  # ids this run registered

    # -- table runs

    def run_of(self, progress: TableProgress) -> TableRun:
        key = _run_key(progress.signal_id, progress.table)
        run = self._runs.get(key)
        if run is None or run.progress is not progress:
            run = self._runs[key] = TableRun(progress)
        return run

    def runs(self) -> list[TableRun]:
        return list(self._runs.values())

    def drop_run(self, progress: TableProgress) -> None:
        """Forget the table's run and its windows (the snapshot finished, failed, stopped,
        or must start over)."""
        run = self._runs.pop(_run_key(progress.signal_id, progress.table), None)
        if run is not None:
            for window_id in run.flights:
                self._windows.pop(window_id, None)

    # -- windows

    @property
    def has_windows(self) -> bool:
        return bool(self._windows)

    def flight(self, window_id: str) -> Flight | None:
        return self._windows.get(window_id)

    def flights(self) -> list[Flight]:
        """Every window in flight, of any table."""
        return list(self._windows.values())

    def flights_of(self, table: TableId) -> list[Flight]:
        return [f for f in self._windows.values() if f.task.table == table]

    def registered(self, window_id: str) -> bool:
        """Whether this run registered the window (held now, or recently)."""
        return window_id in self._retired

    def closing(self, window_id: str) -> None:
        """The window's close watermark is in the log: it is no longer in flight."""
        del self._windows[window_id]

    def leave(self, run: TableRun, window_id: str) -> None:
        """The window no longer counts against its table's windows in flight."""
        if window_id in run.flights:
            run.flights.remove(window_id)

    def read_again(self, run: TableRun, window_id: str) -> None:
        """Give the window up: its span is read again under a new window (or planned again
        from its start, if its end was not known yet); the table's other windows go on."""
        self._windows.pop(window_id, None)
        self.leave(run, window_id)
        if run.plan is not None:
            run.plan.void(window_id)

    def void(self, run: TableRun, task: Task) -> None:
        """Forget a task that did not complete, so ``next_task`` hands it out again (a chunk:
        its window voided, its watermarks, if any were written, then ignored)."""
        if isinstance(task, StartTask):
            run.starting = False  # next_task hands the StartTask out again
        elif task.window.window_id in self._windows:
            self.read_again(run, task.window.window_id)
        # Else its close watermark committed (the answer was lost) and was handled: the chunk
        # is done and emitted; or the window was given up already.

    def knows_span(self, run: TableRun, task: ChunkTask) -> bool:
        """Whether the chunk's window still has its span in the plan (not given up, not
        closed already)."""
        return run.plan is not None and run.plan.span_of(task.window.window_id) is not None

    # -- what to read next

    def next_task(self, progress: TableProgress | None) -> Task | None:
        """The next task for an idle worker, for the active snapshot ``progress``: start its
        table, or read its next span in a new window (registered here, before any worker
        can write its open watermark: rule 1). None: nothing to hand out now."""
        if progress is None:
            return None
        run = self.run_of(progress)
        if run.schema is None:
            if run.starting:
                return None
            run.starting = True
            return StartTask(
                progress.table,
                progress.signal_id,
                progress.surrogate_key,
                progress.filter,
                known_max_key=progress.status is SnapshotStatus.RUNNING,
            )
        if len(run.flights) >= self.windows_in_flight:
            return None
        assert progress.max_key is not None
        if run.plan is None:
            run.plan = SpanPlan(
                progress.last_read_key,
                progress.chunk_id + 1,
                progress.max_key,
                self._chunk_size,
                # A remote read cuts its range by bounds, so it needs the range's end first.
                bound_ahead=self._parallelism > 1 or self._remote is not None,
                max_ahead=SPANS_AHEAD_PER_WINDOW * self.windows_in_flight,
            )
        window_id = self._new_window_id()
        span = run.plan.take(window_id)
        if span is None:
            return None
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
            limit=self._chunk_size,
            read=span.read,
            remote=self._remote,
        )
        # Rule 1: register the window before the worker writes its open watermark.
        self._windows[window_id] = Flight(task)
        self._retired.append(window_id)  # known to this run from now on, even once gone
        run.flights.append(window_id)
        return task


def _run_key(signal_id: str, table: TableId) -> str:
    return f"{signal_id}\x00{table}"

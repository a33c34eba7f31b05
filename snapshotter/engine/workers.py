"""The chunk workers: read chunks beside the stream, so the stream never waits for a SELECT.

Debezium reads a chunk on its streaming thread, so the log stalls for the whole SELECT. Here
worker threads own every database call of the snapshot side (describe, maximum key, chunk
bounds, watermark inserts, chunk SELECTs) while the engine's thread keeps reading the log.
``ChunkWorkers`` holds ``[source] read_parallelism`` of them, each with a dialect (a database
connection and statement guard) of its own, so that many chunk SELECTs run at once, each in
its own window (``core.spans`` says why that is safe). The engine hands a worker one task at
a time and learns the outcome from its results. Between tasks and while idle, the first
worker also deletes watermark rows of finished windows (``snapshotter.engine.signal_cleanup``).
What the engine uses of the pool is ``WorkerPool``; a simulation passes a pool of its own
(``EngineContext(start_workers=...)``) that runs the same tasks without threads.

The ordering rules of a chunk live in ``_read_in_window``, used by both read paths (here and
on Spark executors); each is stated where it is enforced.
Tests run SQL between the steps through ``PhaseHooks`` (on whichever worker reads the chunk).
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from signals.model import WatermarkKind
from signals.names import TableId
from snapshotter.common.faults import failpoint
from snapshotter.core.keys import Key
from snapshotter.core.spans import SpanRead, range_read_limit
from snapshotter.core.visibility import ReadVisibility
from snapshotter.core.window import ChunkWindow, StagedRows
from snapshotter.engine.signal_cleanup import WatermarkCleanup
from snapshotter.sources.base import ChunkSpec, Dialect, ReadCancelled, TableSchema, error_chain

log = logging.getLogger("snapshotter.chunks")

Hook = Callable[["ChunkTask"], None]


@dataclass
class PhaseHooks:
    """Callbacks run on the worker thread between the steps of a chunk (tests use them to
    write to the table at the worst moments)."""

    before_open: Hook | None = None  # window registered, open watermark not yet written
    after_open: Hook | None = None  # open watermark committed, chunk SELECT not yet run
    after_read: Hook | None = None  # chunk rows buffered, close watermark not yet written
    after_close: Hook | None = None  # close watermark committed


@dataclass
class StartTask:
    """Describe a table and record its maximum key (or only describe it, on resume)."""

    table: TableId
    signal_id: str
    surrogate_key: str | None
    condition: str | None
    known_max_key: bool


@dataclass
class ChunkTask:
    table: TableId
    signal_id: str
    number: int
    window: ChunkWindow
    schema: TableSchema
    after: Key | None
    # OPEN, BOUND: the maximum key; CLOSED: the end of the key range (``core.spans``).
    upto: Key
    condition: str | None
    limit: int  # chunk_size (with ``remote``: the window's, every sub-range's times their count)
    read: SpanRead = SpanRead.OPEN
    # Read elsewhere (Spark tasks on executors, ``[snapshot] executors``): the window's key
    # range is split into sub-ranges of ``limit / remote.tasks`` rows, read at once.
    remote: RemoteReads | None = None

    @property
    def read_limit(self) -> int:
        """The chunk SELECT's LIMIT: ``limit`` rows after ``after`` for an OPEN chunk; a
        closed range is read whole, up to ``range_read_limit`` rows."""
        return self.limit if self.read is SpanRead.OPEN else range_read_limit(self.limit)


@dataclass
class TableStarted:
    task: StartTask
    schema: TableSchema
    key_columns: tuple[str, ...]
    max_key: Key | None
    # The database's estimate of the table's rows (None: unknown, or on resume).
    estimated_rows: int | None = None


@dataclass
class ChunkBounded:
    """A BOUND chunk's key range is known, before its read (the task goes on): the engine
    plans the next range on another worker meanwhile."""

    task: ChunkTask
    upto: Key
    final: bool  # the range ends at the maximum key: the last one


@dataclass
class ChunkRead:
    task: ChunkTask
    selected: int
    last_key: Key | None
    visibility: ReadVisibility | None


@dataclass(frozen=True)
class RemoteChunk:
    """A window's rows as readers elsewhere left them, and what their snapshots missed."""

    staged: StagedRows
    visibility: ReadVisibility | None


class RemoteReadFailed(RuntimeError):
    """A window's remote read failed after Spark's own task retries (snapshotter missing on
    the executors, the source unreachable from them...): the table's snapshot fails with
    the reason, as after any other chunk read error."""


_ERROR_LINE = re.compile(r"^\s*(\w+\.)*\w*(Error|Exception)\b.*$", re.MULTILINE)


def _cause_line(exc: BaseException) -> str:
    """The line of a Spark job's error that names the cause: the last ``...Error: ...``
    (a Python worker's traceback ends with it), else the first line."""
    text = str(exc).strip()
    found = [m.group(0).strip() for m in _ERROR_LINE.finditer(text)]
    found = [line for line in found if ":" in line] or found
    if found:
        return found[-1][:300]
    lines = text.splitlines()
    return lines[0][:300] if lines else type(exc).__name__


class RemoteReads(Protocol):
    """Reads a window's key sub-ranges elsewhere, each in a READ ONLY transaction of its own
    that begins when ``read`` is called and ends before it returns (``engine.executor_reads``:
    Spark tasks on executors)."""

    tasks: int  # sub-ranges per window

    def read(
        self, spec: ChunkSpec, ranges: Sequence[tuple[Key | None, Key]], window_id: str
    ) -> RemoteChunk:
        """Read ``(after, upto]`` of each of ``ranges`` (``spec`` says the rest: table, key,
        filter, each read's row limit)."""
        ...


@dataclass
class TaskFailed:
    task: StartTask | ChunkTask
    error: str
    # The connection was lost or the server is restarting or unreachable (the dialect's
    # ``is_transient``): the engine voids the task's window and submits it again later,
    # instead of failing the snapshot.
    transient: bool = False
    # Cancelled on purpose (``ChunkWorker.cancel``: stop-snapshot, shutdown): not a failure
    # of the table, not retried.
    cancelled: bool = False


# A task's answer (TableStarted, ChunkRead, TaskFailed), or news of a task still running
# (ChunkBounded).
Result = TableStarted | ChunkBounded | ChunkRead | TaskFailed
Task = StartTask | ChunkTask
THREAD_NAME = "snapshotter-chunks"  # the first worker's; the others' end in -2, -3, ...


class ChunkWorker:
    def __init__(
        self,
        dialect: Dialect,
        hooks: PhaseHooks | None = None,
        cleanup: WatermarkCleanup | None = None,
        name: str = THREAD_NAME,
    ) -> None:
        self._dialect = dialect
        self._hooks = hooks or PhaseHooks()
        self._cleanup = cleanup  # deletes watermark rows between tasks and while idle
        self._tasks: queue.Queue[Task | None] = queue.Queue()
        self.results: queue.Queue[Result] = queue.Queue()
        self._busy = 0  # tasks submitted and not yet answered (engine thread only)
        # The task being run, and whether reads are refused from now on (stopping): under
        # _lock, so a cancel never reaches a task that has not started or already ended.
        self._lock = threading.Lock()
        self._current: Task | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        return self._busy > 0

    def submit(self, task: Task) -> None:
        self._busy += 1
        self._tasks.put(task)

    def poll(self) -> list[Result]:
        out: list[Result] = []
        while True:
            try:
                out.append(self.results.get_nowait())
            except queue.Empty:
                break
        self._busy -= sum(1 for r in out if not isinstance(r, ChunkBounded))
        return out

    def cancel(self, matches: Callable[[Task], bool]) -> None:
        """Cancel the running task's max-key or chunk query if ``matches(task)`` (the
        engine: the tables a stop-snapshot names). Its answer is then a TaskFailed with
        ``cancelled``; a query already over is not undone."""
        with self._lock:
            if self._current is not None and matches(self._current):
                self._dialect.cancel_reads()

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel the running read (shutdown must not wait for a filter's hour-long query),
        refuse the reads of tasks still queued, and end the thread."""
        self.halt()
        self.join(timeout)

    def halt(self) -> None:
        """``stop`` without waiting: cancel, refuse, and ask the thread to end."""
        with self._lock:
            self._stopping = True
            self._dialect.cancel_reads()
        self._tasks.put(None)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _begin(self, task: Task) -> bool:
        """Mark ``task`` as running; False when it must not run (stopping)."""
        with self._lock:
            if self._stopping and isinstance(task, StartTask | ChunkTask):
                return False
            self._current = task
            if not self._stopping:
                self._dialect.allow_reads()  # a cancel of the task before is done with
            return True

    def _end(self) -> None:
        with self._lock:
            self._current = None

    def _loop(self) -> None:
        while (task := self._next_task()) is not None:
            failpoint("chunks.worker")
            if not self._begin(task):
                stopping = "cancelled: the engine is stopping"
                self.results.put(TaskFailed(task, stopping, cancelled=True))
                continue
            try:
                run_task(task, self._dialect, self._hooks, self.results.put)
            finally:
                self._end()
            if self._cleanup is not None:
                self._cleanup.step(idle=False)  # one batch at most between two tasks
        if self._cleanup is not None:
            self._cleanup.flush()

    def _next_task(self) -> Task | None:
        """The next task; while none comes, the watermark cleanup works (idle time)."""
        cleanup = self._cleanup
        while cleanup is not None and (wait := cleanup.wait_s()) is not None:
            try:
                return self._tasks.get(timeout=wait) if wait > 0 else self._tasks.get_nowait()
            except queue.Empty:
                cleanup.step(idle=True)
        return self._tasks.get()


def run_task(
    task: Task, dialect: Dialect, hooks: PhaseHooks, send: Callable[[Result], None]
) -> None:
    """Run one task on ``dialect``; what it has to say goes to ``send``: a BOUND chunk's
    bound (news, while the task goes on), then its answer, or a TaskFailed that says whether
    the failure was a cancel, transient (the connection lost: retried) or the table's."""
    try:
        if isinstance(task, StartTask):
            send(_start(dialect, task))
        else:
            send(_read_chunk(dialect, hooks, task, send))
    except Exception as exc:  # reported to the engine: it retries or fails that table
        log.debug("task for %s failed", task.table, exc_info=True)
        if any(isinstance(e, ReadCancelled) for e in error_chain(exc)):
            send(TaskFailed(task, _describe(exc), cancelled=True))
        elif not isinstance(exc, RemoteReadFailed) and _transient(dialect, exc):
            # The driver's own words ("connection refused"), without SQLAlchemy's
            # wrapping: the engine logs this on every retry.
            cause = getattr(exc, "orig", None)
            text = _describe(cause if isinstance(cause, BaseException) else exc)
            send(TaskFailed(task, text, transient=True))
        else:
            send(TaskFailed(task, _describe(exc)))


def _transient(dialect: Dialect, exc: Exception) -> bool:
    try:
        return dialect.is_transient(exc)
    except Exception:  # a classification bug must not hide the task's own error
        log.exception("could not classify the error of a chunk task")
        return False


def _start(dialect: Dialect, task: StartTask) -> TableStarted:
    schema = dialect.describe(task.table)
    key_columns = dialect.snapshot_key(schema, task.surrogate_key)
    # The log must carry the table before its first chunk, or in-window changes would be
    # missed: add it to the capture (publication) first. Committed when this returns.
    dialect.ensure_captured([task.table])
    if task.known_max_key:  # resumed: the estimate taken at the start is in state
        return TableStarted(task, schema, tuple(key_columns), None)
    max_key = dialect.max_key(schema, key_columns, task.condition)
    estimate = _estimated_rows(dialect, schema)
    return TableStarted(task, schema, tuple(key_columns), max_key, estimate)


def _estimated_rows(dialect: Dialect, schema: TableSchema) -> int | None:
    """The table's row estimate, for progress only: no failure of it fails a snapshot."""
    try:
        return dialect.estimated_rows(schema)
    except Exception:
        log.debug("no row estimate for %s", schema.table, exc_info=True)
        return None


def _read_chunk(
    dialect: Dialect, hooks: PhaseHooks, task: ChunkTask, send: Callable[[Result], None]
) -> ChunkRead:
    window = task.window
    upto = task.upto
    if task.read is SpanRead.BOUND:
        # Where this chunk's key range ends, before its window: the engine can plan the
        # next range (on another worker) while this one is read. The range is then read
        # whole, so when the bound was found does not matter (core.spans, 1. and 2.).
        # Sent before the open watermark is written: the engine has it before it can see
        # this window's close in the log.
        bound = dialect.chunk_bound(
            ChunkSpec(
                task.schema, window.key_columns, task.after, task.upto, task.condition, task.limit
            )
        )
        final = bound is None or bound == task.upto
        upto = task.upto if bound is None else bound
        send(ChunkBounded(task, upto, final))
    if task.remote is not None:
        return _read_remote(dialect, hooks, task, upto, task.remote)

    def read() -> ChunkRead:
        # The chunk SELECT in its own READ ONLY transaction: read_chunk returns after COMMIT.
        chunk = dialect.read_chunk(
            ChunkSpec(
                task.schema, window.key_columns, task.after, upto, task.condition, task.read_limit
            )
        )
        window.fill(chunk.rows, chunk.visibility)
        return ChunkRead(task, chunk.rows.num_rows, chunk.last_key, chunk.visibility)

    return _read_in_window(dialect, hooks, task, read)


def _read_remote(
    dialect: Dialect, hooks: PhaseHooks, task: ChunkTask, upto: Key, remote: RemoteReads
) -> ChunkRead:
    """``_read_chunk`` for a window read elsewhere: its range ``(after, upto]`` cut into
    sub-ranges of about ``limit / remote.tasks`` rows each (bounds found on the key's index,
    before the open watermark: bounds are key values, so the sub-ranges partition the range
    whatever changes meanwhile, as spans do, core.spans 1.), then read at once by the remote
    readers between the watermarks (``_read_in_window``: the same rules as ``_read_chunk``)."""
    window = task.window
    each = max(1, task.limit // remote.tasks)
    ranges: list[tuple[Key | None, Key]] = []
    after = task.after
    while len(ranges) < remote.tasks - 1:
        bound = dialect.chunk_bound(
            ChunkSpec(task.schema, window.key_columns, after, upto, task.condition, each)
        )
        if bound is None or bound == upto:
            break
        ranges.append((after, bound))
        after = bound
    ranges.append((after, upto))
    spec = ChunkSpec(
        task.schema, window.key_columns, task.after, upto, task.condition, range_read_limit(each)
    )

    def read() -> ChunkRead:
        # Each sub-range in its own READ ONLY transaction on a remote reader, ended before
        # remote.read returns; the window then knows its rows (where they are staged).
        try:
            chunk = remote.read(spec, ranges, window.window_id)
        except Exception as exc:
            raise RemoteReadFailed(
                f"reading {len(ranges)} sub-ranges of {task.table} on Spark executors failed "
                f"(after Spark's own task retries): {_cause_line(exc)}; the executors need "
                "snapshotter installed in their Python (spark.pyspark.python) and the source "
                "reachable from them"
            ) from exc
        window.fill_staged(chunk.staged, chunk.visibility)
        return ChunkRead(task, chunk.staged.selected, chunk.staged.last_key, chunk.visibility)

    return _read_in_window(dialect, hooks, task, read)


def _read_in_window(
    dialect: Dialect, hooks: PhaseHooks, task: ChunkTask, read: Callable[[], ChunkRead]
) -> ChunkRead:
    """The ordering rules of a chunk's window, for both read paths (``_read_chunk`` here,
    ``_read_remote`` elsewhere): ``read`` runs the chunk's reads and fills the window with
    their rows, between the open and the close watermark."""
    window = task.window
    # Rule 1: the window was registered by the engine before this task was submitted, so
    # its id is known before the open watermark exists; the log reader can never see a
    # watermark the engine cannot place.
    _run(hooks.before_open, task)
    dialect.write_watermark(window.watermark(WatermarkKind.OPEN))
    failpoint("watermark.open")
    _run(hooks.after_open, task)
    # Rule 2: every read of the chunk runs in a READ ONLY transaction of its own, begun after
    # the open watermark committed (write_watermark returned) and ended when ``read``
    # returns, before the close watermark is written.
    # Rule 3: ``read`` fills the window, so the buffer is complete before the close watermark
    # is written. The engine can only see the close watermark after that write commits, so
    # it always finds the rows in the window (fill refuses rows for a window already closed).
    answer = read()
    _run(hooks.after_read, task)
    # With the window's secret token: a close row without it is not the engine's own
    # (core.window: forged watermark rows).
    dialect.write_watermark(window.watermark(WatermarkKind.CLOSE))
    _run(hooks.after_close, task)
    return answer


class WorkerPool(Protocol):
    """What the engine uses of its chunk workers (``ChunkWorkers`` is the threaded one).
    Called from the engine's thread only."""

    def __len__(self) -> int: ...

    @property
    def busy(self) -> bool:
        """Whether any task submitted is not yet answered."""
        ...

    @property
    def idle(self) -> int:
        """How many more tasks may be submitted now."""
        ...

    def submit(self, task: Task) -> None: ...

    def poll(self) -> list[Result]:
        """The answers (and news, ``ChunkBounded``) since the last poll, without waiting."""
        ...

    def cancel(self, matches: Callable[[Task], bool]) -> None:
        """Cancel the running reads of the tasks that match (they answer ``cancelled``)."""
        ...

    def stop(self, timeout: float = 30.0) -> None: ...


# Builds the pool: the engine's dialect and one more per extra worker, the phase hooks, the
# watermark cleanup (run by the first worker). ``ChunkWorkers`` is one.
StartWorkers = Callable[[list[Dialect], "PhaseHooks | None", "WatermarkCleanup | None"], WorkerPool]


class ChunkWorkers:
    """``len(dialects)`` chunk workers, one per dialect (each its own connection and
    statement guard), all answering through ``poll``. The first dialect is the engine's (the
    first worker also runs the watermark cleanup); the others are the pool's own, closed by
    ``stop``. Stop and cancel reach every worker."""

    def __init__(
        self,
        dialects: Sequence[Dialect],
        hooks: PhaseHooks | None = None,
        cleanup: WatermarkCleanup | None = None,
    ) -> None:
        if not dialects:
            raise ValueError("at least one chunk worker is needed")
        self._owned = list(dialects[1:])
        self._workers = [
            ChunkWorker(
                dialect,
                hooks,
                cleanup if i == 0 else None,
                name=THREAD_NAME if i == 0 else f"{THREAD_NAME}-{i + 1}",
            )
            for i, dialect in enumerate(dialects)
        ]

    def __len__(self) -> int:
        return len(self._workers)

    @property
    def busy(self) -> bool:
        return any(w.busy for w in self._workers)

    @property
    def idle(self) -> int:
        """Workers without a task (engine thread only)."""
        return sum(not w.busy for w in self._workers)

    def submit(self, task: Task) -> None:
        """Hand ``task`` to an idle worker (the first: the first worker starts tables)."""
        for worker in self._workers:
            if not worker.busy:
                worker.submit(task)
                return
        raise RuntimeError("no idle chunk worker")

    def poll(self) -> list[Result]:
        """What the workers answered since the last poll (each worker's in its order)."""
        out: list[Result] = []
        for worker in self._workers:
            out.extend(worker.poll())
        return out

    def cancel(self, matches: Callable[[Task], bool]) -> None:
        for worker in self._workers:
            worker.cancel(matches)

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel every running read at once, then wait for the threads (``timeout`` in
        all), then close the pool's own dialects."""
        for worker in self._workers:
            worker.halt()
        deadline = time.monotonic() + timeout
        for worker in self._workers:
            worker.join(max(0.0, deadline - time.monotonic()))
        for dialect in self._owned:
            try:
                dialect.close()
            except Exception:  # shutting down: one failed close must not hide the rest
                log.debug("closing a chunk worker's dialect failed", exc_info=True)


def _run(hook: Hook | None, task: ChunkTask) -> None:
    if hook is not None:
        hook(task)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return " ".join(text.split())

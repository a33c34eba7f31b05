"""The checks made while a simulation runs, on what the sink and the chunk workers report.

* Every READ row is the row as the log had it at its close watermark, where it is emitted
  (DBLog's promise: no log event of its key lies between its read and that point, or the
  window would have dropped it).
* No chunk task fails but for a cancel or a connection loss.
* Chunk reads, counted by the key range each covered: within one engine run no range is read
  twice for one snapshot (but for a window the engine gave up at its close, its batch never
  sent, because its snapshot missed a transaction whose keys it does not know:
  core.visibility); a resumed run never reads below the durable key it resumed from; and
  that key reaches as far as the chunks of the run before whose READ batches are in the
  output the saved state names. So what a restart reads again is only what was not yet
  recorded: the windows in flight and the spans read ahead of the durable key.
"""

from __future__ import annotations

from collections import deque

from snapshotter.core.keys import Key
from snapshotter.core.spans import SpanRead
from snapshotter.core.state import TableProgress
from snapshotter.core.window import ReadBatch
from snapshotter.engine.workers import ChunkBounded, ChunkRead, ChunkTask, Result, Task, TaskFailed
from tests.sim.db import Database
from tests.sim.errors import Property, check
from tests.sim.sink import BatchMark, Output


def snapshot_id(signal_id: str, table: object) -> str:
    return f"{signal_id}/{table}"


class Watch:
    def __init__(
        self, db: Database, output: Output, stats: dict[str, int], trace: deque[str]
    ) -> None:
        self._db = db
        self._output = output
        self._stats = stats
        self._trace = trace
        self.run = 0  # the engine run (boot) now
        # Covered key ranges (and windows) per (run, snapshot); per window: run, snapshot and
        # range.
        self.reads: dict[tuple[int, str], list[tuple[Key | None, Key, str]]] = {}
        self.read_windows: dict[str, tuple[int, str, Key | None, Key]] = {}
        self._resumed_from: dict[str, Key | None] = {}  # unfinished snapshots at this boot
        self._bounds: dict[str, Key] = {}  # BOUND chunks' ends, by window
        self._tasks: dict[str, ChunkTask] = {}  # every chunk task submitted, by window
        self._closes: set[str] = set()  # windows whose close watermark the engine was handed
        self._emitted: set[str] = set()  # windows whose READ batch reached the sink

    def begin_run(self, run: int, snapshots: list[TableProgress], kept: int) -> None:
        """A new engine loaded ``snapshots`` from state naming ``kept`` output items."""
        resumed = {
            snapshot_id(p.signal_id, p.table): p.last_read_key
            for p in snapshots
            if not p.status.finished
        }
        chains: dict[str, dict[Key | None, Key]] = {}
        for item in self._output.events[:kept]:
            if isinstance(item, BatchMark) and item.window_id in self.read_windows:
                previous, snapshot, after, end = self.read_windows[item.window_id]
                if previous == self.run:
                    chains.setdefault(snapshot, {})[after] = end
        for snapshot, durable in resumed.items():
            if snapshot not in self._resumed_from or snapshot not in chains:
                continue
            reached = self._resumed_from[snapshot]
            while reached in chains[snapshot]:
                reached = chains[snapshot][reached]
            check(
                reached is None or (durable is not None and durable >= reached),
                Property.RESUMED_BEHIND_OUTPUT,
                f"{snapshot}: resumed after key {durable}, but the output holds every chunk "
                f"up to {reached} (chunks would be read again for nothing)",
            )
        self.run = run
        self._resumed_from = resumed

    def submitted(self, task: Task) -> None:
        if isinstance(task, ChunkTask):
            self._tasks[task.window.window_id] = task

    def close_delivered(self, window_id: str) -> None:
        self._closes.add(window_id)

    def _given_up(self, window_id: str) -> bool:
        """Whether the engine gave the window up at its close (read again: its snapshot
        missed a transaction whose keys it does not know, core.visibility)."""
        return window_id in self._closes and window_id not in self._emitted

    def read_batch(self, batch: ReadBatch) -> None:
        self._emitted.add(batch.window_id)
        if batch.window_id not in self.read_windows:
            # Its close committed, then the worker lost the connection: the task failed
            # (no ChunkRead came), the engine emitted the batch at the close all the same.
            task = self._tasks[batch.window_id]
            snapshot = snapshot_id(task.signal_id, task.table)
            end = self._covered(task, batch.selected, batch.last_key)
            self.read_windows[batch.window_id] = (self.run, snapshot, task.after, end)
        close_lsn = batch.position.parts[0]
        self._stats["read_rows_dropped"] += batch.dropped
        for row in batch.row_dicts():
            key = tuple(row[c] for c in batch.key_columns)
            expected = self._db.row_at(batch.table, key, close_lsn)
            check(
                row == expected,
                Property.STALE_READ,
                f"stale READ row of {batch.table} key {key} at {batch.position}: emitted "
                f"{row}, the log had {expected}",
            )
            self._stats["read_rows_checked"] += 1

    def answer(self, result: Result) -> None:
        if isinstance(result, ChunkBounded):
            self._stats["bounded_spans"] += 1
            self._bounds[result.task.window.window_id] = result.upto
        elif isinstance(result, TaskFailed):
            check(
                result.cancelled or result.transient,
                Property.TASK_FAILED,
                f"a chunk task of {result.task.table} failed: {result.error}",
            )
            self._stats["tasks_cancelled" if result.cancelled else "tasks_failed_transient"] += 1
        elif isinstance(result, ChunkRead):
            self._chunk_read(result)

    def _covered(self, chunk: ChunkTask, selected: int, last_key: Key | None) -> Key:
        """Where the key range a chunk read covered ends."""
        if selected >= chunk.read_limit:
            assert last_key is not None
            return last_key  # the read stopped at its limit: it covered this far
        if chunk.read is SpanRead.BOUND:
            return self._bounds[chunk.window.window_id]
        return chunk.upto

    def _chunk_read(self, result: ChunkRead) -> None:
        chunk = result.task
        end = self._covered(chunk, result.selected, result.last_key)
        self._stats["chunk_reads"] += 1
        snapshot = snapshot_id(chunk.signal_id, chunk.table)
        self._trace.append(f"chunk read {snapshot} ({chunk.after}, {end}] {result.selected} rows")
        if snapshot in self._resumed_from:
            durable = self._resumed_from[snapshot]
            check(
                durable is None or (chunk.after is not None and chunk.after >= durable),
                Property.READ_BELOW_DURABLE,
                f"{snapshot}: chunk ({chunk.after}, {end}] read again below the durable "
                f"key {durable} the run resumed from",
            )
        own = chunk.window.window_id
        for (run, other), ranges in self.reads.items():
            if other != snapshot:
                continue
            for after, upto, window in ranges:
                overlap = (after is None or after < end) and (
                    chunk.after is None or chunk.after < upto
                )
                if not overlap:
                    continue
                # Answers come in any order: the read given up may be reported second.
                if run == self.run and (self._given_up(window) or self._given_up(own)):
                    self._stats["reread_given_up"] += 1
                    continue
                check(
                    run != self.run,
                    Property.READ_TWICE,
                    f"{snapshot}: chunk ({chunk.after}, {end}] read twice in one run "
                    f"(overlaps ({after}, {upto}])",
                )
                self._stats["reread_after_restart"] += 1
        self.reads.setdefault((self.run, snapshot), []).append((chunk.after, end, own))
        self.read_windows[chunk.window.window_id] = (self.run, snapshot, chunk.after, end)

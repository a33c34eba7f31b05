"""The engine's state as it runs, and what changed in it since the last checkpoint.

Every change worth a checkpoint goes through a method here that marks what it changed (the
log's restart point, a signal handled, a problem kept, a snapshot's progress), and the log's
place (inside a transaction, or at a boundary it can restart from) is kept here too: the
checkpointer (``engine.checkpointer``) reads both, so no collaborator sets a flag of the
checkpointer's. Signal actions change snapshots only while a signal is handled, which
``signal_processed`` marks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from enum import Enum
from typing import Any

from snapshotter.core.keys import Key
from snapshotter.core.position import Position
from snapshotter.core.spans import SpanDone
from snapshotter.core.state import EngineState, SignalProblem, TableProgress


class Changed(Enum):
    """What changed since the last checkpoint."""

    STREAM = "stream"  # the log's restart point moved on
    SIGNALS = "signals"  # a signal was handled (its actions may have changed snapshots)
    PROBLEMS = "problems"  # a signal the engine cannot act on, kept for ``status``
    SNAPSHOTS = "snapshots"  # a snapshot started, moved on, finished or failed


def _epoch_ms() -> int:
    return time.time_ns() // 1_000_000


class LiveState:
    def __init__(self, state: EngineState, wall_ms: Callable[[], int] = _epoch_ms) -> None:
        self.state = state
        # The epoch-ms clock of the snapshots' end times in state (``finished_ms``).
        self.wall_ms = wall_ms
        self._changed: set[Changed] = set()
        self._in_transaction = False  # a transaction's changes are being handed over
        self.boundary: Mapping[str, Any] | None = None  # resume point of the last txn end
        self.boundary_offset = 0  # its log offset

    @property
    def changed(self) -> frozenset[Changed]:
        """What changed since the last checkpoint (empty: nothing worth one)."""
        return frozenset(self._changed)

    @property
    def in_transaction(self) -> bool:
        return self._in_transaction

    def checkpointed(self) -> None:
        """A checkpoint took a copy of the state: nothing changed since."""
        self._changed.clear()

    # -- the log

    def transaction_began(self) -> None:
        """A change of a transaction is being handed over: no checkpoint until its end."""
        self._in_transaction = True

    def transaction_ended(self) -> None:
        self._in_transaction = False

    def at_boundary(
        self, resume: Mapping[str, Any], log_offset: int, position: Position | None = None
    ) -> None:
        """The log is at a transaction boundary it can restart from (``resume``); with
        ``position``, after a commit handed over (the sink holds what precedes it)."""
        self.boundary = resume
        self.boundary_offset = log_offset
        if position is not None:
            self.state.stream.position = position.token
        self.state.stream.resume = dict(resume)
        self._changed.add(Changed.STREAM)

    # -- signals

    def signal_processed(self, signal_id: str, position: Position) -> None:
        """A signal read at ``position`` is handled now (once per id)."""
        self.state.mark_processed(signal_id, position)
        self._changed.add(Changed.SIGNALS)

    def signal_channel_read(self, key: str, offset: int) -> None:
        """The signal channel ``key`` (a file, a topic) is acted on up to ``offset``."""
        self.state.signal_channels[key] = offset
        self._changed.add(Changed.SIGNALS)

    def problem_kept(self, problem: SignalProblem) -> None:
        self.state.add_problem(problem)
        self._changed.add(Changed.PROBLEMS)

    # -- snapshots

    def snapshot_started(
        self,
        progress: TableProgress,
        *,
        key_columns: Iterable[str],
        max_key: Key | None,
        estimated_rows: int | None,
        started_ms: int,
    ) -> None:
        """The table was described: its snapshot pages by ``key_columns`` up to
        ``max_key`` (an empty table is done at once)."""
        progress.key_columns = list(key_columns)
        # For progress and ETA (core.eta): with a filter, an upper bound of what it reads.
        progress.estimated_rows = estimated_rows
        progress.started_ms = started_ms
        progress.start(max_key)
        self._stamp_finished(progress)  # an empty table is done at its start
        self._changed.add(Changed.SNAPSHOTS)

    def spans_done(
        self, progress: TableProgress, done: Iterable[SpanDone], chunk_size: int
    ) -> None:
        """Progress moves over ``done``, the spans whose batches are all out (core.spans)."""
        for span in done:
            progress.chunk_done(
                last_key=span.last_key,
                selected=span.selected,
                emitted=span.emitted,
                chunk_size=chunk_size,
                final=span.final,
            )
        self._stamp_finished(progress)
        self._changed.add(Changed.SNAPSHOTS)

    def snapshot_failed(self, progress: TableProgress, error: str) -> bool:
        """The snapshot fails with ``error``; False if it had finished already (unchanged)."""
        self._changed.add(Changed.SNAPSHOTS)
        if progress.status.finished:
            return False
        progress.fail(error)
        self._stamp_finished(progress)
        return True

    def _stamp_finished(self, progress: TableProgress) -> None:
        """A snapshot that has just finished records when (``status`` shows its duration)."""
        if progress.status.finished and progress.finished_ms is None:
            progress.finished_ms = self.wall_ms()

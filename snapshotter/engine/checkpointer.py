"""Checkpoints: when the sink is asked to make everything so far durable, and which state is
saved once it has.

Checkpoints are taken only at transaction boundaries, so the state saved for an acknowledged
checkpoint always names a point the log can restart from exactly: the sink is cut back to
that checkpoint, and the log replays whatever followed it. The engine's loop tells the
state where the log is (inside a transaction, or at a boundary with its resume point) and
changes progress through methods that mark what changed (``engine.live_state``); the
checkpointer reads both, and keeps the state copy of each checkpoint until the sink
acknowledges it, then saves it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from snapshotter.core.position import Position
from snapshotter.core.state import EngineState, TableProgress
from snapshotter.engine.live_state import LiveState
from snapshotter.engine.state_store import StateStore
from snapshotter.sinks.base import Sink, SinkBacklog

# How long a first start waits for the sink to acknowledge its empty first checkpoint.
FIRST_CHECKPOINT_S = 30.0
FIRST_CHECKPOINT_POLL_S = 0.01
# At shutdown, with a save observer: how long the sink may take to acknowledge the final
# checkpoint before it is closed (the observer then sees the final state, sink open).
SETTLE_S = 10.0

# Called with each state saved and the live records its snapshots were copied from (same
# order): what the engine's records are now, as of a state a crash cannot roll back.
SaveObserver = Callable[[EngineState, Sequence[TableProgress]], None]


@dataclass
class _Pending:
    state: EngineState
    resume: Mapping[str, Any]
    live: list[TableProgress]  # the records ``state.snapshots`` were copied from


class Checkpointer:
    def __init__(
        self,
        *,
        live: LiveState,
        sink: Sink,
        store: StateStore,
        interval_s: float,
        flush: Callable[[], None],
        clock: Callable[[], float],
        sleep: Callable[[float], None],
    ) -> None:
        self._live = live
        self._state = live.state
        self._sink = sink
        self._store = store
        self._interval = interval_s
        self._flush = flush  # hands the events on their way to the sink over first
        self._wanted = sink.checkpoint_wanted if isinstance(sink, SinkBacklog) else None
        self._clock = clock
        self._sleep = sleep
        self._pending: dict[int, _Pending] = {}
        self._last = 0.0
        self.saved_at = 0.0  # wall clock of the newest state save (0: none this run)
        self.unacked = 0  # checkpoints the sink has not acknowledged yet
        self.on_saved: SaveObserver | None = None

    def due(self) -> bool:
        """The interval is up, or the sink asks for a checkpoint early (``SinkBacklog``)."""
        if self._clock() - self._last >= self._interval:
            return True
        return self._wanted is not None and self._wanted()

    def may_checkpoint(self) -> bool:
        """Whether a checkpoint may be taken now: at a boundary, outside a transaction."""
        return self._live.boundary is not None and not self._live.in_transaction

    def maybe_checkpoint(self) -> None:
        if self._live.changed and self.may_checkpoint() and self.due():
            self.checkpoint()

    def checkpoint(self) -> None:
        """Ask the sink to make everything so far durable; keep the state that goes with it.

        Only called at a transaction boundary (after a Commit or an idle Progress), so the
        state's stream position and the sink's content describe the same point."""
        boundary = self._live.boundary
        assert boundary is not None
        snapshot = self._state.model_copy(deep=True)
        self._flush()
        checkpoint = self._sink.checkpoint()
        live = list(self._state.snapshots)
        self._pending[checkpoint] = _Pending(snapshot, dict(boundary), live)
        self.unacked = len(self._pending)
        self._last = self._clock()
        self._live.checkpointed()

    def final_checkpoint(self) -> None:
        """At shutdown: checkpoint at the last transaction boundary, if anything is new.
        Never mid-transaction: the saved state must describe a point the log can restart
        from exactly (the sink is cut back to it on the next start)."""
        if self._live.changed and self.may_checkpoint():
            self.checkpoint()

    def newest(self) -> int:
        """The newest pending checkpoint (0: none)."""
        return max(self._pending, default=0)

    def pending(self, checkpoint: int) -> bool:
        return checkpoint in self._pending

    def collect_acks(self, confirm: Callable[[Mapping[str, Any]], None]) -> None:
        """Save the state of the newest acknowledged checkpoint; ``confirm`` its resume point
        to the log (which may then free what comes before it)."""
        newest: _Pending | None = None
        for ack in self._sink.acknowledged():
            pending = self._pending.pop(ack.checkpoint, None)
            if pending is None:
                continue
            pending.state.sink = dict(ack.resume)
            newest = pending
        self.unacked = len(self._pending)
        if newest is None:
            return
        if newest.state.stream.position:
            newest.state.prune_processed(Position.from_token(newest.state.stream.position))
        self._store.save(newest.state)
        self._saved(newest.state, newest.live)
        confirm(newest.resume)

    def settle(self, confirm: Callable[[Mapping[str, Any]], None]) -> None:
        """At shutdown, before the sink closes: with a save observer, wait (SETTLE_S at
        most) for the sink to acknowledge every pending checkpoint, saving as they come, so
        the observer sees the final state while the sink still takes notifications."""
        deadline = self._clock() + SETTLE_S
        while self.on_saved is not None and self._pending and self._clock() < deadline:
            self.collect_acks(confirm)
            if self._pending:
                self._sleep(FIRST_CHECKPOINT_POLL_S)

    def _saved(self, state: EngineState, live: Sequence[TableProgress]) -> None:
        self.saved_at = time.time()
        if self.on_saved is not None:
            self.on_saved(state, live)

    def save_first(self) -> None:
        """On a first start, save state naming the empty sink before writing anything: a
        crash before the first regular checkpoint then leaves state that cuts the sink back
        to nothing (else the next start would find output no state accounts for)."""
        checkpoint = self._sink.checkpoint()
        deadline = self._clock() + FIRST_CHECKPOINT_S
        while not self._state.sink and self._clock() < deadline:
            for ack in self._sink.acknowledged():
                if ack.checkpoint == checkpoint:
                    self._state.sink = dict(ack.resume)
            if not self._state.sink:
                self._sleep(FIRST_CHECKPOINT_POLL_S)
        if self._state.sink:
            self._store.save(self._state)
            self._saved(self._state, list(self._state.snapshots))

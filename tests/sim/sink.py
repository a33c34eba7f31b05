"""The simulated sink (late acknowledgements) and an in-memory state store.

``Output`` is what the sink's storage holds across engine runs: the events in the order the
engine wrote them, and how many of them are durable. ``SimSink`` is one engine run's view of
it (``snapshotter.sinks.base.Sink``): ``write`` appends, ``checkpoint`` asks for durability,
and the acknowledgement comes when the scheduler says (``release``), oldest first. A crash
keeps the durable prefix and a random part of what came after it (written, not yet
acknowledged); the next run's ``open`` cuts the output back to what its saved state names,
as the JSONL sink cuts its file.

``MemoryStateStore`` is the real state store's contract (``snapshotter.engine.state_store``) with
the JSON text kept in memory: what the engine saves is the real state JSON, read back by the
next run. A crash may hit just before or just after a save.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from signals.names import TableId
from snapshotter.core.events import Op
from snapshotter.core.keys import Key
from snapshotter.core.position import Position
from snapshotter.core.state import EngineState
from snapshotter.core.window import ReadBatch
from snapshotter.engine.state_store import StateStore
from snapshotter.sinks.base import Ack, SinkItem, in_process
from tests.sim.errors import Property, check

if TYPE_CHECKING:
    from tests.sim.scheduler import World


@dataclass(frozen=True, slots=True)
class OutEvent:
    table: TableId
    op: Op
    key: Key | None
    row: Mapping[str, Any] | None  # ``after``
    position: Position


@dataclass(frozen=True, slots=True)
class BatchMark:
    """Where a chunk's READ batch began (its rows follow): which window it closed."""

    window_id: str
    position: Position  # the close watermark's


OutItem = OutEvent | BatchMark


class Output:
    def __init__(self) -> None:
        # What the engine wrote, in order: events, and a mark before each READ batch. The
        # sink's resume offset counts both.
        self.events: list[OutItem] = []
        self.durable = 0  # events[:durable] survive any crash

    def rows(self) -> list[OutEvent]:
        return [e for e in self.events if isinstance(e, OutEvent)]

    def crash(self, keep: int) -> None:
        """The process died: what was written after the durable prefix survives in part."""
        assert self.durable <= keep <= len(self.events)
        del self.events[keep:]


class SimSink:
    def __init__(self, world: World, output: Output) -> None:
        self._world = world
        self._out = output
        self._next_id = 0
        self._pending: list[tuple[int, int]] = []  # (checkpoint, events covered), oldest first
        self._acked: list[Ack] = []  # released, not yet collected

    @property
    def pending(self) -> int:
        return len(self._pending)

    def open(self, resume: Mapping[str, Any] | None) -> None:
        out = self._out
        if resume is None:
            check(
                not out.events,
                Property.SINK_OFFSET,
                f"sink opened without state but holds {len(out.events)} events",
            )
            return
        offset = int(resume["offset"])
        check(
            offset <= out.durable,
            Property.SINK_OFFSET,
            f"state names sink offset {offset}, past the durable {out.durable}",
        )
        del out.events[offset:]
        out.durable = offset

    def write(self, items: Sequence[SinkItem]) -> None:
        events: list[OutItem] = []
        for item in map(in_process, items):
            if isinstance(item, ReadBatch):
                self._world.watch.read_batch(item)
                events.append(BatchMark(item.window_id, item.position))
            # Per row, READ batches as the "r" events a row-at-a-time consumer builds.
            for event in item.events() if isinstance(item, ReadBatch) else [item]:
                events.append(
                    OutEvent(event.table, event.op, event.key, event.after, event.position)
                )
        if len(events) > 1 and self._world.crash_point(0.02):
            # Killed halfway through a write (a torn batch).
            self._out.events.extend(events[: len(events) // 2])
            self._world.crash("sink write")
        self._out.events.extend(events)

    def checkpoint(self) -> int:
        self._next_id += 1
        covered = len(self._out.events)
        if not self._pending and covered <= self._out.durable:
            self._acked.append(Ack(self._next_id, {"offset": covered}))  # nothing to flush
        else:
            self._pending.append((self._next_id, covered))
        return self._next_id

    def release(self, count: int) -> None:
        """The oldest ``count`` checkpoints became durable (the scheduler's decision)."""
        for checkpoint, covered in self._pending[:count]:
            self._out.durable = max(self._out.durable, covered)
            self._acked.append(Ack(checkpoint, {"offset": covered}))
        del self._pending[:count]

    def acknowledged(self) -> list[Ack]:
        out, self._acked = self._acked, []
        return out

    def close(self) -> None:
        if self._world.crashed:
            return  # a dead process flushes nothing
        self.release(len(self._pending))


class MemoryStateStore(StateStore):
    def __init__(self, world: World) -> None:
        super().__init__("/nonexistent/sim-state.json")  # never touched
        self._world = world
        self.text: str | None = None
        self.saves = 0

    def load(self) -> EngineState:
        return EngineState() if self.text is None else EngineState.from_json(self.text)

    def save(self, state: EngineState) -> None:
        if self._world.crash_point(0.01):
            self._world.crash("before a state save")
        self.text = state.to_json()
        self.saves += 1
        if self._world.crash_point(0.01):
            self._world.crash("after a state save")

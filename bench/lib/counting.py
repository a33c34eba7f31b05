"""A sink that only counts: for benchmarks, where the cost of a real sink would hide the
engine's own."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from snapshotter.core.events import Op
from snapshotter.core.window import ReadBatch
from snapshotter.sinks.base import Ack, SinkItem, in_process


class CountingSink:
    """Counts events per op and keeps no data; every checkpoint is acknowledged at once."""

    def __init__(self) -> None:
        self.counts: Counter[Op] = Counter()
        self._checkpoint_id = 0
        self._acks: list[Ack] = []

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def open(self, resume: Mapping[str, Any] | None) -> None:
        pass  # nothing kept, so nothing to cut back

    def write(self, items: Sequence[SinkItem]) -> None:
        for item in map(in_process, items):
            if isinstance(item, ReadBatch):
                self.counts[Op.READ] += item.rows.num_rows
            else:
                self.counts[item.op] += 1

    def checkpoint(self) -> int:
        self._checkpoint_id += 1
        self._acks.append(Ack(self._checkpoint_id, {"events": self.total}))
        return self._checkpoint_id

    def acknowledged(self) -> list[Ack]:
        acks, self._acks = self._acks, []
        return acks

    def close(self) -> None:
        self.checkpoint()

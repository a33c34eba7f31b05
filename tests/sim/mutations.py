"""Rules of the algorithm, each broken on purpose by one small change (a monkeypatch), to show
the simulation notices: ``tests/sim/test_mutations.py`` asserts it, and
``python3 -m tests.sim.mutations [NAME] [SEEDS]`` reports which seeds catch each mutation
and how fast.

* ``window-drop`` (core/window.py, DBLog's rule): log events inside a window no longer drop
  the chunk rows of their keys: ``ChunkWindow._keys_of`` returns no key.
* ``visibility-history`` (core/visibility.py, rule 4, PostgreSQL): transactions logged before
  the open watermark that the chunk's snapshot did not see no longer make rows stale.
* ``span-progress`` (core/spans.py, 6.): progress moves over every span whose batch is out,
  not only over the contiguous prefix of them.
* ``resume-from-start`` (core/spans.py): a resumed snapshot pages from the table's start
  instead of from its last durable key (rows read twice, for nothing).
* ``output-barrier`` (engine.py, rule 5): READ batches are handed to the sink after the log
  events that followed their close watermark in the same read.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from snapshotter.core.spans import SpanDone, SpanPlan
from snapshotter.core.visibility import RecentTransactions
from snapshotter.core.window import ChunkWindow, ReadBatch
from snapshotter.engine import Engine
from tests.sim.harness import SeedFailed, simulate


def _no_window_drops(self: ChunkWindow, event: Any) -> list[Any]:
    return []


def _nothing_stale(self: RecentTransactions, table: Any, visibility: Any, before: Any) -> set[Any]:
    return set()


_closed = SpanPlan.closed


def _progress_out_of_order(
    self: SpanPlan, window_id: str, *, selected: int, emitted: int, last_key: Any
) -> list[SpanDone]:
    out = _closed(self, window_id, selected=selected, emitted=emitted, last_key=last_key)
    # The mutation: also record spans done beyond one still being read.
    later = [s for s in self._spans if s.done is not None]
    for span in later:
        self._spans.remove(span)
    return out + [s.done for s in later if s.done is not None]


_plan_init = SpanPlan.__init__


def _plan_from_start(self: SpanPlan, start: Any, first_number: int, *args: Any, **kw: Any) -> None:
    _plan_init(self, None, first_number, *args, **kw)


def _reads_after_log_events(self: Engine) -> None:
    out = self._out
    if out:
        logged = [i for i in out if not isinstance(i, ReadBatch)]
        self._sink.write(logged + [i for i in out if isinstance(i, ReadBatch)])
        self._out = []


@dataclass(frozen=True)
class Mutation:
    name: str
    target: Any
    attribute: str
    replacement: Callable[..., Any]


MUTATIONS = {
    m.name: m
    for m in (
        Mutation("window-drop", ChunkWindow, "_keys_of", _no_window_drops),
        Mutation("visibility-history", RecentTransactions, "stale_keys", _nothing_stale),
        Mutation("span-progress", SpanPlan, "closed", _progress_out_of_order),
        Mutation("resume-from-start", SpanPlan, "__init__", _plan_from_start),
        Mutation("output-barrier", Engine, "_flush_out", _reads_after_log_events),
    )
}


@contextmanager
def applied(mutation: Mutation) -> Iterator[None]:
    original = getattr(mutation.target, mutation.attribute)
    setattr(mutation.target, mutation.attribute, mutation.replacement)
    try:
        yield
    finally:
        setattr(mutation.target, mutation.attribute, original)


def failing_seeds(mutation: Mutation, seeds: range, *, first_only: bool) -> list[SeedFailed]:
    """The seeds among ``seeds`` whose simulation fails with ``mutation`` applied."""
    out: list[SeedFailed] = []
    with applied(mutation):
        for seed in seeds:
            try:
                simulate(seed)
            except SeedFailed as failure:
                out.append(failure)
                if first_only:
                    break
    return out


def main(argv: list[str]) -> None:
    names = [argv[0]] if argv and argv[0] != "all" else list(MUTATIONS)
    count = int(argv[1]) if len(argv) > 1 else 200
    for name in names:
        start = time.perf_counter()
        failures = failing_seeds(MUTATIONS[name], range(count), first_only=False)
        took = time.perf_counter() - start
        seeds = [f.seed for f in failures]
        print(f"{name}: {len(seeds)} of {count} seeds fail ({took:.1f} s); first: {seeds[:10]}")
        if failures:
            print(f"  e.g. seed {failures[0].seed}: {failures[0].problem[:200]}")


if __name__ == "__main__":
    main(sys.argv[1:])

"""Rules of the algorithm, each broken on purpose by one small change (a monkeypatch), to show
the simulation notices: ``tests/sim/test_mutations.py`` asserts it, and
``python3 -m tests.sim.mutations [NAME] [SEEDS]`` reports which seeds catch each mutation,
by which property, and how fast.

Each mutant has exactly the signature of what it replaces (checked), and names the
properties (``tests.sim.errors.Property``) its broken rule must break: a mutation counts as
caught only when a seed fails on one of them, never when the engine merely raises.

* ``window-drop`` (core/window.py, DBLog's rule): log events inside a window no longer drop
  the chunk rows of their keys: ``ChunkWindow._keys_of`` returns no key.
* ``visibility-history`` (core/visibility.py, rule 4, PostgreSQL): transactions logged before
  the open watermark that the chunk's snapshot did not see no longer make rows stale.
* ``visibility-at-start`` (core/visibility.py, rule 4 across restarts): the transactions
  open as the engine starts are ignored, so a commit logged before the log's resume point
  and still invisible after the restart goes unnoticed.
* ``start-idle-only`` (core/visibility.py, 3.): every session showing its transaction is
  taken for idle in it, also one executing its commit (stuck after the commit record, as
  before a restart), so that commit leaves the doubt though the log will not bring it.
* ``start-release-per-xid`` (core/visibility.py, 2.): the log bringing the end of one
  transaction open at the start lets every other one out of doubt too.
* ``span-progress`` (core/spans.py, 6.): progress moves over every span whose batch is out,
  not only over the contiguous prefix of them.
* ``resume-from-start`` (core/spans.py): a resumed snapshot pages from the table's start
  instead of from its last durable key (rows read twice, for nothing).
* ``output-barrier`` (engine/window_close.py, rule 5): READ batches are handed to the sink after
  the log events that followed their close watermark in the same read (``Output.flush``).
* ``barrier-ahead`` (engine/window_close.py, rule 5): a READ batch joins the events on their
  way to the sink ahead of the log events before its close watermark (``Output.append``).
* ``read-before-open`` (engine/workers.py, rule 2): the in-window read rules of both read
  paths (``_read_in_window``) run the chunk's read before the open watermark is written, so
  a transaction that commits in between is neither seen by the read nor in the window.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from signals.model import WatermarkKind
from snapshotter.core.spans import SpanDone, SpanPlan
from snapshotter.core.visibility import OpenTransaction, RecentTransactions
from snapshotter.core.window import ChunkWindow, ReadBatch
from snapshotter.engine import workers
from snapshotter.engine.window_close import Output
from tests.sim.errors import Property
from tests.sim.harness import SeedFailed, simulate

if TYPE_CHECKING:  # the annotations, spelled as the originals spell them
    from signals.names import TableId
    from snapshotter.core.events import ChangeEvent
    from snapshotter.core.keys import Key
    from snapshotter.core.position import Position
    from snapshotter.core.visibility import OpenAtStart, ReadVisibility
    from snapshotter.engine.workers import ChunkRead, ChunkTask, PhaseHooks
    from snapshotter.sinks.base import SinkItem
    from snapshotter.sources.base import Dialect


def _no_window_drops(self, event: ChangeEvent) -> list[Key]:
    return []


def _nothing_stale(
    self, table: TableId, visibility: ReadVisibility, before: Position
) -> set[Key] | None:
    return set()


def _start_ignored(self, open_at_start: OpenAtStart) -> None:
    return None


def _every_session_idle(self) -> bool:
    return self.pid is not None


def _log_saw_every_one(self, xid: int) -> None:
    self._open_at_start.clear()


_closed = SpanPlan.closed


def _progress_out_of_order(
    self,
    window_id: str,
    *,
    selected: int,
    emitted: int,
    last_key: Key | None,
    covered: Key | None = None,
) -> list[SpanDone]:
    out = _closed(
        self, window_id, selected=selected, emitted=emitted, last_key=last_key, covered=covered
    )
    # The mutation: also record spans done beyond one still being read.
    later = [s for s in self._spans if s.done is not None]
    for span in later:
        self._spans.remove(span)
    return out + [s.done for s in later if s.done is not None]


_plan_init = SpanPlan.__init__


def _plan_from_start(
    self,
    start: Key | None,
    first_number: int,
    max_key: Key,
    chunk_size: int,
    *,
    bound_ahead: bool,
    max_ahead: int = 16,
) -> None:
    _plan_init(
        self, None, first_number, max_key, chunk_size, bound_ahead=bound_ahead, max_ahead=max_ahead
    )


def _reads_after_log_events(self) -> None:
    items = self._items
    if items:
        logged = [i for i in items if not isinstance(i, ReadBatch)]
        self._sink.write(logged + [i for i in items if isinstance(i, ReadBatch)])
        self._items = []


def _reads_ahead_of_log_events(self, item: SinkItem) -> None:
    if isinstance(item, ReadBatch):
        # The mutation: before the log events still waiting, not after them.
        waiting = [i for i in self._items if not isinstance(i, ReadBatch)]
        self._items = [i for i in self._items if isinstance(i, ReadBatch)] + [item] + waiting
    else:
        self._items.append(item)


def run_hook(hook: Callable[[ChunkTask], None] | None, task: ChunkTask) -> None:
    if hook is not None:
        hook(task)


def _read_before_open(
    dialect: Dialect, hooks: PhaseHooks, task: ChunkTask, read: Callable[[], ChunkRead]
) -> ChunkRead:
    window = task.window
    run_hook(hooks.before_open, task)
    answer = read()  # the mutation: the chunk's read before the open watermark
    run_hook(hooks.after_open, task)  # writers may commit here, after the read's snapshot
    dialect.write_watermark(window.watermark(WatermarkKind.OPEN))
    run_hook(hooks.after_read, task)
    dialect.write_watermark(window.watermark(WatermarkKind.CLOSE))
    run_hook(hooks.after_close, task)
    return answer


@dataclass(frozen=True)
class Mutation:
    name: str
    target: Any
    attribute: str
    replacement: Callable[..., Any]
    breaks: frozenset[Property]  # what catching it means: a seed fails on one of these


def _mutation(
    name: str, target: Any, attribute: str, replacement: Callable[..., Any], *breaks: Property
) -> Mutation:
    return Mutation(name, target, attribute, replacement, frozenset(breaks))


MUTATIONS = {
    m.name: m
    for m in (
        _mutation("window-drop", ChunkWindow, "_keys_of", _no_window_drops, Property.STALE_READ),
        _mutation(
            "visibility-history",
            RecentTransactions,
            "stale_keys",
            _nothing_stale,
            Property.STALE_READ,
        ),
        _mutation(
            "visibility-at-start",
            RecentTransactions,
            "started",
            _start_ignored,
            Property.STALE_READ,
        ),
        _mutation(
            "start-idle-only",
            OpenTransaction,
            "not_committing",
            _every_session_idle,
            Property.STALE_READ,
        ),
        _mutation(
            "start-release-per-xid",
            RecentTransactions,
            "_log_saw",
            _log_saw_every_one,
            Property.STALE_READ,
        ),
        _mutation(
            "span-progress",
            SpanPlan,
            "closed",
            _progress_out_of_order,
            # Progress over a gap: a finished snapshot misses rows, or the saved key no
            # longer says which chunks the output holds.
            Property.SNAPSHOT_GAP,
            Property.OUTPUT_NOT_TABLE,
            Property.RESUMED_BEHIND_OUTPUT,
        ),
        _mutation(
            "resume-from-start",
            SpanPlan,
            "__init__",
            _plan_from_start,
            Property.READ_BELOW_DURABLE,
        ),
        _mutation(
            "output-barrier",
            Output,
            "flush",
            _reads_after_log_events,
            Property.POSITIONS_BACKWARDS,
            Property.OUTPUT_NOT_TABLE,
        ),
        _mutation(
            "barrier-ahead",
            Output,
            "append",
            _reads_ahead_of_log_events,
            # A READ row ahead of an older event of its key in the output.
            Property.POSITIONS_BACKWARDS,
            Property.OUTPUT_NOT_TABLE,
        ),
        _mutation(
            "read-before-open",
            workers,
            "_read_in_window",
            _read_before_open,
            # A READ row older than the log's row at the close watermark.
            Property.STALE_READ,
        ),
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
        broken = Counter(str(f.broken) for f in failures)
        print(f"{name}: {len(seeds)} of {count} seeds fail ({took:.1f} s); first: {seeds[:10]}")
        print(f"  by property: {dict(broken)}")
        if failures:
            print(f"  e.g. seed {failures[0].seed}: {failures[0].problem[:200]}")


if __name__ == "__main__":
    main(sys.argv[1:])

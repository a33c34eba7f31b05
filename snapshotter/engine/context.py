"""What an engine is built from: its collaborators, its settings, and the injection points a
test or a simulation replaces (the clocks, the chunk-worker pool, the window ids)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from signals.names import TableId
from snapshotter.config import Config
from snapshotter.core.state import EngineState
from snapshotter.engine.key_catalog import KeyCatalog
from snapshotter.engine.scheduler import random_window_id
from snapshotter.engine.state_store import StateStore
from snapshotter.engine.watchdog import LogCoverage
from snapshotter.engine.workers import ChunkWorkers, PhaseHooks, RemoteReads, StartWorkers
from snapshotter.sinks.base import Sink
from snapshotter.sources.base import Dialect
from snapshotter.sources.log import LogReader

KeyColumns = Callable[[TableId], Sequence[str] | None]
OpenReader = Callable[[Mapping[str, Any], KeyColumns], LogReader]


def epoch_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, kw_only=True)
class EngineContext:
    config: Config
    dialect: Dialect  # the engine's own, also the first chunk worker's
    open_reader: OpenReader  # opens the log reader at a resume point
    sink: Sink
    store: StateStore  # the state file (loaded when the engine is built)
    # A dialect of its own (connection, statement guard) for each chunk worker but the
    # first: needed when read_parallelism > 1.
    open_dialect: Callable[[], Dialect] | None = None
    # The catalog the sinks ask for key names (a new one if None).
    keys: KeyCatalog | None = None
    # Windows read elsewhere (Spark tasks on executors, ``[snapshot] executors``).
    remote_reads: RemoteReads | None = None
    # What the source's log no longer carries, asked while running (``engine.watchdog``);
    # None: overdue close watermarks are only warned about.
    log_coverage: LogCoverage | None = None
    retry_for: float | None = None  # how long source outages are waited out (engine.retry)
    hooks: PhaseHooks | None = None  # run between the steps of a chunk (tests)
    on_progress: Callable[[EngineState], None] | None = None  # after each step and close
    # Every time read and wait of the engine (a simulation passes its own).
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    # The epoch-ms clock of the snapshots' start times in state.
    wall_ms: Callable[[], int] = epoch_ms
    # Builds the chunk-worker pool (a simulation runs the same tasks without threads).
    start_workers: StartWorkers = ChunkWorkers
    # The ids of chunk windows; a simulation passes its own, since they reach the signal
    # table.
    new_window_id: Callable[[], str] = random_window_id

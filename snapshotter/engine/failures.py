"""Where the engine's collaborators report what fails, one object for all of them (not
callbacks handed from one to the next):

- a table's snapshot: failed in state with its error (``status`` shows it), dropped from the
  schedule, counted, logged; the other snapshots and the stream go on;
- a signal (or a watermark row) the engine cannot act on, fully or in part: logged, counted
  and kept in state for ``status``; the stream goes on.
"""

from __future__ import annotations

import logging

from snapshotter.core.position import Position
from snapshotter.core.state import SignalProblem
from snapshotter.engine.live_state import LiveState
from snapshotter.engine.scheduler import Scheduler, TableRun
from snapshotter.engine.stats import EngineStats

log = logging.getLogger("snapshotter.engine")


class Failures:
    def __init__(self, live: LiveState, scheduler: Scheduler, stats: EngineStats) -> None:
        self._live = live
        self._scheduler = scheduler
        self._stats = stats

    def snapshot(self, run: TableRun, error: str) -> None:
        """``run``'s snapshot fails with ``error``."""
        if self._live.snapshot_failed(run.progress, error):
            self._stats.errors["snapshot"] += 1
        self._scheduler.drop_run(run.progress)
        log.error("snapshot of %s failed: %s", run.progress.table, error)

    def signal(
        self,
        signal_id: str,
        kind: str,
        message: str,
        position: Position,
        level: int = logging.ERROR,
    ) -> None:
        """A signal (of type ``kind``) read at ``position`` the engine cannot act on."""
        log.log(level, "signal %s (%s): %s", signal_id, kind, message)
        self._stats.errors["signal"] += 1
        self._live.problem_kept(
            SignalProblem(
                signal_id=signal_id, signal_type=kind, message=message, position=position.token
            )
        )

"""Which watermark rows in the log the engine acts on.

Anyone who can insert signals can insert watermark rows too: the engine acts only on a
window's own rows, in order (``core.window`` explains why a forged close is never safe to
act on, even after the chunk rows were buffered). A row of no window this run holds is
ignored; a foreign row that blocks a window (it took the id of the window's own next row)
costs that window: its chunk is read again under a new one, up to FORGED_WINDOWS_MAX times
per table snapshot, then that snapshot fails. The stream goes on either way.
"""

from __future__ import annotations

import logging

from signals import Watermark
from signals.model import WatermarkKind
from signals.names import TableId
from snapshotter.core.position import Position
from snapshotter.core.state import EngineState
from snapshotter.core.window import WatermarkVerdict
from snapshotter.engine.failures import Failures
from snapshotter.engine.scheduler import Flight, Scheduler
from snapshotter.engine.signal_cleanup import WatermarkCleanup

log = logging.getLogger("snapshotter.engine")

# Watermark rows the engine did not write that took a window's id (core.window): the chunk
# is read again under a new id, up to this many times per table snapshot; then it fails.
FORGED_WINDOWS_MAX = 3


class WatermarkRows:
    def __init__(
        self,
        *,
        state: EngineState,
        scheduler: Scheduler,
        failures: Failures,
        cleanup: WatermarkCleanup | None,
        signal_table: TableId,
    ) -> None:
        self._state = state
        self._scheduler = scheduler
        self._failures = failures
        self._cleanup = cleanup  # deletes the watermark rows of windows that are over
        self._signal_table = signal_table
        # Watermark rows that were not the engine's own, and cost a window, per table
        # snapshot (signal id + table): past FORGED_WINDOWS_MAX the snapshot fails.
        self._forged: dict[str, int] = {}
        self._warned_unknown_window = False

    def arrived(self, watermark: Watermark, position: Position) -> Flight | None:
        """Act on a watermark row read at ``position``: an own open row opens its window.
        Returns the window whose own close row this is (the engine closes it: the output
        barrier); None when there is nothing more to do."""
        flight = self._scheduler.flight(watermark.window_id)
        if flight is None:
            self._unknown_window(watermark)
            if watermark.kind is WatermarkKind.CLOSE and self._cleanup is not None:
                self._cleanup.finished(watermark.window_id)  # of a stopped snapshot, a failed task
            return None
        window = flight.task.window
        verdict, why = window.judge(watermark)
        if verdict is not WatermarkVerdict.OWN:
            self._foreign_watermark(flight, watermark, verdict, why, position)
            return None
        if watermark.kind is WatermarkKind.OPEN:
            window.open(position)
            return None
        return flight

    def _unknown_window(self, watermark: Watermark) -> None:
        """A watermark row of no window this run holds: ignored (harmless: no window acts on
        it). Expected for windows of a run before a restart and of stopped snapshots."""
        if self._scheduler.registered(watermark.window_id) or self._warned_unknown_window:
            log.debug("watermark row %s of no current window ignored", watermark.id)
            return
        self._warned_unknown_window = True
        log.warning(
            "watermark row %s ignored: no chunk window of this run has that id (a window of "
            "the run before a restart, a row of another engine sharing the signal table %s, "
            "or a row inserted by hand); further ones are logged at debug level",
            watermark.id,
            self._signal_table,
        )

    def _foreign_watermark(
        self,
        flight: Flight,
        watermark: Watermark,
        verdict: WatermarkVerdict,
        why: str,
        at: Position,
    ) -> None:
        """A watermark row of a live window that is not its own, or out of order: never
        acted on. If the window cannot complete any more (BLOCKING: the row took the id of
        the window's own next row), the chunk is read again under a new window, up to
        FORGED_WINDOWS_MAX times per table snapshot; then that snapshot fails."""
        task = flight.task
        what = f"{watermark.type.value} row ignored: {why} (chunk {task.number} of {task.table})"
        progress = self._state.progress(task.table)
        live = (
            progress is not None
            and progress.signal_id == task.signal_id
            and not progress.status.finished
        )
        if verdict is WatermarkVerdict.STRAY or progress is None or not live:
            self._failures.signal(watermark.id, watermark.type.value, what, at, logging.WARNING)
            return
        key = f"{task.signal_id}\x00{task.table}"
        count = self._forged[key] = self._forged.get(key, 0) + 1
        run = self._scheduler.run_of(progress)
        if count > FORGED_WINDOWS_MAX:
            self._failures.signal(watermark.id, watermark.type.value, what, at, logging.WARNING)
            self._failures.snapshot(
                run,
                f"{count} watermark rows not written by the engine took the ids of its chunk "
                f"windows: something inserts snapshot-window rows into the signal table "
                f"{self._signal_table}; stop it, then send execute-snapshot again",
            )
            return
        self._failures.signal(
            watermark.id,
            watermark.type.value,
            f"{what}; the chunk is read again under a new window",
            at,
            logging.WARNING,
        )
        self._scheduler.read_again(run, task.window.window_id)

"""The run's outcome, as its exit code says it: 0 when every snapshot this run worked on is
done, 2 when one failed, was stopped or is paused (the CLI's contract for
``--until-caught-up``)."""

from __future__ import annotations

from collections.abc import Iterable

from snapshotter.core.state import EngineState, SnapshotStatus, TableProgress

EXIT_DONE = 0
EXIT_UNFINISHED = 2


class RunOutcome:
    def __init__(self) -> None:
        self._touched: set[str] = set()  # signal ids of snapshots this run worked on
        # A snapshot of this run that did not finish as done but whose record was pruned
        # from the history (the exit code must still say so).
        self._pruned_unsuccessful = False

    def touch(self, signal_id: str) -> None:
        """This run works on the snapshots of ``signal_id``."""
        self._touched.add(signal_id)

    def touched(self, signal_id: str) -> bool:
        return signal_id in self._touched

    def pruned(self, dropped: Iterable[TableProgress]) -> None:
        """Snapshot records dropped from the history (``EngineState.prune_history``)."""
        done = SnapshotStatus.DONE
        if any(p.signal_id in self._touched and p.status is not done for p in dropped):
            self._pruned_unsuccessful = True

    def exit_code(self, state: EngineState) -> int:
        touched = [p for p in state.snapshots if p.signal_id in self._touched]
        if self._pruned_unsuccessful or any(p.status is not SnapshotStatus.DONE for p in touched):
            return EXIT_UNFINISHED
        return EXIT_DONE

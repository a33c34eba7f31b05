"""Caught up (``--until-caught-up``): no snapshot left to run, the log read to the end it had
when the engine settled, and a checkpoint covering that point acknowledged by the sink.

The log end is asked once per settled spell (``target``); then the engine waits until its
transaction boundary reaches it (asking the reader for progress, so an idle log reports
where it is), takes one checkpoint that covers it and waits for that acknowledgement only:
under steady traffic later checkpoints keep coming (one per interval), and a sink that
acknowledges slower than that (Kafka under load) would never have none pending.
"""

from __future__ import annotations

from collections.abc import Callable

from snapshotter.engine.checkpointer import Checkpointer
from snapshotter.engine.live_state import LiveState
from snapshotter.engine.retry import SourceRetry
from snapshotter.sources.log import LogReader

# How often the reader is asked for a progress report while the log end is not reached.
PROGRESS_REQUEST_S = 0.2


class CaughtUp:
    def __init__(
        self,
        *,
        log_end: Callable[[], int],
        is_transient: Callable[[BaseException], bool],
        retry: SourceRetry,
        checkpoints: Checkpointer,
        live: LiveState,
        clock: Callable[[], float],
    ) -> None:
        self._log_end = log_end
        self._is_transient = is_transient
        self._retry = retry
        self._checkpoints = checkpoints
        self._live = live  # where the log is, and what changed since the last checkpoint
        self._clock = clock
        self._target: int | None = None  # the log end to reach
        self._covering: int | None = None  # the checkpoint that covers it (0: none needed)
        self._last_progress_request = 0.0

    def check(self, *, settled: bool, reader: LogReader) -> bool:
        """Whether the engine is caught up. ``settled``: no snapshot is active, no window in
        flight and no worker busy; else any target found so far is forgotten."""
        if not settled:
            self._target = None
            self._covering = None
            return False
        if self._target is None:
            if self._retry.waiting():
                return False
            try:
                self._target = self._log_end()
            except Exception as exc:
                if not self._is_transient(exc):
                    raise
                self._retry.failed("reading the log end", " ".join(str(exc).split()))
                return False
            self._retry.answered()
        checkpoints, live = self._checkpoints, self._live
        if live.boundary_offset < self._target:
            now = self._clock()
            if now - self._last_progress_request > PROGRESS_REQUEST_S:
                reader.request_progress()
                self._last_progress_request = now
            return False
        if self._covering is None:
            if live.changed and not checkpoints.may_checkpoint():
                return False  # the next transaction boundary comes first
            if live.changed:
                checkpoints.checkpoint()
            self._covering = checkpoints.newest()
        checkpoints.collect_acks(reader.confirm)
        return not checkpoints.pending(self._covering) and not live.in_transaction

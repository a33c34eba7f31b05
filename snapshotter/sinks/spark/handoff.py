"""What the Spark sink's three threads share: the engine thread checkpoints, the stager thread
stages each checkpoint (``sinks.spark.stager``), the lander thread lands the staged batches
(``sinks.spark.lander_thread``). One condition guards it all, so each can wait for the others'
progress (backpressure, a landing waiting for the batch being staged, the tests' waits)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from signals.names import TableId
from snapshotter.sinks.base import Ack
from snapshotter.sinks.spark.staging import StagedBatch

log = logging.getLogger(__name__)


class SparkSinkError(RuntimeError):
    """The sink cannot go on; the message says why and what to do."""


class Handoff:
    """The sink's shared state; every field is read and written under ``cond`` (except where
    a reader says it needs no lock)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        # Staged batches not yet landed, oldest first, and their bytes (the backpressure bound
        # counts them).
        self.queue: list[StagedBatch] = []
        self.staged_bytes = 0
        # Checkpoints handed to the stager and not yet staged.
        self.unstaged = 0
        self.acks: list[Ack] = []  # appended by the stager, taken by the engine
        self.landing = False  # the lander is landing or compacting
        self.closing = False  # the sink closes: the lander stops once nothing is left
        self.read_at: dict[TableId, float] = {}  # when READ rows of a table were last staged
        # The first failure of any thread: the engine stops with it at its next call.
        self.failure: str | None = None

    def fail(self, reason: str) -> None:
        with self.cond:
            self.failure = self.failure or reason
            self.landing = False
            self.cond.notify_all()
        log.error("%s", reason)

    def check(self) -> None:
        if self.failure is not None:
            raise SparkSinkError(self.failure)

    def wait_while(self, busy: Callable[[], bool], timeout: float | None) -> bool:
        """Wait (with ``cond``) until ``busy()`` is false or a thread failed: False when the
        timeout ran out first; the failure is raised."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while busy() and self.failure is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self.cond.wait(left)
        self.check()
        return True


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"

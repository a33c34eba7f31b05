"""What the Spark sink's three threads share: the engine thread checkpoints, the stager thread
stages each checkpoint (``sinks.spark.stager``), the lander thread lands the staged batches
(``sinks.spark.lander_thread``). One condition guards it all, so each can wait for the others'
progress (backpressure, a landing waiting for the batch being staged)."""

from __future__ import annotations

import logging
import threading

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
        self.closing = False  # the sink closes: the lander stops once nothing is left
        self.read_at: dict[TableId, float] = {}  # when READ rows of a table were last staged
        # The first failure of any thread: the engine stops with it at its next call.
        self.failure: str | None = None

    def fail(self, reason: str) -> None:
        with self.cond:
            self.failure = self.failure or reason
            self.cond.notify_all()
        log.error("%s", reason)

    def check(self) -> None:
        if self.failure is not None:
            raise SparkSinkError(self.failure)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"

"""Helpers shared by unit tests."""

from __future__ import annotations

import time
from collections.abc import Callable

from snapshotter.sinks.spark.sink import SparkSink


def wait_until(done: Callable[[], bool], timeout: float) -> bool:
    """Poll ``done`` until it holds (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def spark_staged(sink: SparkSink, timeout: float) -> bool:
    """Wait until every checkpoint so far is through the sink's stager thread, as its metrics
    say (no checkpoint unstaged): staged and acknowledged, or failed (the next call raises).
    ``acknowledged`` then has its ack: the stager counts a checkpoint done and adds its ack
    under the lock that ``acknowledged`` takes."""
    return wait_until(lambda: sink.metrics()["unstaged_checkpoints"] == 0, timeout)


def spark_landed(sink: SparkSink, timeout: float) -> bool:
    """Wait until everything checkpointed so far is landed, as the sink's metrics say: no
    checkpoint unstaged and no staged bytes left (a batch's bytes count until it landed)."""

    def landed() -> bool:
        figures = sink.metrics()
        return figures["unstaged_checkpoints"] == 0 and figures["staged_bytes"] == 0

    return wait_until(landed, timeout)

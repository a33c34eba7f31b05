"""The Spark sink's threads never die silently (issue 26): whatever ends the lander or the
stager is the sink's failure, and the engine's next call raises it with the reason.

Issue 26: ``[sink] compact_idle_s = inf`` (refused by the config since) made the lander
thread's wait raise OverflowError outside any handler: the thread died, the engine kept
staging, nothing landed again. The same wait is reached here with the sink built directly.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from snapshotter.sinks.spark.sink import SparkSink, SparkSinkError
from snapshotter.sinks.spark.staging import StagingArea
from tests.unit.test_spark_sink_batches import A, RecordingLander, log_event, schema_of


class TailedLander(RecordingLander):
    """A lander whose tables always have a changelog tail: the idle compaction is planned."""

    def has_tails(self) -> bool:
        return True


def _sink(tmp_path: Path, **kwargs: object) -> SparkSink:
    sink = SparkSink(
        staging=StagingArea(tmp_path / "staging"),
        open_lander=lambda: TailedLander(),  # type: ignore[arg-type,return-value]
        describe=lambda table: schema_of(table),
        key_columns=lambda table: ("id",),
        max_staged_bytes=64 * 1024 * 1024,
        root=str(tmp_path / "lake"),
        fmt="parquet",
        **kwargs,  # type: ignore[arg-type]
    )
    sink.open(None)
    return sink


def _failure(sink: SparkSink, timeout: float = 30) -> str:
    """The error the engine's next call gets, once the sink's threads have failed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            sink.acknowledged()
        except SparkSinkError as exc:
            return str(exc)
        time.sleep(0.05)
    raise AssertionError(f"the sink did not fail within {timeout} s")


def test_a_lander_whose_wait_raises_stops_the_engine_with_the_reason(tmp_path: Path) -> None:
    sink = _sink(tmp_path, compact_idle_s=math.inf)
    sink.write([log_event(A, 1, 10)])
    sink.checkpoint()
    said = _failure(sink)
    # "timeout value is too large" or "timestamp out of range for platform time_t"
    assert said.startswith("the Spark sink's lander stopped: OverflowError: "), said
    with pytest.raises(SparkSinkError, match="lander stopped"):
        sink.checkpoint()  # nothing more is staged for a lander that is gone
    with pytest.raises(SparkSinkError, match="lander stopped"):
        sink.close()


def test_spark_that_does_not_start_is_the_sinks_failure(tmp_path: Path) -> None:
    from snapshotter.sinks.spark.start import SparkStartError

    def no_spark() -> RecordingLander:
        raise SparkStartError("cannot reach the Spark master at spark://h:1 (refused); fix it")

    sink = SparkSink(
        staging=StagingArea(tmp_path / "staging"),
        open_lander=no_spark,  # type: ignore[arg-type]
        describe=lambda table: schema_of(table),
        key_columns=lambda table: ("id",),
        max_staged_bytes=64 * 1024 * 1024,
        root=str(tmp_path / "lake"),
        fmt="parquet",
    )
    sink.open(None)
    assert _failure(sink) == "cannot reach the Spark master at spark://h:1 (refused); fix it"

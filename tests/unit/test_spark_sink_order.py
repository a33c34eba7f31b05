"""The Spark sink's landing order on resume, with a stand-in lander (no Spark): batches the
last run staged and recorded head the lander's queue and land first, in order, while the
stream goes on; newer batches queue behind them; a full disk while staging names the place.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from signals.names import TableId
from snapshotter.core.events import ChangeEvent, Op, SnapshotMarker, Source
from snapshotter.core.position import Position
from snapshotter.sinks.spark.lander import Landed
from snapshotter.sinks.spark.sink import SparkSink, SparkSinkError
from snapshotter.sinks.spark.staging import StagedBatch, StagingArea
from snapshotter.sinks.spark.types import events_to_landed
from snapshotter.sources.base import ColumnInfo, TableSchema
from tests.unit.helpers import spark_landed, spark_staged

TABLE = TableId("shop", "items")
SCHEMA = TableSchema(
    TABLE,
    (
        ColumnInfo("id", "bigint", 20, False, pa.int64()),
        ColumnInfo("name", "text", 25, True, pa.string()),
    ),
    ("id",),
)


def event(key: int, pos: int) -> ChangeEvent:
    source = Source(
        "postgresql", "shop", "shop", TABLE, Position(pos), 1_700_000_000_000, SnapshotMarker.FALSE
    )
    return ChangeEvent(Op.CREATE, source, 1, (key,), after={"id": key, "name": f"n{key}"})


class GatedLander:
    """Records what it is asked to land; each landing waits for ``gate``."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.calls: list[list[int]] = []
        self.started = threading.Event()

    def land(self, batches: Sequence[StagedBatch]) -> Landed:
        self.started.set()
        assert self.gate.wait(30), "the test never opened the gate"
        self.calls.append([b.seq for b in batches])
        return Landed(tuple(b.seq for b in batches), 0, 0.0)

    def compact_idle(self) -> list[TableId]:
        return []

    hold_compaction: Any = None

    def waiting_compactions(self) -> list[TableId]:
        return []

    def compact_released(self) -> list[TableId]:
        return []


def sink_over(staging: StagingArea, lander: GatedLander, root: str) -> SparkSink:
    return SparkSink(
        staging=staging,
        open_lander=lambda: lander,  # type: ignore[arg-type,return-value]
        describe=lambda table: SCHEMA,
        key_columns=lambda table: ("id",),
        max_staged_bytes=64 * 1024 * 1024,
        root=root,
        fmt="parquet",
    )


def stage(staging: StagingArea, seq: int) -> None:
    data = events_to_landed(SCHEMA, ["id"], [event(seq, seq * 10)], seq)
    staging.stage(seq, [(TABLE, ["id"], data)])


def test_leftover_batches_land_first_while_the_stream_goes_on(tmp_path: Path) -> None:
    staging = StagingArea(tmp_path / "staging")
    staging.open()
    for seq in (1, 2, 3):
        stage(staging, seq)  # the last run staged 3 batches, the state recorded 2
    lander = GatedLander()
    sink = sink_over(staging, lander, str(tmp_path / "lake"))
    resume: dict[str, Any] = {"staged": 2, "path": str(tmp_path / "lake"), "format": "parquet"}
    sink.open(resume)  # returns at once: nothing landed yet, the lander waits at the gate
    assert lander.started.wait(10)
    assert lander.calls == []
    # The stream goes on: new events are staged as batch 3 (the unrecorded 3 was dropped)
    # and acknowledged while the leftovers still wait to land.
    sink.write([event(100, 1000)])
    sink.checkpoint()
    assert spark_staged(sink, 10)  # staged on the sink's stager thread, then acknowledged
    [ack] = sink.acknowledged()
    assert ack.resume["staged"] == 3
    assert lander.calls == []
    lander.gate.set()
    assert spark_landed(sink, 30)
    sink.close()
    landed = [seq for call in lander.calls for seq in call]
    assert landed == [1, 2, 3], lander.calls  # in order, each once
    assert lander.calls[0][:2] == [1, 2]  # the leftovers first
    assert staging.batches() == []


def test_no_leftovers_no_waiting(tmp_path: Path) -> None:
    staging = StagingArea(tmp_path / "staging")
    lander = GatedLander()
    lander.gate.set()
    sink = sink_over(staging, lander, str(tmp_path / "lake"))
    sink.open(None)
    sink.write([event(1, 10)])
    sink.checkpoint()
    assert spark_landed(sink, 30)
    sink.close()
    assert lander.calls == [[1]]


def test_a_staging_directory_on_a_full_disk_is_named(tmp_path: Path) -> None:
    class FullStaging(StagingArea):
        def stage(self, seq: int, tables: Any, written: Any = None) -> StagedBatch:
            raise OSError(28, "No space left on device")

    staging = FullStaging(tmp_path / "staging")
    lander = GatedLander()
    lander.gate.set()
    sink = sink_over(staging, lander, str(tmp_path / "lake"))
    sink.open(None)
    sink.write([event(1, 10)])
    sink.checkpoint()  # staged on the stager thread: the error comes with the next call
    assert spark_staged(sink, 10)
    with pytest.raises(SparkSinkError) as info:
        sink.acknowledged()
    with pytest.raises(SparkSinkError):
        sink.acknowledged()  # and stays: the engine stops at its next call
    message = str(info.value)
    assert f"no space left on the device holding the staging directory {tmp_path}/staging" in (
        message
    )
    assert "[sink] staging_path" in message and "snapshotter resume" in message

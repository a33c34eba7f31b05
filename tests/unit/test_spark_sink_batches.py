"""The Spark sink with READ batches, with a stand-in lander (no Spark): log events and READ
batches of several tables are staged per table in log order, a READ batch as its own
column-wise cast; a column the catalog does not know is found from the batch's schema; and
compaction waits while a table is being snapshotted, then runs once the lander is idle.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from signals.names import TableId
from snapshotter.core.events import ChangeEvent, Op, SnapshotMarker, Source
from snapshotter.core.position import Position
from snapshotter.core.window import ReadBatch
from snapshotter.sinks.spark import lander_thread
from snapshotter.sinks.spark import sink as spark_sink
from snapshotter.sinks.spark.lander import Landed
from snapshotter.sinks.spark.sink import SparkSink
from snapshotter.sinks.spark.staging import StagedBatch, StagingArea
from snapshotter.sources.base import ColumnInfo, TableSchema
from tests.unit.helpers import spark_landed, spark_staged

A, B = TableId("shop", "a"), TableId("shop", "b")


def schema_of(table: TableId, *extra: str) -> TableSchema:
    columns = [
        ColumnInfo("id", "bigint", 20, False, pa.int64()),
        ColumnInfo("name", "text", 25, True, pa.string()),
    ]
    columns += [ColumnInfo(name, "bigint", 20, True, pa.int64()) for name in extra]
    return TableSchema(table, tuple(columns), ("id",))


def log_event(table: TableId, key: int, pos: int) -> ChangeEvent:
    source = Source("postgresql", "shop", "shop", table, Position(pos), 1, SnapshotMarker.FALSE)
    return ChangeEvent(Op.UPDATE, source, 1, (key,), after={"id": key, "name": f"log{key}"})


def read_batch(table: TableId, keys: Sequence[int], close: int, **extra: list[int]) -> ReadBatch:
    columns: dict[str, Any] = {
        "id": pa.array(keys, pa.int64()),
        "name": pa.array([f"read{k}" for k in keys]),
        **{name: pa.array(values, pa.int64()) for name, values in extra.items()},
    }
    batch = ReadBatch(
        "w", table, ("id",), pa.table(columns), Position(close), len(keys), None, False
    )
    source = Source("postgresql", "shop", "shop", table, Position(close), 1, SnapshotMarker.FALSE)
    return batch.stamped(source, 9, None)


class RecordingLander:
    """Lands nothing; records what it was asked, and what it compacted when. While ``gate``
    is clear, a landing waits (so a test can read the staged files before they go)."""

    def __init__(self) -> None:
        self.landed: list[list[int]] = []
        self.compacted: list[tuple[TableId, float]] = []
        self.due: set[TableId] = set()
        self.hold_compaction: Any = None
        self.gate = threading.Event()
        self.gate.set()

    def land(self, batches: Sequence[StagedBatch]) -> Landed:
        assert self.gate.wait(30), "the test never opened the gate"
        self.landed.append([b.seq for b in batches])
        for batch in batches:
            for part in batch.tables:
                if not self.hold_compaction(part.table):
                    self.compacted.append((part.table, time.monotonic()))
                else:
                    self.due.add(part.table)
        return Landed(tuple(b.seq for b in batches), 0, 0.0)

    def waiting_compactions(self) -> list[TableId]:
        return sorted(self.due, key=str)

    def compact_released(self) -> list[TableId]:
        done = [t for t in self.waiting_compactions() if not self.hold_compaction(t)]
        for table in done:
            self.due.discard(table)
            self.compacted.append((table, time.monotonic()))
        return done

    def compact_idle(self) -> list[TableId]:
        return []


def open_sink(
    tmp_path: Path,
    lander: RecordingLander,
    schemas: dict[TableId, TableSchema],
    fmt: str = "parquet",
) -> tuple[SparkSink, StagingArea]:
    staging = StagingArea(tmp_path / "staging")
    described: list[TableId] = []

    def describe(table: TableId) -> TableSchema:
        described.append(table)
        return schemas[table]

    sink = SparkSink(
        staging=staging,
        open_lander=lambda: lander,  # type: ignore[arg-type,return-value]
        describe=describe,
        key_columns=lambda table: ("id",),
        max_staged_bytes=64 * 1024 * 1024,
        root=str(tmp_path / "lake"),
        fmt=fmt,
    )
    sink.described = described  # type: ignore[attr-defined]
    sink.open(None)
    return sink, staging


def staged_rows(staging: StagingArea, table: TableId) -> list[dict[str, Any]]:
    [batch] = staging.batches()
    part = batch.table(table)
    assert part is not None
    rows: list[dict[str, Any]] = pq.read_table(part.file).to_pylist()
    return rows


def test_log_events_and_read_batches_are_staged_per_table_in_log_order(tmp_path: Path) -> None:
    lander = RecordingLander()
    sink, staging = open_sink(tmp_path, lander, {A: schema_of(A), B: schema_of(B)})
    with held(lander):
        sink.write(
            [
                log_event(A, 7, 10),
                read_batch(A, [1, 2, 3], 20),
                log_event(B, 5, 21),
                read_batch(B, [], 22),  # a chunk the log emptied: nothing to land
                log_event(A, 2, 30),
                read_batch(B, [4, 5], 40),
                read_batch(A, [8], 50),
            ]
        )
        sink.checkpoint()
        assert spark_staged(sink, 10)  # staged on the sink's stager thread
        a = staged_rows(staging, A)
        b = staged_rows(staging, B)
    assert [(r["id"], r["name"], r["__op"]) for r in a] == [
        (7, "log7", "u"),
        (1, "read1", "r"),
        (2, "read2", "r"),
        (3, "read3", "r"),
        (2, "log2", "u"),
        (8, "read8", "r"),
    ]
    assert [r["__pos"] for r in a] == sorted(r["__pos"] for r in a)
    assert [(r["id"], r["__op"]) for r in b] == [(5, "u"), (4, "r"), (5, "r")]
    assert {r["__batch"] for r in a + b} == {1}
    assert all(
        r["__snapshot"] == "incremental" and r["__ts_ms"] == 9 for r in a if r["__op"] == "r"
    )
    sink.close()


def test_a_read_batch_with_a_column_the_catalog_lacks_describes_the_table_again(
    tmp_path: Path,
) -> None:
    lander = RecordingLander()
    schemas = {A: schema_of(A)}
    sink, _ = open_sink(tmp_path, lander, schemas)
    with held(lander):
        sink.write([log_event(A, 1, 10)])
        sink.checkpoint()  # described once
        assert spark_staged(sink, 10)
        schemas[A] = schema_of(A, "added")  # the column was added at the source since
        sink.write([read_batch(A, [2], 20, added=[5])])
        sink.checkpoint()
        assert spark_staged(sink, 10)
    assert sink.described == [A, A]  # type: ignore[attr-defined]
    sink.close()


def test_compaction_waits_while_a_table_is_snapshotted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lander_thread, "SNAPSHOT_QUIET_S", 0.5)
    lander = RecordingLander()
    sink, _ = open_sink(tmp_path, lander, {A: schema_of(A), B: schema_of(B)})
    sink.write([read_batch(A, [1, 2], 10), log_event(B, 3, 11)])
    sink.checkpoint()
    staged_at = time.monotonic()
    assert spark_landed(sink, 10)
    # B (log events only) compacts at its landing; A waits for its snapshot to go quiet.
    deadline = time.monotonic() + 10
    while len(lander.compacted) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [t for t, _ in lander.compacted] == [B, A]
    assert lander.compacted[1][1] - staged_at >= 0.5
    sink.close()


class held:
    """The lander's landings wait inside the block: staged batches stay to be read."""

    def __init__(self, lander: RecordingLander) -> None:
        self.lander = lander

    def __enter__(self) -> None:
        self.lander.gate.clear()

    def __exit__(self, *exc: object) -> None:
        self.lander.gate.set()


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_table_s_first_read_rows_in_a_process_ask_for_a_checkpoint_at_once(
    tmp_path: Path, fmt: str
) -> None:
    """Delta and Iceberg: the first chunk of a table lands beside the reading of the next
    (its tables created, the process's first commit paid early); later chunks wait for the
    checkpoint interval, and log events never ask."""
    sink, _ = open_sink(tmp_path, RecordingLander(), {A: schema_of(A), B: schema_of(B)}, fmt)
    try:
        sink.write([log_event(A, 7, 10)])
        assert not sink.checkpoint_wanted()
        sink.write([read_batch(A, [1, 2], 20)])
        assert sink.checkpoint_wanted()
        sink.checkpoint()
        sink.write([read_batch(A, [3, 4], 30), log_event(B, 5, 31)])
        assert not sink.checkpoint_wanted()  # A's first rows went; B has log events only
        sink.write([read_batch(B, [6], 40)])
        assert sink.checkpoint_wanted()  # B's first READ rows
        sink.checkpoint()
        sink.write([read_batch(B, [7], 50), read_batch(A, [8], 51)])
        assert not sink.checkpoint_wanted()
    finally:
        sink.close()


def test_parquet_asks_for_a_checkpoint_every_so_many_read_rows(tmp_path: Path) -> None:
    sink, _ = open_sink(tmp_path, RecordingLander(), {A: schema_of(A)})
    try:
        sink.write([read_batch(A, [1, 2], 20)])
        assert not sink.checkpoint_wanted()
        many = list(range(3, 3 + spark_sink.CHECKPOINT_READ_ROWS))
        sink.write([read_batch(A, many, 30)])
        assert sink.checkpoint_wanted()
    finally:
        sink.close()

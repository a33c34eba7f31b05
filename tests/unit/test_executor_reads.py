"""The pure parts of chunk reads on Spark executors: a window holding a staged chunk, the
span split at a sub-range's read limit, the combined snapshots, and the tasks' lines made
into one chunk. (The reads and the landing themselves: tests/integration/
test_executor_reads.py.)"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from signals.model import WatermarkKind
from signals.names import TableId
from snapshotter.core.events import ChangeEvent, Op, Source
from snapshotter.core.keys import encode_key
from snapshotter.core.position import Position
from snapshotter.core.spans import SpanDone, SpanPlan
from snapshotter.core.visibility import AllSnapshots, PgSnapshot
from snapshotter.core.window import (
    ChunkWindow,
    ReadBatch,
    StagedReadBatch,
    StagedRows,
    WatermarkVerdict,
    WindowOrderError,
)
from snapshotter.engine.executor_reads import _chunk

TABLE = TableId("public", "items")
KEY_TYPES = pa.schema([("id", pa.int64())])


def staged(rows: int = 10, last: int = 10, covered: Any = None) -> StagedRows:
    return StagedRows(("/s/part-00000.parquet",), rows, (last,), KEY_TYPES, covered)


def change(key: int, at: int) -> ChangeEvent:
    source = Source("postgresql", "srv", "db", TABLE, Position(at, 0), ts_ms=1)
    return ChangeEvent(Op.UPDATE, source, 0, (key,), before={"id": key}, after={"id": key})


def test_a_staged_window_closes_with_its_dropped_keys_typed_as_the_reader_types_them() -> None:
    window = ChunkWindow("w", TABLE, ["id"])
    window.open(Position(10, 0))
    assert window.judge(window.watermark(WatermarkKind.CLOSE))[0] is WatermarkVerdict.BLOCKING
    window.fill_staged(staged())
    assert window.filled
    assert window.observe(change(3, 11)) and window.observe(change(7, 12))
    batch = window.close(Position(20, 1))
    assert isinstance(batch, StagedReadBatch) and not isinstance(batch, ReadBatch)
    assert batch.dropped_keys.schema == KEY_TYPES
    assert sorted(batch.dropped_keys.column("id").to_pylist()) == [3, 7]
    assert (batch.selected, len(batch), batch.last_key, batch.dropped) == (10, 10, (10,), 2)
    with pytest.raises(WindowOrderError):
        batch.template  # noqa: B018 - stamped at the close by the engine


def test_a_staged_window_takes_one_chunk_and_a_truncate_empties_it() -> None:
    window = ChunkWindow("w", TABLE, ["id"])
    window.fill_staged(staged())
    with pytest.raises(WindowOrderError):
        window.fill(pa.table({"id": [1]}))
    window.open(Position(10, 0))
    truncate = ChangeEvent(
        Op.TRUNCATE, Source("postgresql", "srv", "db", TABLE, Position(11, 0), ts_ms=1), 0, None
    )
    window.observe(truncate)
    batch = window.close(Position(20, 0))
    assert isinstance(batch, StagedReadBatch) and batch.truncated and len(batch) == 0


def test_a_sub_range_at_its_read_limit_ends_the_span_where_it_stopped() -> None:
    plan = SpanPlan(None, 1, (100,), 20, bound_ahead=True)
    plan.take("a")
    plan.bounded("a", (40,), final=False)
    # Far below the whole window's read limit, but a sub-range said where it stopped.
    assert plan.closed("a", selected=25, emitted=25, last_key=(30,), covered=(30,)) == [
        SpanDone(1, (30,), 25, 25, False)
    ]
    rest = plan.take("r")
    assert rest is not None and (rest.after, rest.upto) == ((30,), (40,))


def test_combined_snapshots_see_only_what_every_read_saw() -> None:
    early, late = PgSnapshot(100, 105, frozenset({102})), PgSnapshot(100, 110, frozenset())
    both = AllSnapshots((early, late))
    assert both.sees(99) and both.sees(101)
    assert not both.sees(102)  # in progress for one read
    assert not both.sees(107)  # after one read's xmax
    assert both.settled(99) and not both.settled(100)


def _line(index: int, rows: int, last: int | None, limited: bool = False) -> dict[str, Any]:
    return {
        "index": index,
        "file": f"/s/part-{index:05d}.parquet",
        "rows": rows,
        "last_key": None if last is None else json.dumps(encode_key((last,))),
        "visibility": f"{100 + index}:{110 + index}:",
        "key_types": KEY_TYPES.serialize().to_pybytes(),
        "limited": limited,
    }


def test_the_tasks_lines_make_one_chunk_in_key_order() -> None:
    chunk = _chunk([_line(0, 5, 5), _line(1, 0, None), _line(2, 4, 20)])
    assert chunk.staged.files == ("/s/part-00000.parquet", "/s/part-00002.parquet")
    assert (chunk.staged.selected, chunk.staged.last_key, chunk.staged.covered) == (9, (20,), None)
    assert isinstance(chunk.visibility, AllSnapshots) and len(chunk.visibility.snapshots) == 3


def test_files_after_a_sub_range_at_its_limit_are_not_part_of_the_chunk() -> None:
    chunk = _chunk([_line(0, 5, 5), _line(1, 8, 13, limited=True), _line(2, 4, 20)])
    assert chunk.staged.files == ("/s/part-00000.parquet", "/s/part-00001.parquet")
    assert (chunk.staged.selected, chunk.staged.covered) == (13, (13,))


def test_a_failed_spark_job_is_reported_by_its_cause() -> None:
    from snapshotter.engine.workers import _cause_line

    spark_error = Exception(
        "An exception was thrown from the Python worker: \n"
        "Traceback (most recent call last):\n"
        '  File "serializers.py", line 171, in _read_with_length\n'
        "ModuleNotFoundError: No module named 'snapshotter.engine.executor_reads'\n"
        " SQLSTATE: 38000)"
    )
    assert _cause_line(spark_error) == (
        "ModuleNotFoundError: No module named 'snapshotter.engine.executor_reads'"
    )
    assert _cause_line(Exception("lost\nmore")) == "lost"

"""The pool of chunk workers (``snapshotter.engine.workers.ChunkWorkers``), without a server: a
worker stays busy until its task's answer (a BOUND chunk's bound is news, not the answer),
cancel and stop reach every worker's reads, and the pool closes the dialects it owns.
The engine with real servers and several reads in flight is ``test_parallel_reads``."""

from __future__ import annotations

import threading
import time
from typing import Any

import pyarrow as pa

from signals.names import TableId
from snapshotter.core.spans import SpanRead, range_read_limit
from snapshotter.core.window import ChunkWindow
from snapshotter.engine.workers import (
    ChunkBounded,
    ChunkRead,
    ChunkTask,
    ChunkWorkers,
    Result,
    TaskFailed,
)
from snapshotter.sources.base import ChunkRows, ChunkSpec, ColumnInfo, ReadCancelled, TableSchema

TABLE = TableId("s", "t")
SCHEMA = TableSchema(TABLE, (ColumnInfo("id", "bigint", 20, False, pa.int64()),), ("id",))


class FakeDialect:
    """What a chunk worker calls, in memory: keys 1..100; reads can be held by ``gate``."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.gate = gate
        self.cancelled = threading.Event()
        self.closed = False
        self.reads: list[tuple[Any, Any, int]] = []

    def chunk_bound(self, spec: ChunkSpec) -> Any:
        start = 0 if spec.after is None else spec.after[0]
        bound = start + spec.limit
        return (bound,) if bound < spec.upto[0] else None

    def write_watermark(self, watermark: Any) -> None:
        pass

    def read_chunk(self, spec: ChunkSpec) -> ChunkRows:
        after, upto, limit = spec.after, spec.upto, spec.limit
        self.reads.append((after, upto, limit))
        while self.gate is not None and not self.gate.wait(0.01):
            if self.cancelled.is_set():
                raise ReadCancelled("cancelled (fake)")
        start = 0 if after is None else after[0]
        ids = list(range(start + 1, min(upto[0], start + limit) + 1))
        return ChunkRows(
            pa.table({"id": pa.array(ids, pa.int64())}), (ids[-1],) if ids else None, None
        )

    def cancel_reads(self) -> None:
        self.cancelled.set()

    def allow_reads(self) -> None:
        self.cancelled.clear()

    def is_transient(self, exc: BaseException) -> bool:
        return False

    def close(self) -> None:
        self.closed = True


def task(number: int, after: int | None, read: SpanRead, upto: int = 100) -> ChunkTask:
    return ChunkTask(
        table=TABLE,
        signal_id="x",
        number=number,
        window=ChunkWindow(f"w{number}", TABLE, ("id",)),
        schema=SCHEMA,
        after=None if after is None else (after,),
        upto=(upto,),
        condition=None,
        limit=10,
        read=read,
    )


def answers(pool: ChunkWorkers, count: int, timeout: float = 5.0) -> list[Result]:
    out: list[Result] = []
    deadline = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        out.extend(pool.poll())
        time.sleep(0.005)
    return out


def test_a_bound_chunk_sends_its_bound_first_and_reads_the_range_whole() -> None:
    gate = threading.Event()
    first, second = FakeDialect(gate), FakeDialect()
    pool = ChunkWorkers([first, second])  # type: ignore[list-item]
    try:
        pool.submit(task(1, 20, SpanRead.BOUND))
        [bounded] = answers(pool, 1)
        assert isinstance(bounded, ChunkBounded)
        assert (bounded.upto, bounded.final) == ((30,), False)
        assert pool.busy and pool.idle == 1  # the bound is news: the read goes on
        pool.submit(task(2, 30, SpanRead.BOUND))  # on the other worker, meanwhile
        got = answers(pool, 2)
        assert [type(r) for r in got] == [ChunkBounded, ChunkRead]
        assert pool.idle == 1
        gate.set()
        [read] = answers(pool, 1)
        assert isinstance(read, ChunkRead) and read.task.number == 1
        assert read.selected == 10 and read.last_key == (30,)
        assert first.reads == [((20,), (30,), range_read_limit(10))]
        assert not pool.busy and pool.idle == 2
        pool.submit(task(3, 95, SpanRead.BOUND))
        last = answers(pool, 2)
        assert isinstance(last[0], ChunkBounded) and last[0].final and last[0].upto == (100,)
    finally:
        pool.stop(5)


def test_cancel_and_stop_reach_every_worker() -> None:
    gate = threading.Event()
    dialects = [FakeDialect(gate), FakeDialect(gate), FakeDialect(gate)]
    pool = ChunkWorkers(dialects)  # type: ignore[arg-type]
    try:
        for n in (1, 2, 3):
            pool.submit(task(n, n * 10, SpanRead.CLOSED, upto=n * 10 + 10))
        deadline = time.monotonic() + 5
        while sum(len(d.reads) for d in dialects) < 3 and time.monotonic() < deadline:
            time.sleep(0.005)
        pool.cancel(lambda t: isinstance(t, ChunkTask) and t.number != 2)
        got = answers(pool, 2)
        assert sorted(r.task.number for r in got) == [1, 3]
        assert all(isinstance(r, TaskFailed) and r.cancelled for r in got)
        pool.stop(5)  # the held read of chunk 2 is cancelled too
        [last] = answers(pool, 1)
        assert isinstance(last, TaskFailed) and last.cancelled and last.task.number == 2
    finally:
        pool.stop(5)
    assert not dialects[0].closed  # the engine's own
    assert dialects[1].closed and dialects[2].closed

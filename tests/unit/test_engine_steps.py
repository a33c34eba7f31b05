"""The whole engine without a server, driven step by step through its injection points: a
fake clock (``clock``), a pool that runs each task when it is submitted, on the caller's
thread (``start_workers``), an in-memory log, dialect and sink, and ``step`` instead of
``run``. What it shows: a snapshot goes from the signal to READ rows in the sink to a saved,
done state; checkpoints follow the injected clock; a second engine on the saved state
executes nothing twice. (The seeded simulation of the whole engine is ``tests/sim``.)"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import pyarrow as pa

from signals import ExecuteSnapshot, Watermark, to_row
from signals.names import TableId
from snapshotter.config import Config, parse_config
from snapshotter.core.events import ChangeEvent, Op, Source
from snapshotter.core.keys import Key
from snapshotter.core.position import Position
from snapshotter.core.state import SnapshotStatus
from snapshotter.core.window import ReadBatch
from snapshotter.engine import Engine, EngineContext, KeyCatalog
from snapshotter.engine.signal_cleanup import WatermarkCleanup
from snapshotter.engine.state_store import StateStore
from snapshotter.engine.workers import PhaseHooks, Result, Task, run_task
from snapshotter.sinks.base import Ack, SinkItem
from snapshotter.sources.base import ChunkRows as Chunk
from snapshotter.sources.base import ChunkSpec, ColumnInfo, Dialect, TableSchema
from snapshotter.sources.log import Change, Commit, LogItem, Progress

SIGNALS = TableId("public", "debezium_signal")
ITEMS = TableId("public", "items")
SCHEMA = TableSchema(ITEMS, (ColumnInfo("id", "bigint", 20, False, pa.int64()),), ("id",))
WALL = 1_700_000_000_000  # the injected wall clock at the fake clock's 0 (epoch ms)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class Database:
    """One table of ids, the signal table, and a log of committed transactions."""

    def __init__(self, ids: Sequence[int]) -> None:
        self.ids = sorted(ids)
        self.log: list[LogItem] = []
        self.offset = 0
        self._xids = itertools.count(1)

    def commit(self, table: TableId, row: dict[str, Any]) -> None:
        self.offset += 1
        position = Position(self.offset, 0)
        source = Source("postgresql", "test", "db", table, position, 0)
        xid = next(self._xids)
        key = (row["id"],)
        self.log.append(Change(ChangeEvent(Op.CREATE, source, 0, key, after=row), xid))
        self.log.append(Commit(xid, Position(self.offset, 1), {"lsn": self.offset}, 0, self.offset))

    def signal(self, signal: ExecuteSnapshot | Watermark) -> None:
        row_id, kind, data = to_row(signal)
        self.commit(SIGNALS, {"id": row_id, "type": kind, "data": data})


class FakeDialect:
    connector = "postgresql"
    database = "db"
    dollar_quotes = True
    commits_visible_in_log_order = True

    def __init__(self, db: Database) -> None:
        self.db = db
        self.closed = False
        self.estimate_error: Exception | None = None

    def estimated_rows(self, schema: TableSchema) -> int | None:
        if self.estimate_error is not None:
            raise self.estimate_error
        return len(self.db.ids)

    def describe(self, table: TableId) -> TableSchema:
        return SCHEMA

    def snapshot_key(self, schema: TableSchema, surrogate_key: str | None) -> tuple[str, ...]:
        return ("id",)

    def ensure_captured(self, tables: Sequence[TableId]) -> list[TableId]:
        return []

    def list_tables(self) -> list[TableId]:
        return [ITEMS, SIGNALS]

    def relation_kinds(self, tables: Sequence[TableId]) -> Mapping[TableId, str]:
        return {}

    def max_key(self, schema: TableSchema, keys: Sequence[str], condition: str | None) -> Key:
        return (self.db.ids[-1],) if self.db.ids else None  # type: ignore[return-value]

    def read_chunk(self, spec: ChunkSpec) -> Chunk:
        after, upto, limit = spec.after, spec.upto, spec.limit
        low = -1 if after is None else cast(int, after[0])
        ids = [i for i in self.db.ids if low < i <= cast(int, upto[0])][:limit]
        return Chunk(pa.table({"id": pa.array(ids, pa.int64())}), (ids[-1],) if ids else None, None)

    def row_converter(self, schema: TableSchema) -> None:
        return None

    def write_watermark(self, watermark: Watermark) -> None:
        self.db.signal(watermark)

    def log_end(self) -> int:
        return self.db.offset

    def is_transient(self, exc: BaseException) -> bool:
        return False

    def close(self) -> None:
        self.closed = True


class Reader:
    def __init__(self, db: Database, start: int) -> None:
        self.db, self.at = db, start
        self.confirmed: list[Mapping[str, Any]] = []
        self.closed = False

    def read(self, timeout: float) -> list[LogItem]:
        items, self.at = self.db.log[self.at :], len(self.db.log)
        return items

    def confirm(self, resume: Mapping[str, Any]) -> None:
        self.confirmed.append(resume)

    def request_progress(self) -> None:
        self.db.log.append(Progress({"lsn": self.db.offset}, self.db.offset))

    def close(self) -> None:
        self.closed = True


class InlinePool:
    """A WorkerPool that runs each task when it is submitted, on the caller's thread, with
    the chunk worker's own code (``run_task``: open watermark, SELECT, buffer, close)."""

    def __init__(self, dialect: FakeDialect) -> None:
        self.dialect = dialect
        self.answers: list[Result] = []
        self.stopped = False

    def __len__(self) -> int:
        return 1

    @property
    def busy(self) -> bool:
        return bool(self.answers)

    @property
    def idle(self) -> int:
        return 0 if self.answers else 1

    def submit(self, task: Task) -> None:
        run_task(task, self.dialect, PhaseHooks(), self.answers.append)  # type: ignore[arg-type]

    def poll(self) -> list[Result]:
        out, self.answers = self.answers, []
        return out

    def cancel(self, matches: Callable[[Task], bool]) -> None:
        pass

    def stop(self, timeout: float = 30.0) -> None:
        self.stopped = True


class MemorySink:
    def __init__(self) -> None:
        self.items: list[SinkItem] = []
        self.checkpoints = itertools.count(1)
        self.unacked: list[Ack] = []
        self.taken: list[int] = []

    def open(self, resume: Mapping[str, Any] | None) -> None:
        if resume is not None:
            del self.items[resume["count"] :]  # cut back to the acknowledged checkpoint

    def write(self, items: Sequence[SinkItem]) -> None:
        self.items.extend(items)

    def checkpoint(self) -> int:
        checkpoint = next(self.checkpoints)
        self.taken.append(checkpoint)
        self.unacked.append(Ack(checkpoint, {"count": len(self.items)}))
        return checkpoint

    def acknowledged(self) -> list[Ack]:
        out, self.unacked = self.unacked, []
        return out

    def close(self) -> None:
        pass

    def read_ids(self) -> list[int]:
        return [
            i
            for item in self.items
            if isinstance(item, ReadBatch)
            for i in item.rows.column("id").to_pylist()
        ]


def config(tmp_path: Path, chunk_size: int = 3, extra: str = "") -> Config:
    text = f"""
[source]
kind = "postgres"
url = "postgresql://u:p@h:5432/db"
name = "test"
tables = ["public.*"]
chunk_size = {chunk_size}
signal_cleanup = false
read_parallelism = 1
[state]
dir = "{tmp_path / "state"}"
checkpoint_interval_ms = 1000
{extra}"""
    return parse_config(text, environ={})


class Setup:
    def __init__(self, tmp_path: Path, db: Database, sink: MemorySink, extra: str = "") -> None:
        self.clock = Clock()
        self.dialect = FakeDialect(db)
        self.readers: list[Reader] = []
        self.pools: list[InlinePool] = []
        cfg = config(tmp_path, extra=extra)
        (tmp_path / "state").mkdir(exist_ok=True)
        self.store = StateStore(tmp_path / "state" / "state.json")
        self.keys = KeyCatalog(self.dialect.describe, SIGNALS)

        def open_reader(resume: Mapping[str, Any], key_columns: object) -> Reader:
            # Restart at the saved resume point: the log items after its commit.
            lsn = int(resume.get("lsn", 0))
            start = next(
                (
                    i + 1
                    for i, item in enumerate(db.log)
                    if isinstance(item, Commit) and item.resume["lsn"] == lsn
                ),
                0,
            )
            reader = Reader(db, start)
            self.readers.append(reader)
            return reader

        def start_workers(
            dialects: list[Dialect], hooks: PhaseHooks | None, cleanup: WatermarkCleanup | None
        ) -> InlinePool:
            assert len(dialects) == 1 and cleanup is None  # read_parallelism 1, no cleanup
            pool = InlinePool(self.dialect)
            self.pools.append(pool)
            return pool

        self.engine = Engine(
            EngineContext(
                config=cfg,
                dialect=self.dialect,  # type: ignore[arg-type]  # what the engine calls only
                open_reader=open_reader,
                sink=sink,
                store=self.store,
                keys=self.keys,
                clock=self.clock,
                sleep=self.clock.sleep,
                start_workers=start_workers,
                wall_ms=lambda: WALL + round(self.clock.now * 1000),
            )
        )

    def until_caught_up(self, steps: int = 500) -> int:
        """Step (each step 50 ms on the fake clock) until caught up; the exit code."""
        reader = self.engine.start()
        for _ in range(steps):
            if self.engine.step(reader, until_caught_up=True):
                break
            self.clock.now += 0.05
        else:
            raise AssertionError(f"not caught up after {steps} steps")
        self.engine.close()
        return self.engine.exit_code()


def test_a_snapshot_from_signal_to_saved_state_without_a_server(tmp_path: Path) -> None:
    db, sink = Database(range(1, 11)), MemorySink()
    db.signal(ExecuteSnapshot("go", (ITEMS,)))
    run = Setup(tmp_path, db, sink)
    assert run.until_caught_up() == 0
    assert sink.read_ids() == list(range(1, 11))  # chunk_size 3: four windows
    state = run.store.load()
    (progress,) = state.snapshots
    assert (progress.status, progress.rows_emitted, progress.chunk_id) == (
        SnapshotStatus.DONE,
        10,
        4,
    )
    assert state.stream.resume == {"lsn": db.offset}  # the last commit (watermark rows)
    assert state.sink == {"count": len(sink.items)}
    assert run.readers[0].confirmed[-1] == {"lsn": db.offset}
    assert run.pools[0].stopped and run.readers[0].closed and run.dialect.closed
    assert run.engine.keys is run.keys


def test_checkpoints_follow_the_injected_clock(tmp_path: Path) -> None:
    db, sink = Database([]), MemorySink()
    run = Setup(tmp_path, db, sink)
    engine = run.engine
    reader = engine.start()
    assert sink.taken == [1]  # a first start saves state naming the empty sink
    db.commit(ITEMS, {"id": 1})
    engine.step(reader)
    run.clock.now += 0.999
    db.commit(ITEMS, {"id": 2})
    engine.step(reader)
    assert sink.taken == [1]  # not due before checkpoint_interval_ms on the clock
    run.clock.now += 0.002
    db.commit(ITEMS, {"id": 3})
    engine.step(reader)  # due: the commit takes one, at its transaction boundary
    assert sink.taken == [1, 2]
    assert run.store.load().sink == {"count": 3}  # acknowledged at once, state saved
    engine.close()


class EagerSink(MemorySink):
    """A sink that asks for a checkpoint once it holds ``wanted_after`` items (SinkBacklog)."""

    def __init__(self, wanted_after: int) -> None:
        super().__init__()
        self.wanted_after = wanted_after

    def checkpoint_wanted(self) -> bool:
        return len(self.items) >= self.wanted_after


def test_a_sink_that_wants_a_checkpoint_gets_one_before_the_interval(tmp_path: Path) -> None:
    db, sink = Database([]), EagerSink(wanted_after=2)
    run = Setup(tmp_path, db, sink)
    engine = run.engine
    reader = engine.start()
    assert sink.taken == [1]
    db.commit(ITEMS, {"id": 1})
    engine.step(reader)
    assert sink.taken == [1]  # one item: not wanted yet, and the interval is not up
    db.commit(ITEMS, {"id": 2})
    engine.step(reader)  # wanted: taken at this commit, with no time gone by on the clock
    assert sink.taken == [1, 2]
    assert run.store.load().sink == {"count": 2}
    engine.close()


def test_a_second_engine_on_the_saved_state_executes_nothing_twice(tmp_path: Path) -> None:
    db, sink = Database(range(1, 5)), MemorySink()
    db.signal(ExecuteSnapshot("go", (ITEMS,)))
    assert Setup(tmp_path, db, sink).until_caught_up() == 0
    before = list(sink.items)
    db.commit(ITEMS, {"id": 99})
    again = Setup(tmp_path, db, sink)
    assert again.until_caught_up() == 0  # no snapshot touched by this run
    assert sink.items[: len(before)] == before
    (new,) = sink.items[len(before) :]  # only the new change, no READ rows again
    assert isinstance(new, ChangeEvent) and new.key == (99,)
    assert len(again.store.load().snapshots) == 1


def test_the_start_records_the_row_estimate_and_the_start_time(tmp_path: Path) -> None:
    db, sink = Database(range(1, 11)), MemorySink()
    db.signal(ExecuteSnapshot("go", (ITEMS,)))
    run = Setup(tmp_path, db, sink)
    run.clock.now = 7.0
    assert run.until_caught_up() == 0
    (progress,) = run.store.load().snapshots
    assert progress.estimated_rows == 10 and progress.rows_read == 10
    assert progress.started_ms == WALL + 7_050  # the answer came at the second step
    # ... and its end, for its duration in status (the wall clock as the last chunk closed)
    assert progress.finished_ms is not None and progress.finished_ms > progress.started_ms


def test_a_failing_estimate_never_fails_the_snapshot(tmp_path: Path, caplog: Any) -> None:
    db, sink = Database(range(1, 11)), MemorySink()
    db.signal(ExecuteSnapshot("go", (ITEMS,)))
    run = Setup(tmp_path, db, sink)
    run.dialect.estimate_error = RuntimeError("permission denied for pg_class")
    with caplog.at_level("DEBUG", logger="snapshotter.chunks"):
        assert run.until_caught_up() == 0
    (progress,) = run.store.load().snapshots
    assert progress.status is SnapshotStatus.DONE and progress.rows_emitted == 10
    assert progress.estimated_rows is None and progress.started_ms == WALL + 50
    assert any("no row estimate for public.items" in r.getMessage() for r in caplog.records)


def test_a_resumed_start_takes_no_new_estimate() -> None:
    from snapshotter.engine.workers import StartTask, TableStarted

    dialect = FakeDialect(Database(range(1, 4)))
    answers: list[Result] = []
    for known in (False, True):
        task = StartTask(ITEMS, "go", None, None, known_max_key=known)
        run_task(task, dialect, PhaseHooks(), answers.append)  # type: ignore[arg-type]
    first, resumed = answers
    assert isinstance(first, TableStarted) and isinstance(resumed, TableStarted)
    assert (first.max_key, first.estimated_rows) == ((3,), 3)
    assert (resumed.max_key, resumed.estimated_rows) == (None, None)  # state keeps the first

"""The scheduler (``snapshotter.engine.scheduler``) alone, without a server or a worker: what
it hands out next for the active snapshot, how many windows it keeps in flight, and what a
voided task or a window given up hands out again. The engine with real reads is
``tests/integration/test_parallel_reads.py``."""

from __future__ import annotations

import itertools

import pyarrow as pa

from signals.names import TableId
from snapshotter.core.spans import SpanRead
from snapshotter.core.state import TableProgress
from snapshotter.engine.scheduler import WINDOWS_IN_FLIGHT, Scheduler
from snapshotter.engine.workers import ChunkTask, StartTask
from snapshotter.sources.base import ColumnInfo, TableSchema

TABLE = TableId("s", "t")
SCHEMA = TableSchema(TABLE, (ColumnInfo("id", "bigint", 20, False, pa.int64()),), ("id",))


def scheduler(parallelism: int = 1, chunk_size: int = 10) -> Scheduler:
    ids = (f"w{n}" for n in itertools.count(1))
    return Scheduler(
        chunk_size=chunk_size, parallelism=parallelism, new_window_id=lambda: next(ids)
    )


def running(max_key: int = 1000) -> TableProgress:
    progress = TableProgress(table=TABLE, signal_id="sig", key_columns=["id"])
    progress.start((max_key,))
    return progress


def described(s: Scheduler, progress: TableProgress) -> None:
    """The table's StartTask was answered: the run knows the schema."""
    s.run_of(progress).schema = SCHEMA


def test_nothing_to_hand_out_without_an_active_snapshot() -> None:
    assert scheduler().next_task(None) is None


def test_a_pending_table_is_started_once() -> None:
    s = scheduler()
    progress = TableProgress(table=TABLE, signal_id="sig")
    task = s.next_task(progress)
    assert isinstance(task, StartTask)
    assert (task.table, task.signal_id, task.known_max_key) == (TABLE, "sig", False)
    assert s.next_task(progress) is None  # being started: nothing else until its answer


def test_a_resumed_running_table_is_described_without_its_maximum_key() -> None:
    task = scheduler().next_task(running())
    assert isinstance(task, StartTask) and task.known_max_key


def test_a_voided_start_is_handed_out_again() -> None:
    s = scheduler()
    progress = TableProgress(table=TABLE, signal_id="sig")
    task = s.next_task(progress)
    assert isinstance(task, StartTask)
    s.void(s.run_of(progress), task)
    assert isinstance(s.next_task(progress), StartTask)


def test_one_reader_reads_open_spans_one_at_a_time() -> None:
    """Without parallel reads a span's end is its read's last key: the next span waits."""
    s, progress = scheduler(), running()
    described(s, progress)
    task = s.next_task(progress)
    assert isinstance(task, ChunkTask)
    assert (task.number, task.after, task.read, task.upto, task.limit) == (
        1,
        None,
        SpanRead.OPEN,
        (1000,),
        10,
    )
    assert s.flight(task.window.window_id) is not None and s.has_windows
    assert s.flights_of(TABLE)[0].task is task
    assert s.next_task(progress) is None
    # The read's answer ends the span: the next one starts after its last key.
    run = s.run_of(progress)
    assert run.plan is not None
    run.plan.read_open(task.window.window_id, 10, (10,))
    nxt = s.next_task(progress)
    assert isinstance(nxt, ChunkTask) and (nxt.number, nxt.after) == (2, (10,))


def test_parallel_reads_keep_at_most_the_windows_in_flight() -> None:
    parallelism = 4
    s, progress = scheduler(parallelism), running()
    assert s.windows_in_flight == max(WINDOWS_IN_FLIGHT, parallelism + 1)
    described(s, progress)
    run = s.run_of(progress)
    tasks: list[ChunkTask] = []
    while (task := s.next_task(progress)) is not None:
        assert isinstance(task, ChunkTask) and task.read is SpanRead.BOUND
        assert run.plan is not None
        # Each bound is found before the read: the next span can be handed out at once.
        run.plan.bounded(task.window.window_id, (10 * (len(tasks) + 1),), False)
        tasks.append(task)
    assert len(tasks) == s.windows_in_flight == len(run.flights)
    assert [t.after for t in tasks] == [None, (10,), (20,), (30,), (40,)]


def test_a_window_given_up_is_read_again_under_a_new_window() -> None:
    s, progress = scheduler(2), running()
    described(s, progress)
    run = s.run_of(progress)
    first = s.next_task(progress)
    assert isinstance(first, ChunkTask) and run.plan is not None
    run.plan.bounded(first.window.window_id, (10,), False)
    s.read_again(run, first.window.window_id)
    assert s.flight(first.window.window_id) is None
    assert s.registered(first.window.window_id)  # its late watermark rows stay quiet
    again = s.next_task(progress)
    assert isinstance(again, ChunkTask)
    assert again.window.window_id != first.window.window_id
    # The same key range, now known: read whole.
    assert (again.number, again.after, again.upto, again.read) == (1, None, (10,), SpanRead.CLOSED)


def test_a_voided_chunk_whose_close_was_handled_is_not_read_again() -> None:
    s, progress = scheduler(), running()
    described(s, progress)
    run = s.run_of(progress)
    task = s.next_task(progress)
    assert isinstance(task, ChunkTask)
    s.closing(task.window.window_id)  # its close watermark was handled
    s.leave(run, task.window.window_id)
    s.void(run, task)  # then its answer was lost
    assert not s.has_windows and run.flights == []
    assert run.plan is not None and run.plan.span_of(task.window.window_id) is not None


def test_dropping_a_run_forgets_its_windows() -> None:
    s, progress = scheduler(), running()
    described(s, progress)
    task = s.next_task(progress)
    assert isinstance(task, ChunkTask)
    s.drop_run(progress)
    assert not s.has_windows and s.runs() == []
    # A new run of the same progress starts from its last durable key, described again.
    assert isinstance(s.next_task(progress), StartTask)


def test_another_record_of_the_same_snapshot_gets_a_run_of_its_own() -> None:
    """A run belongs to one TableProgress object: a record put in its place (the same
    signal and table) is described again, not read with the old run's schema and plan."""
    s, progress = scheduler(), running()
    described(s, progress)
    again = running()
    assert s.run_of(again).schema is None
    assert isinstance(s.next_task(again), StartTask)

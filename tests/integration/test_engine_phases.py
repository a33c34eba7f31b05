"""The ordering rules, tested deterministically: SQL runs between the steps of a chunk.

Each test writes to the table at one phase of the first chunk (before the open watermark,
between it and the SELECT, between the SELECT and the close watermark, after the close), then
checks the output: which READ rows the window dropped, and that materializing the JSONL file
gives the table.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from snapshotter.engine.workers import ChunkTask, PhaseHooks

ROWS = 40  # chunk size 10: four chunks, the first holds ids 1..10


def _setup(capture: Any, chunk_size: int = 10) -> Any:
    cap = capture(chunk_size=chunk_size)
    cap.sql(f'CREATE TABLE "{cap.schema}".items (id int PRIMARY KEY, name text NOT NULL, n int)')
    items = f'"{cap.schema}".items'
    cap.sql(f"INSERT INTO {items} SELECT g, 'item ' || g, g FROM generate_series(1, %s) g", (ROWS,))
    cap.sql(f"ALTER TABLE {items} REPLICA IDENTITY FULL")
    cap.init()
    return cap


def _once(statement: str, cap: Any) -> Callable[[ChunkTask], None]:
    """A hook that runs ``statement`` during the first chunk only."""
    done = threading.Event()

    def hook(task: ChunkTask) -> None:
        if task.number == 1 and not done.is_set():
            done.set()
            cap.sql(statement.format(t=f'"{cap.schema}".items'))

    return hook


def _reads(cap: Any) -> dict[int, dict[str, Any]]:
    return {
        e["key"]["id"]: e["value"]["after"] for e in cap.events("items") if e["value"]["op"] == "r"
    }


def _run(cap: Any, **hooks: Callable[[ChunkTask], None]) -> None:
    cap.execute(f"{cap.schema}.items")
    assert cap.run(hooks=PhaseHooks(**hooks)) == 0
    verdict = cap.verify("items")
    assert verdict.ok, verdict.render()


def test_a_write_before_the_open_watermark_is_read_by_the_chunk(capture: Any) -> None:
    cap = _setup(capture)
    _run(cap, before_open=_once("UPDATE {t} SET name = 'before open' WHERE id = 3", cap))
    reads = _reads(cap)
    # Committed before the open watermark: the SELECT saw it, the window did not drop it.
    assert reads[3]["name"] == "before open"
    assert len(reads) == ROWS


@pytest.mark.parametrize("phase", ["after_open", "after_read"])
def test_an_update_inside_the_window_drops_the_read_row(capture: Any, phase: str) -> None:
    cap = _setup(capture)
    _run(cap, **{phase: _once("UPDATE {t} SET name = 'in window' WHERE id = 4", cap)})
    reads = _reads(cap)
    assert 4 not in reads  # the log's update is fresher than whatever the SELECT read
    assert len(reads) == ROWS - 1
    updates = [e for e in cap.events("items") if e["value"]["op"] == "u"]
    assert [u["value"]["after"]["name"] for u in updates] == ["in window"]


def test_a_delete_inside_the_window_drops_the_read_row(capture: Any) -> None:
    cap = _setup(capture)
    _run(cap, after_read=_once("DELETE FROM {t} WHERE id = 5", cap))
    assert 5 not in _reads(cap)


def test_a_key_change_inside_the_window_drops_both_keys(capture: Any) -> None:
    cap = _setup(capture)
    _run(cap, after_open=_once("UPDATE {t} SET id = 1005 WHERE id = 6", cap))
    reads = _reads(cap)
    assert 6 not in reads and 1005 not in reads
    ops = [
        (e["value"]["op"], e["key"]["id"]) for e in cap.events("items") if e["value"]["op"] != "r"
    ]
    assert ops == [("d", 6), ("c", 1005)]  # as Debezium: delete the old key, create the new


def test_an_insert_inside_the_window_is_streamed_not_read(capture: Any) -> None:
    cap = _setup(capture)
    _run(cap, after_read=_once("INSERT INTO {t} VALUES (7000, 'new', 0)", cap))
    assert 7000 not in _reads(cap)


def test_a_write_after_the_close_watermark_follows_the_read_row(capture: Any) -> None:
    cap = _setup(capture)
    _run(cap, after_close=_once("UPDATE {t} SET name = 'after close' WHERE id = 2", cap))
    events = [e for e in cap.events("items") if e["key"]["id"] == 2]
    # The output barrier: the READ row (emitted at the close watermark) comes first.
    assert [e["value"]["op"] for e in events] == ["r", "u"]
    assert events[0]["value"]["after"]["name"] == "item 2"
    assert events[1]["value"]["after"]["name"] == "after close"


def test_read_rows_sit_between_their_watermark_and_the_next_event(capture: Any) -> None:
    cap = _setup(capture)
    _run(cap, after_close=_once("UPDATE {t} SET n = -1 WHERE id = 40", cap))
    positions = [e["value"]["source"]["pos"] for e in cap.events("items")]
    assert positions == sorted(positions)  # file order is log order


class _StalledCommit:
    """An UPDATE of id 8 whose commit is in the WAL (so decoded and streamed) but waits for a
    synchronous standby that never answers: other sessions do not see it until ``release``
    cancels the wait (the commit stands)."""

    def __init__(self, cap: Any) -> None:
        self._cap = cap
        self._conn: psycopg.Connection[Any] | None = None
        self._thread: threading.Thread | None = None
        self.started = self.released = False

    def start(self) -> None:
        cap = self._cap
        conn = self._conn = psycopg.connect(cap.url, autocommit=True)
        pid = conn.info.backend_pid

        def commit_and_wait() -> None:
            # The cancel in ``release`` ends the wait with a warning (or an error).
            with contextlib.suppress(psycopg.Error):
                conn.execute("SET synchronous_commit = on")
                conn.execute(f'UPDATE "{cap.schema}".items SET name = %s WHERE id = 8', ("late",))

        self._thread = threading.Thread(target=commit_and_wait, daemon=True)
        self._thread.start()
        self.started = True
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            state = cap.sql("SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (pid,))
            if state and state[0][0] == "SyncRep":
                return
            time.sleep(0.05)
        raise AssertionError("the update never waited for the (absent) synchronous standby")

    def release(self) -> None:
        if self._conn is None or self.released:
            return
        self.released = True
        self._cap.sql("SELECT pg_cancel_backend(%s)", (self._conn.info.backend_pid,))
        assert self._thread is not None
        self._thread.join(10)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


@contextlib.contextmanager
def _no_synchronous_standby(cap: Any) -> Iterator[_StalledCommit]:
    """A synchronous standby is named that never connects, for as long as the test needs it
    (server-wide, briefly, as the synchronous-replication tests must); only sessions that
    ask for synchronous commit wait, the engine's do not."""
    database = cap.sql("SELECT current_database()")[0][0]
    stalled = _StalledCommit(cap)
    cap.sql(f'ALTER DATABASE "{database}" SET synchronous_commit = local')
    cap.sql("ALTER SYSTEM SET synchronous_standby_names = 'nobody_is_listening'")
    cap.sql("SELECT pg_reload_conf()")
    try:
        time.sleep(0.3)
        yield stalled
    finally:
        cap.sql("ALTER SYSTEM RESET synchronous_standby_names")
        cap.sql("SELECT pg_reload_conf()")
        cap.sql(f'ALTER DATABASE "{database}" RESET synchronous_commit')
        stalled.close()


@pytest.mark.parametrize("stall_at", ["first chunk", "before the signal"])
def test_an_invisible_commit_before_the_open_watermark_is_dropped(
    capture: Any, stall_at: str
) -> None:
    """PostgreSQL's WAL order is not visibility order: a transaction waiting for a
    synchronous standby is in the WAL (and decoded, and streamed) before our open watermark,
    but the chunk SELECT's snapshot does not see it. Without the visibility rule the READ row
    would carry the old value *after* the update's event, and the sink would keep it. The
    stall starts either just before the first open watermark or before the signal, even
    before the engine starts: then the transaction is open (and executing its COMMIT) as
    the engine starts, but the log brings its commit, so it leaves the doubt and the
    history of the log drops row 8 as in the first case (core.visibility, 2.; before, the
    first chunk was read again until the transaction became visible)."""
    cap = _setup(capture)
    with _no_synchronous_standby(cap) as stalled:

        def stall_in_first_chunk(task: ChunkTask) -> None:
            if task.number == 1 and not stalled.started:
                stalled.start()

        def release(task: ChunkTask) -> None:
            if task.number == 1:
                stalled.release()

        if stall_at == "first chunk":
            _run(cap, before_open=stall_in_first_chunk, after_read=release)
        else:
            stalled.start()
            _run(cap, after_read=release)
    assert 8 not in _reads(cap)  # dropped by the visibility rule
    updates = [e for e in cap.events("items") if e["value"]["op"] == "u"]
    assert [u["value"]["after"]["name"] for u in updates] == ["late"]


def test_an_invisible_commit_streamed_before_a_restart_is_not_read_stale(capture: Any) -> None:
    """Rule 4 across a restart: one run streams the stalled update and saves a position
    after it; the next run starts with the commit still invisible and snapshots the table.
    Its log resumes after the update, so nothing it reads tells it the update's keys: the
    snapshot it takes as it starts (core.visibility) lists the update's transaction as in
    progress, so the first chunk, which missed it, is read again (by then it is visible)
    instead of emitting the old row after the update's event."""
    cap = _setup(capture)
    with _no_synchronous_standby(cap) as stalled:
        stalled.start()
        assert cap.run() == 0  # streams the update (no snapshot yet) and saves past it
        updates = [e for e in cap.events("items") if e["value"]["op"] == "u"]
        assert [u["value"]["after"]["name"] for u in updates] == ["late"]
        still = cap.sql(f'SELECT name FROM "{cap.schema}".items WHERE id = 8')
        assert still == [("item 8",)]  # the commit is still invisible

        def release(task: ChunkTask) -> None:
            if task.number == 1:
                stalled.release()  # after the first read: its snapshot missed the update

        _run(cap, after_read=release)
    events = [e["value"] for e in cap.events("items") if e["key"]["id"] == 8]
    assert [(e["op"], e["after"]["name"]) for e in events] == [("u", "late"), ("r", "late")]


def test_a_session_idle_in_transaction_across_a_restart_does_not_hold_the_snapshot_up(
    capture: Any,
) -> None:
    """Rule 4 across a restart, its cost: a session that wrote and stays idle in its
    transaction while the engine restarts is open as the new run starts, and every chunk's
    snapshot misses it. It cannot be a commit before the log's resume point (it is not
    executing a COMMIT: core.visibility, 3.), so the snapshot goes on and finishes while the
    session stays open (before: its chunks were read again for as long as it lived), and
    the output converges once it commits."""
    cap = _setup(capture)
    items = f'"{cap.schema}".items'
    idle = psycopg.connect(cap.url)  # not autocommit: the UPDATE leaves it in a transaction
    try:
        idle.execute(f"UPDATE {items} SET name = 'pending' WHERE id = 5")
        assert cap.run() == 0  # the first run: nothing to snapshot, the session stays open
        cap.execute(f"{cap.schema}.items")
        assert cap.run(timeout=120) == 0  # the restart: the snapshot finishes all the same
        still = cap.sql(
            "SELECT state FROM pg_stat_activity WHERE pid = %s", (idle.info.backend_pid,)
        )
        assert still == [("idle in transaction",)]
        reads = _reads(cap)
        assert len(reads) == ROWS and reads[5]["name"] == "item 5"
        idle.commit()
    finally:
        idle.close()
    assert cap.run() == 0
    events = [e["value"] for e in cap.events("items") if e["key"]["id"] == 5]
    assert [(e["op"], e["after"]["name"]) for e in events] == [("r", "item 5"), ("u", "pending")]
    verdict = cap.verify("items")
    assert verdict.ok, verdict.render()


def test_a_json_key_updated_inside_the_window(capture: Any) -> None:
    cap = capture(chunk_size=10)
    docs = f'"{cap.schema}".docs'
    cap.sql(f"CREATE TABLE {docs} (doc jsonb PRIMARY KEY, n int)")
    cap.sql(f"ALTER TABLE {docs} REPLICA IDENTITY FULL")
    cap.sql(
        f"INSERT INTO {docs} SELECT jsonb_build_object('k', g), g FROM generate_series(1, 30) g"
    )
    cap.init()
    cap.execute(f"{cap.schema}.docs")
    done = threading.Event()

    def update(task: ChunkTask) -> None:
        if task.number == 1 and not done.is_set():
            done.set()
            cap.sql(f"UPDATE {docs} SET n = -1 WHERE doc = %s::jsonb", ('{"k": 3}',))

    assert cap.run(hooks=PhaseHooks(after_open=update)) == 0
    reads = [e["key"]["doc"] for e in cap.events("docs") if e["value"]["op"] == "r"]
    assert {"k": 3} not in reads and len(reads) == 29
    verdict = cap.verify("docs")
    assert verdict.ok, verdict.render()


def test_a_failing_chunk_fails_only_its_snapshot(capture: Any) -> None:
    cap = _setup(capture)
    # Chunks 1-4 read fine; chunk 5 (ids 41..50, beyond ROWS so use 35) divides by zero.
    cap.execute(f"{cap.schema}.items", filters=[f"{cap.schema}.items=100 / (id - 35) <> 0"])
    assert cap.run() == 2
    snapshot = cap.status()["snapshots"][0]
    assert snapshot["state"] == "failed"
    assert "division by zero" in snapshot["error"] and "items" in snapshot["error"]
    cap.sql(f'UPDATE "{cap.schema}".items SET n = 0 WHERE id = 1')
    assert cap.run() == 0  # the stream goes on after a failed snapshot
    assert any(e["value"]["op"] == "u" for e in cap.events("items"))

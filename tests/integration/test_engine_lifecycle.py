"""The engine's life around the snapshot: shape changes, the slot, the state lock."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from snapshotter.engine.workers import ChunkTask, PhaseHooks
from snapshotter.sources.postgres.slots import lsn_value


def _items(cap: Any, rows: int = 200) -> str:
    name = f'"{cap.schema}".items'
    cap.sql(f"CREATE TABLE {name} (id int PRIMARY KEY, name text NOT NULL)")
    cap.sql(f"ALTER TABLE {name} REPLICA IDENTITY FULL")
    cap.sql(f"INSERT INTO {name} SELECT g, 'item ' || g FROM generate_series(1, %s) g", (rows,))
    return name


def test_a_column_change_mid_snapshot_fails_that_snapshot_clearly(capture: Any) -> None:
    cap = capture(chunk_size=20)
    name = _items(cap)
    cap.init()
    altered = threading.Event()

    def alter(task: ChunkTask) -> None:
        if task.number == 2 and not altered.is_set():
            altered.set()
            cap.sql(f"ALTER TABLE {name} ADD COLUMN extra int")
            cap.sql(f"UPDATE {name} SET extra = 1 WHERE id = 1")  # the log re-announces it

    cap.execute(f"{cap.schema}.items")
    assert cap.run(hooks=PhaseHooks(after_open=alter)) == 2
    snapshot = cap.status()["snapshots"][0]
    assert snapshot["state"] == "failed"
    assert "columns changed" in snapshot["error"] and "added extra" in snapshot["error"]
    assert "execute-snapshot again" in snapshot["error"]
    # No READ row of the new shape was emitted; the stream went on (the update is there).
    reads = [e for e in cap.events("items") if e["value"]["op"] == "r"]
    assert all("extra" not in e["value"]["after"] for e in reads)
    assert any(e["value"]["op"] == "u" for e in cap.events("items"))
    # A new snapshot of the new shape works and converges.
    cap.execute(f"{cap.schema}.items")
    assert cap.run() == 0
    verdict = cap.verify("items")
    assert verdict.ok, verdict.render()


def _confirmed(cap: Any) -> int:
    rows = cap.sql(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
        (cap.slot,),
    )
    return lsn_value(rows[0][0])


def test_the_slot_advances_on_an_idle_and_on_an_uncaptured_busy_database(capture: Any) -> None:
    cap = capture()
    _items(cap, rows=5)
    cap.init()
    assert cap.run() == 0
    first = _confirmed(cap)
    # Traffic only in a table outside the publication: nothing for us, but WAL grows.
    cap.sql(f'CREATE TABLE "{cap.schema}".noise (n int)')
    cap.sql(f'INSERT INTO "{cap.schema}".noise SELECT generate_series(1, 20000)')
    end = lsn_value(cap.sql("SELECT pg_current_wal_flush_lsn()::text")[0][0])
    assert cap.run() == 0
    assert _confirmed(cap) >= end > first  # confirmed past WAL that had nothing for us


def _locked(path: Path) -> bool:
    """Whether some process holds a flock on ``path`` (Linux: /proc/locks names its inode)."""
    try:
        inode = path.stat().st_ino
    except FileNotFoundError:
        return False
    with open("/proc/locks") as locks:
        return any(
            line.split()[1] == "FLOCK" and line.split()[5].endswith(f":{inode}")
            for line in locks
            if len(line.split()) > 5
        )


def test_a_second_engine_on_the_same_state_is_refused_but_status_works(capture: Any) -> None:
    cap = capture()
    _items(cap)
    cap.init()
    first = cap.start()
    try:
        import time

        # The lock file is created before it is locked: wait for the lock itself (read
        # from /proc/locks, which takes no lock that could race the engine's).
        lock = cap.directory / "state" / "state.json.lock"
        deadline = time.monotonic() + 20
        while not _locked(lock):
            assert time.monotonic() < deadline, "the first engine never took the lock"
            time.sleep(0.05)
        assert cap.cli("run", "--until-caught-up") == 1  # refused, with a message
        assert cap.cli("status", "--json") == 0
    finally:
        assert first.stop() == 0


def test_a_value_python_cannot_hold_does_not_stop_the_stream(capture: Any) -> None:
    cap = capture()
    name = f'"{cap.schema}".times'
    cap.sql(f"CREATE TABLE {name} (id int PRIMARY KEY, at timestamptz)")
    cap.init()
    cap.sql(f"INSERT INTO {name} VALUES (1, 'infinity'), (2, '2024-01-02 03:04:05+00')")
    cap.sql(f"INSERT INTO {name} VALUES (3, '-infinity')")
    assert cap.run() == 0
    after = {e["key"]["id"]: e["value"]["after"]["at"] for e in cap.events("times")}
    assert after == {1: "infinity", 2: "2024-01-02T03:04:05Z", 3: "-infinity"}

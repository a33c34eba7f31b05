"""Signal-table cleanup (issue 15, item 6): the engine deletes its own watermark rows once
their window is over, in batches, during the snapshot and while idle; rows earlier runs left
behind (a crash) are swept at start; user signals always stay; a crash and resume still
converge. On both databases."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from typing import Any

import pytest

from snapshotter.engine.workers import ChunkTask, PhaseHooks
from tests.integration.test_convergence import (
    REPO,
    Source,
    _cli,
    qualified,
    source_named,
    state_of,
    wait_for,
)

pytestmark = pytest.mark.integration

ROWS = 1_000
CHUNK = 40  # 25 chunks
BATCH = 8  # rows per DELETE: 4 windows
WATERMARK_TYPES = ("snapshot-window-open", "snapshot-window-close")


@pytest.fixture(params=["postgres", "mysql"])
def source(request: pytest.FixtureRequest) -> Source:
    return source_named(request, request.param)


def _rows(source: Source, cap: Any) -> list[tuple[str, str]]:
    return [
        (str(i), str(t))
        for i, t in source.sql(cap, "SELECT id, type FROM {s}.debezium_signal ORDER BY id")
    ]


def _watermarks(source: Source, cap: Any) -> list[str]:
    return [i for i, t in _rows(source, cap) if t in WATERMARK_TYPES]


def _insert_row(source: Source, cap: Any, row_id: str, row_type: str, data: str = "{}") -> None:
    source.sql(
        cap,
        "INSERT INTO {s}.debezium_signal (id, type, data) VALUES (%s, %s, %s)",
        (row_id, row_type, data),
    )


def _user_rows(source: Source, cap: Any) -> list[tuple[str, str]]:
    """A stale watermark pair of an earlier run, and user rows that must stay: one that only
    looks like a watermark, a log signal."""
    stale = str(uuid.uuid4())
    _insert_row(source, cap, f"{stale}-open", "snapshot-window-open")
    _insert_row(source, cap, f"{stale}-close", "snapshot-window-close")
    kept = [
        ("ad-hoc-open", "snapshot-window-open"),  # not a watermark id: a user's row
        (f"{uuid.uuid4()}-open", "log"),  # a watermark id of another type
    ]
    data = {"log": '{"message": "kept"}', "snapshot-window-open": "{}"}
    for row_id, row_type in kept:
        _insert_row(source, cap, row_id, row_type, data[row_type])
    return kept


def test_watermark_rows_go_in_batches_during_the_snapshot_and_user_signals_stay(
    source: Source,
) -> None:
    cap = source.capture(chunk_size=CHUNK, extra_config=f"signal_cleanup_batch = {BATCH}")
    source.create(cap, "items", ROWS)
    cap.init()
    kept = _user_rows(source, cap)
    cap.execute(qualified(cap, "items"))
    user = [r for r in _rows(source, cap) if r[1] not in WATERMARK_TYPES]
    assert len(user) == 2  # the execute-snapshot signal and the log row
    seen: list[int] = []

    def count(task: ChunkTask) -> None:
        seen.append(len(_watermarks(source, cap)))

    assert cap.run(hooks=PhaseHooks(before_open=count)) == 0
    assert state_of(cap, "items") == "done"
    verdict = cap.verify("items")
    assert verdict.ok, verdict.render()
    chunks = len(seen)
    assert chunks >= ROWS // CHUNK
    # Deleted as the snapshot went (not only at the end): never more rows than a few batches
    # and the windows in flight hold, far fewer than two per chunk.
    print(f"\nwatermark rows before each chunk: {seen}")
    assert max(seen[5:]) <= 2 * BATCH + 6 * 2, seen
    assert seen[-1] < 2 * chunks, seen
    # Nothing left of this run's windows or of the earlier run's; every user row stays.
    assert _watermarks(source, cap) == ["ad-hoc-open"]
    remaining = _rows(source, cap)
    assert set(kept) <= set(remaining) and set(user) <= set(remaining)
    assert len(remaining) == 3
    # The deletes reached the log and were ignored: a run over them changes nothing.
    assert cap.run() == 0
    assert cap.verify("items").ok


def test_with_cleanup_off_rows_stay_and_turned_on_the_start_sweep_deletes_them(
    source: Source,
) -> None:
    """Rows the log will not show again (before the saved position) go by the sweep at
    start only: an open without its close (a crash between them) included."""
    cap = source.capture(chunk_size=CHUNK, extra_config="signal_cleanup = false")
    source.create(cap, "items", ROWS)
    cap.init()
    _insert_row(source, cap, f"{uuid.uuid4()}-open", "snapshot-window-open")
    cap.execute(qualified(cap, "items"))
    assert cap.run() == 0
    chunks = int(cap.status()["snapshots"][0]["chunks"])
    assert len(_watermarks(source, cap)) == 2 * chunks + 1
    config = cap.config_path.read_text(encoding="utf-8")
    cap.config_path.write_text(
        config.replace("signal_cleanup = false", f"signal_cleanup_batch = {BATCH}"),
        encoding="utf-8",
    )
    assert cap.run() == 0
    assert _watermarks(source, cap) == []
    assert [t for _, t in _rows(source, cap)] == ["execute-snapshot"]


def test_a_crash_leaves_rows_that_resume_sweeps_and_the_output_converges(
    source: Source,
) -> None:
    """SIGKILL right after a close watermark was seen (rows of windows in flight and of
    finished windows not yet deleted stay behind); ``resume`` deletes them (the replayed
    close watermarks end their windows, the start sweep takes the rest) while a writer
    changes the table, and the output converges."""
    cap = source.capture(chunk_size=CHUNK, extra_config=f"signal_cleanup_batch = {BATCH}")
    table = source.create(cap, "items", ROWS)
    cap.init()
    kept = _user_rows(source, cap)
    writer = source.writer(cap, table, ROWS, changes=None, seed=6, rate=200)
    with writer:
        wait_for(lambda: writer.total >= 20, "the writer to get going")
        cap.execute(qualified(cap, "items"))
        killed = subprocess.run(
            _cli(cap, "run", "--until-caught-up"),
            cwd=REPO,
            env={**os.environ, "SNAPSHOTTER_FAULTS": "window.close@15"},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert killed.returncode == -signal.SIGKILL, (killed.stdout + killed.stderr)[-3000:]
        left = _watermarks(source, cap)
        assert len(left) > 2, left  # the killed run's windows (and the earlier run's pair)
        resumed = subprocess.run(
            _cli(cap, "resume", "--until-caught-up"),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    assert cap.run(timeout=300) == 0
    assert state_of(cap, "items") == "done"
    verdict = cap.verify("items")
    assert verdict.ok, verdict.render()
    assert _watermarks(source, cap) == ["ad-hoc-open"]
    assert set(kept) <= set(_rows(source, cap))


def test_a_delete_the_database_refuses_is_said_once_and_the_snapshot_goes_on(
    request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    """The engine's user may lack DELETE on the signal table (here a trigger refuses it): a
    warning that says what to do, once; the rows stay; the snapshot is not affected."""
    source = source_named(request, "postgres")
    cap = source.capture(chunk_size=CHUNK, extra_config=f"signal_cleanup_batch = {BATCH}")
    source.create(cap, "items", ROWS)
    cap.init()
    source.sql(
        cap,
        "CREATE FUNCTION {s}.refuse() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'deletes are not allowed here'; END $$",
    )
    source.sql(
        cap,
        "CREATE TRIGGER refuse BEFORE DELETE ON {s}.debezium_signal "
        "FOR EACH ROW EXECUTE FUNCTION {s}.refuse()",
    )
    cap.execute(qualified(cap, "items"))
    with caplog.at_level("WARNING", logger="snapshotter.cleanup"):
        assert cap.run() == 0
    assert cap.verify("items").ok
    said = [r.getMessage() for r in caplog.records if r.name == "snapshotter.cleanup"]
    assert len(said) == 1, said
    assert "deletes are not allowed here" in said[0] and "signal_cleanup = false" in said[0]
    assert "DELETE" in said[0]
    chunks = int(cap.status()["snapshots"][0]["chunks"])
    assert len(_watermarks(source, cap)) == 2 * chunks

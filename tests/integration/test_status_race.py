"""``snapshotter status`` while an engine moves the state and the stream position: sampled
again and again during a snapshot under writes, it never says the position is lost.

Issue 26: status read the state, then the replication slot; the engine, meanwhile, saved a
newer state and confirmed its position to the slot, which then looked ahead of the state
("was dropped and created again ... run `snapshotter reset-stream`"), advice that throws
changes away. On PostgreSQL the slot is now read before the state (the engine confirms only
positions it saved); on MariaDB the state before the binlog files (a file a saved position
names exists by then), here with the binlog rotated while sampling; on both a warning is said
only if a second read finds one too.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from snapshotter.app.cli import main as cli_main
from snapshotter.engine.workers import PhaseHooks
from tests.integration.engine_harness import Capture
from tests.integration.test_convergence import qualified, source_named, wait_for

pytestmark = pytest.mark.integration

ROWS = 100_000
CHUNK = 100  # 1000 chunks, each held 0.05 s below: the snapshot outlasts the sampling
SAMPLES = 100


def sample_status(cap: Capture, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """``snapshotter status --json``, as the command runs it (in this process)."""
    capsys.readouterr()
    code = cli_main(["status", "-c", str(cap.config_path), "--json"])
    said = capsys.readouterr()
    assert code == 0, said.err
    report: dict[str, Any] = json.loads(said.out)
    return report


@pytest.mark.parametrize("db", ["postgres", "mysql"])
def test_status_sampled_during_a_snapshot_under_writes_never_says_the_position_is_lost(
    request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str], db: str
) -> None:
    src = source_named(request, db)
    # Checkpoints every 20 ms: the state and the slot move all the time.
    cap = src.capture(chunk_size=CHUNK, state_config="checkpoint_interval_ms = 20")
    table = src.create(cap, "items", ROWS)
    cap.init()
    engine = cap.start(hooks=PhaseHooks(after_read=lambda task: time.sleep(0.05)))
    try:
        with src.writer(cap, table, ROWS, changes=None, rate=200, seed=26) as writer:
            cap.execute(qualified(cap, table.name))
            state_file = cap.directory / "state" / "state.json"  # saved once the engine starts
            wait_for(
                lambda: (
                    state_file.exists()
                    and any(s["state"] == "running" for s in cap.status()["snapshots"])
                ),
                "the snapshot to run",
                engine=engine,
            )
            reports = []
            for n in range(SAMPLES):
                if db == "mysql" and n % 20 == 10:
                    cap.sql("FLUSH BINARY LOGS")  # a new binlog file while sampling
                reports.append(sample_status(cap, capsys))
            assert writer.total > 0
    finally:
        engine.stop()
    warned = [(n, r["warnings"]) for n, r in enumerate(reports) if r["warnings"]]
    assert warned == [], f"{len(warned)} of {SAMPLES} samples warned: {warned[:3]}"
    # The samples saw a moving engine: a running snapshot and many stream positions.
    running = sum(1 for r in reports if r["snapshots"][-1]["state"] == "running")
    positions = {r["stream"]["position"] for r in reports}
    assert running >= SAMPLES * 0.9, f"the snapshot ran during {running} samples only"
    assert len(positions) >= SAMPLES // 4, f"{len(positions)} stream positions only"

"""``resume`` with the Spark sink streams at once: batches the killed run staged and recorded
land first, in order, on the lander's thread, while the engine reads the log and stages newer
batches behind them. Real Spark (local mode), the real engine, PostgreSQL; the first run is a
process of its own, killed with SIGKILL while its landings are held back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

from snapshotter.sinks.spark.lander import Landed, Lander
from snapshotter.sinks.spark.staging import StagedBatch
from tests.integration.engine_harness import Capture
from tests.integration.test_convergence import catch_up, wait_for
from tests.integration.test_spark_sink import _CRASHING_RUN, REPO, _saved

pytestmark = pytest.mark.integration


def test_resume_streams_while_the_last_runs_batches_land(
    capture: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cap: Capture = capture(chunk_size=500, sink="spark")
    items = f'"{cap.schema}".items'
    cap.sql(f"CREATE TABLE {items} (id bigint PRIMARY KEY, name text)")
    cap.sql(f"ALTER TABLE {items} REPLICA IDENTITY FULL")
    cap.sql(f"INSERT INTO {items} SELECT g, 'n' || g FROM generate_series(1, 3000) g")
    cap.init()
    cap.execute(f"{cap.schema}.items")
    # A run whose landings never happen: batches are staged and recorded, then it is killed.
    proc = subprocess.Popen(
        [sys.executable, "-c", _CRASHING_RUN, "stage", str(cap.config_path)],
        cwd=cap.directory,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 180
        while _saved(cap).get("sink", {}).get("staged", 0) < 3:
            assert time.monotonic() < deadline, "the engine staged no batches within 180 s"
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            cap.sql(f"UPDATE {items} SET name = name || '+' WHERE id % 97 = 0", None)
            time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGKILL)
        _, said = proc.communicate(timeout=30)
    log = said.decode("utf-8", "replace")
    # The start message names Delta only when the format needs it (this one is parquet).
    assert "starting Spark (master local[2])" in log, log[-3000:]
    assert "with Delta Lake" not in log
    recorded = _saved(cap)["sink"]["staged"]

    # Resume, with every landing held at a gate: the stream must not wait for it.
    gate = threading.Event()
    landed: list[list[int]] = []
    real_land = Lander.land

    def gated_land(self: Lander, batches: Sequence[StagedBatch]) -> Landed:
        landed.append([b.seq for b in batches])
        gate.wait(120)
        return real_land(self, batches)

    monkeypatch.setattr(Lander, "land", gated_land)
    engine = cap.start()
    try:
        cap.sql(f"INSERT INTO {items} VALUES (100001, 'written during the resume')")
        # A newer batch is staged and recorded while the leftovers wait to land.
        wait_for(
            lambda: _saved(cap).get("sink", {}).get("staged", 0) > recorded and bool(landed),
            "a batch staged beside the held landing",
            timeout=120,
            engine=engine,
        )
        assert landed[0][0] == 1, landed  # the lander began with the oldest leftover
    finally:
        gate.set()
    assert engine.stop() == 0
    assert catch_up(cap) == 0
    order = [seq for call in landed for seq in call]
    assert order == sorted(order), landed  # landing order is staging (log) order
    assert not list(cap.config.staging_dir.glob("batch-*"))
    lander = cap.lander()
    changelog = lander.changelog(cap.table_id("items"))
    assert changelog is not None
    positions = [r["__pos"] for r in changelog.select("__pos").toArrow().to_pylist()]
    assert len(positions) == len(set(positions)), "an event landed twice"
    assert cap.landed_rows("items") == cap.source_rows("items")

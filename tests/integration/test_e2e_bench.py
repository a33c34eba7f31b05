"""bench/e2e_bench.py runs end to end at a tiny size on the real servers: both sources, the
counting, JSONL and Kafka sinks, the ticker run and the scale run, and its JSON and markdown
hold what the speed tables of docs/benchmarks.md are filled from.

The Spark sink is left out here: its session start alone is 10-20 s per engine run (the
bench starts one per Spark run), which would take this test well past a minute; the timing
proxy's Spark path (waiting for the landing of the staged batch) is unit-tested in
tests/unit/test_e2e_bench.py, and the Spark sink itself in test_spark_sink.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[2] / "bench" / "e2e_bench.py"


def test_e2e_bench_tiny_run(
    pg_url: str, mysql_url: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    out = tmp_path / "e2e.json"
    env = {
        **os.environ,
        "SNAPSHOTTER_PG_URL": pg_url,
        "SNAPSHOTTER_MYSQL_URL": mysql_url,
        "SNAPSHOTTER_KAFKA_BOOTSTRAP": kafka_bootstrap,
    }
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            *("--rows", "2000", "--rounds", "1", "--source", "both"),
            *("--sinks", "counting,jsonl,kafka", "--latency-sink", "counting"),
            *("--idle-seconds", "0.5", "--scale-rows", "4000", "--scale-sinks", "counting"),
            *("--json", str(out)),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert [s["kind"] for s in doc["sources"]] == ["postgres", "mysql"]
    for source in doc["sources"]:
        assert [r["sink"] for r in source["runs"]] == ["counting", "jsonl", "kafka"]
        for r in source["runs"] + source["scale"] + [source["latency"]]:
            assert r["seconds"] > 0 and r["engine_rss_mb"] > 0
            assert r["marks"]["first_read"] <= r["marks"]["acked"] <= r["seconds"]
        assert source["scale"][0]["rows"] == 4000
        assert len(source["latency"]["ticks"]) > 10
        assert source["plain"][0]["rows"] == 2000
    lines = [line for part in doc["summary"] for line in part]
    assert len(lines) == 2 * 4  # A and three sinks per source
    assert all(line["ratio"] > 0 for line in lines)
    assert "| PostgreSQL | snapshot → Kafka |" in proc.stdout
    assert "| MariaDB | during the snapshot | counting |" in proc.stdout
    assert proc.stdout.strip() == doc["markdown"].strip()

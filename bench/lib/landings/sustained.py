"""Sustained log throughput into each landing format: a writer commits updates of random keys
at a steady rate while ``snapshotter run`` lands them; what landed per second, how far behind
the source each event landed, and what files the tables hold afterwards.

    python bench/landing_bench.py sustained                      # 60 s per format, 1M rows
    python bench/landing_bench.py sustained --seconds 20 --rows 100000 --formats iceberg

One PostgreSQL table (``bench/lib/tables.py``), Spark in local mode (local[2]), the CLI in this
process. Per format: a snapshot lands the table (``run --until-caught-up``); then ``run``
while the writer updates ``--rate`` random rows a second in transactions of ``--per-commit``
for ``--seconds``; a few seconds after the writer stops the run gets SIGTERM (and closes as
it would in production: the closing compaction or maintenance included). Lag of an event: the
wall time its batch finished landing minus its source commit time (``__ts_ms``). Files: data
files and delete files (Iceberg deletion vectors and position deletes, Delta deletion
vectors) on disk under the table's landing path, old snapshots' included: what piles up.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

from bench.lib.runs import init_and_signal, run_config
from bench.lib.servers import package_version, service_url
from bench.lib.stats import percentile
from bench.lib.tables import TENANT_ROWS, Postgres

FORMATS = ("parquet", "delta", "iceberg")
TABLE = "bench_sustained"


class _Writer(threading.Thread):
    """Updates ``rate`` random rows a second, ``per_commit`` per transaction."""

    def __init__(self, db: Postgres, rows: int, rate: int, per_commit: int, seconds: float):
        super().__init__(daemon=True)
        self.db, self.rows, self.rate, self.per_commit, self.seconds = (
            db,
            rows,
            rate,
            per_commit,
            seconds,
        )
        self.updated = 0
        self.took = 0.0

    def run(self) -> None:
        rng = random.Random(7)
        name = self.db.name(TABLE)
        started = time.monotonic()
        with psycopg.connect(self.db.url, autocommit=False) as conn:
            while (elapsed := time.monotonic() - started) < self.seconds:
                ahead = self.updated / self.rate - elapsed
                if ahead > 0:
                    time.sleep(ahead)
                ids = [rng.randint(1, self.rows) for _ in range(self.per_commit)]
                keys = [(1 + (i - 1) // TENANT_ROWS, i) for i in ids]
                conn.execute(
                    f"UPDATE {name} SET score = coalesce(score, 0) + 1 "
                    "WHERE (tenant, id) IN (SELECT * FROM unnest(%s::int[], %s::bigint[]))",
                    ([t for t, _ in keys], [i for _, i in keys]),
                )
                conn.commit()
                self.updated += len(ids)
        self.took = time.monotonic() - started


def _files(path: Path) -> tuple[int, int]:
    """(data files, delete files) under ``path``."""
    data = deletes = 0
    for f in path.rglob("*"):
        name = f.name
        if name.endswith(".puffin") or name.startswith("deletion_vector_") or "-deletes" in name:
            deletes += 1
        elif name.endswith(".parquet") and "/metadata/" not in str(f):
            data += 1
    return data, deletes


def _one(args: argparse.Namespace, db: Postgres, work: Path, fmt: str) -> dict[str, Any]:
    from snapshotter.app.cli import main as cli
    from snapshotter.sinks.spark import lander as lander_module

    sink = {"kind": "spark", "format": fmt}
    run, cfg = run_config(db, work, TABLE, sink, {"master": "local[2]"})
    init_and_signal(cfg, db, TABLE)
    assert cli(["run", "-c", cfg, "--until-caught-up"]) == 0

    landed_at: dict[int, float] = {}  # batch -> wall time its landing finished
    real_land = lander_module.Lander.land

    def land(self: Any, batches: Sequence[Any]) -> Any:
        out = real_land(self, batches)
        now = time.time()
        for batch in batches:
            landed_at[batch.seq] = now
        return out

    writer = _Writer(db, args.rows, args.rate, args.per_commit, args.seconds)

    def stop_later() -> None:
        writer.join()
        time.sleep(args.grace)
        os.kill(os.getpid(), signal.SIGTERM)

    lander_module.Lander.land = land  # type: ignore[method-assign]
    try:
        writer.start()
        threading.Thread(target=stop_later, daemon=True).start()
        cli(["run", "-c", cfg])
    finally:
        lander_module.Lander.land = real_land  # type: ignore[method-assign]
    from snapshotter.config import load_config
    from snapshotter.sinks.spark.session import spark_session

    config = load_config(cfg)
    lander = lander_module.Lander(
        spark_session(config.spark), config.sink.path or "", config.sink.format
    )
    table = lander.tables()[0]
    changelog = lander.changelog(table)
    assert changelog is not None
    rows = changelog.where("__op != 'r'").select("__batch", "__ts_ms").collect()
    lags = [
        landed_at[r["__batch"]] - r["__ts_ms"] / 1000 for r in rows if r["__batch"] in landed_at
    ]
    data, deletes = _files(run / "lake")
    cli(["teardown", "-c", cfg, "--yes"])
    shutil.rmtree(run, ignore_errors=True)
    return {
        "written": writer.updated / writer.took,
        "landed": len(lags) / writer.took,
        "p50": percentile(lags, 50),
        "p99": percentile(lags, 99),
        "data": data,
        "deletes": deletes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=int, default=2000, help="rows updated per second")
    parser.add_argument("--per-commit", type=int, default=10)
    parser.add_argument("--grace", type=float, default=10.0, help="seconds before SIGTERM")
    parser.add_argument("--formats", nargs="+", choices=FORMATS, default=list(FORMATS))
    parser.add_argument("--url", help="PostgreSQL URL (else scripts/services)")
    args = parser.parse_args(argv)

    db = Postgres(
        service_url("postgres", "SNAPSHOTTER_PG_URL", args.url), f"ls_{uuid.uuid4().hex[:8]}"
    )
    work = Path(tempfile.mkdtemp(prefix="sustained-bench-"))
    results = {}
    try:
        db.create()
        db.load(TABLE, args.rows)
        for fmt in args.formats:
            results[fmt] = _one(args, db, work, fmt)
            print(f"{fmt}: {results[fmt]}", file=sys.stderr)
    finally:
        db.drop()
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"\n{args.rows} rows; a writer updating {args.rate} random rows/s ({args.per_commit} per "
        f"commit) for {args.seconds:.0f} s; pyspark {package_version('pyspark')}, local[2]\n"
    )
    print(
        "| format | written rows/s | landed events/s | lag p50 s | lag p99 s | data files "
        "| delete files |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for fmt, r in results.items():
        print(
            f"| {fmt} | {r['written']:.0f} | {r['landed']:.0f} | {r['p50']:.1f} | "
            f"{r['p99']:.1f} | {r['data']} | {r['deletes']} |"
        )
    return 0

"""The landed table per format (parquet, delta, iceberg): what a snapshot costs against a plain
copy, and whether keeping ``current`` exact costs the change or the table, in one run.

    python bench/landing_bench.py formats                        # 1M and 4M rows, 3 rounds
    python bench/landing_bench.py formats --sizes 100000 400000 --rounds 1 --formats parquet iceberg

One PostgreSQL table per size (``bench/lib/tables.py``), Spark in local mode (local[2]), the CLI run
in this process (one Spark session for every line: no line pays for Spark's start). Per round,
sizes and formats interleaved:

* A: the whole table read and written with pyarrow (the baseline), measured in that round.
* snapshot: ``init``, ``execute-snapshot``, ``run --until-caught-up`` into a fresh lake.
* change, twice: ``--changed`` rows updated (the same number at every size), then ``run
  --until-caught-up``: the landing and what keeps ``current`` exact (Parquet: the closing
  compaction, the first one bucketing the snapshot's files; Delta and Iceberg: their merge
  and maintenance). First *spread*: every (size / changed)-th key, so every file of the table
  holds changed keys; then *recent*: the ``--changed`` highest keys (the rows an application
  mostly updates). Time at the largest size over time at the smallest is the scaling line:
  the issue asks for <= 1.3.

Markdown on stdout: rows/s as a ratio to A per format and size, and the scaling line.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.lib.runs import init_and_signal, run_config
from bench.lib.servers import package_version, service_url
from bench.lib.tables import Postgres

FORMATS = ("parquet", "delta", "iceberg")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 4_000_000])
    parser.add_argument("--changed", type=int, default=10_000, help="rows updated per size")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--formats", nargs="+", choices=FORMATS, default=list(FORMATS))
    parser.add_argument("--url", help="PostgreSQL URL (else scripts/services)")
    args = parser.parse_args(argv)

    from snapshotter.app.cli import main as cli
    from snapshotter.config import SparkConfig
    from snapshotter.sinks.spark.session import spark_session

    db = Postgres(
        service_url("postgres", "SNAPSHOTTER_PG_URL", args.url), f"lb_{uuid.uuid4().hex[:8]}"
    )
    work = Path(tempfile.mkdtemp(prefix="landing-bench-"))
    tables = {size: f"bench_{size}" for size in args.sizes}
    a: dict[int, list[float]] = {size: [] for size in args.sizes}
    snap: dict[tuple[str, int], list[float]] = {}
    change: dict[tuple[str, int], list[float]] = {}  # spread
    recent: dict[tuple[str, int], list[float]] = {}
    try:
        db.create()
        for size, table in tables.items():
            db.load(table, size)
        spark_session(SparkConfig(master="local[2]"), delta=True)
        for round_ in range(args.rounds):
            for size, table in tables.items():
                a[size].append(db.plain_read(table, work / "plain.parquet").seconds)
                every = max(1, size // args.changed)
                for fmt in args.formats:
                    sink = {"kind": "spark", "format": fmt}
                    run, cfg = run_config(db, work, table, sink, {"master": "local[2]"})
                    init_and_signal(cfg, db, table)
                    started = time.perf_counter()
                    assert cli(["run", "-c", cfg, "--until-caught-up"]) == 0
                    snap.setdefault((fmt, size), []).append(time.perf_counter() - started)
                    db.sql(f"UPDATE {db.name(table)} SET score = score + 1 WHERE id %% {every} = 0")
                    started = time.perf_counter()
                    assert cli(["run", "-c", cfg, "--until-caught-up"]) == 0
                    change.setdefault((fmt, size), []).append(time.perf_counter() - started)
                    db.sql(
                        f"UPDATE {db.name(table)} SET score = score + 1 "
                        f"WHERE id > {size - args.changed}"
                    )
                    started = time.perf_counter()
                    assert cli(["run", "-c", cfg, "--until-caught-up"]) == 0
                    recent.setdefault((fmt, size), []).append(time.perf_counter() - started)
                    cli(["teardown", "-c", cfg, "--yes"])
                    shutil.rmtree(run, ignore_errors=True)
                    print(
                        f"round {round_ + 1} {fmt} {size}: A {a[size][-1]:.1f} s, snapshot "
                        f"{snap[fmt, size][-1]:.1f} s, change {change[fmt, size][-1]:.1f} s, "
                        f"recent {recent[fmt, size][-1]:.1f} s",
                        file=sys.stderr,
                    )
    finally:
        db.drop()
        shutil.rmtree(work, ignore_errors=True)

    small, large = min(args.sizes), max(args.sizes)
    print(
        f"\nsizes {', '.join(map(str, args.sizes))} rows, {args.changed} updated after each "
        f"snapshot, {args.rounds} round(s); pyspark {package_version('pyspark')}, delta-spark "
        f"{package_version('delta-spark')}, local[2]\n"
    )
    print(
        "| format | rows | snapshot s | snapshot rows/s, ratio to A | change spread s "
        "| change recent s |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for fmt in args.formats:
        for size in args.sizes:
            ratio = statistics.median(
                ax / s for ax, s in zip(a[size], snap[fmt, size], strict=True)
            )
            print(
                f"| {fmt} | {size} | {statistics.median(snap[fmt, size]):.1f} | {ratio:.2f}x | "
                f"{statistics.median(change[fmt, size]):.1f} | "
                f"{statistics.median(recent[fmt, size]):.1f} |"
            )
    if small != large:
        print(f"\n| format | time at {large} / time at {small}: spread | recent |")
        print("|---|---:|---:|")
        for fmt in args.formats:
            scales = [
                statistics.median(
                    b / s for s, b in zip(times[fmt, small], times[fmt, large], strict=True)
                )
                for times in (change, recent)
            ]
            print(f"| {fmt} | {scales[0]:.2f} | {scales[1]:.2f} |")
    return 0

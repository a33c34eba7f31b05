"""What an exact ``current/`` for plain Spark readers costs: the compaction the Spark sink now
runs when a run ends (and after compact_idle_s of quiet), against the same catch-up without
it, with a plain pyarrow copy of the table as the baseline, in one run.

    python bench/landing_bench.py current-state         # 1M rows, 1% changed, 3 rounds
    python bench/landing_bench.py current-state --rows 100000 --rounds 1

One PostgreSQL table (``bench/lib/tables.py``), Spark in local mode (local[2]); per round:

* A: the whole table read and written with pyarrow (the baseline).
* snapshot: ``init``, ``execute-snapshot``, ``run --until-caught-up`` into a fresh lake: the
  first landing (READ rows of new keys are appended to current/: no compaction).
* catch-up: ``--changed`` of the rows updated (a tail below compact_ratio, which issue 19's
  plain reader missed), then ``run --until-caught-up``; its time is split into the landing
  and the closing compaction (from the compaction's log line): the compaction is the price
  of exactness. It is the table's first bucketing (issue 27), so it writes every bucket.
* steady: as many other rows updated, then ``run --until-caught-up`` again: the closing
  compaction of a bucketed table rewrites only the buckets the changed keys fall in (how
  many of how many is printed): the line that scales with the change, not the table, as
  long as the changed keys touch few of the buckets (``--buckets``: 0, the default, chooses
  from the table's size).

The Spark session starts before the rounds (no line pays for it). Markdown on stdout.
"""

from __future__ import annotations

import argparse
import logging
import re
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from bench.lib.runs import init_and_signal, run_config
from bench.lib.servers import service_url
from bench.lib.stats import log_round
from bench.lib.tables import Postgres

TABLE = "bench_items"
_COMPACTED = re.compile(
    r"current state compacted at batch \d+: (\d+) of (\d+) buckets rewritten.* in ([0-9.]+) s"
)


class _Compactions(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.seconds: list[float] = []
        self.buckets = ""  # "<rewritten>/<of>" of the last compaction

    def emit(self, record: logging.LogRecord) -> None:
        m = _COMPACTED.search(record.getMessage())
        if m:
            self.seconds.append(float(m.group(3)))
            self.buckets = f"{m.group(1)}/{m.group(2)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--changed", type=float, default=0.01, help="share of rows updated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--url", help="PostgreSQL URL (else scripts/services)")
    parser.add_argument("--buckets", type=int, default=0, help="[sink] buckets (0: by size)")
    args = parser.parse_args(argv)

    from snapshotter.app.cli import main as cli
    from snapshotter.config import SparkConfig
    from snapshotter.sinks.spark.session import spark_session

    db = Postgres(
        service_url("postgres", "SNAPSHOTTER_PG_URL", args.url), f"cb_{uuid.uuid4().hex[:8]}"
    )
    work = Path(tempfile.mkdtemp(prefix="current-bench-"))
    compactions = _Compactions()
    compacting = logging.getLogger("snapshotter.sinks.spark.formats.parquet")
    compacting.addHandler(compactions)
    compacting.setLevel(logging.INFO)
    every = max(1, round(1 / args.changed))
    lines: dict[str, list[float]] = {
        "A": [],
        "snapshot": [],
        "catch-up": [],
        "compaction": [],
        "steady": [],
        "steady compaction": [],
    }
    touched = ""
    try:
        db.create()
        db.load(TABLE, args.rows)
        spark_session(SparkConfig(master="local[2]"))
        for round_ in range(args.rounds):
            lines["A"].append(db.plain_read(TABLE, work / "plain.parquet").seconds)
            sink = {"kind": "spark", "buckets": args.buckets}
            run, cfg = run_config(db, work, TABLE, sink, {"master": "local[2]"})
            init_and_signal(cfg, db, TABLE)
            started = time.perf_counter()
            assert cli(["run", "-c", cfg, "--until-caught-up"]) == 0
            lines["snapshot"].append(time.perf_counter() - started)
            db.sql(f"UPDATE {db.name(TABLE)} SET score = -1 WHERE id %% {every} = 0")
            compactions.seconds.clear()
            started = time.perf_counter()
            assert cli(["run", "-c", cfg, "--until-caught-up"]) == 0
            lines["catch-up"].append(time.perf_counter() - started)
            lines["compaction"].append(sum(compactions.seconds))
            db.sql(f"UPDATE {db.name(TABLE)} SET score = -2 WHERE id %% {every} = 1 %% {every}")
            compactions.seconds.clear()
            started = time.perf_counter()
            assert cli(["run", "-c", cfg, "--until-caught-up"]) == 0
            lines["steady"].append(time.perf_counter() - started)
            lines["steady compaction"].append(sum(compactions.seconds))
            touched = compactions.buckets
            cli(["teardown", "-c", cfg, "--yes"])
            shutil.rmtree(run, ignore_errors=True)
            log_round(round_, lines)
    finally:
        db.drop()
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in lines.items()}
    a = lines["A"]
    changed = args.rows // every
    print(f"\n{args.rows} rows, {changed} updated after the snapshot, {args.rounds} round(s)\n")
    print("| line | seconds (median) | ratio of A's time (median of rounds) |")
    print("|---|---:|---:|")
    for key, label in (
        ("A", "A: plain read, pyarrow Parquet of the whole table"),
        ("snapshot", "snapshot landed (appends, no compaction)"),
        ("catch-up", f"catch-up of {changed} updates, with the closing compaction"),
        ("compaction", "  of which the closing compaction (the first bucketing: all)"),
        ("steady", f"catch-up of {changed} other updates, the table bucketed"),
        ("steady compaction", f"  of which the closing compaction ({touched} buckets)"),
    ):
        ratio = statistics.median(s / ax for ax, s in zip(a, lines[key], strict=True))
        print(f"| {label} | {med[key]:.2f} | {ratio:.2f}x |")
    return 0

"""The log path's speed (stream and backlog) and a cProfile of one snapshot.

    python bench/log_bench.py stream [--rows N] [--updates U] [--batch B] [--chunk-size C]
                                     [--url URL] [--profile] [--profile-top K]

The end-to-end comparison (a plain read against snapshots into every sink, both sources,
peak RSS, stream latency during a snapshot) is ``bench/e2e_bench.py``. It loads N
rows into a fresh schema (``items``, bigint key), then measures:

1. the log stream: the engine runs in a thread with a counting sink while a writer commits
   ``--updates`` single-row UPDATEs, ``--batch`` per transaction; from the first write to the
   last event counted (it cannot beat the writer: the note gives the writer's own rate);
2. the log backlog: the same UPDATEs committed before the engine starts; from its start to
   the last event counted: the log path's own speed;
3. with ``--profile``: one snapshot of the table into a counting sink under cProfile
   (``run_engine(until_caught_up=True)``), the top entries per thread.

Every measurement gets its own slot, publication and state directory; slots, publications
and the schema are dropped at the end, also on error.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

from bench.lib.counting import CountingSink
from bench.lib.inprocess import (
    DEFAULT_CHUNK_SIZE,
    ENGINE_TIMEOUT_S,
    TABLE,
    Capture,
    cleanup,
    load_table,
    machine,
    profiled_snapshot,
    start_engine,
    wait_for,
)
from bench.lib.servers import pg_url
from bench.lib.stats import Result
from snapshotter.core.events import Op

# --------------------------------------------------------------------------- results


# --------------------------------------------------------------------------- setup


# --------------------------------------------------------------------------- baselines


# --------------------------------------------------------------------------- engine runs


def update_statement(schema: str) -> str:
    return f'UPDATE "{schema}"."{TABLE}" SET amount = amount + 1 WHERE id = %s'


def write_updates(
    conn: psycopg.Connection[Any], schema: str, rows: int, n: int, batch: int
) -> None:
    """``n`` single-row UPDATEs (ids spread over the table), ``batch`` per transaction,
    pipelined by ``executemany``."""
    statement = update_statement(schema)
    with conn.cursor() as cur:
        for first in range(0, n, batch):
            ids = [((i * 7919) % rows) + 1 for i in range(first, min(first + batch, n))]
            with conn.transaction():
                cur.executemany(statement, [(i,) for i in ids])


def check_counts(what: str, sink: CountingSink, updates: int, code: int) -> None:
    if code != 0:
        raise RuntimeError(f"{what}: the engine exited {code}")
    if sink.counts[Op.UPDATE] != updates or sink.total != updates:
        raise RuntimeError(f"{what}: counted {dict(sink.counts)}, wanted {updates} updates")


def log_stream(capture: Capture, table_rows: int, updates: int, batch: int) -> Result:
    """The engine streams into a counting sink while the writer commits; from the first
    write to the last event counted. The note gives the writer's own rate: the engine
    cannot be faster than the writer here (the backlog row shows how fast it can go)."""
    what = "log stream → counting sink"
    capture.init()
    sink = CountingSink()
    engine = start_engine(capture.config, sink)
    code = -1
    try:
        with psycopg.connect(capture.url) as conn:
            # One warm-up change proves the engine is streaming before the clock starts.
            with conn.transaction():
                conn.execute(update_statement(capture.schema), (1,))
            wait_for(engine, lambda: sink.total >= 1, 120.0, "the warm-up event")
            sink.counts.clear()
            started = time.perf_counter()
            write_updates(conn, capture.schema, table_rows, updates, batch)
            written = time.perf_counter()
        last = wait_for(engine, lambda: sink.total >= updates, ENGINE_TIMEOUT_S, "log events")
    finally:
        code = engine.stop()
    check_counts(what, sink, updates, code)
    write_s = written - started
    note = (
        f"{updates:,} single-row UPDATEs, {batch} per commit; the writer alone took "
        f"{write_s:.2f} s ({updates / write_s:,.0f}/s), the last event arrived "
        f"{last - written:.2f} s after the last commit"
    )
    return Result(what, updates, last - started, note)


def log_backlog(capture: Capture, table_rows: int, updates: int, batch: int) -> Result:
    """The same UPDATEs committed before the engine starts; from the engine's start to the
    last event counted: the log path's own speed, with no writer to wait for."""
    what = "log backlog → counting sink"
    capture.init()
    with psycopg.connect(capture.url) as conn:
        write_updates(conn, capture.schema, table_rows, updates, batch)
    sink = CountingSink()
    started = time.perf_counter()
    engine = start_engine(capture.config, sink)
    code = -1
    try:
        last = wait_for(engine, lambda: sink.total >= updates, ENGINE_TIMEOUT_S, "log events")
    finally:
        code = engine.stop()
    check_counts(what, sink, updates, code)
    note = "the same UPDATEs, committed before the engine started (includes its start-up)"
    return Result(what, updates, last - started, note)


# --------------------------------------------------------------------------- MySQL


# --------------------------------------------------------------------------- profile


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="table rows (1,000,000)")
    parser.add_argument(
        "--chunk-size",
        type=int,
        default=None,
        help=f"engine chunk size (default: the config's default, {DEFAULT_CHUNK_SIZE})",
    )
    parser.add_argument("--url", help="PostgreSQL URL (default: $SNAPSHOTTER_PG_URL or services)")
    parser.add_argument("--updates", type=int, default=50_000, help="log stream UPDATEs (50,000)")
    parser.add_argument("--batch", type=int, default=1000, help="UPDATEs per commit (1000)")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="afterwards, profile one snapshot → counting sink with cProfile",
    )
    parser.add_argument("--profile-top", type=int, default=15, help="entries per thread (15)")
    args = parser.parse_args(argv)
    counts = [args.rows, args.updates, args.batch]
    if args.chunk_size is not None:
        counts.append(args.chunk_size)
    if min(counts) < 1:
        parser.error("--rows, --chunk-size, --updates and --batch must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    chunk_size = args.chunk_size or DEFAULT_CHUNK_SIZE
    url = pg_url(args.url)
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    captures: list[Capture] = []
    results: list[Result] = []
    profile_text = ""
    with tempfile.TemporaryDirectory(prefix="snapshotter-bench-") as tmp_name:
        tmp = Path(tmp_name)

        def new_capture(name: str) -> Capture:
            capture = Capture(url, schema, tmp / name, chunk_size)
            captures.append(capture)
            return capture

        try:
            print(f"loading {args.rows:,} rows into {schema}.{TABLE} ...", file=sys.stderr)
            load_table(url, schema, args.rows)
            for name, measure in (("stream", log_stream), ("backlog", log_backlog)):
                print(f"log {name} ...", file=sys.stderr)
                capture = new_capture(name)
                results.append(measure(capture, args.rows, args.updates, args.batch))
                capture.drop()
            if args.profile:
                print("profiled snapshot ...", file=sys.stderr)
                capture = new_capture("profile")
                profile_text = profiled_snapshot(capture, args.rows, args.profile_top)
                capture.drop()
        finally:
            cleanup(url, schema, captures)

    print(f"## snapshotter log path: {args.updates:,} UPDATEs on a {args.rows:,}-row table\n")
    print("\n".join(machine(url)))
    print()
    lines = ["| what | events | seconds | events/s |", "|---|---:|---:|---:|"]
    for r in results:
        assert r.rows is not None and r.seconds is not None
        lines.append(f"| {r.what} | {r.rows:,} | {r.seconds:.2f} | {r.rows / r.seconds:,.0f} |")
    print("\n".join(lines))
    print()
    print("\n".join(f"- {r.what}: {r.note}" for r in results if r.note))
    if profile_text:
        print()
        print(profile_text)
    return 0

"""A Spanner snapshot against a plain read of the same table, on the emulator.

    python bench/read_bench.py spanner [--rows 100000] [--rounds 3] [--heartbeat-ms 1000]

One database (GoogleSQL) with ``items`` (5 columns), the signal table and a change stream
(NEW_ROW_AND_OLD_VALUES). Interleaved rounds, each:

* A: one strong read of the whole table (``SELECT *``) into a pyarrow table, written as
  Parquet: the plain copy a user could make instead;
* S: ``snapshotter init``, ``execute-snapshot``, then the engine run until caught up (the
  stream idle), sink JSONL: rows/s of the snapshot from the signal to caught up.

Prints the medians and S as a multiple of A's rows/s. The emulator is one process on this
machine, so the numbers say where the engine's time goes, not what Cloud Spanner does: a
change stream's latency there is a network round trip and ``heartbeat_ms``.
Needs the emulator: ``scripts/services up spanner`` (SNAPSHOTTER_SPANNER_EMULATOR_HOST).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from bench.lib.configs import toml_text

PROJECT, INSTANCE = "test-project", "test-instance"
DDL = [
    "CREATE TABLE items (id INT64 NOT NULL, region STRING(16) NOT NULL, qty INT64, "
    "note STRING(MAX), price NUMERIC) PRIMARY KEY (id, region)",
    "CREATE TABLE debezium_signal (id STRING(42) NOT NULL, type STRING(32) NOT NULL, "
    "data STRING(MAX)) PRIMARY KEY (id)",
    "CREATE CHANGE STREAM cs FOR items, debezium_signal "
    "OPTIONS (value_capture_type = 'NEW_ROW_AND_OLD_VALUES')",
]


def database(host: str, rows: int) -> Any:
    from decimal import Decimal

    from google.auth.credentials import AnonymousCredentials
    from google.cloud import spanner

    os.environ["SPANNER_EMULATOR_HOST"] = host
    client = spanner.Client(project=PROJECT, credentials=AnonymousCredentials())
    db = client.instance(INSTANCE).database(f"bench{uuid.uuid4().hex[:8]}", ddl_statements=DDL)
    db.create().result(120)
    for start in range(0, rows, 2000):
        batch = [
            (i, ("eu", "us", "ap")[i % 3], i * 7, f"note {i}", Decimal(i) / 100)
            for i in range(start, min(rows, start + 2000))
        ]
        with db.batch() as b:
            b.insert("items", ("id", "region", "qty", "note", "price"), batch)
    return db


def plain_read(db: Any, out: Path) -> float:
    started = time.perf_counter()
    with db.snapshot() as snap:
        result = snap.execute_sql("SELECT id, region, qty, note, price FROM items")
        rows = list(result)
    table = pa.table(
        {
            "id": [r[0] for r in rows],
            "region": [r[1] for r in rows],
            "qty": [r[2] for r in rows],
            "note": [r[3] for r in rows],
            "price": [str(r[4]) for r in rows],
        }
    )
    pq.write_table(table, out)
    return time.perf_counter() - started


def snapshot(db: Any, host: str, work: Path, heartbeat_ms: int) -> float:
    from snapshotter.app.cli import main as cli
    from snapshotter.app.runner import StopFlag, run_engine
    from snapshotter.config import load_config

    work.mkdir()
    config = work / "s.toml"
    source = {
        "kind": "spanner",
        "url": f"spanner:///{db.name}",
        "change_stream": "cs",
        "emulator_host": host,
        "heartbeat_ms": heartbeat_ms,
        "tables": ["items"],
    }
    sink = {"kind": "jsonl", "path": "events.jsonl"}
    config.write_text(
        toml_text({"source": source, "sink": sink, "state": {"dir": "state"}}), encoding="utf-8"
    )
    assert cli(["init", "-c", str(config)]) == 0
    started = time.perf_counter()
    assert cli(["signal", "execute-snapshot", "public.items", "-c", str(config)]) == 0
    code = run_engine(load_config(config), until_caught_up=True, stop=StopFlag())
    assert code == 0
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--heartbeat-ms", type=int, default=1000)
    args = parser.parse_args(argv)
    host = os.environ.get("SNAPSHOTTER_SPANNER_EMULATOR_HOST", "127.0.0.1:29010")
    db = database(host, args.rows)
    a: list[float] = []
    s: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.rounds):
            a.append(plain_read(db, Path(tmp) / f"a{n}.parquet"))
            s.append(snapshot(db, host, Path(tmp) / f"s{n}", args.heartbeat_ms))
            print(f"round {n + 1}: A {a[-1]:.2f} s, snapshot {s[-1]:.2f} s", flush=True)
    db.drop()
    a_rate, s_rate = args.rows / statistics.median(a), args.rows / statistics.median(s)
    print(
        f"{args.rows} rows, {args.rounds} rounds, medians: A {a_rate:,.0f} rows/s, snapshot "
        f"{s_rate:,.0f} rows/s = {s_rate / a_rate:.2f}x A (heartbeat_ms {args.heartbeat_ms})"
    )
    return 0

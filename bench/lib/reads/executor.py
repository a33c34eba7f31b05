"""Chunk reads in the engine against chunk reads on Spark executors, on a Spark cluster, in
one run, with Spark's own JDBC copy as the peer.

    python bench/read_bench.py executor                              # defaults below
    python bench/read_bench.py executor --rows 100000 --rounds 1     # a quick check

Defaults: ``--rows 4000000 --rounds 3 --executors 2 --source postgres``; the cluster is
``$SNAPSHOTTER_STANDALONE_MASTER`` or ``scripts/services up spark`` (a master and two 1-core
workers on this machine). One table (``bench/lib/tables.py``: six columns, PRIMARY KEY (tenant,
id)), then ``--rounds`` interleaved rounds, each:

* A: the whole table read in one go and written with pyarrow (``tables.py``'s plain read): the
  baseline every line is a ratio to, per round, reported as the median over rounds.
* engine: ``snapshotter run --until-caught-up`` of an execute-snapshot signal, spark sink
  landing on the cluster, chunks read by the engine (``[source] read_parallelism = 2``).
* executors: the same with ``[snapshot] executors = N``: each window read by N Spark tasks
  on the cluster's executors (``--executor-chunk-size`` rows each, default 131072: a window
  is one Spark job to read and one to stage, whose fixed cost larger windows pay less often).
* JDBC: ``spark.read.jdbc(..., column="id", numPartitions=N).write.parquet`` on the same
  cluster and session: what a Spark user writes for a one-off copy (no log, no consistency).

Both snapshot lines are timed from the signal to the engine's exit: every row read, landed
(changelog and current state, compacted at the end) and the log caught up. One Spark session
serves all (it starts before the rounds, so no line pays for it). Markdown on stdout, JSON
to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.lib.runs import init_and_signal, run_config
from bench.lib.servers import service_url
from bench.lib.stats import log_round
from bench.lib.tables import MySql, Postgres, SourceDb

TABLE = "bench_items"


def cluster_master(given: str | None) -> str:
    """``--master``, else ``$SNAPSHOTTER_STANDALONE_MASTER``, else ``scripts/services up
    spark``."""
    return service_url("spark", "SNAPSHOTTER_STANDALONE_MASTER", given)


def spark_conf(kind: str) -> dict[str, str]:
    from snapshotter.sinks.spark.jars import jdbc_jar

    return {"spark.jars": str(jdbc_jar("postgres" if kind == "postgres" else "mysql"))}


def snapshot(db: SourceDb, work: Path, master: str, executors: int, chunk: int) -> float:
    """Seconds from the execute-snapshot signal to ``run --until-caught-up``'s end."""
    from snapshotter.app.cli import main

    sink = {"kind": "spark", "compact_min_rows": 0}
    spark = {"master": master, "conf": spark_conf(db.kind)}
    source = {"chunk_size": chunk}
    snapshot = {"executors": executors}
    run, cfg = run_config(db, work, TABLE, sink, spark, source, snapshot=snapshot)
    init_and_signal(cfg, db, TABLE)
    started = time.perf_counter()
    verbose = ["-v"] if os.environ.get("EXECUTOR_BENCH_VERBOSE") else []
    assert main(["run", "-c", cfg, "--until-caught-up", *verbose]) == 0
    seconds = time.perf_counter() - started
    main(["teardown", "-c", cfg, "--yes"])
    shutil.rmtree(run, ignore_errors=True)
    return seconds


def jdbc_copy(db: SourceDb, work: Path, partitions: int, rows: int) -> float:
    import sqlalchemy as sa

    spark = spark_session_of(db, work)
    parsed = sa.make_url(db.url)
    host, port = parsed.host or "127.0.0.1", parsed.port
    props = {"user": parsed.username or "", "password": parsed.password or ""}
    if db.kind == "postgres":
        url = f"jdbc:postgresql://{host}:{port or 5432}/{parsed.database}"
        table = f'"{db.schema}"."{TABLE}"'
        props["driver"] = "org.postgresql.Driver"
    else:
        url = f"jdbc:mysql://{host}:{port or 3306}/{db.schema}?permitMysqlScheme"
        table = f"`{db.schema}`.`{TABLE}`"
        props["driver"] = "org.mariadb.jdbc.Driver"
    out = work / f"jdbc-{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    spark.read.jdbc(
        url,
        table,
        column="id",
        lowerBound=1,
        upperBound=rows,
        numPartitions=partitions,
        properties=props,
    ).write.parquet(str(out))
    seconds = time.perf_counter() - started
    shutil.rmtree(out, ignore_errors=True)
    return seconds


_SPARK: dict[str, Any] = {}


def spark_session_of(db: SourceDb, work: Path) -> Any:
    from snapshotter.config import SparkConfig
    from snapshotter.sinks.spark.session import spark_session

    return spark_session(SparkConfig(master=_SPARK["master"], conf=spark_conf(db.kind)))


def table_bytes(db: SourceDb) -> int:
    """The table's size on disk at the source (heap and TOAST; MariaDB: data length)."""
    if isinstance(db, Postgres):
        return int(db.sql(f"SELECT pg_table_size('{db.schema}.{TABLE}')")[0][0])
    import pymysql

    from bench.lib.mysql import connect_args

    conn = pymysql.connect(**connect_args(db.url))
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT data_length FROM information_schema.tables "
                "WHERE table_schema = %s AND table_name = %s",
                (db.schema, TABLE),
            )
            row = cur.fetchone()
    finally:
        conn.close()
    return int(row[0]) if row else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--executors", type=int, default=2)
    parser.add_argument("--chunk-size", type=int, default=32768, help="the engine line's")
    parser.add_argument(
        "--executor-chunk-size",
        type=int,
        default=131072,
        help="rows per sub-range on the executors line (a window is N of them: one Spark job "
        "each, so larger windows pay the jobs' fixed cost less often)",
    )
    parser.add_argument("--source", choices=["postgres", "mysql"], default="postgres")
    parser.add_argument("--master", help="a spark:// master (else the services' cluster)")
    parser.add_argument("--url", help="the source's URL (else scripts/services)")
    parser.add_argument("--json", default="executor-bench.json")
    args = parser.parse_args(argv)

    master = cluster_master(args.master)
    _SPARK["master"] = master
    schema = f"xb_{uuid.uuid4().hex[:8]}"
    db: SourceDb
    if args.source == "postgres":
        db = Postgres(service_url("postgres", "SNAPSHOTTER_PG_URL", args.url), schema)
    else:
        db = MySql(service_url("mysql", "SNAPSHOTTER_MYSQL_URL", args.url), schema)
    work = Path(tempfile.mkdtemp(prefix="executor-bench-"))
    lines: dict[str, list[float]] = {"A": [], "engine": [], "executors": [], "JDBC": []}
    try:
        db.create()
        print(f"loading {args.rows} rows ...", file=sys.stderr)
        db.load(TABLE, args.rows)
        size = table_bytes(db)
        started = time.perf_counter()
        spark_session_of(db, work)
        print(f"Spark session on {master}: {time.perf_counter() - started:.1f} s", file=sys.stderr)
        for round_ in range(args.rounds):
            plain = db.plain_read(TABLE, work / "plain.parquet")
            lines["A"].append(plain.seconds)
            lines["engine"].append(snapshot(db, work, master, 0, args.chunk_size))
            lines["executors"].append(
                snapshot(db, work, master, args.executors, args.executor_chunk_size)
            )
            lines["JDBC"].append(jdbc_copy(db, work, args.executors, args.rows))
            log_round(round_, lines)
    finally:
        db.drop()
        shutil.rmtree(work, ignore_errors=True)
    a = lines["A"]
    labels = {
        "A": "A: plain read, pyarrow Parquet (this process)",
        "engine": f"snapshot, chunks of {args.chunk_size} read by the engine → Spark sink on "
        "the cluster",
        "executors": f"snapshot, windows of {args.executors} x {args.executor_chunk_size} rows "
        f"read by {args.executors} executors → Spark sink",
        "JDBC": f"Spark JDBC copy, numPartitions={args.executors} (no log, no consistency)",
    }
    result: dict[str, Any] = {
        "rows": args.rows,
        "table_mb": size / 1e6,
        "master": master,
        "source": args.source,
        "executors": args.executors,
    }
    print(
        f"\n{args.rows} rows ({size / 1e6:.0f} MB in the table), {args.source}, cluster "
        f"{master}, {args.rounds} round(s)\n"
    )
    print("| line | rows/s (median) | table MB/s | ratio to A (median of rounds) |")
    print("|---|---|---|---|")
    for key, seconds in lines.items():
        rate = statistics.median(args.rows / s for s in seconds)
        ratio = statistics.median(ax / s for ax, s in zip(a, seconds, strict=True))
        mb_s = size / 1e6 * rate / args.rows
        result[key] = {
            "seconds": seconds,
            "rows_per_s": rate,
            "mb_per_s": mb_s,
            "ratio_to_a": ratio,
        }
        print(f"| {labels[key]} | {rate:,.0f} | {mb_s:.1f} | {ratio:.2f}x |")
    Path(args.json).write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0

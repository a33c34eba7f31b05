"""The Spark sink, end to end against hand-written baselines, and its landing cost per batch.

    python bench/landing_bench.py spark [--part all|e2e|landing] [--source postgres|mysql|both]
                                        [--rows N] [--delta] [--profile] [--batches B]
                                        [--batch-rows R]

Part 1, end to end (``--part e2e``): one table of N rows (``bench.lib.inprocess``' table and
loader), measured in the same run, three ways:

A. a plain read into Arrow (``bench.lib.inprocess``' baseline: psycopg with the engine's loaders,
   or pymysql with the dialect's Arrow types), then ``pyarrow.parquet.write_table``;
B. what a Spark user writes by hand: ``spark.read.jdbc(url, table, properties=...)
   .write.parquet(...)`` with the JDBC driver jar of ``snapshotter.sinks.spark.jars.jdbc_jar``:
   one partition (one connection, one task), and, in another process, ``column="id"``,
   ``numPartitions`` = the cores; each timed without and with the Spark session's start;
C. snapshotter: ``init``, the ``execute-snapshot`` signal and ``run_engine(until_caught_up=
   True)`` with the spark sink (``format = "parquet"``; with ``--delta`` also ``"delta"``),
   timed from the signal to ``run_engine``'s return: the engine's last ``close()`` waits
   until everything staged is landed. Where its time goes comes from a ``SparkSink`` subclass
   the runner builds in place of the configured sink (session start, staging split into
   events → Arrow and Arrow → Parquet, backpressure, the final wait) and ``sink.landed``
   (landing and compaction seconds). The landed current state and changelog are counted.
   C0, for scale: ``bench.lib.inprocess``' snapshot → counting sink on the same table (the engine
   without any sink cost or Spark).

Every Spark measurement (each B, each C) runs in a child process of its own (one
SparkSession per process), started by ``snapshotter.sinks.spark.session.spark_session`` with the
same ``[spark]`` settings, so B and C start Spark the same way. ``--profile`` runs C once
more under cProfile on the engine's thread, from ``sink.open`` returned (Spark started) to
``close`` called (the snapshot part), and prints its top functions by cumulative time.

Part 2, landing cost per batch (``--part landing``; no database): synthesized batches in the
landed schema (six columns, bigint key), each 20,000 new keys in key order (a snapshot), plus
10% as many updates of random earlier keys and 2% deletes, staged with ``StagingArea`` and
landed one by one with ``Lander.land`` (parquet; with ``--delta`` also delta, fewer batches),
recording landing and compaction seconds and the table's size after each, up to about 2M
rows. The table printed at 0.2M, 0.5M, 1M and 2M rows gives the median landing seconds per
batch around that size, the compactions, the amortized cost per row, and what a naive
"rewrite the whole current state per batch" landing costs near that size: right after the
compaction nearest to it (when the base is the whole state in one Parquet directory), the
base and the next batch are read, reduced per key and written to a new path.

Results: markdown on stdout, progress on stderr. See bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import logging
import os
import platform
import pstats
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import sqlalchemy as sa

from bench.lib import inprocess as inproc
from bench.lib import mysql as mydb
from bench.lib.counting import CountingSink
from bench.lib.profiling import top_functions
from bench.lib.servers import REPO, mysql_url, pg_url
from signals.names import TableId
from snapshotter.app.cli import main as cli_main
from snapshotter.config import SinkConfig, SparkConfig
from snapshotter.sinks.spark.types import BATCH, META_FIELDS

CHILD_FLAG = "--child"
CHILD_TIMEOUT_S = 3600.0
DEFAULT_SIZES = (200_000, 500_000, 1_000_000, 2_000_000)
COMPACT_RATIO: float = SinkConfig.model_fields["compact_ratio"].default
COMPACT_MIN_ROWS: int = SinkConfig.model_fields["compact_min_rows"].default
SYNTH_TABLE = TableId("bench", "items")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def rate(rows: int, seconds: float) -> float:
    return rows / seconds if seconds > 0 else float("nan")


# =========================================================================== part 1: end to end


@dataclass
class Row:
    """One row of the end-to-end table. ``session`` says how it counts the Spark session's
    start: "none" (no Spark), "excluded" or "included"; its ratio to B is taken to the B row
    with the same accounting (A rows and C rows without Spark: to B excluded)."""

    what: str
    rows: int
    seconds: float
    kind: str  # "A", "B" or "C"
    session: str = "none"
    source: str = "postgres"
    note: str = ""
    plain: bool = False  # B: the one-partition read (the ratio's base)


def render_e2e(rows: list[Row]) -> str:
    lines = [
        "| what | rows | seconds | rows/s | ÷ A (pyarrow) | ÷ B (Spark JDBC, 1 partition) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        base_a = next((b for b in rows if b.kind == "A" and b.source == r.source), None)
        want = "included" if r.session == "included" else "excluded"
        base_b = next(
            (
                b
                for b in rows
                if b.kind == "B" and b.source == r.source and b.session == want and b.plain
            ),
            None,
        )
        own = rate(r.rows, r.seconds)
        to_a = f"{own / rate(base_a.rows, base_a.seconds):.2f}" if base_a else "–"
        to_b = f"{own / rate(base_b.rows, base_b.seconds):.2f}" if base_b else "–"
        prefix = "MySQL: " if r.source == "mysql" else ""
        lines.append(
            f"| {prefix}{r.what} | {r.rows:,} | {r.seconds:.2f} | {own:,.0f} | {to_a} | {to_b} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- A: pyarrow


def mysql_read_arrow(url: str, database: str) -> pa.Table:
    """The MySQL baseline: the table described, then read through pymysql into Arrow."""
    return mydb.pymysql_table(url, database, inproc.mysql_schema(url, database))


def baseline_a(read: Callable[[], pa.Table], out: Path, source: str) -> Row:
    started = time.perf_counter()
    table = read()
    read_s = time.perf_counter() - started
    pq.write_table(table, out)
    seconds = time.perf_counter() - started
    reader = "psycopg" if source == "postgres" else "pymysql"
    return Row(
        f"A: plain read ({reader} → Arrow) + pyarrow.parquet.write_table",
        table.num_rows,
        seconds,
        "A",
        source=source,
        note=f"read {read_s:.2f} s + write {seconds - read_s:.2f} s, "
        f"{out.stat().st_size / 1e6:,.0f} MB",
    )


# --------------------------------------------------------------------------- child processes


def run_child(spec: dict[str, Any], workdir: Path, name: str) -> dict[str, Any]:
    """Run ``landing_bench.py spark --child spec.json`` and return what it wrote to its result
    file; its stdout and stderr (Spark's chatter) go to ``<name>.log``, shown on failure."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path = workdir / f"{name}.spec.json"
    result_path = workdir / f"{name}.result.json"
    log_path = workdir / f"{name}.log"
    spec = {**spec, "result": str(result_path)}
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    started = time.perf_counter()
    with log_path.open("wb") as out:
        proc = subprocess.run(
            [
                sys.executable,
                str(REPO / "bench" / "landing_bench.py"),
                "spark",
                CHILD_FLAG,
                str(spec_path),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=CHILD_TIMEOUT_S,
            check=False,
        )
    wall = time.perf_counter() - started
    if proc.returncode != 0 or not result_path.exists():
        tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-40:]
        raise RuntimeError(f"child {name} exited {proc.returncode}:\n" + "\n".join(tail))
    result: dict[str, Any] = json.loads(result_path.read_text(encoding="utf-8"))
    result["process_wall_s"] = wall
    return result


def spark_conf(args: argparse.Namespace) -> dict[str, str]:
    conf = {}
    for item in args.spark_conf:
        key, _, value = item.partition("=")
        conf[key.strip()] = value.strip()
    return conf


# --------------------------------------------------------------------------- B: Spark JDBC


def jdbc_target(kind: str, url: str, schema: str) -> dict[str, Any]:
    """The JDBC URL, table and properties a Spark user would pass for our table. The driver's
    class is named: without it Spark asks java.sql.DriverManager, which does not see drivers
    added through spark.jars ("No suitable driver")."""
    parsed = sa.make_url(url)
    host, port = parsed.host or "127.0.0.1", parsed.port
    props = {"user": parsed.username or "", "password": parsed.password or ""}
    if kind == "postgres":
        return {
            "url": f"jdbc:postgresql://{host}:{port or 5432}/{parsed.database}",
            "table": f'"{schema}"."{inproc.TABLE}"',
            "properties": {**props, "driver": "org.postgresql.Driver"},
        }
    # Spark picks its MySQL dialect (backquoted names) for jdbc:mysql: URLs only; with
    # jdbc:mariadb: it quotes names with double quotes and reads the column names as values.
    # MariaDB's driver takes the jdbc:mysql: scheme with permitMysqlScheme.
    return {
        "url": f"jdbc:mysql://{host}:{port or 3306}/{schema}?permitMysqlScheme",
        "table": f"`{schema}`.`{inproc.TABLE}`",
        "properties": {**props, "driver": "org.mariadb.jdbc.Driver"},
    }


def child_jdbc(spec: dict[str, Any]) -> dict[str, Any]:
    """B in this process: session start, then ``read.jdbc`` → ``write.parquet``: one
    partition, or ``partitions`` on id. The count is checked after the clock."""
    from pyspark.sql import SparkSession  # noqa: F401  (imported before the clock, as in C)

    from snapshotter.sinks.spark.jars import jdbc_jar
    from snapshotter.sinks.spark.session import spark_session

    jar = jdbc_jar(spec["kind"])
    conf = {**spec["conf"], "spark.jars": str(jar)}
    started = time.perf_counter()
    spark = spark_session(SparkConfig(master=spec["master"], conf=conf))
    session_s = time.perf_counter() - started
    out = spec["out"]
    partitions = spec["partitions"]
    if partitions > 1:
        t0 = time.perf_counter()
        df = spark.read.jdbc(
            spec["url"],
            spec["table"],
            column="id",
            lowerBound=1,
            upperBound=spec["rows"] + 1,
            numPartitions=partitions,
            properties=spec["properties"],
        )
    else:
        t0 = time.perf_counter()
        df = spark.read.jdbc(spec["url"], spec["table"], properties=spec["properties"])
    df.write.mode("overwrite").parquet(out)
    seconds = time.perf_counter() - t0
    return {
        "jar": jar.name,
        "session_s": session_s,
        "seconds": seconds,
        "rows": spark.read.parquet(out).count(),
        "spark": spark.version,
    }


def baseline_b(args: argparse.Namespace, kind: str, url: str, schema: str, tmp: Path) -> list[Row]:
    """B, each read in a child process of its own: one partition, then (unless
    ``--jdbc-partitions 1``) partitioned on id."""
    out: list[Row] = []
    for partitions in sorted({1, max(1, args.jdbc_partitions)}):
        spec = {
            "child": "jdbc",
            "kind": kind,
            "master": args.master,
            "conf": spark_conf(args),
            "out": str(tmp / f"{kind}-jdbc-{partitions}"),
            "partitions": partitions,
            "rows": args.rows,
            **jdbc_target(kind, url, schema),
        }
        log(f"{kind}: B, Spark JDBC → Parquet, {partitions} partition(s) (child process) ...")
        r = run_child(spec, tmp / "children", f"{kind}-jdbc-{partitions}")
        shutil.rmtree(spec["out"], ignore_errors=True)
        if r["rows"] != args.rows:
            raise RuntimeError(f"B ({partitions} partitions): wrote {r['rows']} of {args.rows}")
        note = (
            f"Spark {r['spark']}, {r['jar']}; session start {r['session_s']:.2f} s; whole child "
            f"process {r['process_wall_s']:.1f} s"
        )
        if partitions == 1:
            what = "B: spark.read.jdbc(url, table) → .write.parquet, 1 partition"
        else:
            what = f"B: the same, column=id, numPartitions={partitions}"
        plain = partitions == 1
        out += [
            Row(what, args.rows, r["seconds"], "B", "excluded", kind, note, plain=plain),
            Row(
                what + ", incl. session start",
                args.rows,
                r["seconds"] + r["session_s"],
                "B",
                "included",
                kind,
                plain=plain,
            ),
        ]
    return out


# --------------------------------------------------------------------------- C: snapshotter


def spark_sink(fmt: str, master: str, conf: dict[str, str]) -> str:
    """The ``[sink]`` and ``[spark]`` sections of a capture (``inprocess.Capture``'s
    ``sink``) with the spark sink."""
    conf_toml = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in conf.items())
    return (
        f'[sink]\nkind = "spark"\npath = "lake"\nformat = "{fmt}"\n\n'
        f'[spark]\nmaster = "{master}"\nconf = {{ {conf_toml} }}\n'
    )


def child_snapshot(spec: dict[str, Any]) -> dict[str, Any]:
    """C in this process: signal, then ``run_engine(until_caught_up=True)`` with a timed
    ``SparkSink`` (built where the runner builds the configured sink); then the landed
    current state and changelog are counted (after the clock)."""
    from snapshotter.app import runner
    from snapshotter.config import load_config
    from snapshotter.sinks.spark.sink import SparkSink
    from snapshotter.sinks.spark.staging import StagedBatch, StagingArea

    timing: dict[str, float] = dict.fromkeys(
        ("session", "stage", "to_arrow", "write", "wait_room", "close"), 0.0
    )
    counts = {"staged": 0, "staged_bytes": 0}
    marks: dict[str, float] = {}
    # The engine's thread is this one: the sink enables the profiler once open (Spark
    # started) and disables it when the engine closes it.
    profiler = cProfile.Profile() if spec["profile"] else None

    class TimedStaging(StagingArea):
        def stage(
            self,
            seq: int,
            tables: Sequence[tuple[TableId, Sequence[str], pa.Table]],
            written: Any = None,
        ) -> StagedBatch:
            started = time.perf_counter()
            batch = super().stage(seq, tables, written)
            timing["write"] += time.perf_counter() - started
            counts["staged"] += 1
            counts["staged_bytes"] += batch.bytes
            return batch

    class TimedSparkSink(SparkSink):
        def __init__(self, **kwargs: Any) -> None:
            kwargs["staging"] = TimedStaging(kwargs["staging"].directory)
            opener = kwargs["open_lander"]

            def open_lander() -> Any:
                started = time.perf_counter()
                lander = opener()
                timing["session"] += time.perf_counter() - started
                return lander

            kwargs["open_lander"] = open_lander
            super().__init__(**kwargs)
            stage = self._stager._stage  # on the sink's stager thread

            def timed_stage(work: Any) -> None:
                started = time.perf_counter()
                stage(work)
                timing["stage"] += time.perf_counter() - started

            self._stager._stage = timed_stage  # type: ignore[method-assign]

        def open(self, resume: Any) -> None:
            super().open(resume)
            marks["opened"] = time.perf_counter()
            if profiler is not None:  # the snapshot part only: not Spark's start, not close
                profiler.enable()

        def _wait_for_room(self) -> None:
            started = time.perf_counter()
            super()._wait_for_room()
            timing["wait_room"] += time.perf_counter() - started

        def close(self) -> None:
            if profiler is not None:
                profiler.disable()
            started = marks.setdefault("close_called", time.perf_counter())
            super().close()
            timing["close"] += time.perf_counter() - started

    sinks: list[TimedSparkSink] = []

    def open_sink(config: Any, describe: Any, key_names: Any) -> Any:
        sink = TimedSparkSink.from_config(config, describe=describe, key_columns=key_names)
        assert isinstance(sink, TimedSparkSink)  # from_config makes the class it is called on
        sinks.append(sink)
        return sink

    runner.sink_for = open_sink  # build_engine looks it up at call time
    config = load_config(spec["config"])
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        code = cli_main(["signal", "-c", spec["config"], "execute-snapshot", spec["table"]])
    if code != 0:
        raise RuntimeError(f"snapshotter signal exited {code}:\n{buffer.getvalue()}")
    started = time.perf_counter()
    code = runner.run_engine(config, until_caught_up=True)
    seconds = time.perf_counter() - started
    if code != 0:
        raise RuntimeError(f"the engine exited {code}")
    (sink,) = sinks
    timing["to_arrow"] = timing["stage"] - timing["write"]
    landed = [asdict(x) for x in sink.landed]
    lander = sink._landings.lander
    assert lander is not None
    table = TableId(*spec["table"].split(".", 1))
    current = lander.current_state(table)
    changelog = lander.changelog(table)
    result: dict[str, Any] = {
        "seconds": seconds,
        "timing": timing,
        "counts": counts,
        "snapshot_s": marks["close_called"] - marks["opened"],
        "landed": landed,
        "current_rows": current.count() if current is not None else 0,
        "changelog_rows": changelog.count() if changelog is not None else 0,
        "spark": lander.spark.version,
    }
    if profiler is not None:
        result["profile"] = "\n".join(top_functions(profiler, spec["profile_top"]))
        result["profile_total"] = pstats.Stats(profiler).total_tt  # type: ignore[attr-defined]
    return result


@dataclass
class Breakdown:
    what: str
    source: str
    result: dict[str, Any]


def snapshotter_run(
    args: argparse.Namespace,
    capture: inproc.Capture,
    kind: str,
    fmt: str,
    tmp: Path,
    name: str,
    profile: bool = False,
) -> dict[str, Any]:
    started = time.perf_counter()
    capture.init()
    init_s = time.perf_counter() - started
    spec = {
        "child": "snapshot",
        "config": str(capture.config_path),
        "table": f"{capture.schema}.{inproc.TABLE}",
        "profile": profile,
        "profile_top": args.profile_top,
    }
    r = run_child(spec, tmp / "children", name)
    r["init_s"] = init_s
    if r["current_rows"] != args.rows or r["changelog_rows"] != args.rows:
        raise RuntimeError(
            f"C ({fmt}): landed {r['current_rows']} current rows and {r['changelog_rows']} "
            f"changelog rows for {args.rows} table rows"
        )
    return r


def counting_row(capture: inproc.Capture, rows: int, source: str) -> Row:
    """``bench.lib.inprocess``' snapshot → counting sink, on the same table: the engine without
    any sink cost, to set C against."""
    r = inproc.snapshot(capture, rows, CountingSink(), "counting")
    assert r.seconds is not None
    what = "C0: snapshotter → counting sink (no sink cost, no Spark)"
    return Row(what, rows, r.seconds, "C", source=source)


def c_rows(kind: str, fmt: str, rows: int, r: dict[str, Any]) -> list[Row]:
    what = f"C: snapshotter → spark sink ({fmt})"
    session = r["timing"]["session"]
    note = (
        f"init {r['init_s']:.2f} s (not in the time); session start {session:.2f} s; "
        f"whole child process {r['process_wall_s']:.1f} s"
    )
    return [
        Row(what, rows, r["seconds"] - session, "C", "excluded", kind, note),
        Row(what + ", incl. session start", rows, r["seconds"], "C", "included", kind),
    ]


def render_breakdown(parts: list[Breakdown]) -> str:
    """Where C's time goes, one column per run."""
    heads = [f"{'MySQL: ' if p.source == 'mysql' else ''}{p.what}" for p in parts]
    lines = [
        "| where C's time goes (s) | " + " | ".join(heads) + " |",
        "|---|" + "---:|" * len(parts),
    ]

    def line(label: str, get: Callable[[dict[str, Any]], str]) -> None:
        lines.append(f"| {label} | " + " | ".join(get(p.result) for p in parts) + " |")

    def landings(r: dict[str, Any]) -> list[dict[str, Any]]:
        return list(r["landed"])

    line("signal → `run_engine` returned (C, incl. session)", lambda r: f"{r['seconds']:.2f}")
    line(
        "Spark session start (engine thread, in `sink.open`, before the log is read)",
        lambda r: f"{r['timing']['session']:.2f}",
    )
    line(
        "snapshot: `open` returned → final `close` called (engine + chunk worker)",
        lambda r: f"{r['snapshot_s']:.2f}",
    )
    line(
        "  in it, staging, stager thread: rows → Arrow (`pieces_to_landed`)",
        lambda r: f"{r['timing']['to_arrow']:.2f}",
    )
    line(
        "  in it, staging, stager thread: Arrow → Parquet, fsync, rename",
        lambda r: f"{r['timing']['write']:.2f}",
    )
    line(
        "  in it, waiting for the lander (backpressure, `max_staged_mb`)",
        lambda r: f"{r['timing']['wait_room']:.2f}",
    )
    line("`close()`: waiting for the last landings", lambda r: f"{r['timing']['close']:.2f}")
    line(
        "staged batches (MB)",
        lambda r: f"{r['counts']['staged']} ({r['counts']['staged_bytes'] / 1e6:,.0f} MB)",
    )
    line(
        "landing, lander thread: sum of `Landed.seconds` (landings)",
        lambda r: f"{sum(x['seconds'] for x in landings(r)):.2f} ({len(landings(r))})",
    )
    line(
        "compaction: sum of `compact_seconds` (compactions)",
        lambda r: (
            f"{sum(x['compact_seconds'] for x in landings(r)):.2f} "
            f"({sum(1 for x in landings(r) if x['compacted'])})"
        ),
    )
    line(
        "batches per landing (max)",
        lambda r: str(max((len(x["batches"]) for x in landings(r)), default=0)),
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------- per source


@dataclass
class E2E:
    rows: list[Row]
    breakdowns: list[Breakdown]
    machine: list[str]
    profiles: list[str]


def e2e_postgres(args: argparse.Namespace, chunk_size: int, tmp: Path) -> E2E:
    url = pg_url(args.url)
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    captures: list[inproc.Capture] = []
    rows: list[Row] = []
    breakdowns: list[Breakdown] = []
    profiles: list[str] = []

    def capture(name: str, fmt: str) -> inproc.Capture:
        sink = spark_sink(fmt, args.master, spark_conf(args))
        c = inproc.Capture(url, schema, tmp / name, chunk_size, sink=sink)
        captures.append(c)
        return c

    try:
        log(f"postgres: loading {args.rows:,} rows into {schema}.{inproc.TABLE} ...")
        load_s = inproc.load_table(url, schema, args.rows)
        log(f"postgres: loaded in {load_s:.1f} s; A, plain read + pyarrow Parquet ...")
        rows.append(
            baseline_a(lambda: inproc.pg_table(url, schema), tmp / "pg-a.parquet", "postgres")
        )
        rows += baseline_b(args, "postgres", url, schema, tmp)
        log("postgres: C0, snapshotter → counting sink (this process) ...")
        c0 = inproc.Capture(url, schema, tmp / "pg-counting", chunk_size)
        captures.append(c0)
        rows.append(counting_row(c0, args.rows, "postgres"))
        c0.drop()
        for fmt in ("parquet", "delta") if args.delta else ("parquet",):
            log(f"postgres: C, snapshotter → spark sink ({fmt}) (child process) ...")
            c = capture(f"pg-{fmt}", fmt)
            r = snapshotter_run(args, c, "postgres", fmt, tmp, f"pg-{fmt}")
            c.drop()
            rows += c_rows("postgres", fmt, args.rows, r)
            breakdowns.append(Breakdown(f"C {fmt}", "postgres", r))
        if args.profile:
            log("postgres: C under cProfile (child process) ...")
            c = capture("pg-profile", "parquet")
            r = snapshotter_run(args, c, "postgres", "parquet", tmp, "pg-profile", profile=True)
            c.drop()
            profiles.append(profile_text("postgres", args.rows, r))
    finally:
        inproc.cleanup(url, schema, captures)
    return E2E(rows, breakdowns, inproc.machine(url), profiles)


def e2e_mysql(args: argparse.Namespace, chunk_size: int, tmp: Path) -> E2E:
    server = mysql_url(args.mysql_url)
    database = f"bench_{uuid.uuid4().hex[:10]}"
    url = mydb.with_database(server, database)
    rows: list[Row] = []
    breakdowns: list[Breakdown] = []
    profiles: list[str] = []

    def capture(name: str, fmt: str) -> inproc.MySqlCapture:
        sink = spark_sink(fmt, args.master, spark_conf(args))
        return inproc.MySqlCapture(url, database, tmp / name, chunk_size, sink=sink)

    mydb.create_database(server, database)
    try:
        log(f"mysql: loading {args.rows:,} rows into {database}.{inproc.TABLE} ...")
        load_s = mydb.load_items(server, database, args.rows)
        log(f"mysql: loaded in {load_s:.1f} s; A, plain read + pyarrow Parquet ...")
        rows.append(
            baseline_a(lambda: mysql_read_arrow(url, database), tmp / "my-a.parquet", "mysql")
        )
        rows += baseline_b(args, "mysql", url, database, tmp)
        log("mysql: C0, snapshotter → counting sink (this process) ...")
        c0 = inproc.MySqlCapture(url, database, tmp / "my-counting", chunk_size)
        rows.append(counting_row(c0, args.rows, "mysql"))
        for fmt in ("parquet", "delta") if args.delta else ("parquet",):
            log(f"mysql: C, snapshotter → spark sink ({fmt}) (child process) ...")
            r = snapshotter_run(args, capture(f"my-{fmt}", fmt), "mysql", fmt, tmp, f"my-{fmt}")
            rows += c_rows("mysql", fmt, args.rows, r)
            breakdowns.append(Breakdown(f"C {fmt}", "mysql", r))
        if args.profile:
            log("mysql: C under cProfile (child process) ...")
            c = capture("my-profile", "parquet")
            r = snapshotter_run(args, c, "mysql", "parquet", tmp, "my-profile", profile=True)
            profiles.append(profile_text("mysql", args.rows, r))
    finally:
        mydb.drop_database(server, database)
    return E2E(rows, breakdowns, inproc.mysql_machine(server), profiles)


def profile_text(source: str, rows: int, r: dict[str, Any]) -> str:
    prefix = "MySQL: " if source == "mysql" else ""
    return "\n".join(
        [
            f"### {prefix}cProfile of C (parquet), engine thread, from `sink.open` returned to "
            f"`close` called: {rows:,} rows, {r['snapshot_s']:.2f} s under the profiler (whole "
            f"run {r['seconds']:.2f} s); top {r['profile'].count(chr(10))} by cumulative time",
            "",
            "```",
            r["profile"],
            "```",
        ]
    )


# =========================================================================== part 2: landing


def synth_schema() -> pa.Schema:
    """Six columns, bigint key, then the landing's meta columns (``landed_schema``'s shape)."""
    fields = [
        pa.field("id", pa.int64()),
        pa.field("k", pa.int32()),
        pa.field("name", pa.string()),
        pa.field("amount", pa.float64()),
        pa.field("created", pa.timestamp("us", tz="UTC")),
        pa.field("active", pa.bool_()),
    ]
    return pa.schema([*fields, *META_FIELDS])


class Synth:
    """Batches of a table growing like a snapshot with a busy log: per batch, ``new_rows`` new
    keys in key order (READ events), then updates of random live earlier keys and deletes of
    others (``updates`` and ``deletes`` of ``new_rows`` each)."""

    def __init__(self, new_rows: int, updates: float, deletes: float, seed: int) -> None:
        self.rng = random.Random(seed)
        self.n_new = new_rows
        self.n_update = round(new_rows * updates)
        self.n_delete = round(new_rows * deletes)
        self.live: list[int] = []
        self.next_key = 1
        self.schema = synth_schema()

    def batch(self, seq: int) -> pa.Table:
        live = self.live
        new = list(range(self.next_key, self.next_key + self.n_new))
        self.next_key += self.n_new
        picked = self.rng.sample(range(len(live)), min(len(live), self.n_update + self.n_delete))
        updated = [live[i] for i in picked[: self.n_update]]
        gone_at = sorted(picked[self.n_update :], reverse=True)
        deleted = [live[i] for i in gone_at]
        for i in gone_at:  # swap-remove: order of live keys does not matter
            live[i] = live[-1]
            live.pop()
        live.extend(new)
        keys = new + updated + deleted
        ops = ["r"] * len(new) + ["u"] * len(updated) + ["d"] * len(deleted)
        n = len(keys)
        alive = len(new) + len(updated)
        values = [None] * len(deleted)
        base_ms = 1_700_000_000_000
        columns = [
            pa.array(keys, pa.int64()),
            pa.array([(k * 7919 + seq) % 100_003 for k in keys[:alive]] + values, pa.int32()),
            pa.array([f"name-{k}-{seq}" for k in keys[:alive]] + values, pa.string()),
            pa.array([k * 0.25 + seq for k in keys[:alive]] + values, pa.float64()),
            pa.array(
                [(base_ms + k) * 1000 for k in keys[:alive]] + values, pa.timestamp("us", tz="UTC")
            ),
            pa.array([k % 3 != 0 for k in keys[:alive]] + values, pa.bool_()),
            pa.array(ops, pa.string()),
            pa.array([f"{seq:010d}:{i:08d}" for i in range(n)], pa.string()),
            pa.array([base_ms + seq] * n, pa.int64()),
            pa.array(["incremental"] * len(new) + ["false"] * (n - len(new)), pa.string()),
            pa.nulls(n, pa.list_(pa.string())),
            pa.array([seq] * n, pa.int64()),
        ]
        return pa.Table.from_arrays(columns, schema=self.schema)


def predict_compactions(spec: dict[str, Any]) -> list[tuple[int, int]]:
    """(batch, base rows) of the compactions the lander will do on ``Synth``'s batches: its
    rule (``tail_rows >= max(compact_min_rows, compact_ratio * base_rows)``) replayed on the
    batch sizes, which do not depend on the random picks."""
    n_new = spec["batch_rows"]
    n_change = round(n_new * spec["updates"]) + round(n_new * spec["deletes"])
    n_update = round(n_new * spec["updates"])
    live = base = tail = 0
    out = []
    for seq in range(1, spec["batches"] + 1):
        picked = min(live, n_change)
        deleted = max(0, picked - n_update)
        live += n_new - deleted
        tail += n_new + picked
        if tail >= max(spec["compact_min_rows"], spec["compact_ratio"] * base):
            base, tail = live, 0
            out.append((seq, live))
    return out


def plan_naive(spec: dict[str, Any]) -> dict[int, int]:
    """For each naive size, the compaction whose base is nearest to it (within 1.5×):
    {batch that compacts: the size asked for}. The naive rewrite is timed right after it,
    when the base is the whole current state as one Parquet directory, as the naive design
    keeps it, so it needs no extra copy."""
    compactions = predict_compactions(spec)
    chosen: dict[int, int] = {}
    for size in spec["naive"]:
        near = min(compactions, key=lambda c: abs(c[1] - size), default=None)
        if near is not None and size / 1.5 <= near[1] <= size * 1.5:
            chosen.setdefault(near[0], size)
    return chosen


def child_landing(spec: dict[str, Any]) -> dict[str, Any]:
    """Part 2 in this process for one format: stage and land ``batches`` batches one by one.
    After the compactions ``plan_naive`` chose (parquet), the naive rewrite of the whole
    current state with the next batch is timed before that batch lands."""
    from snapshotter.sinks.spark.lander import Lander
    from snapshotter.sinks.spark.session import spark_session
    from snapshotter.sinks.spark.staging import StagingArea

    fmt = spec["format"]
    work = Path(spec["work"])
    started = time.perf_counter()
    spark = spark_session(
        SparkConfig(master=spec["master"], conf=spec["conf"]), delta=fmt == "delta"
    )
    session_s = time.perf_counter() - started
    lander = Lander(
        spark,
        str(work / "lake"),
        fmt,
        compact_ratio=spec["compact_ratio"],
        compact_min_rows=spec["compact_min_rows"],
    )
    staging = StagingArea(work / "staging")
    staging.open()
    synth = Synth(spec["batch_rows"], spec["updates"], spec["deletes"], spec["seed"])
    plan = plan_naive(spec) if fmt == "parquet" else {}
    records: list[dict[str, Any]] = []
    naive: list[dict[str, Any]] = []
    for seq in range(1, spec["batches"] + 1):
        data = synth.batch(seq)
        t0 = time.perf_counter()
        staged = staging.stage(seq, [(SYNTH_TABLE, ["id"], data)])
        stage_s = time.perf_counter() - t0
        meta = lander.meta(SYNTH_TABLE)
        if seq - 1 in plan and meta is not None and meta.base == seq - 1 and not meta.tail_rows:
            log(f"naive rewrite of {meta.base_rows:,} rows ...")
            # No tail: current/ holds the base alone (its files lie flat in it).
            current = f"{lander.table_path(SYNTH_TABLE)}/current"
            seconds = naive_rewrite(spark, current, staged.tables[0].file, work / "naive")
            naive.append({"for_size": plan[seq - 1], "size": meta.base_rows, "seconds": seconds})
        t0 = time.perf_counter()
        landed = lander.land([staged])
        wall = time.perf_counter() - t0
        staging.remove(staged)
        meta = lander.meta(SYNTH_TABLE)
        records.append(
            {
                "seq": seq,
                "rows": data.num_rows,
                "size": len(synth.live),
                "stage_s": stage_s,
                "land_s": landed.seconds,
                "compact_s": landed.compact_seconds,
                "compacted": bool(landed.compacted),
                "wall_s": wall,
                "base_rows": meta.base_rows if meta else 0,
            }
        )
        if seq % 10 == 0:
            log(f"{fmt}: batch {seq}, {len(synth.live):,} rows, landing {landed.seconds:.2f} s")
    state = lander.current_state(SYNTH_TABLE)
    t0 = time.perf_counter()
    got = state.count() if state is not None else 0
    read_s = time.perf_counter() - t0
    if got != len(synth.live):
        raise RuntimeError(f"{fmt}: current state {got} rows, the synthesis {len(synth.live)}")
    return {
        "format": fmt,
        "session_s": session_s,
        "records": records,
        "naive": naive,
        "final_rows": got,
        "final_read_s": read_s,
        "spark": spark.version,
    }


def naive_rewrite(spark: Any, state_dir: str, batch_file: Path, work: Path) -> float:
    """What landing a batch costs when the current state is one Parquet table rewritten per
    batch: read it and the batch, keep per key the latest event (``reduce_latest``, deletes
    dropped), write it all to a new path (then drop that copy)."""
    from pyspark.sql import functions as F

    from snapshotter.sinks.spark.lander import reduce_latest

    out = work / f"state-{uuid.uuid4().hex[:8]}"
    t0 = time.perf_counter()
    state = spark.read.parquet(state_dir).withColumn(BATCH, F.col(BATCH).cast("long"))
    batch = spark.read.parquet(str(batch_file))
    merged = state.unionByName(batch, allowMissingColumns=True)
    reduce_latest(merged, ["id"]).write.mode("overwrite").parquet(str(out))
    seconds = time.perf_counter() - t0
    shutil.rmtree(out, ignore_errors=True)
    return seconds


def landing_part(args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    out = []
    for fmt in ("parquet", "delta") if args.delta else ("parquet",):
        batches = args.batches if fmt == "parquet" else args.delta_batches
        spec = {
            "child": "landing",
            "format": fmt,
            "work": str(tmp / f"landing-{fmt}"),
            "master": args.master,
            "conf": spark_conf(args),
            "batches": batches,
            "batch_rows": args.batch_rows,
            "updates": args.update_fraction,
            "deletes": args.delete_fraction,
            "seed": args.seed,
            "compact_ratio": args.compact_ratio,
            "compact_min_rows": args.compact_min_rows,
            "naive": list(args.naive_sizes) if fmt == "parquet" else [],
        }
        log(f"landing ({fmt}): {batches} batches of {args.batch_rows:,} rows (child process) ...")
        out.append(run_child(spec, tmp / "children", f"landing-{fmt}"))
        shutil.rmtree(tmp / f"landing-{fmt}", ignore_errors=True)
    return out


def render_landing(r: dict[str, Any], sizes: Sequence[int], window: int) -> str:
    records = r["records"]
    fmt = r["format"]
    naive = {n["for_size"]: n for n in r["naive"]}
    lines = [
        f"| table rows ({fmt}) | batch | landing s/batch, median (p90) of {window} | "
        "staging s/batch | compactions so far | last compaction: base rows, s | "
        "landing + compaction, amortized since previous size: s/batch, µs/row | "
        "naive rewrite s/batch | naive ÷ landing |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    previous = 0
    for size in sizes:
        at = next((i for i, x in enumerate(records) if x["size"] >= size), None)
        if at is None:
            continue
        lo = max(0, at - window // 2)
        win = records[lo : lo + window]
        lands = sorted(x["land_s"] for x in win)
        med = statistics.median(lands)
        p90 = lands[min(len(lands) - 1, int(0.9 * len(lands)))]
        stage = statistics.median(x["stage_s"] for x in win)
        done = records[: at + 1]
        compactions = [x for x in done if x["compacted"]]
        last = (
            f"{compactions[-1]['base_rows']:,}, {compactions[-1]['compact_s']:.2f}"
            if compactions
            else "–"
        )
        span = records[previous : at + 1]
        cost = sum(x["land_s"] + x["compact_s"] for x in span)
        span_rows = sum(x["rows"] for x in span)
        amortized = f"{cost / len(span):.2f}, {cost / span_rows * 1e6:.1f}"
        n = naive.get(size)
        naive_cell = f"{n['seconds']:.2f} (at {n['size']:,})" if n else "–"
        ratio = f"{n['seconds'] / med:.1f}" if n else "–"
        lines.append(
            f"| {records[at]['size']:,} | {at + 1} | {med:.2f} ({p90:.2f}) | {stage:.3f} | "
            f"{len(compactions)} | {last} | {amortized} | {naive_cell} | {ratio} |"
        )
        previous = at + 1
    if len(lines) == 2:
        lines = [f"(the table reached none of the sizes {', '.join(f'{n:,}' for n in sizes)})"]
    compactions = [x for x in records if x["compacted"]]
    total_land = sum(x["land_s"] for x in records)
    total_compact = sum(x["compact_s"] for x in records)
    total_rows = sum(x["rows"] for x in records)
    notes = [
        f"- {len(records)} batches ({sum(x['rows'] for x in records):,} events) landed in "
        f"{total_land:.1f} s + {total_compact:.1f} s compaction "
        f"({(total_land + total_compact) / total_rows * 1e6:.1f} µs per landed row); "
        f"final table {r['final_rows']:,} rows; Spark session start {r['session_s']:.1f} s; "
        f"reading the final current state (`current_state().count()`) {r['final_read_s']:.2f} s",
    ]
    if compactions:
        notes.append(
            "- compactions (after batch: base rows, s): "
            + "; ".join(
                f"{x['seq']}: {x['base_rows']:,}, {x['compact_s']:.1f}" for x in compactions
            )
        )
    first = records[: min(window, len(records))]
    last_w = records[-min(window, len(records)) :]
    notes.append(
        f"- landing s/batch, median of the first {len(first)} batches "
        f"{statistics.median(x['land_s'] for x in first):.2f}, of the last {len(last_w)} "
        f"{statistics.median(x['land_s'] for x in last_w):.2f}"
    )
    return "\n".join([*lines, "", *notes])


# =========================================================================== main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("all", "e2e", "landing"), default="all")
    parser.add_argument(
        "--source",
        choices=("postgres", "mysql", "both"),
        default="postgres",
        help="end to end: which source(s) (postgres)",
    )
    parser.add_argument("--rows", type=int, default=1_000_000, help="table rows (1,000,000)")
    parser.add_argument("--chunk-size", type=int, default=None, help="engine chunk size")
    parser.add_argument("--url", help="PostgreSQL URL (default: $SNAPSHOTTER_PG_URL or services)")
    parser.add_argument("--mysql-url", help="MySQL URL (default: $SNAPSHOTTER_MYSQL_URL, services)")
    parser.add_argument("--delta", action="store_true", help="also measure format = delta")
    parser.add_argument("--master", default="local[*]", help="Spark master (local[*])")
    parser.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Spark setting for every session (B and C alike); repeatable",
    )
    parser.add_argument(
        "--jdbc-partitions",
        type=int,
        default=os.cpu_count() or 2,
        help="B: numPartitions of the partitioned read (the cores; 1 skips it)",
    )
    parser.add_argument("--profile", action="store_true", help="C once more under cProfile")
    parser.add_argument("--profile-top", type=int, default=10, help="functions shown (10)")
    parser.add_argument("--batches", type=int, default=106, help="landing: batches (106)")
    parser.add_argument(
        "--delta-batches", type=int, default=30, help="landing, delta: batches (30)"
    )
    parser.add_argument(
        "--batch-rows",
        type=int,
        default=20_000,
        help="landing: new keys per batch (20,000); updates and deletes come on top",
    )
    parser.add_argument("--update-fraction", type=float, default=0.10, help="(0.10)")
    parser.add_argument("--delete-fraction", type=float, default=0.02, help="(0.02)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--sizes",
        default=",".join(map(str, DEFAULT_SIZES)),
        help="landing: table sizes to report (200000,500000,1000000,2000000)",
    )
    parser.add_argument(
        "--naive-sizes",
        default=",".join(map(str, DEFAULT_SIZES)),
        help="landing: sizes near which to time the naive rewrite (as --sizes)",
    )
    parser.add_argument("--window", type=int, default=11, help="batches per median (11)")
    parser.add_argument("--compact-ratio", type=float, default=COMPACT_RATIO)
    parser.add_argument("--compact-min-rows", type=int, default=COMPACT_MIN_ROWS)
    args = parser.parse_args(argv)
    try:
        args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
        args.naive_sizes = [int(s) for s in args.naive_sizes.split(",") if s.strip()]
    except ValueError:
        parser.error("--sizes and --naive-sizes are comma-separated row counts")
    if min(args.rows, args.batches, args.delta_batches, args.batch_rows, args.window) < 1:
        parser.error("--rows, --batches, --delta-batches, --batch-rows and --window: positive")
    if not 0 <= args.update_fraction + args.delete_fraction < 1:
        parser.error("--update-fraction + --delete-fraction must be in [0, 1)")
    return args


def child_main(spec_path: str) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("pymysqlreplication").setLevel(logging.ERROR)
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    run = {"jdbc": child_jdbc, "snapshot": child_snapshot, "landing": child_landing}
    result = run[spec["child"]](spec)
    Path(spec["result"]).write_text(json.dumps(result), encoding="utf-8")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [CHILD_FLAG]:
        return child_main(argv[1])
    args = parse_args(argv)
    chunk_size = args.chunk_size or inproc.DEFAULT_CHUNK_SIZE
    parts: list[E2E] = []
    landing: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="snapshotter-spark-bench-") as tmp_name:
        tmp = Path(tmp_name)
        if args.part in ("all", "e2e"):
            if args.source in ("postgres", "both"):
                parts.append(e2e_postgres(args, chunk_size, tmp))
            if args.source in ("mysql", "both"):
                parts.append(e2e_mysql(args, chunk_size, tmp))
        if args.part in ("all", "landing"):
            landing = landing_part(args, tmp)

    machine = [line for part in parts for line in part.machine] or [
        f"- machine: {platform.platform()}, {os.cpu_count()} cores",
        f"- Python {platform.python_version()}, pyarrow {pa.__version__}",
    ]
    spark_versions = {p.result["spark"] for part in parts for p in part.breakdowns}
    spark_versions |= {r["spark"] for r in landing}
    print(f"## spark sink bench ({time.strftime('%Y-%m-%d')})\n")
    print("\n".join(dict.fromkeys(machine)))
    print(
        f"- Spark {', '.join(sorted(spark_versions)) or '–'}, master {args.master}"
        + (f", conf {', '.join(args.spark_conf)}" if args.spark_conf else "")
        + f", load average at the end {os.getloadavg()[0]:.1f}"
    )
    if parts:
        rows = [r for part in parts for r in part.rows]
        print(f"\n### end to end: {args.rows:,} rows, chunk size {chunk_size}\n")
        print(render_e2e(rows))
        notes = [
            f"- {'MySQL: ' if r.source == 'mysql' else ''}{r.what}: {r.note}"
            for r in rows
            if r.note
        ]
        print("\n" + "\n".join(notes))
        print()
        print(render_breakdown([b for part in parts for b in part.breakdowns]))
        for part in parts:
            for text in part.profiles:
                print("\n" + text)
    for r in landing:
        n = r["records"]
        print(
            f"\n### landing cost per batch ({r['format']}): {len(n)} batches, each "
            f"{args.batch_rows:,} new keys + {round(args.batch_rows * args.update_fraction):,} "
            f"updates + {round(args.batch_rows * args.delete_fraction):,} deletes of earlier "
            "keys, landed one by one\n"
        )
        print(render_landing(r, args.sizes, args.window))
    return 0

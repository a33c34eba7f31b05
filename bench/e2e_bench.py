"""End to end, in one run: a plain read of a table (A) against snapshotter's snapshot of the
same table into each sink, on PostgreSQL and on MariaDB; peak RSS and linearity at a bigger
size; the log's latency during a Spark-sink snapshot.

    python bench/e2e_bench.py                                # the full run (defaults below)
    python bench/e2e_bench.py --rows 20000 --rounds 1 --scale-rows 0   # a quick check

Defaults: ``--rows 1000000 --rounds 3 --source both --sinks counting,jsonl,spark,kafka
--scale-rows 4000000 --scale-sinks counting,spark --latency-sink spark --tick-ms 20``, and
``kafka-confluent`` in ``--sinks`` (the Kafka sink with ``client = "confluent"``) where
confluent-kafka is installed. JSON to ``--json`` (``e2e-bench.json``), markdown on stdout,
progress on stderr. Servers: ``--url`` /
``$SNAPSHOTTER_PG_URL``, ``--mysql-url`` / ``$SNAPSHOTTER_MYSQL_URL``, ``--bootstrap`` /
``$SNAPSHOTTER_KAFKA_BOOTSTRAP`` (else ``scripts/services up ...``). ``--set
[SINK:]SECTION.KEY=VALUE`` puts a key in every engine's config (or only that sink's), e.g.
``--set source.read_parallelism=1`` or ``--set spark:sink.max_staged_mb=1024``.

Per source, one table of ``--rows`` rows (``bench/lib/tables.py``: six columns, int, bigint,
text, numeric(14,2), timestamptz, float8, PRIMARY KEY (tenant, id)), then ``--rounds``
interleaved rounds, each: A, snapshot → counting, → JSONL, → Spark, → Kafka (→ Kafka with the
confluent client) in that order, so drift and other load spread over all of them alike.
Reported: per line the median rows/s over the rounds and the median of each round's ratio to
that round's A.

A = the whole table read in one go and written with ``pyarrow.parquet.write_table``:
PostgreSQL through ADBC (``adbc_driver_postgresql``, ``SELECT *`` → ``fetch_arrow_table``,
numeric cast to decimal128), MariaDB through mysqlclient (``SELECT *``, buffered, DECIMAL and
TIMESTAMP converted by Arrow casts); timed from connect to the file written, in this process.
Without those packages A falls back to psycopg / pymysql (the report says which).

A snapshot: the engine runs in a child process of its own, ``snapshotter run -c CONFIG`` as a
user runs it (``bench/lib/child.py``; the sink wrapped in a timing proxy), started beforehand: it
reads the log (a ``log`` signal proves it) and, for Spark, its session is up. Timed from
``snapshotter signal execute-snapshot`` returned to the last READ row acknowledged by the sink
(counting: handed over; JSONL: written and fsynced; Kafka: acknowledged by the broker;
Spark: landed in the changelog and current state); the sink is asked for that
acknowledgement right after the last READ row (``--until-caught-up`` does the same), so the
1 s checkpoint interval is not in it. "Spark incl. session start" adds that run's session
start. CPU seconds are read from /proc for the engine process and, apart, for what runs
below it (Spark's JVM), from the signal to done; peak RSS is the engine process's VmHWM.

Then, per source: one more snapshot into ``--latency-sink`` (spark) with a ticker (``ticker``
table, captured too) that updates one row every ``--tick-ms`` (autocommit, its own
connection, in this process) from ``--idle-seconds`` before the signal to the end: latency =
the event's arrival at the sink (``write`` called) − the moment the ticker sent its UPDATE
(p50, p99, max), idle and during the snapshot (sent between the signal and the last READ
row handed to the sink). Last, a ``--scale-rows`` table snapshotted once per
``--scale-sinks`` sink: peak RSS and time per row against the rounds' medians, and the rate
over the last quarter of the rows against the first.

Every engine run has its own config, state, slot and publication (PostgreSQL) or server id
(MariaDB), ``snapshotter teardown`` after it; the schema / database and the Kafka topics are
dropped at the end, also after an error. About 0.5 GB of temporary disk per million rows.
See bench/README.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":  # the bootstrap (bench/README.md): import bench.lib from the repo root
    sys.path[0] = str(Path(__file__).resolve().parents[1])


def child_main(spec: str) -> int:
    # Only the engine's own imports in the engine's process (its RSS is measured).
    from bench.lib.child import main

    return main(spec)


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    sys.exit(child_main(sys.argv[2]))

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from collections.abc import Callable  # noqa: E402

from bench.lib import report  # noqa: E402
from bench.lib.configs import parse_setting  # noqa: E402
from bench.lib.runs import EngineOptions, snapshot  # noqa: E402
from bench.lib.servers import REPO, machine_lines, service_url  # noqa: E402
from bench.lib.stats import median  # noqa: E402
from bench.lib.tables import BIG_TABLE, TABLE, MySql, Postgres, SourceDb  # noqa: E402

SINKS = ("counting", "jsonl", "spark", "kafka", "kafka-confluent")


def default_sinks() -> list[str]:
    """Every sink; the Kafka sink's confluent client only where confluent-kafka is installed
    (the ``snapshotter[confluent]`` extra)."""
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        return list(SINKS[:4])
    return list(SINKS)


DEFAULT_BOOTSTRAP = "127.0.0.1:29092"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def sink_list(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in names if s not in SINKS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown sink(s) {unknown}; known: {', '.join(SINKS)}")
    return names


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000, help="table rows (1,000,000)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3)")
    p.add_argument("--source", choices=("postgres", "mysql", "both"), default="both")
    p.add_argument(
        "--sinks",
        type=sink_list,
        default=default_sinks(),
        help="(counting,jsonl,spark,kafka, and kafka-confluent where confluent-kafka is installed)",
    )
    p.add_argument(
        "--scale-rows",
        type=int,
        default=4_000_000,
        help="the RSS / linearity table (4,000,000; 0: none)",
    )
    p.add_argument(
        "--scale-sinks", type=sink_list, default=["counting", "spark"], help="(counting,spark)"
    )
    p.add_argument("--no-latency", action="store_true", help="skip the ticker run")
    p.add_argument(
        "--latency-sink", choices=SINKS, default="spark", help="the ticker run's sink (spark)"
    )
    p.add_argument("--tick-ms", type=float, default=20.0, help="ticker interval (20)")
    p.add_argument("--idle-seconds", type=float, default=2.0, help="ticks before the signal (2)")
    p.add_argument("--chunk-size", type=int, default=None, help="[source] chunk_size (the default)")
    p.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="[SINK:]SECTION.KEY=VALUE",
        help="a config key for every engine run (or one sink's), VALUE a TOML literal; repeatable",
    )
    p.add_argument("--url", help="PostgreSQL (default: $SNAPSHOTTER_PG_URL, else services)")
    p.add_argument(
        "--mysql-url", help="MariaDB/MySQL (default: $SNAPSHOTTER_MYSQL_URL, else services)"
    )
    p.add_argument(
        "--bootstrap",
        default=os.environ.get("SNAPSHOTTER_KAFKA_BOOTSTRAP") or DEFAULT_BOOTSTRAP,
        help=f"Kafka (default: $SNAPSHOTTER_KAFKA_BOOTSTRAP, else {DEFAULT_BOOTSTRAP})",
    )
    p.add_argument("--json", type=Path, default=Path("e2e-bench.json"), help="(e2e-bench.json)")
    p.add_argument("--keep", action="store_true", help="keep every run's directory and output")
    args = p.parse_args(argv)
    if min(args.rows, args.rounds) < 1 or args.scale_rows < 0 or args.tick_ms <= 0:
        p.error("--rows and --rounds must be positive, --scale-rows >= 0, --tick-ms > 0")
    if args.chunk_size is not None and args.chunk_size < 1:
        p.error("--chunk-size must be positive")
    try:
        args.settings = [parse_setting(s, SINKS) for s in args.settings]
    except ValueError as exc:
        p.error(f"--set {exc}")
    return args


def git_commit() -> str:
    """The checkout's commit, "+dirty" when files differ from it (read only)."""
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return head + ("+dirty" if dirty else "")


def measure(
    db: SourceDb, args: argparse.Namespace, opts: EngineOptions, work: Path
) -> report.SourceResults:
    label = db.label
    db.create()
    try:
        log(f"{label}: loading {args.rows:,} rows ...")
        res = report.SourceResults(db.kind, args.rows, db.load(TABLE, args.rows))
        res.machine = db.machine()
        log(f"{label}: loaded in {res.load_s:.1f} s")
        for r in range(args.rounds):
            plain = db.plain_read(TABLE, work / f"{db.kind}-a.parquet")
            (work / f"{db.kind}-a.parquet").unlink(missing_ok=True)
            res.plain.append(plain)
            a_rate = plain.rows / plain.seconds
            log(f"{label} round {r + 1}: A {plain.seconds:.2f} s ({a_rate:,.0f}/s)")
            for sink in args.sinks:
                run = snapshot(db, sink, TABLE, args.rows, work, opts, round_no=r)
                res.runs.append(run)
                log(
                    f"{label} round {r + 1}: {sink} {run.seconds:.2f} s ({run.rate:,.0f}/s, "
                    f"{run.rate * plain.seconds / plain.rows:.2f} A)"
                )
        if not args.no_latency:
            db.create_ticker()
            log(f"{label}: {args.latency_sink}-sink snapshot with the ticker ...")
            res.latency = snapshot(db, args.latency_sink, TABLE, args.rows, work, opts, ticker=True)
            log(f"{label}: {res.latency.seconds:.2f} s, {len(res.latency.ticks)} ticks")
        if args.scale_rows:
            log(f"{label}: loading {args.scale_rows:,} rows ...")
            res.scale_rows = args.scale_rows
            res.scale_load_s = db.load(BIG_TABLE, args.scale_rows)
            for sink in args.scale_sinks:
                run = snapshot(db, sink, BIG_TABLE, args.scale_rows, work, opts)
                res.scale.append(run)
                log(
                    f"{label} {args.scale_rows:,} rows: {sink} {run.seconds:.2f} s, "
                    f"peak RSS {run.engine_rss_mb:,.0f} MB"
                )
            db.drop_table(BIG_TABLE)
        return res
    finally:
        db.drop()


def render(
    args: argparse.Namespace, results: list[report.SourceResults], meta: dict[str, object]
) -> str:
    out = [
        f"## snapshotter end to end ({meta['date']}, commit {meta['commit']})",
        "",
        *meta["machine"],  # type: ignore[misc]
        f"- {args.rows:,} rows, {args.rounds} interleaved round(s), medians; chunk size "
        f"{args.chunk_size or 'default'}"
        + (f"; --set {', '.join(meta['settings'])}" if meta["settings"] else ""),  # type: ignore[arg-type]
    ]
    for res in results:
        if res.plain:
            out.append(
                f"- {res.label} A: {res.plain[0].reader}; Parquet {res.plain[0].parquet_mb:,.0f} MB"
            )
    sessions = [r.session_s for res in results for r in res.runs if r.session_s]
    if sessions:
        out.append(f"- Spark session start (median): {median(sessions):.1f} s")
    notes = {f"{res.label} {r.sink}: {r.note}" for res in results for r in res.runs if r.note}
    out += [f"- warning: {n}" for n in sorted(notes)]
    lines = [x for res in results for x in report.summary(res, args.sinks)]
    out += ["", report.main_table(lines)]
    if any(res.latency for res in results):
        out += ["", report.latency_table(results, args.tick_ms)]
    if any(res.scale for res in results):
        out += ["", report.scale_table(results)]
    out += [
        "",
        f"- the run took {meta['minutes']:.1f} min; load average at the end "
        f"{os.getloadavg()[0]:.2f}",
    ]
    return "\n".join(out)


def interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C: engines stopped, slots, schemas and topics dropped.
    signal.signal(signal.SIGTERM, interrupted)
    logging.getLogger("pymysqlreplication").setLevel(logging.ERROR)
    if any(s.startswith("kafka") for s in args.sinks + args.scale_sinks):
        from bench.lib.kafka import check_broker

        check_broker(args.bootstrap)
    opts = EngineOptions(
        args.chunk_size, args.settings, args.bootstrap, args.tick_ms, args.idle_seconds, args.keep
    )
    started = time.perf_counter()
    meta: dict[str, object] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "commit": git_commit(),
        "machine": machine_lines(),
        "args": {k: v for k, v in vars(args).items() if k not in ("settings", "json")},
        "settings": [
            f"{s.sink + ':' if s.sink else ''}{s.section}.{s.key}={s.value!r}"
            for s in args.settings
        ],
    }
    tag = uuid.uuid4().hex[:8]
    makers: list[Callable[[], SourceDb]] = []
    if args.source in ("postgres", "both"):
        makers.append(
            lambda: Postgres(service_url("postgres", "SNAPSHOTTER_PG_URL", args.url), f"e2e_{tag}")
        )
    if args.source in ("mysql", "both"):
        makers.append(
            lambda: MySql(
                service_url("mysql", "SNAPSHOTTER_MYSQL_URL", args.mysql_url), f"e2e_{tag}"
            )
        )
    results: list[report.SourceResults] = []
    work_ctx = tempfile.TemporaryDirectory(prefix="snapshotter-e2e-")
    work = Path(work_ctx.name)
    try:
        for make in makers:
            results.append(measure(make(), args, opts, work))
    finally:
        if args.keep:
            log(f"kept: {work}")
        else:
            work_ctx.cleanup()
    meta["minutes"] = (time.perf_counter() - started) / 60
    for res in results:
        meta["machine"] = [*meta["machine"], *res.machine]  # type: ignore[misc]
    text = render(args, results, meta)
    document = {
        "meta": meta,
        "markdown": text,
        "summary": [report.summary(res, args.sinks) for res in results],
        "latency": {res.kind: report.latency(res.latency) for res in results if res.latency},
        "sources": results,
    }
    args.json.write_text(json.dumps(report.to_json(document), indent=1), encoding="utf-8")
    print(text)
    log(f"JSON: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

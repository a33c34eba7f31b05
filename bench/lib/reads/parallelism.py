"""``[source] read_parallelism``: snapshot speed with 1, 2, 3 chunk SELECTs in flight.

    python bench/read_bench.py parallelism [--rows 200000] [--rounds 5] [--parallel 1,2,3]
                                           [--chunk-size N] [--sources postgres,mysql]

Loads ``--rows`` rows (``bench.lib.inprocess``' ``items`` table: bigint key, int, text, float,
timestamp) into a fresh schema / database per source, then snapshots it into a counting sink
(``run_engine(until_caught_up=True)``, in this process) with each ``read_parallelism``,
interleaved (round r runs the settings rotated by r, so a machine that gets busier or
quieter during the run does not favour one), ``--rounds`` times. Per run:

* wall seconds, from the committed signal to the engine's return;
* the engine's CPU seconds (``time.process_time()`` of this process: every engine thread);
* the database server's CPU seconds: PostgreSQL, the backends serving this process's
  connections (found by their client ports, sampled while the run lasts; the replication
  walsender included); MariaDB, the whole ``mariadbd`` process (other clients included);
* the machine's busy CPU seconds over all cores (``/proc/stat``), which says how loaded the
  machine was.

Prints medians per setting and the ratios to ``read_parallelism = 1``.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg

from bench.lib import inprocess as inproc
from bench.lib import mysql as mydb
from bench.lib.counting import CountingSink
from bench.lib.servers import mysql_url, pg_url
from snapshotter.app.runner import run_engine
from snapshotter.core.events import Op

TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> float | None:
    """utime + stime of ``pid`` in seconds (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK


def machine_busy() -> float:
    """Busy CPU seconds of all cores since boot (``/proc/stat``: all but idle and iowait)."""
    with open("/proc/stat", encoding="ascii") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    return (sum(values) - values[3] - values[4]) / TICK


def own_ports(server_port: int) -> set[int]:
    """Local ports of this process's TCP connections to ``server_port``."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            lines = Path(table).read_text(encoding="ascii").splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            local, remote, inode = parts[1], parts[2], parts[9]
            if inode in inodes and int(remote.rsplit(":", 1)[1], 16) == server_port:
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


class BackendCpu:
    """PostgreSQL: CPU seconds of the backends serving this process's connections, sampled
    every ``interval`` seconds while it runs (a backend that exits loses at most that)."""

    def __init__(self, url: str, interval: float = 0.2) -> None:
        self.url = url
        self.port = int(re.search(r":(\d+)/", url).group(1))  # type: ignore[union-attr]
        self.interval = interval
        self.seen: dict[int, tuple[float, float]] = {}  # pid -> (first, last) CPU seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> BackendCpu:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def seconds(self) -> float:
        return sum(last - first for first, last in self.seen.values())

    def _run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            me = conn.execute("SELECT pg_backend_pid()").fetchone()
            while not self._stop.wait(self.interval):
                ports = own_ports(self.port)
                rows = conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE client_port = ANY(%s) AND pid <> %s",
                    (list(ports), me[0] if me else 0),
                ).fetchall()
                for (pid,) in rows:
                    cpu = proc_cpu(pid)
                    if cpu is None:
                        continue
                    # A backend first seen mid-run started after the run began: its CPU
                    # from 0 (it was born for this run) is counted.
                    first, _ = self.seen.get(pid, (0.0, 0.0))
                    self.seen[pid] = (first, cpu)


class ProcessCpu:
    """CPU seconds of one server process (MariaDB: all its connections, others' too)."""

    def __init__(self, name: str) -> None:
        self.pid = next(
            int(p) for p in os.listdir("/proc") if p.isdigit() and _comm(int(p)) == name
        )
        self.start = 0.0
        self.seconds = 0.0

    def __enter__(self) -> ProcessCpu:
        self.start = proc_cpu(self.pid) or 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = (proc_cpu(self.pid) or 0.0) - self.start


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text(encoding="ascii").strip()
    except OSError:
        return ""


@dataclass
class Run:
    source: str
    parallel: int
    rows: int
    wall: float
    engine_cpu: float
    server_cpu: float
    machine_cpu: float


def with_parallelism(capture: inproc.Capture, parallel: int) -> None:
    text = capture.config_path.read_text(encoding="utf-8")
    text = re.sub(
        r"^chunk_size = .*$",
        lambda m: f"{m.group(0)}\nread_parallelism = {parallel}",
        text,
        count=1,
        flags=re.M,
    )
    capture.config_path.write_text(text, encoding="utf-8")


def one_run(
    source: str,
    capture: inproc.Capture,
    rows: int,
    parallel: int,
    server: Callable[[], BackendCpu | ProcessCpu],
) -> Run:
    with_parallelism(capture, parallel)
    capture.init()
    config = capture.config
    assert config.source.read_parallelism == parallel
    capture.signal_snapshot()
    sink = CountingSink()
    busy0, cpu0, wall0 = machine_busy(), time.process_time(), time.perf_counter()
    with server() as watch:
        code = run_engine(config, until_caught_up=True, sink=sink)
    wall = time.perf_counter() - wall0
    cpu, busy = time.process_time() - cpu0, machine_busy() - busy0
    if code != 0 or sink.counts[Op.READ] != rows:
        raise RuntimeError(f"{source}, {parallel} reads: exit {code}, {sink.counts[Op.READ]} READs")
    capture.drop()
    return Run(source, parallel, rows, wall, cpu, watch.seconds, busy)


def report(runs: list[Run], settings: list[int]) -> str:
    lines = [
        "| source | reads | runs | rows/s (wall) | vs 1 | engine CPU s | server CPU s | "
        "engine+server CPU s per 1M rows | machine busy CPU s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for source in dict.fromkeys(r.source for r in runs):
        base: float | None = None
        for n in settings:
            mine = [r for r in runs if r.source == source and r.parallel == n]
            if not mine:
                continue
            rate = statistics.median(r.rows / r.wall for r in mine)
            base = base or rate
            engine = statistics.median(r.engine_cpu for r in mine)
            server = statistics.median(r.server_cpu for r in mine)
            per_m = statistics.median((r.engine_cpu + r.server_cpu) / r.rows * 1e6 for r in mine)
            busy = statistics.median(r.machine_cpu for r in mine)
            lines.append(
                f"| {source} | {n} | {len(mine)} | {rate:,.0f} | {rate / base:.2f}x | "
                f"{engine:.2f} | {server:.2f} | {per_m:.1f} | {busy:.2f} |"
            )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--parallel", default="1,2,3")
    parser.add_argument("--chunk-size", type=int, default=0, help="default: the config's")
    parser.add_argument("--sources", default="postgres,mysql")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = [int(n) for n in args.parallel.split(",")]
    chunk = args.chunk_size or inproc.DEFAULT_CHUNK_SIZE
    sources = args.sources.split(",")
    runs: list[Run] = []
    tag = uuid.uuid4().hex[:10]
    pg_server = pg_url(None) if "postgres" in sources else ""
    my_server = mysql_url(None) if "mysql" in sources else ""
    pg_schema, my_db = f"bench_{tag}", f"bench_{tag}"
    captures: list[inproc.Capture] = []
    with tempfile.TemporaryDirectory(prefix="snapshotter-parallel-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            if "postgres" in sources:
                print(f"loading {args.rows:,} rows into PostgreSQL ...", file=sys.stderr)
                inproc.load_table(pg_server, pg_schema, args.rows)
            if "mysql" in sources:
                print(f"loading {args.rows:,} rows into MariaDB ...", file=sys.stderr)
                mydb.create_database(my_server, my_db)
                mydb.load_items(my_server, my_db, args.rows)
            for r in range(args.rounds):
                order = settings[r % len(settings) :] + settings[: r % len(settings)]
                for source in sources:
                    for n in order:
                        name = f"{source}-{r}-{n}"
                        capture: inproc.Capture
                        watch: Callable[[], BackendCpu | ProcessCpu]
                        if source == "postgres":
                            capture = inproc.Capture(pg_server, pg_schema, tmp / name, chunk)
                            watch = lambda: BackendCpu(pg_server)  # noqa: E731
                        else:
                            url = mydb.with_database(my_server, my_db)
                            capture = inproc.MySqlCapture(url, my_db, tmp / name, chunk)
                            watch = lambda: ProcessCpu("mariadbd")  # noqa: E731
                        captures.append(capture)
                        run = one_run(source, capture, args.rows, n, watch)
                        runs.append(run)
                        print(
                            f"round {r + 1}: {source}, {n} reads: {run.rows / run.wall:,.0f} "
                            f"rows/s, engine CPU {run.engine_cpu:.2f} s, server CPU "
                            f"{run.server_cpu:.2f} s, machine busy {run.machine_cpu:.2f} s "
                            f"in {run.wall:.2f} s",
                            file=sys.stderr,
                        )
        finally:
            if "postgres" in sources:
                inproc.cleanup(pg_server, pg_schema, [c for c in captures if c.url == pg_server])
            if "mysql" in sources:
                mydb.drop_database(my_server, my_db)
    print(
        f"## read_parallelism: snapshot of {args.rows:,} rows into a counting sink, "
        f"chunk_size {chunk}, {args.rounds} interleaved rounds, medians; "
        f"{os.cpu_count()} cores, load average at the end {os.getloadavg()[0]:.1f}\n"
    )
    print(report(runs, settings))
    return 0

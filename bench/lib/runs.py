"""The parent's side of one engine run: config, ``snapshotter init``, the engine in a child
process (``child.py``), the ``execute-snapshot`` signal, what the child reports, /proc
readings, the stop, the checks, ``snapshotter teardown``.

Timing of a run (``EngineRun.seconds``): from the moment ``snapshotter signal
execute-snapshot`` returned (its INSERT committed) to ``done`` in the child: the last READ
row of the table acknowledged by the sink, for Spark landed (in the changelog and the
current state). The engine was started beforehand and reads the log (a ``log`` signal it
logged proves it), and for Spark its session is up; neither start is in the time. In the
time: the engine seeing the signal, every chunk (watermarks, SELECT, window), the sink's work
and its acknowledgement (JSONL: write + fsync; Kafka: the broker's acks; Spark: staging,
then landing).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.lib.configs import Setting, apply_settings, toml_text
from bench.lib.stats import TreeReading, read_tree
from bench.lib.tables import TICKER_TABLE, Postgres, SourceDb

ENTRY = Path(__file__).resolve().parents[1] / "e2e_bench.py"
SIGNAL_TABLE = "debezium_signal"
START_TIMEOUT_S = 180.0  # child start, sink open, the probe
SPARK_TIMEOUT_S = 600.0  # the Spark session
STOP_TIMEOUT_S = 600.0  # SIGTERM → exit (Spark lands what is staged and compacts)
TICK_SETTLE_S = 1.0  # after the ticker stops, for its last events to arrive
TICK_WARMUP_S = 1.0  # ticks before the idle phase, not counted


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class EngineOptions:
    chunk_size: int | None
    settings: Sequence[Setting]
    bootstrap: str
    tick_ms: float
    idle_s: float
    keep: bool = False  # keep the run's directory (output, logs)


@dataclass
class EngineRun:
    """One snapshot by the engine, as measured."""

    source: str
    sink: str
    rows: int
    seconds: float  # signal → done (see the module docstring)
    marks: dict[str, float]  # the child's marks, seconds after the signal
    session_s: float | None  # Spark session start (Spark runs)
    engine_cpu_s: float  # the engine process's CPU seconds from the signal to done
    below_cpu_s: float  # the same for the processes below it (Spark's JVM)
    engine_rss_mb: float  # the engine process's peak RSS (VmHWM) at done
    below_rss_mb: float  # the largest peak RSS below it (the JVM)
    exit_rss_mb: float  # the engine's ru_maxrss at exit (the stop included)
    progress: list[tuple[float, int]]  # (seconds after the signal, READ rows) per write
    round: int | None = None
    # per tick: (UPDATE sent, UPDATE returned, arrival at the sink), seconds after the signal
    ticks: list[tuple[float, float, float]] = field(default_factory=list)
    ticks_lost: int = 0  # committed ticks that never reached the sink
    idle_s: float = 0.0  # ticks sent this long before the signal are the idle phase
    note: str = ""

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else math.nan


class Capture:
    """One engine setup: config file, state, output, slot and publication (PostgreSQL) or
    server id (MariaDB) of its own, in its own directory."""

    def __init__(
        self, db: SourceDb, sink: str, table: str, workdir: Path, opts: EngineOptions, ticker: bool
    ) -> None:
        self.db = db
        self.sink = sink
        self.table = table
        self.ticker = ticker
        self.tag = uuid.uuid4().hex[:8]
        self.dir = workdir / f"{db.kind}-{sink}-{self.tag}"
        self.dir.mkdir(parents=True)
        self.name = f"e2e{self.tag}"  # [source] name: the Kafka topic prefix
        tables = [f"{db.schema}.{table}"] + ([f"{db.schema}.{TICKER_TABLE}"] if ticker else [])
        source: dict[str, Any] = {
            "kind": db.kind,
            "url": db.url,
            "name": self.name,
            "tables": tables,
            "signal_table": f"{db.schema}.{SIGNAL_TABLE}",
        }
        if opts.chunk_size:
            source["chunk_size"] = opts.chunk_size
        if isinstance(db, Postgres):
            source["slot"] = source["publication"] = f"e2e_{self.tag}"
            db.slots.append(source["slot"])
        else:  # outside 5400..6399, where tests and engines pick theirs at random
            source["server_id"] = random.randint(7_000_000, 7_999_999)
        sections: dict[str, dict[str, Any]] = {
            "source": source,
            "sink": self.sink_section(opts),
            "state": {"dir": "state"},
        }
        apply_settings(sections, opts.settings, sink)
        self.config = self.dir / "snapshotter.toml"
        self.config.write_text(toml_text(sections), encoding="utf-8")

    def sink_section(self, opts: EngineOptions) -> dict[str, Any]:
        if self.sink == "counting":  # the child builds a CountingSink in its place
            return {"kind": "jsonl", "path": "unused.jsonl"}
        if self.sink == "jsonl":
            return {"kind": "jsonl", "path": "events.jsonl"}
        if self.sink == "spark":
            return {"kind": "spark", "path": "lake", "format": "parquet"}
        if self.sink == "kafka":  # kafka-python, named: the default ("auto") may pick confluent
            return {"kind": "kafka", "bootstrap_servers": opts.bootstrap, "client": "kafka-python"}
        if self.sink == "kafka-confluent":  # the librdkafka producer
            return {"kind": "kafka", "bootstrap_servers": opts.bootstrap, "client": "confluent"}
        raise ValueError(f"unknown sink {self.sink!r}")

    def cli(self, *args: str) -> str:
        """``snapshotter <args> -c CONFIG`` in this process; its output is returned, and
        shown if it fails."""
        from snapshotter.app.cli import main as cli_main

        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            code = cli_main([args[0], "-c", str(self.config), *args[1:]])
        if code != 0:
            raise RuntimeError(f"snapshotter {' '.join(args)} exited {code}:\n{buffer.getvalue()}")
        return buffer.getvalue()

    @property
    def table_id(self) -> str:
        return f"{self.db.schema}.{self.table}"

    def teardown(self) -> None:
        try:
            self.cli("teardown", "--yes")
        except Exception as exc:
            log(f"warning: teardown of {self.dir.name}: {exc}")


class Child:
    """The engine process and the messages it sends (read by a thread into a queue)."""

    def __init__(self, capture: Capture, rows: int) -> None:
        self.capture = capture
        self.rows = rows
        self.probe = f"e2e-probe-{uuid.uuid4().hex}"
        read_fd, write_fd = os.pipe()
        spec = {
            "config": str(capture.config),
            "sink": capture.sink,
            "table": capture.table_id,
            "ticker": f"{capture.db.schema}.{TICKER_TABLE}" if capture.ticker else None,
            "rows": rows,
            "probe": self.probe,
            "fd": write_fd,
        }
        spec_path = capture.dir / "child.json"
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        self.log_path = capture.dir / "engine.log"
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(ENTRY), "--child", str(spec_path)],
                stdout=out,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd,),
                cwd=capture.dir,
            )
        os.close(write_fd)
        self.messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.seen: dict[str, dict[str, Any]] = {}  # the last message of each kind
        self.ticks: list[tuple[float, int]] = []  # (arrival, seq)
        self._reader = threading.Thread(target=self._read, args=(read_fd,), daemon=True)
        self._reader.start()
        self.rusage_maxrss_mb = math.nan

    def _read(self, fd: int) -> None:
        with os.fdopen(fd, "r", encoding="utf-8") as lines:
            for line in lines:
                self.messages.put(json.loads(line))
        self.messages.put(None)  # the child closed its end: it is gone

    def expect(self, ev: str, timeout: float) -> dict[str, Any]:
        """The next ``ev`` message (or one already seen); fails if the child ends first."""
        deadline = time.monotonic() + timeout
        while ev not in self.seen:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(
                    f"no {ev!r} from the engine within {timeout:.0f} s" + self.tail()
                )
            try:
                message = self.messages.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if message is None:
                raise RuntimeError(f"the engine ended before {ev!r}" + self.tail())
            self.note(message)
        return self.seen[ev]

    def note(self, message: dict[str, Any]) -> None:
        if message["ev"] == "error":
            raise RuntimeError(f"the engine logged an error: {message['message']}" + self.tail())
        if message["ev"] == "snapshot_done":
            # "snapshot of T done: N rows in C chunks": a snapshot that read another number of
            # rows than the table holds would never be "done" here; say so at once.
            found = re.search(r" done: (\d+) rows", message["message"])
            if found and int(found.group(1)) != self.rows:
                raise RuntimeError(
                    f"the engine logged {message['message']!r}, the table has "
                    f"{self.rows} rows" + self.tail()
                )
        if message["ev"] == "ticks":
            self.ticks += [(message["arrived"], seq) for seq in message["seqs"]]
        self.seen[message["ev"]] = message

    def drain(self) -> None:
        with contextlib.suppress(queue.Empty):
            while (message := self.messages.get_nowait()) is not None:
                self.note(message)

    def stop(self) -> int:
        """SIGTERM (the CLI saves state and exits), then the exit code; SIGKILL after
        ``STOP_TIMEOUT_S``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while True:
            pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                self.proc.returncode = os.waitstatus_to_exitcode(status)
                self.rusage_maxrss_mb = usage.ru_maxrss / 1024
                break
            if time.monotonic() > deadline:
                self.proc.kill()
                self.proc.wait()
                raise RuntimeError(f"the engine did not stop within {STOP_TIMEOUT_S:.0f} s")
            time.sleep(0.05)
        self._reader.join(10)
        self.drain()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return ""
        return f"\n--- {self.log_path} (last {lines} lines) ---\n" + "\n".join(text[-lines:])


def snapshot(
    db: SourceDb,
    sink: str,
    table: str,
    rows: int,
    workdir: Path,
    opts: EngineOptions,
    *,
    ticker: bool = False,
    round_no: int | None = None,
) -> EngineRun:
    """One measured snapshot of ``table`` (``rows`` rows) into ``sink``; see the module
    docstring for what is timed. With ``ticker``, the ticker table is captured too and the
    ticker commits every ``opts.tick_ms`` from ``opts.idle_s`` before the signal until the
    snapshot is done."""
    capture = Capture(db, sink, table, workdir, opts, ticker)
    capture.cli("init")
    child: Child | None = None
    tick: Any = None
    try:
        child = Child(capture, rows)
        child.expect("open", START_TIMEOUT_S)
        capture.cli("signal", "log", child.probe)
        child.expect("probe", START_TIMEOUT_S)
        session_s = None
        if sink == "spark":
            session_s = float(child.expect("spark", SPARK_TIMEOUT_S)["session_s"])
        if ticker:
            tick = db.ticker(opts.tick_ms / 1000.0)
            tick.start()
            # The first ticker events wait for the engine's first look at the table
            # (catalog, key columns; ~0.1 s): a warm-up, in neither phase.
            time.sleep(TICK_WARMUP_S + opts.idle_s)
        before = read_tree(child.proc.pid)
        capture.cli("signal", "execute-snapshot", capture.table_id)
        signalled = time.monotonic()
        done = child.expect("done", max(900.0, rows / 1000.0))
        if "signal" in child.seen:
            # The signal committed before the engine logged it, and the CLI returns a moment
            # after its commit: whichever came first is the closer to the commit.
            signalled = min(signalled, child.seen["signal"]["t"])
        after = read_tree(child.proc.pid)
        commits: dict[int, tuple[float, float]] = {}
        if tick is not None:
            commits = tick.stop()
            tick = None
            time.sleep(TICK_SETTLE_S)
        code = child.stop()
        exit_message = child.seen.get("exit", {})
        if code != 0 or exit_message.get("code") != 0:
            raise RuntimeError(f"the engine exited {code}" + child.tail())
        run = measured(db, sink, rows, done, signalled, before, after, session_s, child)
        run.round = round_no
        if sink == "spark" and "landed" not in run.marks:
            run.note = (
                "the landing was not observable (no sink.landed / staged ack): timed to staged"
            )
        check(capture, run, exit_message)
        if commits:
            arrivals = {seq: arrived for arrived, seq in child.ticks}
            run.ticks = [
                (sent - signalled, returned - signalled, arrivals[seq] - signalled)
                for seq, (sent, returned) in sorted(commits.items())
                if seq in arrivals
            ]
            run.ticks_lost = sum(1 for seq in commits if seq not in arrivals)
            run.idle_s = opts.idle_s
        return run
    finally:
        if tick is not None:
            with contextlib.suppress(Exception):
                tick.stop()
        if child is not None:
            child.kill()
        capture.teardown()
        if not opts.keep:
            remove_outputs(capture)


def measured(
    db: SourceDb,
    sink: str,
    rows: int,
    done: dict[str, Any],
    signalled: float,
    before: TreeReading,
    after: TreeReading,
    session_s: float | None,
    child: Child,
) -> EngineRun:
    marks = {k: v - signalled for k, v in done["marks"].items()}
    marks["done"] = done["t"] - signalled
    if "signal" in child.seen:
        marks["signal_seen"] = child.seen["signal"]["t"] - signalled
    return EngineRun(
        source=db.kind,
        sink=sink,
        rows=rows,
        seconds=marks["done"],
        marks=marks,
        session_s=session_s,
        engine_cpu_s=after.engine_cpu_s - before.engine_cpu_s,
        below_cpu_s=after.below_cpu_s - before.below_cpu_s,
        engine_rss_mb=after.engine_hwm_mb,
        below_rss_mb=after.below_hwm_mb,
        exit_rss_mb=float(child.seen.get("exit", {}).get("maxrss_mb", math.nan)),
        progress=[(t - signalled, n) for t, n in done["progress"]],
    )


def check(capture: Capture, run: EngineRun, exit_message: dict[str, Any]) -> None:
    """Exactly ``rows`` READ rows reached the sink, and its output holds them."""
    read = exit_message.get("read_rows")
    if read != run.rows:
        raise RuntimeError(f"{run.sink}: {read} READ rows reached the sink, wanted {run.rows}")
    if run.sink == "jsonl":
        with (capture.dir / "events.jsonl").open("rb") as f:
            lines = sum(1 for _ in f)
        if lines != run.rows:
            raise RuntimeError(f"jsonl: {lines} lines written, wanted {run.rows}")
    elif run.sink == "spark":
        landed = exit_message.get("landed_rows", 0)
        if landed < run.rows:
            raise RuntimeError(f"spark: {landed} rows landed, wanted at least {run.rows}")
    elif run.sink.startswith("kafka"):
        from bench.lib import kafka

        topic = kafka.topic(capture.name, capture.db.schema, capture.table)
        count = kafka.message_count(capture_bootstrap(capture), topic)
        if count != run.rows:
            raise RuntimeError(f"kafka: topic {topic} holds {count} messages, wanted {run.rows}")


def capture_bootstrap(capture: Capture) -> str:
    from snapshotter.config import load_config

    return load_config(capture.config).sink.bootstrap_servers


def remove_outputs(capture: Capture) -> None:
    """The run's output (JSONL file, landed tables, staging) and its Kafka topics."""
    import shutil

    if capture.sink.startswith("kafka"):
        from bench.lib import kafka

        with contextlib.suppress(Exception):
            kafka.delete_topics(capture_bootstrap(capture), capture.name + ".")
    for name in ("events.jsonl", "lake", "state/staging"):
        path = capture.dir / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def run_config(
    db: SourceDb,
    work: Path,
    table: str,
    sink: dict[str, Any],
    spark: dict[str, Any],
    source: dict[str, Any] | None = None,
    **sections: dict[str, Any],
) -> tuple[Path, str]:
    """A directory ``work/run-<tag>`` and its config, for a run of the CLI in this process:
    ``db``'s ``table`` captured (on PostgreSQL a slot and publication of its own, which
    ``db.drop()`` drops; on MariaDB a server id of its own) with ``source``'s keys too,
    ``sink`` landing into ``lake/``, state in ``state/``, ``[spark]`` ``spark`` and any
    further ``sections``. Returns the directory and the config's path."""
    tag = uuid.uuid4().hex[:8]
    run = work / f"run-{tag}"
    run.mkdir()
    keys: dict[str, Any] = {
        "kind": db.kind,
        "url": db.url,
        "tables": [f"{db.schema}.{table}"],
        "signal_table": f"{db.schema}.{SIGNAL_TABLE}",
        **(source or {}),
    }
    if isinstance(db, Postgres):
        keys |= {"slot": f"bench_{tag}", "publication": f"bench_{tag}"}
        db.slots.append(f"bench_{tag}")
    else:
        keys["server_id"] = 100_000 + int(tag[:6], 16)
    config = run / "snapshotter.toml"
    config.write_text(
        toml_text(
            {
                "source": keys,
                "sink": {**sink, "path": str(run / "lake")},
                "state": {"dir": str(run / "state")},
                "spark": spark,
                **sections,
            }
        )
    )
    return run, str(config)


def init_and_signal(config: str, db: SourceDb, table: str) -> None:
    """``snapshotter init``, then the ``execute-snapshot`` signal for ``table``, in this
    process."""
    from snapshotter.app.cli import main as cli

    assert cli(["init", "-c", config]) == 0
    assert cli(["signal", "execute-snapshot", f"{db.schema}.{table}", "-c", config]) == 0

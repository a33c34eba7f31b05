"""The engine's process in the end-to-end bench: ``snapshotter run -c CONFIG``, as a user runs
it, with the configured sink wrapped in a transparent timing proxy.

``e2e_bench.py --child SPEC`` lands here. It replaces ``snapshotter.app.runner.sink_for`` (which
``build_engine`` looks up when it builds the engine) by one that builds the configured sink
(or, for ``"counting"``, ``CountingSink``) and wraps it in ``TimedSink``, then calls the CLI's
``main(["run", "-c", CONFIG])``: its logging, its SIGTERM handling (the parent stops the
engine with SIGTERM), the engine, the sink. Everything the parent needs comes back as JSON
lines on the pipe whose write end is ``spec["fd"]``; all times are ``time.monotonic()``,
one clock for every process of the machine.

Messages: ``open`` (the sink is open), ``probe`` (the engine logged the parent's ``log``
signal: it reads the log), ``spark`` (the Spark session is up, with its start time),
``signal`` (the engine logged the ``execute-snapshot`` signal), ``ticks`` (ticker events
that reached the sink), ``done`` (the last READ row is acknowledged, or for Spark landed),
``exit`` (the CLI returned).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from signals.names import TableId
from snapshotter.core.events import Op
from snapshotter.core.window import ReadBatch, StagedReadBatch
from snapshotter.sinks.base import Ack, Sink, SinkItem

LANDING_POLL_S = 0.002


class Channel:
    """JSON lines to the parent; one lock, so messages of several threads never interleave."""

    def __init__(self, fd: int) -> None:
        self._file = os.fdopen(fd, "w", buffering=1, encoding="utf-8")
        self._lock = threading.Lock()

    def send(self, ev: str, **fields: Any) -> None:
        line = json.dumps({"ev": ev, "t": time.monotonic(), **fields}) + "\n"
        with self._lock, contextlib.suppress(BrokenPipeError):  # the parent is gone
            self._file.write(line)


class TimedSink:
    """Passes every call to ``inner``, noting what the bench measures.

    When the READ rows of ``table`` handed to the sink reach ``rows``, it asks the sink for a
    checkpoint at once (as ``run --until-caught-up`` asks for one when the snapshot is done),
    so the figure does not hold up to a checkpoint interval of waiting, and reports ``done``
    when the sink acknowledges it; for a sink that lands later (Spark: the acknowledgement
    says a batch is staged, ``{"staged": N}``), when ``inner.landed`` shows a landing that
    covers batch N. That checkpoint's acknowledgement is not passed on: the engine did not
    ask for it (it would ignore it anyway)."""

    def __init__(
        self,
        inner: Sink,
        chan: Channel,
        table: TableId,
        ticker: TableId | None,
        rows: int,
    ) -> None:
        self.inner = inner
        self.chan = chan
        self.table = table
        self.ticker = ticker
        self.rows = rows
        self.read_rows = 0
        self.marks: dict[str, float] = {}
        self.progress: list[tuple[float, int]] = []  # (time, READ rows so far) per write
        self._forced: int | None = None
        self._stash: list[Ack] = []
        self._closing = threading.Event()

    def __getattr__(self, name: str) -> Any:  # anything else a sink offers (landed, ...)
        return getattr(self.inner, name)

    def open(self, resume: Mapping[str, Any] | None) -> None:
        self.inner.open(resume)
        self.chan.send("open")

    def write(self, items: Sequence[SinkItem]) -> None:
        handed = time.monotonic()
        reads = 0
        ticks: list[int] = []
        for item in items:
            if isinstance(item, ReadBatch):
                if item.table == self.table:
                    reads += len(item)
            elif isinstance(item, StagedReadBatch):  # read on executors: rows in files
                if item.table == self.table:
                    reads += item.staged.selected
            elif item.op is Op.READ:  # an engine that hands READ rows one by one
                if item.table == self.table:
                    reads += 1
            elif self.ticker is not None and item.table == self.ticker and item.after:
                ticks.append(int(item.after["seq"]))
        if reads and "first_read" not in self.marks:
            self.marks["first_read"] = handed
        self.inner.write(items)
        if ticks:
            self.chan.send("ticks", arrived=handed, seqs=ticks)
        if not reads:
            return
        self.read_rows += reads
        written = time.monotonic()
        self.progress.append((written, self.read_rows))
        if self.read_rows >= self.rows and self._forced is None:
            self.marks["last_read_handed"] = handed
            self.marks["last_read_written"] = written
            self._forced = self.inner.checkpoint()
            self.marks["checkpoint_returned"] = time.monotonic()
            self._collect()  # counting, JSONL, Spark staging: acknowledged at once

    def checkpoint(self) -> int:
        return self.inner.checkpoint()

    def acknowledged(self) -> list[Ack]:
        self._collect()
        acks, self._stash = self._stash, []
        return acks

    def close(self) -> None:
        self._closing.set()
        self.inner.close()

    def _collect(self) -> None:
        for ack in self.inner.acknowledged():
            if ack.checkpoint == self._forced and "acked" not in self.marks:
                self.marks["acked"] = time.monotonic()
                self._acked(ack)
            else:
                self._stash.append(ack)

    def _acked(self, ack: Ack) -> None:
        staged = ack.resume.get("staged")
        landed = getattr(self.inner, "landed", None)
        if isinstance(staged, int) and isinstance(landed, list):
            threading.Thread(
                target=self._watch_landing, args=(landed, staged), name="bench-landed", daemon=True
            ).start()
        else:
            self._done()

    def _watch_landing(self, landed: list[Any], seq: int) -> None:
        """Until a landing covers staged batch ``seq`` (``Landed.batches``)."""
        seen = 0
        while not self._closing.is_set():
            while seen < len(landed):
                batches = landed[seen].batches
                seen += 1
                if batches and max(batches) >= seq:
                    self.marks["landed"] = time.monotonic()
                    self._done()
                    return
            time.sleep(LANDING_POLL_S)

    def _done(self) -> None:
        self.chan.send(
            "done", marks=self.marks, read_rows=self.read_rows, progress=self.progress[:]
        )


class LogWatch(logging.Handler):
    """Tells the parent when the engine logs its probe (a ``log`` signal with ``token``), the
    ``execute-snapshot`` signal (both only happen once the engine reads the log) and a
    snapshot done, and every error it logs (a failed snapshot: the engine streams on, the
    bench must not wait for it)."""

    def __init__(self, chan: Channel, token: str) -> None:
        super().__init__()
        self.chan = chan
        self.token = token

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:
            return
        if record.levelno >= logging.ERROR:
            self.chan.send("error", message=f"{record.name}: {message}")
        elif self.token in message:
            self.chan.send("probe")
        elif "(execute-snapshot) received" in message:
            self.chan.send("signal")
        elif message.startswith("snapshot of ") and " done: " in message:
            self.chan.send("snapshot_done", message=message)


def watch_parent(interval: float = 1.0) -> None:
    """Stop the engine (SIGTERM, as the parent would) if the bench that started it dies."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="bench-parent-watch", daemon=True).start()


def time_spark_session(chan: Channel) -> None:
    """Wrap ``snapshotter.sinks.spark.session.spark_session`` (the sink calls it when it starts
    Spark) to report when the session is up and how long it took."""
    try:
        from snapshotter.sinks.spark import session
    except ImportError:  # no pyspark: no Spark runs either
        return
    original: Callable[..., Any] = session.spark_session

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        spark = original(*args, **kwargs)
        chan.send("spark", session_s=time.monotonic() - started)
        return spark

    session.spark_session = timed


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    chan = Channel(spec["fd"])
    watch_parent()
    # mysql-replication warns on every reconnect, closing the binlog stream included.
    logging.getLogger("pymysqlreplication").setLevel(logging.ERROR)
    logging.getLogger("snapshotter").addHandler(LogWatch(chan, spec["probe"]))
    if spec["sink"] == "spark":
        time_spark_session(chan)

    from bench.lib.counting import CountingSink
    from snapshotter.app import cli, runner

    configured = runner.sink_for
    holder: list[TimedSink] = []
    ticker = TableId(*spec["ticker"].split(".", 1)) if spec.get("ticker") else None

    def open_sink(config: Any, describe: Any, key_names: Any) -> Sink:
        inner = (
            CountingSink()
            if spec["sink"] == "counting"
            else configured(config, describe, key_names)
        )
        timed = TimedSink(inner, chan, TableId(*spec["table"].split(".", 1)), ticker, spec["rows"])
        holder.append(timed)
        return timed

    runner.sink_for = open_sink  # build_engine looks it up at call time
    code = cli.main(["run", "-c", spec["config"]])
    landed = [x.rows for x in getattr(holder[0].inner, "landed", [])] if holder else []
    chan.send(
        "exit",
        code=code,
        read_rows=holder[0].read_rows if holder else 0,
        landed_rows=sum(landed),
        maxrss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    )
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

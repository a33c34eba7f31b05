"""Fault injection: named points where the process kills itself (SIGKILL), or where the
code raises, on request.

The fault suite (tests/integration/test_faults.py) proves that a hard crash at any step of a
snapshot loses nothing: it runs ``snapshotter run`` with, say,
``SNAPSHOTTER_FAULTS=window.close@4``, and the process dies the fourth time it reaches the
point where a close watermark has been seen and its READ rows are not yet emitted. Nothing
is flushed, closed or saved on the way out, as after a power cut or the OOM killer.

Points (each named where it is placed, with the moment it stands for):

* ``watermark.open``: the open watermark committed, the chunk SELECT not yet run.
* ``chunk.select``: inside the chunk's read transaction, rows fetched, not yet committed.
* ``window.close``: the close watermark seen in the log, READ rows not yet emitted.
* ``sink.flush``: halfway through handing a batch of events to the sink (JSONL: half the
  bytes written, often a torn line; Kafka: half the messages sent; Spark: a staged batch's
  files written, not yet renamed into place).
* ``state.write``: the new state file written and fsynced under its temporary name, not yet
  renamed over the old one.
* ``spark.land``: a Spark landing under way (the changelog appended, the table's landing
  record not yet updated).
* ``executor.reads``: Spark tasks reading a window's sub-ranges on executors
  (``[snapshot] executors``).
* ``spark.compact.written``: a Parquet compaction's new base written, the table's landing
  record not yet naming it (the new base is a stray: a plain reader would see it besides
  the old one).
* ``spark.compact.named``: a Parquet compaction's new base named by the landing record, the
  old base not yet deleted (the old base is a stray).
* ``spanner.partition_end``: a Spanner change-stream partition has ended (its children
  named, some of them waiting for other parents; records of several partitions buffered).
* ``spark.iceberg.changelog``: an Iceberg landing's changelog committed, its current state
  not yet.
* ``spark.iceberg.appended``: an Iceberg landing's appends to the current state committed
  (READ rows of new keys), its merge not yet.
* ``spark.lander``: the Spark sink's lander thread, between two landings (where a wait on an
  infinite timeout once raised OverflowError outside any handler).
* ``chunks.worker``: a chunk worker's thread, between two tasks.
* ``binlog.read``: the MySQL binlog reader's thread, at each event.
* ``spanner.partition_query``: a Spanner change-stream partition's thread, as its query
  starts.

``point@N:raise`` raises :class:`InjectedFault` there instead of killing the process: the
thread-failure tests (tests/integration/test_thread_failures.py) check that an exception in
any background thread's work is retried or stops the engine with the reason: never a thread
dying silently.

Unset (always, outside tests) a point costs one attribute lookup.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from collections.abc import Callable

ENV = "SNAPSHOTTER_FAULTS"
POINTS = (
    "watermark.open",
    "chunk.select",
    "window.close",
    "sink.flush",
    "state.write",
    "spark.land",
    "spark.compact.written",
    "spark.compact.named",
    "spark.iceberg.changelog",
    "spark.iceberg.appended",
    "executor.reads",
    "spanner.partition_end",
    "spark.lander",
    "chunks.worker",
    "binlog.read",
    "spanner.partition_query",
)
RAISE = "raise"


class InjectedFault(RuntimeError):
    """Raised at a ``point@N:raise`` fault."""


class FaultSpecError(ValueError):
    """``SNAPSHOTTER_FAULTS`` is not a list of ``point@N``."""


def parse(spec: str) -> dict[str, tuple[int, bool]]:
    """``"window.close@4,spark.lander@1:raise"`` -> ``{"window.close": (4, False),
    "spark.lander": (1, True)}``: kill (or raise) at the N-th time the point is reached
    (counted from 1, per process)."""
    faults: dict[str, tuple[int, bool]] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, at, rest = part.partition("@")
        count, colon, action = rest.partition(":")
        if name not in POINTS:
            raise FaultSpecError(f"{ENV}: unknown fault point {name!r}; known: {', '.join(POINTS)}")
        if not at or not count.isdigit() or int(count) < 1 or (colon and action != RAISE):
            raise FaultSpecError(f"{ENV}: {part!r} must be {name}@N or {name}@N:raise, N >= 1")
        faults[name] = (int(count), bool(colon))
    return faults


class _Faults:
    def __init__(self, spec: str) -> None:
        self.armed = parse(spec)
        self._passed: dict[str, int] = {}
        self._lock = threading.Lock()  # points are reached from several threads
        # A run that ends without its fault says how often each point was reached, so the
        # suite can tell a moment drawn too late from a point that is never reached.
        atexit.register(self._report)

    def _report(self) -> None:
        reached = ", ".join(f"{p} {n}" for p, n in sorted(self._passed.items())) or "none"
        sys.stderr.write(f"snapshotter: fault points reached: {reached}\n")

    def reach(self, point: str, before: Callable[[], object] | None) -> None:
        at, raising = self.armed.get(point, (0, False))
        with self._lock:
            seen = self._passed[point] = self._passed.get(point, 0) + 1
        if seen == at:
            if before is not None:
                before()
            if raising:
                sys.stderr.write(f"snapshotter: fault {point}@{at}: raising\n")
                raise InjectedFault(f"injected fault at {point} (reached {at} times)")
            # stderr is unbuffered: the suite reads this line to know the fault was hit.
            sys.stderr.write(f"snapshotter: fault {point}@{at}: killing the process\n")
            os.kill(os.getpid(), signal.SIGKILL)


_faults: _Faults | None = _Faults(os.environ[ENV]) if os.environ.get(ENV) else None


def failpoint(point: str, before: Callable[[], object] | None = None) -> None:
    """Die (or raise) here if ``SNAPSHOTTER_FAULTS`` asks for it (see the module's docstring);
    when this is the fatal reach, ``before`` runs first to set the moment up (write half a
    batch)."""
    if _faults is not None:
        _faults.reach(point, before)


def fault_armed(point: str) -> bool:
    """Whether ``SNAPSHOTTER_FAULTS`` names ``point`` (a caller may then arrange the moment
    its fault needs)."""
    return _faults is not None and point in _faults.armed

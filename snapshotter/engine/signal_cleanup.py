"""Deleting the engine's own watermark rows from the signal table (``[source] signal_cleanup``).

Each chunk writes two rows (its open and close watermarks); without cleanup they stay forever.

Why deleting them is safe: the engine never reads watermarks from the table. It sees them in
the log, and a row's INSERT is in the log, with the row's contents, once it has committed. A
later DELETE adds a delete event to the log, which the engine ignores (it acts on created
signal rows only), and takes nothing from what was logged: a replay after a restart still
reads every inserted watermark from the saved position on. (And a restarted engine ignores
the watermarks of an earlier run's windows anyway: windows live in memory only, and an
unfinished snapshot goes on from its last durable chunk with new windows.)

Still, a window's rows go only once the window is over for the engine: when it has handled
the window's close watermark (both rows are in the log by then), or when the window's chunk
task failed (it is never continued: a new window reads that chunk again). Rows that earlier
runs or a crash left behind are found by a sweep over the table at start, which skips the
windows this run has in flight. Only rows of a watermark type whose id is ``<uuid>-open`` or
``<uuid>-close`` to match are ever deleted: user signals never.

The deletes run on the chunk worker's thread (it owns the snapshot side's database calls),
never on the stream's: at most one batch between two chunk tasks, the rest while the worker
is idle, so chunks are not slowed noticeably.
"""

from __future__ import annotations

import logging
import re
import threading
import time

from signals.model import Watermark, WatermarkKind
from signals.names import TableId
from snapshotter.sources.base import Dialect

log = logging.getLogger("snapshotter.cleanup")

# A failed delete for a transient reason (the database restarting) is tried again after this.
RETRY_AFTER_S = 5.0
# At shutdown, the windows already over are deleted (and the sweep finished) for at most this
# long; what is left is for the next start's sweep.
FLUSH_FOR_S = 5.0
# How long the idle worker waits for a task before it deletes the rows of finished windows
# (while there are some), and before it looks again (while there are none).
IDLE_S = 0.2
POLL_S = 1.0

_WATERMARK_ID = re.compile(
    r"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})-(open|close)"
)


def window_of(row_id: str, row_type: str) -> str | None:
    """The window of an engine watermark row (``<uuid>-open`` of type snapshot-window-open,
    ``<uuid>-close`` of type snapshot-window-close); None for any other row."""
    match = _WATERMARK_ID.fullmatch(row_id)
    if match is None:
        return None
    window = match.group(1)
    if Watermark(window, WatermarkKind(match.group(2))).type.value != row_type:
        return None
    return window


class WatermarkCleanup:
    """Which windows' rows may go, and deleting them in batches of ``batch`` rows.

    The engine's thread calls ``opened`` and ``finished``; the worker's calls ``step`` and
    ``flush``."""

    def __init__(self, dialect: Dialect, table: TableId, batch: int, *, sweep: bool = True) -> None:
        self._dialect = dialect
        self._table = table
        self.batch = max(2, batch)
        self._lock = threading.Lock()
        self._finished: list[str] = []  # windows over, rows not deleted yet (under _lock)
        self._in_flight: set[str] = set()  # windows registered and not over (under _lock)
        self._sweeping = sweep
        self._swept_to: str | None = None  # the sweep's last id
        self._paused_until = 0.0
        self._disabled = False
        self.deleted = 0  # rows deleted by this run

    # --- the engine's thread --------------------------------------------------------------

    def opened(self, window_id: str) -> None:
        """A window was registered (before its open watermark is written)."""
        with self._lock:
            self._in_flight.add(window_id)

    def finished(self, window_id: str) -> None:
        """A window is over: its close watermark was handled, or its chunk task failed."""
        with self._lock:
            self._in_flight.discard(window_id)
            self._finished.append(window_id)

    # --- the worker's thread --------------------------------------------------------------

    def wait_s(self) -> float | None:
        """How long the worker may wait for a task before ``step(idle=True)``: not at all
        while sweeping, a moment while finished windows wait (a task may come and more
        windows finish: fewer, larger deletes), a while otherwise (windows finish on the
        engine's thread); None: no cleanup to do ever (disabled)."""
        if self._disabled:
            return None
        paused = self._paused_until - time.monotonic()
        if paused > 0:
            return paused
        if self._sweeping:
            return 0.0
        with self._lock:
            return IDLE_S if self._finished else POLL_S

    def step(self, *, idle: bool) -> None:
        """At most one batch: finished windows' rows once a batch is full (any number when
        ``idle``), else one page of the sweep."""
        if self._disabled or time.monotonic() < self._paused_until:
            return
        per_batch = self.batch // 2  # two rows per window
        with self._lock:
            ready = len(self._finished) >= per_batch or (idle and bool(self._finished))
            windows = self._finished[:per_batch]
        try:
            if ready:
                self.deleted += self._dialect.delete_watermarks(windows)
                with self._lock:
                    del self._finished[: len(windows)]
            elif self._sweeping:
                self._sweep_page()
        except Exception as exc:
            self._failed(exc)

    def flush(self, deadline_s: float = FLUSH_FOR_S) -> None:
        """At shutdown: delete the rows of every finished window, and finish the sweep, for
        at most ``deadline_s`` (what is left is for the next start's sweep)."""
        deadline = time.monotonic() + deadline_s
        self._paused_until = 0.0
        while not self._disabled and time.monotonic() < deadline:
            with self._lock:
                if not self._finished and not self._sweeping:
                    return
            self.step(idle=True)
            if self._paused_until:
                return  # the database is away

    def _sweep_page(self) -> None:
        rows = self._dialect.watermark_rows(self._swept_to, self.batch)
        if len(rows) < self.batch:
            self._sweeping = False
            log.debug("watermark sweep of %s done", self._table)
        if rows:
            self._swept_to = rows[-1][0]
        with self._lock:
            in_flight = set(self._in_flight)
        stale = [
            w
            for w in dict.fromkeys(window_of(row_id, row_type) for row_id, row_type in rows)
            if w is not None and w not in in_flight
        ]
        if stale:
            self.deleted += self._dialect.delete_watermarks(stale)

    def _failed(self, exc: Exception) -> None:
        text = " ".join(str(getattr(exc, "orig", None) or exc).split())
        try:
            transient = self._dialect.is_transient(exc)
        except Exception:  # a classification bug must not end the worker's thread
            transient = False
        if transient:
            log.debug(
                "deleting watermark rows from %s failed (%s); trying again", self._table, text
            )
            self._paused_until = time.monotonic() + RETRY_AFTER_S
            return
        self._disabled = True
        log.warning(
            "cannot delete watermark rows from the signal table %s (%s); they stay. Grant the "
            "engine's user DELETE on it, or set [source] signal_cleanup = false",
            self._table,
            text,
        )

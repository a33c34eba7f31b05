"""Time limits and cancellation for the chunk connection's max-key and chunk queries.

A filter (``additional-conditions``) is SQL from the signal table: it can make one query run
for hours (``pg_sleep``, ``SLEEP``, a cross join). The dialects give each query a
server-side statement timeout (``[source] chunk_timeout_s``); the guard is the client side
of that limit, and of stopping:

* a watchdog thread cancels a query still running ``GRACE_S`` after its limit (a filter may
  switch the server's timeout off, or the server may not check it where the query waits);
* ``cancel`` stops the running query at once (stop-snapshot, shutdown) and refuses the
  queries started after it, until ``allow``.

The dialect supplies how to cancel (PostgreSQL: a cancel request; MySQL: ``KILL QUERY``
from another connection) and reads the outcome after the query: a query the guard
cancelled failed because of it, whatever the driver raised (or did not: MySQL's ``SLEEP``
returns 1 when killed).
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from signals.names import TableId
from snapshotter.sources.base import ReadCancelled, TableError

log = logging.getLogger("snapshotter.chunks")

DEFAULT_TIMEOUT_S = 300.0  # [source] chunk_timeout_s's default
# How long after its limit a query still running is cancelled by the client: the server's
# own timeout, a clearer error, fires first when it can.
GRACE_S = 1.0
# How long a cancel request may take (it opens a connection of its own).
CANCEL_TIMEOUT_S = 5.0


class Outcome(enum.Enum):
    TIMED_OUT = "timed out"
    CANCELLED = "cancelled"


@dataclass
class GuardedQuery:
    """One query under the guard: when the watchdog cancels it, and what the guard did."""

    started: float  # time.monotonic()
    deadline: float
    send_cancel: Callable[[], None]
    outcome: Outcome | None = None

    def ran_for(self, seconds: float) -> bool:
        """Whether the query has run ``seconds`` (a server's own timeout error is only
        taken for one when it has: its SQLSTATE is shared with other cancels)."""
        return time.monotonic() - self.started >= seconds


class QueryGuard:
    """Watches one connection's queries (one at a time); thread-safe."""

    def __init__(self, grace_s: float = GRACE_S) -> None:
        self._grace_s = grace_s
        self._cond = threading.Condition()
        self._current: GuardedQuery | None = None
        self._cancelled = False  # sticky: set by cancel(), cleared by allow()
        self._closed = False
        self._thread: threading.Thread | None = None

    def allow(self) -> None:
        """Let queries run again after ``cancel``."""
        with self._cond:
            self._cancelled = False

    def cancel(self) -> None:
        """Cancel the running query, if any, and refuse later ones until ``allow``."""
        with self._cond:
            self._cancelled = True
            query = self._current
            if query is not None and query.outcome is None:
                query.outcome = Outcome.CANCELLED
                # Under the lock: the query cannot end (and the connection start another)
                # before the cancel request was delivered.
                _send(query)

    @contextmanager
    def running(self, timeout_s: float, send_cancel: Callable[[], None]) -> Iterator[GuardedQuery]:
        """Watch the query run in the ``with`` block; ReadCancelled at once after
        ``cancel``. The caller checks ``outcome`` when the block ends, normally or not."""
        now = time.monotonic()
        query = GuardedQuery(now, now + timeout_s + self._grace_s, send_cancel)
        with self._cond:
            if self._cancelled:
                raise ReadCancelled("cancelled before it started")
            self._start_watchdog()
            self._current = query
            self._cond.notify_all()
        try:
            yield query
        finally:
            with self._cond:
                self._current = None
                self._cond.notify_all()

    def close(self) -> None:
        """End the watchdog thread (a later query starts it again)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(CANCEL_TIMEOUT_S)

    def _start_watchdog(self) -> None:
        if self._thread is not None and self._thread.is_alive() and not self._closed:
            return
        self._closed = False
        self._thread = threading.Thread(
            target=self._watch, name="snapshotter-query-watchdog", daemon=True
        )
        self._thread.start()

    def _watch(self) -> None:
        with self._cond:
            while not self._closed:
                query = self._current
                if query is None or query.outcome is not None:
                    self._cond.wait()
                    continue
                remaining = query.deadline - time.monotonic()
                if remaining > 0:
                    self._cond.wait(remaining)
                    continue
                query.outcome = Outcome.TIMED_OUT
                _send(query)


def _send(query: GuardedQuery) -> None:
    try:
        query.send_cancel()
    except Exception as exc:  # the query runs on; the next stop or shutdown tries again
        log.warning("could not cancel a query (%s): %s", query.outcome, exc, exc_info=True)


def timeout_error(what: str, table: TableId, timeout_s: float, filtered: bool) -> TableError:
    """The snapshot's failure when its query ran past ``chunk_timeout_s``."""
    cause = (
        "simplify the snapshot's filter (additional-conditions)"
        if filtered
        else ("lower [source] chunk_size")
    )
    return TableError(
        f"{what} on table {table} ran longer than chunk_timeout_s = {timeout_s:g} s and was "
        f"cancelled; raise [source] chunk_timeout_s or {cause}, then send execute-snapshot "
        "again"
    )


def cancelled_error(what: str, table: TableId) -> ReadCancelled:
    return ReadCancelled(f"{what} on table {table} cancelled (stop-snapshot or shutdown)")


def session_changed_error(
    table: TableId,
    kind: str,
    names: Sequence[str],
    before: Sequence[object],
    after: Sequence[object],
    fix: str,
) -> TableError | None:
    """The error for a filter that changed one of the session settings ``names`` (values
    ``before`` the query and ``after`` it), which changes the values read or how they are
    written; None when nothing changed. ``kind``: "setting" or "variable"."""
    for name, old, new in zip(names, before, after, strict=True):
        if old != new:
            return TableError(
                f"the filter of the snapshot of {table} changed the session {kind} {name} "
                f"(from {old!r} to {new!r}), which changes the values read or how they are "
                f"written: its rows would differ from the log's. {fix}"
            )
    return None

"""Outages of the source database, as the snapshot side meets them: how long to wait before
the next database call, and when to give up.

The snapshot side's database calls (the chunk workers' tasks, listing tables for a signal,
reading the log end) failing for a transient reason (the dialect's ``is_transient``:
connection lost, server restarting or unreachable) are retried, after RETRY_FIRST_S
doubling up to RETRY_MAX_S, for up to ``retry_for`` seconds of continuous failure
(SOURCE_RETRY_FOR_S when the engine is given none); then the engine stops with its state
saved. Nothing is failed or lost by an outage: ``snapshotter resume`` goes on.

This module only keeps the books (when the outage began, when the next call may run); what
to retry (a chunk's window voided, a task submitted again) is the engine's and the
scheduler's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import sqlalchemy as sa

log = logging.getLogger("snapshotter.engine")

T = TypeVar("T")

SOURCE_RETRY_FOR_S = 60.0
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 5.0
# A failure this long after the last one (nothing was retried in between: say the snapshot
# was paused) starts a new outage.
OUTAGE_GAP_S = 30.0


class SourceUnavailableError(ConnectionError):
    """The source database stayed unreachable past the retry bound. Nothing is failed or
    lost: the engine stopped with its state saved, and ``snapshotter resume`` continues."""


class SourceRetry:
    """The books of the current outage of the source (if any) and its backoff."""

    def __init__(
        self,
        *,
        server: str,
        retry_for: float | None = None,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
    ) -> None:
        self._server = server  # host:port/database, for messages
        # Read here, not at import: tests shorten the bound by patching SOURCE_RETRY_FOR_S.
        self.retry_for = SOURCE_RETRY_FOR_S if retry_for is None else retry_for
        self._clock = clock
        self._sleep = sleep
        self._last_failure = 0.0
        self._failing_since: float | None = None  # first failure of the current outage
        self._retry_at = 0.0  # no database call of the snapshot side before this
        self._delay = RETRY_FIRST_S
        self.retried_tasks = 0  # tasks submitted again after a transient failure (this run)

    def waiting(self) -> bool:
        """Whether the snapshot side must not call the database yet (backing off)."""
        return self._clock() < self._retry_at

    def wait_s(self) -> float:
        """How long until the next database call may run (0: now)."""
        return max(0.0, self._retry_at - self._clock())

    def failed(self, what: str, error: str) -> None:
        """Note a transient failure of ``what``; raise SourceUnavailableError once the
        snapshot side's calls have failed for ``retry_for`` seconds in a row."""
        now = self._clock()
        if self._failing_since is None or now - self._last_failure > OUTAGE_GAP_S:
            self._failing_since = now
            self._delay = RETRY_FIRST_S
        self._last_failure = now
        failing = now - self._failing_since
        if failing >= self.retry_for:
            raise SourceUnavailableError(
                f"the source database ({self._server}) has been unreachable for "
                f"{failing:.0f} s ({what}: {error}); stopping. Nothing is lost and no "
                "snapshot is marked failed: the state is saved, and `snapshotter resume` "
                "continues where it stopped once the database is up"
            )
        log.warning(
            "%s: the source database is unreachable (%s); retrying in %.1f s (for up to "
            "%.0f s more)",
            what,
            error,
            self._delay,
            self.retry_for - failing,
        )
        self._retry_at = now + self._delay
        self._delay = min(self._delay * 2, RETRY_MAX_S)

    def answered(self) -> None:
        """A database call of the snapshot side succeeded: the outage, if any, is over."""
        if self._failing_since is not None:
            log.info(
                "the source database answers again after %.1f s; the snapshot goes on",
                self._clock() - self._failing_since,
            )
            self._failing_since = None
            self._retry_at = 0.0

    def wait_out(
        self, what: str, call: Callable[[], T], is_transient: Callable[[BaseException], bool]
    ) -> T:
        """``call()`` on this thread, waiting out a source that is restarting: a transient
        failure is tried again after the backoff, until the bound (SourceUnavailableError);
        any other error is raised at once."""
        while True:
            try:
                answer = call()
            except Exception as exc:
                if not is_transient(exc):
                    raise
                self.failed(what, str(exc))
                self._sleep(self.wait_s())
                continue
            self.answered()
            return answer


def server_of(url: str) -> str:
    """The source as host:port/database, without credentials (for messages)."""
    try:
        parsed = sa.make_url(url)
    except Exception:
        return "the configured source.url"
    return f"{parsed.host or 'localhost'}:{parsed.port or 'default port'}/{parsed.database or ''}"

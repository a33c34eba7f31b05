"""Chunks read again because their snapshot missed a transaction open as the engine started
(rule 4 across restarts, ``core.visibility``): the next chunk waits, longer each time, and a
warning names the transactions that hold the snapshot up and how to let it go on.

Usually the wait is for transactions that were committing as the engine started
(milliseconds): the first re-read waits ``FIRST_WAIT_S``. A transaction that stays open (a
long statement, a forgotten prepared transaction) would otherwise have its chunks read again
back to back for as long as it lives: the wait doubles up to ``MAX_WAIT_S``, so the source
sees one chunk read every few seconds, and after ``WARN_AFTER_S`` of it (then every
``WARN_EVERY_S``) a warning says which transaction to end. The wait holds every new task
(not only the table's): a chunk read meanwhile would miss the same transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from signals.names import TableId
from snapshotter.core.visibility import OpenTransaction

log = logging.getLogger("snapshotter.engine")

FIRST_WAIT_S = 0.2
MAX_WAIT_S = 5.0
WARN_AFTER_S = 30.0
WARN_EVERY_S = 300.0
LISTED = 5  # transactions named in a warning, at most


class StartGuardWait:
    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._started = clock()  # about when the engine asked (sessions' ages are from then)
        self._wait = 0.0  # the last wait
        self._until = 0.0  # no new task before then
        self._since: float | None = None  # the first re-read since a chunk was last used
        self._warned: float | None = None

    def holding(self) -> bool:
        """Whether new tasks wait (a chunk was just read again for nothing)."""
        return self._clock() < self._until

    def read_again(self, table: TableId, number: int, missed: Sequence[OpenTransaction]) -> None:
        """Chunk ``number`` of ``table`` is read again: its snapshot missed ``missed`` (none:
        a transaction the history forgot, which is visible soon; no wait then)."""
        if not missed:
            why = "its snapshot missed a transaction of unknown keys: see core.visibility"
            log.info("chunk %d of %s: re-read (%s)", number, table, why)
            return
        now = self._clock()
        if self._since is None:
            self._since = now
        if now >= self._until:  # windows read before the wait began do not double it
            self._wait = min(MAX_WAIT_S, 2 * self._wait) if self._wait else FIRST_WAIT_S
            self._until = now + self._wait
        xids = ", ".join(str(t.xid) for t in missed)
        log.info(
            "chunk %d of %s: re-read in %.1f s (its snapshot missed transaction %s, open as "
            "the engine started: see core.visibility)",
            number,
            table,
            self._until - now,
            xids,
        )
        waited = now - self._since
        if waited >= WARN_AFTER_S and (self._warned is None or now - self._warned >= WARN_EVERY_S):
            self._warned = now
            log.warning("%s", held_up(table, missed, waited, now - self._started))

    def passed(self) -> None:
        """A chunk's snapshot saw every transaction still in doubt ended: no more waits."""
        self._wait = self._until = 0.0
        self._since = self._warned = None


def held_up(
    table: TableId, missed: Sequence[OpenTransaction], waited_s: float, since_start_s: float
) -> str:
    """The warning: what holds the snapshot up, and the way out."""
    named = [_describe(t, since_start_s) for t in missed[:LISTED]]
    if len(missed) > LISTED:
        named.append(f"and {len(missed) - LISTED} more")
    hidden = any(t.pid is not None and t.state is None for t in missed)
    hint = (
        "; granting pg_read_all_stats (or pg_monitor) to the engine's user lets it see which "
        "sessions are idle in transaction (those never hold it up)"
        if hidden
        else ""
    )
    return (
        f"snapshot of {table} held up for {_duration(waited_s)}: its chunks are read again "
        f"until these transactions, open when the engine started, end: {', '.join(named)}. "
        "One may have committed before the point the log resumed from and still be "
        "invisible (docs/design.md, rule 4). End it (COMMIT or ROLLBACK in its session, "
        "pg_terminate_backend(pid), COMMIT/ROLLBACK PREPARED 'gid') and the snapshot goes on"
        f"{hint}"
    )


def _describe(t: OpenTransaction, since_start_s: float) -> str:
    age = "" if t.age_s is None else f", open {_duration(t.age_s + since_start_s)}"
    if t.prepared is not None:
        return f"xid {t.xid} (prepared transaction '{t.prepared}'{age})"
    if t.pid is None:
        return f"xid {t.xid} (no session shows it)"
    state = t.state if t.state is not None else "state hidden from the engine's user"
    return f"xid {t.xid} (pid {t.pid}, {state}{age})"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"

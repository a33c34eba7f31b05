"""Which logged transactions a chunk SELECT could not see, and the rows they made stale.

The DBLog argument assumes that a transaction committed before the open watermark (in log
order) is visible to the chunk SELECT, which starts after the open watermark committed. In
PostgreSQL that is not quite true: a commit is written to the WAL first and becomes visible
(leaves the proc array) a moment later - much later under synchronous replication, which
waits in between. The logical decoder sends a transaction once its commit record is flushed,
so a transaction can sit in the log *before* our open watermark and still be invisible to the
SELECT that follows it. The window ignores log events before its open watermark, so the stale
value the SELECT read for such a transaction's keys would survive and be emitted after the
transaction's own, fresher, event: the sink would end up with the older row.

The fix: record the chunk transaction's snapshot (``pg_current_snapshot()``), keep a short
history of the keys each recently committed transaction touched, and at the close watermark
drop the chunk's rows for keys of every transaction positioned before the open watermark that
the snapshot lists as in progress (or at/after its xmax). If the history lost a transaction
that might matter (it is bounded), the chunk is re-read instead.

Across a restart. The history is learnt from the log, and a new engine reads the log only
from its resume point R on (on a first start: where ``init`` created the slot): a
transaction T committed before R (its events, if any, already in the output) but still
invisible afterwards (a commit stuck waiting for a synchronous standby while the engine
restarted) is in no history, so a chunk read after the restart could emit the row T made
stale. So the engine asks, as it starts and before any chunk of this run is read, for the
range of xids that may still be open (``unfinished_xids``): from the xmin of a snapshot S0
taken then up to an xid assigned right after S0. Until one chunk snapshot (with every other
that can still ask) sees every transaction of that range ended, a chunk whose snapshot
misses one of them is read again, as for a forgotten transaction (``started``).

Why that covers T: T's commit was in the WAL before the previous run received it, so before
S0 was taken, and its xid was assigned before, so it is below the range's end; T was not
visible to S0 either (visibility only grows), so its xid is not below S0's xmin. (Not S0's
in-progress list alone: PostgreSQL lists only xids below its xmax, the newest ended one + 1,
so T can be at or past xmax, untold.) What it costs: a snapshot after a restart waits, its
chunks read again, for the writing transactions open as the engine started to end (as
CREATE INDEX CONCURRENTLY does) - usually milliseconds; a long-running writer or a forgotten
prepared transaction holds it up for as long as it lives.

Why not the alternatives: ``pg_xact_status`` cannot tell T from a transaction still running
(it asks the proc array first and answers "in progress" for both); and persisting the
history in the state would have to keep every transaction no snapshot has yet shown visible -
all of them while no snapshot runs - which is not bounded.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from signals.names import TableId
from snapshotter.core.keys import Key
from snapshotter.core.position import Position

_XID_SPACE = 1 << 32
_HALF = 1 << 31
_FIRST_NORMAL_XID = 3  # 0 invalid, 1 bootstrap, 2 frozen: always visible


class ReadVisibility(Protocol):
    """What a chunk SELECT's snapshot saw, in terms of the log's transaction ids."""

    def sees(self, xid: int) -> bool:
        """Whether the SELECT saw the effects of (committed) transaction ``xid``."""
        ...

    def settled(self, xid: int) -> bool:
        """Whether ``xid`` is older than every transaction this snapshot could miss, so any
        later snapshot sees it too (history about it can be forgotten)."""
        ...

    def sees_range(self, xids: XidRange) -> bool:
        """Whether every transaction of ``xids`` had ended when the snapshot was taken (so
        it, and every later snapshot, sees all that committed)."""
        ...


@dataclass(frozen=True, slots=True)
class XidRange:
    """The 64-bit transaction ids ``low <= xid < high``."""

    low: int
    high: int


def widen_xid(xid: int, reference: int) -> int:
    """The 64-bit transaction id nearest ``reference`` whose low 32 bits are ``xid``.

    pgoutput's Begin carries 32-bit xids; ``pg_current_snapshot()`` gives 64-bit ones
    (epoch << 32 | xid). A logged transaction is always within 2^31 of a current snapshot.
    """
    if not 0 <= xid < _XID_SPACE:
        raise ValueError(f"xid {xid} is not a 32-bit transaction id")
    candidate = (reference & ~(_XID_SPACE - 1)) | xid
    if candidate > reference + _HALF:
        candidate -= _XID_SPACE
    elif candidate < reference - _HALF:
        candidate += _XID_SPACE
    return candidate


@dataclass(frozen=True, slots=True)
class PgSnapshot:
    """``pg_current_snapshot()``: xids < xmin are visible, xids >= xmax are not, and those in
    between are visible unless listed in ``xip`` (in progress when the snapshot was taken)."""

    xmin: int
    xmax: int
    xip: frozenset[int] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if not 0 < self.xmin <= self.xmax:
            raise ValueError(f"snapshot needs 0 < xmin <= xmax, got {self.xmin}:{self.xmax}")
        outside = [x for x in self.xip if not self.xmin <= x < self.xmax]
        if outside:
            raise ValueError(f"snapshot in-progress xids {sorted(outside)} outside xmin..xmax")

    @classmethod
    def parse(cls, text: str) -> PgSnapshot:
        """Parse the text form ``xmin:xmax:xip1,xip2,...``."""
        try:
            xmin_text, xmax_text, xip_text = text.strip().split(":")
            xip = frozenset(int(x) for x in xip_text.split(",") if x)
            return cls(int(xmin_text), int(xmax_text), xip)
        except ValueError as exc:
            raise ValueError(f"{text!r} is not a pg_snapshot: {exc}") from None

    def _full(self, xid: int) -> int:
        return widen_xid(xid, self.xmax)

    def sees(self, xid: int) -> bool:
        if xid < _FIRST_NORMAL_XID:
            return True
        full = self._full(xid)
        if full < self.xmin:
            return True
        return full < self.xmax and full not in self.xip

    def settled(self, xid: int) -> bool:
        return xid < _FIRST_NORMAL_XID or self._full(xid) < self.xmin

    def sees_range(self, xids: XidRange) -> bool:
        return xids.high <= self.xmax and not any(xids.low <= x < xids.high for x in self.xip)


@dataclass(frozen=True, slots=True)
class AllSnapshots:
    """What several reads of one window saw together (a chunk split into sub-ranges, each
    read in a transaction of its own): a transaction counts as seen only if every read saw
    it, so the window drops the keys of any transaction one of them missed. Dropping more
    than one read needed is safe: those keys have log events before the open watermark,
    which the sink holds already."""

    snapshots: tuple[ReadVisibility, ...]

    def sees(self, xid: int) -> bool:
        return all(s.sees(xid) for s in self.snapshots)

    def settled(self, xid: int) -> bool:
        return all(s.settled(xid) for s in self.snapshots)

    def sees_range(self, xids: XidRange) -> bool:
        return all(s.sees_range(xids) for s in self.snapshots)


@dataclass(slots=True)
class _Transaction:
    xid: int
    position: Position  # its commit's position in the log
    keys: dict[TableId, set[Key]]


MAX_FORGOTTEN = 100_000


class RecentTransactions:
    """The keys recently committed transactions touched, per table, bounded in size.

    The engine records every captured change (``touch``) and each commit; at a close
    watermark it asks for the keys a chunk's snapshot missed (``stale_keys``). When over
    ``max_keys``, the oldest transactions are forgotten, but their xids are kept: if a later
    snapshot might have missed one of them, ``stale_keys`` answers None (re-read the chunk).
    """

    def __init__(self, max_keys: int = 200_000) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be positive")
        self.max_keys = max_keys
        self._committed: deque[_Transaction] = deque()
        self._open: dict[int, dict[TableId, set[Key]]] = {}
        self._size = 0
        self._open_size = 0
        self._overflowed: set[int] = set()
        # xid -> commit position of transactions whose keys were let go (too many keys).
        self._forgotten: dict[int, Position] = {}
        # The transactions that may have been open as the engine started (``started``):
        # one may have committed before the point the log resumed from, keys unknown.
        self._open_at_start: XidRange | None = None

    @property
    def size(self) -> int:
        """Keys held, committed transactions only."""
        return self._size

    def started(self, open_xids: XidRange) -> None:
        """The engine starts: ``open_xids`` holds every transaction not ended before any
        chunk of this run is read. Until a chunk's snapshot sees them all ended, a chunk
        that misses one of them is read again (one may have committed before where the log
        resumed; see the module docstring)."""
        self._open_at_start = open_xids

    def touch(self, xid: int, table: TableId, keys: Iterable[Key]) -> None:
        if xid in self._overflowed:
            return
        held = self._open.setdefault(xid, {}).setdefault(table, set())
        before = len(held)
        held.update(keys)
        self._open_size += len(held) - before
        if self._open_size > self.max_keys:
            # One huge transaction: keep only its xid (memory stays bounded); a chunk whose
            # snapshot missed it will be re-read.
            self._open_size -= sum(len(k) for k in self._open.pop(xid).values())
            self._overflowed.add(xid)

    def commit(self, xid: int, position: Position) -> None:
        if xid in self._overflowed:
            self._overflowed.discard(xid)
            self._forget(xid, position)
            return
        keys = self._open.pop(xid, None)
        if not keys:
            return
        self._open_size -= sum(len(k) for k in keys.values())
        if self._committed and position <= self._committed[-1].position:
            raise ValueError(f"commit at {position} is not after {self._committed[-1].position}")
        self._committed.append(_Transaction(xid, position, keys))
        self._size += sum(len(k) for k in keys.values())
        while self._size > self.max_keys and self._committed:
            old = self._committed.popleft()
            self._size -= sum(len(k) for k in old.keys.values())
            self._forget(old.xid, old.position)

    def _forget(self, xid: int, position: Position) -> None:
        self._forgotten[xid] = position
        if len(self._forgotten) > MAX_FORGOTTEN:
            # Bounded too: drop the oldest. A transaction that many commits old still being
            # invisible to a new snapshot would need a commit stalled for that long.
            del self._forgotten[next(iter(self._forgotten))]  # insertion = commit order

    def stale_keys(
        self, table: TableId, visibility: ReadVisibility, before: Position
    ) -> set[Key] | None:
        """Keys of ``table`` that transactions committed before ``before`` (the window's open
        watermark) wrote but the chunk's snapshot did not see; None if a forgotten
        transaction, or one open when the engine started, might be one of them (the chunk
        must be re-read)."""
        if self._open_at_start is not None and not visibility.sees_range(self._open_at_start):
            return None
        # Only forgotten transactions before the open watermark matter: later ones are in
        # the window's own reach.
        if any(
            position < before and not visibility.sees(xid)
            for xid, position in self._forgotten.items()
        ):
            return None
        stale: set[Key] = set()
        for txn in self._committed:
            if txn.position >= before:
                break
            if not visibility.sees(txn.xid):
                stale.update(txn.keys.get(table, ()))
        return stale

    def clear(self) -> None:
        """Forget what the log told (no snapshot is running, so no chunk can ask); not the
        transactions open at the start, which no later chunk may miss unawares."""
        self._committed.clear()
        self._open.clear()
        self._overflowed.clear()
        self._forgotten.clear()
        self._size = self._open_size = 0

    def abort(self, xid: int) -> None:
        """A transaction the reader saw begin but will never commit (not with pgoutput v1,
        which sends committed transactions only; kept for readers that can)."""
        keys = self._open.pop(xid, None)
        if keys:
            self._open_size -= sum(len(k) for k in keys.values())
        self._overflowed.discard(xid)

    def prune(self, visibility: ReadVisibility, *others: ReadVisibility) -> None:
        """Forget transactions every snapshot from now on sees (older than its xmin), and
        every one of ``others`` too (snapshots of chunks read earlier whose windows have
        not closed yet: with parallel reads they may close later, and ask then)."""
        snapshots = (visibility, *others)

        def settled(xid: int) -> bool:
            return all(s.settled(xid) for s in snapshots)

        while self._committed and settled(self._committed[0].xid):
            old = self._committed.popleft()
            self._size -= sum(len(k) for k in old.keys.values())
        self._forgotten = {x: p for x, p in self._forgotten.items() if not settled(x)}
        # Seen ended by every snapshot that can ask: by every later one too.
        doubt = self._open_at_start
        if doubt is not None and all(s.sees_range(doubt) for s in snapshots):
            self._open_at_start = None

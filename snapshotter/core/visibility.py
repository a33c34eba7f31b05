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
stale. So the engine asks, as it starts and before any chunk of this run is read, which
transactions may be such a T (``OpenAtStart``, ``Dialect.unfinished_xids``), and each of
them, by itself, keeps a chunk whose snapshot misses it from being used: the chunk is read
again (``started``, ``missed_at_start``), as for a forgotten transaction.

1. Every T is asked about. The server assigns an xid A to the question and ends it; then a
   snapshot S0 is taken. PostgreSQL's xmax is the newest ended xid + 1, so S0's xmax is
   past A. T's commit record was in the WAL before R, so before the engine started, and its
   xid was assigned before that: T < A < xmax. T is invisible to S0 (a chunk read later
   misses it, and visibility only grows), so S0 lists T in progress. So the xids S0 lists
   below A hold every T. (Not S0's in-progress list without A: xids at or past xmax are
   not listed, and T can be one of them.) There are at most as many as open transactions.

2. An xid whose commit (or abort) the log brings in this run, replayed or new, leaves the
   doubt (``commit``, ``abort``): from then on the history holds its keys like any logged
   transaction's (replayed changes are recorded too; a transaction of too many keys is
   remembered as forgotten, which also reads the chunk again), so the rule above handles a
   snapshot that misses it. A window only asks at its close watermark, after every item
   the log has before it, so a commit before its open watermark has been seen by then; one
   after it is in the window's own reach. Only xids open at the start and not yet seen in
   the log keep a chunk that misses them from being used.

3. An xid whose client backend ``pg_stat_activity`` showed *idle in transaction* (or *idle
   in transaction (aborted)*) never was in doubt (``OpenTransaction.not_committing``). A
   backend writes a commit record only while it executes a command (COMMIT, the statement
   that ends an implicit transaction, a Sync after an Execute, a procedure's COMMIT): it
   reports itself 'active' before it executes, and idle again only back in its main loop,
   after the commit has left the proc array (its ``backend_xid`` is gone by then). The
   activity is read after the engine started and before S0. Were T's commit record
   written before R, T's backend would have been executing that commit from before the
   read until after S0 (T is in progress there): 'active' throughout, whether the row's
   state or its xid was read first. So an idle xid's commit, if it comes, is written after
   the read, after R: the log brings it (2.). Kept in doubt, as they may be a T: prepared
   transactions (they have no session; COMMIT PREPARED runs in another backend and can
   wait for a synchronous standby with the transaction still listed); other backend types
   (autovacuum, replication workers: they commit without going idle); and sessions whose
   state the engine's role may not see: ``pg_stat_activity`` shows ``backend_xid`` to
   everyone but ``state`` only to members of the session's role and of
   ``pg_read_all_stats`` (``pg_monitor`` has it), which makes the rule precise for them.

4. An xid that every snapshot that can still ask sees ended is forgotten (``prune``): every
   later snapshot sees it too.

What it costs: a chunk whose snapshot misses an xid still in doubt is read again after a
wait that doubles (``engine.start_guard``), and after a while a warning names the
transaction and its session. Usually the wait is for transactions that were committing as
the engine started: milliseconds. A transaction active in a long statement when the engine
started, a forgotten prepared transaction, or a session of another role left idle in
transaction (without ``pg_read_all_stats``) holds the snapshot up for as long as it lives.

Why not the alternatives: ``pg_xact_status`` cannot tell T from a transaction still running
(it asks the proc array first and answers "in progress" for both); and persisting the
history in the state would have to keep every transaction no snapshot has yet shown visible -
all of them while no snapshot runs - which is not bounded.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from signals.names import TableId
from snapshotter.core.keys import Key
from snapshotter.core.position import Position

_XID_SPACE = 1 << 32
_HALF = 1 << 31
_FIRST_NORMAL_XID = 3  # 0 invalid, 1 bootstrap, 2 frozen: always visible
# pg_stat_activity's states of a client backend waiting for its client inside a transaction.
IDLE_IN_TRANSACTION = frozenset({"idle in transaction", "idle in transaction (aborted)"})


class ReadVisibility(Protocol):
    """What a chunk SELECT's snapshot saw, in terms of the log's transaction ids."""

    def sees(self, xid: int) -> bool:
        """Whether the SELECT saw the effects of (committed) transaction ``xid``."""
        ...

    def settled(self, xid: int) -> bool:
        """Whether ``xid`` is older than every transaction this snapshot could miss, so any
        later snapshot sees it too (history about it can be forgotten)."""
        ...


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


@dataclass(frozen=True, slots=True)
class OpenTransaction:
    """A transaction not ended as the engine started, as the server showed it: a session of
    ``pg_stat_activity`` or a prepared transaction of ``pg_prepared_xacts`` (or neither)."""

    xid: int  # 32 bits, as pg_stat_activity, pg_prepared_xacts and the log give it
    pid: int | None = None  # its session's backend
    state: str | None = None  # pg_stat_activity.state; None: hidden from the engine's role
    client: bool = False  # a client backend (not autovacuum, a replication worker, ...)
    age_s: float | None = None  # since it began (prepared: since PREPARE TRANSACTION)
    prepared: str | None = None  # the gid of a prepared transaction

    def not_committing(self) -> bool:
        """Whether it cannot have written a commit record before the engine started: its
        client backend was idle in it (module docstring, 3.)."""
        return self.client and self.prepared is None and self.state in IDLE_IN_TRANSACTION


@dataclass(frozen=True, slots=True)
class OpenAtStart:
    """What the engine asks as it starts (``Dialect.unfinished_xids``): ``snapshot`` was
    taken after the xid ``assigned`` (64 bits) was assigned and ended, and ``sessions``
    (what the server showed of the transactions open then) was read between the two."""

    assigned: int
    snapshot: PgSnapshot
    sessions: tuple[OpenTransaction, ...] = ()

    def __post_init__(self) -> None:
        if self.snapshot.xmax <= self.assigned:
            raise ValueError(
                f"snapshot {self.snapshot.xmin}:{self.snapshot.xmax} was taken before xid "
                f"{self.assigned} ended"
            )

    def in_doubt(self) -> dict[int, OpenTransaction]:
        """The transactions that may have committed before the log's resume point and be
        invisible still, by 32-bit xid (module docstring, 1. and 3.)."""
        shown: dict[int, OpenTransaction] = {}
        for session in self.sessions:  # of several rows of one xid, a busy one counts
            if session.xid not in shown or not session.not_committing():
                shown[session.xid] = session
        out: dict[int, OpenTransaction] = {}
        for full in sorted(self.snapshot.xip):
            if full >= self.assigned:
                continue  # began after the question: committed after the resume point
            xid = full % _XID_SPACE
            session = shown.get(xid, OpenTransaction(xid))
            if not session.not_committing():
                out[xid] = session
        return out


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
        # By 32-bit xid, the transactions open as the engine started that may have
        # committed before the point the log resumed from, keys unknown (``started``).
        self._open_at_start: dict[int, OpenTransaction] = {}

    @property
    def size(self) -> int:
        """Keys held, committed transactions only."""
        return self._size

    def started(self, open_at_start: OpenAtStart) -> None:
        """The engine starts, and has asked ``open_at_start`` before any chunk of this run is
        read: a chunk that misses one of the transactions in doubt is read again, until the
        log brings its end or every snapshot that can ask sees it ended (one may have
        committed before where the log resumed; see the module docstring)."""
        self._open_at_start = open_at_start.in_doubt()

    @property
    def open_at_start(self) -> Mapping[int, OpenTransaction]:
        """The transactions still in doubt (``started``), by 32-bit xid."""
        return self._open_at_start

    def missed_at_start(self, visibility: ReadVisibility) -> list[OpenTransaction]:
        """The transactions still in doubt that the snapshot missed: while there is one, the
        chunk must be read again."""
        return [t for x, t in self._open_at_start.items() if not visibility.sees(x)]

    def _log_saw(self, xid: int) -> None:
        """The log brought the end of ``xid``: the history knows it from now on (module
        docstring, 2.)."""
        self._open_at_start.pop(xid % _XID_SPACE, None)

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
        self._log_saw(xid)
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
        if self.missed_at_start(visibility):
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
        self._log_saw(xid)
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
        self._open_at_start = {
            x: t for x, t in self._open_at_start.items() if not all(s.sees(x) for s in snapshots)
        }

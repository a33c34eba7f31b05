"""The simulated database: keyed tables with row versions, transactions, a log, visibility lag.

Everything a real source does that the DBLog algorithm depends on, and nothing else:

* Tables with a (possibly composite) primary key; rows are dicts. Keys of one table compare
  as Python tuples (ints, ASCII strings), the order chunk reads page by.
* Transactions get an xid when they begin and write nothing until they commit: their
  changes are computed against the latest committed rows at commit (as if each waited for
  the row locks of earlier writers), then appended to the log in commit order, each change
  becoming a row version stamped with the transaction's xid and commit LSN.
* The log: committed transactions in commit order, with monotonic LSNs. A change that moves a
  row to a new key is logged as a delete of the old key and a create of the new one (as the
  readers hand them over). The replication slot remembers the confirmed LSN.
* Visibility lag (PostgreSQL): a commit is in the log before other sessions see it, and
  commits leave the "in progress" set in any order, except that a transaction touching a
  row another one logged earlier and still invisible has to wait (row locks are held until
  then). A chunk SELECT reads through a snapshot (xmin, xmax, in-progress xids) exactly as
  ``pg_current_snapshot()`` describes it, so the engine's visibility history has real work:
  xmax is the newest ended xid + 1, and only xids below it are listed in progress.
  With lag off (MySQL), commits are visible when they are logged.
* Sessions (``pg_stat_activity``): each open transaction's session is idle in it, running a
  statement, or hidden (another role's); a logged, invisible one is executing its commit
  ('active'): what the engine's start asks (core.visibility, 3.).

Deterministic: no clock, no randomness (the scheduler decides everything), dicts only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from signals.names import TableId
from snapshotter.core.keys import Key
from snapshotter.core.visibility import OpenTransaction, PgSnapshot
from snapshotter.sources.base import ColumnInfo, TableSchema

Row = dict[str, Any]

SCHEMA = "public"
SIGNAL_TABLE = TableId(SCHEMA, "debezium_signal")
# Rows loaded before the capture began: written by the bootstrap xid, always visible.
BOOTSTRAP_XID = 1
FIRST_XID = 100
LSN_STEP = 16  # between two commits; a commit's end is its LSN + 8


def _int(name: str, code: int = 20) -> ColumnInfo:
    return ColumnInfo(name, "bigint", code, False, pa.int64())


def _text(name: str, nullable: bool = False) -> ColumnInfo:
    return ColumnInfo(name, "text", 25, nullable, pa.string())


# One table keyed by one integer, one by (integer, text): composite keys page and compare too.
ITEMS = TableSchema(TableId(SCHEMA, "items"), (_int("id"), _int("v"), _text("note", True)), ("id",))
PAIRS = TableSchema(TableId(SCHEMA, "pairs"), (_int("g"), _text("name"), _int("v")), ("g", "name"))
SIGNALS = TableSchema(SIGNAL_TABLE, (_text("id"), _text("type"), _text("data", True)), ("id",))
DATA_TABLES = (ITEMS, PAIRS)


def key_of(schema: TableSchema, row: Mapping[str, Any]) -> Key:
    return tuple(row[c] for c in schema.primary_key)


@dataclass(frozen=True, slots=True)
class Version:
    xid: int
    lsn: int  # the commit LSN of the transaction that wrote it (its place in the log)
    row: Row | None  # None: deleted


@dataclass(frozen=True, slots=True)
class LoggedChange:
    table: TableId
    op: str  # "c", "u" or "d"
    before: Row | None
    after: Row | None


@dataclass(slots=True)
class LoggedTxn:
    xid: int
    lsn: int  # commit LSN
    end: int  # the log offset after the commit (its resume point)
    changes: list[LoggedChange]
    keys: list[tuple[TableId, Key]] = field(default_factory=list)


class Database:
    def __init__(self, *, lagging: bool) -> None:
        # Whether commits become visible after they are logged (PostgreSQL) or at once.
        self.lagging = lagging
        self.schemas: dict[TableId, TableSchema] = {s.table: s for s in (*DATA_TABLES, SIGNALS)}
        self.versions: dict[TableId, dict[Key, list[Version]]] = {t: {} for t in self.schemas}
        self.log: list[LoggedTxn] = []
        self.end = LSN_STEP  # the log's end offset
        self.next_xid = FIRST_XID
        self.open_xids: dict[int, None] = {}  # begun, not committed or aborted
        self.invisible: dict[int, LoggedTxn] = {}  # logged, not yet visible (log order)
        self.latest_ended = FIRST_XID - 1  # the newest xid that ended (visible or aborted)
        self.slot_confirmed = 0  # the slot's confirmed LSN (set at init)

    # --- loading and reading --------------------------------------------------------------

    def load(self, table: TableId, rows: list[Row]) -> None:
        """Rows that exist before the capture starts (only a snapshot can deliver them)."""
        schema = self.schemas[table]
        for row in rows:
            self.versions[table][key_of(schema, row)] = [Version(BOOTSTRAP_XID, 0, dict(row))]

    def latest(self, table: TableId) -> dict[Key, Row]:
        """The table as the log says it is now (every logged commit applied)."""
        out: dict[Key, Row] = {}
        for key, versions in self.versions[table].items():
            row = versions[-1].row
            if row is not None:
                out[key] = row
        return out

    def latest_row(self, table: TableId, key: Key) -> Row | None:
        versions = self.versions[table].get(key)
        return versions[-1].row if versions else None

    def row_at(self, table: TableId, key: Key, lsn: int) -> Row | None:
        """The row as the log had it just before the commit at ``lsn``."""
        out: Row | None = None
        for version in self.versions[table].get(key, ()):
            if version.lsn >= lsn:
                break
            out = version.row
        return out

    def snapshot(self) -> PgSnapshot:
        """What a SELECT starting now sees: ``pg_current_snapshot()``. As PostgreSQL's:
        xids past the newest ended one are not listed, all invisible all the same."""
        xmax = self.latest_ended + 1
        xip = [x for x in (*self.open_xids, *self.invisible) if x < xmax]
        return PgSnapshot(min(xip, default=xmax), xmax, frozenset(xip))

    def sessions(self) -> tuple[OpenTransaction, ...]:
        """``pg_stat_activity``'s sessions holding an xid. A transaction not committing
        writes nothing yet here: its session is idle in it, or runs a statement, or (another
        role's) its state is hidden; one logged but not yet visible is executing its commit.
        Which, by xid (no draw: the seeds' random sequences stay as they were)."""
        out = []
        for xid in (*self.open_xids, *self.invisible):
            shown = xid % 4 != 3
            if not shown:
                state = None
            elif xid in self.invisible:
                state = "active"
            else:
                state = "idle in transaction" if xid % 4 < 2 else "active"
            out.append(OpenTransaction(xid, pid=xid, state=state, client=shown))
        return tuple(out)

    def read(self, table: TableId, snapshot: PgSnapshot) -> dict[Key, Row]:
        """The table as ``snapshot`` sees it."""
        out: dict[Key, Row] = {}
        for key, versions in self.versions[table].items():
            row: Row | None = None
            for version in versions:
                if snapshot.sees(version.xid):
                    row = version.row
            if row is not None:
                out[key] = row
        return out

    # --- transactions ---------------------------------------------------------------------

    def begin(self) -> int:
        xid = self.next_xid
        self.next_xid += 1
        self.open_xids[xid] = None
        return xid

    def abort(self, xid: int) -> None:
        del self.open_xids[xid]
        self._ended(xid)

    def _ended(self, xid: int) -> None:
        self.latest_ended = max(self.latest_ended, xid)

    def blocked(self, changes: list[LoggedChange]) -> bool:
        """Whether a row these changes touch was written by a transaction that is logged
        but not yet visible (its row locks are still held)."""
        touched = {self._change_key(c) for c in changes}
        return any(k in touched for txn in self.invisible.values() for k in txn.keys)

    def commit(self, xid: int, changes: list[LoggedChange], *, visible: bool = False) -> LoggedTxn:
        """Log the transaction's changes (computed by the caller against ``latest``) at the
        next LSN; visible at once when ``visible`` (a session's own commit returning) or
        without lag, else once ``make_visible`` says so."""
        del self.open_xids[xid]
        lsn = self.end + LSN_STEP
        txn = LoggedTxn(xid, lsn, lsn + LSN_STEP // 2, list(changes))
        for change in changes:
            table, key = self._change_key(change)
            txn.keys.append((table, key))
            self.versions[table].setdefault(key, []).append(Version(xid, lsn, change.after))
        self.log.append(txn)
        self.end = txn.end
        if self.lagging and not visible:
            self.invisible[xid] = txn
        else:
            self._ended(xid)
        return txn

    def visible_candidates(self) -> list[int]:
        """Logged, invisible transactions that may become visible now: not one touching a
        row that an earlier invisible transaction touched."""
        out: list[int] = []
        seen: set[tuple[TableId, Key]] = set()
        for xid, txn in self.invisible.items():
            if not any(k in seen for k in txn.keys):
                out.append(xid)
            seen.update(txn.keys)
        return out

    def make_visible(self, xid: int) -> None:
        del self.invisible[xid]
        self._ended(xid)

    def _change_key(self, change: LoggedChange) -> tuple[TableId, Key]:
        row = change.after if change.after is not None else change.before
        assert row is not None
        return change.table, key_of(self.schemas[change.table], row)

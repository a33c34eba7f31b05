"""The simulated database behind the engine's source interfaces: a Dialect and a LogReader.

``SimDialect`` answers what the engine and its chunk workers ask a real dialect
(``snapshotter.sources.base.Dialect``): describe, max key, chunk bounds, chunk reads into
Arrow with the SELECT's snapshot, watermark inserts and deletes. Calls of the snapshot side
may fail as a lost connection would (the scheduler decides), and can be cancelled.

``SimLogReader`` hands out the database's log as a pgoutput reader would
(``snapshotter.sources.log.LogReader``): a ``TableShape`` before a table's first change in a
session, each committed transaction's changes (a key change as delete + create, deletes with
the key columns only, updates without the old row), then its ``Commit``; ``Progress`` when
idle. What the reader may hand out is decided by the scheduler (``deliver``): the log
reaches the engine late, in commit order, sometimes half a transaction at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from signals import Watermark, to_row
from signals.model import SignalType
from signals.names import TableId
from snapshotter.core.events import ChangeEvent, Op, Source
from snapshotter.core.keys import Key
from snapshotter.core.position import Position
from snapshotter.core.visibility import OpenAtStart
from snapshotter.sources.base import ChunkRows, ChunkSpec, ReadCancelled, TableError, TableSchema
from snapshotter.sources.log import Change, Commit, LogItem, Progress, TableShape
from tests.sim.db import SIGNAL_TABLE, Database, LoggedChange, LoggedTxn, Row
from tests.sim.errors import Property, check

if TYPE_CHECKING:
    from tests.sim.scheduler import World

WINDOW_TYPES = (SignalType.WINDOW_OPEN.value, SignalType.WINDOW_CLOSE.value)


class SimOutage(ConnectionError):
    """The connection was lost (simulated): transient, the engine retries."""


def _in_range(key: Key, after: Key | None, upto: Key) -> bool:
    return (after is None or key > after) and key <= upto


class SimDialect:
    connector = "postgresql"
    database = "sim"
    dollar_quotes = True

    def __init__(self, world: World, worker: int) -> None:
        self._world = world
        self._db: Database = world.db
        self.worker = worker
        self.commits_visible_in_log_order = not self._db.lagging
        self._cancelled = False
        self.closed = False

    # --- catalog --------------------------------------------------------------------------

    def describe(self, table: TableId) -> TableSchema:
        schema = self._db.schemas.get(table)
        if schema is None:
            raise TableError(f"table {table} does not exist")
        return schema

    def snapshot_key(self, schema: TableSchema, surrogate_key: str | None) -> tuple[str, ...]:
        if surrogate_key is not None:
            raise TableError("the simulation has no surrogate keys")
        return schema.primary_key

    def list_tables(self) -> list[TableId]:
        return sorted(self._db.schemas, key=str)

    def relation_kinds(self, tables: Sequence[TableId]) -> Mapping[TableId, str]:
        return {}

    def ensure_captured(self, tables: Sequence[TableId]) -> list[TableId]:
        return []

    def row_converter(
        self, schema: TableSchema
    ) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
        return None

    def scan(self, schema: TableSchema) -> Iterator[dict[str, Any]]:
        return iter(self._db.latest(schema.table).values())

    # --- the snapshot side ----------------------------------------------------------------

    def unfinished_xids(self) -> OpenAtStart | None:
        self._world.maybe_outage("unfinished xids")
        if not self._db.lagging:
            return None
        assigned = self._db.begin()  # as PostgreSQL's pg_current_xact_id()
        sessions = self._db.sessions()  # pg_stat_activity, read in the same transaction
        self._db.abort(assigned)  # rolled back: ended before the snapshot is taken
        return OpenAtStart(assigned, self._db.snapshot(), sessions)

    def _query(self, what: str) -> None:
        if self._cancelled:
            raise ReadCancelled(f"{what} cancelled (simulated)")
        self._world.maybe_outage(what)

    def _keys(self, schema: TableSchema, after: Key | None, upto: Key | None) -> list[Key]:
        rows = self._db.read(schema.table, self._db.snapshot())
        return sorted(k for k in rows if upto is None or _in_range(k, after, upto))

    def max_key(
        self, schema: TableSchema, key_columns: Sequence[str], condition: str | None
    ) -> Key | None:
        self._query("max key")
        keys = self._keys(schema, None, None)
        return keys[-1] if keys else None

    def estimated_rows(self, schema: TableSchema) -> int | None:
        # Exact, and without an outage draw: the seeds' random sequences stay as they were.
        return len(self._db.latest(schema.table))

    def chunk_bound(self, spec: ChunkSpec) -> Key | None:
        self._query("chunk bound")
        keys = self._keys(spec.schema, spec.after, spec.upto)
        return keys[spec.limit - 1] if len(keys) >= spec.limit else None

    def read_chunk(self, spec: ChunkSpec) -> ChunkRows:
        self._query("chunk read")
        schema, after, upto, limit = spec.schema, spec.after, spec.upto, spec.limit
        snapshot = self._db.snapshot()
        rows = self._db.read(schema.table, snapshot)
        keys = sorted(k for k in rows if _in_range(k, after, upto))[:limit]
        chosen = [rows[k] for k in keys]
        table = pa.Table.from_pylist(chosen, schema=schema.arrow_schema())
        visibility = snapshot if self._db.lagging else None
        return ChunkRows(table, keys[-1] if keys else None, visibility)

    def write_watermark(self, watermark: Watermark) -> None:
        self._world.maybe_outage("watermark insert")
        row_id, row_type, data = to_row(watermark)
        if self._db.latest_row(SIGNAL_TABLE, (row_id,)) is not None:
            raise TableError(f"duplicate key value: signal row {row_id} exists")
        xid = self._db.begin()
        row: Row = {"id": row_id, "type": row_type, "data": data}
        self._db.commit(xid, [LoggedChange(SIGNAL_TABLE, "c", None, row)], visible=True)
        # The commit went through, and then the connection was lost: the row is logged, the
        # worker sees an error.
        self._world.maybe_outage("watermark commit")

    def delete_watermarks(self, window_ids: Sequence[str]) -> int:
        changes = []
        for window in window_ids:
            for kind in ("open", "close"):
                row = self._db.latest_row(SIGNAL_TABLE, (f"{window}-{kind}",))
                if row is not None and row["type"] in WINDOW_TYPES:
                    changes.append(LoggedChange(SIGNAL_TABLE, "d", row, None))
        if changes:
            self._db.commit(self._db.begin(), changes, visible=True)
        return len(changes)

    def watermark_rows(self, after: str | None, limit: int) -> list[tuple[str, str]]:
        rows = self._db.latest(SIGNAL_TABLE)
        ids = sorted(
            str(k[0])
            for k, row in rows.items()
            if row["type"] in WINDOW_TYPES and (after is None or str(k[0]) > after)
        )
        return [(i, rows[(i,)]["type"]) for i in ids[:limit]]

    # --- the log, outages, cancels --------------------------------------------------------

    def log_end(self) -> int:
        return self._db.end

    def lag_bytes(self, resume: Mapping[str, Any]) -> int | None:
        return None

    def is_transient(self, exc: BaseException) -> bool:
        return isinstance(exc, SimOutage)

    def cancel_reads(self) -> None:
        self._cancelled = True

    def allow_reads(self) -> None:
        self._cancelled = False

    def close(self) -> None:
        self.closed = True


class SimLogReader:
    """One replication session, from ``start`` (an LSN: transactions committed at or after
    it are sent)."""

    def __init__(
        self,
        world: World,
        start: int,
        key_columns: Callable[[TableId], Sequence[str] | None],
    ) -> None:
        self._world = world
        self._db = world.db
        self._key_columns = key_columns
        log = self._db.log
        self._next = next((i for i, t in enumerate(log) if t.lsn >= start), len(log))
        self._queued: list[LogItem] = []  # built, not handed out yet
        self._available = 0  # how many of them the scheduler lets ``read`` hand out
        self._announced: dict[TableId, None] = {}
        self._keys: dict[TableId, tuple[str, ...]] = {}
        self._mid_txn = False  # handed out part of a transaction, not its commit
        self._progress_asked = False
        self.confirmed: list[int] = []
        self.closed = False

    # --- the scheduler's side -------------------------------------------------------------

    @property
    def behind(self) -> bool:
        """Whether the log holds items this session has not made available yet."""
        return self._available < len(self._queued) or self._next < len(self._db.log)

    def deliver(self, count: int) -> None:
        """Let ``read`` hand out ``count`` more items of the log (as far as it goes)."""
        while len(self._queued) < self._available + count and self._next < len(self._db.log):
            self._queued.extend(self._items(self._db.log[self._next]))
            self._next += 1
        self._available = min(len(self._queued), self._available + count)

    def finish_transaction(self) -> bool:
        """Before a graceful stop: whether a transaction was half handed out (its rest is
        made available, so the engine can read to its end)."""
        if self._mid_txn:
            self._rest_of_txn()
        return self._mid_txn

    def _watch_close(self, change: Change) -> None:
        row = change.event.after
        close = SignalType.WINDOW_CLOSE.value
        if change.event.table == SIGNAL_TABLE and row is not None and row["type"] == close:
            self._world.watch.close_delivered(str(row["id"]).removesuffix("-close"))  # <id>-close

    def _rest_of_txn(self) -> None:
        """The rest of a half-delivered transaction (committed: it is on its way)."""
        for index in range(self._available, len(self._queued)):
            if isinstance(self._queued[index], Commit):
                self._available = index + 1
                return

    # --- LogReader ------------------------------------------------------------------------

    def read(self, timeout: float) -> list[LogItem]:
        self._send_feedback()
        if not self._available and self._mid_txn:
            self._rest_of_txn()
        if self._available:
            out = self._queued[: self._available]
            del self._queued[: self._available]
            self._available = 0
            for item in out:
                if isinstance(item, Change):
                    self._mid_txn = True
                    self._watch_close(item)
                elif isinstance(item, Commit):
                    self._mid_txn = False
            return out
        idle = not self._queued and self._next == len(self._db.log)
        if idle and (self._progress_asked or self._world.chance(0.2)):
            self._progress_asked = False
            end = self._db.end
            return [Progress(resume={"lsn": end}, log_offset=end)]
        self._world.wait(timeout)  # nothing came in time
        return []

    def confirm(self, resume: Mapping[str, Any]) -> None:
        """The feedback reaches the server (the slot) with the session's next read, or not
        at all if the engine dies first: a restart then replays from an older point."""
        lsn = int(resume["lsn"])
        previous = self.confirmed[-1] if self.confirmed else self._db.slot_confirmed
        check(
            lsn >= previous,
            Property.CONFIRMED_BACKWARDS,
            f"the engine confirmed LSN {lsn} after confirming {previous}",
        )
        self.confirmed.append(lsn)

    def _send_feedback(self) -> None:
        if self.confirmed and self._world.chance(0.5):
            self._db.slot_confirmed = max(self._db.slot_confirmed, self.confirmed[-1])

    def request_progress(self) -> None:
        self._progress_asked = True

    def close(self) -> None:
        self.closed = True

    # --- decoding -------------------------------------------------------------------------

    def _key_of(self, table: TableId) -> tuple[str, ...]:
        if table not in self._keys:
            self._keys[table] = tuple(
                self._key_columns(table) or self._db.schemas[table].primary_key
            )
        return self._keys[table]

    def _items(self, txn: LoggedTxn) -> list[LogItem]:
        items: list[LogItem] = []
        seq = 0
        ts_ms = txn.lsn  # a stand-in for the commit time, deterministic
        for change in txn.changes:
            table = change.table
            schema = self._db.schemas[table]
            key_columns = self._key_of(table)
            if table not in self._announced:
                self._announced[table] = None
                items.append(TableShape(table, schema.signature(), False, key_columns))
            before, after = self._rows(change, key_columns)
            row = after if after is not None else before
            assert row is not None
            source = Source("postgresql", "sim", "sim", table, Position(txn.lsn, seq), ts_ms)
            event = ChangeEvent(
                Op(change.op), source, ts_ms, tuple(row[c] for c in key_columns), before, after
            )
            items.append(Change(event, txn.xid))
            seq += 1
        items.append(
            Commit(txn.xid, Position(txn.lsn, seq), {"lsn": txn.end}, ts_ms, log_offset=txn.end)
        )
        return items

    @staticmethod
    def _rows(change: LoggedChange, key_columns: tuple[str, ...]) -> tuple[Row | None, Row | None]:
        """As pgoutput sends them (REPLICA IDENTITY DEFAULT): a delete's old row holds the
        key columns only; an update carries no old row."""
        if change.op == "d":
            assert change.before is not None
            return {c: change.before[c] for c in key_columns}, None
        return None, dict(change.after) if change.after is not None else None

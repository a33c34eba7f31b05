"""pgoutput messages to log items: positioned Debezium change events, commits, table shapes.

No IO: the reader hands :meth:`PgOutputDecoder.feed` each ``XLogData`` payload with the
frame's start LSN, and gets back what the engine consumes (``snapshotter.sources.log``).

Positions are ``(commit LSN, seq)``: the transaction's commit LSN (from Begin) then the
index of the event in the transaction. pgoutput sends transactions whole and in commit
order, so positions strictly increase across the stream, and a transaction replayed after a
restart gets exactly the positions it had the first time.

Event keys are the primary key reported by ``key_columns`` (the catalog), else the replica
identity columns the Relation message flags, else, for a table with neither, the whole row in
column order (NULLs included). Such a table only ever logs inserts: PostgreSQL refuses its
updates and deletes while a publication publishes them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from signals.names import TableId
from snapshotter.core.events import ChangeEvent, Op, Source
from snapshotter.core.position import Position
from snapshotter.core.values import UNAVAILABLE_VALUE
from snapshotter.sources.log import Change, Commit, LogItem, Notice, TableShape
from snapshotter.sources.postgres import pgoutput as pgo
from snapshotter.sources.postgres import types as pg_types

# 2000-01-01 00:00 UTC (PostgreSQL's epoch) in Unix milliseconds.
_PG_EPOCH_MS = 946_684_800_000
_TOAST = pgo.UNCHANGED_TOAST


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def pg_time_to_unix_ms(ts_us: int) -> int:
    """A pgoutput timestamp (microseconds since 2000-01-01) as Unix milliseconds."""
    return _PG_EPOCH_MS + ts_us // 1000


@dataclass(frozen=True, slots=True)
class _Table:
    """What one Relation message tells us, prepared for decoding its rows fast."""

    table: TableId
    names: tuple[str, ...]
    oids: tuple[int, ...]
    columns: tuple[tuple[Callable[[bytes], Any], int], ...]  # per column: (loader, type OID)
    key: tuple[int, ...]  # indexes of the event key columns
    key_of: Callable[[Sequence[Any]], tuple[Any, ...]]  # row values -> the event key
    identity: tuple[int, ...]  # indexes of the columns an old-key ('K') tuple carries


@dataclass(slots=True)
class _Txn:
    xid: int
    commit_lsn: int
    ts_ms: int
    seq: int = 0


class PgOutputDecoder:
    """Turns pgoutput (protocol version 1, text tuples) into ``snapshotter.sources.log`` items.

    One decoder follows one replication stream: it remembers Relation messages by OID and
    the open transaction, so it must see every message, in order, from the stream's start.
    """

    def __init__(
        self,
        *,
        name: str,
        database: str,
        key_columns: Callable[[TableId], Sequence[str] | None],
        clock_ms: Callable[[], int] = _wall_clock_ms,
    ) -> None:
        self._name = name
        self._database = database
        self._key_columns = key_columns
        self._clock_ms = clock_ms
        self._transformer = pg_types.transformer()
        self._tables: dict[int, _Table] = {}
        self._txn: _Txn | None = None
        self._toast_noticed: set[TableId] = set()
        self._pending: list[LogItem] = []  # notices raised while loading values
        self._unloadable_noticed: set[tuple[TableId, str]] = set()

    def restart(self) -> None:
        """The stream starts over on a new connection (the reader reconnected): the server
        sends again from a transaction's Begin, so forget the transaction that was open.
        Relations stay known (the server describes each again before its first change)."""
        self._txn = None

    def feed(self, data: bytes, wal_start: int) -> list[LogItem]:
        """Decode one message; ``wal_start`` is its XLogData frame's start LSN.

        Raises :class:`~snapshotter.sources.postgres.pgoutput.PgOutputError` for a malformed
        message, a change outside a transaction or of a relation no Relation message
        described. A value the loaders refuse (``infinity`` timestamps, dates BC: outside Python's
        range) is kept as its text, with a Notice, so the stream goes on.
        """
        items = self._dispatch(pgo.parse_message(data), wal_start)
        if self._pending:
            items = [*items, *self._pending]
            self._pending = []
        return items

    def _dispatch(self, message: pgo.PgOutputMessage, wal_start: int) -> list[LogItem]:
        match message:
            case pgo.Insert():
                txn, table = self._change_context(message.relation_oid, "Insert")
                items: list[LogItem] = []
                after = self._new_row(table, message.new, None, None, items)
                change = self._change(txn, table, wal_start, Op.CREATE, None, after)
                return [change, *items] if items else [change]
            case pgo.Update():
                txn, table = self._change_context(message.relation_oid, "Update")
                return self._update(txn, table, wal_start, message)
            case pgo.Delete():
                txn, table = self._change_context(message.relation_oid, "Delete")
                before = self._old_row(table, message.old, message.old_kind)
                return [self._change(txn, table, wal_start, Op.DELETE, before, None)]
            case pgo.Begin():
                return self._begin(message)
            case pgo.Commit():
                return self._commit(message)
            case pgo.Relation():
                return [self._relation(message)]
            case pgo.Truncate():
                items = []
                for oid in message.relation_oids:
                    txn, table = self._change_context(oid, "Truncate")
                    items.append(self._change(txn, table, wal_start, Op.TRUNCATE, None, None))
                return items
            case _:  # Origin, Type, logical decoding Message: nothing for the engine
                return []

    # -- transactions -----------------------------------------------------------------------

    def _begin(self, begin: pgo.Begin) -> list[LogItem]:
        if self._txn is not None:
            raise pgo.PgOutputError(
                f"pgoutput Begin of transaction {begin.xid} while transaction "
                f"{self._txn.xid} has not committed"
            )
        self._txn = _Txn(begin.xid, begin.final_lsn, pg_time_to_unix_ms(begin.commit_ts_us))
        return []

    def _commit(self, commit: pgo.Commit) -> list[LogItem]:
        txn = self._txn
        if txn is None:
            raise pgo.PgOutputError(
                f"pgoutput Commit at LSN {commit.commit_lsn:#x} outside a transaction"
            )
        if commit.commit_lsn != txn.commit_lsn:
            raise pgo.PgOutputError(
                f"pgoutput Commit at LSN {commit.commit_lsn:#x} does not match its Begin "
                f"(transaction {txn.xid}, final LSN {txn.commit_lsn:#x})"
            )
        self._txn = None
        return [
            Commit(
                xid=txn.xid,
                position=Position(txn.commit_lsn, txn.seq),
                resume={"lsn": commit.end_lsn},
                ts_ms=pg_time_to_unix_ms(commit.commit_ts_us),
                log_offset=commit.end_lsn,
            )
        ]

    def _change_context(self, oid: int, kind: str) -> tuple[_Txn, _Table]:
        if self._txn is None:
            raise pgo.PgOutputError(f"pgoutput {kind} for relation {oid} outside a transaction")
        table = self._tables.get(oid)
        if table is None:
            raise pgo.PgOutputError(
                f"pgoutput {kind} for relation {oid}, which no Relation message described"
            )
        return self._txn, table

    # -- relations --------------------------------------------------------------------------

    def _relation(self, rel: pgo.Relation) -> TableShape:
        table = TableId(rel.namespace or "pg_catalog", rel.name)
        names = tuple(c.name for c in rel.columns)
        oids = tuple(c.type_oid for c in rel.columns)
        identity = tuple(i for i, c in enumerate(rel.columns) if c.is_key)
        key_names = self._key_columns(table)
        if key_names:
            index = {n: i for i, n in enumerate(names)}
            missing = [n for n in key_names if n not in index]
            if missing:
                raise pgo.PgOutputError(
                    f"table {table}: key columns {missing} are not among the columns the "
                    f"log announced {list(names)}"
                )
            key = tuple(index[n] for n in key_names)
        else:
            key = identity or tuple(range(len(names)))
        columns = tuple((self._transformer.get_loader(oid, 0).load, oid) for oid in oids)
        self._tables[rel.oid] = _Table(table, names, oids, columns, key, _key_getter(key), identity)
        return TableShape(
            table,
            tuple(zip(names, oids, strict=True)),
            rel.replica_identity == "f",
            tuple(names[i] for i in key),
        )

    # -- rows -------------------------------------------------------------------------------

    def _load(self, table: _Table, values: pgo.TupleData) -> list[Any]:
        """Python values for a tuple; NULL stays None, UNCHANGED_TOAST stays the marker."""
        if len(values) != len(table.names):
            raise pgo.PgOutputError(
                f"table {table.table}: a tuple of {len(values)} columns, but its Relation "
                f"message announced {len(table.names)}"
            )
        finish = pg_types.finish_value
        try:
            # The chunk reader's loader, then its finishing step: identical values.
            return [
                raw if raw is None or raw is _TOAST else finish(oid, load(raw))
                for raw, (load, oid) in zip(values, table.columns, strict=True)
            ]
        except Exception:
            return self._load_slowly(table, values)

    def _load_slowly(self, table: _Table, values: pgo.TupleData) -> list[Any]:
        """Value by value: one the loaders refuse stays as the database's text."""
        out: list[Any] = []
        finish = pg_types.finish_value
        for name, raw, (load, oid) in zip(table.names, values, table.columns, strict=True):
            if raw is None or raw is _TOAST:
                out.append(raw)
                continue
            try:
                out.append(finish(oid, load(raw)))
            except Exception as exc:
                text = bytes(raw).decode("utf-8", "replace")
                out.append(text)
                if (table.table, name) not in self._unloadable_noticed:
                    self._unloadable_noticed.add((table.table, name))
                    self._pending.append(
                        Notice(
                            table.table,
                            f"column {name!r} (type OID {oid}) holds {text[:40]!r}, which "
                            f"cannot be loaded ({exc}); events carry it as text",
                            {"column": name},
                        )
                    )
        return out

    def _old_row(self, table: _Table, old: pgo.TupleData, kind: str) -> _Row:
        """The ``before`` row of an old key ('K') or old row ('O') tuple."""
        values = self._load(table, old)
        if _TOAST in old:  # never seen in practice: PostgreSQL detoasts the old row it logs
            values = [UNAVAILABLE_VALUE if v is _TOAST else v for v in values]
        if kind == "O":
            return _Row(values, dict(zip(table.names, values, strict=True)))
        missing = [table.names[i] for i in table.key if i not in table.identity]
        if missing:
            raise pgo.PgOutputError(
                f"table {table.table}: the log's old key lacks key columns {missing} (the "
                "replica identity is an index without them); use REPLICA IDENTITY "
                "DEFAULT or FULL"
            )
        # An old key carries only the replica identity columns; the others are NULL in the
        # tuple, not values the row had, so they stay out of ``before``.
        return _Row(values, {table.names[i]: values[i] for i in table.identity})

    def _new_row(
        self,
        table: _Table,
        new: pgo.TupleData,
        old: _Row | None,
        old_raw: pgo.TupleData | None,
        notices: list[LogItem],
    ) -> _Row:
        """The ``after`` row, with unchanged TOAST values taken from a whole old row
        (REPLICA IDENTITY FULL logs it detoasted) or else made UNAVAILABLE_VALUE."""
        values = self._load(table, new)
        if _TOAST in new:
            absent = []
            for i, raw in enumerate(new):
                if raw is _TOAST:
                    if old is not None and old_raw is not None and old_raw[i] is not _TOAST:
                        values[i] = old.values[i]
                    else:
                        values[i] = UNAVAILABLE_VALUE
                        absent.append(table.names[i])
            if absent and table.table not in self._toast_noticed:
                self._toast_noticed.add(table.table)
                notices.append(_toast_notice(table.table, absent))
        return _Row(values, dict(zip(table.names, values, strict=True)))

    def _update(
        self, txn: _Txn, table: _Table, wal_start: int, update: pgo.Update
    ) -> list[LogItem]:
        old = None
        if update.old is not None and update.old_kind is not None:
            old = self._old_row(table, update.old, update.old_kind)
        notices: list[LogItem] = []
        if update.old_kind == "O":  # the whole old row: unchanged TOAST values are in it
            new = self._new_row(table, update.new, old, update.old, notices)
        else:
            new = self._new_row(table, update.new, None, None, notices)
        if old is not None and table.key_of(old.values) != table.key_of(new.values):
            # A primary-key change: Debezium's delete of the old key, create of the new.
            return [
                self._change(txn, table, wal_start, Op.DELETE, old, None),
                self._change(txn, table, wal_start, Op.CREATE, None, new),
                *notices,
            ]
        return [self._change(txn, table, wal_start, Op.UPDATE, old, new), *notices]

    def _change(
        self,
        txn: _Txn,
        table: _Table,
        wal_start: int,
        op: Op,
        before: _Row | None,
        after: _Row | None,
    ) -> Change:
        keyed = after if after is not None else before
        source = Source(
            "postgresql",
            self._name,
            self._database,
            table.table,
            Position(txn.commit_lsn, txn.seq),
            txn.ts_ms,
            details={"lsn": wal_start, "txId": txn.xid},
        )
        txn.seq += 1
        event = ChangeEvent(
            op,
            source,
            self._clock_ms(),
            None if keyed is None else table.key_of(keyed.values),
            None if before is None else before.fields,
            None if after is None else after.fields,
        )
        return Change(event, txn.xid)


@dataclass(frozen=True, slots=True)
class _Row:
    values: list[Any]  # in column order, for keys and for filling TOAST
    fields: dict[str, Any]  # the event's before/after


def _key_getter(index: tuple[int, ...]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """A fast ``lambda row: tuple(row[i] for i in index)``: keys are built for every event."""
    if len(index) == 1:
        (only,) = index
        return lambda row: (row[only],)
    if not index:
        return lambda row: ()
    get = itemgetter(*index)
    return lambda row: get(row)  # a tuple for 2+ indexes


def _toast_notice(table: TableId, columns: list[str]) -> Notice:
    return Notice(
        table,
        f"the log did not carry the value of {', '.join(columns)} (an unchanged TOAST "
        f"value), so events of {table} hold {UNAVAILABLE_VALUE!r} in its place; "
        f"ALTER TABLE {table} REPLICA IDENTITY FULL makes the log carry it",
        {"columns": columns},
    )

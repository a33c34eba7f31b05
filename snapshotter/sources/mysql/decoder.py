"""Binlog events (as mysql-replication parses them) to log items: positioned Debezium change
events, commits, table shapes, progress.

No IO: the reader hands :meth:`BinlogDecoder.feed` each event the stream returns. Row images
of tables that are not captured are never decoded (mysql-replication parses rows lazily, on
the first access to ``rows``), which is most of what decoding costs.

Positions are ``(binlog file number, end offset of the event, sub)``, where ``sub`` is
``2 * row index`` for the rows of one rows event, ``+ 1`` for the create half of a
primary-key change (a delete of the old key, then a create of the new one, as Debezium
does). Offsets grow within a file and file numbers across files, so positions strictly
increase along the binlog, and a transaction read again after a reconnect or a restart gets
exactly the positions it had the first time. READ rows emitted at a close watermark get
``(f, p, s, i)``, between the watermark row and the next event.

Transactions end at an XID event (InnoDB), a ``COMMIT`` query (non-transactional engines),
or a DDL statement (implicitly committed). The restart point after a transaction is the
start of the next one, so the table maps of the next transaction are read again.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from pymysqlreplication.constants import NONE_SOURCE
from pymysqlreplication.event import (
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    QueryEvent,
    RotateEvent,
    XidEvent,
)
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from signals.names import TableId
from snapshotter.core.events import ChangeEvent, Op, Source
from snapshotter.core.position import Position
from snapshotter.sources.log import Change, Commit, LogItem, Notice, Progress, TableShape
from snapshotter.sources.mysql import types as my_types
from snapshotter.sources.mysql.positions import binlog_file_number, binlog_offset

# The statements that change a table's definition (and commit implicitly).
_DDL = re.compile(r"^\s*(ALTER|CREATE|DROP|RENAME|TRUNCATE)\b", re.IGNORECASE)
_NAME = r"(?:`(?:[^`]|``)+`|[A-Za-z0-9_$\u0080-\uffff]+)"
_TRUNCATE = re.compile(rf"^\s*TRUNCATE\s+(?:TABLE\s+)?({_NAME})(?:\s*\.\s*({_NAME}))?\s*$", re.I)
_TABLE_DDL = re.compile(
    rf"^\s*(?:ALTER|DROP|RENAME)\s+(?:ONLINE\s+|IGNORE\s+)*TABLES?\s+(?:IF\s+EXISTS\s+)?"
    rf"({_NAME})(?:\s*\.\s*({_NAME}))?",
    re.IGNORECASE,
)


# Comments a client put before its statement: the binlog keeps the text as sent.
_LEADING_COMMENTS = re.compile(r"^(?:\s+|/\*.*?\*/|--[^\n]*(?:\n|$)|#[^\n]*(?:\n|$))*", re.S)


def statement_text(query: str) -> str:
    """The statement without the comments and spaces before it."""
    return query[_LEADING_COMMENTS.match(query).end() :]  # type: ignore[union-attr]


def is_transaction_marker(query: str) -> bool:
    """BEGIN / COMMIT / ROLLBACK / SAVEPOINT / XA: statements that change no table."""
    head = statement_text(query)[:10].upper()
    return head.startswith(("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "XA ", "RELEASE"))


class BinlogError(RuntimeError):
    """The binlog holds something the decoder cannot turn into events."""


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def _unquote(name: str) -> str:
    if name.startswith("`") and name.endswith("`"):
        return name[1:-1].replace("``", "`")
    return name


@dataclass(frozen=True, slots=True)
class _Table:
    """One table map, prepared for decoding its rows fast."""

    table: TableId
    columns_obj: object  # the table map's column list: a new one means a new table map
    names: tuple[str, ...]
    converters: tuple[tuple[str, Callable[[Any], Any]], ...]  # columns needing conversion
    set_columns: frozenset[str]  # an empty SET arrives as None with an "empty set" reason
    key: tuple[str, ...]
    key_of: Callable[[dict[str, Any]], tuple[Any, ...]]
    shape: TableShape


class BinlogDecoder:
    def __init__(
        self,
        name: str,
        captured: Callable[[TableId], bool],
        key_columns: Callable[[TableId], Sequence[str] | None],
        clock_ms: Callable[[], int] = _wall_clock_ms,
        column_types: Callable[[TableId], Mapping[str, str]] | None = None,
    ) -> None:
        """``column_types``: the catalog's DATA_TYPE of each column of a table (the
        dialect's ``catalog_types``). Only the catalog tells MariaDB's UUID, INET6 and
        INET4 from a BINARY(16) or BINARY(4): the binlog carries their bytes alike."""
        self._name = name
        self._captured_of = captured
        self._key_columns = key_columns
        self._clock_ms = clock_ms
        self._column_types_of = column_types
        # Per table, until DDL on it: the catalog's types (asked once, not per table map:
        # mysql-replication makes a new table map for every transaction).
        self._column_types: dict[TableId, tuple[tuple[str, ...], Mapping[str, str]]] = {}
        self._captured: dict[TableId, bool] = {}
        self._tables: dict[int, _Table] = {}
        self._shapes: dict[TableId, TableShape] = {}
        self._file = ""
        self._file_number = 0
        self._gtid: str | None = None
        self._in_txn = False
        self._end = 0  # where the event being decoded ends in the binlog file (_end_of)

    # -- state --------------------------------------------------------------------------------

    def start(self, file_name: str) -> None:
        """The stream starts (again) in ``file_name``: forget any half-read transaction."""
        self._set_file(file_name)
        self._in_txn = False

    def _set_file(self, file_name: str) -> None:
        self._file = file_name
        self._file_number = binlog_file_number(file_name)
        self._end = 0

    def _end_of(self, packet: Any) -> int:
        """Where an event ends in the binlog file: its header's ``log_pos``, or, where that is
        0 (MariaDB 11.4 writes no position into the events of a transaction, which it copies
        from the transaction's cache: table maps and rows events), the previous event's end
        plus this one's size. That is at most the event's true end (the table maps between
        are not decoded), so positions still rise within a transaction and stay below its
        commit's, which carries its real position."""
        end = int(packet.log_pos)
        if end == 0 and self._end:
            end = self._end + int(packet.event_size)
        self._end = end
        return end

    @property
    def in_transaction(self) -> bool:
        return self._in_txn

    def _is_captured(self, table: TableId) -> bool:
        known = self._captured.get(table)
        if known is None:
            known = self._captured[table] = bool(self._captured_of(table))
        return known

    # -- events -------------------------------------------------------------------------------

    def feed(self, event: Any) -> list[LogItem]:
        packet = getattr(event, "packet", None)
        if packet is not None:
            self._end_of(packet)
        if isinstance(event, WriteRowsEvent | UpdateRowsEvent | DeleteRowsEvent):
            return self._rows(event)
        if isinstance(event, XidEvent):
            return self._commit(event)
        if isinstance(event, GtidEvent | MariadbGtidEvent):
            self._gtid = event.gtid
            self._in_txn = True
            return []
        if isinstance(event, QueryEvent):
            return self._query(event)
        if isinstance(event, RotateEvent):
            self._set_file(event.next_binlog)
            # Where the stream goes on in that file: 4 for a new file, the asked-for start
            # for the rotate a (re)connection begins with, so that an event there without a
            # position of its own (log_pos 0, _end_of) counts from it, not from 0.
            self._end = int(getattr(event, "position", 0) or 0)
            return []
        if isinstance(event, HeartbeatLogEvent):
            return self._heartbeat(event)
        return []

    def _resume(self, end: int) -> dict[str, Any]:
        resume: dict[str, Any] = {"file": self._file, "pos": end}
        if self._gtid is not None:
            resume["gtid"] = self._gtid
        return resume

    def _commit(self, event: Any, sub: int = 0) -> list[LogItem]:
        self._in_txn = False
        end = self._end
        return [
            Commit(
                xid=0,
                position=Position(self._file_number, end, sub),
                resume=self._resume(end),
                ts_ms=event.timestamp * 1000,
                log_offset=binlog_offset(self._file, end),
            )
        ]

    def _heartbeat(self, event: Any) -> list[LogItem]:
        if self._in_txn or not event.ident:
            return []
        # The server's position in the file it is sending: nothing before it is unsent.
        file_name = event.ident.rstrip("\x00")
        end = self._end
        if file_name != self._file:
            return []
        return [Progress(resume=self._resume(end), log_offset=binlog_offset(file_name, end))]

    def _query(self, event: Any) -> list[LogItem]:
        query = event.query if isinstance(event.query, str) else bytes(event.query).decode()
        query = statement_text(query)
        head = query[:16].upper()
        if head.startswith("BEGIN"):
            self._in_txn = True
            return []
        if head.startswith("COMMIT"):
            return self._commit(event)
        if _DDL.match(query) is None:
            return []  # SAVEPOINT, XA, ... inside a transaction: nothing to emit
        schema = event.schema if isinstance(event.schema, str) else bytes(event.schema).decode()
        items: list[LogItem] = []
        truncate = _TRUNCATE.match(query)
        if truncate is not None:
            table = self._table_named(schema, truncate.group(1), truncate.group(2))
            if table is not None and self._is_captured(table):
                items.append(self._truncate(event, table))
        else:
            named = _TABLE_DDL.match(query)
            if named is not None:
                table = self._table_named(schema, named.group(1), named.group(2))
                if table is not None and self._is_captured(table):
                    # Its next table map may differ: announce the shape again then.
                    self._shapes.pop(table, None)
                    self._column_types.pop(table, None)
                    items.append(Notice(table, f"DDL on {table}: {' '.join(query.split())[:200]}"))
        if query[:6].upper() in ("CREATE", "RENAME"):
            self._captured.clear()  # a new table may match source.tables now
        items.extend(self._commit(event, sub=1 if items else 0))
        return items

    @staticmethod
    def _table_named(default_schema: str, first: str, second: str | None) -> TableId | None:
        if second is None:
            return TableId(default_schema, _unquote(first)) if default_schema else None
        return TableId(_unquote(first), _unquote(second))

    def _truncate(self, event: Any, table: TableId) -> Change:
        end = self._end
        source = self._source(table, Position(self._file_number, end, 0), event, 0)
        return Change(ChangeEvent(Op.TRUNCATE, source, self._clock_ms(), None), 0)

    # -- rows ---------------------------------------------------------------------------------

    def _table(self, event: Any) -> _Table | None:
        known = self._tables.get(event.table_id)
        if known is not None and known.columns_obj is event.columns:
            return known
        table = TableId(event.schema, event.table)
        if not self._is_captured(table):
            return None
        names = tuple(c.name for c in event.columns)
        if any(n is None or n.startswith("UNKNOWN_COL") for n in names):
            raise BinlogError(
                f"the binlog's table map of {table} has no column names: set "
                "binlog_row_metadata=FULL on the server (snapshotter init checks it)"
            )
        converters = []
        sets = set()
        catalog = self._catalog_types(table, names)
        for column in event.columns:
            family = my_types.binlog_family(column.type)
            if family == my_types.SET:
                sets.add(column.name)
            conv = my_types.binlog_converter(
                column.type,
                bits=getattr(column, "bits", 0) or 0,
                set_values=tuple(column.set_values or ()),
                binary=getattr(column, "character_set_name", None) == "binary",
                max_length=getattr(column, "max_length", 0) or 0,
                data_type=catalog.get(column.name),
            )
            if conv is not None:
                converters.append((column.name, conv))
        key = tuple(self._key_columns(table) or ())
        if not key or any(k not in names for k in key):
            primary = event.primary_key
            if isinstance(primary, str):
                key = (primary,) if primary else ()
            else:
                key = tuple(primary or ())
        if not key:
            key = names  # a table without a key: the whole row identifies it
        shape = TableShape(
            table,
            tuple((c.name, my_types.binlog_family(c.type)) for c in event.columns),
            True,
            key,
        )
        prepared = _Table(
            table,
            event.columns,
            names,
            tuple(converters),
            frozenset(sets),
            key,
            _key_getter(key),
            shape,
        )
        self._tables[event.table_id] = prepared
        return prepared

    def _catalog_types(self, table: TableId, names: Sequence[str]) -> Mapping[str, str]:
        if self._column_types_of is None:
            return {}
        asked = self._column_types.get(table)
        if asked is None or asked[0] != tuple(names):  # a column added, dropped, renamed
            try:
                types = dict(self._column_types_of(table))
            except Exception:  # dropped meanwhile, say: the binlog alone decides then
                types = {}
            asked = self._column_types[table] = (tuple(names), types)
        return asked[1]

    def _rows(self, event: Any) -> list[LogItem]:
        table = self._table(event)
        if table is None:
            return []
        items: list[LogItem] = []
        if self._shapes.get(table.table) != table.shape:
            self._shapes[table.table] = table.shape
            items.append(table.shape)
        number, end = self._file_number, self._end

        def change(
            sub: int, row: int, op: Op, before: dict[str, Any] | None, after: dict[str, Any] | None
        ) -> Change:
            keyed = after if after is not None else before
            assert keyed is not None
            source = self._source(table.table, Position(number, end, sub), event, row)
            key = table.key_of(keyed)
            return Change(ChangeEvent(op, source, self._clock_ms(), key, before, after), 0)

        if isinstance(event, UpdateRowsEvent):
            for i, row in enumerate(event.rows):
                before = self._values(table, row["before_values"], row["before_none_sources"])
                after = self._values(table, row["after_values"], row["after_none_sources"])
                if table.key_of(before) != table.key_of(after):
                    # A primary-key change: Debezium's delete of the old key, then a create.
                    items.append(change(2 * i, i, Op.DELETE, before, None))
                    items.append(change(2 * i + 1, i, Op.CREATE, None, after))
                else:
                    items.append(change(2 * i, i, Op.UPDATE, before, after))
        elif isinstance(event, WriteRowsEvent):
            for i, row in enumerate(event.rows):
                values = self._values(table, row["values"], row["none_sources"])
                items.append(change(2 * i, i, Op.CREATE, None, values))
        else:
            for i, row in enumerate(event.rows):
                values = self._values(table, row["values"], row["none_sources"])
                items.append(change(2 * i, i, Op.DELETE, values, None))
        return items

    @staticmethod
    def _values(table: _Table, values: dict[str, Any], reasons: dict[str, str]) -> dict[str, Any]:
        if table.set_columns and reasons:
            for name in table.set_columns:
                if values.get(name) is None and reasons.get(name) == NONE_SOURCE.EMPTY_SET:
                    values[name] = ""
        for name, convert in table.converters:
            value = values[name]
            if value is not None:
                values[name] = convert(value)
        return values

    def _source(self, table: TableId, position: Position, event: Any, row: int) -> Source:
        packet = event.packet
        return Source(
            "mysql",
            self._name,
            table.schema or "",
            table,
            position,
            event.timestamp * 1000,
            details={
                "server_id": packet.server_id,
                "gtid": self._gtid,
                "file": self._file,
                "binlog_pos": self._end - packet.event_size,
                "row": row,
            },
        )


def _key_getter(names: tuple[str, ...]) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    if len(names) == 1:
        (only,) = names
        return lambda row: (row[only],)
    get = itemgetter(*names)
    return lambda row: get(row)  # a tuple for 2+ names

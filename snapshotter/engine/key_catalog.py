"""Which columns key each table's events, for the decoder, the windows and the sinks.

Three kinds of key, kept apart:

- the primary key: the decoder's key for log events, described once per table;
- the paging key of a table's current snapshot: what chunk windows and the visibility
  history compare (described when the snapshot starts, or recorded in state, for an
  unfinished snapshot after a restart);
- for a table without a primary key snapshotted by a surrogate key, that surrogate as the
  key of all its events: READ rows and log events must share one key shape, before and
  after a restart, so the engine re-keys that table's log events by it.

The runner builds the catalog first and hands it to the sinks (``key_names``) and to the
engine, which keeps it current; so a sink asks the catalog, never the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

from signals.names import TableId
from snapshotter.core.events import ChangeEvent, Op
from snapshotter.core.keys import Key
from snapshotter.core.state import SnapshotStatus, TableProgress
from snapshotter.core.window import buffer_key
from snapshotter.sources.base import TableSchema
from snapshotter.sources.log import TableShape

SIGNAL_TABLE_KEY = ("id",)


class KeyCatalog:
    def __init__(self, describe: Callable[[TableId], TableSchema], signal_table: TableId) -> None:
        self._describe = describe
        self._signal_table = signal_table
        self._primary_keys: dict[TableId, tuple[str, ...] | None] = {}
        self._paging_keys: dict[TableId, tuple[str, ...]] = {}
        self._unfinished_keys: dict[TableId, tuple[str, ...]] = {}
        self._surrogate_keys: dict[TableId, tuple[str, ...]] = {}
        # The log's latest description of each table (its key is what the decoder keyed by).
        self._shapes: dict[TableId, TableShape] = {}

    # -- what the engine tells the catalog

    def remember_surrogates(self, snapshots: Iterable[TableProgress]) -> None:
        """The surrogate keys of snapshots in state that did not fail: their tables' events
        keep that key after a restart, as before it."""
        for p in snapshots:
            if p.surrogate_key and p.key_columns and p.status is not SnapshotStatus.FAILED:
                self._surrogate_keys[p.table] = tuple(p.key_columns)

    def refresh_unfinished(self, snapshots: Iterable[TableProgress]) -> None:
        """Per-table paging keys of unfinished snapshots, computed once per read of the log
        and whenever a snapshot is added or described (not per event: state can hold many
        past snapshots)."""
        keys: dict[TableId, tuple[str, ...]] = {}
        for progress in snapshots:
            if progress.status.finished:
                continue
            if progress.key_columns:
                keys[progress.table] = tuple(progress.key_columns)
            elif progress.surrogate_key:
                keys[progress.table] = (progress.surrogate_key,)
        self._unfinished_keys = keys

    def table_started(
        self, table: TableId, schema: TableSchema, key_columns: Sequence[str]
    ) -> None:
        """A snapshot described ``table``: it pages by ``key_columns``, which are also the
        key of all its events when the table has no primary key (a surrogate key)."""
        self._paging_keys[table] = tuple(key_columns)
        if not schema.primary_key:
            self._surrogate_keys[table] = tuple(key_columns)

    def shape_seen(self, shape: TableShape) -> TableShape | None:
        """Record the log's description of a table; the one before it, if any."""
        previous = self._shapes.get(shape.table)
        self._shapes[shape.table] = shape
        return previous

    # -- what the decoder, the windows and the sinks ask

    def primary_key(self, table: TableId) -> Sequence[str] | None:
        """The decoder's key for a table's log events: its primary key (None: the decoder
        falls back to the log's identity columns)."""
        if table == self._signal_table:
            return SIGNAL_TABLE_KEY
        if table not in self._primary_keys:
            try:
                self._primary_keys[table] = self._describe(table).primary_key or None
            except Exception:
                return None  # not cached: asked again on the table's next Relation message
        return self._primary_keys[table]

    def paging_key(self, table: TableId) -> tuple[str, ...] | None:
        """The paging key of the table's unfinished snapshot: described, or recorded in
        state (after a restart, before the table is described again), or the signal's
        surrogate key; None: the primary key, which is the decoder's event key."""
        unfinished = self._unfinished_keys.get(table)
        if unfinished:
            return unfinished
        return self._paging_keys.get(table) or self._surrogate_keys.get(table)

    def key_names(self, table: TableId) -> Sequence[str]:
        """Column names of an event's ``key`` (for sinks that write a key object): the
        surrogate key the engine re-keys by, else exactly what the decoder keyed by."""
        if table in self._surrogate_keys:
            return self._surrogate_keys[table]
        shape = self._shapes.get(table)
        if shape is not None and shape.key:
            return shape.key
        return self.primary_key(table) or ()

    def window_keys(self, event: ChangeEvent) -> list[Key]:
        """The event's keys as a window of its table compares them (the paging key)."""
        if event.op is Op.TRUNCATE:
            return []
        columns = self.paging_key(event.table)
        keys = []
        for row in (event.before, event.after):
            if row is not None and columns is not None and all(c in row for c in columns):
                keys.append(buffer_key(tuple(row[c] for c in columns)))
        if columns is None and event.key is not None:
            keys.append(buffer_key(event.key))
        return keys

    def rekeyed(self, event: ChangeEvent) -> ChangeEvent:
        """The log event as the sink gets it: keyed by its table's surrogate key, if the
        table has one, else as the decoder keyed it."""
        columns = self._surrogate_keys.get(event.table)
        if columns is None or event.op is Op.TRUNCATE:
            return event
        row = event.after if event.after is not None else event.before
        if row is None or any(c not in row for c in columns):
            return event  # cannot happen under REPLICA IDENTITY FULL, which snapshot_key checks
        return replace(event, key=tuple(row[c] for c in columns))

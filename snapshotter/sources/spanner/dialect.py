"""The Spanner dialect (``sources.base.Dialect``): the catalog (``catalog``), max-key and
chunk reads, watermarks.

Chunk and max-key queries are strong single-use read-only transactions: they cannot write
(a signal's filter included), they see every transaction that committed before they started
(Spanner's external consistency), and the time limit is the call's deadline; no session
state outlives them, so there is nothing to reset after a filter. A transaction whose commit
timestamp is before a strong read's timestamp is visible to it, and commit timestamps are
the change stream's order: ``commits_visible_in_log_order``.

Watermark rows are ``insert_or_update`` mutations of the signal table in read-write
transactions (retried when Spanner, or the emulator's one-transaction-at-a-time rule,
aborts them).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from signals import Watermark
from signals.model import Signal, WatermarkKind, to_row
from signals.names import TableId
from signals.table import WATERMARK_TYPES
from snapshotter.common.faults import failpoint
from snapshotter.core.keys import Key
from snapshotter.core.values import RawJson
from snapshotter.sources.base import (
    ChunkReadError,
    ChunkRows,
    ChunkSpec,
    Dialect,
    ReadCancelled,
    TableError,
    TableSchema,
)
from snapshotter.sources.spanner import client as sp_client
from snapshotter.sources.spanner import sql
from snapshotter.sources.spanner.catalog import SpannerCatalog
from snapshotter.sources.spanner.chunk_sql import SpannerChunkQueries
from snapshotter.sources.spanner.client import SpannerDialectKind, SpannerTarget
from snapshotter.sources.spanner.types import (
    SpannerType,
    read_converter,
)
from snapshotter.sources.sql_common import checked_key, columns_converter


class SpannerDialect(SpannerCatalog):
    connector = "spanner"
    commits_visible_in_log_order = True

    def __init__(
        self,
        target: SpannerTarget,
        *,
        signal_table: TableId,
        chunk_timeout_s: float = 300.0,
        change_stream: str | None = None,
        database: Any = None,
    ) -> None:
        self.target = target
        self.change_stream = change_stream
        self.database = target.database
        self.signal_table = signal_table.with_default_schema(sql.DEFAULT_SCHEMA)
        super().__init__(
            database if database is not None else sp_client.open_database(target),
            chunk_timeout_s,
        )
        self._cancelled = threading.Event()

    # --- queries ---------------------------------------------------------------------------

    def _guarded(self, table: TableId, what: str, st: sql.Statement, text: str) -> list[list[Any]]:
        """A max-key, bound or chunk query: refused while reads are cancelled, past the time
        limit a TableError, a lost connection a ChunkReadError."""
        from google.api_core import exceptions as gexc

        if self._cancelled.is_set():
            raise ReadCancelled(f"{what} of {table} cancelled")
        try:
            rows = self._query(st, text)
        except gexc.DeadlineExceeded:
            raise TableError(
                f"the {what} of {table} ran past source.chunk_timeout_s "
                f"({self.chunk_timeout_s:g} s); raise it, or make the signal's filter cheaper"
            ) from None
        except gexc.GoogleAPICallError as exc:
            if sp_client.is_transient(exc):
                raise ChunkReadError(f"the {what} of {table}: {sp_client.reason(exc)}") from exc
            raise TableError(f"the {what} of {table} failed: {sp_client.reason(exc)}") from exc
        if self._cancelled.is_set():
            raise ReadCancelled(f"{what} of {table} cancelled")
        return rows

    # --- the snapshot side -------------------------------------------------------------------

    def max_key(
        self, schema: TableSchema, key_columns: Sequence[str], condition: str | None
    ) -> Key | None:
        st, text = self._queries(schema, key_columns).max_key(condition)
        rows = self._guarded(schema.table, "max-key query", st, text)
        if not rows:
            return None
        return self._key(schema, key_columns, rows[0])

    def _queries(self, schema: TableSchema, key_columns: Sequence[str]) -> SpannerChunkQueries:
        types = self._key_types(schema, key_columns)
        return SpannerChunkQueries(self.kind, schema.table, key_columns, types)

    def _key(self, schema: TableSchema, key_columns: Sequence[str], row: Sequence[Any]) -> Key:
        types = self._key_types(schema, key_columns)
        values = []
        for t, value in zip(types, row, strict=True):
            conv = read_converter(t)
            values.append(value if conv is None else conv(value))
        if any(t.family == "NUMERIC" for t in types):
            # The value model's NUMERIC is text; a key keeps the Decimal's exact value.
            values = [
                str(v) if t.family == "NUMERIC" else v for t, v in zip(types, values, strict=True)
            ]
        return checked_key(schema.table, values, "key")

    def estimated_rows(self, schema: TableSchema) -> int | None:
        return None  # Spanner keeps no cheap row count (SPANNER_SYS stats are hourly)

    def unfinished_xids(self) -> None:
        return None  # a strong read sees every commit before it (commits_visible_in_log_order)

    def read_chunk(self, spec: ChunkSpec) -> ChunkRows:
        schema = spec.schema
        st, text = self._queries(schema, spec.key_columns).chunk(spec)
        rows = self._guarded(schema.table, "chunk query", st, text)
        failpoint("chunk.select")
        table = self._to_arrow(schema, rows)
        last = None
        if rows:
            index = [schema.column_names.index(k) for k in spec.key_columns]
            last = self._key(schema, spec.key_columns, [rows[-1][i] for i in index])
        return ChunkRows(table, last, None)

    def _to_arrow(self, schema: TableSchema, rows: Sequence[Sequence[Any]]) -> pa.Table:
        types = self._types.get(schema.table) or {}
        arrays = []
        for i, column in enumerate(schema.columns):
            t = types.get(column.name, SpannerType("STRING"))
            conv = read_converter(t)
            values = [row[i] for row in rows]
            if conv is not None:
                values = [conv(v) for v in values]
            if t.family == "JSON":
                values = [None if v is None else v.text for v in values]
            arrays.append(pa.array(values, type=column.arrow_type))
        return pa.Table.from_arrays(arrays, schema=schema.arrow_schema())

    def chunk_bound(self, spec: ChunkSpec) -> Key | None:
        st, text = self._queries(spec.schema, spec.key_columns).bound(spec)
        rows = self._guarded(spec.schema.table, "bound query", st, text)
        return self._key(spec.schema, spec.key_columns, rows[0]) if rows else None

    def row_converter(
        self, schema: TableSchema
    ) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
        types = self._types.get(schema.table) or {}
        return columns_converter(
            {
                name: (lambda v: None if v is None else RawJson(v))
                for name, t in types.items()
                if t.family == "JSON"
            }
        )

    def scan(self, schema: TableSchema) -> Iterator[dict[str, Any]]:
        key = schema.primary_key
        convert = self.row_converter(schema)
        upto = self.max_key(schema, key, None)
        after: Key | None = None
        while upto is not None:
            chunk = self.read_chunk(ChunkSpec(schema, key, after, upto, None, 10_000))
            for row in chunk.rows.to_pylist():
                yield convert(row) if convert is not None else row
            if chunk.last_key is None or chunk.rows.num_rows < 10_000:
                return
            after = chunk.last_key

    # --- watermarks ------------------------------------------------------------------------

    def _run(self, work: Callable[[Any], Any]) -> Any:
        return self.db.run_in_transaction(work)

    def write_watermark(self, watermark: Watermark) -> None:
        sid, stype, data = to_row(watermark)
        name = sql.mutation_table(self.signal_table)

        def write(tx: Any) -> None:
            tx.insert_or_update(name, ("id", "type", "data"), [(sid, stype, data)])

        self._run(write)

    def delete_watermarks(self, window_ids: Sequence[str]) -> int:
        if not window_ids:
            return 0
        from google.cloud.spanner_v1 import KeySet

        ids = [Watermark(w, kind).id for w in window_ids for kind in WatermarkKind]
        name = sql.mutation_table(self.signal_table)

        def delete(tx: Any) -> int:
            rows = list(tx.read(name, ("id", "type"), KeySet(keys=[[i] for i in ids])))
            # Only watermark rows: a user's signal that happens to have such an id stays.
            ours = [[r[0]] for r in rows if r[1] in WATERMARK_TYPES]
            if ours:
                tx.delete(name, KeySet(keys=ours))
            return len(ours)

        return int(self._run(delete))

    def watermark_rows(self, after: str | None, limit: int) -> list[tuple[str, str]]:
        from google.cloud.spanner_v1 import param_types

        st = sql.Statement(self.kind)
        types = ", ".join(st.param(t, param_types.STRING) for t in WATERMARK_TYPES)
        where = f"{st.name('type')} IN ({types})"
        if after is not None:
            where += f" AND {st.name('id')} > {st.param(after, param_types.STRING)}"
        text = (
            f"SELECT {st.name('id')}, {st.name('type')} "
            f"FROM {sql.table_ref(self.kind, self.signal_table)} WHERE {where} "
            f"ORDER BY {st.name('id')} LIMIT {st.param(limit, sql.int64())}"
        )
        return [(str(i), str(t)) for i, t in self._query(st, text)]

    # --- the signal table and the change stream (init, signal, teardown) ------------------

    def update_ddl(self, statements: Sequence[str]) -> None:
        """Run DDL and wait for it (schema changes are long-running operations)."""
        self.db.update_ddl(list(statements)).result(timeout=600)
        self._schemas.clear()
        self._types.clear()

    def create_signal_table(self) -> bool:
        from snapshotter.sources.spanner.setup import signal_table_ddl

        if self.table_exists(self.signal_table):
            return False
        self.update_ddl([signal_table_ddl(self.kind, self.signal_table)])
        return True

    def drop_signal_table(self) -> bool:
        if not self.table_exists(self.signal_table):
            return False
        self.update_ddl([f"DROP TABLE {sql.table_ref(self.kind, self.signal_table)}"])
        return True

    def insert_signal(self, signal: Signal | Watermark) -> str:
        sid, stype, data = to_row(signal)
        name = sql.mutation_table(self.signal_table)
        self._run(lambda tx: tx.insert(name, ("id", "type", "data"), [(sid, stype, data)]))
        return sid

    def signal_rows(self) -> list[tuple[Any, Any, Any]]:
        text = (
            f"SELECT {sql.quote(self.kind, 'id')}, {sql.quote(self.kind, 'type')}, "
            f"{sql.quote(self.kind, 'data')} FROM {sql.table_ref(self.kind, self.signal_table)} "
            f"ORDER BY {sql.quote(self.kind, 'id')}"
        )
        return [(r[0], r[1], r[2]) for r in self._query(None, text)]

    # --- the log ---------------------------------------------------------------------------

    def server_time_us(self) -> int:
        """Spanner's current time (a strong read's timestamp), in µs since the epoch."""
        text = (
            "SELECT CURRENT_TIMESTAMP()"
            if self.kind is SpannerDialectKind.GOOGLESQL
            else ("SELECT now()")
        )
        (row,) = self._query(None, text)
        from snapshotter.sources.spanner.records import micros

        return micros(row[0])

    def log_end(self) -> int:
        return self.server_time_us()

    def lag_bytes(self, resume: Mapping[str, Any]) -> int | None:
        return None  # a change stream has no byte offsets

    def ensure_captured(self, tables: Sequence[TableId]) -> list[TableId]:
        """Nothing is added: the change stream is the user's DDL. A table it does not watch
        cannot be snapshotted (its changes would be missing)."""
        from snapshotter.sources.spanner import setup

        return setup.refuse_unwatched(self, tables)

    def is_transient(self, exc: BaseException) -> bool:
        return isinstance(exc, ChunkReadError) or sp_client.is_transient(exc)

    def cancel_reads(self) -> None:
        self._cancelled.set()

    def allow_reads(self) -> None:
        self._cancelled.clear()

    def close(self) -> None:
        # Not Database.close(): it joins the client's session-maintenance thread, which
        # sleeps 10 minutes between checks (client 3.71). That thread is a daemon and holds
        # nothing of ours; the sessions expire on the server.
        return None


def _is_a_dialect(dialect: SpannerDialect) -> Dialect:
    """Never called: makes mypy check that SpannerDialect implements the protocol."""
    return dialect

"""The small interface between the generic engine and one database.

The DBLog algorithm (``snapshotter.engine`` with ``snapshotter.core.window``) is written once.
A dialect supplies what differs per database: the catalog, the SQL of the max-key and chunk
queries, the watermark insert, and capture setup. Log reading is behind ``LogReader`` in
``snapshotter.sources.log``. A capability the engine needs goes here, never an ``isinstance``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from signals import Watermark
from signals.names import TableId
from snapshotter.core.keys import Key
from snapshotter.core.visibility import OpenAtStart, ReadVisibility


class TableError(Exception):
    """A table that cannot be snapshotted as asked; the message says why and what to do."""


class ChunkReadError(Exception):
    """A read failed for a reason outside the query (connection lost, server restarting or
    shutting down): worth retrying, unlike a TableError."""


class ReadCancelled(Exception):
    """A max-key or chunk query cancelled on purpose (stop-snapshot, shutdown:
    ``Dialect.cancel_reads``): neither a failure of the table nor worth a retry."""


def error_chain(exc: BaseException) -> Iterable[BaseException]:
    """``exc``, then what it wraps, each once: SQLAlchemy's ``orig`` (the driver's error)
    and the ``raise ... from`` causes (what ``Dialect.is_transient`` looks through)."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        error = todo.pop(0)
        if id(error) in seen:
            continue
        seen.add(id(error))
        yield error
        orig = getattr(error, "orig", None)
        if isinstance(orig, BaseException):
            todo.append(orig)
        if error.__cause__ is not None:
            todo.append(error.__cause__)


@dataclass(frozen=True, slots=True)
class ColumnInfo:
    name: str
    type_name: str  # the SQL type as the database spells it (used in casts), e.g. "numeric(12,2)"
    type_code: int  # PostgreSQL: the type OID (resolved through domains); MySQL: its type code
    nullable: bool
    arrow_type: pa.DataType


@dataclass(frozen=True, slots=True)
class TableSchema:
    table: TableId
    columns: tuple[ColumnInfo, ...]
    primary_key: tuple[str, ...]  # in key order; empty when the table has none

    def column(self, name: str) -> ColumnInfo:
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(name)

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def arrow_schema(self) -> pa.Schema:
        return pa.schema(
            [pa.field(c.name, c.arrow_type, nullable=c.nullable) for c in self.columns]
        )

    def signature(self) -> tuple[tuple[str, int], ...]:
        """What a log reader can compare against the table's shape in the log."""
        return tuple((c.name, c.type_code) for c in self.columns)


@dataclass(frozen=True, slots=True)
class ChunkSpec:
    """One chunk's key range: the rows of ``schema`` with ``after < key <= upto`` (the key is
    ``key_columns``, compared in the index's order) under the signal's filter ``condition``
    (SQL, None for none), in key order, at most ``limit`` of them. ``after`` None: from the
    table's first key. ``Dialect.chunk_bound`` reads only where the ``limit``-th row's key is."""

    schema: TableSchema
    key_columns: tuple[str, ...]
    after: Key | None
    upto: Key
    condition: str | None
    limit: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "key_columns", tuple(self.key_columns))  # a cache key part
        for label, key in (("after", self.after), ("upto", self.upto)):
            if key is not None and len(key) != len(self.key_columns):
                raise ValueError(
                    f"{label} key {key!r} does not match key columns {self.key_columns}"
                )
        if self.limit < 1:
            raise ValueError(f"a chunk needs a limit >= 1, not {self.limit}")

    @property
    def table(self) -> TableId:
        return self.schema.table

    @property
    def filtered(self) -> bool:
        """Whether the queries run a signal's filter (then they are checked and the session
        reset after them)."""
        return self.condition is not None


@dataclass(frozen=True, slots=True)
class ChunkRows:
    """What one chunk SELECT returned."""

    rows: pa.Table  # in key order, columns and Arrow types as TableSchema.arrow_schema()
    last_key: Key | None  # the last key the SELECT returned; None when it returned nothing
    # What the SELECT's snapshot could not see (PostgreSQL: pg_current_snapshot()), so the
    # engine can drop rows that transactions logged before the open watermark made stale.
    visibility: ReadVisibility | None


class Dialect(Protocol):
    connector: str  # Debezium's connector name: "postgresql", "mysql"
    database: str  # the database name (``source.db``)
    # Whether the database reads ``$$`` as a quote (PostgreSQL) or as part of a name
    # (MySQL): signal filters are checked the way the database will read them.
    dollar_quotes: bool
    # Whether every transaction logged before a commit is visible to a SELECT that starts
    # after that commit returned (MySQL, binlog_order_commits=ON). When False (PostgreSQL:
    # a commit can be in the WAL before it is visible), chunk reads report ReadVisibility
    # and the engine keeps a history of recent transactions to drop what they missed.
    commits_visible_in_log_order: bool

    def describe(self, table: TableId) -> TableSchema:
        """Columns (in table order) and primary key; TableError if the table is missing."""
        ...

    def snapshot_key(self, schema: TableSchema, surrogate_key: str | None) -> tuple[str, ...]:
        """The columns chunks are paged by: the primary key, or the signal's surrogate key
        (which must exist, be NOT NULL and unique). TableError with the fix otherwise."""
        ...

    def list_tables(self) -> list[TableId]:
        """Every base or partitioned (root) table the user can read, for pattern matching."""
        ...

    def relation_kinds(self, tables: Sequence[TableId]) -> Mapping[TableId, str]:
        """For names ``list_tables`` lacks: why each is not a table to snapshot ("is a
        view: only tables can be snapshotted", ...), in one query; names the catalog does
        not know are left out (``snapshotter.sources.relations``)."""
        ...

    def max_key(
        self, schema: TableSchema, key_columns: Sequence[str], condition: str | None
    ) -> Key | None:
        """The largest key under the filter, or None when no row matches."""
        ...

    def estimated_rows(self, schema: TableSchema) -> int | None:
        """The table's row count from the database's statistics (cheap: no scan, no
        filter), for progress and ETA only; None when the statistics do not know (never
        analyzed). May be stale or rough; the engine treats any error as None."""
        ...

    def read_chunk(self, spec: ChunkSpec) -> ChunkRows:
        """The rows of ``spec``'s range under its filter, in key order, at most
        ``spec.limit``, in one READ ONLY transaction that has ended when this returns.

        This and ``max_key`` run the signal's filter (SQL from the signal table): each runs
        under the ``chunk_timeout_s`` limit (a TableError past it), and after a filtered
        query the connection's session is reset (settings, locks, variables), so a filter
        cannot change what later queries of other tables return."""
        ...

    def unfinished_xids(self) -> OpenAtStart | None:
        """The transactions not ended now, and what the server shows of their sessions:
        asked once as the engine starts, before any chunk is read, where commits are not
        visible in log order (``core.visibility``: rule 4 across restarts); None
        elsewhere."""
        ...

    def chunk_bound(self, spec: ChunkSpec) -> Key | None:
        """Where a chunk of ``spec.limit`` rows after ``spec.after`` ends: the key of the
        ``spec.limit``-th row of the range under the filter, in key order (a scan of the
        key's index, no row fetched to the client); None when fewer rows remain. Runs like
        ``max_key`` (time limit, session reset after a filter). Parallel reads
        (``core.spans``) read the range up to it whole while the next one is bounded."""
        ...

    def row_converter(
        self, schema: TableSchema
    ) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
        """What turns a buffered chunk row (Arrow storage values) into the event value model
        (e.g. JSON text into RawJson); None when nothing needs converting."""
        ...

    def scan(self, schema: TableSchema) -> Iterator[dict[str, Any]]:
        """Every row of the table in the value model, read as chunks are read (for the
        convergence check), streamed; in no particular order."""
        ...

    def write_watermark(self, watermark: Watermark) -> None:
        """Insert the watermark row into the signal table and commit."""
        ...

    def delete_watermarks(self, window_ids: Sequence[str]) -> int:
        """Delete these windows' open and close rows from the signal table (watermark rows
        only, never a user signal) and commit; returns how many rows went."""
        ...

    def watermark_rows(self, after: str | None, limit: int) -> list[tuple[str, str]]:
        """``(id, type)`` of up to ``limit`` watermark rows of the signal table with an id
        above ``after``, in id order."""
        ...

    def log_end(self) -> int:
        """The current end of the log (PostgreSQL: the WAL flush LSN) as a log offset,
        comparable with the readers' ``Progress.log_offset`` and commit resume points."""
        ...

    def lag_bytes(self, resume: Mapping[str, Any]) -> int | None:
        """How many bytes of log follow the reader's restart point ``resume`` (for
        ``status``); None when the distance is not known."""
        ...

    def ensure_captured(self, tables: Sequence[TableId]) -> list[TableId]:
        """Make the log carry these tables (PostgreSQL: ALTER PUBLICATION ... ADD TABLE);
        returns those that were added. Committed when this returns."""
        ...

    def is_transient(self, exc: BaseException) -> bool:
        """Whether ``exc`` (raised by one of these methods) means the connection was lost or
        the server is restarting, shutting down or unreachable: the engine retries the call
        later instead of failing the snapshot. False for what the query or the table did
        (bad filter, permissions, missing table, data), and for authentication failures."""
        ...

    def cancel_reads(self) -> None:
        """Cancel the max-key or chunk query running now (called from another thread than
        the one reading), and refuse those started later, until ``allow_reads``; each
        raises ReadCancelled."""
        ...

    def allow_reads(self) -> None:
        """Let max-key and chunk queries run again after ``cancel_reads``."""
        ...

    def close(self) -> None: ...

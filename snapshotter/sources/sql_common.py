"""The chunk SQL, written once (SQLAlchemy Core: identifiers are always quoted by the
library), and what both SQL dialects share around it: the statement cache, keys as state
keeps them, the signal-table writes, the turning of fetched rows into Arrow.

:class:`ChunkQueries` builds the three queries of a chunk — the maximum key, the chunk
SELECT, and a chunk's bound (the key ``n`` rows on) — from one skeleton: select, the key
range, the filter, key order, a row count. A dialect fills in three hooks: how a column is
selected (``output``: PostgreSQL casts what its driver would read differently from the log,
MySQL reads FLOAT as DOUBLE), how a key bound is compared (``key_range``: PostgreSQL's row
comparison with each value cast to its column's type, MySQL's OR-expanded form MariaDB can
range-scan), and the type of the count parameters (``count``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any

import pyarrow as pa
import sqlalchemy as sa

from signals import Watermark
from signals.names import TableId
from signals.table import delete_watermarks, insert_signal, watermark_rows
from snapshotter.core.keys import Key, KeyCodecError, normalize_key
from snapshotter.core.visibility import OpenAtStart
from snapshotter.sources.base import (
    ChunkReadError,
    ChunkSpec,
    ColumnInfo,
    TableError,
    TableSchema,
    error_chain,
)
from snapshotter.sources.privileges import SIGNAL_TABLE_PRIVILEGES, granted

_MAX_CACHED_QUERIES = 256
CHUNK_QUERY = "chunk query"  # what a chunk read is called in errors (and fault points)


def sa_table(schema: TableSchema) -> sa.TableClause:
    return sa.table(
        schema.table.table, *(sa.column(c.name) for c in schema.columns), schema=schema.table.schema
    )


def key_clauses(
    schema: TableSchema, table: sa.TableClause, names: tuple[str, ...]
) -> list[sa.ColumnClause[Any]]:
    missing = [k for k in names if k not in schema.column_names]
    if missing or not names:
        raise TableError(f"table {schema.table} has no key column(s) {missing or names}")
    return [table.c[k] for k in names]


def signal_filter(condition: str) -> sa.TextClause:
    """The signal's filter, parenthesised so an OR inside it cannot widen the key range.

    Colons are escaped: in ``sa.text`` ``:name`` would be a bind parameter. (SQLAlchemy
    doubles percent signs itself for drivers with pyformat parameters.)
    """
    return sa.text("(" + condition.replace(":", "\\:") + ")")


def count_params(spec: ChunkSpec, bound: bool) -> dict[str, int]:
    """The row count of a chunk query (``:limit``) or of a bound query (``:skip``, the rows
    passed over before the bound's)."""
    return {"skip": spec.limit - 1} if bound else {"limit": spec.limit}


def chunk_shape(spec: ChunkSpec, bound: bool) -> tuple[Any, ...]:
    """What the SQL of ``spec``'s chunk (or bound) query depends on, for the statement
    cache: not the key values or the row count, which are parameters."""
    kind = "bound" if bound else "chunk"
    return (kind, spec.schema, spec.key_columns, spec.after is not None, spec.condition)


def checked_key(table: TableId, key: Sequence[Any], what: str) -> Key:
    """``key`` as state keeps it; a TableError, not a failure to save state later, for a
    value that cannot be kept."""
    try:
        return normalize_key(key)
    except KeyCodecError as exc:
        raise TableError(
            f"table {table}: its {what} {tuple(key)!r} cannot be kept: {exc}"
        ) from None


class ChunkQueries(ABC):
    """The max-key, chunk and bound queries of one table and key, for one dialect.

    Key values are bound parameters: ``a<i>`` the lower bound (``after``), ``u<i>`` the
    upper one (``upto``), as the dialect's ``key_range`` names them; the row count is
    ``:limit`` (chunk) or ``:skip`` (bound)."""

    def __init__(self, schema: TableSchema, key_columns: Sequence[str]) -> None:
        self.schema = schema
        self.key_columns = tuple(key_columns)
        self.table = sa_table(schema)
        self.keys = key_clauses(schema, self.table, self.key_columns)

    # --- hooks ----------------------------------------------------------------------------

    @abstractmethod
    def output(self, column: ColumnInfo) -> sa.ColumnElement[Any]:
        """``column`` as selected, under its own name."""

    @abstractmethod
    def key_range(self, prefix: str, lower: bool) -> sa.ColumnElement[bool]:
        """``key > (:<prefix>0, ..)`` (lower) or ``key <= (:<prefix>0, ..)`` (upper), in a
        form the database answers with one range of the key's index."""

    @abstractmethod
    def count(self, name: str) -> sa.BindParameter[Any]:
        """The ``LIMIT`` / ``OFFSET`` parameter ``name``."""

    # --- the queries ----------------------------------------------------------------------

    def max_key(self, condition: str | None) -> sa.Select[Any]:
        """The largest key under the filter (a backward scan of the key's index)."""
        query = sa.select(*self._key_outputs()).select_from(self.table)
        if condition is not None:
            query = query.where(signal_filter(condition))
        return query.order_by(*(k.desc() for k in self.keys)).limit(sa.literal_column("1"))

    def chunk(self, has_after: bool, condition: str | None) -> sa.Select[Any]:
        """Every column of the rows in the key range, in key order, ``:limit`` of them."""
        outputs = [self.output(c) for c in self.schema.columns]
        return self._in_range(outputs, has_after, condition).limit(self.count("limit"))

    def bound(self, has_after: bool, condition: str | None) -> sa.Select[Any]:
        """The key ``:skip`` rows past the first of the range: the chunk query's key range
        and order, the key columns only (as ``max_key`` selects them), so the database walks
        the key's index and stops there, sending one row."""
        query = self._in_range(self._key_outputs(), has_after, condition)
        return query.limit(sa.literal_column("1")).offset(self.count("skip"))

    def of(self, spec: ChunkSpec, bound: bool) -> sa.Select[Any]:
        """``spec``'s chunk query, or (``bound``) its bound query."""
        has_after = spec.after is not None
        return (self.bound if bound else self.chunk)(has_after, spec.condition)

    def _key_outputs(self) -> list[sa.ColumnElement[Any]]:
        return [self.output(self.schema.column(k)) for k in self.key_columns]

    def _in_range(
        self, outputs: Sequence[sa.ColumnElement[Any]], has_after: bool, condition: str | None
    ) -> sa.Select[Any]:
        query = sa.select(*outputs).select_from(self.table)
        if has_after:
            query = query.where(self.key_range("a", lower=True))
        query = query.where(self.key_range("u", lower=False))
        if condition is not None:
            query = query.where(signal_filter(condition))
        # ORDER BY the table's own columns (qualified), not the labels of cast ones.
        return query.order_by(*self.keys)


class SqlDialect(ABC):
    """What the SQL dialects share beside the chunk SQL: the watermark rows of the signal
    table (the same SQL for every database: ``signals.table``, through the dialect's
    SQLAlchemy engine) and the error classification by the chain of causes. Hooks:
    ``engine`` and ``_transient_error``. The reads of the chunk connection are
    ``sql_reads.GuardedReads``."""

    signal_table: TableId

    @property
    @abstractmethod
    def engine(self) -> sa.Engine:
        """The SQLAlchemy engine of the catalog and watermark connections."""

    @staticmethod
    @abstractmethod
    def _transient_error(error: BaseException) -> bool:
        """Whether the driver's ``error`` (one link of the chain) means a lost connection
        or a server going away."""

    def write_watermark(self, watermark: Watermark) -> None:
        # A privilege the user lacks is said in one line with its GRANT: the snapshot's
        # error in status, never SQLAlchemy's dump of the upsert and its parameters.
        what = f"writing a snapshot watermark row into the signal table {self.signal_table}"
        with (
            granted(self.engine, self.signal_table, SIGNAL_TABLE_PRIVILEGES, what),
            self.engine.begin() as conn,
        ):
            self._watermark_transaction(conn)
            insert_signal(conn, self.signal_table, watermark)

    def _watermark_transaction(self, conn: sa.Connection) -> None:
        """Settings of the transaction that writes a watermark row, before its insert
        (none here; PostgreSQL asks for a local flush at commit)."""
        return None

    def delete_watermarks(self, window_ids: Sequence[str]) -> int:
        with self.engine.begin() as conn:
            return delete_watermarks(conn, self.signal_table, window_ids)

    def watermark_rows(self, after: str | None, limit: int) -> list[tuple[str, str]]:
        with self.engine.connect() as conn:
            return watermark_rows(conn, self.signal_table, after, limit)

    def is_transient(self, exc: BaseException) -> bool:
        return any(_lost(error) or self._transient_error(error) for error in error_chain(exc))

    def unfinished_xids(self) -> OpenAtStart | None:
        return None  # commits visible in log order (MySQL); PostgreSQL answers


def _lost(error: BaseException) -> bool:
    """What means a lost connection whatever the database: a chunk read that failed so
    (``ChunkReadError``), a connection error, a pooled connection SQLAlchemy found gone."""
    if isinstance(error, ChunkReadError | ConnectionError):
        return True
    return isinstance(error, sa.exc.DBAPIError) and error.connection_invalidated


def rows_to_arrow(
    schema: TableSchema, rows: Sequence[tuple[Any, ...]], arrow: pa.Schema | None = None
) -> pa.Table:
    """Rows to an Arrow table, column by column (``map(itemgetter)`` transposes about 2.5x
    faster than ``zip(*rows)``)."""
    arrays = [
        pa.array(list(map(itemgetter(i), rows)), type=c.arrow_type)
        for i, c in enumerate(schema.columns)
    ]
    return pa.Table.from_arrays(arrays, schema=arrow or schema.arrow_schema())


def last_key(
    schema: TableSchema, key_columns: Sequence[str], rows: Sequence[tuple[Any, ...]]
) -> Key | None:
    """The key of the last row a chunk SELECT returned (None for no rows)."""
    if not rows:
        return None
    last = rows[-1]
    return tuple(last[schema.column_names.index(k)] for k in key_columns)


def columns_converter(
    converters: dict[str, Callable[[Any], Any]],
) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
    """A row converter applying ``converters`` by column; None when there are none."""
    if not converters:
        return None
    return ColumnsConverter(converters)


class ColumnsConverter:
    """A row converter made of per-column value converters. ``columns`` lets a sink that
    encodes a READ batch column by column (``sinks.batch_json``) convert just those columns
    instead of building a dict per row."""

    __slots__ = ("columns",)

    def __init__(self, columns: dict[str, Callable[[Any], Any]]) -> None:
        self.columns = columns

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        out = dict(row)
        for name, conv in self.columns.items():
            out[name] = conv(out[name])
        return out


class StatementCache:
    """Statements compiled once per shape (chunks differ only in their parameters)."""

    def __init__(self, dialect: Callable[[], sa.Dialect]) -> None:
        self._dialect = dialect
        self._sql: dict[tuple[Any, ...], tuple[str, tuple[str, ...]]] = {}

    def get(self, key: tuple[Any, ...], build: Callable[[], sa.Select[Any]]) -> str:
        return self.get_positional(key, build)[0]

    def get_positional(
        self, key: tuple[Any, ...], build: Callable[[], sa.Select[Any]]
    ) -> tuple[str, tuple[str, ...]]:
        """The statement and, for a dialect with a positional paramstyle (``$1``, ...), the
        names of its parameters in position order (empty for a named paramstyle)."""
        found = self._sql.get(key)
        if found is None:
            if len(self._sql) >= _MAX_CACHED_QUERIES:
                self._sql.clear()
            compiled = build().compile(dialect=self._dialect())
            found = str(compiled), tuple(compiled.positiontup or ())
            self._sql[key] = found
        return found

"""The PostgreSQL chunk connection's reads: the maximum key, a chunk, a chunk's bound, their
plans (``EXPLAIN``), and a whole table for ``verify``, through ``sql_reads.GuardedReads``.

One ADBC connection (``pg_arrow``) reads rows straight into Arrow: the types whose binary
value equals what the pgoutput decoder's loaders make of the output text are read by type,
every other type as its output text, so a READ row and a log row of the same table are
identical. Each read runs in a REPEATABLE READ READ ONLY transaction that records its
snapshot (rule 4 of docs/design.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

import psycopg
import pyarrow as pa
import sqlalchemy as sa
from psycopg.conninfo import make_conninfo

from signals.names import TableId
from snapshotter.core.keys import Key
from snapshotter.core.visibility import PgSnapshot
from snapshotter.sources.base import ChunkRows, ChunkSpec, TableError, TableSchema
from snapshotter.sources.postgres import arrow as pg_arrow
from snapshotter.sources.postgres import types as pg_types
from snapshotter.sources.postgres.chunk_sql import DOLLAR_PARAMS, PgChunkQueries, key_params
from snapshotter.sources.postgres.transient import driver_error_is_transient
from snapshotter.sources.query_guard import CANCEL_TIMEOUT_S, GuardedQuery
from snapshotter.sources.sql_common import (
    CHUNK_QUERY,
    checked_key,
    chunk_shape,
    columns_converter,
    count_params,
)
from snapshotter.sources.sql_reads import GuardedReads, Statement, WatchedSession

_JSON = pg_types.JSON_OIDS

# The chunk's read transaction: REPEATABLE READ (the snapshot is fixed by its first
# statement) and READ ONLY (a filter, SQL from the signal table, cannot write). Its first
# statement records the snapshot (the SELECT's) and sets the statement timeout of the
# queries in it, in milliseconds.
_BEGIN = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
_BEGIN_READ = (
    "SELECT pg_current_snapshot()::text AS snapshot, "
    "set_config('statement_timeout', $1, true) AS statement_timeout"
)
# Settings that change how values are written as text (the chunk reader's format, also the
# log decoder's): a filter that changes one (set_config) would make chunk rows differ from
# log rows, so a filtered read checks them before its rows are used.
_OUTPUT_SETTINGS = (
    "DateStyle",
    "IntervalStyle",
    "TimeZone",
    "extra_float_digits",
    "bytea_output",
    "lc_monetary",
    "search_path",  # how regclass, regtype, ... values name objects
)
_SETTINGS_QUERY = "SELECT " + ", ".join(f"current_setting('{s}')" for s in _OUTPUT_SETTINGS)
# The chunk connection's own settings: timestamptz text carries the session's offset, and the
# log decoder loads it as UTC.
_SESSION_SETTINGS = "SET TimeZone TO 'UTC'"
# What a filter may have left in the session, undone in one round trip: DISCARD ALL but for
# DEALLOCATE ALL (which cannot run in the implicit transaction of a multi-statement string;
# no prepared statement holds session state a filter set). Simple protocol: several
# statements, one implicit transaction.
_RESET_SESSION = (
    "CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; RESET ALL; UNLISTEN *; "
    "SELECT pg_advisory_unlock_all(); DISCARD TEMP; DISCARD SEQUENCES; " + _SESSION_SETTINGS
)
# statement_timeout's SQLSTATE (query_canceled, shared with any cancel request).
_QUERY_CANCELED = "57014"


_Connection = pg_arrow.ArrowConnection


class PgReads(GuardedReads[_Connection, tuple[pa.Table, str]]):
    """The reads part of :class:`snapshotter.sources.postgres.dialect.PostgresDialect`:
    its chunk connection's queries and the hooks of the read lifecycle."""

    url: sa.URL  # the source (``postgresql+psycopg``)
    _driver_errors = (pg_arrow.AdbcError,)
    _watched_session = WatchedSession(
        "setting",
        _OUTPUT_SETTINGS,
        "Send execute-snapshot again with a filter that changes no setting (no set_config)",
    )

    def _statement_dialect(self) -> sa.Dialect:
        return DOLLAR_PARAMS

    # --- the queries ----------------------------------------------------------------------

    def max_key(
        self, schema: TableSchema, key_columns: Sequence[str], condition: str | None
    ) -> Key | None:
        keys = tuple(key_columns)

        def statement(conn: _Connection) -> Statement:
            float_text = conn.float_text
            sql = self._statements.get(
                ("max", schema, keys, condition, float_text),
                lambda: PgChunkQueries(schema, keys, float_text).max_key(condition),
            )
            return sql, []

        rows, _ = self._read(schema.table, "max-key query", statement, condition is not None)
        return _key_of(schema, keys, rows, "maximum key")

    def read_chunk(self, spec: ChunkSpec) -> ChunkRows:
        statement = partial(self._statement, spec, False)
        raw, snapshot = self._read(spec.table, CHUNK_QUERY, statement, spec.filtered)
        rows = _to_schema(spec.table, raw, spec.schema.arrow_schema())
        last = pg_arrow.last_row_key(rows, spec.key_columns)
        return ChunkRows(
            rows,
            None if last is None else checked_key(spec.table, last, "last key of a chunk"),
            PgSnapshot.parse(snapshot),
        )

    def chunk_bound(self, spec: ChunkSpec) -> Key | None:
        statement = partial(self._statement, spec, True)
        found, _ = self._read(spec.table, "chunk bound query", statement, spec.filtered)
        return _key_of(spec.schema, spec.key_columns, found, "chunk bound")

    def explain_chunk(self, spec: ChunkSpec) -> str:
        """The plan (``EXPLAIN``) of the chunk SELECT ``read_chunk`` would run: a composite
        key must be an index range (``Index Cond`` with the row comparison), or every chunk
        reads the index from its start."""
        return self._explain(spec, False, "EXPLAIN of the chunk query")

    def explain_bound(self, spec: ChunkSpec) -> str:
        """The plan of ``chunk_bound``'s query: an index (only) scan with the key range as
        its ``Index Cond``, never a scan from the index's start or a sort."""
        return self._explain(spec, True, "EXPLAIN of the chunk bound query")

    def _statement(self, spec: ChunkSpec, bound: bool, conn: _Connection) -> Statement:
        """The chunk SELECT (or, ``bound``, the chunk bound query) of ``spec`` for the
        connection's float mode, and its parameters in ``$n`` order."""
        float_text = conn.float_text
        sql, names = self._statements.get_positional(
            (*chunk_shape(spec, bound), float_text),
            lambda: PgChunkQueries(spec.schema, spec.key_columns, float_text).of(spec, bound),
        )
        params = {**key_params(spec), **count_params(spec, bound)}
        return sql, [params[name] for name in names]

    def _explain(self, spec: ChunkSpec, bound: bool, what: str) -> str:
        def statement(conn: _Connection) -> Statement:
            sql, params = self._statement(spec, bound, conn)
            return "EXPLAIN " + sql, params

        rows, _ = self._read(spec.table, what, statement, False)
        return "\n".join(str(line) for line in rows.column(0).to_pylist())

    def row_converter(
        self, schema: TableSchema
    ) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
        """JSON columns are buffered as their text; events carry them as RawJson (what
        ``pg_types.finish_value`` makes of a log value too). Nothing else needs converting."""
        return columns_converter(
            {
                c.name: partial(pg_types.finish_value, c.type_code)
                for c in schema.columns
                if c.type_code in _JSON
            }
        )

    def scan(self, schema: TableSchema) -> Iterator[dict[str, Any]]:
        """Every row of the table in the value model, read with the chunk reader's loaders
        (for ``verify``), on a connection of its own, streamed."""
        from snapshotter.sources.postgres.scan import read_table_rows

        columns = [(c.name, c.type_code) for c in schema.columns]
        args, kwargs = self.engine.dialect.create_connect_args(self.url)
        kwargs.pop("context", None)
        with psycopg.connect(*args, **kwargs, context=pg_types.LoadContext()) as conn:
            conn.execute("SET TimeZone = 'UTC'")
            yield from read_table_rows(conn, schema.table, columns)

    # --- the hooks of the read lifecycle (sql_reads) ---------------------------------------

    def _open_connection(self) -> tuple[_Connection, tuple[Any, ...]]:
        # The same connection arguments the engine would use (host, sslmode, ...), as a
        # libpq connection string; text in UTF-8 whatever the database's encoding (the
        # driver's Arrow strings are UTF-8; psycopg decoded the server's encoding).
        args, kwargs = self.engine.dialect.create_connect_args(self.url)
        kwargs.pop("context", None)
        kwargs.setdefault("application_name", "snapshotter")
        kwargs["client_encoding"] = "UTF8"
        conninfo = make_conninfo(*args, **kwargs)
        conn = pg_arrow.ArrowConnection(conninfo, CANCEL_TIMEOUT_S)
        try:
            conn.script(_SESSION_SETTINGS)
            settings = _first_row(conn.fetch(_SETTINGS_QUERY))
        except BaseException:
            conn.close()
            raise
        # float8 in binary equals the log's text only when that text reads back exactly.
        digits = dict(zip(_OUTPUT_SETTINGS, settings, strict=True))["extra_float_digits"]
        conn.float_text = int(digits) <= 0
        return conn, settings

    @staticmethod
    def _is_usable(conn: _Connection) -> bool:
        return not (conn.closed or conn.broken)

    @staticmethod
    def _close_connection(conn: _Connection) -> None:
        conn.close()

    def _canceller(self, conn: _Connection) -> Callable[[], None]:
        return conn.cancel

    @contextmanager
    def _read_transaction(self, conn: _Connection) -> Iterator[None]:
        conn.script(_BEGIN)
        try:
            yield
            conn.script("COMMIT")
        except BaseException:
            if not conn.broken:
                try:
                    conn.script("ROLLBACK")
                except pg_arrow.AdbcError:
                    conn.broken = True
            raise

    def _fetch(self, conn: _Connection, statement: Statement) -> tuple[pa.Table, str]:
        """The statement's rows as the driver's Arrow table, and the transaction's
        snapshot (``pg_current_snapshot()``, the snapshot the statement read in)."""
        sql, params = statement
        timeout_ms = str(max(1, round(self.chunk_timeout_s * 1000)))
        snapshot = _first_row(conn.fetch(_BEGIN_READ, [timeout_ms]))[0]
        return conn.fetch(sql, params), str(snapshot)

    def _session_values(self, conn: _Connection) -> tuple[Any, ...]:
        return _first_row(conn.fetch(_SETTINGS_QUERY))

    def _reset_session(self, conn: _Connection) -> bool:
        conn.script(_RESET_SESSION)
        return True

    def _server_timed_out(self, exc: BaseException, query: GuardedQuery | None) -> bool:
        # The SQLSTATE is shared with any cancel request: only a query that ran its time.
        return (
            getattr(exc, "sqlstate", None) == _QUERY_CANCELED
            and query is not None
            and query.ran_for(self.chunk_timeout_s)
        )

    def _error_text(self, exc: BaseException) -> str:
        if isinstance(exc, pg_arrow.AdbcError):
            return pg_arrow.error_message(exc)
        return str(exc)

    @staticmethod
    def _transient_error(error: BaseException) -> bool:
        """A lost or refused connection, a server shutting down, starting up or crashed, a
        terminated backend, no free connection slot: retry. Not: what the query did, an
        authentication or permission failure, a missing database."""
        return driver_error_is_transient(error)


def _first_row(table: pa.Table) -> tuple[Any, ...]:
    """The first row of a one-row result, by position (names may repeat)."""
    return tuple(column[0].as_py() for column in table.columns)


def _key_of(
    schema: TableSchema, key_columns: tuple[str, ...], rows: pa.Table, what: str
) -> Key | None:
    """The key in the (last) row of a query selecting the key columns; None for none."""
    arrow = schema.arrow_schema()
    typed = _to_schema(schema.table, rows, pa.schema([arrow.field(k) for k in key_columns]))
    key = pg_arrow.last_row_key(typed, key_columns)
    return None if key is None else checked_key(schema.table, key, what)


def _to_schema(table_id: TableId, rows: pa.Table, arrow: pa.Schema) -> pa.Table:
    """``rows`` as the dialect's Arrow types; the snapshot fails (TableError) on a value
    Python has no type for, as the log decoder's loaders would."""
    try:
        return pg_arrow.to_schema(rows, arrow)
    except pg_arrow.Unrepresentable as exc:
        raise TableError(
            f"table {table_id} holds a value snapshotter cannot represent ({exc}): timestamps "
            "and dates of 'infinity' or outside the years 1-9999, and the time 24:00:00, have "
            "no Python value; leave such rows out of the snapshot with a filter "
            '("additional-conditions"), or change them'
        ) from None

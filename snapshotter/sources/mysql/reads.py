"""The MySQL / MariaDB chunk connection's reads: the maximum key, a chunk, a chunk's bound,
their plans (``EXPLAIN``), and a whole table for ``verify``, through
``sql_reads.GuardedReads``.

One connection, with mysqlclient (C) when it is installed, else pymysql (``my_client``),
each query run in its own ``START TRANSACTION READ ONLY`` (a filter, SQL from the signal
table, cannot write), with the session in UTC so TIMESTAMP values come back as the binlog
has them.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

import pymysql
import sqlalchemy as sa

from snapshotter.core.keys import Key
from snapshotter.sources.base import ChunkRows, ChunkSpec, TableError, TableSchema
from snapshotter.sources.mysql import client as my_client
from snapshotter.sources.mysql import types as my_types
from snapshotter.sources.mysql.chunk_sql import MyChunkQueries, key_params, select_all, timed_select
from snapshotter.sources.mysql.tables import ColumnType
from snapshotter.sources.query_guard import CANCEL_TIMEOUT_S, GuardedQuery
from snapshotter.sources.sql_common import (
    CHUNK_QUERY,
    checked_key,
    chunk_shape,
    columns_converter,
    count_params,
    last_key,
    rows_to_arrow,
)
from snapshotter.sources.sql_reads import GuardedReads, Statement, WatchedSession

# Errors that mean the connection, not the query, failed, or the server is going away or
# full: worth a retry. CR_CONNECTION_ERROR, CR_CONN_HOST_ERROR, CR_SERVER_GONE_ERROR,
# CR_SERVER_LOST, CR_SERVER_LOST_EXTENDED; ER_CON_COUNT_ERROR, ER_SERVER_SHUTDOWN, MariaDB's
# ER_CONNECTION_KILLED, MySQL's ER_CLIENT_INTERACTION_TIMEOUT. Not retried: access denied
# (1045), an unknown database (1049), anything the query did.
_CONNECTION_ERRORS = frozenset({2002, 2003, 2006, 2013, 2055, 1040, 1053, 1927, 4031})
# Session variables that change the values a chunk reads (TIMESTAMP's zone, the strings'
# character set) or how key values are compared: a filter can change them only through a
# stored function it calls, and a filtered read checks them before its rows are used.
_OUTPUT_VARIABLES = (
    "time_zone",
    "character_set_results",
    "character_set_client",
    "character_set_connection",
    "collation_connection",
)
_VARIABLES_QUERY = "SELECT " + ", ".join(f"@@session.{v}" for v in _OUTPUT_VARIABLES)
# A statement that ran past its limit: MariaDB's max_statement_time (ER_STATEMENT_TIMEOUT),
# MySQL's MAX_EXECUTION_TIME (ER_QUERY_TIMEOUT).
_TIMEOUT_ERRORS = frozenset({1969, 3024})
# What the chunk connection's client library raises (either library's errors).
_CLIENT_ERRORS = my_client.all_errors()

Rows = list[tuple[Any, ...]]


class MySqlReads(GuardedReads[Any, Rows]):
    """The reads part of :class:`snapshotter.sources.mysql.dialect.MySqlDialect`: its
    chunk connection's queries and the hooks of the read lifecycle. The connection is
    mysqlclient's or pymysql's (``my_client``), hence ``Any``."""

    url: sa.URL  # the source (``mysql+pymysql``)
    client: str  # the chunk connection's client library (``my_client``)
    _driver_errors = _CLIENT_ERRORS
    _watched_session = WatchedSession(
        "variable",
        _OUTPUT_VARIABLES,
        "Send execute-snapshot again with a filter that calls no function changing it",
    )

    def _statement_dialect(self) -> sa.Dialect:
        return self.engine.dialect

    # --- what the catalog says (``tables``) -----------------------------------------------

    @abstractmethod
    def column_types(self, schema: TableSchema) -> dict[str, ColumnType]:
        """Each column's catalog type."""

    @abstractmethod
    def key_bindings(
        self, schema: TableSchema, key_columns: Sequence[str]
    ) -> tuple[my_types.KeyBinding, ...]:
        """How bounds on each key column are compared."""

    @abstractmethod
    def connect_args(self) -> dict[str, Any]:
        """pymysql.connect() arguments for the source."""

    # --- the queries ----------------------------------------------------------------------

    def max_key(
        self, schema: TableSchema, key_columns: Sequence[str], condition: str | None
    ) -> Key | None:
        keys = tuple(key_columns)
        sql = self._statements.get(
            ("max", schema, keys, condition),
            lambda: self._queries(schema, keys).max_key(condition),
        )
        rows = self._read(schema.table, "max-key query", lambda _: (sql, {}), condition is not None)
        if not rows:
            return None
        (key,) = self._model_rows(schema, keys, rows, keys)
        return checked_key(schema.table, key, "maximum key")

    def read_chunk(self, spec: ChunkSpec) -> ChunkRows:
        statement = self._statement(spec, False)
        rows = self._read(spec.table, CHUNK_QUERY, lambda _: statement, spec.filtered)
        schema = spec.schema
        rows = self._model_rows(schema, schema.column_names, rows, spec.key_columns)
        last = last_key(schema, spec.key_columns, rows)
        if last is not None:
            last = checked_key(spec.table, last, "last key of a chunk")
        return ChunkRows(rows_to_arrow(schema, rows), last, None)

    def chunk_bound(self, spec: ChunkSpec) -> Key | None:
        statement = self._statement(spec, True)
        found = self._read(spec.table, "chunk bound query", lambda _: statement, spec.filtered)
        if not found:
            return None
        keys = spec.key_columns
        (key,) = self._model_rows(spec.schema, keys, found, keys)
        return checked_key(spec.table, key, "chunk bound")

    def explain_chunk(self, spec: ChunkSpec) -> str:
        """``EXPLAIN`` of the chunk SELECT ``read_chunk`` would run (``plan_text``: ``type``
        must be ``range`` for a key range, not ``index`` or ``ALL``)."""
        return self._explain(spec, False)

    def explain_bound(self, spec: ChunkSpec) -> str:
        """``EXPLAIN`` of ``chunk_bound``'s query (``plan_text``: ``type`` must be
        ``range`` on the key's index)."""
        return self._explain(spec, True)

    def _model_rows(
        self,
        schema: TableSchema,
        columns: Sequence[str],
        rows: list[tuple[Any, ...]],
        key_columns: Sequence[str],
    ) -> list[tuple[Any, ...]]:
        """Fetched rows (of ``columns``) with what pymysql returns as text for a zero date
        made what the binlog has (``my_types.zero_dates_to_none``); a TableError for a
        zero date in a key column."""
        types = self.column_types(schema)
        named = [(c, types[c].data_type) for c in columns]
        try:
            return my_types.zero_dates_to_none(named, rows, key_columns)
        except my_types.KeyTypeError as exc:
            raise TableError(f"table {schema.table}: {exc}") from None

    def _statement(self, spec: ChunkSpec, bound: bool) -> tuple[str, dict[str, Any]]:
        """The chunk SELECT (or, ``bound``, the chunk bound query) of ``spec`` and its
        parameters."""
        bindings = self.key_bindings(spec.schema, spec.key_columns)
        sql = self._statements.get(
            chunk_shape(spec, bound),
            lambda: self._queries(spec.schema, spec.key_columns, bindings).of(spec, bound),
        )
        try:
            params = key_params(bindings, spec.after, spec.upto)
        except my_types.KeyTypeError as exc:
            raise TableError(f"table {spec.table}: {exc}") from None
        return sql, {**params, **count_params(spec, bound)}

    def _explain(self, spec: ChunkSpec, bound: bool) -> str:
        sql, params = self._statement(spec, bound)
        with self._conn_lock:
            conn = self._connection()
            with my_client.dict_cursor(conn) as cur:
                cur.execute("EXPLAIN " + sql, params)
                return plan_text(cur.fetchall())

    def _queries(
        self,
        schema: TableSchema,
        key_columns: Sequence[str],
        bindings: Sequence[my_types.KeyBinding] = (),
    ) -> MyChunkQueries:
        enums = frozenset(i for i, b in enumerate(bindings) if b.members is not None)
        return MyChunkQueries(schema, key_columns, self._float_columns(schema), enums)

    def _float_columns(self, schema: TableSchema) -> frozenset[str]:
        types = self.column_types(schema)
        return frozenset(n for n, t in types.items() if my_types.selects_as_double(t.data_type))

    def row_converter(
        self, schema: TableSchema
    ) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
        """JSON columns (MySQL's JSON type) are buffered as text and carried as RawJson,
        as the binlog decoder makes of them; nothing else needs converting."""
        return columns_converter(
            {
                name: conv
                for name, t in self.column_types(schema).items()
                if (conv := my_types.chunk_converter(t.data_type)) is not None
            }
        )

    def scan(self, schema: TableSchema) -> Iterator[dict[str, Any]]:
        """Every row of the table in the value model, read as chunks are (for ``verify``),
        in one READ ONLY transaction, streamed."""
        sql = str(
            select_all(schema, self._float_columns(schema)).compile(dialect=self.engine.dialect)
        )
        convert = self.row_converter(schema)
        arrow = schema.arrow_schema()
        # A connection of its own, streaming (SSCursor): the table may be large.
        conn = pymysql.connect(
            **self.connect_args(), autocommit=True, cursorclass=pymysql.cursors.SSCursor
        )
        try:
            with conn.cursor() as cur:
                cur.execute("SET time_zone = '+00:00'")
                cur.execute("START TRANSACTION READ ONLY")
                # With arguments (none), so pymysql turns the compiled %% of a column name
                # holding % back into %; without, the query would name a column "50%%".
                cur.execute(sql, ())
                while batch := cur.fetchmany(5000):
                    fixed = self._model_rows(schema, schema.column_names, list(batch), ())
                    table = rows_to_arrow(schema, fixed, arrow)
                    for row in table.to_pylist():
                        yield row if convert is None else convert(row)
                cur.execute("COMMIT")
        finally:
            conn.close()

    def _kill_query(self, thread_id: int) -> None:
        """``KILL QUERY`` the chunk connection's statement, from a connection of its own."""
        conn = pymysql.connect(**self.connect_args(), connect_timeout=int(CANCEL_TIMEOUT_S))
        try:
            with conn.cursor() as cur:
                cur.execute(f"KILL QUERY {int(thread_id)}")
        finally:
            conn.close()

    # --- the hooks of the read lifecycle (sql_reads) ---------------------------------------

    def _open_connection(self) -> tuple[Any, tuple[Any, ...] | None]:
        conn = my_client.connect(self.client, self.url)
        _set_session(conn)
        return conn, _session_variables(conn)

    @staticmethod
    def _is_usable(conn: Any) -> bool:
        return my_client.is_open(conn)

    @staticmethod
    def _close_connection(conn: Any) -> None:
        my_client.close_quietly(conn)

    def _canceller(self, conn: Any) -> Callable[[], None]:
        return partial(self._kill_query, conn.thread_id())

    @contextmanager
    def _read_transaction(self, conn: Any) -> Iterator[None]:
        with conn.cursor() as cur:
            cur.execute("START TRANSACTION READ ONLY")
            try:
                yield
            finally:
                if my_client.is_open(conn):
                    cur.execute("COMMIT")

    def _fetch(self, conn: Any, statement: Statement) -> Rows:
        sql, params = statement
        timed = timed_select(sql, self.chunk_timeout_s, _is_mariadb(conn))
        with conn.cursor() as cur:
            cur.execute(timed, params)
            return list(cur.fetchall())

    def _session_values(self, conn: Any) -> tuple[Any, ...] | None:
        return _session_variables(conn)

    def _reset_session(self, conn: Any) -> bool:
        """COM_RESET_CONNECTION (session and user variables, GET_LOCK locks, temporary
        tables), then the session's own settings; a reset that leaves the session unlike a
        new one (a server that resets the character set to its own default) is refused."""
        return _renewed_session(conn, self.url) == self._clean_session

    def _server_timed_out(self, exc: BaseException, query: GuardedQuery | None) -> bool:
        return my_client.error_code(exc) in _TIMEOUT_ERRORS

    def _error_text(self, exc: BaseException) -> str:
        detail = exc.args[1] if len(exc.args) > 1 else str(exc)
        return f"({my_client.error_code(exc)}) {detail}"

    @staticmethod
    def _transient_error(error: BaseException) -> bool:
        """A lost or refused connection, a server shutting down or out of connections, a
        killed connection: retry. Not: what the query did, access denied, a missing
        database."""
        if my_client.closed_error(error):
            return True  # pymysql's (0, ''): the connection is closed
        if isinstance(error, _CLIENT_ERRORS):
            return my_client.error_code(error) in _CONNECTION_ERRORS
        return False


def plan_text(rows: Sequence[dict[str, Any]]) -> str:
    """An ``EXPLAIN``'s rows as plan text: one line per plan row, its columns as a JSON
    object (``json.loads`` gives the row back), values the JSON types lack as text."""
    return "\n".join(json.dumps(dict(row), default=str) for row in rows)


def _is_mariadb(conn: Any) -> bool:
    """From the handshake's version ("5.5.5-10.11.6-MariaDB-..."), no query."""
    return "mariadb" in conn.get_server_info().lower()


def _set_session(conn: Any) -> None:
    """The chunk connection's own session settings (after connecting and a reset)."""
    with conn.cursor() as cur:
        # TIMESTAMP values as stored (UTC), as the binlog carries them.
        cur.execute("SET time_zone = '+00:00'")


def _session_variables(conn: Any) -> tuple[Any, ...] | None:
    with conn.cursor() as cur:
        cur.execute(_VARIABLES_QUERY)
        row = cur.fetchone()
    return None if row is None else tuple(row)


def _renewed_session(conn: Any, url: sa.URL) -> tuple[Any, ...] | None:
    """The session as new, keeping the connection (``my_client.reset_session``), with our
    own settings again; its _OUTPUT_VARIABLES now. None (a new connection is needed) if the
    client library cannot reset it."""
    if not my_client.reset_session(conn, url):
        return None
    _set_session(conn)
    return _session_variables(conn)

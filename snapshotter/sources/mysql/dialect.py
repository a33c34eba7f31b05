"""The MySQL / MariaDB dialect: catalog, max-key and chunk queries, watermarks.

Two kinds of connection:

* a SQLAlchemy engine (``mysql+pymysql``) for the catalog and watermark inserts;
* one connection for the max-key and chunk SELECTs, with mysqlclient (C) when it is
  installed, else pymysql (``my_client``), each query run in its own ``START TRANSACTION
  READ ONLY`` (a filter, SQL from the signal table, cannot write), with the session in UTC
  so TIMESTAMP values come back as the binlog has them.

The chunk predicate is the OR-expanded key comparison with a leading bound on the first
key column, ``k1 >= ? AND (k1 > ? OR (k1 = ? AND k2 > ?))``: MariaDB reads a row-value
comparison ``(k1, k2) > (?, ?)`` as a scan of the whole index, MySQL and MariaDB both turn
this form into one index range (``type = range`` in EXPLAIN, tested). Identifiers are quoted
by SQLAlchemy; key values are bound parameters, compared by the database in the column's
own collation, so paging under a case-insensitive or PAD SPACE collation follows the index.

Chunk SELECTs see every transaction binlogged before the open watermark: with
``binlog_order_commits`` (``snapshotter init`` checks it) InnoDB commits in binlog order, so
no visibility bookkeeping is needed (``commits_visible_in_log_order``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import pymysql
import sqlalchemy as sa

from signals.names import TableId
from snapshotter.common.faults import failpoint
from snapshotter.core.keys import Key
from snapshotter.sources.base import (
    ChunkReadError,
    ChunkRows,
    ChunkSpec,
    ColumnInfo,
    Dialect,
    TableError,
    TableSchema,
)
from snapshotter.sources.mysql import client as my_client
from snapshotter.sources.mysql import types as my_types
from snapshotter.sources.mysql.positions import binlog_end, binlog_offset
from snapshotter.sources.query_guard import (
    CANCEL_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
    GuardedQuery,
    Outcome,
    QueryGuard,
    session_changed_error,
)
from snapshotter.sources.relations import mysql_relation_kinds
from snapshotter.sources.sql_common import (
    CHUNK_QUERY,
    ChunkQueries,
    SqlDialect,
    StatementCache,
    checked_key,
    chunk_shape,
    columns_converter,
    count_params,
    last_key,
    rows_to_arrow,
    sa_table,
)

_SYSTEM_SCHEMAS = ("mysql", "information_schema", "performance_schema", "sys")
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


def _transient(error: BaseException) -> bool:
    if isinstance(error, ChunkReadError | ConnectionError):
        return True
    if isinstance(error, sa.exc.DBAPIError) and error.connection_invalidated:
        return True
    if my_client.closed_error(error):
        return True  # pymysql's (0, ''): the connection is closed
    if isinstance(error, _CLIENT_ERRORS):
        return my_client.error_code(error) in _CONNECTION_ERRORS
    return False


@dataclass(frozen=True, slots=True)
class ColumnType:
    """What the catalog says of a column beyond ColumnInfo (used to build converters)."""

    data_type: str  # information_schema DATA_TYPE, lower case: "varchar", "json", ...
    column_type: str  # COLUMN_TYPE: "varchar(20)", "bigint(20) unsigned", "enum('a','b')"


def mysql_url(url: str | sa.URL) -> sa.URL:
    """``mysql://`` / ``mariadb://`` URLs with the pymysql driver snapshotter uses."""
    parsed = sa.make_url(url)
    return parsed.set(drivername="mysql+pymysql")


class MySqlDialect(SqlDialect):
    """:class:`snapshotter.sources.base.Dialect` for MySQL 8 and MariaDB 10.5+."""

    connector = "mysql"
    dollar_quotes = False
    commits_visible_in_log_order = True

    def __init__(
        self,
        url: str | sa.URL,
        signal_table: TableId,
        chunk_timeout_s: float = DEFAULT_TIMEOUT_S,
        client: str | None = None,
    ) -> None:
        self.url = mysql_url(url)
        # The chunk connection's client library (my_client): the fastest installed unless
        # named.
        if client is not None and client not in my_client.available():
            raise ValueError(f"MySQL client library {client!r} is not installed")
        self.client = client or my_client.default()
        self.chunk_timeout_s = chunk_timeout_s
        database = self.url.database
        if not database:
            raise TableError(f"the source URL {self.url!r} names no database")
        self._default_schema = database
        self.signal_table = signal_table.with_default_schema(database)
        self._engine: sa.Engine | None = None
        self._conn: Any = None  # a my_client connection (mysqlclient's or pymysql's)
        self._conn_lock = threading.Lock()  # the chunk connection serves one query at a time
        self._guard = QueryGuard()  # time limit and cancellation of its queries
        self._variables: tuple[Any, ...] | None = None  # its _OUTPUT_VARIABLES when clean
        self._statements = StatementCache(lambda: self.engine.dialect)
        self._types: dict[TableId, dict[str, ColumnType]] = {}

    @property
    def database(self) -> str:
        return self._default_schema

    @database.setter
    def database(self, value: str) -> None:
        self._default_schema = value

    # --- connections ---------------------------------------------------------------------

    @property
    def engine(self) -> sa.Engine:
        if self._engine is None:
            self._engine = sa.create_engine(
                self.url,
                pool_pre_ping=True,
                pool_size=2,
                connect_args={"charset": "utf8mb4"},
            )
        return self._engine

    def connect_args(self) -> dict[str, Any]:
        """pymysql.connect() arguments for this URL (host, port, user, password, ...)."""
        _, kwargs = self.engine.dialect.create_connect_args(self.url)
        kwargs = dict(kwargs)
        kwargs["charset"] = "utf8mb4"
        return kwargs

    def _connection(self) -> Any:
        if self._conn is None or not my_client.is_open(self._conn):
            conn = my_client.connect(self.client, self.url)
            _set_session(conn)
            self._variables = _session_variables(conn)
            self._conn = conn
        return self._conn

    @staticmethod
    def _transient_error(error: BaseException) -> bool:
        """A lost or refused connection, a server shutting down or out of connections, a
        killed connection: retry. Not: what the query did, access denied, a missing
        database."""
        return _transient(error)

    def close(self) -> None:
        self._guard.close()
        # Not forever: a query whose KILL failed may still hold the lock (the reading
        # thread is a daemon; the server ends the query when the connection drops).
        if self._conn_lock.acquire(timeout=CANCEL_TIMEOUT_S):
            try:
                if self._conn is not None:
                    my_client.close_quietly(self._conn)
                    self._conn = None
            finally:
                self._conn_lock.release()
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    # --- catalog -------------------------------------------------------------------------

    def describe(self, table: TableId) -> TableSchema:
        table = table.with_default_schema(self._default_schema)
        with self.engine.connect() as conn:
            kind = conn.execute(
                sa.text(
                    "SELECT TABLE_TYPE FROM information_schema.TABLES "
                    "WHERE TABLE_SCHEMA = :s AND TABLE_NAME = :t"
                ),
                {"s": table.schema, "t": table.table},
            ).scalar()
            if kind is None:
                raise TableError(
                    f"table {table} does not exist (or the user may not see it: it needs "
                    f"SELECT on {table})"
                )
            if kind != "BASE TABLE":
                raise TableError(f"{table} is a {str(kind).lower()}, not a table")
            rows = conn.execute(
                sa.text(
                    "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, "
                    "NUMERIC_PRECISION, NUMERIC_SCALE FROM information_schema.COLUMNS "
                    "WHERE TABLE_SCHEMA = :s AND TABLE_NAME = :t ORDER BY ORDINAL_POSITION"
                ),
                {"s": table.schema, "t": table.table},
            ).all()
            key = conn.execute(
                sa.text(
                    "SELECT COLUMN_NAME FROM information_schema.STATISTICS "
                    "WHERE TABLE_SCHEMA = :s AND TABLE_NAME = :t AND INDEX_NAME = 'PRIMARY' "
                    "ORDER BY SEQ_IN_INDEX"
                ),
                {"s": table.schema, "t": table.table},
            ).scalars()
            primary_key = tuple(str(k) for k in key)
        columns = []
        types = {}
        for name, data_type, column_type, nullable, precision, scale in rows:
            data_type = str(data_type).lower()
            column_type = str(column_type)
            types[str(name)] = ColumnType(data_type, column_type)
            columns.append(
                ColumnInfo(
                    name=str(name),
                    type_name=column_type,
                    type_code=my_types.family_code(data_type),
                    nullable=nullable == "YES",
                    arrow_type=my_types.arrow_type(
                        data_type,
                        column_type,
                        None if precision is None else int(precision),
                        None if scale is None else int(scale),
                    ),
                )
            )
        self._types[table] = types
        return TableSchema(table, tuple(columns), primary_key)

    def catalog_types(self, table: TableId) -> dict[str, str]:
        """Each column's DATA_TYPE (``uuid``, ``inet6``, ``binary``, ...), for the binlog
        decoder, which cannot tell MariaDB's UUID and INET types from BINARY(n) alone."""
        schema = self.describe(table)
        return {name: t.data_type for name, t in self.column_types(schema).items()}

    def column_types(self, schema: TableSchema) -> dict[str, ColumnType]:
        types = self._types.get(schema.table)
        if types is None or set(types) != set(schema.column_names):
            self.describe(schema.table)
            types = self._types[schema.table]
        return types

    def key_bindings(
        self, schema: TableSchema, key_columns: Sequence[str]
    ) -> tuple[my_types.KeyBinding, ...]:
        """How bounds on each key column are compared (``my_types.key_binding``); a
        TableError for a column that cannot be paged in the index's order."""
        types = self.column_types(schema)
        try:
            return tuple(
                my_types.key_binding(k, types[k].data_type, types[k].column_type)
                for k in key_columns
            )
        except my_types.KeyTypeError as exc:
            raise TableError(f"table {schema.table}: {exc}") from None

    def snapshot_key(self, schema: TableSchema, surrogate_key: str | None) -> tuple[str, ...]:
        key = self._snapshot_key(schema, surrogate_key)
        self.key_bindings(schema, key)  # refuse a key that cannot be paged, now
        return key

    def _snapshot_key(self, schema: TableSchema, surrogate_key: str | None) -> tuple[str, ...]:
        if surrogate_key is None:
            if not schema.primary_key:
                raise TableError(
                    f"table {schema.table} has no primary key: name a NOT NULL column with a "
                    'unique index to page by, with "surrogate-key" in the execute-snapshot '
                    "signal (or --surrogate-key COL on the CLI)"
                )
            return schema.primary_key
        if surrogate_key not in schema.column_names:
            raise TableError(f"surrogate key {surrogate_key!r} is not a column of {schema.table}")
        if schema.column(surrogate_key).nullable:
            raise TableError(
                f"surrogate key {surrogate_key!r} of {schema.table} may be NULL; a paging key "
                "must be NOT NULL"
            )
        with self.engine.connect() as conn:
            unique = conn.execute(
                sa.text(
                    "SELECT INDEX_NAME FROM information_schema.STATISTICS "
                    "WHERE TABLE_SCHEMA = :s AND TABLE_NAME = :t AND NON_UNIQUE = 0 "
                    "GROUP BY INDEX_NAME HAVING COUNT(*) = 1 AND MAX(COLUMN_NAME) = :c"
                ),
                {"s": schema.table.schema, "t": schema.table.table, "c": surrogate_key},
            ).first()
        if unique is None:
            raise TableError(
                f"surrogate key {surrogate_key!r} of {schema.table} has no unique index of its "
                "own; a paging key must be unique"
            )
        return (surrogate_key,)

    def list_tables(self) -> list[TableId]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES "
                    "WHERE TABLE_TYPE = 'BASE TABLE' AND TABLE_SCHEMA NOT IN :system "
                    "ORDER BY TABLE_SCHEMA, TABLE_NAME"
                ).bindparams(sa.bindparam("system", expanding=True)),
                {"system": list(_SYSTEM_SCHEMAS)},
            ).all()
        return [TableId(str(s), str(t)) for s, t in rows]

    def relation_kinds(self, tables: Sequence[TableId]) -> Mapping[TableId, str]:
        with self.engine.connect() as conn:
            return mysql_relation_kinds(conn, tables, _SYSTEM_SCHEMAS)

    # --- reads ---------------------------------------------------------------------------

    def max_key(
        self, schema: TableSchema, key_columns: Sequence[str], condition: str | None
    ) -> Key | None:
        keys = tuple(key_columns)
        sql = self._statements.get(
            ("max", schema, keys, condition),
            lambda: self._queries(schema, keys).max_key(condition),
        )
        rows = self._read(schema.table, "max-key query", sql, {}, condition is not None)
        if not rows:
            return None
        (key,) = self._model_rows(schema, keys, rows, keys)
        return checked_key(schema.table, key, "maximum key")

    def estimated_rows(self, schema: TableSchema) -> int | None:
        """``information_schema.TABLES.TABLE_ROWS``: InnoDB's estimate from sampled pages
        (often tens of percent off); None when the server has none."""
        table = schema.table.with_default_schema(self._default_schema)
        with self.engine.connect() as conn:
            if not conn.dialect.is_mariadb:  # type: ignore[attr-defined]
                # MySQL 8 serves cached statistics up to a day old unless told otherwise
                # (this session only; put back before the connection returns to the pool).
                conn.execute(sa.text("SET SESSION information_schema_stats_expiry = 0"))
            try:
                value = conn.execute(
                    sa.text(
                        "SELECT TABLE_ROWS FROM information_schema.TABLES "
                        "WHERE TABLE_SCHEMA = :s AND TABLE_NAME = :t"
                    ),
                    {"s": table.schema, "t": table.table},
                ).scalar()
            finally:
                if not conn.dialect.is_mariadb:  # type: ignore[attr-defined]
                    conn.execute(sa.text("SET SESSION information_schema_stats_expiry = DEFAULT"))
        return None if value is None else max(0, int(value))

    def read_chunk(self, spec: ChunkSpec) -> ChunkRows:
        sql, params = self._statement(spec, False)
        rows = self._read(spec.table, CHUNK_QUERY, sql, params, spec.filtered)
        schema = spec.schema
        rows = self._model_rows(schema, schema.column_names, rows, spec.key_columns)
        last = last_key(schema, spec.key_columns, rows)
        if last is not None:
            last = checked_key(spec.table, last, "last key of a chunk")
        return ChunkRows(rows_to_arrow(schema, rows), last, None)

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

    def explain_chunk(self, spec: ChunkSpec) -> list[dict[str, Any]]:
        """``EXPLAIN`` of the chunk SELECT ``read_chunk`` would run, one dict per plan row
        (``type`` must be ``range`` for a key range, not ``index`` or ``ALL``)."""
        return self._explain(spec, False)

    def _statement(self, spec: ChunkSpec, bound: bool) -> tuple[str, dict[str, Any]]:
        """The chunk SELECT (or, ``bound``, the chunk bound query) of ``spec`` and its
        parameters."""
        bindings = self.key_bindings(spec.schema, spec.key_columns)
        sql = self._statements.get(
            chunk_shape(spec, bound),
            lambda: self._queries(spec.schema, spec.key_columns, bindings).of(spec, bound),
        )
        try:
            params = _key_params(bindings, spec.after, spec.upto)
        except my_types.KeyTypeError as exc:
            raise TableError(f"table {spec.table}: {exc}") from None
        return sql, {**params, **count_params(spec, bound)}

    def _explain(self, spec: ChunkSpec, bound: bool) -> list[dict[str, Any]]:
        sql, params = self._statement(spec, bound)
        with self._conn_lock:
            conn = self._connection()
            with my_client.dict_cursor(conn) as cur:
                cur.execute("EXPLAIN " + sql, params)
                return list(cur.fetchall())

    def _queries(
        self,
        schema: TableSchema,
        key_columns: Sequence[str],
        bindings: Sequence[my_types.KeyBinding] = (),
    ) -> _MyChunkQueries:
        enums = frozenset(i for i, b in enumerate(bindings) if b.members is not None)
        return _MyChunkQueries(schema, key_columns, self._float_columns(schema), enums)

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
            _select_all(schema, self._float_columns(schema)).compile(dialect=self.engine.dialect)
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

    def _read(
        self, table: TableId, what: str, sql: str, params: dict[str, Any], filtered: bool
    ) -> list[tuple[Any, ...]]:
        """Run ``sql`` in one ``START TRANSACTION READ ONLY`` under the time limit; its rows.
        ``filtered``: ``sql`` holds a signal's filter, so the session is reset after it
        (whatever the filter did to it stays out of later reads)."""
        with self._conn_lock:
            query: GuardedQuery | None = None
            try:
                conn = self._connection()
                statement = timed_select(sql, self.chunk_timeout_s, _is_mariadb(conn))
                kill = partial(self._kill_query, conn.thread_id())
                with self._guard.running(self.chunk_timeout_s, kill) as query, conn.cursor() as cur:
                    cur.execute("START TRANSACTION READ ONLY")
                    try:
                        cur.execute(statement, params)
                        rows = list(cur.fetchall())
                        if filtered:
                            self._check_variables(cur, table)
                        if what == CHUNK_QUERY:
                            failpoint("chunk.select")
                    finally:
                        if my_client.is_open(conn):
                            cur.execute("COMMIT")
            except _CLIENT_ERRORS as exc:
                raise self._failure(table, what, exc, query, filtered) from exc
            finally:
                self._after_read(query, filtered)
            assert query is not None
            if query.outcome is not None:  # killed, though the query got to its end
                raise self._outcome_error(query.outcome, table, what, filtered)
        return rows

    def _check_variables(self, cur: Any, table: TableId) -> None:
        cur.execute(_VARIABLES_QUERY)
        now = cur.fetchone()
        if self._variables is None or now is None:
            return
        error = session_changed_error(
            table,
            "variable",
            _OUTPUT_VARIABLES,
            self._variables,
            now,
            "Send execute-snapshot again with a filter that calls no function changing it",
        )
        if error is not None:
            raise error

    def _kill_query(self, thread_id: int) -> None:
        """``KILL QUERY`` the chunk connection's statement, from a connection of its own."""
        conn = pymysql.connect(**self.connect_args(), connect_timeout=int(CANCEL_TIMEOUT_S))
        try:
            with conn.cursor() as cur:
                cur.execute(f"KILL QUERY {int(thread_id)}")
        finally:
            conn.close()

    def _after_read(self, query: GuardedQuery | None, filtered: bool) -> None:
        """After a killed query, a new connection (a late KILL must not hit a later query);
        after a filtered one, a clean session: COM_RESET_CONNECTION (session and user
        variables, GET_LOCK locks, temporary tables), then the session's own settings."""
        conn = self._conn
        if conn is None or not my_client.is_open(conn):
            return
        try:
            if query is not None and query.outcome is not None:
                conn.close()
            elif filtered and _reset_session(conn, self.url) != self._variables:
                # The reset left the session unlike a new one (a server that resets the
                # character set to its own default): start a new one instead.
                conn.close()
        except _CLIENT_ERRORS:
            my_client.close_quietly(conn)  # whatever the filter left is gone with the session
        if not my_client.is_open(conn):
            self._conn = None  # reconnect on the next read

    def _failure(
        self,
        table: TableId,
        what: str,
        exc: BaseException,
        query: GuardedQuery | None,
        filtered: bool,
    ) -> Exception:
        code = my_client.error_code(exc)
        if query is not None and query.outcome is not None:
            return self._outcome_error(query.outcome, table, what, filtered)
        if code in _TIMEOUT_ERRORS:
            return self._outcome_error(Outcome.TIMED_OUT, table, what, filtered)
        detail = exc.args[1] if len(exc.args) > 1 else str(exc)
        message = f"{what} on table {table} failed: ({code}) {detail}"
        if _transient(exc):
            if self._conn is not None:
                my_client.close_quietly(self._conn)
            self._conn = None  # reconnect on the next read
            return ChunkReadError(message)
        return TableError(message)

    # --- chunk bounds (parallel reads, core.spans) -----------------------------------------

    def chunk_bound(self, spec: ChunkSpec) -> Key | None:
        sql, params = self._statement(spec, True)
        found = self._read(spec.table, "chunk bound query", sql, params, spec.filtered)
        if not found:
            return None
        keys = spec.key_columns
        (key,) = self._model_rows(spec.schema, keys, found, keys)
        return checked_key(spec.table, key, "chunk bound")

    def explain_bound(self, spec: ChunkSpec) -> list[dict[str, Any]]:
        """``EXPLAIN`` of ``chunk_bound``'s query, one dict per plan row (``type`` must be
        ``range`` on the key's index)."""
        return self._explain(spec, True)

    # --- writes and the log ----------------------------------------------------------------

    def ensure_captured(self, tables: Sequence[TableId]) -> list[TableId]:
        """The binlog carries every table: nothing to add (the log reader decodes the tables
        ``source.tables`` selects, new ones included)."""
        return []

    def binlog_start(self) -> dict[str, Any]:
        """Where a reader that starts now begins: the binlog's current end."""
        return binlog_end(self.engine)

    def log_end(self) -> int:
        start = self.binlog_start()
        return binlog_offset(start["file"], start["pos"])

    def lag_bytes(self, resume: Mapping[str, Any]) -> int | None:
        """Binlog bytes after the restart point; None when it is in another file (file
        sizes in between are not known) or there is none."""
        if not resume.get("file"):
            return None
        start = binlog_offset(str(resume["file"]), int(resume.get("pos", 0)))
        end = self.log_end()
        return end - start if end >> 32 == start >> 32 else None


# --- SQL -----------------------------------------------------------------------------------


def timed_select(sql: str, timeout_s: float, mariadb: bool) -> str:
    """The SELECT ``sql`` with the server's time limit for that one statement: MariaDB's
    ``SET STATEMENT max_statement_time = <s> FOR``, MySQL's ``MAX_EXECUTION_TIME(<ms>)``
    hint (the statement's own: a filter cannot change it)."""
    if mariadb:
        return f"SET STATEMENT max_statement_time = {timeout_s:.3f} FOR {sql}"
    head, sep, rest = sql.partition(" ")
    if head.upper() != "SELECT" or not sep:
        raise ValueError(f"not a SELECT: {sql[:40]!r}")
    milliseconds = max(1, round(timeout_s * 1000))
    return f"SELECT /*+ MAX_EXECUTION_TIME({milliseconds}) */ {rest}"


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


def _reset_session(conn: Any, url: sa.URL) -> tuple[Any, ...] | None:
    """The session as new, keeping the connection (``my_client.reset_session``), with our
    own settings again; its _OUTPUT_VARIABLES now. None (a new connection is needed) if the
    client library cannot reset it."""
    if not my_client.reset_session(conn, url):
        return None
    _set_session(conn)
    return _session_variables(conn)


class _MyChunkQueries(ChunkQueries):
    """The chunk SQL (``sql_common.ChunkQueries``) as MySQL and MariaDB range-scan it."""

    def __init__(
        self,
        schema: TableSchema,
        key_columns: Sequence[str],
        floats: frozenset[str],
        enums: frozenset[int] = frozenset(),
    ) -> None:
        super().__init__(schema, key_columns)
        self.floats = floats  # FLOAT columns (``my_types.selects_as_double``)
        self.enums = enums  # the positions of ENUM key columns (``key_bound``)

    def output(self, column: ColumnInfo) -> sa.ColumnElement[Any]:
        return _output(self.table, column, self.floats)

    def key_range(self, prefix: str, lower: bool) -> sa.ColumnElement[bool]:
        bound: sa.ColumnElement[bool] = key_bound(self.keys, prefix, lower, self.enums)
        return bound

    def count(self, name: str) -> sa.BindParameter[Any]:
        return sa.bindparam(name)


def _output(
    table: sa.TableClause, column: ColumnInfo, floats: frozenset[str]
) -> sa.ColumnElement[Any]:
    """FLOAT as DOUBLE (exact, as the binlog has it); every other column as is."""
    raw = table.c[column.name]
    if column.name in floats:
        return sa.cast(raw, sa.Double()).label(column.name)
    return raw


def _select_all(schema: TableSchema, floats: frozenset[str]) -> sa.Select[Any]:
    """Every row, every column as the chunk query selects it (``scan``)."""
    table = sa_table(schema)
    return sa.select(*(_output(table, c, floats) for c in schema.columns)).select_from(table)


def key_bound(
    columns: Sequence[sa.ColumnClause[Any]],
    prefix: str,
    lower: bool,
    enums: frozenset[int] = frozenset(),
) -> Any:
    """``(k1, .., kn) > (:a0, ..)`` (lower) or ``<= (:u0, ..)`` (upper), written so MySQL and
    MariaDB range-scan the key's index: a plain bound on the first column, AND the
    lexicographic comparison expanded into ORs.

    The key columns at positions ``enums`` are ENUMs: their index orders by member index,
    which neither a text nor a number comparison range-scans, so ``e > :a0`` is written
    ``e IN :a0_gt``, the members above the bound (``my_types.KeyBinding.enum_params``)."""
    strict, last = (">", ">") if lower else ("<", "<=")

    def compare(i: int, op: str) -> Any:
        if i in enums:
            return columns[i].op("IN")(sa.bindparam(f"{prefix}{i}{my_types.ENUM_LISTS[op]}"))
        return columns[i].op(op)(sa.bindparam(f"{prefix}{i}"))

    if len(columns) == 1:
        return compare(0, last)
    alternatives = []
    for i in range(len(columns)):
        equal = [columns[j] == sa.bindparam(f"{prefix}{j}") for j in range(i)]
        op = last if i == len(columns) - 1 else strict
        alternatives.append(sa.and_(*equal, compare(i, op)))
    leading = compare(0, ">=" if lower else "<=")
    return sa.and_(leading, sa.or_(*alternatives))


def _key_params(
    bindings: Sequence[my_types.KeyBinding], after: Key | None, upto: Key
) -> dict[str, Any]:
    """The key range's parameters: ``u<i>`` the upper key, ``a<i>`` the lower one, each
    value as its column compares in the index's order (``my_types.KeyBinding``)."""
    params: dict[str, Any] = {}
    for prefix, key in (("u", upto), ("a", after)):
        for i, (binding, value) in enumerate(zip(bindings, key or (), strict=False)):
            name = f"{prefix}{i}"
            if binding.members is not None:
                params.update(binding.enum_params(name, value))
            else:
                params[name] = value if binding.to_param is None else binding.to_param(value)
    return params


def _is_a_dialect(dialect: MySqlDialect) -> Dialect:
    """Never called: makes mypy check that MySqlDialect implements the protocol."""
    return dialect

"""The PostgreSQL dialect: catalog, max-key and chunk queries, watermarks, capture setup.

Two kinds of connection:

* a SQLAlchemy engine for the catalog, watermark inserts and publication changes;
* one ADBC connection (``pg_arrow``) for the max-key and chunk SELECTs, which reads rows
  straight into Arrow: the types whose binary value equals what the pgoutput decoder's
  loaders make of the output text are read by type, every other type as its output text,
  so a READ row and a log row of the same table are identical.

SQL is built with SQLAlchemy Core (every identifier quoted by the library) and compiled with
``$n`` parameters; key values are bound parameters, each cast to its column's type so the
planner compares in that type and range-scans the key's index.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import adbc_driver_manager
import psycopg
import pyarrow as pa
import sqlalchemy as sa
from psycopg.conninfo import make_conninfo
from sqlalchemy.dialects.postgresql import psycopg as sa_psycopg
from sqlalchemy.types import UserDefinedType

from signals.names import TableId
from snapshotter.common.faults import failpoint
from snapshotter.core.keys import Key
from snapshotter.core.visibility import OpenAtStart, PgSnapshot
from snapshotter.sources.base import (
    ChunkReadError,
    ChunkRows,
    ChunkSpec,
    ColumnInfo,
    Dialect,
    TableError,
    TableSchema,
)
from snapshotter.sources.postgres import arrow as pg_arrow
from snapshotter.sources.postgres import catalog as pg_catalog
from snapshotter.sources.postgres import commits as pg_commits
from snapshotter.sources.postgres import open_xacts as pg_open_xacts
from snapshotter.sources.postgres import publications as pg_publications
from snapshotter.sources.postgres import setup as pg_setup
from snapshotter.sources.postgres import types as pg_types
from snapshotter.sources.query_guard import (
    CANCEL_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
    GuardedQuery,
    Outcome,
    QueryGuard,
    session_changed_error,
)
from snapshotter.sources.relations import pg_relation_kinds
from snapshotter.sources.sql_common import (
    CHUNK_QUERY,
    ChunkQueries,
    SqlDialect,
    StatementCache,
    checked_key,
    chunk_shape,
    columns_converter,
    count_params,
)

DEFAULT_SCHEMA = pg_catalog.DEFAULT_SCHEMA

# Chunk statements are compiled with positional parameters ($1, $2, ...), as the ADBC
# driver binds them.
_DOLLAR_PARAMS = sa_psycopg.dialect(paramstyle="numeric_dollar")  # type: ignore[no-untyped-call]

_RELKIND_NAMES = {
    "v": "a view",
    "m": "a materialized view",
    "f": "a foreign table",
    "i": "an index",
    "I": "a partitioned index",
    "S": "a sequence",
    "c": "a composite type",
    "t": "a TOAST table",
}

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
# The row estimate of a table (or of a partitioned table's leaves), for progress only:
# reltuples per page of the last ANALYZE or VACUUM times the pages there are now, as the
# planner estimates; a part never analyzed (-1) counts 0, and if none was, unknown (NULL).
_ESTIMATE_LIMITS = ("SET LOCAL lock_timeout = '1s'", "SET LOCAL statement_timeout = '5s'")
_ESTIMATE_QUERY = (
    "SELECT CASE WHEN bool_and(c.reltuples < 0) THEN NULL ELSE sum("
    "  CASE WHEN c.reltuples < 0 THEN 0"
    "    WHEN c.relpages > 0 THEN CAST(c.reltuples AS float8) / c.relpages"
    "      * (pg_catalog.pg_relation_size(c.oid)"
    "         / CAST(pg_catalog.current_setting('block_size') AS int))"
    "    ELSE c.reltuples END) END "
    "FROM pg_catalog.pg_class t "
    "JOIN pg_catalog.pg_namespace n ON n.oid = t.relnamespace "
    "CROSS JOIN LATERAL ("
    "  SELECT t.oid AS oid WHERE t.relkind <> 'p' "
    "  UNION ALL SELECT p.relid FROM pg_catalog.pg_partition_tree(CAST(t.oid AS regclass)) p "
    "  WHERE t.relkind = 'p' AND p.isleaf"
    ") leaf "
    "JOIN pg_catalog.pg_class c ON c.oid = leaf.oid "
    "WHERE n.nspname = :schema AND t.relname = :table"
)
# statement_timeout's SQLSTATE (query_canceled, shared with any cancel request).
_QUERY_CANCELED = "57014"


# Server errors that mean the server is going away, coming back or out of connection slots
# (a restart, a terminated backend, a crash of another backend): worth retrying. Class 08 is
# a lost or refused connection.
_TRANSIENT_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "53300"})
# libpq reports a failed connection attempt without a SQLSTATE: these words in its message
# mean the server answered and refused us, which no retry fixes.
_REFUSED = (
    "authentication failed",
    "pg_hba.conf",
    "does not exist",
    "permission denied",
    "must be superuser",
    "replication role",
    "no password supplied",
)


def pg_error_is_transient(sqlstate: str | None, message: str) -> bool:
    """Whether a PostgreSQL error (its SQLSTATE, None for what libpq reports itself, such as
    a refused or dropped connection) means the connection was lost or the server is
    restarting or unavailable, rather than a problem a retry cannot fix."""
    if sqlstate is None:
        lowered = message.lower()
        return not any(word in lowered for word in _REFUSED)
    return sqlstate.startswith("08") or sqlstate in _TRANSIENT_SQLSTATES


def _transient(error: BaseException) -> bool:
    if isinstance(error, ChunkReadError | ConnectionError):
        return True
    if isinstance(error, sa.exc.DBAPIError) and error.connection_invalidated:
        return True
    if isinstance(error, psycopg.Error):
        if error.sqlstate is None and not isinstance(error, psycopg.OperationalError):
            return False  # a client-side error of ours (a closed cursor, a bad parameter)
        return pg_error_is_transient(error.sqlstate, str(error))
    if isinstance(error, pg_arrow.AdbcError):
        sqlstate = getattr(error, "sqlstate", None)
        if sqlstate is None and not isinstance(error, adbc_driver_manager.OperationalError):
            return False  # a client-side error of ours (a parameter it cannot bind)
        return pg_error_is_transient(sqlstate, str(error))
    return False


class _SqlType(UserDefinedType[Any]):
    """A column's own type, as ``format_type`` spells it, for ``CAST(:p AS <type>)``.

    The name comes from the catalog (``format_type`` quotes what needs quoting), never from
    a signal.
    """

    cache_ok = True

    def __init__(self, name: str) -> None:
        self.name = name

    def get_col_spec(self, **kw: Any) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class _Relation:
    oid: int
    relkind: str
    root: TableId | None  # for a partition: the partitioned table at the top of its tree
    readable: bool


class PostgresDialect(SqlDialect):
    """:class:`snapshotter.sources.base.Dialect` for PostgreSQL (13+)."""

    connector = "postgresql"
    dollar_quotes = True
    commits_visible_in_log_order = False

    def __init__(
        self,
        url: str | sa.URL,
        signal_table: TableId,
        publication: str,
        chunk_timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.url = pg_setup.psycopg_url(url)
        self.chunk_timeout_s = chunk_timeout_s
        self.signal_table = signal_table.with_default_schema(DEFAULT_SCHEMA)
        self.publication = publication
        self._engine: sa.Engine | None = None
        self._conn: pg_arrow.ArrowConnection | None = None
        self._conn_lock = threading.Lock()  # the chunk connection serves one query at a time
        self._guard = QueryGuard()  # time limit and cancellation of its queries
        self._settings: tuple[Any, ...] | None = None  # its _OUTPUT_SETTINGS when clean
        self._database: str | None = None
        self._statements = StatementCache(lambda: _DOLLAR_PARAMS)

    # --- connections ---------------------------------------------------------------------

    @property
    def engine(self) -> sa.Engine:
        if self._engine is None:
            self._engine = sa.create_engine(self.url, pool_pre_ping=True, pool_size=2)
        return self._engine

    @property
    def database(self) -> str:
        if self._database is None:
            with self.engine.connect() as conn:
                self._database = str(conn.execute(sa.text("SELECT current_database()")).scalar())
        return self._database

    @database.setter
    def database(self, value: str) -> None:
        self._database = value

    def _connection(self) -> pg_arrow.ArrowConnection:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
        return self._conn

    def _connect(self) -> pg_arrow.ArrowConnection:
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
            self._settings = _first_row(conn.fetch(_SETTINGS_QUERY))
        except BaseException:
            conn.close()
            raise
        # float8 in binary equals the log's text only when that text reads back exactly.
        digits = dict(zip(_OUTPUT_SETTINGS, self._settings, strict=True))["extra_float_digits"]
        conn.float_text = int(digits) <= 0
        return conn

    @staticmethod
    def _transient_error(error: BaseException) -> bool:
        """A lost or refused connection, a server shutting down, starting up or crashed, a
        terminated backend, no free connection slot: retry. Not: what the query did, an
        authentication or permission failure, a missing database."""
        return _transient(error)

    def close(self) -> None:
        self._guard.close()
        # Not forever: a query whose cancel failed may still hold the lock (the reading
        # thread is a daemon; the server ends the query when the process exits).
        if self._conn_lock.acquire(timeout=CANCEL_TIMEOUT_S):
            try:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
            finally:
                self._conn_lock.release()
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    # --- catalog -------------------------------------------------------------------------

    def describe(self, table: TableId) -> TableSchema:
        table = table.with_default_schema(DEFAULT_SCHEMA)
        with self.engine.connect() as conn:
            relation = self._relation(conn, table)
            gencols = pg_setup.publishes_generated_columns(conn, self.publication)
            columns = self._columns(conn, relation.oid, gencols)
            pk = sa.inspect(conn).get_pk_constraint(table.table, schema=table.schema)
        return TableSchema(table, columns, tuple(pk.get("constrained_columns") or ()))

    def _relation(self, conn: sa.Connection, table: TableId) -> _Relation:
        row = conn.execute(
            sa.text(
                "SELECT c.oid, c.relkind, current_user AS username, rn.nspname AS root_schema, "
                "  r.relname AS root_table, has_schema_privilege(n.oid, 'USAGE') "
                "  AND has_table_privilege(c.oid, 'SELECT') AS readable "
                "FROM pg_catalog.pg_class c "
                "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
                # A partition's root (the table the log names its changes by).
                "LEFT JOIN pg_catalog.pg_class r "
                "  ON c.relispartition AND r.oid = pg_catalog.pg_partition_root(c.oid) "
                "LEFT JOIN pg_catalog.pg_namespace rn ON rn.oid = r.relnamespace "
                "WHERE n.nspname = :schema AND c.relname = :table"
            ),
            {"schema": table.schema, "table": table.table},
        ).one_or_none()
        if row is None:
            raise pg_catalog.missing_table_error(table, self._user(conn))
        root = None if row.root_table is None else TableId(row.root_schema, row.root_table)
        relation = _Relation(int(row.oid), row.relkind, root, row.readable)
        _check_relation(table, relation, row.username)
        return relation

    @staticmethod
    def _user(conn: sa.Connection) -> str:
        return str(conn.execute(sa.text("SELECT current_user")).scalar())

    @staticmethod
    def _columns(conn: sa.Connection, oid: int, gencols: bool) -> tuple[ColumnInfo, ...]:
        # atttypid as is (a domain keeps its own OID): pgoutput's Relation message sends the
        # same OID, so both paths pick the same loader (text, for a domain).
        rows = conn.execute(
            sa.text(
                "SELECT a.attname, a.atttypid, format_type(a.atttypid, a.atttypmod) AS type_name, "
                "  NOT a.attnotnull AS nullable "
                "FROM pg_catalog.pg_attribute a "
                "WHERE a.attrelid = :oid AND a.attnum > 0 AND NOT a.attisdropped "
                # Generated columns are left out where pgoutput does not carry them (all
                # before PostgreSQL 18; virtual ones always): a READ row must be the row the
                # log has (pg_setup warns at init).
                "  AND (a.attgenerated = '' OR (:gencols AND a.attgenerated = 's')) "
                "ORDER BY a.attnum"
            ),
            {"oid": oid, "gencols": gencols},
        )
        return tuple(
            ColumnInfo(
                name=r.attname,
                type_name=r.type_name,
                type_code=int(r.atttypid),
                nullable=r.nullable,
                arrow_type=pg_types.arrow_type(int(r.atttypid)),
            )
            for r in rows
        )

    def snapshot_key(self, schema: TableSchema, surrogate_key: str | None) -> tuple[str, ...]:
        if surrogate_key is None:
            # describe leaves out generated columns the log does not carry: a key column
            # missing is one.
            generated = [k for k in schema.primary_key if k not in schema.column_names]
            if generated:
                raise TableError(_generated_key(schema.table, generated, self.publication))
            if not schema.primary_key:
                raise TableError(_no_primary_key(schema.table))
            # (A surrogate key requires FULL already: _check_surrogate_key.)
            with self.engine.connect() as conn:
                gencols = pg_setup.publishes_generated_columns(conn, self.publication)
                pg_setup.check_toast_identity(conn, schema.table, gencols)
            return schema.primary_key
        self._check_surrogate_key(schema, surrogate_key)
        return (surrogate_key,)

    def _check_surrogate_key(self, schema: TableSchema, column: str) -> None:
        table = schema.table
        try:
            info = schema.column(column)
        except KeyError:
            raise TableError(
                f"surrogate key {column!r}: table {table} has no such column "
                "(names are case-sensitive)"
            ) from None
        if info.nullable:
            raise TableError(
                f"surrogate key {column!r} of table {table} may be NULL; it must be NOT NULL "
                f"to page by it: ALTER TABLE {pg_catalog.quote_table(table)} ALTER COLUMN "
                f"{pg_catalog.quote_name(column)} SET NOT NULL;"
            )
        with self.engine.connect() as conn:
            unique, gaps = _unique_and_identity(conn, table, column)
        if not unique:
            raise TableError(
                f"surrogate key {column!r} of table {table} has no unique index or constraint "
                "on exactly that column (a partial or multi-column one does not count); "
                f"add one: CREATE UNIQUE INDEX ON {pg_catalog.quote_table(table)} "
                f"({pg_catalog.quote_name(column)})"
            )
        if gaps:
            fixes = " ".join(
                f"ALTER TABLE {pg_catalog.quote_table(t)} REPLICA IDENTITY FULL;" for t in gaps
            )
            raise TableError(
                f"surrogate key {column!r} of table {table}: the PostgreSQL log carries a "
                "surrogate key for updates and deletes only with REPLICA IDENTITY FULL, which "
                f"{', '.join(map(str, gaps))} lacks; run: {fixes}"
            )

    def list_tables(self) -> list[TableId]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT n.nspname, c.relname FROM pg_catalog.pg_class c "
                    "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition "
                    "  AND n.nspname NOT IN ('pg_catalog', 'information_schema') "
                    "  AND n.nspname !~ '^pg_(toast|temp_|toast_temp_)' "
                    "  AND has_schema_privilege(n.oid, 'USAGE') "
                    "  AND has_table_privilege(c.oid, 'SELECT') "
                    "ORDER BY n.nspname, c.relname"
                )
            )
            return [TableId(r.nspname, r.relname) for r in rows]

    def relation_kinds(self, tables: Sequence[TableId]) -> Mapping[TableId, str]:
        with self.engine.connect() as conn:
            return pg_relation_kinds(conn, tables)

    # --- reads ---------------------------------------------------------------------------

    def max_key(
        self, schema: TableSchema, key_columns: Sequence[str], condition: str | None
    ) -> Key | None:
        keys = tuple(key_columns)

        def statement(float_text: bool) -> tuple[str, list[Any]]:
            sql = self._statements.get(
                ("max", schema, keys, condition, float_text),
                lambda: _PgChunkQueries(schema, keys, float_text).max_key(condition),
            )
            return sql, []

        rows, _ = self._read(schema.table, "max-key query", statement, condition is not None)
        return _key_of(schema, keys, rows, "maximum key")

    def estimated_rows(self, schema: TableSchema) -> int | None:
        """The planner's row estimate: ``reltuples`` scaled to the table's current size (as
        the planner does), summed over the leaf partitions of a partitioned table; None
        when no part was ever analyzed (``reltuples`` -1)."""
        table = schema.table.with_default_schema(DEFAULT_SCHEMA)
        with self.engine.connect() as conn:
            # pg_relation_size takes the lock a SELECT takes: never wait on DDL for this.
            for limit in _ESTIMATE_LIMITS:
                conn.execute(sa.text(limit))
            value = conn.execute(
                sa.text(_ESTIMATE_QUERY), {"schema": table.schema, "table": table.table}
            ).scalar()
        return None if value is None else max(0, round(float(value)))

    def unfinished_xids(self) -> OpenAtStart:
        return pg_open_xacts.open_at_start(self.engine)

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

    def explain_chunk(self, spec: ChunkSpec) -> str:
        """The plan (``EXPLAIN``) of the chunk SELECT ``read_chunk`` would run: a composite
        key must be an index range (``Index Cond`` with the row comparison), or every chunk
        reads the index from its start."""
        return self._explain(spec, False, "EXPLAIN of the chunk query")

    def _statement(self, spec: ChunkSpec, bound: bool, float_text: bool) -> tuple[str, list[Any]]:
        """The chunk SELECT (or, ``bound``, the chunk bound query) of ``spec`` and its
        parameters in ``$n`` order."""
        sql, names = self._statements.get_positional(
            (*chunk_shape(spec, bound), float_text),
            lambda: _PgChunkQueries(spec.schema, spec.key_columns, float_text).of(spec, bound),
        )
        params = {**_key_params(spec), **count_params(spec, bound)}
        return sql, [params[name] for name in names]

    def _explain(self, spec: ChunkSpec, bound: bool, what: str) -> str:
        def statement(float_text: bool) -> tuple[str, list[Any]]:
            sql, params = self._statement(spec, bound, float_text)
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

    def _read(
        self,
        table: TableId,
        what: str,
        statement: Callable[[bool], tuple[str, list[Any]]],
        filtered: bool,
    ) -> tuple[pa.Table, str]:
        """Run the query ``statement(float_text)`` builds (its SQL and ``$n`` parameters, for
        the connection's float mode) in one REPEATABLE READ READ ONLY transaction under the
        time limit; its rows as the driver's Arrow table, and the transaction's snapshot
        (``pg_current_snapshot()``, the snapshot the query read in). ``filtered``: the SQL
        holds a signal's filter, so the session's output settings are checked before the
        rows are used and the session is reset after (whatever the filter did to it stays
        out of later reads)."""
        with self._conn_lock:
            query: GuardedQuery | None = None
            try:
                conn = self._connection()
                sql, params = statement(conn.float_text)
                timeout_ms = str(max(1, round(self.chunk_timeout_s * 1000)))
                with self._guard.running(self.chunk_timeout_s, conn.cancel) as query:
                    rows, snapshot = self._transaction(
                        conn, table, what, sql, params, timeout_ms, filtered
                    )
            except pg_arrow.AdbcError as exc:
                raise self._failure(table, what, exc, query, filtered) from exc
            finally:
                self._after_read(query, filtered)
            assert query is not None
            if query.outcome is not None:  # cancelled, though the query got to its end
                raise self._outcome_error(query.outcome, table, what, filtered)
        return rows, snapshot

    def _transaction(
        self,
        conn: pg_arrow.ArrowConnection,
        table: TableId,
        what: str,
        sql: str,
        params: list[Any],
        timeout_ms: str,
        filtered: bool,
    ) -> tuple[pa.Table, str]:
        conn.script(_BEGIN)
        try:
            snapshot = _first_row(conn.fetch(_BEGIN_READ, [timeout_ms]))[0]
            rows = conn.fetch(sql, params)
            if filtered:
                self._check_settings(conn, table)
            if what == CHUNK_QUERY:
                failpoint("chunk.select")
            conn.script("COMMIT")
        except BaseException:
            if not conn.broken:
                try:
                    conn.script("ROLLBACK")
                except pg_arrow.AdbcError:
                    conn.broken = True
            raise
        return rows, str(snapshot)

    def _check_settings(self, conn: pg_arrow.ArrowConnection, table: TableId) -> None:
        now = _first_row(conn.fetch(_SETTINGS_QUERY))
        if self._settings is None:
            return
        error = session_changed_error(
            table,
            "setting",
            _OUTPUT_SETTINGS,
            self._settings,
            now,
            "Send execute-snapshot again with a filter that changes no setting (no set_config)",
        )
        if error is not None:
            raise error

    def _after_read(self, query: GuardedQuery | None, filtered: bool) -> None:
        """After a cancelled query, a new connection (a late cancel request must not hit a
        later query); after a filtered one, a clean session (``_RESET_SESSION``)."""
        conn = self._conn
        if conn is None or conn.closed:
            return
        try:
            if query is not None and query.outcome is not None:
                conn.close()
            elif filtered and not conn.broken:
                conn.script(_RESET_SESSION)
        except pg_arrow.AdbcError:
            conn.close()  # whatever the filter left is gone with the session
        if conn.closed or conn.broken:
            conn.close()
            self._conn = None  # reconnect on the next read

    def _failure(
        self,
        table: TableId,
        what: str,
        exc: pg_arrow.AdbcError,
        query: GuardedQuery | None,
        filtered: bool,
    ) -> Exception:
        """A TableError for what the query did (bad filter, permissions, data, the time
        limit); ReadCancelled when the guard cancelled it on request; a ChunkReadError,
        worth a retry, when the connection or server failed."""
        if query is not None and query.outcome is not None:
            return self._outcome_error(query.outcome, table, what, filtered)
        if (
            getattr(exc, "sqlstate", None) == _QUERY_CANCELED
            and query is not None
            and query.ran_for(self.chunk_timeout_s)
        ):
            return self._outcome_error(Outcome.TIMED_OUT, table, what, filtered)
        message = f"{what} on table {table} failed: {pg_arrow.error_message(exc)}"
        conn = self._conn
        if conn is not None and (conn.broken or conn.closed):
            conn.close()
            self._conn = None  # reconnect on the next read
        if _transient(exc):
            return ChunkReadError(message)
        return TableError(message)

    # --- chunk bounds (parallel reads, core.spans) -----------------------------------------

    def chunk_bound(self, spec: ChunkSpec) -> Key | None:
        statement = partial(self._statement, spec, True)
        found, _ = self._read(spec.table, "chunk bound query", statement, spec.filtered)
        return _key_of(spec.schema, spec.key_columns, found, "chunk bound")

    def explain_bound(self, spec: ChunkSpec) -> str:
        """The plan of ``chunk_bound``'s query: an index (only) scan with the key range as
        its ``Index Cond``, never a scan from the index's start or a sort."""
        return self._explain(spec, True, "EXPLAIN of the chunk bound query")

    # --- capture and the log ------------------------------------------------------------

    def ensure_captured(self, tables: Sequence[TableId]) -> list[TableId]:
        wanted = [t.with_default_schema(DEFAULT_SCHEMA) for t in tables]
        with self.engine.begin() as conn:
            missing = pg_publications.missing_from_publication(conn, self.publication, wanted)
            pg_publications.add_tables(conn, self.publication, missing)
        return missing

    def _watermark_transaction(self, conn: sa.Connection) -> None:
        """A watermark row is committed with a local WAL flush whatever
        ``synchronous_commit`` says (``pg_commits``: an async watermark would wait for the
        WAL writer to come back)."""
        pg_commits.flush_at_commit(conn)

    def log_end(self) -> int:
        """A WAL position past every transaction committed before the call, already
        decodable (``pg_commits.committed_end``; not the flushed position, which async
        commits can be past)."""
        return pg_commits.committed_end(self.engine)

    def lag_bytes(self, resume: Mapping[str, Any]) -> int | None:
        """WAL bytes after the restart point (the slot's confirmed LSN)."""
        lsn = resume.get("lsn")
        return max(0, pg_commits.wal_end(self.engine) - (lsn if isinstance(lsn, int) else 0))


# --- SQL -----------------------------------------------------------------------------------


def _first_row(table: pa.Table) -> tuple[Any, ...]:
    """The first row of a one-row result, by position (names may repeat)."""
    return tuple(column[0].as_py() for column in table.columns)


class _PgChunkQueries(ChunkQueries):
    """The chunk SQL (``sql_common.ChunkQueries``) as PostgreSQL reads it through ADBC."""

    def __init__(self, schema: TableSchema, key_columns: Sequence[str], float_text: bool) -> None:
        super().__init__(schema, key_columns)
        self.float_text = float_text  # the connection reads float8 as text (pg_arrow)

    def output(self, column: ColumnInfo) -> sa.ColumnElement[Any]:
        """As is when read by type, cast where the driver's binary value differs from what
        the log decoder loads (``pg_arrow.select_as``), else the text of its type's output
        function, as pgoutput sends it (``pg_types.OUTPUT_TEXT``, written with SQLAlchemy)."""
        raw = self.table.c[column.name]
        how = pg_arrow.how_read(column.type_code, self.float_text)
        if how is pg_arrow.Read.AS_IS:
            return raw
        if how is pg_arrow.Read.FLOAT_TEXT:
            return sa.cast(sa.cast(raw, sa.Text()), sa.Double()).label(column.name)
        if how is pg_arrow.Read.TEXT:
            return sa.cast(raw, sa.Text()).label(column.name)
        if how is pg_arrow.Read.BIGINT:
            return sa.cast(raw, sa.BigInteger()).label(column.name)
        one: sa.ColumnElement[Any] = sa.literal_column("1")
        return sa.case((sa.func.num_nonnulls(raw) == one, sa.func.concat(raw))).label(column.name)

    def key_range(self, prefix: str, lower: bool) -> sa.ColumnElement[bool]:
        """``(k1, k2) > (v1, v2)``: a row comparison PostgreSQL turns into one index range
        (an OR-expanded form would be a filter over the whole index), each value
        ``CAST(:<prefix>i AS <column type>)`` so the planner compares in the column's type."""
        op = ">" if lower else "<="
        values = [
            sa.cast(
                sa.bindparam(f"{prefix}{i}", type_=_SqlType(self.schema.column(k).type_name)),
                _SqlType(self.schema.column(k).type_name),
            )
            for i, k in enumerate(self.key_columns)
        ]
        if len(self.keys) == 1:
            compared: sa.ColumnElement[bool] = self.keys[0].op(op)(values[0])
        else:
            compared = sa.tuple_(*self.keys).op(op)(sa.tuple_(*values))
        return compared

    def count(self, name: str) -> sa.BindParameter[Any]:
        return sa.bindparam(name, type_=_SqlType("bigint"))


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


def _key_params(spec: ChunkSpec) -> dict[str, Any]:
    """The key range's parameters: ``u<i>`` the upper key, ``a<i>`` the lower one."""
    params: dict[str, Any] = {f"u{i}": v for i, v in enumerate(spec.upto)}
    params.update({f"a{i}": v for i, v in enumerate(spec.after or ())})
    return params


# --- checks --------------------------------------------------------------------------------


def _check_relation(table: TableId, relation: _Relation, user: str) -> None:
    if relation.relkind not in ("r", "p"):
        kind = _RELKIND_NAMES.get(relation.relkind, f"a relation of kind {relation.relkind!r}")
        raise TableError(f"{table} is {kind}, not a table: only tables can be snapshotted")
    if relation.root is not None:
        raise TableError(
            f"table {table} is a partition of {relation.root}; snapshot {relation.root} "
            "(the log names a partition's changes by its partitioned table)"
        )
    if not relation.readable:
        raise TableError(
            f"user {user} may not read table {table}: it needs USAGE on the schema and "
            f"SELECT on the table (GRANT SELECT ON {pg_catalog.quote_table(table)} TO "
            f"{pg_catalog.quote_name(user)})"
        )


def _generated_key(table: TableId, columns: Sequence[str], publication: str) -> str:
    return (
        f"table {table}: its primary key includes the generated column(s) "
        f"{', '.join(columns)}, which PostgreSQL's log (pgoutput) does not carry here, so log "
        "events could not be matched with snapshot rows; name a unique NOT NULL column that "
        'is not generated to page by, with "surrogate-key" in the execute-snapshot signal '
        "(PostgreSQL 18, stored columns: or ALTER PUBLICATION "
        f"{pg_catalog.quote_name(publication)} SET (publish_generated_columns = stored))"
    )


def _no_primary_key(table: TableId) -> str:
    return (
        f"table {table} has no primary key: name a NOT NULL column with a unique index to "
        'page by, with "surrogate-key" in the execute-snapshot signal (or --surrogate-key COL '
        "on the CLI); under PostgreSQL the log carries that column for updates and deletes "
        f"only with REPLICA IDENTITY FULL (ALTER TABLE {pg_catalog.quote_table(table)} "
        "REPLICA IDENTITY FULL;)"
    )


def _unique_and_identity(
    conn: sa.Connection, table: TableId, column: str
) -> tuple[bool, list[TableId]]:
    """Whether a valid, non-partial unique index covers exactly ``column``; and the table's
    storage (itself or its leaf partitions: replica identity is not inherited) lacking
    REPLICA IDENTITY FULL."""
    oid = pg_catalog.table_oid(conn, table)
    if oid is None:  # dropped since it was described
        raise pg_catalog.missing_table_error(table, PostgresDialect._user(conn))
    unique = conn.execute(
        sa.text(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_index i "
            "JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attname = :col "
            "WHERE i.indrelid = :oid AND i.indisunique AND i.indisvalid "
            "  AND i.indpred IS NULL AND i.indexprs IS NULL AND i.indnkeyatts = 1 "
            "  AND i.indkey[0] = a.attnum)"
        ),
        {"oid": oid, "col": column},
    ).scalar_one()
    gaps = [s.table for s in pg_setup.storage_tables(conn, oid) if not s.full]
    return bool(unique), gaps


def _is_a_dialect(dialect: PostgresDialect) -> Dialect:
    """Never called: makes mypy check that PostgresDialect implements the protocol."""
    return dialect

"""The MySQL / MariaDB dialect: catalog, max-key and chunk queries, watermarks.

Two kinds of connection:

* a SQLAlchemy engine (``mysql+pymysql``) for the catalog and watermark inserts;
* one pymysql connection for the max-key and chunk SELECTs, each run in its own
  ``START TRANSACTION READ ONLY`` (a filter, SQL from the signal table, cannot write), with
  the session in UTC so TIMESTAMP values come back as the binlog has them.

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

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pymysql
import sqlalchemy as sa

from signals import Watermark
from signals.names import TableId
from signals.table import insert_signal
from snapshotter.core.keys import Key
from snapshotter.dialects import my_types
from snapshotter.dialects.base import (
    ChunkRead,
    ChunkReadError,
    ColumnInfo,
    Dialect,
    TableError,
    TableSchema,
    error_chain,
)
from snapshotter.dialects.sql_common import (
    CHUNK_QUERY,
    StatementCache,
    bound_params,
    check_bounds,
    columns_converter,
    key_clauses,
    last_key,
    rows_to_arrow,
    sa_table,
    signal_filter,
)
from snapshotter.faults import failpoint

_SYSTEM_SCHEMAS = ("mysql", "information_schema", "performance_schema", "sys")
# Errors that mean the connection, not the query, failed, or the server is going away or
# full: worth a retry. CR_CONNECTION_ERROR, CR_CONN_HOST_ERROR, CR_SERVER_GONE_ERROR,
# CR_SERVER_LOST, CR_SERVER_LOST_EXTENDED; ER_CON_COUNT_ERROR, ER_SERVER_SHUTDOWN, MariaDB's
# ER_CONNECTION_KILLED, MySQL's ER_CLIENT_INTERACTION_TIMEOUT. Not retried: access denied
# (1045), an unknown database (1049), anything the query did.
_CONNECTION_ERRORS = frozenset({2002, 2003, 2006, 2013, 2055, 1040, 1053, 1927, 4031})


def _transient(error: BaseException) -> bool:
    if isinstance(error, ChunkReadError | ConnectionError):
        return True
    if isinstance(error, sa.exc.DBAPIError) and error.connection_invalidated:
        return True
    if isinstance(error, pymysql.err.InterfaceError):
        return True  # pymysql's (0, ''): the connection is closed
    if isinstance(error, pymysql.err.Error):
        code = error.args[0] if error.args and isinstance(error.args[0], int) else None
        return code in _CONNECTION_ERRORS
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


def binlog_offset(file_name: str, position: int) -> int:
    """A binlog coordinate as one integer that grows with the log: the file's sequence
    number (``binlog.000042`` -> 42) in the high bits, the byte offset in the low 32."""
    return (binlog_file_number(file_name) << 32) | position


def binlog_file_number(file_name: str) -> int:
    _, _, suffix = file_name.rpartition(".")
    if not suffix.isdigit():
        raise ValueError(f"binlog file name {file_name!r} does not end in a sequence number")
    return int(suffix)


def binlog_status(conn: sa.Connection) -> tuple[str, int] | None:
    """The binlog file and position the server writes next; None when binary logging is
    off. MySQL 8.4 removed ``SHOW MASTER STATUS`` for ``SHOW BINARY LOG STATUS`` (which
    MariaDB before 10.5.2 lacks): try the new name first."""
    for statement in ("SHOW BINARY LOG STATUS", "SHOW MASTER STATUS"):
        try:
            row = conn.exec_driver_sql(statement).first()
        except sa.exc.ProgrammingError:
            continue
        if row is None:
            return None
        return str(row[0]), int(row[1])
    return None


class MySqlDialect:
    """:class:`snapshotter.dialects.base.Dialect` for MySQL 8 and MariaDB 10.5+."""

    connector = "mysql"
    dollar_quotes = False
    commits_visible_in_log_order = True

    def __init__(self, url: str | sa.URL, signal_table: TableId) -> None:
        self.url = mysql_url(url)
        database = self.url.database
        if not database:
            raise TableError(f"the source URL {self.url!r} names no database")
        self._default_schema = database
        self.signal_table = signal_table.with_default_schema(database)
        self._engine: sa.Engine | None = None
        self._conn: pymysql.connections.Connection[Any] | None = None
        self._conn_lock = threading.Lock()  # the chunk connection serves one query at a time
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

    def _connection(self) -> pymysql.connections.Connection[Any]:
        if self._conn is None or not self._conn.open:
            conn = pymysql.connect(**self.connect_args(), autocommit=True)
            with conn.cursor() as cur:
                # TIMESTAMP values as stored (UTC), as the binlog carries them.
                cur.execute("SET time_zone = '+00:00'")
            self._conn = conn
        return self._conn

    def is_transient(self, exc: BaseException) -> bool:
        """A lost or refused connection, a server shutting down or out of connections, a
        killed connection: retry. Not: what the query did, access denied, a missing
        database."""
        return any(_transient(error) for error in error_chain(exc))

    def close(self) -> None:
        with self._conn_lock:
            if self._conn is not None:
                with contextlib.suppress(pymysql.err.Error):
                    self._conn.close()
                self._conn = None
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

    def column_types(self, schema: TableSchema) -> dict[str, ColumnType]:
        types = self._types.get(schema.table)
        if types is None or set(types) != set(schema.column_names):
            self.describe(schema.table)
            types = self._types[schema.table]
        return types

    def snapshot_key(self, schema: TableSchema, surrogate_key: str | None) -> tuple[str, ...]:
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

    # --- reads ---------------------------------------------------------------------------

    def max_key(
        self, schema: TableSchema, key_columns: Sequence[str], condition: str | None
    ) -> Key | None:
        keys = tuple(key_columns)
        sql = self._statements.get(
            ("max", schema, keys, condition), lambda: _max_key_query(schema, keys, condition)
        )
        rows = self._read(schema.table, "max-key query", sql, {})
        return tuple(rows[0]) if rows else None

    def read_chunk(
        self,
        schema: TableSchema,
        key_columns: Sequence[str],
        after: Key | None,
        upto: Key,
        condition: str | None,
        limit: int,
    ) -> ChunkRead:
        sql, params = self._chunk_statement(schema, key_columns, after, upto, condition, limit)
        rows = self._read(schema.table, CHUNK_QUERY, sql, params)
        return ChunkRead(rows_to_arrow(schema, rows), last_key(schema, key_columns, rows), None)

    def explain_chunk(
        self,
        schema: TableSchema,
        key_columns: Sequence[str],
        after: Key | None,
        upto: Key,
        condition: str | None,
        limit: int,
    ) -> list[dict[str, Any]]:
        """``EXPLAIN`` of the chunk SELECT ``read_chunk`` would run, one dict per plan row
        (``type`` must be ``range`` for a key range, not ``index`` or ``ALL``)."""
        sql, params = self._chunk_statement(schema, key_columns, after, upto, condition, limit)
        with self._conn_lock:
            conn = self._connection()
            with conn.cursor(pymysql.cursors.DictCursor) as cur:
                cur.execute("EXPLAIN " + sql, params)
                return list(cur.fetchall())

    def _chunk_statement(
        self,
        schema: TableSchema,
        key_columns: Sequence[str],
        after: Key | None,
        upto: Key,
        condition: str | None,
        limit: int,
    ) -> tuple[str, dict[str, Any]]:
        keys = tuple(key_columns)
        check_bounds(keys, after, upto)
        has_after = after is not None
        sql = self._statements.get(
            ("chunk", schema, keys, has_after, condition),
            lambda: _chunk_query(schema, keys, has_after, condition, self._float_columns(schema)),
        )
        return sql, bound_params(after, upto, limit)

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
                cur.execute(sql)
                while batch := cur.fetchmany(5000):
                    table = rows_to_arrow(schema, list(batch), arrow)
                    for row in table.to_pylist():
                        yield row if convert is None else convert(row)
                cur.execute("COMMIT")
        finally:
            conn.close()

    def _read(
        self, table: TableId, what: str, sql: str, params: dict[str, Any]
    ) -> list[tuple[Any, ...]]:
        """Run ``sql`` in one ``START TRANSACTION READ ONLY``; its rows."""
        with self._conn_lock:
            try:
                conn = self._connection()
                with conn.cursor() as cur:
                    cur.execute("START TRANSACTION READ ONLY")
                    try:
                        cur.execute(sql, params)
                        rows = list(cur.fetchall())
                        if what == CHUNK_QUERY:
                            failpoint("chunk.select")
                    finally:
                        if conn.open:
                            cur.execute("COMMIT")
            except pymysql.err.Error as exc:
                raise self._failure(table, what, exc) from exc
        return rows

    def _failure(self, table: TableId, what: str, exc: pymysql.err.Error) -> Exception:
        code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
        detail = exc.args[1] if len(exc.args) > 1 else str(exc)
        message = f"{what} on table {table} failed: ({code}) {detail}"
        if _transient(exc):
            if self._conn is not None:
                with contextlib.suppress(pymysql.err.Error):
                    self._conn.close()
            self._conn = None  # reconnect on the next read
            return ChunkReadError(message)
        return TableError(message)

    # --- writes and the log ----------------------------------------------------------------

    def write_watermark(self, watermark: Watermark) -> None:
        with self.engine.begin() as conn:
            insert_signal(conn, self.signal_table, watermark)

    def ensure_captured(self, tables: Sequence[TableId]) -> list[TableId]:
        """The binlog carries every table: nothing to add (the log reader decodes the tables
        ``source.tables`` selects, new ones included)."""
        return []

    def binlog_start(self) -> dict[str, Any]:
        """Where a reader that starts now begins: the binlog's current end."""
        with self.engine.connect() as conn:
            status = binlog_status(conn)
        if status is None:
            raise TableError("binary logging is off on the source (log_bin=OFF)")
        return {"file": status[0], "pos": status[1]}

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


def _outputs(
    table: sa.TableClause, schema: TableSchema, floats: frozenset[str]
) -> list[sa.ColumnElement[Any]]:
    out: list[sa.ColumnElement[Any]] = []
    for column in schema.columns:
        raw = table.c[column.name]
        if column.name in floats:
            out.append(sa.cast(raw, sa.Double()).label(column.name))
        else:
            out.append(raw)
    return out


def key_bound(columns: Sequence[sa.ColumnClause[Any]], prefix: str, lower: bool) -> Any:
    """``(k1, .., kn) > (:a0, ..)`` (lower) or ``<= (:u0, ..)`` (upper), written so MySQL and
    MariaDB range-scan the key's index: a plain bound on the first column, AND the
    lexicographic comparison expanded into ORs."""
    strict, last = (">", ">") if lower else ("<", "<=")
    params: list[sa.BindParameter[Any]] = [
        sa.bindparam(f"{prefix}{i}") for i in range(len(columns))
    ]
    if len(columns) == 1:
        return columns[0].op(last)(params[0])
    alternatives = []
    for i in range(len(columns)):
        equal = [columns[j] == params[j] for j in range(i)]
        op = last if i == len(columns) - 1 else strict
        alternatives.append(sa.and_(*equal, columns[i].op(op)(params[i])))
    leading = columns[0].op(">=" if lower else "<=")(params[0])
    return sa.and_(leading, sa.or_(*alternatives))


def _max_key_query(
    schema: TableSchema, key_columns: tuple[str, ...], condition: str | None
) -> sa.Select[Any]:
    table = sa_table(schema)
    keys = key_clauses(schema, table, key_columns)
    query = sa.select(*keys).select_from(table)
    if condition is not None:
        query = query.where(signal_filter(condition))
    return query.order_by(*(k.desc() for k in keys)).limit(sa.literal_column("1"))


def _chunk_query(
    schema: TableSchema,
    key_columns: tuple[str, ...],
    has_after: bool,
    condition: str | None,
    floats: frozenset[str],
) -> sa.Select[Any]:
    table = sa_table(schema)
    keys = key_clauses(schema, table, key_columns)
    query = sa.select(*_outputs(table, schema, floats)).select_from(table)
    if has_after:
        query = query.where(key_bound(keys, "a", lower=True))
    query = query.where(key_bound(keys, "u", lower=False))
    if condition is not None:
        query = query.where(signal_filter(condition))
    return query.order_by(*keys).limit(sa.bindparam("limit"))


def _select_all(schema: TableSchema, floats: frozenset[str]) -> sa.Select[Any]:
    table = sa_table(schema)
    return sa.select(*_outputs(table, schema, floats)).select_from(table)


def _is_a_dialect(dialect: MySqlDialect) -> Dialect:
    """Never called: makes mypy check that MySqlDialect implements the protocol."""
    return dialect

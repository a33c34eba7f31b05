"""The MySQL / MariaDB catalog, as the dialect asks it (``information_schema``): a table's
columns and primary key, each column's catalog type (for the converters, the binlog
decoder and the key's bindings), the key chunks are paged by (and the errors for a key that
cannot be paged), the tables there are, what a name is when it is no table, a table's row
estimate. Through the dialect's SQLAlchemy engine (pymysql)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from signals.names import TableId
from snapshotter.sources.base import ColumnInfo, TableError, TableSchema
from snapshotter.sources.mysql import types as my_types
from snapshotter.sources.relations import mysql_relation_kinds

_SYSTEM_SCHEMAS = ("mysql", "information_schema", "performance_schema", "sys")


@dataclass(frozen=True, slots=True)
class ColumnType:
    """What the catalog says of a column beyond ColumnInfo (used to build converters)."""

    data_type: str  # information_schema DATA_TYPE, lower case: "varchar", "json", ...
    column_type: str  # COLUMN_TYPE: "varchar(20)", "bigint(20) unsigned", "enum('a','b')"


class MySqlTables(ABC):
    """The catalog part of :class:`snapshotter.sources.mysql.dialect.MySqlDialect`."""

    _default_schema: str  # the URL's database: where an unqualified table name lives
    _types: dict[TableId, dict[str, ColumnType]]  # each described table's catalog types

    @property
    @abstractmethod
    def engine(self) -> sa.Engine:
        """The SQLAlchemy engine of the catalog connections (the dialect's)."""

    def describe(self, table: TableId) -> TableSchema:
        table = table.with_default_schema(self._default_schema)
        with self.engine.connect() as conn:
            kind = _table_fact(conn, table, "TABLE_TYPE")
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
                value = _table_fact(conn, table, "TABLE_ROWS")
            finally:
                if not conn.dialect.is_mariadb:  # type: ignore[attr-defined]
                    conn.execute(sa.text("SET SESSION information_schema_stats_expiry = DEFAULT"))
        return None if value is None else max(0, int(value))


def _table_fact(conn: sa.Connection, table: TableId, column: str) -> Any:
    """The ``information_schema.TABLES`` column ``column`` (one of ours, never a signal's)
    of ``table``; None when the table is not there or the user may not see it."""
    return conn.execute(
        sa.text(
            f"SELECT {column} FROM information_schema.TABLES "
            "WHERE TABLE_SCHEMA = :s AND TABLE_NAME = :t"
        ),
        {"s": table.schema, "t": table.table},
    ).scalar()

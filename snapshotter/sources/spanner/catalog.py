"""The Spanner catalog, as the dialect asks it (``information_schema``, in strong
single-use read-only transactions): the database's dialect (GoogleSQL or PostgreSQL), a
table's columns, their Spanner types and its primary key, the key chunks are paged by (and
the errors for one that cannot be), the tables there are, what a name is when it is no
table, and what a change stream watches (init's and run's checks)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from signals.names import TableId
from snapshotter.sources.base import ColumnInfo, TableError, TableSchema
from snapshotter.sources.spanner import client as sp_client
from snapshotter.sources.spanner import sql
from snapshotter.sources.spanner.client import SpannerDialectKind
from snapshotter.sources.spanner.setup import StreamFacts
from snapshotter.sources.spanner.types import SpannerType, arrow_type, parse_type


def _schema_value(dialect: SpannerDialectKind, table: TableId) -> str:
    """``information_schema``'s table_schema of ``table`` (GoogleSQL's default is '')."""
    schema = table.schema or sql.DEFAULT_SCHEMA
    if dialect is SpannerDialectKind.GOOGLESQL and schema == sql.DEFAULT_SCHEMA:
        return ""
    return schema


def _table_of(dialect: SpannerDialectKind, schema: str, name: str) -> TableId:
    return TableId(schema or sql.DEFAULT_SCHEMA, name)


class SpannerCatalog:
    """The catalog part of :class:`snapshotter.sources.spanner.dialect.SpannerDialect`."""

    def __init__(self, db: Any, chunk_timeout_s: float) -> None:
        self.db = db  # the client library's Database
        self.chunk_timeout_s = chunk_timeout_s
        self._kind: SpannerDialectKind | None = None
        self._types: dict[TableId, dict[str, SpannerType]] = {}
        self._schemas: dict[TableId, TableSchema] = {}
        # Whether filters are checked reading $$ as a quote: the PostgreSQL dialect's way,
        # the stricter reading until the database's dialect is known.
        self.dollar_quotes = True

    @property
    def kind(self) -> SpannerDialectKind:
        if self._kind is None:
            self._kind = sp_client.dialect_of(self.db)
            self.dollar_quotes = self._kind is SpannerDialectKind.POSTGRESQL
        return self._kind

    def _query(
        self, st: sql.Statement | None, text: str, *, timeout: float | None = None
    ) -> list[list[Any]]:
        params = st.params if st is not None else None
        types = st.types if st is not None else None
        with self.db.snapshot() as snapshot:
            result = snapshot.execute_sql(
                text, params=params, param_types=types, timeout=timeout or self.chunk_timeout_s
            )
            return [list(row) for row in result]

    # --- the catalog -------------------------------------------------------------------------

    def _of_table(self, table: TableId, select: str, then: str = "") -> list[list[Any]]:
        """``SELECT <select> FROM information_schema.<...> WHERE`` the rows of ``table``."""
        from google.cloud.spanner_v1 import param_types

        st = sql.Statement(self.kind)
        schema_p = st.param(_schema_value(self.kind, table), param_types.STRING)
        name_p = st.param(table.table, param_types.STRING)
        return self._query(
            st, f"{select} WHERE table_schema = {schema_p} AND table_name = {name_p} {then}"
        )

    def describe(self, table: TableId) -> TableSchema:
        table = table.with_default_schema(sql.DEFAULT_SCHEMA)
        columns = self._of_table(
            table,
            "SELECT column_name, spanner_type, is_nullable FROM information_schema.columns",
            "ORDER BY ordinal_position",
        )
        if not columns:
            raise TableError(f"table {table} does not exist or is not readable")
        keys = self._of_table(
            table,
            "SELECT column_name FROM information_schema.index_columns",
            "AND index_name = 'PRIMARY_KEY' ORDER BY ordinal_position",
        )
        types = {str(name): parse_type(str(t)) for name, t, _ in columns}
        self._types[table] = types
        info = tuple(
            ColumnInfo(
                name=str(name),
                type_name=str(t),
                type_code=types[str(name)].code,
                nullable=str(nullable).upper() == "YES",
                arrow_type=arrow_type(types[str(name)]),
            )
            for name, t, nullable in columns
        )
        schema = TableSchema(table, info, tuple(str(k[0]) for k in keys))
        self._schemas[table] = schema
        return schema

    def columns_of(self, table: TableId) -> tuple[str, ...]:
        """A table's columns in order (cached: the log decoder asks per record)."""
        schema = self._schemas.get(table)
        if schema is None:
            schema = self.describe(table)
        return schema.column_names

    def _key_types(self, schema: TableSchema, key_columns: Sequence[str]) -> list[SpannerType]:
        types = self._types.get(schema.table)
        if types is None:
            self.describe(schema.table)
            types = self._types[schema.table]
        return [types[k] for k in key_columns]

    def snapshot_key(self, schema: TableSchema, surrogate_key: str | None) -> tuple[str, ...]:
        key = schema.primary_key
        if surrogate_key is not None and (surrogate_key,) != key:
            raise TableError(
                f"table {schema.table}: a Spanner table is always paged by its primary key "
                f"({', '.join(key)}); send the signal without surrogate-key"
            )
        nullable = [c for c in key if schema.column(c).nullable]
        if nullable:
            raise TableError(
                f"table {schema.table}: primary key column {', '.join(nullable)} allows NULL, "
                "which snapshotter cannot page by; declare it NOT NULL"
            )
        return key

    def list_tables(self) -> list[TableId]:
        rows = self._query(
            None,
            "SELECT table_schema, table_name FROM information_schema.tables "
            "WHERE table_type = 'BASE TABLE' AND table_schema NOT IN "
            "('INFORMATION_SCHEMA', 'SPANNER_SYS', 'information_schema', 'pg_catalog', "
            "'spanner_sys') ORDER BY table_schema, table_name",
        )
        return [_table_of(self.kind, str(s), str(n)) for s, n in rows]

    def relation_kinds(self, tables: Sequence[TableId]) -> Mapping[TableId, str]:
        rows = self._query(
            None,
            "SELECT table_schema, table_name, table_type FROM information_schema.tables",
        )
        kinds = {_table_of(self.kind, str(s), str(n)): str(t) for s, n, t in rows}
        out: dict[TableId, str] = {}
        for table in tables:
            kind = kinds.get(table.with_default_schema(sql.DEFAULT_SCHEMA))
            if kind == "VIEW":
                out[table] = "is a view: only tables can be snapshotted"
            elif kind is not None and kind != "BASE TABLE":
                out[table] = f"is a {kind.lower()}: only tables can be snapshotted"
        return out

    def table_exists(self, table: TableId) -> bool:
        return bool(self._of_table(table, "SELECT table_name FROM information_schema.tables"))

    def stream_facts(self, stream: str) -> StreamFacts:
        from google.cloud.spanner_v1 import param_types

        def rows(text: str) -> list[list[Any]]:
            st = sql.Statement(self.kind)
            return self._query(st, text.format(name=st.param(stream, param_types.STRING)))

        found = rows(
            "SELECT change_stream_name, `all` FROM information_schema.change_streams "
            "WHERE change_stream_name = {name}"
            if self.kind is SpannerDialectKind.GOOGLESQL
            else 'SELECT change_stream_name, "all" FROM information_schema.change_streams '
            "WHERE change_stream_name = {name}"
        )
        if not found:
            return StreamFacts(False, False, {}, {})
        watched = rows(
            "SELECT table_schema, table_name, all_columns FROM "
            "information_schema.change_stream_tables WHERE change_stream_name = {name}"
        )
        options = rows(
            "SELECT option_name, option_value FROM information_schema.change_stream_options "
            "WHERE change_stream_name = {name}"
        )
        return StreamFacts(
            exists=True,
            all_tables=_truth(found[0][1]) and self._declared_for_all(stream) is not False,
            tables={_table_of(self.kind, str(s), str(n)): _truth(a) for s, n, a in watched},
            options={str(k).lower(): str(v) for k, v in options},
        )

    def _declared_for_all(self, stream: str) -> bool | None:
        """Whether the database's DDL creates ``stream`` FOR ALL (None: not known). Asked
        only when ``information_schema`` says so: the emulator keeps saying it after ``DROP
        FOR ALL`` (docs/spanner.md, On the emulator)."""
        from google.api_core import exceptions as gexc

        from snapshotter.sources.spanner.setup import declared_for_all

        try:
            self.db.reload()  # GetDatabaseDdl, then GetDatabase
        except gexc.GoogleAPICallError:
            return None  # e.g. no right to read the DDL: information_schema's word stands
        return declared_for_all(self.db.ddl_statements, stream)


def _truth(value: Any) -> bool:
    """information_schema's booleans: BOOL in GoogleSQL, 'YES'/'NO' in PostgreSQL."""
    return value is True or str(value).upper() in ("YES", "TRUE")

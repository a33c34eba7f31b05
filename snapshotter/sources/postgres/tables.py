"""The PostgreSQL catalog, as the dialect asks it: a table's columns and primary key, the
key chunks are paged by (and the fix-it errors for a table that cannot be paged or
captured), the tables there are, what a name is when it is no table, a table's row
estimate. Through the dialect's SQLAlchemy engine (psycopg)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from signals.names import TableId
from snapshotter.sources.base import ColumnInfo, TableError, TableSchema
from snapshotter.sources.postgres import catalog as pg_catalog
from snapshotter.sources.postgres import setup as pg_setup
from snapshotter.sources.postgres import types as pg_types
from snapshotter.sources.relations import pg_relation_kinds

DEFAULT_SCHEMA = pg_catalog.DEFAULT_SCHEMA

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


@dataclass(frozen=True, slots=True)
class _Relation:
    oid: int
    relkind: str
    root: TableId | None  # for a partition: the partitioned table at the top of its tree
    readable: bool


class PgTables(ABC):
    """The catalog part of :class:`snapshotter.sources.postgres.dialect.PostgresDialect`."""

    publication: str  # the publication the log is read through

    @property
    @abstractmethod
    def engine(self) -> sa.Engine:
        """The SQLAlchemy engine of the catalog connections (the dialect's)."""

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
        raise pg_catalog.missing_table_error(table, PgTables._user(conn))
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

"""Why a name a signal gives is not a table the engine can snapshot: a view, a materialized
view, a foreign table, a sequence, a partition, a table the user cannot read.

Asked once per signal, for all of its names the catalog listing (``Dialect.list_tables``)
lacks, in one query; a name the catalog does not know at all is left out (the caller says
"does not exist").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from signals.names import TableId

_ONLY_TABLES = "only tables can be snapshotted"

_PG_KINDS = {
    "v": f"is a view: {_ONLY_TABLES} (snapshot the tables it reads)",
    "m": f"is a materialized view: {_ONLY_TABLES}",
    "f": f"is a foreign table: {_ONLY_TABLES}",
    "S": f"is a sequence: {_ONLY_TABLES}",
    "i": f"is an index: {_ONLY_TABLES}",
    "I": f"is a partitioned index: {_ONLY_TABLES}",
    "c": f"is a composite type: {_ONLY_TABLES}",
    "t": f"is a TOAST table: {_ONLY_TABLES}",
}

_MY_KINDS = {
    "VIEW": f"is a view: {_ONLY_TABLES} (snapshot the tables it reads)",
    "SYSTEM VIEW": f"is a system view: {_ONLY_TABLES}",
    "SEQUENCE": f"is a sequence: {_ONLY_TABLES}",
    "TEMPORARY": f"is a temporary table: {_ONLY_TABLES}",
}


def pg_relation_kinds(conn: Connection, tables: Sequence[TableId]) -> Mapping[TableId, str]:
    wanted = [t for t in tables if t.schema is not None]
    if not wanted:
        return {}
    rows = conn.execute(
        sa.text(
            "SELECT n.nspname, c.relname, c.relkind, c.relispartition, "
            "  has_schema_privilege(n.oid, 'USAGE') AND has_table_privilege(c.oid, 'SELECT') "
            "    AS readable, "
            "  (SELECT format('%I.%I', pn.nspname, p.relname) FROM pg_catalog.pg_inherits i "
            "     JOIN pg_catalog.pg_class p ON p.oid = i.inhparent "
            "     JOIN pg_catalog.pg_namespace pn ON pn.oid = p.relnamespace "
            "    WHERE i.inhrelid = c.oid LIMIT 1) AS parent "
            "FROM pg_catalog.pg_class c "
            "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            "WHERE (n.nspname, c.relname) IN "
            "  (SELECT * FROM unnest(CAST(:schemas AS text[]), CAST(:names AS text[])))"
        ),
        {"schemas": [t.schema for t in wanted], "names": [t.table for t in wanted]},
    )
    out: dict[TableId, str] = {}
    for row in rows:
        table = TableId(row.nspname, row.relname)
        if row.relkind in ("r", "p"):
            if row.relispartition:
                out[table] = (
                    f"is a partition of {row.parent}: snapshot the partitioned table "
                    f"{row.parent} instead"
                )
            elif not row.readable:
                out[table] = (
                    "exists, but the source user cannot read it: GRANT USAGE on its schema "
                    "and SELECT on it"
                )
        else:
            out[table] = _PG_KINDS.get(row.relkind, f"is not a table (relkind {row.relkind!r})")
    return out


def mysql_relation_kinds(
    conn: Connection, tables: Sequence[TableId], system_schemas: Sequence[str]
) -> Mapping[TableId, str]:
    wanted = {t for t in tables if t.schema is not None}
    if not wanted:
        return {}
    rows = conn.execute(
        sa.text(
            "SELECT TABLE_SCHEMA, TABLE_NAME, TABLE_TYPE FROM information_schema.TABLES "
            "WHERE TABLE_SCHEMA IN :schemas AND TABLE_NAME IN :names"
        ).bindparams(
            sa.bindparam("schemas", expanding=True), sa.bindparam("names", expanding=True)
        ),
        {
            "schemas": sorted({t.schema for t in wanted if t.schema is not None}),
            "names": sorted({t.table for t in wanted}),
        },
    ).all()
    out: dict[TableId, str] = {}
    for schema, name, kind in rows:
        table = TableId(str(schema), str(name))
        if table not in wanted:  # the server may compare names without case
            continue
        if str(schema).lower() in system_schemas:
            out[table] = f"is in the system schema {schema}: {_ONLY_TABLES} of user schemas"
        elif kind != "BASE TABLE":
            out[table] = _MY_KINDS.get(str(kind), f"is a {str(kind).lower()}: {_ONLY_TABLES}")
    return out

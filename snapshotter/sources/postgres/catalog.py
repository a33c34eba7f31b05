"""PostgreSQL catalog basics every setup module uses: quoting (by SQLAlchemy's identifier
preparer, never by string formatting), connections, settings, a table's oid, the server's
version, and SQL literals for the fixes shown to people."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql.base import PGDialect

from signals.names import TableId
from snapshotter.sources.base import TableError

DEFAULT_SCHEMA = "public"  # where an unqualified table name lives
# A preparer that does not double "%" (the psycopg dialect's does, for its pyformat
# placeholders): the statements built here run without parameters and are shown to people.
_PREPARER = PGDialect(paramstyle="named").identifier_preparer  # type: ignore[no-untyped-call]
EngineOrUrl = sa.Engine | sa.URL | str
# --- quoting -------------------------------------------------------------------------------


def quote_name(name: str) -> str:
    """One identifier (role, publication, slot) quoted as PostgreSQL needs."""
    return _PREPARER.quote(name)


def quote_table(table: TableId) -> str:
    """``schema.table`` quoted as PostgreSQL needs (each part only when necessary)."""
    return _PREPARER.format_table(sa.table(table.table, schema=table.schema))


# --- connections ---------------------------------------------------------------------------


def psycopg_url(url: sa.URL | str) -> sa.URL:
    """The URL with the driver snapshotter uses (psycopg 3), whatever scheme it was given."""
    return sa.make_url(url).set(drivername="postgresql+psycopg")


@contextmanager
def _engine(engine_or_url: EngineOrUrl) -> Iterator[sa.Engine]:
    """The given engine, or a temporary one for a URL (disposed afterwards)."""
    if isinstance(engine_or_url, sa.Engine):
        yield engine_or_url
        return
    engine = sa.create_engine(psycopg_url(engine_or_url))
    try:
        yield engine
    finally:
        engine.dispose()


@contextmanager
def _connection(conn_or_engine: sa.Connection | sa.Engine) -> Iterator[sa.Connection]:
    """A connection: the caller's (who commits), or one committed here for an engine."""
    if isinstance(conn_or_engine, sa.Connection):
        yield conn_or_engine
        return
    with conn_or_engine.begin() as conn:
        yield conn


def _setting(conn: sa.Connection, name: str) -> str:
    return str(conn.execute(sa.text("SELECT current_setting(:n)"), {"n": name}).scalar_one())


def table_oid(conn: sa.Connection, table: TableId) -> int | None:
    """The table's OID by exact (case-sensitive) name, or None when there is none."""
    oid = conn.execute(
        sa.text(
            "SELECT c.oid FROM pg_catalog.pg_class c "
            "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = :schema AND c.relname = :table"
        ),
        {"schema": table.schema, "table": table.table},
    ).scalar_one_or_none()
    return None if oid is None else int(oid)


def missing_table_error(table: TableId, user: str) -> TableError:
    return TableError(f"table {table} does not exist or is not visible to user {user}")


def server_version(conn: sa.Connection) -> int:
    """``server_version_num``: 180006 for 18.6."""
    return int(_setting(conn, "server_version_num"))


def _literal(text: str) -> str:
    """A SQL string literal, for fixes shown to people (never executed here)."""
    return "'" + text.replace("'", "''") + "'"

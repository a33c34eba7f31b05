"""The signal table itself: its DDL per dialect, and inserting and reading signal rows.

Uses SQLAlchemy so that the table's schema and name are always quoted by the library.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.schema import CreateTable

from signals.model import Signal, SignalError, Watermark, to_row
from signals.names import TableId
from signals.parser import parse_signal

DEFAULT_SIGNAL_TABLE = "debezium_signal"


def signal_table(name: TableId) -> sa.Table:
    """The Debezium-compatible signal table (``id varchar(42)``, ``type varchar(32)``, ``data``)."""
    return sa.Table(
        name.table,
        sa.MetaData(),
        sa.Column("id", sa.String(42), primary_key=True),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("data", sa.Text, nullable=True),
        schema=name.schema,
    )


def signal_table_ddl(name: TableId, dialect: str | Dialect) -> str:
    """``CREATE TABLE`` for the signal table in ``dialect`` ("postgresql", "mysql", ...)."""
    if isinstance(dialect, str):
        dialect = _dialect(dialect)
    return str(CreateTable(signal_table(name)).compile(dialect=dialect)).strip()


def _dialect(name: str) -> Dialect:
    from sqlalchemy.dialects import mysql, postgresql

    dialects: dict[str, type[Dialect]] = {
        "postgresql": postgresql.dialect,
        "mysql": mysql.dialect,
        "mariadb": mysql.dialect,
    }
    try:
        return dialects[name]()
    except KeyError:
        raise ValueError(
            f"no signal-table DDL for dialect {name!r}; known: {', '.join(dialects)}"
        ) from None


def create_signal_table(conn: Connection, name: TableId) -> bool:
    """Create the signal table unless it exists; returns whether it was created."""
    table = signal_table(name)
    if sa.inspect(conn).has_table(table.name, schema=table.schema):
        return False
    table.create(conn)
    return True


def new_signal_id() -> str:
    return str(uuid.uuid4())


def insert_signal(conn: Connection, name: TableId, signal: Signal | Watermark) -> str:
    """Insert ``signal`` as a row of the signal table; returns its id. The caller commits."""
    sid, stype, data = to_row(signal)
    conn.execute(sa.insert(signal_table(name)).values(id=sid, type=stype, data=data))
    return sid


def read_signals(
    conn: Connection, name: TableId, ids: Sequence[str] | None = None
) -> list[Signal | Watermark | SignalError]:
    """Read and parse rows of the signal table (all, or those with the given ids)."""
    table = signal_table(name)
    query = sa.select(table.c.id, table.c.type, table.c.data).order_by(table.c.id)
    if ids is not None:
        query = query.where(table.c.id.in_(list(ids)))
    return [parse_signal(r.id, r.type, r.data) for r in conn.execute(query)]

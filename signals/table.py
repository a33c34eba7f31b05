"""The signal table itself: its DDL per dialect, inserting signal rows and cleaning up
watermark rows.

Uses SQLAlchemy so that the table's schema and name are always quoted by the library.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.schema import CreateTable

from signals.model import Signal, SignalType, Watermark, WatermarkKind, to_row
from signals.names import TableId


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
    """Insert ``signal`` as a row of the signal table; returns its id. The caller commits.

    A watermark's id belongs to the engine's window, so a row someone else inserted with that
    id (a forged watermark) is overwritten rather than failing the engine's insert: the log
    then carries an update, which the engine does not act on, while the forged row, earlier
    in the log, made it give that window up (``snapshotter.core.window``). Without a
    conflict it is a plain insert."""
    sid, stype, data = to_row(signal)
    table = signal_table(name)
    values = {"id": sid, "type": stype, "data": data}
    dialect = conn.dialect.name
    if isinstance(signal, Watermark) and dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        pg = pg_insert(table).values(**values)
        conn.execute(
            pg.on_conflict_do_update(
                index_elements=[table.c.id],
                set_={"type": pg.excluded.type, "data": pg.excluded.data},
            )
        )
    elif isinstance(signal, Watermark) and dialect in ("mysql", "mariadb"):
        from sqlalchemy.dialects.mysql import insert as my_insert

        my = my_insert(table).values(**values)
        conn.execute(my.on_duplicate_key_update(type=my.inserted.type, data=my.inserted.data))
    else:
        conn.execute(sa.insert(table).values(**values))
    return sid


# --- watermark cleanup (snapshotter.engine.signal_cleanup) ---------------------------------

WATERMARK_TYPES = (SignalType.WINDOW_OPEN.value, SignalType.WINDOW_CLOSE.value)


def delete_watermarks(conn: Connection, name: TableId, window_ids: Sequence[str]) -> int:
    """Delete the open and close rows of these windows: only rows of a watermark type whose
    id is exactly ``<window>-open`` or ``<window>-close``, so no user signal is ever touched.
    Returns how many rows went. The caller commits."""
    if not window_ids:
        return 0
    table = signal_table(name)
    ids = [Watermark(w, kind).id for w in window_ids for kind in WatermarkKind]
    result = conn.execute(
        sa.delete(table).where(table.c.id.in_(ids), table.c.type.in_(WATERMARK_TYPES))
    )
    return int(result.rowcount)


def watermark_rows(
    conn: Connection, name: TableId, after: str | None, limit: int
) -> list[tuple[str, str]]:
    """``(id, type)`` of up to ``limit`` rows of a watermark type with an id above ``after``,
    in id order (a sweep over the table, one page per call)."""
    table = signal_table(name)
    query = sa.select(table.c.id, table.c.type).where(table.c.type.in_(WATERMARK_TYPES))
    if after is not None:
        query = query.where(table.c.id > after)
    return [(r.id, r.type) for r in conn.execute(query.order_by(table.c.id).limit(limit))]

"""A whole PostgreSQL table read row by row in the value model, with the chunk reader's
loaders: what ``snapshotter verify`` compares the sink's output with."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
from psycopg import pq, sql
from psycopg.rows import tuple_row

from signals.names import TableId
from snapshotter.sources.postgres import types as pg_types

_TEXT_OID = 25  # what pg_types.OUTPUT_TEXT returns


def read_table_rows(
    conn: psycopg.Connection[Any],
    table: TableId,
    columns: Sequence[tuple[str, int]],
    *,
    batch: int = 5000,
) -> Iterator[dict[str, Any]]:
    """Every row of ``table`` in the value model, read as the engine reads chunks.

    ``columns`` are (name, type OID) pairs. Open the connection with
    ``context=pg_types.LoadContext()``; a connection whose loaders differ from the engine's
    for these columns is refused. Columns without a native loader are read as the text of
    their type's output function (``pg_types.OUTPUT_TEXT``), as the chunk reader does, and JSON
    becomes :class:`RawJson` through ``pg_types.finish_value``. Rows are streamed through a
    cursor, in no particular order. Errors in the arguments are raised at the call.
    """
    if table.schema is None:
        raise ValueError(f"table {table} has no schema")
    # What matters is that every value loads as in the engine: check the loaders this query
    # uses (psycopg's defaults agree for these types; a connection-level customisation would
    # not, and would make the check compare something else than what the engine emits).
    engine = pg_types.adapters()
    for name, oid in columns:
        loaded_as = oid if pg_types.loaded_natively(oid) else _TEXT_OID
        mine = conn.adapters.get_loader(loaded_as, pq.Format.TEXT)
        if mine is not engine.get_loader(loaded_as, pq.Format.TEXT):
            raise ValueError(
                f"column {name!r} would not load as the engine loads it: open the connection "
                "with context=snapshotter.sources.postgres.types.LoadContext()"
            )
    selected = sql.SQL(", ").join(
        sql.Identifier(name)
        if pg_types.loaded_natively(oid)
        else sql.SQL(pg_types.OUTPUT_TEXT + " AS {0}").format(sql.Identifier(name))
        for name, oid in columns
    )
    query = sql.SQL("SELECT {} FROM {}").format(selected, sql.Identifier(table.schema, table.table))
    return _stream(conn, query, columns, batch)


def _stream(
    conn: psycopg.Connection[Any],
    query: sql.Composed,
    columns: Sequence[tuple[str, int]],
    batch: int,
) -> Iterator[dict[str, Any]]:
    names = [name for name, _ in columns]
    oids = [oid for _, oid in columns]
    # Streamed, not a server-side cursor: psycopg's FETCH sends its row count as a bound
    # literal, and a LoadContext connection has loaders only (no dumpers). libpq 17+ can
    # stream in chunks, which is much faster than row by row.
    size = batch if pq.version() >= 170000 else 1
    with conn.cursor(row_factory=tuple_row) as cur:
        for record in cur.stream(query, size=size):
            yield {
                name: pg_types.finish_value(oid, v)
                for name, oid, v in zip(names, oids, record, strict=True)
            }

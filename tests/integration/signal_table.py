"""Reading the signal table back, for tests (the engine reads signal rows from the log)."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from signals import Signal, SignalError, TableId, Watermark, parse_signal
from signals.table import signal_table


def read_signals(
    conn: Connection, name: TableId, ids: Sequence[str] | None = None
) -> list[Signal | Watermark | SignalError]:
    """Read and parse rows of the signal table (all, or those with the given ids)."""
    table = signal_table(name)
    query = sa.select(table.c.id, table.c.type, table.c.data).order_by(table.c.id)
    if ids is not None:
        query = query.where(table.c.id.in_(list(ids)))
    return [parse_signal(r.id, r.type, r.data) for r in conn.execute(query)]

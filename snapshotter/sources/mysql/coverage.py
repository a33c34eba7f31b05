"""Whether the binlog carries the signal table and the captured tables.

The binlog carries every database's changes unless the server filters it: ``binlog-do-db``
(only those databases) or ``binlog-ignore-db`` (all but those), server options that SHOW
BINARY LOG STATUS reports. With ROW events a change is filtered by the database of the table
it changes. A filtered signal table means no signal and no watermark row reaches the engine
(a snapshot would wait forever); a filtered captured table, changes missing from the output.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from signals.names import TableId


def binlog_filters(conn: sa.Connection) -> tuple[list[str], list[str]]:
    """``(Binlog_Do_DB, Binlog_Ignore_DB)`` as the server reports them; ([], []) when binary
    logging is off or the server does not say (the binlog checks say the rest)."""
    for statement in ("SHOW BINARY LOG STATUS", "SHOW MASTER STATUS"):
        try:
            result = conn.exec_driver_sql(statement)
        except sa.exc.ProgrammingError:
            continue
        row = result.mappings().first()
        if row is None:
            return [], []
        return _names(row.get("Binlog_Do_DB")), _names(row.get("Binlog_Ignore_DB"))
    return [], []


def _names(value: object) -> list[str]:
    return [n.strip() for n in str(value or "").split(",") if n.strip()]


def filter_problems(
    do_db: Sequence[str], ignore_db: Sequence[str], signal_table: TableId, tables: Sequence[TableId]
) -> list[str]:
    """One line per database whose changes the binlog filters leave out, for the signal
    table first, then the captured tables."""
    ignored: dict[str, list[TableId]] = {}
    for table in dict.fromkeys((signal_table, *tables)):
        database = str(table.schema)
        left_out = database not in do_db if do_db else database in ignore_db
        if left_out:
            ignored.setdefault(database, []).append(table)
    out = []
    for database, held in ignored.items():
        rule = (
            f"binlog-do-db lists only {', '.join(do_db)}"
            if do_db
            else f"binlog-ignore-db lists {database}"
        )
        fix = (
            f"add binlog-do-db = {database} to the server's my.cnf"
            if do_db
            else f"take binlog-ignore-db = {database} out of the server's my.cnf"
        )
        cost = (
            "no signal and no snapshot watermark reaches the engine"
            if signal_table in held
            else "their changes are missing from the output"
        )
        out.append(
            f"the binlog leaves out database {database} ({rule}), which holds "
            f"{', '.join(map(str, held))}: {cost}; {fix} and restart the server"
        )
    return out


def coverage_problems(
    engine: sa.Engine, signal_table: TableId, tables: Sequence[TableId]
) -> list[str]:
    with engine.connect() as conn:
        do_db, ignore_db = binlog_filters(conn)
    return filter_problems(do_db, ignore_db, signal_table, tables)

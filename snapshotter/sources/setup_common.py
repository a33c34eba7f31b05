"""What every source's setup shares: a problem ``snapshotter init`` reports with its fix, the
error of a capture that cannot be set up, and the tables ``source.tables`` selects."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import sqlalchemy as sa

from signals.names import TableId, TablePattern, parse_table_selector
from snapshotter.sources.base import Dialect, TableError

Severity = Literal["error", "warning"]


class SetupError(Exception):
    """Capture cannot be set up as configured; the message says what to run."""


@dataclass(frozen=True, slots=True)
class Problem:
    """A prerequisite that is not met, with the exact statement or setting that fixes it."""

    what: str
    fix: str
    severity: Severity = "error"

    def __str__(self) -> str:
        return f"{self.severity}: {self.what}\n  fix: {self.fix}"


def drop_table_if_exists(engine: sa.Engine, table: sa.Table) -> bool:
    """Drop a table ``init`` made (``teardown``: the signal table, the notification table) if
    it exists; whether it existed."""
    with engine.begin() as conn:
        if not sa.inspect(conn).has_table(table.name, schema=table.schema):
            return False
        table.drop(conn)
        return True


def resolve_tables(dialect: Dialect, patterns: Sequence[str], default_schema: str) -> list[TableId]:
    """The tables that configured names and patterns select, in the order given, each once.

    An exact name must exist (TableError otherwise); a pattern may match nothing yet.
    """
    available = dialect.list_tables()
    known = set(available)
    out: dict[TableId, None] = {}
    for text in patterns:
        selector = parse_table_selector(text)
        if isinstance(selector, TablePattern):
            out.update(dict.fromkeys(t for t in available if selector.matches(t)))
            continue
        table = selector.with_default_schema(default_schema)
        if table not in known:
            raise TableError(f"table {table} (from {text!r}) does not exist or is not readable")
        out[table] = None
    return list(out)


def captured_by(
    patterns: Sequence[str], default_schema: str, signal_table: TableId
) -> Callable[[TableId], bool]:
    """Whether a table the log names is captured: the signal table, or a table
    ``source.tables`` selects (a log reader drops the changes of every other table)."""
    selectors = [
        s.with_default_schema(default_schema) if isinstance(s, TableId) else s
        for s in map(parse_table_selector, patterns)
    ]

    def captured(table: TableId) -> bool:
        return table == signal_table or any(
            s == table if isinstance(s, TableId) else s.matches(table) for s in selectors
        )

    return captured

"""SQL text for Spanner's two dialects: quoted names, parameters, key-range predicates.

Google's client library builds no SQL, so names are quoted here: GoogleSQL with backticks
(a backtick or backslash inside escaped), the PostgreSQL dialect by SQLAlchemy's PostgreSQL
quoting. Values are always parameters (``@p1`` in GoogleSQL, ``$1`` in PostgreSQL), each
with its column's Spanner type.

Spanner compares no row values (``(a, b) > (@x, @y)`` is refused in both dialects), so a
key range is written out: ``k1 > a1 OR (k1 = a1 AND k2 > a2) ...``, with a leading bound on
the first key column so the range is one scan of the key. Rows are ordered by the key, the
way the primary key stores them (key columns that allow NULL are refused before a snapshot
starts: a NULL would not compare).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.dialects import postgresql

from signals.names import TableId
from snapshotter.sources.spanner.client import SpannerDialectKind
from snapshotter.sources.spanner.types import SpannerType, key_binding, param_type

DEFAULT_SCHEMA = "public"


_PG_PREPARER = postgresql.dialect().identifier_preparer  # type: ignore[no-untyped-call]


def quote(dialect: SpannerDialectKind, name: str) -> str:
    if dialect is SpannerDialectKind.POSTGRESQL:
        return str(_PG_PREPARER.quote_identifier(name))
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def table_ref(dialect: SpannerDialectKind, table: TableId) -> str:
    """The table as a query names it (GoogleSQL's default schema has no name)."""
    name = quote(dialect, table.table)
    if table.schema in (None, DEFAULT_SCHEMA) and dialect is SpannerDialectKind.GOOGLESQL:
        return name
    return f"{quote(dialect, table.schema or DEFAULT_SCHEMA)}.{name}"


def mutation_table(table: TableId) -> str:
    """The table as mutations and the Read API name it."""
    if table.schema in (None, DEFAULT_SCHEMA):
        return table.table
    return f"{table.schema}.{table.table}"


class Statement:
    """SQL text with its parameters, built in one dialect."""

    def __init__(self, dialect: SpannerDialectKind) -> None:
        self.dialect = dialect
        self.params: dict[str, Any] = {}
        self.types: dict[str, Any] = {}

    def param(self, value: Any, type_: Any) -> str:
        n = len(self.params) + 1
        name = f"p{n}"
        self.params[name] = value
        self.types[name] = type_
        return f"${n}" if self.dialect is SpannerDialectKind.POSTGRESQL else f"@{name}"

    def name(self, column: str) -> str:
        return quote(self.dialect, column)


def _compare(st: Statement, column: str, t: SpannerType, op: str, value: Any) -> str:
    return f"{st.name(column)} {op} {st.param(key_binding(t, value), param_type(t))}"


def key_after(
    st: Statement, columns: Sequence[str], types: Sequence[SpannerType], key: Sequence[Any]
) -> str:
    """``key columns > key``, written out."""
    return _expanded(st, columns, types, key, ">", inclusive=False)


def key_upto(
    st: Statement, columns: Sequence[str], types: Sequence[SpannerType], key: Sequence[Any]
) -> str:
    """``key columns <= key``, written out."""
    return _expanded(st, columns, types, key, "<", inclusive=True)


def _expanded(
    st: Statement,
    columns: Sequence[str],
    types: Sequence[SpannerType],
    key: Sequence[Any],
    op: str,
    *,
    inclusive: bool,
) -> str:
    alternatives = []
    for i in range(len(columns)):
        equal = [_compare(st, columns[j], types[j], "=", key[j]) for j in range(i)]
        alternatives.append(" AND ".join([*equal, _compare(st, columns[i], types[i], op, key[i])]))
    if inclusive:
        alternatives.append(
            " AND ".join(
                _compare(st, c, t, "=", v) for c, t, v in zip(columns, types, key, strict=True)
            )
        )
    lead = _compare(st, columns[0], types[0], op + "=", key[0])
    return f"{lead} AND (" + " OR ".join(f"({a})" for a in alternatives) + ")"


def order_by(st: Statement, columns: Sequence[str], *, descending: bool = False) -> str:
    direction = "DESC" if descending else "ASC"
    return ", ".join(f"{st.name(c)} {direction}" for c in columns)


def int64() -> Any:
    """Spanner's INT64 parameter type (a LIMIT, an OFFSET, a count)."""
    from google.cloud.spanner_v1 import param_types

    return param_types.INT64

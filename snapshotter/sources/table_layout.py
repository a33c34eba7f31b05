"""Whether an existing table has the layout snapshotter would give it.

``init`` adopts an existing signal table or notification table only when its columns are the
ones the engine writes (Debezium's signal table: ``id``, ``type``, ``data``; the notification
table's six columns). A user table that merely carries the configured name (``[notifications]
table = "public.orders"``) is refused with the fix, never written into or dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa


def _kind(type_: Any) -> str:
    """What a column's type holds, as far as the engine's writes care: text, an integer, or
    the type's own name."""
    if isinstance(type_, sa.String):  # VARCHAR, CHAR, TEXT, MEDIUMTEXT, ...
        return "text"
    if isinstance(type_, sa.Integer):  # SMALLINT, INTEGER, BIGINT, ...
        return "integer"
    return str(type_).lower()


def _length(type_: Any) -> int | None:
    length = getattr(type_, "length", None)
    return length if isinstance(length, int) else None


def _fills_itself(column: Mapping[str, Any]) -> bool:
    """Whether the database gives the column its value (serial, identity, AUTO_INCREMENT)."""
    return bool(
        column.get("identity") or column.get("default") or column.get("autoincrement") is True
    )


def layout_problems(conn: sa.Connection, expected: sa.Table) -> list[str]:
    """How the existing table ``expected.schema.expected.name`` differs from ``expected``:
    missing or extra columns, a column of another kind (text, integer) or too short for
    what the engine writes, another primary key, a key the engine does not fill that the
    database must. [] when the engine can write it as it writes a table it made."""
    inspector = sa.inspect(conn)
    fold = conn.dialect.name in ("mysql", "mariadb")  # column names are case-insensitive

    def name(text: str) -> str:
        return text.lower() if fold else text

    found = {
        name(c["name"]): c for c in inspector.get_columns(expected.name, schema=expected.schema)
    }
    wanted = {name(c.name): c for c in expected.columns}
    problems = []
    missing = [n for n in wanted if n not in found]
    extra = [n for n in found if n not in wanted]
    if missing:
        problems.append(f"no column {', '.join(missing)}")
    if extra:
        problems.append(f"columns the layout does not have: {', '.join(extra)}")
    for key, column in wanted.items():
        have = found.get(key)
        if have is None:
            continue
        if _kind(have["type"]) != _kind(column.type):
            problems.append(
                f"column {key} is {str(have['type']).lower()}, not {_kind(column.type)}"
            )
            continue
        need, length = _length(column.type), _length(have["type"])
        if need is not None and length is not None and length < need:
            problems.append(f"column {key} holds {length} characters, not {need}")
    pk = [
        name(c)
        for c in inspector.get_pk_constraint(expected.name, schema=expected.schema)[
            "constrained_columns"
        ]
    ]
    want_pk = [name(c.name) for c in expected.primary_key.columns]
    if pk != want_pk:
        shown = f"({', '.join(pk)})" if pk else "none"
        problems.append(f"primary key {shown}, not ({', '.join(want_pk)})")
    for key, column in wanted.items():
        have = found.get(key)
        fills = column.identity is not None or column.autoincrement is True
        if have is not None and fills and not _fills_itself(have):
            problems.append(f"column {key} is not filled by the database (serial or identity)")
    return problems


def describe_layout(table: sa.Table) -> str:
    """The layout as people read it: ``id text(42) primary key, type text(32), data text``."""
    parts = []
    for column in table.columns:
        length = _length(column.type)
        text = _kind(column.type) + (f"({length})" if length else "")
        parts.append(f"{column.name} {text}" + (" primary key" if column.primary_key else ""))
    return ", ".join(parts)

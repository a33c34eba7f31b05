"""The chunk SQL (``sql_common.ChunkQueries``) as MySQL and MariaDB range-scan it, and the
server's time limit of one statement.

The chunk predicate is the OR-expanded key comparison with a leading bound on the first
key column, ``k1 >= ? AND (k1 > ? OR (k1 = ? AND k2 > ?))``: MariaDB reads a row-value
comparison ``(k1, k2) > (?, ?)`` as a scan of the whole index, MySQL and MariaDB both turn
this form into one index range (``type = range`` in EXPLAIN, tested). Key values are bound
parameters, compared by the database in the column's own collation, so paging under a
case-insensitive or PAD SPACE collation follows the index.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from snapshotter.core.keys import Key
from snapshotter.sources.base import ColumnInfo, TableSchema
from snapshotter.sources.mysql import types as my_types
from snapshotter.sources.sql_common import ChunkQueries, sa_table


def timed_select(sql: str, timeout_s: float, mariadb: bool) -> str:
    """The SELECT ``sql`` with the server's time limit for that one statement: MariaDB's
    ``SET STATEMENT max_statement_time = <s> FOR``, MySQL's ``MAX_EXECUTION_TIME(<ms>)``
    hint (the statement's own: a filter cannot change it)."""
    if mariadb:
        return f"SET STATEMENT max_statement_time = {timeout_s:.3f} FOR {sql}"
    head, sep, rest = sql.partition(" ")
    if head.upper() != "SELECT" or not sep:
        raise ValueError(f"not a SELECT: {sql[:40]!r}")
    milliseconds = max(1, round(timeout_s * 1000))
    return f"SELECT /*+ MAX_EXECUTION_TIME({milliseconds}) */ {rest}"


class MyChunkQueries(ChunkQueries):
    """The chunk SQL (``sql_common.ChunkQueries``) as MySQL and MariaDB range-scan it."""

    def __init__(
        self,
        schema: TableSchema,
        key_columns: Sequence[str],
        floats: frozenset[str],
        enums: frozenset[int] = frozenset(),
    ) -> None:
        super().__init__(schema, key_columns)
        self.floats = floats  # FLOAT columns (``my_types.selects_as_double``)
        self.enums = enums  # the positions of ENUM key columns (``key_bound``)

    def output(self, column: ColumnInfo) -> sa.ColumnElement[Any]:
        return select_output(self.table, column, self.floats)

    def key_range(self, prefix: str, lower: bool) -> sa.ColumnElement[bool]:
        bound: sa.ColumnElement[bool] = key_bound(self.keys, prefix, lower, self.enums)
        return bound

    def count(self, name: str) -> sa.BindParameter[Any]:
        return sa.bindparam(name)


def select_output(
    table: sa.TableClause, column: ColumnInfo, floats: frozenset[str]
) -> sa.ColumnElement[Any]:
    """FLOAT as DOUBLE (exact, as the binlog has it); every other column as is."""
    raw = table.c[column.name]
    if column.name in floats:
        return sa.cast(raw, sa.Double()).label(column.name)
    return raw


def select_all(schema: TableSchema, floats: frozenset[str]) -> sa.Select[Any]:
    """Every row, every column as the chunk query selects it (``reads.scan``)."""
    table = sa_table(schema)
    return sa.select(*(select_output(table, c, floats) for c in schema.columns)).select_from(table)


def key_bound(
    columns: Sequence[sa.ColumnClause[Any]],
    prefix: str,
    lower: bool,
    enums: frozenset[int] = frozenset(),
) -> Any:
    """``(k1, .., kn) > (:a0, ..)`` (lower) or ``<= (:u0, ..)`` (upper), written so MySQL and
    MariaDB range-scan the key's index: a plain bound on the first column, AND the
    lexicographic comparison expanded into ORs.

    The key columns at positions ``enums`` are ENUMs: their index orders by member index,
    which neither a text nor a number comparison range-scans, so ``e > :a0`` is written
    ``e IN :a0_gt``, the members above the bound (``my_types.KeyBinding.enum_params``)."""
    strict, last = (">", ">") if lower else ("<", "<=")

    def compare(i: int, op: str) -> Any:
        if i in enums:
            return columns[i].op("IN")(sa.bindparam(f"{prefix}{i}{my_types.ENUM_LISTS[op]}"))
        return columns[i].op(op)(sa.bindparam(f"{prefix}{i}"))

    if len(columns) == 1:
        return compare(0, last)
    alternatives = []
    for i in range(len(columns)):
        equal = [columns[j] == sa.bindparam(f"{prefix}{j}") for j in range(i)]
        op = last if i == len(columns) - 1 else strict
        alternatives.append(sa.and_(*equal, compare(i, op)))
    leading = compare(0, ">=" if lower else "<=")
    return sa.and_(leading, sa.or_(*alternatives))


def key_params(
    bindings: Sequence[my_types.KeyBinding], after: Key | None, upto: Key
) -> dict[str, Any]:
    """The key range's parameters: ``u<i>`` the upper key, ``a<i>`` the lower one, each
    value as its column compares in the index's order (``my_types.KeyBinding``)."""
    params: dict[str, Any] = {}
    for prefix, key in (("u", upto), ("a", after)):
        for i, (binding, value) in enumerate(zip(bindings, key or (), strict=False)):
            name = f"{prefix}{i}"
            if binding.members is not None:
                params.update(binding.enum_params(name, value))
            else:
                params[name] = value if binding.to_param is None else binding.to_param(value)
    return params

"""The position-guarded merge of a batch's latest events into a current-state table, as the
clauses of a MERGE (Delta's ``DeltaTable.merge``, Spark's ``DataFrame.mergeInto`` for DSv2
tables such as Iceberg's): the target is ``t`` (Delta's alias; for ``mergeInto``, the
table's quoted name), the batch's latest event per key ``s`` (its alias; the rows of
``latest.reduce_latest(..., keep_deletes=True, restarted=RESTARTED)``).

The rule: a row is updated or deleted only by an event with a higher ``__pos``, so merging a
batch again matches nothing; a key the target does not have is inserted unless deleted.
Unchanged TOAST values (``__unavailable``) keep the target's value, unless the key was
deleted in the batch before its latest event (the target's row is then of another life)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from snapshotter.sinks.spark.latest import RESTARTED, all_of, no_columns, quote, reduce_latest
from snapshotter.sinks.spark.types import OP, POS, UNAVAILABLE

if TYPE_CHECKING:
    from snapshotter.sinks.spark.lander import TableMeta


@dataclass(frozen=True)
class MergeClauses:
    on: Column  # the key columns equal
    delete_when: Column  # matched: delete
    update_when: Column  # matched: update with ``updates``
    updates: dict[str, str | Column]
    insert_when: Column  # not matched: insert ``inserts``
    inserts: dict[str, str | Column]


def position_merge(
    keys: Sequence[str],
    columns: Sequence[str],
    unavailable_columns: Sequence[str],
    *,
    target: str = "t",
    source: str = "s",
    bounds: Mapping[str, tuple[Any, Any]] | None = None,
) -> MergeClauses:
    """The clauses for landed ``columns`` (the batch's, without ``RESTARTED``) keyed by
    ``keys``; ``unavailable_columns``: those ever landed unavailable for the table.
    ``target`` and ``source``: how the merge names the two sides (already quoted).
    ``bounds``: per key column, the lowest and highest value the batch has (``key_bounds``)."""

    def _t(column: str) -> Column:
        return F.col(f"{target}.{quote(column)}")

    def _s(column: str) -> Column:
        return F.col(f"{source}.{quote(column)}")

    on = all_of([_t(k) == _s(k) for k in keys])
    for key, (low, high) in (bounds or {}).items():
        # On the target alone: Delta and Iceberg skip the files whose statistics for the
        # key lie outside the batch's keys (changes to recent keys read recent files only).
        on = on & _t(key).between(F.lit(low), F.lit(high))
    newer = _t(POS) < _s(POS)
    is_delete = _s(OP) == "d"
    restarted = _s(RESTARTED)
    s_missing = F.coalesce(_s(UNAVAILABLE), no_columns())
    updates: dict[str, str | Column] = {}
    for c in columns:
        value = _s(c)
        if c in unavailable_columns:
            missing = F.array_contains(s_missing, F.lit(c)) & ~restarted
            value = F.when(missing, _t(c)).otherwise(value)
        updates[quote(c)] = value
    if unavailable_columns:
        # Still unavailable: what the event lacked and the target's row lacked too.
        t_missing = F.coalesce(_t(UNAVAILABLE), no_columns())
        still = F.when(restarted, s_missing).otherwise(F.array_intersect(s_missing, t_missing))
        updates[quote(UNAVAILABLE)] = F.when(F.size(still) > 0, still).cast("array<string>")
    inserts: dict[str, str | Column] = {quote(c): _s(c) for c in columns}
    return MergeClauses(
        on=on,
        delete_when=is_delete & newer,
        update_when=~is_delete & newer,
        updates=updates,
        insert_when=~is_delete,
        inserts=inserts,
    )


def key_bounds(files: Sequence[Path], keys: Sequence[str]) -> dict[str, tuple[Any, Any]]:
    """Per key column of an integer, string or date type, the lowest and highest value in the
    staged ``files`` (read from their key columns alone): a match lies within them. Other
    types are left out (a timestamp or decimal literal compares by Spark's casts, which need
    not be the column's own order)."""
    if not files or any(f.is_dir() for f in files):
        return {}
    tables = [pq.read_table(f, columns=list(keys)) for f in files]
    rows = tables[0] if len(tables) == 1 else pa.concat_tables(tables, promote_options="default")
    bounds: dict[str, tuple[Any, Any]] = {}
    for key in keys:
        column = rows.column(key)
        kind = column.type
        if not (pa.types.is_integer(kind) or pa.types.is_string(kind) or pa.types.is_date32(kind)):
            continue
        found = pc.min_max(column)
        low, high = found["min"].as_py(), found["max"].as_py()
        if low is not None and high is not None:
            bounds[key] = (low, high)
    return bounds


def latest_changes(
    batch: DataFrame,
    meta: TableMeta,
    truncated_at: str | None,
    *,
    target: str = "t",
    source: str = "s",
    bounds: Mapping[str, tuple[Any, Any]] | None = None,
) -> tuple[DataFrame, MergeClauses]:
    """A landing's rows as a MERGE's source (per key the latest event, deletes kept) and the
    clauses that merge it into the current state (Delta's and Iceberg's)."""
    changes = reduce_latest(
        batch,
        meta.key_columns,
        meta.unavailable_columns,
        keep_deletes=True,
        after=truncated_at,
        restarted=RESTARTED,
    )
    columns = [c for c in changes.columns if c != RESTARTED]
    clauses = position_merge(
        meta.key_columns,
        columns,
        meta.unavailable_columns,
        target=target,
        source=source,
        bounds=bounds,
    )
    return changes, clauses

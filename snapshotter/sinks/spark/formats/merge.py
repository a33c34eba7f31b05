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

import math
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
    inserted: tuple[str, ...]  # the names ``inserts`` quotes, in its order


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
        inserted=tuple(columns),
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


def split_worthwhile(
    files: Sequence[Path],
    keys: Sequence[str],
    bounds: Mapping[str, tuple[Any, Any]],
    target_bytes: int | None,
) -> bool:
    """Whether a landing's changes (the staged ``files``) are better merged split by presence
    (``split_by_presence``) than by one MERGE into a target of ``target_bytes`` (its data
    files; None: not known): a target of at least ``SPLIT_TARGET_BYTES``, changes small
    enough to send whole to every task reading it (``BROADCAST_BYTES`` uncompressed, by
    their footers), and spread thinly over their key range (``SPREAD``: the box of their
    integer key columns' ranges holds that many keys per change; with no integer key column
    they count as spread). Changes to a narrow range, such as the most recent keys, are left
    to one MERGE: the table's files outside the range are skipped by their statistics, and
    the split's extra reading and commit would cost more than its join saves; so is a small
    target, which one MERGE shuffles cheaply (every landing of a random writer's changes to
    a small table counts as spread: the split's extra jobs and commit made them slower).

    Iceberg's landing asks this; Delta's does not: its MERGE with WHEN MATCHED clauses alone
    still reads the target three times (the files it touches, the rows it rewrites, the
    deletion vectors), so the split measured slower at 1M rows (10.1 -> 12.3 s for 10,000
    spread changes) and no faster at 4M (14.1 -> 13.5 s)."""
    if target_bytes is None or target_bytes < SPLIT_TARGET_BYTES:
        return False
    if not files or any(f.is_dir() for f in files):
        return False
    size = rows = 0
    for f in files:
        meta = pq.ParquetFile(f).metadata
        rows += meta.num_rows
        size += sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    if size > BROADCAST_BYTES:
        return False
    spans = [
        high - low + 1
        for low, high in (bounds.get(key, (None, None)) for key in keys)
        if isinstance(low, int) and isinstance(high, int)
    ]
    if not spans:
        return True
    return math.prod(spans) > SPREAD * max(rows, 1)


# A target smaller than this is merged by one MERGE whatever its changes: 10,000 changes spread
# over a 1M-row table (55 MB of Iceberg data files) landed in 3.6 s by one MERGE and 4.6 s
# split, over a 4M-row one in 8.1 and 5.6 s; the two meet near 1.8M rows, about 100 MB.
SPLIT_TARGET_BYTES = 96 * 1024 * 1024
# A landing's changes up to this size can be sent whole to every task reading the target (a
# broadcast join); a larger one is merged by one MERGE, which shuffles the target's rows.
BROADCAST_BYTES = 64 * 1024 * 1024
# Changes this thinly spread over their key range (integer keys per change) land in files all
# over the table: one MERGE would read and shuffle all of it.
SPREAD = 16


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


def split_by_presence(
    changes: DataFrame,
    target: DataFrame,
    keys: Sequence[str],
    bounds: Mapping[str, tuple[Any, Any]] | None = None,
) -> tuple[DataFrame, DataFrame]:
    """``changes`` (``latest_changes``'s, small: ``split_worthwhile``) split by whether
    ``target`` has their key: (present, new).

    Why: a MERGE with a WHEN NOT MATCHED clause joins its source to the target by an outer
    join that keeps every source row, and Spark broadcasts only the side an outer join does
    not keep; so it shuffled every row of the target to join 10,000 changes (a 4M-row
    Iceberg table: 4M rows shuffled, about 10 s of task time). Here the target's key columns
    alone are read, semi-joined with the changes' keys sent to every task, and the present
    ones kept by the executors (a local checkpoint: the target is read once). The present
    keys then go to a MERGE with only WHEN MATCHED clauses (an inner join, which broadcasts
    a source hinted so: ``F.broadcast``); the new ones are appended (``inserted_rows``)."""
    on_keys = [quote(k) for k in keys]
    # Computed once (the staged files read and reduced per key), not once per use below.
    changes = changes.localCheckpoint(eager=True)
    wanted = F.broadcast(changes.select(*on_keys).alias("w"))
    scanned = target.select(*on_keys)
    for key, (low, high) in (bounds or {}).items():
        scanned = scanned.where(F.col(quote(key)).between(F.lit(low), F.lit(high)))
    found = (
        scanned.alias("f")
        .join(wanted, all_of([F.col(f"f.{k}") == F.col(f"w.{k}") for k in on_keys]), "left_semi")
        .localCheckpoint(eager=True)
    )
    same = all_of([F.col(f"c.{k}") == F.col(f"p.{k}") for k in on_keys])
    side = F.broadcast(found.alias("p"))
    present = changes.alias("c").join(side, same, "left_semi")
    new = changes.alias("c").join(side, same, "left_anti")
    return present, new


def inserted_rows(new: DataFrame, clauses: MergeClauses, source: str = "s") -> DataFrame:
    """The rows the MERGE's WHEN NOT MATCHED clause would insert for ``new`` (keys the target
    does not have): ``clauses.inserts`` where ``insert_when`` holds; ``source``: the name
    the clauses give the source side (already quoted)."""
    rows = new.alias(source.strip("`")).where(clauses.insert_when)
    values = [clauses.inserts[quote(name)] for name in clauses.inserted]
    return rows.select(
        *[
            F.col(v).alias(n) if isinstance(v, str) else v.alias(n)
            for v, n in zip(values, clauses.inserted, strict=True)
        ]
    )

"""Landing into Parquet: each batch's rows into its changelog file, READ rows of new keys
straight into the base (``appends``), written with pyarrow, no Spark job.

The changelog is ``changelog/batch-<N>.parquet`` (``parquet_changelog``): a landing of the
same batch again replaces it, so landing again changes nothing. READ rows of keys the table
never had (``appends.KnownKeys``: a first snapshot's chunks) go into the base as files of
their own (``bases``), bucketed at the next compaction (``formats.parquet``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from signals.names import TableId
from snapshotter.sinks.spark import bases
from snapshotter.sinks.spark.appends import KnownKeys, Plan
from snapshotter.sinks.spark.files import parquet_files
from snapshotter.sinks.spark.formats import parquet_changelog
from snapshotter.sinks.spark.formats import schema_changes as schemas
from snapshotter.sinks.spark.staging import StagedTable
from snapshotter.sinks.spark.types import BEFORE, OP, POS

_LOCAL = pafs.LocalFileSystem()  # the staging directory is on this machine

if TYPE_CHECKING:
    from snapshotter.sinks.spark.lander import Lander, TableMeta


def land(
    lander: Lander,
    table: TableId,
    meta: TableMeta,
    parts: Sequence[tuple[int, StagedTable]],
    lo: int,
    target: pa.Schema | None,
) -> int:
    """Each batch's rows into its changelog file ``batch-<N>.parquet``, replacing what a
    landing of the same batch wrote before (so landing again changes nothing); READ rows
    of keys the table never had also straight into the base (``landing.appends``).
    Written with pyarrow: the staged file already holds the landed schema (no Spark
    job). Returns how many rows went into the base."""
    _drop_appended_from(lander, table, meta, lo, max(seq for seq, _ in parts))
    appended = 0
    # Whether the base holds every row landed so far: then ``base_through`` follows the
    # batches wholly appended, and no tail is read or compacted for them.
    whole = meta.tail_rows == 0 and meta.covered == (meta.landed_through or None)
    for seq, part in parts:
        changelog_dir = lander._fs_path(table, "changelog")
        rows: pa.Table | None = None
        if part.file.is_dir():
            # READ rows read on executors (``remote_reads``: a directory of files in the
            # landed schema): its files' rows as the batch's changelog file, and those of
            # keys the table never had appended to the base, as the engine's own reads are.
            rows = _rows_of(part.file, target)
            if rows is None:  # none: every row read was dropped, and no log row
                lander._known.pop(table, None)
                whole = False
                continue
            parquet_changelog.replace(lander._fs, changelog_dir, seq, rows)
        elif target is None or pq.read_schema(part.file).equals(target, check_metadata=False):
            # Already the changelog's rows: the staged file itself goes in.
            parquet_changelog.replace_with_file(lander._fs, changelog_dir, seq, part.file)
        else:
            rows = schemas.conform(pq.read_table(part.file), target)
            parquet_changelog.replace(lander._fs, changelog_dir, seq, rows)
        known = lander._known.get(table)
        # The plan needs keys, operations and positions only: a third of a snapshot
        # chunk's bytes (names, amounts, ... are read only for the rows it appends).
        keyed = (
            rows
            if rows is not None
            else pq.read_table(part.file, columns=[*part.key_columns, OP, POS])
        )
        plan = None if known is None else known.plan(keyed)
        if known is None or plan is None:
            lander._known.pop(table, None)
            whole = False
            continue
        if plan.appends:
            source = rows if rows is not None else (part.current_file or part.file)
            _append(lander, table, meta, seq, source, plan, parts[0][0])
            appended += plan.appended
        whole = whole and plan.appended == plan.rows
        if whole:
            meta.base_through = seq
        if not known.record(plan.ranges, seq):
            del lander._known[table]  # too many keys of log rows to follow: no more appends
    return appended


def _append(
    lander: Lander,
    table: TableId,
    meta: TableMeta,
    seq: int,
    rows: pa.Table | Path,
    plan: Plan,
    first_seq: int,
) -> None:
    """Write the appends of staged batch ``seq`` (its rows, or a staged file) into the
    base, as a file of their own."""
    data = _appended_rows(rows, plan)
    base = meta.base
    if base is None:
        # The table's first rows in a base: whatever current/ holds is what a crash left
        # before the table's metadata said there was a base.
        lander._fs.delete_dir_contents(lander._fs_path(table, "current"), missing_dir_ok=True)
        base = seq
    if meta.base is None:
        # It holds no batch whole yet. Rows landed before it (log rows of the table
        # before its first READ rows, in earlier batches or earlier in this landing) are
        # not in it: then it covers nothing, and a compaction merges every batch.
        nothing_before = meta.landed_through == 0 and seq == first_seq
        meta.base, meta.base_through = base, (seq - 1 if nothing_before else 0)
        meta.base_dir = bases.base_name_for(seq)
    current = lander._fs_path(table, "current")
    if isinstance(data, Path):
        bases.append_file(lander._fs, current, _named(meta), seq, data)
    else:
        bases.append(lander._fs, current, _named(meta), seq, data)
    meta.base_rows += plan.appended
    meta.appended_through = seq


def _drop_appended_from(lander: Lander, table: TableId, meta: TableMeta, lo: int, hi: int) -> None:
    """Before landing batches ``lo..hi``: take out of the base what an earlier landing
    appended from batch ``lo`` on (a landing retried, or batches landed before the state
    recorded them, staged again after a crash, maybe with other rows), so that nothing
    is in twice. A no-op unless batches from ``lo`` on were landed before."""
    if meta.base is None:
        return
    appended_again = (meta.appended_through or 0) >= lo
    if not appended_again and (meta.covered or 0) < lo:
        return
    current, base = lander._fs_path(table, "current"), _named(meta)
    if appended_again:
        removed = bases.drop_appended(lander._fs, current, base, lo)
        meta.appended_through = lo - 1
        if removed and not bases.files(lander._fs, current, base):  # it held appends only
            bases.remove_strays(lander._fs, current, None, table=table, crashed=False)
            meta.base, meta.base_rows, meta.base_through = None, 0, None
        elif removed:
            meta.base_rows = bases.rows(lander._fs, current, base)
    known = lander._known.get(table)
    if known is not None and meta.landed_through <= hi:
        known.forget_from(lo)  # this landing overwrites every batch landed from lo on
    else:  # batches after hi were landed: their changelog rows stay, merged as a tail
        lander._known.pop(table, None)
    if meta.base is not None:
        # The base holds no batch from ``lo`` on whole any more (a base compacted at such
        # a batch holds events the changelog has too: the tail from ``lo`` is merged).
        meta.base_through = min(meta.covered or 0, lo - 1)
    elif meta.tail_rows == 0 and meta.landed_through <= hi:
        # Nothing landed remains outside what this landing overwrites: fresh again.
        lander._known.setdefault(table, KnownKeys(meta.key_columns))


def _appended_rows(rows: pa.Table | Path, plan: Plan) -> pa.Table | Path:
    """What of a staged part goes into the base: the stager's current-state copy as it is
    (every row of it an append), or the appended rows without before-images (a changelog
    column, not the current state's: not even read from a file)."""
    if isinstance(rows, Path):
        names = pq.read_schema(rows).names
        if BEFORE not in names and plan.appended == plan.rows:
            return rows
        rows = pq.read_table(rows, columns=[n for n in names if n != BEFORE])
    data = rows if plan.appended == rows.num_rows else rows.take(plan.appends)
    return data.drop_columns([BEFORE]) if BEFORE in data.column_names else data


def _rows_of(directory: Path, target: pa.Schema | None) -> pa.Table | None:
    """The rows of a staged directory's files (None: it has none), in one schema: ``target``
    (the table's, when it changed), else all of theirs (the landed schema; a file Spark
    staged has no ``__before``, NULL for READ rows anyway)."""
    tables = [pq.read_table(f) for f in sorted(parquet_files(_LOCAL, str(directory)))]
    if not tables:
        return None
    schema = target or pa.unify_schemas([t.schema for t in tables], promote_options="permissive")
    return pa.concat_tables([schemas.conform(t, schema) for t in tables])


def _named(meta: TableMeta) -> str:
    from snapshotter.sinks.spark.lander import base_name

    name = base_name(meta)
    assert name is not None, "the table has no base"
    return name

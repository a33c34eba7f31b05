"""Parquet ``current/``: a base bucketed by a hash of the key, compacted part by part.

The base is files directly in ``current/``, one or more per bucket: ``<base>.bucket-<i, 5
digits>.parquet`` (part 0) and ``<base>.bucket-<i>.<part, 5 digits>.parquet`` (parts pyarrow
writes, ``parquet_fold``: at most ``PART_ROWS`` rows each, each a range of keys): a key
lives in bucket
``pmod(xxhash64(key columns), N)``, computed by Spark (its ``xxhash64`` of the landed
columns' Spark types) wherever rows are given a bucket: at the first bucketing and at every
compaction, for the base and for the tail alike. ``N`` is ``[sink] buckets``, or, when that
is 0, chosen at the table's first bucketing from its size (a power of two, about
``ROWS_PER_BUCKET`` rows each); it is recorded in ``_snapshotter.json`` and kept for the
table's life.

A compaction reads the changelog tail, finds the buckets its keys fall in, and rewrites only
those (where pyarrow rewrites them, only their parts whose key range holds a changed key, and
their last part: ``parquet_fold.touched_parts``): per touched bucket, its files and its tail
rows merged (``reduce_latest``: per key the
highest ``__pos``, deletes dropped, unavailable TOAST values carried), applied only to the
base rows of keys the tail has (``_folded``: the others are kept by an anti join; for a
tail of up to ``BROADCAST_ROWS``, ``parquet_fold`` copies them with pyarrow instead).
Untouched buckets are neither read nor written; a key's bucket is a hash, so 10,000 changed
keys touch every bucket, but changes to recent keys touch about one part of each, while
changes spread over every part rewrite the table (bench/landing_bench.py:
docs/benchmarks.md).

Replacing buckets so a plain reader never sees a key twice, nor a deleted row back:

1. the touched parts are written hidden, ``current/.compacting-<base>-<tag>/`` (a part left
   with no rows gets an empty file, never a deletion, so a reader that listed the file
   still opens it);
2. the metadata records the compaction as *pending* (the commit: from here on it is rolled
   forward, by ``finish`` now or by ``Lander.take_over`` after a crash);
3. files that the new base supersedes are deleted (another base's, a crash's, READ rows
   appended as files of their own, parts a bucket rewritten whole no longer has); then each
   new part file is renamed over its old one, same name (on a local or POSIX filesystem an
   atomic replacement, a reader opens the old file or the new one, and a key is only ever
   in one part), new parts last;
4. the metadata names the result (``pending`` cleared).

A crash before 2 leaves a hidden directory no metadata names (removed as a stray); after it,
the roll-forward moves what is left of the hidden directory into place. A compaction that
supersedes files (the first bucketing, a table's appended READ rows, an older layout) deletes
them before renaming the buckets in: a reader in between may miss those rows for a moment,
but never reads a key twice.

Such a compaction is *full* (every bucket written): when the base is not bucketed yet (a flat
base of the previous version, a directory of an older layout, or appended files only), when
READ rows were appended as files since, when a truncate landed since the last compaction
(it empties every bucket), when the tail has columns the base has not (every file of a
table keeps one schema, as plain readers take the schema of one file), or when a key
column's type changed (``xxhash64`` hashes by type).
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from signals.names import TableId
from snapshotter.common.faults import failpoint
from snapshotter.sinks.spark import bases
from snapshotter.sinks.spark.files import parquet_files
from snapshotter.sinks.spark.formats import parquet_changelog, parquet_fold
from snapshotter.sinks.spark.latest import all_of, quote, reduce_latest
from snapshotter.sinks.spark.types import BATCH, BEFORE, OP

if TYPE_CHECKING:
    from snapshotter.sinks.spark.lander import Lander, TableMeta

log = logging.getLogger(__name__)

BUCKET = "__snapshotter_bucket"  # the hidden write's partition column (never in a file)
# A bucket is rewritten part by part where pyarrow rewrites it (below), so its size bounds
# only Spark's whole-bucket rewrites; fewer buckets, fewer parts a change of recent keys
# touches (one per bucket).
ROWS_PER_BUCKET = 4_000_000
# The rows of a part file pyarrow writes, at most: what a compaction rewrites per part its
# keys fall in.
PART_ROWS = 128 * 1024
MAX_BUCKETS = 1 << 16
# Reasons for a full compaction (``_full_reason``) that fold the base in row by row.
TRUNCATED = "a truncate landed"
KEY_TYPE_CHANGED = "a key column's type changed"
NOT_BUCKETED = "the base is not bucketed yet"
APPENDED = "READ rows were appended as files"
# Full compactions whose files pyarrow can bucket (``parquet_fold.can_bucket`` says when).
BY_ARROW = (NOT_BUCKETED, APPENDED)
# Tails up to this many rows have their keys broadcast to the compaction's joins.
BROADCAST_ROWS = 2_000_000
_BUCKET_FILE = "bucket-"


def bucket_of(keys: list[str], count: int) -> Column:
    """The bucket of a row: the one hash every bucket assignment uses."""
    return F.pmod(F.xxhash64(*[F.col(quote(k)) for k in keys]), F.lit(count))


def bucket_count(configured: int, rows: int) -> int:
    """``configured``, or (0) a power of two giving about ``ROWS_PER_BUCKET`` rows each."""
    if configured > 0:
        return configured
    count = 1
    while count * ROWS_PER_BUCKET < rows and count < MAX_BUCKETS:
        count *= 2
    return count


def bucket_file_name(base: str, bucket: int, part: int = 0) -> str:
    """A bucket's part file: ``<base>.bucket-<i>.parquet`` for part 0 (the one file of a
    bucket Spark writes), ``<base>.bucket-<i>.<part>.parquet`` for the others."""
    suffix = f".{part:05d}" if part else ""
    return f"{base}.{_BUCKET_FILE}{bucket:05d}{suffix}.parquet"


def file_unit(base: str, name: str) -> tuple[int, int] | None:
    """The (bucket, part) a file of ``current/`` is (None: not a bucket file of ``base``)."""
    prefix, suffix = f"{base}.{_BUCKET_FILE}", ".parquet"
    if not (name.startswith(prefix) and name.endswith(suffix)):
        return None
    bucket, dot, part = name[len(prefix) : -len(suffix)].partition(".")
    if len(bucket) != 5 or not bucket.isdigit():
        return None
    if not dot:
        return int(bucket), 0
    if len(part) == 5 and part.isdigit() and int(part) > 0:
        return int(bucket), int(part)
    return None


def _bucket_index(base: str, name: str) -> int | None:
    """The bucket a file of ``current/`` is in (None: not a bucket file of ``base``)."""
    unit = file_unit(base, name)
    return None if unit is None else unit[0]


def bucket_parts(fs: pafs.FileSystem, current: str, base: str) -> dict[int, dict[int, str]]:
    """The part files of ``base``'s buckets: bucket -> part -> filesystem path."""
    found: dict[int, dict[int, str]] = {}
    for path in bases.files(fs, current, base):
        unit = file_unit(base, _leaf(path))
        if unit is not None:
            found.setdefault(unit[0], {})[unit[1]] = path
    return found


def hidden_part(bucket: int, part: int) -> str:
    """Where a compaction's hidden directory holds a part it wrote."""
    return f"{BUCKET}={bucket}/part-{part:05d}.parquet"


@dataclass
class Pending:
    """A compaction committed but not yet wholly in place (``TableMeta.pending``)."""

    base: str  # the base's name after it
    hidden: str  # the directory under current/ holding the new bucket files
    upto: int  # the last batch it holds
    buckets: int  # the bucket count
    touched: list[int]  # the buckets it replaces
    full: bool  # whether it supersedes every other file of current/
    # The parts it wrote per touched bucket (JSON: the bucket as a string); None: part 0 of
    # each (a compaction recorded before buckets had parts).
    parts: dict[str, list[int]] | None = None
    # Whether it rewrote some parts of its buckets (their other parts kept as they are), not
    # whole buckets (every other part of a touched bucket superseded).
    partial: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def written(self) -> dict[int, list[int]]:
        if self.parts is None:
            return {b: [0] for b in self.touched}
        return {int(b): parts for b, parts in self.parts.items()}


def tail(lander: Lander, table: TableId, meta: TableMeta, upto: int | None) -> DataFrame | None:
    """The changelog rows the base does not hold (up to batch ``upto``), ``__batch`` long."""
    path = f"{lander.table_path(table)}/changelog"
    directory = lander._fs_path(table, "changelog")
    return parquet_changelog.read(lander.spark, path, lander._fs, directory, meta.covered, upto)


def base_rows(lander: Lander, table: TableId, names: list[str]) -> DataFrame | None:
    """The rows of the base files ``names`` (files of ``current/``), ``__batch`` long."""
    if not names:
        return None
    current = f"{lander.table_path(table)}/current"
    rows = lander.spark.read.parquet(*[f"{current}/{n}" for n in names])
    return rows.withColumn(BATCH, F.col(BATCH).cast("long"))


def merged(lander: Lander, meta: TableMeta, parts: list[DataFrame | None]) -> DataFrame:
    present = [p for p in parts if p is not None]
    if not present:  # no base file, no tail batch: an empty state of the landed columns
        raise RuntimeError("nothing landed to merge")
    out = present[0]
    for part in present[1:]:
        out = out.unionByName(part, allowMissingColumns=True)
    return reduce_latest(out, meta.key_columns, meta.unavailable_columns, after=meta.truncated_at)


def _folded(
    lander: Lander, meta: TableMeta, base: DataFrame | None, rows: DataFrame | None
) -> DataFrame:
    """The base's rows (one per key) with the tail (``rows``) folded in: the base's rows of
    keys the tail has not as they are (an anti join against the tail's keys, which Spark
    broadcasts), the others reduced with the tail (``reduce_latest``). The same rows as
    ``merged`` of both, without shuffling and sorting every base row by key (what a
    compaction spent most of its time on: 4M rows, 25 s before, 15 s now)."""
    if base is None or rows is None:
        return merged(lander, meta, [base, rows])
    keys = meta.key_columns
    changed = rows.where(F.col(OP) != "t").select(*[F.col(quote(k)) for k in keys]).distinct()
    changed = F.broadcast(changed) if meta.tail_rows <= BROADCAST_ROWS else changed
    b, c = base.alias("b"), changed.alias("c")
    same = all_of([F.col(f"b.{quote(k)}") == F.col(f"c.{quote(k)}") for k in keys])
    kept = b.join(c, same, "left_anti")  # the left side's columns only
    latest = merged(lander, meta, [b.join(c, same, "left_semi"), rows])
    return kept.unionByName(latest, allowMissingColumns=True)


def _changed_keys(rows: DataFrame, keys: list[str], count: int) -> pa.Table:
    """The tail's distinct keys, each with its bucket (Spark's hash)."""
    keyed = rows.where(F.col(OP) != "t").withColumn(BUCKET, bucket_of(keys, count))
    return keyed.select(*[quote(k) for k in keys], BUCKET).distinct().toArrow()


def _full_reason(
    lander: Lander, table: TableId, meta: TableMeta, rows: DataFrame | None, current: str
) -> str | None:
    """Why this compaction must write every bucket (None: only the touched ones)."""
    name = _base_name(meta)
    if meta.buckets is None or name is None or bases.is_legacy(name):
        return NOT_BUCKETED
    if meta.truncated_at != meta.compacted_truncate:
        return TRUNCATED
    listed = {
        _leaf(p): _bucket_index(name, _leaf(p)) for p in bases.files(lander._fs, current, name)
    }
    if None in listed.values():
        return APPENDED
    if set(listed.values()) != set(range(meta.buckets)):
        return "bucket files are missing"
    if rows is None:
        return None
    base = lander.spark.read.parquet(
        f"{lander.table_path(table)}/current/{bucket_file_name(name, 0)}"
    )
    if set(rows.columns) - set(base.columns) - {BEFORE}:  # __before: the changelog's only
        return "the tail has columns the base has not"
    # xxhash64 hashes by type: a key column of another type puts a key in another bucket.
    if any(rows.schema[k].dataType != base.schema[k].dataType for k in meta.key_columns):
        return KEY_TYPE_CHANGED
    return None


def compact(lander: Lander, table: TableId, meta: TableMeta) -> None:
    """Fold the changelog tail into the bucketed base, rewriting only what it touches."""
    started = time.monotonic()
    # A compaction can take seconds to minutes: said before, not only after.
    log.info(
        "%s: compacting the current state (folding %d changed rows into a base of %d)",
        table,
        meta.tail_rows,
        meta.base_rows,
    )
    upto = meta.landed_through
    path = lander.table_path(table)
    current = lander._fs_path(table, "current")
    rows = tail(lander, table, meta, upto)
    reason = _full_reason(lander, table, meta, rows, current)
    keys = meta.key_columns
    old = _base_name(meta)
    changed: pa.Table | None = None  # the tail's keys, when pyarrow rewrites the buckets
    sources: list[parquet_fold.Source] | None = None  # the files pyarrow rewrites
    state: DataFrame | None = None
    partial = False  # pyarrow rewrites the touched parts of the touched buckets only
    if reason is None:
        assert meta.buckets is not None and old is not None
        count, name = meta.buckets, old
        touched = []
        listing = bucket_parts(lander._fs, current, name) if rows is not None else {}
        if rows is not None:
            if meta.tail_rows <= BROADCAST_ROWS:  # the changed keys, for pyarrow's filters
                changed = _changed_keys(rows, keys, count)
                touched = sorted(set(changed.column(BUCKET).to_pylist()))
                sources = parquet_fold.touched_parts(lander._fs, listing, touched, keys, changed)
                partial = True
            else:
                keyed = rows.where(F.col(OP) != "t").withColumn(BUCKET, bucket_of(keys, count))
                touched = sorted(int(r[0]) for r in keyed.select(BUCKET).distinct().collect())
        if changed is None:
            names = [_leaf(path) for i in touched for path in listing.get(i, {}).values()]
            state = _folded(lander, meta, base_rows(lander, table, names), rows)
    else:
        if meta.buckets is not None and old is not None and not bases.is_legacy(old):
            count, name = meta.buckets, old
        else:
            count = bucket_count(lander.buckets, meta.base_rows + meta.tail_rows)
            name = bases.base_name_for(upto)
            if name == old:
                name += f"-{uuid.uuid4().hex[:8]}"
        touched = list(range(count))
        existing = [] if old is None else _base_files(lander, current, old)
        if reason in BY_ARROW and old is not None and not bases.is_legacy(old):
            paths = [f"{current}/{n}" for n in existing]
            if parquet_fold.can_bucket(lander._fs, paths, keys, rows, count, meta.tail_rows):
                own = old == name
                sources = [
                    parquet_fold.Source(p, _bucket_index(name, _leaf(p)) if own else None, 0)
                    for p in paths
                ]
                changed = _changed_keys(rows, keys, count) if rows is not None else None
        if sources is None:
            base = base_rows(lander, table, existing)
            if reason in (TRUNCATED, KEY_TYPE_CHANGED):  # every base row to filter, or rehash
                state = merged(lander, meta, [base, rows])
            else:  # one row per key in the base: a compaction's, or READ rows of new keys
                state = _folded(lander, meta, base, rows)
    hidden = f"{bases.WRITING}{name}-{uuid.uuid4().hex[:8]}"
    written = {b: [0] for b in touched}
    if sources and touched:
        where = (f"{path}/current/{hidden}", f"{current}/{hidden}")
        written = parquet_fold.write(
            lander, meta, sources, touched, (changed, rows), where, (BUCKET, count), partial
        )
    elif touched:
        assert state is not None
        # ``__batch`` bigint, as in the changelog (a base of an older layout had int).
        state = state.withColumn(BATCH, F.col(BATCH).cast("long"))
        state = state.withColumn(BUCKET, bucket_of(keys, count))
        out = state.repartition(len(touched), F.col(BUCKET))
        out.write.mode("overwrite").partitionBy(BUCKET).parquet(f"{path}/current/{hidden}")
        _fill_empty(lander, current, hidden, name, touched, state)
        _name_parts(lander._fs, f"{current}/{hidden}", touched)
    # A crash here leaves the hidden directory a stray: the metadata does not name it.
    failpoint("spark.compact.written")
    parts = {str(b): written[b] for b in touched}
    pending = Pending(name, hidden, upto, count, touched, reason is not None, parts, partial)
    meta.pending = pending.to_json()
    lander._save_meta(table, meta)  # the commit: rolled forward from here on
    # A crash here leaves the compaction pending: take_over rolls it forward.
    failpoint("spark.compact.named")
    finish(lander, table, meta)
    log.info(
        "%s: current state compacted at batch %d: %d of %d buckets rewritten (%d part "
        "file(s))%s in %.1f s",
        table,
        upto,
        len(touched),
        count,
        sum(len(p) for p in written.values()),
        f" ({reason})" if reason else "",
        time.monotonic() - started,
    )


def finish(lander: Lander, table: TableId, meta: TableMeta) -> None:
    """Put a committed compaction (``meta.pending``) in place; idempotent, so it also rolls
    forward one a crash cut short."""
    if meta.pending is None:
        return
    pending = Pending(**meta.pending)
    fs, current = lander._fs, lander._fs_path(table, "current")
    hidden = f"{current}/{pending.hidden}"
    written = pending.written()
    legacy = pending.parts is None
    # A bucket rewritten whole as other parts than its one file (rows of a part may have gone
    # to another part): its old parts go before any new one is renamed in, or a reader
    # between two renames would read a key in an old part and in a new one.
    existing = bucket_parts(fs, current, pending.base)
    spread = {
        b: parts != [0] or set(existing.get(b, {})) - {0} != set() for b, parts in written.items()
    }
    # What the new base supersedes goes first: a key is never in two files.
    for info in fs.get_file_info(pafs.FileSelector(current, allow_not_found=True)):
        if info.path.rstrip("/") == hidden.rstrip("/"):
            continue
        owner = bases.owner(info)
        if owner is None:
            continue
        if owner == pending.base:
            unit = file_unit(pending.base, info.base_name)
            if unit is not None and unit[0] < pending.buckets:
                bucket, part = unit
                if pending.partial or bucket not in written:
                    continue  # kept: parts rewritten are replaced by their new files below
                if part in written[bucket] and not spread[bucket]:
                    continue  # the bucket's one file, replaced by its new one below
                if part in written[bucket] and not _written_file(
                    fs, hidden, bucket, part, legacy=legacy
                ):
                    continue  # its new file, put in place before a crash
                # else: a part of a bucket rewritten whole, that the new bucket has not, or
                # whose rows it spread over its parts
            elif not pending.full and info.type is pafs.FileType.File:
                continue  # files appended after this compaction began are kept
        if info.type is pafs.FileType.Directory:
            fs.delete_dir(info.path)
        else:
            fs.delete_file(info.path)
    moves = []
    for bucket, parts in written.items():
        for part in parts:
            source = _written_file(fs, hidden, bucket, part, legacy=legacy)
            if source is not None:  # else moved already, before a crash
                moves.append((source, f"{current}/{bucket_file_name(pending.base, bucket, part)}"))
    # Replacements before new parts: a part's rows that went on to a new part (it outgrew
    # PART_ROWS) may be missing for a moment, never in two files.
    replaced = {
        info.path
        for info in fs.get_file_info([target for _, target in moves])
        if info.type is pafs.FileType.File
    }
    for source, target in sorted(moves, key=lambda move: move[1] not in replaced):
        fs.move(source, target)
    if fs.get_file_info(hidden).type is not pafs.FileType.NotFound:
        fs.delete_dir(hidden)
    meta.base, meta.base_dir, meta.buckets = pending.upto, pending.base, pending.buckets
    meta.base_through = None
    meta.appended_through = None if pending.full else meta.appended_through
    meta.tail_rows = 0
    meta.compacted_truncate = meta.truncated_at
    meta.base_rows = bases.rows(fs, current, pending.base)
    meta.pending = None
    lander._save_meta(table, meta)


def _fill_empty(
    lander: Lander, current: str, hidden: str, name: str, touched: list[int], state: DataFrame
) -> None:
    """An empty file for each touched bucket the merge left without rows: a bucket file is
    replaced, never deleted (a reader that listed it still opens it)."""
    fs = lander._fs
    directory = f"{current}/{hidden}"
    empty = [i for i in touched if not parquet_files(fs, f"{directory}/{BUCKET}={i}")]
    if not empty:
        return
    schema = _schema_of(fs, parquet_files(fs, directory))
    if schema is None:
        schema = _schema_of(fs, _base_files(lander, current, name))
    if schema is None:
        from pyspark.sql.pandas.types import to_arrow_schema

        schema = to_arrow_schema(state.drop(BUCKET).schema)
    for i in empty:
        target = f"{directory}/{BUCKET}={i}"
        fs.create_dir(target, recursive=True)
        pq.write_table(schema.empty_table(), f"{target}/part-empty.parquet", filesystem=fs)


def _written_file(
    fs: pafs.FileSystem, hidden: str, bucket: int, part: int, *, legacy: bool
) -> str | None:
    """The file a compaction wrote for ``bucket``'s ``part`` under ``hidden`` (None: not
    there, moved into place already). ``legacy``: recorded without parts, a bucket's one
    file of any name."""
    if not legacy:
        path = f"{hidden}/{hidden_part(bucket, part)}"
        return path if fs.get_file_info(path).type is pafs.FileType.File else None
    found = parquet_files(fs, f"{hidden}/{BUCKET}={bucket}")
    if len(found) > 1:
        raise RuntimeError(f"{hidden}: bucket {bucket} was written as {len(found)} files")
    return found[0] if found else None


def _name_parts(fs: pafs.FileSystem, hidden: str, touched: list[int]) -> None:
    """Name the one file Spark wrote per touched bucket as its part 0 (``hidden_part``)."""
    for bucket in touched:
        [written] = parquet_files(fs, f"{hidden}/{BUCKET}={bucket}")
        fs.move(written, f"{hidden}/{hidden_part(bucket, 0)}")


def _schema_of(fs: pafs.FileSystem, paths: list[str]) -> pa.Schema | None:
    for path in paths:
        if fs.get_file_info(path).type is pafs.FileType.File:
            with fs.open_input_file(path) as f:
                schema: pa.Schema = pq.ParquetFile(f).schema_arrow
                return schema
    return None


def _base_files(lander: Lander, current: str, base: str) -> list[str]:
    """The names under ``current/`` of ``base``'s files (a directory base: itself)."""
    if bases.is_legacy(base):
        return [base]
    return [_leaf(p) for p in bases.files(lander._fs, current, base)]


def _base_name(meta: TableMeta) -> str | None:
    from snapshotter.sinks.spark.lander import base_name

    return base_name(meta)


def _leaf(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]

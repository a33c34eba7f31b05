"""A compaction's touched buckets rewritten by pyarrow: Spark reduces only the changed keys.

Spark rewrote a touched bucket by reading every row, dropping the changed keys (an anti
join) and shuffling the whole bucket into one file per bucket. Most of a compaction's
rows are the ones it keeps as they are, so they need neither Spark nor a shuffle: here
pyarrow streams each touched bucket file twice, once to pick the base rows of the changed
keys, once to copy the others, in record batches (memory bounded by a batch, not a bucket),
and Spark reduces only the changed keys' rows with the tail (``merged``: per key the
highest ``__pos``, deletes dropped, TOAST values carried, the same reduction as before).
The output: part files of at most ``PART_ROWS`` rows per touched bucket, in
``<hidden>/__snapshotter_bucket=<i>/part-<part>.parquet``, which ``parquet.finish`` renames
into place.

A bucket is a set of part files. Where pyarrow writes a bucket whole (a first bucketing of a
snapshot's files, read in key order), its rows go to parts of ``PART_ROWS`` rows each in the
order they come, so each part holds a range of keys. An incremental compaction rewrites only
the parts of a touched bucket whose keys' range (the key columns' minimum and maximum in the
part's footer) holds a changed key, and the bucket's last part, where keys the bucket never
had go (``touched_parts``): a changed key stays in the part it was in (a key moved to another
file would be in two files, or none, between the two renames). So changes to the most recent
keys rewrite about one part per bucket, not the bucket; changes spread over every part still
rewrite the table. A rewritten part that outgrows ``PART_ROWS`` (the last part, with new
keys) goes on in a new part.

Each output file has the schema of the bucket file it replaces, its metadata included (the
Spark schema Spark writes there), so plain readers and Spark read the same types.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from snapshotter.sinks.spark.files import WRITE_OPTIONS, parquet_files
from snapshotter.sinks.spark.formats import schema_changes as schemas
from snapshotter.sinks.spark.formats import spark_hash
from snapshotter.sinks.spark.types import BATCH

if TYPE_CHECKING:
    from snapshotter.sinks.spark.lander import Lander, TableMeta

SCRATCH = "_fold"  # under the hidden directory: never a bucket's, removed with it
_ROW = "__snapshotter_row"  # a working column: a row's index in its record batch
_BATCH_ROWS = 128 * 1024
_HELD_ROWS = 1024 * 1024  # rows held for all buckets' row groups at most (memory)
MAX_OPEN_BUCKETS = 256  # files of rows of any bucket: one output file open per bucket
MAX_TAIL_ROWS = 2_000_000  # the tail's keys are held in memory


class Source(NamedTuple):
    """A file a compaction reads: a filesystem path, its bucket (None: rows of any bucket,
    READ rows appended as files, a base not bucketed yet, which ``spark_hash`` buckets row
    by row) and its part in the bucket."""

    path: str
    bucket: int | None
    part: int


def touched_parts(
    fs: pafs.FileSystem,
    listing: dict[int, dict[int, str]],
    touched: list[int],
    keys: list[str],
    changed: pa.Table,
) -> list[Source]:
    """The parts of the ``touched`` buckets (``listing``: bucket -> part -> path) an
    incremental compaction rewrites: those whose footer's key range holds one of the
    bucket's ``changed`` keys (every part whose footer says nothing of it), and each
    bucket's last part, where the bucket's new keys go."""
    from snapshotter.sinks.spark.formats.parquet import BUCKET

    picked = []
    for bucket in touched:
        parts = listing.get(bucket, {})
        wanted = _keys_of(changed, keys, BUCKET, bucket)
        last = max(parts, default=0)
        for part in sorted(parts):
            if part == last or _may_hold(fs, parts[part], keys, wanted):
                picked.append(Source(parts[part], bucket, part))
    return picked


def _may_hold(fs: pafs.FileSystem, path: str, keys: list[str], wanted: pa.Table) -> bool:
    """Whether the file may hold one of the ``wanted`` keys: every key column of one of them
    within that column's range in the file's footer statistics (True when a footer has no
    statistics for a key column, or they cannot be compared)."""
    with fs.open_input_file(path) as f:
        metadata = pq.ParquetFile(f).metadata
    if metadata.num_rows == 0:
        return False
    schema = metadata.schema.to_arrow_schema()
    if any(pa.types.is_floating(schema.field(key).type) for key in keys):
        return True  # statistics leave NaN out, and NaN is a key like any other
    inside: Any = None
    try:
        for key in keys:
            bounds = _bounds(metadata, schema.get_field_index(key))
            if bounds is None:
                return True
            column = wanted.column(key).cast(schema.field(key).type)
            low, high = (pa.scalar(v, schema.field(key).type) for v in bounds)
            within = pc.and_(pc.greater_equal(column, low), pc.less_equal(column, high))
            inside = within if inside is None else pc.and_(inside, within)
    except (pa.ArrowException, TypeError, ValueError):
        return True
    return inside is None or bool(pc.any(inside).as_py())


def _bounds(metadata: pq.FileMetaData, column: int) -> tuple[Any, Any] | None:
    """The minimum and maximum of a column over a file's row groups (None: not known)."""
    low = high = None
    for group in range(metadata.num_row_groups):
        stats = metadata.row_group(group).column(column).statistics
        if stats is None or not stats.has_min_max:
            if metadata.row_group(group).num_rows:
                return None
            continue
        low = stats.min if low is None else min(low, stats.min)
        high = stats.max if high is None else max(high, stats.max)
    return None if low is None else (low, high)


def write(
    lander: Lander,
    meta: TableMeta,
    sources: list[Source],
    touched: list[int],
    tail: tuple[pa.Table | None, DataFrame | None],
    hidden: tuple[str, str],
    bucket: tuple[str, int],
    partial: bool = False,
) -> dict[int, list[int]]:
    """Write the ``touched`` buckets' new part files into ``hidden`` (a (Spark path,
    filesystem path) pair), from ``sources``: the base's files. ``tail``: the tail's distinct
    keys (with their bucket) and its rows; ``bucket``: the bucket column's name and the
    bucket count. ``partial``: ``sources`` are some parts of their buckets, each rewritten
    as itself (``touched_parts``); else the buckets are written whole, parts numbered from 0.
    Returns the parts written per bucket."""
    from snapshotter.sinks.spark.formats.parquet import bucket_of, merged

    fs, keys = lander._fs, meta.key_columns
    changed, rows = tail
    bucket_column, count = bucket
    scratch_uri, scratch = f"{hidden[0]}/{SCRATCH}", f"{hidden[1]}/{SCRATCH}"
    schema = _schema(fs, sources[0][0])
    if changed is None:  # no tail: the files are only bucketed
        changed = pa.schema([schema.field(k) for k in keys]).empty_table()
        changed = changed.append_column(bucket_column, pa.array([], pa.int64()))
    every = changed.select(keys)
    wanted = {b: _keys_of(changed, keys, bucket_column, b) for _, b, _ in sources if b is not None}

    def changed_in(b: int | None) -> pa.Table:
        return every if b is None else wanted[b]

    # 1. The base rows of the changed keys: the part of the base Spark has to reduce; and,
    # per source, the keys it holds (where their new rows go, in a partial rewrite).
    held: list[pa.Table] = []
    key_schema = pa.schema([schema.field(k) for k in keys])  # the files' key types
    found = []
    for path, b, _ in sources:
        hits = [batch.filter(_member(batch, keys, changed_in(b))) for batch in _batches(fs, path)]
        hits = [t for t in hits if t.num_rows]
        found += hits
        held.append(
            pa.concat_tables([t.select(keys) for t in hits]) if hits else key_schema.empty_table()
        )
    parts: list[DataFrame | None] = [rows]
    if found:
        fs.create_dir(f"{scratch}/base", recursive=True)
        table = pa.concat_tables([schemas.conform(t, schema) for t in found])
        pq.write_table(table, f"{scratch}/base/part-0.parquet", filesystem=fs)
        parts.insert(0, lander.spark.read.parquet(f"{scratch_uri}/base"))
    # 2. Spark reduces them with the tail, rows of the changed keys only.
    if rows is not None:
        state = merged(lander, meta, parts).withColumn(BATCH, F.col(BATCH).cast("long"))
        state = state.withColumn(bucket_column, bucket_of(keys, count))
        state.write.partitionBy(bucket_column).parquet(f"{scratch_uri}/reduced")

    def reduced(b: int) -> list[pa.Table]:
        names = parquet_files(fs, f"{scratch}/reduced/{bucket_column}={b}")
        return [schemas.conform(pq.read_table(p, filesystem=fs), schema) for p in names]

    # 3. The base rows of unchanged keys as they are, then the reduced rows.
    parts_of: dict[int, list[int]] = {}
    for _, b, part in sources:
        if b is not None:
            parts_of.setdefault(b, []).append(part)
    out = _Outputs(fs, f"{hidden[1]}/{bucket_column}=", schema, parts_of if partial else {})
    for i, (path, b, part) in enumerate(sources):
        unit = (b, part) if partial and b is not None else None
        for batch in _batches(fs, path):
            unchanged = pc.invert(_member(batch, keys, changed_in(b)))
            kept = schemas.conform(batch.filter(unchanged), schema)
            if b is not None:
                out.add(unit or (b, 0), kept)
                continue
            ids = spark_hash.buckets([kept.column(k) for k in keys], count)
            assert ids is not None, "keys spark_hash cannot bucket"  # the caller checked
            for one in np.unique(ids):
                out.add((int(one), 0), kept.filter(pa.array(ids == one)))
        if unit is not None:  # the part's rows are all here: its keys' new rows, then close
            assert b is not None
            new_rows = reduced(b)
            mine = [t.filter(_member(t, keys, held[i])) for t in new_rows]
            if part == max(parts_of[b]):  # and the keys no part of the bucket held
                had = pa.concat_tables(
                    [held[j] for j, s in enumerate(sources) if s.bucket == b],
                    promote_options="permissive",
                )
                mine += [t.filter(pc.invert(_member(t, keys, had))) for t in new_rows]
            out.add_all(unit, mine)
            out.close(unit)
    for b in touched:
        if not out.closed((b, 0)) and not partial:
            out.add_all((b, 0), reduced(b))
            out.close((b, 0))
    if fs.get_file_info(scratch).type is not pafs.FileType.NotFound:
        fs.delete_dir(scratch)
    return out.written


Unit = tuple[int, int]  # a bucket and a part: a file written, and those it goes on in


class _Outputs:
    """The new part files, each written as rows arrive, in row groups of about
    ``_BATCH_ROWS`` rows (rows of many buckets arrive a few at a time), smaller when more
    than ``_HELD_ROWS`` rows wait over all buckets. A unit's file that reaches
    ``PART_ROWS`` rows goes on in a new part of its bucket (numbered after every part the
    bucket has: ``parts``, the bucket's parts rewritten in a partial rewrite)."""

    def __init__(
        self, fs: pafs.FileSystem, prefix: str, schema: pa.Schema, parts: dict[int, list[int]]
    ) -> None:
        self._fs, self._prefix, self._schema = fs, prefix, schema
        self._files: dict[Unit, _File] = {}
        self._pending: dict[Unit, list[pa.Table]] = {}
        self._done: set[Unit] = set()
        self._held = 0  # rows pending over all units
        self._next = {b: max(p) + 1 for b, p in parts.items()}
        self.written: dict[int, list[int]] = {}  # bucket: the parts written

    def add(self, unit: Unit, rows: pa.Table) -> None:
        if not rows.num_rows:
            return
        pending = self._pending.setdefault(unit, [])
        pending.append(rows)
        self._held += rows.num_rows
        if sum(t.num_rows for t in pending) >= _BATCH_ROWS:
            self._flush(unit)
        if self._held > _HELD_ROWS:  # many buckets, each short of a row group: write all
            for other in list(self._pending):
                self._flush(other)

    def add_all(self, unit: Unit, tables: list[pa.Table]) -> None:
        for table in tables:
            self.add(unit, table)

    def closed(self, unit: Unit) -> bool:
        return unit in self._done

    def close(self, unit: Unit) -> None:
        """Write what is pending and close the file (a unit with no rows gets an empty
        file: a part is replaced, never deleted)."""
        self._flush(unit)
        self._file(unit).close()
        del self._files[unit]
        self._done.add(unit)

    def _file(self, unit: Unit) -> _File:
        if unit not in self._files:
            self._files[unit] = self._open(*unit)
        return self._files[unit]

    def _open(self, bucket: int, part: int) -> _File:
        from snapshotter.sinks.spark.formats.parquet import hidden_part

        directory = f"{self._prefix}{bucket}"
        self._fs.create_dir(directory, recursive=True)
        self.written.setdefault(bucket, []).append(part)
        name = hidden_part(bucket, part).rsplit("/", 1)[-1]
        return _File(self._fs.open_output_stream(f"{directory}/{name}"), self._schema)

    def _flush(self, unit: Unit) -> None:
        from snapshotter.sinks.spark.formats.parquet import PART_ROWS

        pending = self._pending.pop(unit, [])
        self._held -= sum(t.num_rows for t in pending)
        rows = pa.concat_tables(pending) if pending else None
        while rows is not None and rows.num_rows:
            file = self._file(unit)
            room = PART_ROWS - file.rows
            if room <= 0:  # full: go on in a new part of the bucket
                file.close()
                bucket = unit[0]
                part = self._next.get(bucket, 1)
                self._next[bucket] = part + 1
                self._files[unit] = self._open(bucket, part)
                continue
            file.write(rows.slice(0, room))
            rows = rows.slice(room)


class _File:
    """One part file being written."""

    def __init__(self, stream: Any, schema: pa.Schema) -> None:
        self._stream = stream
        self._writer = pq.ParquetWriter(stream, schema, **WRITE_OPTIONS)
        self.rows = 0

    def write(self, rows: pa.Table) -> None:
        self._writer.write_table(rows)
        self.rows += rows.num_rows

    def close(self) -> None:
        self._writer.close()
        self._stream.close()


def can_bucket(
    fs: pafs.FileSystem,
    paths: list[str],
    keys: list[str],
    rows: DataFrame | None,
    count: int,
    tail_rows: int,
) -> bool:
    """Whether ``write`` can bucket the files ``paths`` itself: their keys of types
    ``spark_hash`` hashes as Spark does, the tail's keys of the same Spark types (else Spark
    would hash them otherwise), one schema in every file (plain readers take a table's schema
    from one file), few enough buckets to keep a file open for each, a tail whose keys fit
    in memory."""
    from pyspark.sql.pandas.types import from_arrow_type

    if not paths or count > MAX_OPEN_BUCKETS or tail_rows > MAX_TAIL_ROWS:
        return False
    schemas = [_schema(fs, p).remove_metadata() for p in paths]
    if any(s != schemas[0] for s in schemas[1:]):
        return False
    if any(k not in schemas[0].names for k in keys):
        return False
    types = [schemas[0].field(k).type for k in keys]
    if not spark_hash.supported(types):
        return False
    if rows is None:
        return True
    pairs = zip(keys, types, strict=True)
    return all(rows.schema[k].dataType == from_arrow_type(t) for k, t in pairs)


def _schema(fs: pafs.FileSystem, path: str) -> pa.Schema:
    """A bucket file's schema as the new file keeps it: ``__batch`` bigint, as Spark writes."""
    with fs.open_input_file(path) as f:
        schema: pa.Schema = pq.ParquetFile(f).schema_arrow
    if BATCH in schema.names:
        index = schema.get_field_index(BATCH)
        schema = schema.set(index, schema.field(index).with_type(pa.int64()))
    return schema


def _batches(fs: pafs.FileSystem, path: str) -> Iterator[pa.Table]:
    with fs.open_input_file(path) as f:
        for batch in pq.ParquetFile(f).iter_batches(batch_size=_BATCH_ROWS):
            yield pa.Table.from_batches([batch])


def _keys_of(changed: pa.Table, keys: list[str], bucket_column: str, bucket: int) -> pa.Table:
    picked = changed.filter(pc.equal(changed.column(bucket_column), bucket))
    return picked.select(keys)


def _member(rows: pa.Table, keys: list[str], wanted: pa.Table) -> pa.ChunkedArray | pa.Array:
    """Whether each row's key is one of ``wanted``'s (compared in the rows' types)."""
    if wanted.num_rows == 0:
        return pa.array(np.zeros(rows.num_rows, dtype=bool))
    if len(keys) == 1:
        column = rows.column(keys[0])
        return pc.is_in(column, value_set=wanted.column(keys[0]).cast(column.type))
    probe = rows.select(keys).append_column(_ROW, pa.array(np.arange(rows.num_rows)))
    build = pa.table({k: wanted.column(k).cast(rows.schema.field(k).type) for k in keys})
    hits = probe.join(build, keys, join_type="left semi").column(_ROW).to_numpy()
    mask = np.zeros(rows.num_rows, dtype=bool)
    mask[hits] = True
    return pa.array(mask)

"""A compaction's touched buckets rewritten by pyarrow: Spark reduces only the changed keys.

Spark rewrote a touched bucket by reading every row, dropping the changed keys (an anti
join) and shuffling the whole bucket into one file per bucket. Most of a compaction's
rows are the ones it keeps as they are, so they need neither Spark nor a shuffle: here
pyarrow streams each touched bucket file twice, once to pick the base rows of the changed
keys, once to copy the others, in record batches (memory bounded by a batch, not a bucket),
and Spark reduces only the changed keys' rows with the tail (``merged``: per key the
highest ``__pos``, deletes dropped, TOAST values carried, the same reduction as before).
The output is what the Spark write left: one file per touched bucket, in
``<hidden>/__snapshotter_bucket=<i>/``, which ``parquet.finish`` renames into place.

Each output file has the schema of the bucket file it replaces, its metadata included (the
Spark schema Spark writes there), so plain readers and Spark read the same types.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

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


def write(
    lander: Lander,
    meta: TableMeta,
    sources: list[tuple[str, int | None]],
    touched: list[int],
    tail: tuple[pa.Table | None, DataFrame | None],
    hidden: tuple[str, str],
    bucket: tuple[str, int],
) -> None:
    """Write each bucket of ``touched`` as one new file into ``hidden`` (a (Spark path,
    filesystem path) pair), from ``sources``: the base's files (filesystem paths), each with
    its bucket, or None for a file of rows of any bucket (READ rows appended as files, a
    base not bucketed yet), which ``spark_hash`` buckets row by row. ``tail``: the tail's
    distinct keys (with their bucket) and its rows; ``bucket``: the bucket column's name and
    the bucket count."""
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
    wanted = {b: _keys_of(changed, keys, bucket_column, b) for _, b in sources if b is not None}

    def changed_in(b: int | None) -> pa.Table:
        return every if b is None else wanted[b]

    # 1. The base rows of the changed keys: the part of the base Spark has to reduce.
    found = [
        batch.filter(_member(batch, keys, changed_in(b)))
        for path, b in sources
        for batch in _batches(fs, path)
    ]
    found = [t for t in found if t.num_rows]
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

    # 3. The base rows of unchanged keys as they are, then each bucket's reduced rows.
    out = _Outputs(fs, f"{hidden[1]}/{bucket_column}=", schema)
    spread = any(b is None for _, b in sources)  # rows of any bucket: every file open
    for path, b in sources:
        for batch in _batches(fs, path):
            unchanged = pc.invert(_member(batch, keys, changed_in(b)))
            kept = schemas.conform(batch.filter(unchanged), schema)
            if b is not None:
                out.add(b, kept)
                continue
            ids = spark_hash.buckets([kept.column(k) for k in keys], count)
            assert ids is not None, "keys spark_hash cannot bucket"  # the caller checked
            for one in np.unique(ids):
                out.add(int(one), kept.filter(pa.array(ids == one)))
        if b is not None and not spread:  # its bucket's rows are all here: close it
            out.add_all(b, reduced(b))
            out.close(b)
    for b in touched:
        if not out.closed(b):
            out.add_all(b, reduced(b))
            out.close(b)
    if fs.get_file_info(scratch).type is not pafs.FileType.NotFound:
        fs.delete_dir(scratch)


class _Outputs:
    """The new bucket files, each written as rows arrive, in row groups of about
    ``_BATCH_ROWS`` rows (rows of many buckets arrive a few at a time), smaller when more
    than ``_HELD_ROWS`` rows wait over all buckets."""

    def __init__(self, fs: pafs.FileSystem, prefix: str, schema: pa.Schema) -> None:
        self._fs, self._prefix, self._schema = fs, prefix, schema
        self._writers: dict[int, tuple[Any, pq.ParquetWriter]] = {}
        self._pending: dict[int, list[pa.Table]] = {}
        self._done: set[int] = set()
        self._held = 0  # rows pending over all buckets

    def add(self, bucket: int, rows: pa.Table) -> None:
        if not rows.num_rows:
            return
        pending = self._pending.setdefault(bucket, [])
        pending.append(rows)
        self._held += rows.num_rows
        if sum(t.num_rows for t in pending) >= _BATCH_ROWS:
            self._flush(bucket)
        if self._held > _HELD_ROWS:  # many buckets, each short of a row group: write all
            for other in list(self._pending):
                self._flush(other)

    def add_all(self, bucket: int, tables: list[pa.Table]) -> None:
        for table in tables:
            self.add(bucket, table)

    def closed(self, bucket: int) -> bool:
        return bucket in self._done

    def close(self, bucket: int) -> None:
        """Write what is pending and close the file (an empty bucket gets an empty file)."""
        self._flush(bucket)
        stream, writer = self._writer(bucket)
        writer.close()
        stream.close()
        del self._writers[bucket]
        self._done.add(bucket)

    def _writer(self, bucket: int) -> tuple[Any, pq.ParquetWriter]:
        if bucket not in self._writers:
            directory = f"{self._prefix}{bucket}"
            self._fs.create_dir(directory, recursive=True)
            stream = self._fs.open_output_stream(f"{directory}/part-00000.parquet")
            self._writers[bucket] = (
                stream,
                pq.ParquetWriter(stream, self._schema, **WRITE_OPTIONS),
            )
        return self._writers[bucket]

    def _flush(self, bucket: int) -> None:
        pending = self._pending.pop(bucket, [])
        self._held -= sum(t.num_rows for t in pending)
        _, writer = self._writer(bucket)
        if pending:
            writer.write_table(pa.concat_tables(pending))


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

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
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from snapshotter.sinks.spark.files import WRITE_OPTIONS, parquet_files
from snapshotter.sinks.spark.types import BATCH

if TYPE_CHECKING:
    from snapshotter.sinks.spark.lander import Lander, TableMeta

SCRATCH = "_fold"  # under the hidden directory: never a bucket's, removed with it
_ROW = "__snapshotter_row"  # a working column: a row's index in its record batch
_BATCH_ROWS = 128 * 1024


def write(
    lander: Lander,
    meta: TableMeta,
    files: dict[int, str],
    changed: pa.Table,
    rows: DataFrame,
    hidden: tuple[str, str],
    bucket: tuple[str, int],
) -> None:
    """Write each touched bucket's new file into ``hidden`` (a (Spark path, filesystem
    path) pair). ``files``: per touched bucket, its current file (a filesystem path);
    ``changed``: the tail's distinct keys with their bucket; ``rows``: the tail; ``bucket``:
    the bucket column's name and the bucket count."""
    from snapshotter.sinks.spark.formats.parquet import bucket_of, merged

    fs, keys = lander._fs, meta.key_columns
    bucket_column, count = bucket
    scratch_uri, scratch = f"{hidden[0]}/{SCRATCH}", f"{hidden[1]}/{SCRATCH}"
    wanted = {b: _keys_of(changed, keys, bucket_column, b) for b in files}
    schemas = {b: _schema(fs, path) for b, path in files.items()}
    # 1. The base rows of the changed keys: the part of the base Spark has to reduce.
    found = [
        batch.filter(_member(batch, keys, wanted[b]))
        for b, path in files.items()
        for batch in _batches(fs, path)
    ]
    found = [t for t in found if t.num_rows]
    parts: list[DataFrame | None] = [rows]
    if found:
        fs.create_dir(f"{scratch}/base", recursive=True)
        first = next(iter(schemas.values()))
        table = pa.concat_tables([t.cast(first) for t in found])
        pq.write_table(table, f"{scratch}/base/part-0.parquet", filesystem=fs)
        parts.insert(0, lander.spark.read.parquet(f"{scratch_uri}/base"))
    # 2. Spark reduces them with the tail, rows of the changed keys only.
    state = merged(lander, meta, parts).withColumn(BATCH, F.col(BATCH).cast("long"))
    state = state.withColumn(bucket_column, bucket_of(keys, count))
    state.write.partitionBy(bucket_column).parquet(f"{scratch_uri}/reduced")
    # 3. Per bucket: the base rows of unchanged keys as they are, then the reduced rows.
    for index, path in files.items():
        schema = schemas[index]
        reduced = [
            _conform(pq.read_table(p, filesystem=fs), schema)
            for p in parquet_files(fs, f"{scratch}/reduced/{bucket_column}={index}")
        ]
        target = f"{hidden[1]}/{bucket_column}={index}"
        fs.create_dir(target, recursive=True)
        with (
            fs.open_output_stream(f"{target}/part-00000.parquet") as out,
            pq.ParquetWriter(out, schema, **WRITE_OPTIONS) as writer,
        ):
            for batch in _batches(fs, path):
                kept = batch.filter(pc.invert(_member(batch, keys, wanted[index])))
                if kept.num_rows:
                    writer.write_table(_conform(kept, schema))
            for table in reduced:
                if table.num_rows:
                    writer.write_table(table)
    fs.delete_dir(scratch)


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


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table``'s columns in ``schema``'s order and types (a column it lacks: nulls)."""
    columns = [
        table.column(f.name).cast(f.type)
        if f.name in table.column_names
        else pa.nulls(table.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)

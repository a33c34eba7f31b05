"""READ rows read on Spark executors, staged without a Spark job.

The executors wrote each window's rows as Parquet (``engine.executor_reads``) into the
staging directory, on this machine's disk: the landed data columns, the key columns as the
chunk reader gives them, and each row's READ index. At the window's close the engine knows
only which keys the log dropped; here pyarrow streams each file once, applies those drops
(a left anti-join against the dropped keys, typed as the chunk reader types them, so the
join compares what the window's own anti-join would), adds the meta columns the landing
needs (``__op = "r"``, ``__pos`` from the close watermark's position and the READ index:
``Position.read_row``'s token, ``__ts_ms``, ``__snapshot``, ``__batch``; ``__before`` NULL)
and writes the staged batch's file: the landed schema, as the engine's own reads stage it.
This used to be a Spark job per staged batch (``write_remote_reads``, kept for files on a
file system this process cannot read), a second pass over every row read on executors.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from snapshotter.core.window import RAW_KEY_PREFIX, ROW_INDEX, StagedReadBatch
from snapshotter.sinks.spark.lander import quote
from snapshotter.sinks.spark.types import (
    BATCH,
    OP,
    POS,
    SNAPSHOT,
    TS_MS,
    UNAVAILABLE,
    landed_columns,
    landed_schema,
)
from snapshotter.sources.base import TableSchema


def write_remote_reads(
    spark: Any, schema: TableSchema, batches: Sequence[StagedReadBatch], seq: int, target: str
) -> None:
    """Stage ``batches`` (READ rows of one table read on executors) as staged batch ``seq``'s
    Parquet files in the new directory ``target``."""
    from pyspark.sql import functions as F

    data = [c.name for c in landed_columns(schema)]
    frames = []
    for batch in batches:
        if batch.truncated or not batch.staged.files:
            continue
        raw = [RAW_KEY_PREFIX + c for c in batch.key_columns]
        rows = spark.read.parquet(*batch.staged.files)
        if batch.dropped_keys.num_rows:
            dropped = spark.createDataFrame(batch.dropped_keys.rename_columns(raw))
            rows = rows.join(dropped, on=raw, how="left_anti")
        index = F.lpad(F.lower(F.hex(F.col(ROW_INDEX))), 16, "0")
        frames.append(
            rows.select(
                *[F.col(quote(name)) for name in data],
                F.lit("r").alias(OP),
                F.concat(F.lit(batch.position.token + "-"), index).alias(POS),
                F.lit(int(batch.ts_ms)).cast("long").alias(TS_MS),
                F.lit(batch.template.snapshot.value).alias(SNAPSHOT),
                F.lit(None).cast("array<string>").alias(UNAVAILABLE),
                F.lit(seq).cast("long").alias(BATCH),
            )
        )
    if not frames:
        return
    reduce(lambda a, b: a.unionByName(b), frames).write.parquet(target)


_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_SHIFTS = np.arange(60, -4, -4, dtype=np.uint64)


def stage_remote_reads(
    schema: TableSchema, batches: Sequence[StagedReadBatch], seq: int, target: str
) -> bool:
    """Stage ``batches`` (READ rows of one table read on executors) as staged batch ``seq``'s
    Parquet file in the new directory ``target``, with pyarrow. False: a file is not on this
    machine's file system (the caller has Spark stage them)."""
    files = [f for batch in batches if not batch.truncated for f in batch.staged.files]
    if not all(Path(f).is_file() for f in files):
        return False
    landed = landed_schema(schema)
    data = [c.name for c in landed_columns(schema)]
    out: pq.ParquetWriter | None = None  # opened at the first row (none: no file, as Spark)
    try:
        for batch in batches:
            if batch.truncated:
                continue
            raw = [RAW_KEY_PREFIX + c for c in batch.key_columns]
            for name in batch.staged.files:
                rows = pq.read_table(name)
                if batch.dropped_keys.num_rows:
                    rows = _without(rows, raw, batch.dropped_keys.rename_columns(raw))
                if not rows.num_rows:
                    continue
                if out is None:
                    Path(target).mkdir(parents=True)
                    out = pq.ParquetWriter(
                        f"{target}/part-00000.parquet", landed, use_dictionary=False
                    )
                out.write_table(_landed(rows, data, landed, batch, seq))
    finally:
        if out is not None:
            out.close()
    return True


def _without(rows: pa.Table, raw: list[str], dropped: pa.Table) -> pa.Table:
    """``rows`` whose raw key is not one of ``dropped``'s (compared in the rows' types)."""
    dropped = pa.table({k: dropped.column(k).cast(rows.schema.field(k).type) for k in raw})
    kept: pa.Table = rows.join(dropped, raw, join_type="left anti")
    return kept


def _landed(
    rows: pa.Table, data: list[str], landed: pa.Schema, batch: StagedReadBatch, seq: int
) -> pa.Table:
    count = rows.num_rows
    prefix = np.frombuffer((batch.position.token + "-").encode(), dtype=np.uint8)
    index = rows.column(ROW_INDEX).to_numpy().astype(np.int64).view(np.uint64)
    digits = _HEX[((index[:, None] >> _SHIFTS) & np.uint64(0xF)).astype(np.uint8)]
    text = np.hstack([np.broadcast_to(prefix, (count, prefix.size)), digits])
    width = prefix.size + 16
    pos = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(width), count, [None, pa.py_buffer(np.ascontiguousarray(text).tobytes())]
    )
    meta = {
        OP: pa.array(np.full(count, "r", dtype=object), pa.string()),
        POS: pos.cast(pa.binary()).cast(pa.string()),
        TS_MS: pa.array(np.full(count, int(batch.ts_ms), dtype=np.int64)),
        SNAPSHOT: pa.array(np.full(count, batch.template.snapshot.value, dtype=object)),
        BATCH: pa.array(np.full(count, seq, dtype=np.int64)),
    }
    columns = []
    for field in landed:
        if field.name in data:
            columns.append(rows.column(field.name).cast(field.type))
        elif field.name in meta:
            columns.append(meta[field.name].cast(field.type))
        else:  # __unavailable, __before: NULL for READ rows
            columns.append(pa.nulls(count, field.type))
    return pa.Table.from_arrays(columns, schema=landed)

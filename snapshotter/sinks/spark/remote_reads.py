"""READ rows read on Spark executors, staged by Spark: the rows never reach the engine.

The executors wrote each window's rows as Parquet (``engine.executor_reads``): the landed
data columns, the key columns as the chunk reader gives them, and each row's READ index. At
the window's close the engine knows only which keys the log dropped; here one Spark job per
staged batch applies those drops (a left anti-join against the dropped keys, typed as the
chunk reader types them, so the join compares what the window's own anti-join would) and
adds the meta columns the landing needs: ``__op = "r"``, ``__pos`` from the close watermark's
position and the READ index (``Position.read_row``'s token, built in Spark SQL),
``__ts_ms``, ``__snapshot``, ``__batch``. The result is written into the staged batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce
from typing import Any

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

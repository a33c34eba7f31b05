"""The Delta format: the changelog and the current state as Delta tables.

The changelog is appended per landing, replacing exactly the batches it lands
(``replaceWhere __batch BETWEEN lo AND hi``), so landing a batch twice changes nothing. The
current state is updated by one MERGE per landing under the position rule
(``formats.merge``), so a second landing matches nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from snapshotter.sinks.spark.formats.merge import position_merge
from snapshotter.sinks.spark.latest import RESTARTED, quote, reduce_latest
from snapshotter.sinks.spark.types import BATCH, OP, POS

if TYPE_CHECKING:
    from snapshotter.sinks.spark.lander import TableMeta


def land_delta(
    spark: SparkSession,
    base: str,
    meta: TableMeta,
    batch: DataFrame,
    lo: int,
    hi: int,
    truncated_at: str | None,
) -> None:
    """Land batches ``lo..hi`` (``batch``: their rows) of the table at ``base``."""
    from delta.tables import DeltaTable

    changelog = f"{base}/changelog"
    writer = batch.write.format("delta").option("mergeSchema", "true")
    if DeltaTable.isDeltaTable(spark, changelog):
        writer.mode("overwrite").option(
            "replaceWhere", f"{quote(BATCH)} >= {lo} AND {quote(BATCH)} <= {hi}"
        ).save(changelog)
    else:
        writer.mode("append").save(changelog)
    current = f"{base}/current"
    changes = reduce_latest(
        batch,
        meta.key_columns,
        meta.unavailable_columns,
        keep_deletes=True,
        after=truncated_at,
        restarted=RESTARTED,
    )
    columns = [c for c in changes.columns if c != RESTARTED]
    if not DeltaTable.isDeltaTable(spark, current):
        inserted = changes.where(F.col(OP) != "d").select(*[F.col(quote(c)) for c in columns])
        inserted.write.format("delta").mode("append").save(current)
        return
    target = DeltaTable.forPath(spark, current)
    if truncated_at is not None:
        target.delete(F.col(POS) < F.lit(truncated_at))
    clauses = position_merge(meta.key_columns, columns, meta.unavailable_columns)
    (
        target.alias("t")
        .merge(changes.alias("s"), clauses.on)
        .whenMatchedDelete(condition=clauses.delete_when)
        .whenMatchedUpdate(condition=clauses.update_when, set=clauses.updates)
        .whenNotMatchedInsert(condition=clauses.insert_when, values=clauses.inserts)
        .execute()
    )

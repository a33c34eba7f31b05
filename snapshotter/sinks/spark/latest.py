"""Per key, the latest event: how a changelog folds into a current state (every format)."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from snapshotter.sinks.spark.types import BEFORE, OP, POS, UNAVAILABLE

# Working columns of reduce_latest and the merges (never landed).
_LIFE = "__snapshotter_life"
RESTARTED = "__snapshotter_restarted"


def quote(name: str) -> str:
    """A Spark SQL identifier, quoted (backticks doubled)."""
    return "`" + name.replace("`", "``") + "`"


def no_columns() -> Column:
    """An empty list of column names (a function: a Column needs a running Spark)."""
    return F.array().cast("array<string>")


def all_of(conditions: list[Column]) -> Column:
    out = conditions[0]
    for c in conditions[1:]:
        out = out & c
    return out


def reduce_latest(
    df: DataFrame,
    keys: Sequence[str],
    unavailable_columns: Sequence[str] = (),
    *,
    keep_deletes: bool = False,
    after: str | None = None,
    restarted: str | None = None,
) -> DataFrame:
    """Per key, the event with the highest ``__pos`` (deletes dropped unless kept), after the
    last truncate; values the log did not carry taken from the key's previous event since
    its last delete (never from before a delete: a key deleted and created again by a key
    change is another row). With ``restarted``, a boolean column of that name says whether
    the key was deleted before its latest event (its state before ``df`` resolves nothing)."""
    df = df.drop(BEFORE).where(F.col(OP) != "t")  # a changelog column only
    if after is not None:
        df = df.where(F.col(POS) > F.lit(after))
    key_cols = [F.col(quote(k)) for k in keys]
    if unavailable_columns:
        upto_here = (
            Window.partitionBy(*key_cols)
            .orderBy(F.col(POS))
            .rowsBetween(Window.unboundedPreceding, Window.currentRow)
        )
        # Deletes so far, this row's included: the key's life the row belongs to.
        df = df.withColumn(_LIFE, F.sum(F.when(F.col(OP) == "d", 1).otherwise(0)).over(upto_here))
        history = (
            Window.partitionBy(*key_cols, F.col(_LIFE))
            .orderBy(F.col(POS))
            .rowsBetween(Window.unboundedPreceding, Window.currentRow)
        )
        missing_list = F.coalesce(F.col(UNAVAILABLE), no_columns())
        unresolved = []
        temps: list[str] = [_LIFE]
        if restarted is not None:
            df = df.withColumn(restarted, F.col(_LIFE) > 0)
        for i, c in enumerate(unavailable_columns):
            if c not in df.columns:
                continue
            carried = F.when(
                (F.col(OP) != "d") & ~F.array_contains(missing_list, F.lit(c)),
                F.struct(F.col(quote(c)).alias("v")),
            )
            temp = f"__carried_{i}"
            df = df.withColumn(temp, F.last(carried, ignorenulls=True).over(history))
            df = df.withColumn(c, F.col(temp).getField("v"))
            unresolved.append(
                F.when(F.array_contains(missing_list, F.lit(c)) & F.col(temp).isNull(), F.lit(c))
            )
            temps.append(temp)
        # What no earlier event carried stays unavailable (the landing resolves it against
        # the state before the batch, where there is one).
        still = F.array_compact(F.array(*unresolved)) if unresolved else F.array()
        df = df.withColumn(
            UNAVAILABLE, F.when(F.size(still) > 0, still).cast("array<string>")
        ).drop(*temps)
    elif restarted is not None:
        df = df.withColumn(restarted, F.lit(False))
    latest = Window.partitionBy(*key_cols).orderBy(F.col(POS).desc())
    df = df.withColumn("__rank", F.row_number().over(latest)).where(F.col("__rank") == 1)
    df = df.drop("__rank")
    if not keep_deletes:
        df = df.where(F.col(OP) != "d")
    return df

"""``formats.parquet._folded`` (a compaction's base joined against the tail's keys, only
their rows reduced) gives the very rows ``merged`` (every row of both reduced by key) does:
random bases of one row per key and random tails of creates, updates, deletes, keys created
again, and updates lacking an unavailable (TOAST) column, in real Spark."""

from __future__ import annotations

import random
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

from snapshotter.config import SparkConfig
from snapshotter.sinks.spark.formats.parquet import _folded, merged
from snapshotter.sinks.spark.lander import TableMeta
from snapshotter.sinks.spark.session import spark_session
from tests.integration.engine_harness import SPARK_MASTER

pytestmark = pytest.mark.integration

ROWS = StructType(
    [
        StructField("k1", LongType(), False),
        StructField("k2", StringType(), False),
        StructField("note", StringType(), True),
        StructField("doc", StringType(), True),
        StructField("__op", StringType(), False),
        StructField("__pos", StringType(), False),
        StructField("__unavailable", ArrayType(StringType()), True),
        StructField("__batch", LongType(), False),
    ]
)


def _rows(seed: int) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    rng = random.Random(seed)
    keys = [(k, f"s{k % 7}") for k in rng.sample(range(400), 150)]
    base = [(k1, k2, f"b{k1}", f"doc{k1}", "r", f"{k1:08d}", None, 1) for k1, k2 in keys]
    tail = []
    pos = 10**6
    for _ in range(300):
        pos += 1
        k1, k2 = rng.choice(keys) if rng.random() < 0.7 else (rng.randrange(400, 450), "n")
        op = rng.choice(["c", "u", "u", "d"])
        missing = ["doc"] if op == "u" and rng.random() < 0.4 else None
        doc = None if missing else f"doc{pos}"
        tail.append((k1, k2, f"t{pos}", doc, op, f"{pos:08d}", missing, 2))
    return base, tail


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_folding_the_tail_in_by_keys_equals_reducing_every_row(seed: int) -> None:
    spark: SparkSession = spark_session(SparkConfig(master=SPARK_MASTER))
    base_rows, tail_rows = _rows(seed)
    base = spark.createDataFrame(base_rows, ROWS)
    tail = spark.createDataFrame(tail_rows, ROWS)
    meta = TableMeta("s", "t", "parquet", ["k1", "k2"], unavailable_columns=["doc"])
    meta.tail_rows = len(tail_rows)

    def state(df: DataFrame) -> list[tuple[Any, ...]]:
        out = [tuple(r[c] for c in ROWS.fieldNames()) for r in df.collect()]
        return sorted(out, key=repr)

    expected = state(merged(None, meta, [base, tail]))  # type: ignore[arg-type]
    assert len({(r[0], r[1]) for r in expected}) == len(expected)
    assert state(_folded(None, meta, base, tail)) == expected  # type: ignore[arg-type]

"""``formats.parquet._folded`` (a compaction's base joined against the tail's keys, only
their rows reduced) gives the very rows ``merged`` (every row of both reduced by key) does:
random bases of one row per key and random tails of creates, updates, deletes, keys created
again, and updates lacking an unavailable (TOAST) column, in real Spark."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

from snapshotter.config import SparkConfig
from snapshotter.sinks.spark.formats import parquet_fold
from snapshotter.sinks.spark.formats.parquet import BUCKET, _folded, bucket_of, merged
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


class _Lander:
    """What ``parquet_fold.write`` uses of a lander: its filesystem and Spark."""

    def __init__(self, spark: SparkSession) -> None:
        self._fs = pafs.LocalFileSystem()
        self.spark = spark


@pytest.mark.parametrize(("seed", "keys"), [(1, ["k1", "k2"]), (2, ["k1"]), (3, ["k1", "k2"])])
def test_buckets_rewritten_by_pyarrow_hold_the_rows_of_reducing_every_row(
    seed: int, keys: list[str], tmp_path: Path
) -> None:
    """Each touched bucket's new file (the base's rows of unchanged keys copied by pyarrow,
    the changed keys' rows reduced by Spark) holds exactly that bucket's rows of ``merged``
    of the base and the tail, in the bucket file's schema (metadata included); an untouched
    bucket is not written."""
    spark: SparkSession = spark_session(SparkConfig(master=SPARK_MASTER))
    base_rows, tail_rows = _rows(seed)
    count = 4
    tail = spark.createDataFrame(tail_rows, ROWS)
    meta = TableMeta("s", "t", "parquet", keys, unavailable_columns=["doc"])
    meta.tail_rows, meta.buckets = len(tail_rows), count
    base = spark.createDataFrame(base_rows, ROWS).withColumn(BUCKET, bucket_of(keys, count))
    current = tmp_path / "current"
    files: dict[int, str] = {}
    for index in range(count):
        part = base.where(F.col(BUCKET) == index).drop(BUCKET).toArrow()
        schema = part.schema.with_metadata({b"origin": b"the bucket file"})
        files[index] = str(current / f"base-1.bucket-{index:05d}.parquet")
        current.mkdir(exist_ok=True)
        pq.write_table(part.cast(schema), files[index])
    changed = (
        tail.where(F.col("__op") != "t")
        .select(*keys)
        .distinct()
        .withColumn(BUCKET, bucket_of(keys, count))
        .toArrow()
    )
    touched = sorted(set(changed.column(BUCKET).to_pylist()))
    assert touched, "the tail touches no bucket"
    if len(touched) == count:  # leave one bucket untouched, so the test sees it skipped
        touched = touched[1:]
        changed = changed.filter(pc.is_in(changed.column(BUCKET), pa.array(touched)))
        tail = tail.join(spark.createDataFrame(changed.select(keys)), keys, "left_semi")
    hidden = tmp_path / "current" / ".compacting-x"
    parquet_fold.write(
        _Lander(spark),  # type: ignore[arg-type]
        meta,
        {i: files[i] for i in touched},
        changed,
        tail,
        (str(hidden), str(hidden)),
        (BUCKET, count),
    )
    whole = spark.createDataFrame(base_rows, ROWS)
    expected = merged(None, meta, [whole, tail]).withColumn(BUCKET, bucket_of(keys, count))  # type: ignore[arg-type]
    written = sorted(p.name for p in hidden.iterdir())
    assert written == [f"{BUCKET}={i}" for i in touched]
    for index in touched:
        [path] = list((hidden / f"{BUCKET}={index}").iterdir())
        got = pq.read_table(path)
        assert (got.schema.metadata or {}).get(b"origin") == b"the bucket file"
        assert got.schema.remove_metadata() == pq.read_schema(files[index]).remove_metadata()
        want = expected.where(F.col(BUCKET) == index).drop(BUCKET).collect()
        rows = sorted((tuple(r.values()) for r in got.to_pylist()), key=repr)
        assert rows == sorted((tuple(r[c] for c in ROWS.fieldNames()) for r in want), key=repr)

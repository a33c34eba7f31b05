"""``formats.parquet._folded`` (a compaction's base joined against the tail's keys, only
their rows reduced) gives the very rows ``merged`` (every row of both reduced by key) does:
random bases of one row per key and random tails of creates, updates, deletes, keys created
again, and updates lacking an unavailable (TOAST) column, in real Spark."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, IntegerType, LongType, StringType, StructField, StructType

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
        StructField("k3", IntegerType(), False),
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
    base = [(k1, k2, k1 % 5, f"b{k1}", f"doc{k1}", "r", f"{k1:08d}", None, 1) for k1, k2 in keys]
    tail = []
    pos = 10**6
    for _ in range(300):
        pos += 1
        k1, k2 = rng.choice(keys) if rng.random() < 0.7 else (rng.randrange(400, 450), "n")
        op = rng.choice(["c", "u", "u", "d"])
        missing = ["doc"] if op == "u" and rng.random() < 0.4 else None
        doc = None if missing else f"doc{pos}"
        tail.append((k1, k2, k1 % 5, f"t{pos}", doc, op, f"{pos:08d}", missing, 2))
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


@pytest.mark.parametrize(
    ("seed", "keys", "layout"),
    [
        (1, ["k1", "k2"], "buckets"),
        (2, ["k1"], "buckets"),
        (3, ["k1", "k3"], "appended"),
        (4, ["k1"], "appended"),
        (5, ["k3", "k1"], "both"),
        (6, ["k1"], "no tail"),
    ],
)
def test_buckets_rewritten_by_pyarrow_hold_the_rows_of_reducing_every_row(
    seed: int, keys: list[str], layout: str, tmp_path: Path
) -> None:
    """Each bucket's new file (the base's rows of unchanged keys copied by pyarrow, bucketed
    by ``spark_hash`` where a file holds rows of any bucket; the changed keys' rows reduced
    by Spark) holds exactly that bucket's rows of ``merged`` of the base and the tail, Spark's
    bucket of each, in the base files' schema (metadata included); a bucket the tail does not
    touch is not written. Layouts: bucket files only (an incremental compaction), files of
    READ rows appended only (a first bucketing), both, and appended files without a tail."""
    spark: SparkSession = spark_session(SparkConfig(master=SPARK_MASTER))
    base_rows, tail_rows = _rows(seed)
    count = 4
    tail: DataFrame | None = spark.createDataFrame(tail_rows, ROWS)
    meta = TableMeta("s", "t", "parquet", keys, unavailable_columns=["doc"])
    meta.tail_rows, meta.buckets = len(tail_rows), count
    base = spark.createDataFrame(base_rows, ROWS).withColumn(BUCKET, bucket_of(keys, count))
    current = tmp_path / "current"
    current.mkdir()
    metadata = {b"origin": b"the base files"}
    sources: list[parquet_fold.Source] = []
    appended = {"buckets": 0, "appended": 1, "both": 0.5, "no tail": 1}[layout]
    rng = random.Random(seed)
    whole = base.toArrow()
    pick = np.array([rng.random() < appended for _ in range(whole.num_rows)])
    spread, bucketed = whole.filter(pa.array(pick)), whole.filter(pa.array(~pick))
    for index in range(count) if appended < 1 else []:
        part = bucketed.filter(pc.equal(bucketed.column(BUCKET), index)).drop([BUCKET])
        path = str(current / f"base-1.bucket-{index:05d}.parquet")
        pq.write_table(part.cast(part.schema.with_metadata(metadata)), path)
        sources.append(parquet_fold.Source(path, index, 0))
    spread = spread.drop([BUCKET])
    for n, start in enumerate(range(0, spread.num_rows, 40)):  # files of 40 rows each
        path = str(current / f"base-1.b{n}-x.parquet")
        part = spread.slice(start, 40)
        pq.write_table(part.cast(part.schema.with_metadata(metadata)), path)
        sources.append(parquet_fold.Source(path, None, 0))
    assert tail is not None
    changed: pa.Table | None = (
        tail.where(F.col("__op") != "t")
        .select(*keys)
        .distinct()
        .withColumn(BUCKET, bucket_of(keys, count))
        .toArrow()
    )
    assert changed is not None
    touched = sorted(set(changed.column(BUCKET).to_pylist()))
    assert touched, "the tail touches no bucket"
    if layout == "buckets" and len(touched) == count:  # one bucket left untouched, not written
        touched = touched[1:]
        changed = changed.filter(pc.is_in(changed.column(BUCKET), pa.array(touched)))
        tail = tail.join(spark.createDataFrame(changed.select(keys)), keys, "left_semi")
        sources = [src for src in sources if src.bucket in touched]
    if layout != "buckets":
        touched = list(range(count))
    if layout == "no tail":
        changed, tail = None, None
    paths = [src.path for src in sources]
    if layout != "buckets":  # rows of any bucket: keys spark_hash hashes
        assert parquet_fold.can_bucket(pafs.LocalFileSystem(), paths, keys, tail, count, 300)
    hidden = tmp_path / "current" / ".compacting-x"
    parquet_fold.write(
        _Lander(spark),  # type: ignore[arg-type]
        meta,
        sources,
        touched,
        (changed, tail),
        (str(hidden), str(hidden)),
        (BUCKET, count),
    )
    everything = spark.createDataFrame(base_rows, ROWS)
    parts = [everything] if tail is None else [everything, tail]
    expected = merged(None, meta, parts).withColumn(BUCKET, bucket_of(keys, count))  # type: ignore[arg-type]
    written = sorted(p.name for p in hidden.iterdir())
    assert written == [f"{BUCKET}={i}" for i in touched]
    for index in touched:
        [written_file] = list((hidden / f"{BUCKET}={index}").iterdir())
        got = pq.read_table(written_file)
        assert (got.schema.metadata or {}).get(b"origin") == b"the base files"
        assert got.schema.remove_metadata() == pq.read_schema(paths[0]).remove_metadata()
        want = expected.where(F.col(BUCKET) == index).drop(BUCKET).collect()
        rows = sorted((tuple(r.values()) for r in got.to_pylist()), key=repr)
        assert rows == sorted((tuple(r[c] for c in ROWS.fieldNames()) for r in want), key=repr)
        # Spark, reading the file, puts each of its rows in this bucket.
        buckets = spark.read.parquet(str(written_file)).select(bucket_of(keys, count).alias("b"))
        assert {r["b"] for r in buckets.distinct().collect()} <= {index}


def test_files_of_another_schema_or_key_type_are_bucketed_by_spark(tmp_path: Path) -> None:
    """``can_bucket`` declines files whose schemas differ, string keys, and more buckets
    than it keeps files open for: those compactions stay Spark's."""
    fs = pafs.LocalFileSystem()
    a, b, c = (str(tmp_path / f"{n}.parquet") for n in "abc")
    pq.write_table(pa.table({"k": pa.array([1], pa.int64()), "v": ["x"]}), a)
    pq.write_table(pa.table({"k": pa.array([2], pa.int64()), "v": [1]}), b)
    pq.write_table(pa.table({"k": ["s"], "v": ["x"]}), c)
    assert parquet_fold.can_bucket(fs, [a], ["k"], None, 4, 0)
    assert not parquet_fold.can_bucket(fs, [a, b], ["k"], None, 4, 0)
    assert not parquet_fold.can_bucket(fs, [c], ["k"], None, 4, 0)
    assert not parquet_fold.can_bucket(fs, [a], ["k"], None, parquet_fold.MAX_OPEN_BUCKETS + 1, 0)

"""``spark_hash.buckets`` (numpy) equals Spark's ``pmod(xxhash64(...), n)`` bit for bit, for
every key type it claims (byte, short, int, long, date, microsecond timestamps with and
without a zone) and for composite keys; it declines the others, so Spark buckets them."""

from __future__ import annotations

import datetime as dt
import random

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from snapshotter.config import SparkConfig
from snapshotter.sinks.spark.formats import spark_hash
from snapshotter.sinks.spark.formats.parquet import bucket_of
from snapshotter.sinks.spark.session import spark_session
from tests.integration.engine_harness import SPARK_MASTER

pytestmark = pytest.mark.integration

EPOCH = dt.datetime(1970, 1, 1)


def _values(t: pa.DataType, rng: random.Random, n: int) -> pa.Array:
    def ints(bits: int) -> list[int]:
        edge = [0, 1, -1, 2 ** (bits - 1) - 1, -(2 ** (bits - 1))]
        return edge + [rng.randrange(-(2 ** (bits - 1)), 2 ** (bits - 1)) for _ in range(n)]

    if pa.types.is_date32(t):
        return pa.array([EPOCH.date() + dt.timedelta(days=d % 2_900_000) for d in ints(21)], t)
    if pa.types.is_timestamp(t):
        micros = [m % (2**62) - 2**61 for m in ints(62)]
        return pa.array(micros, pa.int64()).cast(t)
    return pa.array(ints(t.bit_width), t)


TYPES = [
    pa.int8(),
    pa.int16(),
    pa.int32(),
    pa.int64(),
    pa.date32(),
    pa.timestamp("us", tz="UTC"),
    pa.timestamp("us"),
]


@pytest.mark.parametrize("count", [1, 8, 1000])
def test_buckets_equal_sparks_for_every_supported_type_and_composites(count: int) -> None:
    spark: SparkSession = spark_session(SparkConfig(master=SPARK_MASTER))
    rng = random.Random(count)
    cases = [[t] for t in TYPES] + [
        [pa.int64(), pa.int32()],
        [pa.int32(), pa.date32(), pa.timestamp("us", tz="UTC")],
        [pa.int16(), pa.int64(), pa.int8()],
    ]
    for types in cases:
        n = 300
        columns = [_values(t, rng, n)[: n + 5] for t in types]
        table = pa.table({f"k{i}": c for i, c in enumerate(columns)})
        table = table.append_column("row", pa.array(np.arange(table.num_rows)))
        keys = [f"k{i}" for i in range(len(types))]
        ours = spark_hash.buckets([table.column(k) for k in keys], count)
        assert ours is not None, types
        theirs = (
            spark.createDataFrame(table)
            .select("row", bucket_of(keys, count).alias("b"))
            .orderBy("row")
            .toArrow()
            .column("b")
            .to_numpy()
        )
        read_back = spark.createDataFrame(table).schema
        assert [f.name for f in read_back.fields][: len(keys)] == keys
        assert ours.tolist() == theirs.tolist(), (types, count)


def test_other_types_and_nulls_are_left_to_spark() -> None:
    for t in [pa.string(), pa.decimal128(10, 2), pa.float64(), pa.uint32(), pa.timestamp("ms")]:
        assert not spark_hash.supported([t])
        assert spark_hash.buckets([pa.array([], t)], 4) is None
    assert spark_hash.buckets([pa.array([1, None], pa.int64())], 4) is None
    assert spark_hash.buckets([pa.array([1, 2], pa.int64())], 4) is not None

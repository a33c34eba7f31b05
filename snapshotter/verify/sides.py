"""Both sides of the Spark sink's convergence check (``verify.spark``), each summarised per
key-hash bucket and read by bucket: the source in key-range chunks, every chunk converted as
its READ rows would land; the landed current state through Spark, hashed by the same
function (``verify.row_hash``) in an Arrow UDF on Spark's workers."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from snapshotter.sinks.spark.types import landed_columns, rows_to_landed
from snapshotter.sources.base import ChunkSpec, Dialect, TableSchema
from snapshotter.verify import row_hash as hash_module
from snapshotter.verify.row_hash import BUCKETS, bucket_of, hash_rows

if TYPE_CHECKING:  # pyspark is imported where Spark is used: the source side needs none
    from pyspark.sql import Column, DataFrame

KEY_HASH = "__verify_key_hash"
ROW_HASH = "__verify_row_hash"
_HASHES = "__verify_hashes"
_BUCKET = "__verify_bucket"


# --- per-bucket summaries ---------------------------------------------------------------------

_MOD = 1 << 64


@dataclass
class Summary:
    """Per bucket: how many rows, and the sum of their row hashes modulo 2**64."""

    counts: dict[int, int] = field(default_factory=dict)
    sums: dict[int, int] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return sum(self.counts.values())

    def add(self, buckets: Sequence[int], counts: Sequence[int], sums: Sequence[int]) -> None:
        for bucket, count, total in zip(buckets, counts, sums, strict=True):
            self.counts[bucket] = self.counts.get(bucket, 0) + count
            self.sums[bucket] = (self.sums.get(bucket, 0) + total) % _MOD

    def add_rows(self, key_hash: pa.Array, row_hash: pa.Array) -> None:
        """Rows of one chunk (grouped in Arrow; uint64 sums wrap modulo 2**64)."""
        grouped = (
            pa.table({"b": bucket_of(key_hash), "r": row_hash.view(pa.uint64())})
            .group_by("b")
            .aggregate([("r", "count"), ("r", "sum")])
        )
        self.add(
            grouped["b"].to_pylist(), grouped["r_count"].to_pylist(), grouped["r_sum"].to_pylist()
        )

    def differing(self, other: Summary) -> list[int]:
        buckets = set(self.counts) | set(other.counts)
        return sorted(
            b
            for b in buckets
            if self.counts.get(b, 0) != other.counts.get(b, 0)
            or self.sums.get(b, 0) != other.sums.get(b, 0)
        )


def narrowable(
    differing: Sequence[int], source: Summary, landed: Summary, max_keys: int
) -> list[int]:
    """The differing buckets, in order, that together hold at most ``max_keys`` rows per side
    (at least one bucket)."""
    chosen: list[int] = []
    source_rows = landed_rows = 0
    for bucket in differing:
        source_rows += source.counts.get(bucket, 0)
        landed_rows += landed.counts.get(bucket, 0)
        if chosen and max(source_rows, landed_rows) > max_keys:
            break
        chosen.append(bucket)
    return chosen


# --- the source side --------------------------------------------------------------------------


def landed_data_schema(schema: TableSchema) -> pa.Schema:
    """The data columns of the table as they land (no meta columns)."""
    return pa.schema([pa.field(c.name, c.landed_type) for c in landed_columns(schema)])


def source_chunks(
    dialect: Dialect, schema: TableSchema, key_columns: Sequence[str], chunk_rows: int
) -> Iterator[pa.Table]:
    """The table's rows as they would land, in key-range chunks of at most ``chunk_rows``:
    each chunk is its own short read (as the engine's), so no lock is held across the table,
    and only one chunk is in memory at a time."""
    upto = dialect.max_key(schema, key_columns, None)
    if upto is None:
        return
    convert = dialect.row_converter(schema)
    data_schema = landed_data_schema(schema)
    after = None
    while True:
        spec = ChunkSpec(schema, tuple(key_columns), after, upto, None, chunk_rows)
        chunk = dialect.read_chunk(spec)
        if chunk.last_key is None:
            return
        rows = chunk.rows.to_pylist()
        if convert is not None:
            rows = [convert(row) for row in rows]
        yield pa.Table.from_arrays(rows_to_landed(schema, rows), schema=data_schema)
        if chunk.rows.num_rows < chunk_rows:
            return
        after = chunk.last_key


def summarise_source(
    dialect: Dialect, schema: TableSchema, key_columns: Sequence[str], chunk_rows: int
) -> Summary:
    summary = Summary()
    for data in source_chunks(dialect, schema, key_columns, chunk_rows):
        key_hash, row_hash = hash_rows(data, key_columns)
        summary.add_rows(key_hash, row_hash)
    return summary


def source_rows_in(
    dialect: Dialect,
    schema: TableSchema,
    key_columns: Sequence[str],
    buckets: Sequence[int],
    chunk_rows: int,
) -> pa.Table:
    """The source rows (landed data columns and both hashes) whose key falls in ``buckets``."""
    wanted = pa.array(sorted(buckets), pa.int64())
    parts = []
    for data in source_chunks(dialect, schema, key_columns, chunk_rows):
        key_hash, row_hash = hash_rows(data, key_columns)
        keep = pc.is_in(bucket_of(key_hash), value_set=wanted)
        hashed = data.append_column(KEY_HASH, key_hash).append_column(ROW_HASH, row_hash)
        parts.append(hashed.filter(keep))
    if not parts:
        data_schema = landed_data_schema(schema)
        hashes = [pa.field(KEY_HASH, pa.int64()), pa.field(ROW_HASH, pa.int64())]
        return pa.schema([*data_schema, *hashes]).empty_table()
    return pa.concat_tables(parts)


# --- the landed side (Spark) ------------------------------------------------------------------


def _hash_udf(names: Sequence[str], key_columns: Sequence[str]) -> Callable[[Column], Column]:
    """An Arrow UDF: a struct of the data columns -> struct<k, r> of their two hashes."""
    from pyspark import cloudpickle
    from pyspark.sql.pandas.functions import ArrowUDFType, arrow_udf

    # Ship the hash (and this closure's module) by value: executors of a cluster (or a
    # Spark Connect server) need pyarrow, not snapshotter.
    cloudpickle.register_pickle_by_value(hash_module)  # type: ignore[no-untyped-call]
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]
    columns, keys = list(names), list(key_columns)

    def hashes(rows: pa.Array) -> pa.Array:
        data = pa.Table.from_arrays(rows.flatten(), names=columns)
        key, row = hash_rows(data, keys)
        return pa.StructArray.from_arrays([key, row], names=["k", "r"])

    with warnings.catch_warnings():
        # The kind is given (arrow_udf's typed overloads need it); PySpark would rather read
        # it from type hints, and warns.
        warnings.simplefilter("ignore", UserWarning)
        udf = arrow_udf(hashes, "struct<k: bigint, r: bigint>", ArrowUDFType.SCALAR)
    return udf


class LandedSide:
    """The landed current state's data columns, in the source's column order, with hashes."""

    def __init__(self, state: DataFrame, names: Sequence[str], key_columns: Sequence[str]):
        from pyspark.sql import functions as F

        from snapshotter.sinks.spark.lander import quote

        self.names = list(names)
        present = set(state.columns)
        # A source column the landed state lacks compares as NULL (and is noted).
        data = state.select(
            *[F.col(quote(n)) if n in present else F.lit(None).alias(n) for n in names]
        )
        hashes = _hash_udf(names, key_columns)(F.struct(*[F.col(quote(n)) for n in names]))
        # The hashes are computed once per row; the bucket is their low bits, as bucket_of.
        self._hashed = data.withColumn(_HASHES, hashes).withColumn(
            _BUCKET, F.col(f"{_HASHES}.k").bitwiseAND(F.lit(BUCKETS - 1))
        )

    def summary(self) -> Summary:
        """Counts and row-hash sums per bucket, aggregated by Spark. Spark sums longs with
        overflow checks, so the 64-bit hashes are summed as two 32-bit halves."""
        from pyspark.sql import functions as F

        row = F.col(f"{_HASHES}.r")
        grouped = self._hashed.groupBy(_BUCKET).agg(
            F.count(F.lit(1)).alias("n"),
            F.sum(F.shiftrightunsigned(row, 32)).alias("hi"),
            F.sum(row.bitwiseAND(F.lit(0xFFFFFFFF))).alias("lo"),
        )
        summary = Summary()
        rows = grouped.collect()
        summary.add(
            [r[_BUCKET] for r in rows],
            [r["n"] for r in rows],
            [(r["hi"] << 32) + r["lo"] for r in rows],
        )
        return summary

    def rows_in(self, buckets: Sequence[int]) -> pa.Table:
        """The landed rows (data columns and both hashes) whose key falls in ``buckets``."""
        from pyspark.sql import functions as F

        from snapshotter.sinks.spark.lander import quote

        picked = self._hashed.where(F.col(_BUCKET).isin(list(buckets))).select(
            *[F.col(quote(n)) for n in self.names],
            F.col(f"{_HASHES}.k").alias(KEY_HASH),
            F.col(f"{_HASHES}.r").alias(ROW_HASH),
        )
        table: pa.Table = picked.toArrow()
        return table

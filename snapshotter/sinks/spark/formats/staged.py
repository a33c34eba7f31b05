"""Staged Parquet files read as one DataFrame when a column's type changed between them (a
column widened at the source mid-stream: batches staged before hold an int, after a
bigint). Spark's ``mergeSchema`` refuses two types for one column, so files are read in
groups of one schema each and the groups' columns cast to the widest type (Iceberg's type
promotions, which the table formats apply too) before a union by name."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StructType,
)

from snapshotter.sinks.spark.latest import quote

_PROMOTIONS = {
    (ShortType, IntegerType),
    (ShortType, LongType),
    (IntegerType, LongType),
    (FloatType, DoubleType),
}


class SchemaChangeError(RuntimeError):
    """A column's type changed in a way no table format can follow (not a widening)."""


def widens(before: DataType, after: DataType) -> bool:
    """Whether ``before`` -> ``after`` is a type promotion (Iceberg's: int to bigint, float
    to double, a decimal's precision raised at the same scale)."""
    if isinstance(before, DecimalType) and isinstance(after, DecimalType):
        return after.scale == before.scale and after.precision > before.precision
    return (type(before), type(after)) in _PROMOTIONS


def _schema_key(path: str) -> tuple[tuple[str, str], ...]:
    """The column names and types of a staged file (or of the first file of a staged
    directory: the executor-read path), from its footer."""
    p = Path(path)
    first = p if not p.is_dir() else next(iter(sorted(p.rglob("*.parquet"))), None)
    if first is None:
        return ()
    schema = pq.read_schema(first)
    return tuple((n, str(t)) for n, t in zip(schema.names, schema.types, strict=True))


def read_staged(spark: SparkSession, paths: Sequence[str]) -> DataFrame:
    """``paths`` as one DataFrame, columns missing from some files NULL there, a column of
    two types at its wider one."""
    groups: dict[tuple[tuple[str, str], ...], list[str]] = {}
    for path in paths:
        groups.setdefault(_schema_key(path), []).append(path)
    frames = [spark.read.option("mergeSchema", "true").parquet(*g) for g in groups.values()]
    if len(frames) == 1:
        return frames[0]
    widest: dict[str, DataType] = {}
    for frame in frames:
        for field in frame.schema.fields:
            have = widest.get(field.name)
            if have is None or widens(have, field.dataType):
                widest[field.name] = field.dataType
            elif isinstance(have, StructType) and isinstance(field.dataType, StructType):
                continue  # unionByName widens a struct's fields and adds its missing ones
            elif have != field.dataType and not widens(field.dataType, have):
                raise SchemaChangeError(
                    f"column {field.name} is staged as both {have.simpleString()} and "
                    f"{field.dataType.simpleString()}: only int to bigint, float to double and "
                    "a decimal's precision can change while landing; land the table into "
                    "another path"
                )
    union: DataFrame | None = None
    for frame in frames:
        cast = frame.select(
            *[
                F.col(quote(f.name)).cast(widest[f.name]).alias(f.name)
                if f.dataType != widest[f.name] and not isinstance(f.dataType, StructType)
                else F.col(quote(f.name))
                for f in frame.schema.fields
            ]
        )
        union = cast if union is None else union.unionByName(cast, allowMissingColumns=True)
    assert union is not None
    return union


def with_dropped(rows: DataFrame, table: StructType | None) -> DataFrame:
    """``rows`` with the ``table``'s top-level columns it lacks (a column dropped at the
    source, kept in the landed table) as NULLs of the table's type: so a MERGE sets them NULL
    in the rows it updates too, not only in those it inserts."""
    if table is None:
        return rows
    have = set(rows.columns)
    missing = [f for f in table.fields if f.name not in have]
    return rows.select("*", *[F.lit(None).cast(f.dataType).alias(f.name) for f in missing])


def widened(rows: DataFrame, staged: StructType) -> DataFrame:
    """``rows`` (a landed table's) with each column that ``staged`` has wider cast to it; so
    too a struct's fields (a before-image)."""
    wide = {f.name: f.dataType for f in staged.fields}
    columns = []
    for field in rows.schema.fields:
        column, want = F.col(quote(field.name)), wide.get(field.name)
        if isinstance(field.dataType, StructType) and isinstance(want, StructType):
            inner = {f.name: f.dataType for f in want.fields}
            parts = [
                column.getField(f.name).cast(inner[f.name]).alias(f.name)
                if f.name in inner and widens(f.dataType, inner[f.name])
                else column.getField(f.name).alias(f.name)
                for f in field.dataType.fields
            ]
            column = F.when(column.isNull(), None).otherwise(F.struct(*parts))
        elif want is not None and widens(field.dataType, want):
            column = column.cast(want)
        columns.append(column.alias(field.name))
    return rows.select(*columns)

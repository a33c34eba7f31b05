"""Spark's ``pmod(xxhash64(<key columns>), n)`` computed with numpy, for integer-like keys.

A Parquet ``current/`` puts a key in bucket ``pmod(xxhash64(key columns), n)`` as Spark
computes it (``parquet.bucket_of``). To bucket files with pyarrow, without a Spark job, the
same value must come out here, bit for bit: Spark's XXH64 with seed 42, chained over the key
columns (each column's hash is the next one's seed), each value hashed by its Spark type:
``hashInt`` (4 bytes) for byte, short, int and date columns, ``hashLong`` (8 bytes) for long
and timestamp columns. Other types (strings, decimals, floats, unsigned integers, timestamps
of another unit than microseconds) answer None here: their rows are bucketed by Spark.
tests/integration/test_spark_hash.py compares every supported type with Spark's own.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SEED = 42  # Spark's xxhash64 seed
_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)
_P4 = np.uint64(0x85EBCA77C2B2AE63)
_P5 = np.uint64(0x27D4EB2F165667C5)
_LOW32 = np.uint64(0xFFFFFFFF)


def supported(types: list[pa.DataType]) -> bool:
    """Whether keys of these (Parquet-read) types are hashed here as Spark hashes them."""
    return all(_width(t) is not None for t in types)


def buckets(columns: list[pa.ChunkedArray | pa.Array], count: int) -> np.ndarray | None:
    """Per row, its bucket of ``count`` (None: a type or a NULL this module does not hash)."""
    if not columns or not supported([c.type for c in columns]):
        return None
    if any(c.null_count for c in columns):
        return None
    rows = len(columns[0])
    hashed = np.full(rows, SEED, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for column in columns:
            width = _width(column.type)
            values = _int64(column)
            hashed = _hash_int(values, hashed) if width == 4 else _hash_long(values, hashed)
    signed = hashed.view(np.int64)
    return np.mod(signed, count)  # numpy's modulo of a positive count: Spark's pmod


def _width(t: pa.DataType) -> int | None:
    """Bytes Spark hashes a value of type ``t`` as (None: not done here)."""
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_int32(t):
        return 4
    if pa.types.is_date32(t):
        return 4
    if pa.types.is_int64(t):
        return 8
    if pa.types.is_timestamp(t) and t.unit == "us":
        return 8
    return None


def _int64(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """The column's values as int64 (sign-extended, as Java widens a byte, short or int)."""
    t = column.type
    if pa.types.is_date32(t):
        column = pc.cast(column, pa.int32())
    elif pa.types.is_timestamp(t):
        column = pc.cast(column, pa.int64())
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    rotated: np.ndarray = (x << np.uint64(r)) | (x >> np.uint64(64 - r))
    return rotated


def _fmix(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint64(33))
    h = h * _P2
    h = h ^ (h >> np.uint64(29))
    h = h * _P3
    mixed: np.ndarray = h ^ (h >> np.uint64(32))
    return mixed


def _hash_int(values: np.ndarray, seed: np.ndarray) -> np.ndarray:
    h = seed + _P5 + np.uint64(4)
    h = h ^ ((values.view(np.uint64) & _LOW32) * _P1)
    h = _rotl(h, 23) * _P2 + _P3
    return _fmix(h)


def _hash_long(values: np.ndarray, seed: np.ndarray) -> np.ndarray:
    h = seed + _P5 + np.uint64(8)
    h = h ^ (_rotl(values.view(np.uint64) * _P2, 31) * _P1)
    h = _rotl(h, 27) * _P1 + _P4
    return _fmix(h)

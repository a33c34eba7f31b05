"""PostgreSQL key values without a server: every NaN a float column loads is the one NaN keys
use, so a row keyed by NaN is the same key in the chunk and in the log (an update of it is an
update, not a key change); infinities load as floats."""

from __future__ import annotations

import math

from snapshotter.core.keys import NAN
from snapshotter.sources.postgres import types as pg_types

FLOAT4, FLOAT8 = 700, 701


def test_nan_loads_as_the_one_nan_of_keys() -> None:
    transformer = pg_types.transformer()
    for oid in (FLOAT4, FLOAT8):
        load = transformer.get_loader(oid, 0).load
        assert load(b"NaN") is NAN
        assert load(memoryview(b"NaN")) is NAN
        assert (load(b"NaN"), "k") == (load(b"NaN"), "k")  # keys holding it are equal
        assert load(b"Infinity") == math.inf and load(b"-Infinity") == -math.inf
        assert math.copysign(1.0, load(b"-0")) == -1.0
        assert load(b"1.1") == 1.1


def test_the_chunk_loader_and_the_log_loader_are_one() -> None:
    assert pg_types.pg_type(FLOAT8).loader is pg_types.FloatLoader
    assert pg_types.adapters().get_loader(FLOAT8, 0) is pg_types.FloatLoader


def test_output_text_tells_null_from_a_row_of_nulls() -> None:
    # concat() writes a value with its type's output function; num_nonnulls() is 1 for a
    # composite whose fields are all NULL, which IS NULL would call NULL.
    sql = pg_types.OUTPUT_TEXT.format('"k"')
    assert sql == 'CASE WHEN num_nonnulls("k") = 1 THEN concat("k") END'

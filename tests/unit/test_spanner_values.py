"""Spanner's value model: a chunk read's value (as the client library hands it over) and the
same stored value in a change stream's mod (JSON) convert to one value, for every type
(hypothesis against the encodings measured on the emulator, docs/spanner.md); the catalog's
type names of both dialects parse to the same families."""

from __future__ import annotations

import base64
import datetime as dt
import json
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snapshotter.core.values import RawJson
from snapshotter.sources.spanner.types import (
    SpannerType,
    arrow_type,
    mod_converter,
    parse_timestamp,
    parse_type,
    read_converter,
)

INT64 = st.integers(-(2**63), 2**63 - 1)
FLOATS = st.floats(allow_nan=False, allow_infinity=False)
TEXT = st.text(max_size=30)
TIMESTAMPS = st.datetimes(
    min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30), timezones=st.just(dt.UTC)
)
JSON_DOCS = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)


def _client_timestamp(value: dt.datetime) -> Any:
    from google.api_core.datetime_helpers import DatetimeWithNanoseconds

    return DatetimeWithNanoseconds(
        value.year,
        value.month,
        value.day,
        value.hour,
        value.minute,
        value.second,
        value.microsecond,
        tzinfo=dt.UTC,
    )


def _rfc3339(value: dt.datetime, *, nanos: str = "") -> str:
    fraction = f".{value.microsecond:06d}{nanos}" if value.microsecond or nanos else ""
    return f"{value.year:04d}-" + value.strftime("%m-%dT%H:%M:%S") + fraction + "Z"


def _json_object(doc: Any) -> Any:
    from google.cloud.spanner_v1.data_types import JsonObject

    return JsonObject(doc)


# type -> strategy of (client value, mod value)
PAIRS: dict[str, st.SearchStrategy[tuple[Any, Any]]] = {
    "INT64": INT64.map(lambda v: (v, str(v))),
    "FLOAT64": FLOATS.map(lambda v: (v, v)),
    "BOOL": st.booleans().map(lambda v: (v, v)),
    "STRING": TEXT.map(lambda v: (v, v)),
    "BYTES": st.binary(max_size=40).map(
        lambda v: (base64.b64encode(v), base64.b64encode(v).decode("ascii"))
    ),
    "DATE": st.dates().map(lambda v: (v, v.isoformat())),
    "TIMESTAMP": TIMESTAMPS.map(lambda v: (_client_timestamp(v), _rfc3339(v, nanos="789"))),
    "NUMERIC": st.decimals(allow_nan=False, allow_infinity=False, places=9).map(
        lambda v: (Decimal(str(v)), str(v))
    ),
    "JSON": JSON_DOCS.filter(lambda d: d is not None).map(
        lambda d: (_json_object(d), json.dumps(d, separators=(",", ":")))
    ),
}


@settings(max_examples=60, deadline=None)
@given(st.data())
@pytest.mark.parametrize("family", sorted(PAIRS))
def test_a_read_value_and_a_mod_value_are_one_value(family: str, data: st.DataObject) -> None:
    client, mod = data.draw(PAIRS[family])
    t = SpannerType(family)
    read = read_converter(t)
    from_read = client if read is None else read(client)
    assert from_read == mod_converter(t)(mod)
    assert read_converter(t) is None or read_converter(t)(None) is None  # type: ignore[misc]
    assert mod_converter(t)(None) is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.none() | INT64, max_size=6))
def test_an_array_is_one_text_from_either_side(values: list[int | None]) -> None:
    t = SpannerType("ARRAY", SpannerType("INT64"))
    read = read_converter(t)
    assert read is not None
    # The emulator writes a NULL element as the text "NULL".
    mod = ["NULL" if v is None else str(v) for v in values]
    assert read(values) == mod_converter(t)(mod) == json.dumps(values, separators=(",", ":"))


def test_json_becomes_compact_sorted_text() -> None:
    read = read_converter(SpannerType("JSON"))
    assert read is not None
    assert read(_json_object({"b": 1, "a": [1, "ü"]})) == RawJson('{"a":[1,"ü"],"b":1}')
    assert mod_converter(SpannerType("JSON"))('{"b": 1, "a": [1, "ü"]}') == RawJson(
        '{"a":[1,"ü"],"b":1}'
    )


def test_timestamps_keep_microseconds_and_read_any_fraction() -> None:
    assert parse_timestamp("2024-01-02T03:04:05Z") == dt.datetime(
        2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC
    )
    assert parse_timestamp("2024-01-02T03:04:05.1Z").microsecond == 100000
    assert parse_timestamp("2024-01-02T03:04:05.123456789Z").microsecond == 123456
    assert parse_timestamp("2026-11-27T08:28:21.121215+00:00").microsecond == 121215


def test_nan_and_infinity_as_text_are_floats() -> None:
    conv = mod_converter(SpannerType("FLOAT64"))
    assert conv("Infinity") == float("inf")
    assert conv(None) is None


@pytest.mark.parametrize(
    ("googlesql", "postgresql", "family"),
    [
        ("INT64", "bigint", "INT64"),
        ("FLOAT64", "double precision", "FLOAT64"),
        ("BOOL", "boolean", "BOOL"),
        ("STRING(MAX)", "character varying", "STRING"),
        ("STRING(16)", "character varying(16)", "STRING"),
        ("BYTES(MAX)", "bytea", "BYTES"),
        ("DATE", "date", "DATE"),
        ("TIMESTAMP", "timestamp with time zone", "TIMESTAMP"),
        ("TIMESTAMP", "spanner.commit_timestamp", "TIMESTAMP"),
        ("NUMERIC", "numeric", "NUMERIC"),
        ("JSON", "jsonb", "JSON"),
    ],
)
def test_both_dialects_type_names_are_one_family(
    googlesql: str, postgresql: str, family: str
) -> None:
    assert parse_type(googlesql) == parse_type(postgresql) == SpannerType(family)
    assert arrow_type(parse_type(googlesql)) == arrow_type(parse_type(postgresql))


def test_arrays_of_both_dialects() -> None:
    assert (
        parse_type("ARRAY<INT64>")
        == parse_type("bigint[]")
        == SpannerType("ARRAY", SpannerType("INT64"))
    )
    assert parse_type("ARRAY<STRING(MAX)>") == SpannerType("ARRAY", SpannerType("STRING"))

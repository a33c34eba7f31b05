"""The typed key codec: every key survives JSON with its exact Python type and value."""

from __future__ import annotations

import json
import math
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any
from uuid import UUID

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snapshotter.core.keys import NAN, KeyCodecError, decode_key, encode_key, normalize_key

PLUS_0530 = timezone(timedelta(hours=5, minutes=30))
MINUS_8 = timezone(timedelta(hours=-8))


def through_json(key: Any) -> tuple[Any, ...]:
    return decode_key(json.loads(json.dumps(encode_key(key))))


def assert_identical(got: tuple[Any, ...], expected: tuple[Any, ...]) -> None:
    """Equal, and equal in every way a key can differ while comparing equal."""
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        if isinstance(e, bytearray | memoryview):
            e = bytes(e)
        assert type(g) is type(e), (g, e)
        if isinstance(e, float):
            assert repr(g) == repr(e)  # -0.0 stays -0.0; nan stays nan
        elif isinstance(e, Decimal):
            assert str(g) == str(e)  # the scale survives
        elif isinstance(e, datetime | time):
            assert g == e
            assert g.tzinfo is None if e.tzinfo is None else g.utcoffset() == e.utcoffset()
            assert g.isoformat() == e.isoformat()
        else:
            assert g == e


SCALARS: list[tuple[str, Any]] = [
    ("int-zero", 0),
    ("int-negative", -17),
    ("int-huge", 2**64 + 12345),
    ("int-huge-negative", -(2**70)),
    ("bool-true", True),
    ("bool-false", False),
    ("float", 1.5),
    ("float-tiny", 5e-324),
    ("float-inf", math.inf),
    ("float-minus-inf", -math.inf),
    ("float-minus-zero", -0.0),
    ("float-nan", math.nan),  # PostgreSQL's float keys: NaN sorts above every number
    ("decimal-scale", Decimal("12.30")),
    ("decimal-negative-zero-scale", Decimal("-0.000")),
    ("decimal-exponent", Decimal("1E+5")),
    ("decimal-long", Decimal("123456789012345678901234567890.123456789")),
    ("text-empty", ""),
    ("text-unicode", "Grüße ☃ 𝄞 日本語"),
    ("text-control", 'quote " backslash \\ nul \x00 newline \n'),
    ("text-surrogate", "\ud800"),
    ("bytes", b"\x00\xff\x10abc"),
    ("bytes-empty", b""),
    ("bytearray", bytearray(b"\x01\x02")),
    ("memoryview", memoryview(b"mv\x00")),
    ("uuid", UUID("12345678-1234-5678-1234-567812345678")),
    ("date", date(2024, 2, 29)),
    ("date-min", date(1, 1, 1)),
    ("timestamp-micros", datetime(2024, 1, 2, 3, 4, 5, 678901)),
    ("timestamptz-utc", datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=UTC)),
    ("timestamptz-offset", datetime(2024, 1, 2, 3, 4, 5, tzinfo=PLUS_0530)),
    ("timestamptz-negative", datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=MINUS_8)),
    ("time", time(23, 59, 59, 999999)),
    ("time-midnight", time(0, 0)),
    ("timetz", time(12, 30, 1, 5, tzinfo=PLUS_0530)),
    ("duration", timedelta(hours=-838, minutes=-59, seconds=-59)),  # MySQL's TIME
    ("duration-micro", timedelta(microseconds=-1)),
    ("duration-zero", timedelta(0)),
]


@pytest.mark.parametrize("value", [v for _, v in SCALARS], ids=[n for n, _ in SCALARS])
def test_single_value_round_trips_with_its_type(value: Any) -> None:
    assert_identical(through_json((value,)), (value,))


def test_bytes_likes_come_back_as_bytes() -> None:
    got = through_json((bytearray(b"ab"), memoryview(b"cd"), b"ef"))
    assert got == (b"ab", b"cd", b"ef")
    assert all(type(v) is bytes for v in got)


def test_aware_timestamp_keeps_its_offset_not_just_the_instant() -> None:
    value = datetime(2024, 6, 1, 12, 0, tzinfo=PLUS_0530)
    (got,) = through_json((value,))
    assert got.utcoffset() == timedelta(hours=5, minutes=30)
    assert got.hour == 12


def test_decimal_scale_is_kept() -> None:
    (got,) = through_json((Decimal("12.30"),))
    assert str(got) == "12.30"
    assert got.as_tuple().exponent == -2


def test_composite_key_round_trips() -> None:
    key = (
        42,
        "région",
        Decimal("0.10"),
        b"\x00",
        UUID(int=7),
        date(2020, 1, 1),
        datetime(2020, 1, 1, 0, 0, 0, 1),
        datetime(2020, 1, 1, tzinfo=MINUS_8),
        time(1, 2, 3),
        False,
        -0.0,
    )
    assert_identical(through_json(key), key)


def test_encoded_form_is_readable_typed_json() -> None:
    encoded = encode_key((Decimal("12.30"), "x", 7, b"\x00\x01"))
    assert encoded == [
        {"type": "decimal", "value": "12.30"},
        {"type": "text", "value": "x"},
        {"type": "int", "value": 7},
        {"type": "bytes", "value": "AAE="},
    ]


def test_bool_is_not_encoded_as_int_and_datetime_not_as_date() -> None:
    assert encode_key((True,)) == [{"type": "bool", "value": True}]
    assert encode_key((datetime(2020, 1, 1),))[0]["type"] == "timestamp"
    assert encode_key((datetime(2020, 1, 1, tzinfo=UTC),))[0]["type"] == "timestamptz"
    assert encode_key((date(2020, 1, 1),))[0]["type"] == "date"
    assert encode_key((time(1, tzinfo=UTC),))[0]["type"] == "timetz"


def test_normalize_key_turns_bytes_likes_into_bytes_and_checks_values() -> None:
    assert normalize_key([bytearray(b"a"), memoryview(b"b"), 1]) == (b"a", b"b", 1)
    with pytest.raises(KeyCodecError):
        normalize_key((1, None))
    with pytest.raises(KeyCodecError):
        normalize_key(())


# --- hypothesis ----------------------------------------------------------------------------

offsets = st.integers(-(23 * 60 + 59), 23 * 60 + 59).map(lambda m: timezone(timedelta(minutes=m)))
key_values = st.one_of(
    st.integers(min_value=-(2**80), max_value=2**80),
    st.booleans(),
    st.floats(),
    st.timedeltas(),
    st.decimals(allow_nan=False, allow_infinity=False),
    st.text(),
    st.binary(),
    st.binary().map(bytearray),
    st.uuids(),
    st.dates(),
    st.datetimes(),
    st.datetimes(timezones=offsets),
    st.times(),
    st.times(timezones=offsets),
)


@settings(max_examples=300, deadline=None)
@given(key=st.lists(key_values, min_size=1, max_size=6).map(tuple))
def test_mixed_tuples_round_trip_through_json(key: tuple[Any, ...]) -> None:
    assert_identical(through_json(key), key)


# --- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        (None,),
        (1, None),
        ([1, 2],),
        ({"a": 1},),
        (object(),),
        ((1, 2),),
        (),
        [],
    ],
    ids=[
        "none",
        "none-second",
        "list",
        "dict",
        "object",
        "tuple",
        "empty-tuple",
        "empty-list",
    ],
)
def test_unencodable_keys_raise(key: Any) -> None:
    with pytest.raises(KeyCodecError):
        encode_key(key)


def test_null_error_says_null() -> None:
    with pytest.raises(KeyCodecError, match="NULL"):
        encode_key((None,))


def test_unsupported_type_error_names_the_type() -> None:
    with pytest.raises(KeyCodecError, match="list"):
        encode_key(([1],))


@pytest.mark.parametrize(
    "obj",
    [
        [],
        None,
        {"type": "int", "value": 1},  # not a list
        "[]",
        [{"type": "nope", "value": 1}],
        [{"type": None, "value": 1}],
        [{"type": ["int"], "value": 1}],  # unhashable type name
        [{"type": "int"}],
        [{"value": 1}],
        [{}],
        [{"type": "int", "value": 1, "extra": 2}],
        [1],
        ["int"],
        [{"type": "int", "value": "1"}],
        [{"type": "int", "value": 1.0}],
        [{"type": "int", "value": True}],
        [{"type": "int", "value": None}],
        [{"type": "text", "value": 1}],
        [{"type": "text", "value": None}],
        [{"type": "bool", "value": 1}],
        [{"type": "bool", "value": "true"}],
        [{"type": "bytes", "value": "not base64!"}],
        [{"type": "bytes", "value": "AAE"}],  # bad padding
        [{"type": "bytes", "value": 5}],
        [{"type": "float", "value": "-nan"}],
        [{"type": "duration", "value": "1"}],
        [{"type": "duration", "value": 1.5}],
        [{"type": "duration", "value": True}],
        [{"type": "float", "value": "one"}],
        [{"type": "decimal", "value": "12,30"}],
        [{"type": "decimal", "value": None}],
        [{"type": "uuid", "value": "not-a-uuid"}],
        [{"type": "uuid", "value": 5}],
        [{"type": "uuid", "value": None}],
        [{"type": "date", "value": "2024-02-30"}],
        [{"type": "date", "value": 20240101}],
        [{"type": "timestamp", "value": "yesterday"}],
        [{"type": "timestamptz", "value": "2024-01-02T03:04:05"}],
        [{"type": "timestamptz", "value": 5}],
        [{"type": "time", "value": "25:00"}],
        [{"type": "int", "value": 1}, {"type": "nope", "value": 1}],
    ],
)
def test_undecodable_json_raises_key_codec_error(obj: Any) -> None:
    with pytest.raises(KeyCodecError):
        decode_key(obj)


def test_timestamptz_without_offset_error_mentions_the_offset() -> None:
    with pytest.raises(KeyCodecError, match="offset"):
        decode_key([{"type": "timestamptz", "value": "2024-01-02T03:04:05"}])


def test_bool_is_not_an_int() -> None:
    with pytest.raises(KeyCodecError, match="int"):
        decode_key([{"type": "int", "value": True}])


def test_key_codec_error_is_a_value_error() -> None:
    assert issubclass(KeyCodecError, ValueError)


@pytest.mark.parametrize(
    "obj",
    [
        {"type": "float", "value": 1.5},  # written as text; a JSON number is not coerced
        {"type": "float", "value": True},
        {"type": "decimal", "value": 12},
        {"type": "timestamp", "value": "2024-01-01T00:00:00+02:00"},  # aware is timestamptz
        {"type": "time", "value": "10:00:00+02:00"},
        {"type": "timetz", "value": "10:00:00"},
        {"type": "date", "value": 20240101},
        {"type": "bytes", "value": 5},
    ],
)
def test_decoding_never_coerces(obj: dict[str, Any]) -> None:
    with pytest.raises(KeyCodecError):
        decode_key([obj])


@pytest.mark.parametrize("key", ["abc", b"abc", 5])
def test_a_bare_string_or_scalar_is_not_a_key(key: Any) -> None:
    with pytest.raises(KeyCodecError, match="tuple of column values"):
        encode_key(key)
    with pytest.raises(KeyCodecError, match="tuple of column values"):
        normalize_key(key)


# --- NaN and durations ---------------------------------------------------------------------


def test_nan_is_one_object_so_keys_holding_it_are_equal() -> None:
    read = through_json((math.nan, "a"))
    again = normalize_key((float("nan"), "a"))
    assert read[0] is NAN and again[0] is NAN
    assert read == again and hash(read) == hash(again)
    assert {read: 1}[again] == 1
    assert encode_key((float("-nan"),)) == [{"type": "float", "value": "nan"}]
    assert decode_key([{"type": "float", "value": "NaN"}])[0] is NAN


def test_a_duration_is_kept_to_the_microsecond() -> None:
    value = timedelta(days=-35, seconds=3601, microseconds=1)
    assert encode_key((value,)) == [
        {"type": "duration", "value": value // timedelta(microseconds=1)}
    ]
    assert through_json((value,)) == (value,)


def test_a_state_with_a_nan_maximum_key_saves_and_loads() -> None:
    from snapshotter.core.state import EngineState, TableProgress

    progress = TableProgress(table="public.t", signal_id="s", key_columns=["k"])
    progress.start((math.nan,))
    state = EngineState(snapshots=[progress])
    loaded = EngineState.from_json(state.to_json())
    (saved,) = loaded.snapshots
    assert saved.max_key is not None and saved.max_key[0] is NAN
    saved.chunk_done(last_key=(1.5,), selected=2, emitted=2, chunk_size=2)
    assert saved.status.value == "running"
    saved.chunk_done(last_key=(math.nan,), selected=1, emitted=1, chunk_size=2)
    assert saved.status.value == "done"

"""The PostgreSQL chunk reader's Arrow conversion (pure): the driver's types to the table's,
values Python cannot hold refused as the log decoder's loaders refuse them, float text parsed
as the loaders parse it, the last key as the loaders give it."""

from __future__ import annotations

import datetime as dt
import math

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from snapshotter.sources.postgres import arrow as pg_arrow
from snapshotter.sources.postgres import types as pg_types

_UTC = pa.timestamp("us", tz="UTC")


def test_every_type_read_by_type_is_one_the_log_loaders_load_by_type() -> None:
    for oid in (*pg_arrow.BINARY_EXACT, 700, 701, 26):
        assert pg_types.loaded_natively(oid), oid
    for oid in pg_types.PG_TYPES:
        how = pg_arrow.how_read(oid, float_text=False)
        assert how is not pg_arrow.Read.OUTPUT_TEXT or oid == 18, oid  # "char": its text
    assert pg_arrow.how_read(1700, False) is pg_arrow.Read.OUTPUT_TEXT  # numeric
    assert pg_arrow.how_read(700, False) is pg_arrow.Read.FLOAT_TEXT
    assert pg_arrow.how_read(701, False) is pg_arrow.Read.AS_IS
    assert pg_arrow.how_read(701, True) is pg_arrow.Read.TEXT
    assert pg_arrow.how_read(26, False) is pg_arrow.Read.BIGINT


@given(
    st.lists(st.none() | st.integers(-(2**15), 2**15 - 1)),
    st.lists(st.none() | st.integers(-(2**31), 2**31 - 1), min_size=0),
)
def test_integer_widths_become_int64(small: list[int | None], medium: list[int | None]) -> None:
    n = min(len(small), len(medium))
    table = pa.table({"a": pa.array(small[:n], pa.int16()), "b": pa.array(medium[:n], pa.int32())})
    schema = pa.schema([("a", pa.int64()), ("b", pa.int64())])
    out = pg_arrow.to_schema(table, schema)
    assert out.schema == schema
    assert out.column("a").to_pylist() == small[:n] and out.column("b").to_pylist() == medium[:n]


@given(
    st.lists(st.none() | st.dates(), max_size=20),
    st.lists(st.none() | st.datetimes(), max_size=20),
    st.lists(st.none() | st.times(), max_size=20),
)
def test_dates_and_times_python_holds_pass_unchanged(
    dates: list[dt.date | None], stamps: list[dt.datetime | None], times: list[dt.time | None]
) -> None:
    n = min(len(dates), len(stamps), len(times))
    aware = [None if s is None else s.replace(tzinfo=dt.UTC) for s in stamps[:n]]
    table = pa.table(
        {
            "d": pa.array(dates[:n], pa.date32()),
            "ts": pa.array(stamps[:n], pa.timestamp("us")),
            "tz": pa.array(aware, _UTC),
            "t": pa.array(times[:n], pa.time64("us")),
        }
    )
    out = pg_arrow.to_schema(table, table.schema)
    assert out.equals(table)


_DAY = 86_400_000_000  # microseconds


@pytest.mark.parametrize(
    ("column", "what"),
    [
        (pa.array([0, -719_163], pa.int32()).cast(pa.date32()), "date"),  # 0000-12-31
        (pa.array([2_932_897], pa.int32()).cast(pa.date32()), "date"),  # 10000-01-01
        (pa.array([-2_147_472_692], pa.int32()).cast(pa.date32()), "date"),  # the driver's infinity
        (
            pa.array([None, 253_402_300_800_000_000], pa.int64()).cast(pa.timestamp("us")),
            "timestamp",
        ),
        (pa.array([-9_222_425_352_054_775_809], pa.int64()).cast(_UTC), "timestamp"),
        (pa.array([-62_135_596_800_000_001], pa.int64()).cast(_UTC), "timestamp"),
        (pa.array([_DAY], pa.int64()).cast(pa.time64("us")), "24:00:00"),
    ],
)
def test_values_python_cannot_hold_are_refused(column: pa.Array, what: str) -> None:
    table = pa.table({"v": column})
    with pytest.raises(pg_arrow.Unrepresentable, match=what):
        pg_arrow.to_schema(table, table.schema)


def test_the_edges_python_holds_pass() -> None:
    table = pa.table(
        {
            "d": pa.array([dt.date(1, 1, 1), dt.date(9999, 12, 31)], pa.date32()),
            "ts": pa.array([dt.datetime(1, 1, 1), dt.datetime.max], pa.timestamp("us")),
            "t": pa.array([dt.time(0), dt.time.max], pa.time64("us")),
        }
    )
    assert pg_arrow.to_schema(table, table.schema).equals(table)


@given(st.lists(st.none() | st.floats(allow_nan=True, allow_infinity=True), max_size=20))
def test_float_text_is_parsed_as_the_loader_parses_it(values: list[float | None]) -> None:
    texts = [None if v is None else _pg_float_text(v) for v in values]
    table = pa.table({"f": pa.array(texts, pa.string())})
    out = pg_arrow.to_schema(table, pa.schema([("f", pa.float64())])).column("f").to_pylist()
    loader = pg_types.transformer().get_loader(701, 0)
    for got, text in zip(out, texts, strict=True):
        want = None if text is None else loader.load(text.encode())
        assert (got is None and want is None) or (
            got is not None
            and want is not None
            and (got == want or math.isnan(got))
            and (math.copysign(1, got) == math.copysign(1, want))
        )


def test_the_rounded_float8_maximum_reads_as_infinity() -> None:
    table = pa.table({"f": pa.array(["1.79769313486232e+308", "-Infinity", "NaN"], pa.string())})
    got = pg_arrow.to_schema(table, pa.schema([("f", pa.float64())])).column("f").to_pylist()
    assert got[0] == math.inf and got[1] == -math.inf and math.isnan(got[2])


def _pg_float_text(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(value)


def test_last_row_key_gives_utc_datetimes_as_the_loaders_do() -> None:
    table = pa.table(
        {
            "a": pa.array([1, 2], pa.int64()),
            "t": pa.array([dt.datetime(2024, 1, 1, tzinfo=dt.UTC)] * 2, _UTC),
        }
    )
    key = pg_arrow.last_row_key(table, ("t", "a"))
    assert key == (dt.datetime(2024, 1, 1, tzinfo=dt.UTC), 2)
    assert key is not None and key[0].tzinfo is dt.UTC
    assert pg_arrow.last_row_key(table.slice(0, 0), ("a",)) is None


class _FakeError(Exception):
    def __init__(self, text: str, details: list[tuple[bytes, bytes]]) -> None:
        super().__init__(text)
        self.details = details


def test_error_message_is_the_servers() -> None:
    error = _FakeError(
        'NOT_FOUND: Failed to prepare query: ERROR:  column "nope" does not exist\n'
        "LINE 1: ...\n\nQuery was: SELECT nope. SQLSTATE: 42703",
        [
            (b"PG_DIAG_MESSAGE_PRIMARY", b'column "nope" does not exist'),
            (b"PG_DIAG_MESSAGE_HINT", b"Perhaps you meant x."),
        ],
    )
    message = pg_arrow.error_message(error)  # type: ignore[arg-type]
    assert message == 'column "nope" does not exist\nHINT: Perhaps you meant x.'
    lost = _FakeError("IO: Failed to prepare query: no connection to the server\nQuery was: X", [])
    assert pg_arrow.error_message(lost) == "Failed to prepare query: no connection to the server"  # type: ignore[arg-type]

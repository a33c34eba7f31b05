"""Positions: total order, fixed-width tokens whose text order is log order."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snapshotter.core.position import Position, PositionError

U64 = 2**64 - 1
U32 = 2**32 - 1
TOKEN_SHAPE = re.compile(r"[0-9a-f]{16}-[0-9a-f]{16}-[0-9a-f]{8}")

positions = st.builds(
    Position,
    st.one_of(st.integers(0, 5), st.integers(0, U64)),
    st.one_of(st.integers(0, 5), st.integers(0, U64)),
    st.one_of(st.integers(0, 5), st.integers(0, U32)),
)


def test_token_is_fixed_width_lower_hex() -> None:
    assert Position(0, 0).token == "0000000000000000-0000000000000000-00000000"
    assert Position(U64, U64, U32).token == "ffffffffffffffff-ffffffffffffffff-ffffffff"
    assert Position(0xABC, 1, 2).token == "0000000000000abc-0000000000000001-00000002"
    assert str(Position(1, 2, 3)) == Position(1, 2, 3).token


def test_row_defaults_to_zero() -> None:
    assert Position(5, 6) == Position(5, 6, 0)


@given(p=positions)
def test_token_round_trips_and_has_fixed_width(p: Position) -> None:
    token = p.token
    assert len(token) == 42
    assert TOKEN_SHAPE.fullmatch(token)
    assert Position.from_token(token) == p


@settings(max_examples=200)
@given(ps=st.lists(positions, max_size=30))
def test_token_text_order_is_position_order(ps: list[Position]) -> None:
    assert [p.token for p in sorted(ps)] == sorted(p.token for p in ps)
    assert [Position.from_token(t) for t in sorted(p.token for p in ps)] == sorted(ps)


@given(a=positions, b=positions)
def test_comparisons_agree_with_tokens(a: Position, b: Position) -> None:
    assert (a < b) == (a.token < b.token)
    assert (a == b) == (a.token == b.token)


def test_order_is_major_then_minor_then_row() -> None:
    assert Position(1, 9, 9) < Position(2, 0, 0)
    assert Position(1, 1, 9) < Position(1, 2, 0)
    assert Position(1, 1, 1) < Position(1, 1, 2)


@given(
    watermark=st.builds(
        Position, st.integers(0, U64), st.integers(0, U64 - 1), st.integers(0, U32 - 1000)
    ),
    index=st.integers(0, 999),
)
def test_read_rows_sit_between_the_watermark_and_the_next_event(
    watermark: Position, index: int
) -> None:
    row = watermark.read_row(index)
    next_event = Position(watermark.major, watermark.minor + 1, 0)
    assert watermark < row < next_event
    assert watermark.token < row.token < next_event.token
    assert row < watermark.read_row(index + 1)


def test_read_row_numbers() -> None:
    wm = Position(7, 3, 0)
    assert [wm.read_row(i) for i in range(3)] == [
        Position(7, 3, 1),
        Position(7, 3, 2),
        Position(7, 3, 3),
    ]
    assert Position(7, 3, 5).read_row(0) == Position(7, 3, 6)


def test_read_row_past_the_row_range_raises() -> None:
    with pytest.raises(PositionError):
        Position(1, 1, U32).read_row(0)


@pytest.mark.parametrize(
    "args",
    [
        (-1, 0, 0),
        (0, -1, 0),
        (0, 0, -1),
        (U64 + 1, 0, 0),
        (0, U64 + 1, 0),
        (0, 0, U32 + 1),
        (True, 0, 0),
        (0, False, 0),
        (0, 0, True),
        (1.0, 0, 0),
        ("1", 0, 0),
        (None, 0, 0),
    ],
)
def test_out_of_range_or_wrong_type_components_raise(args: tuple[Any, ...]) -> None:
    with pytest.raises(PositionError):
        Position(*args)


def test_position_error_is_a_value_error() -> None:
    assert issubclass(PositionError, ValueError)


@pytest.mark.parametrize(
    "token",
    [
        "",
        "garbage",
        "0000000000000ABC-0000000000000001-00000002",  # upper-case hex
        "0000000000000abc-0000000000000001-0000000A",
        "000000000000abc-0000000000000001-00000002",  # major too short
        "00000000000000abc-0000000000000001-00000002",  # major too long
        "0000000000000abc-000000000000001-00000002",
        "0000000000000abc-0000000000000001-0000002",
        "0000000000000abc-0000000000000001-000000002",
        "0000000000000abc-0000000000000001",
        "0000000000000abc:0000000000000001:00000002",
        " 0000000000000abc-0000000000000001-00000002",
        "0000000000000abc-0000000000000001-00000002\n",
        "0000000000000abg-0000000000000001-00000002",
        "0x00000000000abc-0000000000000001-00000002",
        "-000000000000abc-0000000000000001-00000002",
        "０000000000000abc-0000000000000001-00000002",  # full-width digit
    ],
)
def test_bad_tokens_raise(token: str) -> None:
    with pytest.raises(PositionError):
        Position.from_token(token)


@given(text=st.text(max_size=50))
def test_random_text_is_either_a_token_or_an_error(text: str) -> None:
    try:
        p = Position.from_token(text)
    except PositionError:
        return
    assert p.token == text


def test_positions_are_hashable_and_frozen() -> None:
    p = Position(1, 2, 3)
    assert {p, Position(1, 2, 3)} == {p}
    with pytest.raises(AttributeError):
        p.major = 5  # type: ignore[misc]

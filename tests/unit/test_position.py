"""Positions: tuples of u64 parts, totally ordered, with tokens whose text order is log order."""

from __future__ import annotations

import copy
import pickle
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snapshotter.core.position import Position, PositionError

U64 = 2**64 - 1
TOKEN_SHAPE = re.compile(r"[0-9a-f]{16}(-[0-9a-f]{16})*")

# Small parts make ties and shared prefixes common; any u64 covers the full width.
parts = st.one_of(st.integers(0, 3), st.integers(0, U64))
part_tuples = st.lists(parts, min_size=1, max_size=4).map(tuple)
positions = part_tuples.map(lambda ps: Position(*ps))


def test_token_is_sixteen_lower_hex_digits_per_part() -> None:
    assert Position(0).token == "0000000000000000"
    assert Position(0, 0).token == "0000000000000000-0000000000000000"
    assert Position(U64, U64, U64).token == "-".join(["ffffffffffffffff"] * 3)
    assert Position(0xABC, 1, 2).token == "0000000000000abc-0000000000000001-0000000000000002"
    assert str(Position(1, 2, 3)) == Position(1, 2, 3).token


def test_parts_are_the_constructor_arguments() -> None:
    assert Position(7).parts == (7,)
    assert Position(5, 6).parts == (5, 6)
    assert Position(1, 2, 3, 4, 5).parts == (1, 2, 3, 4, 5)
    assert type(Position(5, 6).parts) is tuple


def test_a_position_needs_at_least_one_part() -> None:
    with pytest.raises(PositionError, match="at least one part"):
        Position()


def test_equality_is_by_parts_and_arity_matters() -> None:
    assert Position(1, 0) == Position(1, 0)
    assert Position(1, 0) != Position(1, 0, 0)
    assert Position(1) != Position(1, 0)
    assert Position(0, 1) != Position(1, 0)
    assert len({Position(1, 0), Position(1, 0, 0), Position(1, 0)}) == 2


def test_positions_do_not_equal_or_order_against_tuples() -> None:
    assert Position(1, 2) != (1, 2)
    assert Position(1, 2) != "0000000000000001-0000000000000002"
    with pytest.raises(TypeError):
        _ = Position(1, 2) < (1, 3)  # type: ignore[operator]


def test_order_is_left_to_right_and_a_prefix_sorts_first() -> None:
    assert Position(1, 9, 9) < Position(2, 0, 0)
    assert Position(1, 1, 9) < Position(1, 2, 0)
    assert Position(1, 1, 1) < Position(1, 1, 2)
    assert Position(1, 2) < Position(1, 2, 0) < Position(1, 2, U64) < Position(1, 3)
    assert Position(1, U64) < Position(2)
    assert Position(1, 2).token < Position(1, 2, 0).token < Position(1, 3).token
    assert Position(1, 2, 0) >= Position(1, 2) and Position(1, 2) <= Position(1, 2)


@given(p=positions)
def test_token_round_trips_and_has_a_fixed_width_per_part(p: Position) -> None:
    token = p.token
    assert len(token) == 17 * len(p.parts) - 1
    assert TOKEN_SHAPE.fullmatch(token)
    back = Position.from_token(token)
    assert back == p and back.parts == p.parts


@settings(max_examples=200)
@given(tuples=st.lists(part_tuples, max_size=30))
def test_token_text_order_is_tuple_order_across_arities(
    tuples: list[tuple[int, ...]],
) -> None:
    ps = [Position(*t) for t in tuples]
    by_tuple = [Position(*t) for t in sorted(tuples)]
    assert sorted(ps) == by_tuple
    assert sorted(p.token for p in ps) == [p.token for p in by_tuple]
    assert [Position.from_token(t) for t in sorted(p.token for p in ps)] == by_tuple


@given(a=part_tuples, b=part_tuples)
def test_comparisons_agree_with_tuples_and_tokens(a: tuple[int, ...], b: tuple[int, ...]) -> None:
    pa, pb = Position(*a), Position(*b)
    assert (pa < pb) == (a < b) == (pa.token < pb.token)
    assert (pa <= pb) == (a <= b) == (pa.token <= pb.token)
    assert (pa > pb) == (a > b) == (pa.token > pb.token)
    assert (pa == pb) == (a == b) == (pa.token == pb.token)
    assert (pa != pb) == (a != b)
    if pa == pb:
        assert hash(pa) == hash(pb)


@given(a=part_tuples, extra=st.lists(parts, min_size=1, max_size=3).map(tuple))
def test_a_prefix_sorts_before_its_extensions(a: tuple[int, ...], extra: tuple[int, ...]) -> None:
    short, long = Position(*a), Position(*a, *extra)
    assert short < long and short.token < long.token
    assert long.token.startswith(short.token + "-")


# --- READ rows at a close watermark --------------------------------------------------------


def test_read_row_appends_the_index_as_a_part() -> None:
    wm = Position(7, 3)
    assert [wm.read_row(i) for i in range(3)] == [
        Position(7, 3, 0),
        Position(7, 3, 1),
        Position(7, 3, 2),
    ]
    assert wm.read_row(5).parts == (7, 3, 5)
    assert wm.read_row(U64) == Position(7, 3, U64)
    assert Position(9).read_row(0) == Position(9, 0)
    assert wm.read_row(0).read_row(1) == Position(7, 3, 0, 1)  # arity is not capped
    assert wm == Position(7, 3)  # the watermark itself is untouched


@pytest.mark.parametrize("index", [-1, U64 + 1, True, 1.0, "0", None])
def test_read_row_index_out_of_range_or_of_a_wrong_type_raises(index: Any) -> None:
    with pytest.raises(PositionError):
        Position(1, 1).read_row(index)


# Watermarks whose last part can still be incremented, so the next log event exists.
watermarks = st.tuples(
    st.lists(parts, max_size=3), st.one_of(st.integers(0, 3), st.integers(0, U64 - 1))
).map(lambda t: (*t[0], t[1]))


@settings(max_examples=200)
@given(watermark=watermarks, index=st.one_of(st.integers(0, 5), st.integers(0, U64 - 1)))
def test_read_rows_sit_between_the_watermark_and_the_next_event(
    watermark: tuple[int, ...], index: int
) -> None:
    wm = Position(*watermark)
    row = wm.read_row(index)
    next_event = Position(*watermark[:-1], watermark[-1] + 1)
    assert wm < row < next_event
    assert wm.token < row.token < next_event.token
    assert row < wm.read_row(index + 1)
    assert row.token < wm.read_row(index + 1).token


@settings(max_examples=300)
@given(watermark=part_tuples, index=st.integers(0, U64), data=st.data())
def test_no_position_of_the_readers_arity_falls_between_a_watermark_and_its_rows(
    watermark: tuple[int, ...], index: int, data: st.DataObject
) -> None:
    # A log reader uses one arity for every event: any event it emits is either at or before
    # the watermark (and so before its READ rows) or after it (and so after all of them).
    other = data.draw(st.lists(parts, min_size=len(watermark), max_size=len(watermark)))
    event, wm = Position(*other), Position(*watermark)
    row = wm.read_row(index)
    assert (event > wm) == (event > row)
    assert (event.token > wm.token) == (event.token > row.token)


# --- validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        (-1,),
        (0, -1),
        (0, 0, -1),
        (U64 + 1,),
        (0, U64 + 1),
        (0, 0, 0, U64 + 1),
        (True,),
        (0, False),
        (1.0,),
        ("1",),
        (None,),
        (0, 1.5),
    ],
)
def test_out_of_range_or_wrong_type_parts_raise(args: tuple[Any, ...]) -> None:
    with pytest.raises(PositionError):
        Position(*args)


def test_position_error_is_a_value_error() -> None:
    assert issubclass(PositionError, ValueError)


A = "0000000000000abc"
B = "0000000000000001"


@pytest.mark.parametrize(
    "token",
    [
        "",
        "-",
        "garbage",
        "0000000000000ABC",  # upper-case hex
        f"{A}-000000000000000A",
        "000000000000abc",  # a part too short
        "00000000000000abc",  # a part too long
        f"{A}-000000000000001",
        f"{A}-{B}-00000002",  # the old 8-digit row
        f"{A}-",
        f"-{A}",
        f"{A}--{B}",
        f"{A}:{B}",
        f"{A}_{B}",
        f" {A}",
        f"{A}\n",
        f"{A}-{B}\n",
        "0000000000000abg",
        "0x00000000000abc",
        "-000000000000abc",
        "+000000000000abc",
        "０000000000000abc",  # full-width digit
    ],
)
def test_bad_tokens_raise(token: str) -> None:
    with pytest.raises(PositionError):
        Position.from_token(token)


@pytest.mark.parametrize("token", [None, 5, b"0000000000000abc", ["0000000000000abc"]])
def test_a_token_that_is_not_a_string_raises(token: Any) -> None:
    with pytest.raises(PositionError):
        Position.from_token(token)


@given(text=st.text(alphabet="0123456789abcdefABx- \n", max_size=60) | st.text(max_size=40))
def test_random_text_is_either_a_token_or_an_error(text: str) -> None:
    try:
        p = Position.from_token(text)
    except PositionError:
        return
    assert p.token == text


# --- a value type --------------------------------------------------------------------------


def test_positions_are_hashable() -> None:
    p = Position(1, 2, 3)
    assert {p, Position(1, 2, 3)} == {p}
    assert {Position(1, 2): "a"}[Position(1, 2)] == "a"


@pytest.mark.parametrize("name", ["parts", "_parts", "major", "row", "token"])
def test_positions_are_immutable(name: str) -> None:
    p = Position(1, 2, 3)
    with pytest.raises(AttributeError):
        setattr(p, name, (5,))
    with pytest.raises(AttributeError):
        delattr(p, name)
    assert p.parts == (1, 2, 3)


@pytest.mark.parametrize(
    "clone",
    [copy.copy, copy.deepcopy, lambda p: pickle.loads(pickle.dumps(p))],
    ids=["copy", "deepcopy", "pickle"],
)
def test_positions_copy_and_pickle(clone: Any) -> None:
    for p in (Position(7), Position(1, 2), Position(U64, 0, 3)):
        back = clone(p)
        assert back == p and back.parts == p.parts and back.token == p.token


@given(p=positions)
def test_repr_evaluates_back(p: Position) -> None:
    assert eval(repr(p), {"Position": Position}) == p

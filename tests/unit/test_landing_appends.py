"""Which staged rows are appends that need no merge (``landing.appends``): never a key landed
before (by an earlier part or an earlier row of the same part), never a row that is not a
READ; and a snapshot's chunks, in any order, between log rows of other keys, all are. Pure."""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snapshotter.core.position import Position
from snapshotter.sinks.spark import appends
from snapshotter.sinks.spark.appends import KnownKeys, orderable
from snapshotter.sinks.spark.types import OP, POS

# A segment of a staged part: a chunk's READ rows after its close watermark ("r"), or log
# rows ("c", "u", "d"), with their keys.
Segment = tuple[int, list[tuple[Any, ...]], str]


def part(segments: list[Segment], types: tuple[pa.DataType, ...] = (pa.int64(),)) -> pa.Table:
    keys: list[tuple[Any, ...]] = []
    ops: list[str] = []
    positions: list[str] = []
    for close, segment_keys, op in segments:
        for i, key in enumerate(segment_keys):
            keys.append(key)
            ops.append(op)
            at = Position(close)
            positions.append(at.read_row(i).token if op == "r" else Position(close, i).token)
    columns = {f"k{j}": pa.array([k[j] for k in keys], type=t) for j, t in enumerate(types)}
    return pa.table({**columns, "v": pa.array(range(len(keys))), OP: ops, POS: positions})


def names(types: tuple[pa.DataType, ...]) -> list[str]:
    return [f"k{j}" for j in range(len(types))]


def land(known: KnownKeys, rows: pa.Table, batch: int = 1) -> list[int]:
    """The part's rows that are appends (their indices), recorded as landed."""
    plan = known.plan(rows)
    assert plan is not None
    assert known.record(plan.ranges, batch)
    indices: list[int] = plan.appends.to_pylist()
    return indices


segment_strategy = st.tuples(
    st.integers(1, 50),
    st.lists(st.integers(0, 40).map(lambda k: (k,)), max_size=6),
    st.sampled_from("rrrrcud"),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(segment_strategy, min_size=1, max_size=4), max_size=8))
def test_an_append_is_a_read_row_of_a_key_never_landed(parts: list[list[Segment]]) -> None:
    known = KnownKeys(["k0"])
    seen: set[tuple[Any, ...]] = set()
    for batch, segments in enumerate(parts, 1):
        rows = part(segments)
        appended = land(known, rows, batch)
        assert appended == sorted(set(appended))
        ops = rows.column(OP).to_pylist()
        keys = [(k,) for k in rows.column("k0").to_pylist()]
        for i in appended:
            assert ops[i] == "r"
            # Neither an earlier part nor an earlier row of this one had the key.
            assert keys[i] not in seen and keys[i] not in keys[:i], "a key landed before"
        seen.update(keys)


def _snapshot(
    values: list[tuple[Any, ...]],
    chunk: int,
    types: tuple[pa.DataType, ...],
    seed: int,
    log_keys: Sequence[tuple[Any, ...]] = (),
) -> None:
    """A snapshot's chunks (disjoint ranges) closing in any order, several per part, log
    rows of other keys between them: every READ row is an append."""
    ordered = sorted(values)
    segments: list[Segment] = [
        (10 + i, ordered[at : at + chunk], "r")
        for i, at in enumerate(range(0, len(ordered), chunk))
    ]
    random.Random(seed).shuffle(segments)
    for i, key in enumerate(log_keys):
        segments.insert(min(len(segments), 2 * i), (1000 + i, [key], "u"))
    known = KnownKeys(names(types))
    for batch, at in enumerate(range(0, len(segments), 3), 1):
        rows = part(segments[at : at + 3], types)
        appended = land(known, rows, batch)
        assert len(appended) == rows.column(OP).to_pylist().count("r")
    # A second snapshot of the table re-reads keys it has: not an append.
    again = next(s for s in segments if s[2] == "r")
    plan = known.plan(part([again], types))
    assert plan is not None and not plan.appends


@settings(max_examples=100, deadline=None)
@given(
    st.sets(st.integers(-(2**63), 2**62), min_size=1, max_size=60),
    st.integers(1, 7),
    st.integers(0, 1000),
    st.lists(st.integers(2**62 + 1, 2**63 - 1), max_size=5, unique=True),
)
def test_a_snapshot_lands_as_appends_whatever_the_chunk_order(
    keys: set[int], chunk: int, seed: int, log_keys: list[int]
) -> None:
    _snapshot([(k,) for k in keys], chunk, (pa.int64(),), seed, [(k,) for k in log_keys])


@settings(max_examples=100, deadline=None)
@given(
    st.sets(st.tuples(st.integers(0, 3), st.text(max_size=3)), min_size=1, max_size=40),
    st.integers(1, 5),
    st.integers(0, 1000),
)
def test_composite_text_keys_too(keys: set[tuple[int, str]], chunk: int, seed: int) -> None:
    _snapshot(sorted(keys), chunk, (pa.int64(), pa.string()), seed)


def test_other_orderable_key_types() -> None:
    at = datetime(2024, 1, 1, tzinfo=UTC)
    _snapshot([(Decimal(f"{i}.50"),) for i in range(-20, 20)], 4, (pa.decimal128(6, 2),), 1)
    _snapshot([(at + timedelta(seconds=i),) for i in range(30)], 4, (pa.timestamp("us", "UTC"),), 2)
    _snapshot([(bytes([i, 255 - i]),) for i in range(30)], 4, (pa.binary(),), 3)


def test_what_is_never_an_append() -> None:
    known = KnownKeys(["k0"])
    assert land(known, part([(1, [(1,), (2,)], "c")])) == []  # log rows
    assert land(known, part([(2, [(3,), (3,)], "r")])) == []  # a key twice in a chunk
    # Key 2 was landed (a log row): the chunk's other rows are appends.
    assert land(known, part([(3, [(2,), (9,)], "r")])) == [1]
    assert land(known, part([(4, [(10,), (12,)], "r")])) == [0, 1]
    assert land(known, part([(5, [(11,)], "r")])) == []  # inside an appended chunk's range
    # A log row first, then a chunk holding its key, in one part: the chunk's other row is
    # an append; and so is the next chunk, of other keys.
    rows = part([(6, [(20,)], "u"), (7, [(20,), (21,)], "r"), (8, [(30,)], "r")])
    assert land(known, rows) == [2, 3]
    # NULL keys (a truncate) and float keys (NaN, -0.0 order differently in Python and Arrow):
    # no plan, no appends from here on.
    assert KnownKeys(["k0"]).plan(part([(1, [(None,)], "t")])) is None
    assert not orderable(pa.schema([("k0", pa.float64())]), ["k0"])
    assert KnownKeys(["k0"]).plan(part([(1, [(1.5,)], "r")], (pa.float64(),))) is None
    assert KnownKeys(["missing"]).plan(part([(1, [(1,)], "r")])) is None


def test_ranges_of_batches_landed_again_are_forgotten() -> None:
    known = KnownKeys(["k0"])
    for batch, keys in ((1, [(0,), (1,)]), (2, [(5,), (6,)]), (3, [(8,)])):
        assert land(known, part([(batch, keys, "r")]), batch) == list(range(len(keys)))
    known.forget_from(2)  # batches 2 and 3 taken out of the base, to land again
    assert len(known) == 1
    assert land(known, part([(9, [(5,), (6,), (8,)], "r")]), 2) == [0, 1, 2]
    assert land(known, part([(10, [(1,)], "r")]), 3) == []


def test_too_many_log_keys_end_the_appends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(appends, "MAX_RANGES", 5)
    known = KnownKeys(["k0"])
    plan = known.plan(part([(1, [(k,) for k in range(0, 12, 2)], "u")]))
    assert plan is not None and not known.record(plan.ranges, 1)


def test_a_chunk_with_too_many_logged_keys_is_no_append(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(appends, "MAX_LOGGED_IN_CHUNK", 2)
    known = KnownKeys(["k0"])
    land(known, part([(1, [(1,), (3,), (5,)], "u")]))
    assert land(known, part([(2, [(k,) for k in range(7)], "r")])) == []
    assert land(known, part([(3, [(k,) for k in range(10, 14)], "r")])) == [0, 1, 2, 3]

"""The key ranges of parallel chunk reads (``snapshotter.core.spans``): planning, bounds,
out-of-order closes, re-reads, the read limit, and progress over contiguous spans only."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from signals.names import TableId
from snapshotter.core.spans import SpanDone, SpanPlan, SpanRead, range_read_limit
from snapshotter.core.state import SnapshotStatus, TableProgress


def plan(bound_ahead: bool = True, start: int | None = None, max_key: int = 100) -> SpanPlan:
    return SpanPlan(
        None if start is None else (start,), 1, (max_key,), chunk_size=10, bound_ahead=bound_ahead
    )


def test_open_spans_are_planned_one_at_a_time_from_each_read() -> None:
    p = plan(bound_ahead=False)
    first = p.take("w1")
    assert first is not None and first.read is SpanRead.OPEN and first.after is None
    assert p.take("w2") is None  # its end comes with its read
    p.read_open("w1", 10, (10,))
    second = p.take("w2")
    assert second is not None and second.after == (10,) and second.number == 2
    assert p.closed("w1", selected=10, emitted=9, last_key=(10,)) == [
        SpanDone(1, (10,), 10, 9, False)
    ]
    p.read_open("w2", 4, (14,))  # fewer rows than asked: the last span
    assert p.exhausted and p.take("w3") is None
    assert p.closed("w2", selected=4, emitted=4, last_key=(14,)) == [SpanDone(2, (14,), 4, 4, True)]
    assert p.finished


def test_an_open_span_whose_close_comes_before_its_read_answer_is_ended_by_the_batch() -> None:
    p = plan(bound_ahead=False)
    p.take("w1")
    [done] = p.closed("w1", selected=10, emitted=10, last_key=(10,))
    assert done == SpanDone(1, (10,), 10, 10, False)
    p.read_open("w1", 10, (10,))  # the late answer changes nothing
    nxt = p.take("w2")
    assert nxt is not None and nxt.after == (10,)


def test_an_open_span_reaching_the_maximum_key_is_the_last() -> None:
    p = plan(bound_ahead=False, max_key=10)
    p.take("w1")
    p.read_open("w1", 10, (10,))
    assert p.exhausted


def test_bound_spans_overlap_and_progress_waits_for_the_earliest() -> None:
    p = plan()
    a = p.take("a")
    assert a is not None and a.read is SpanRead.BOUND
    assert p.take("x") is None  # the next starts where this one ends: not known yet
    p.bounded("a", (20,), final=False)
    b = p.take("b")
    assert b is not None and b.after == (20,) and b.read is SpanRead.BOUND
    p.bounded("b", (40,), final=False)
    c = p.take("c")
    assert c is not None and c.after == (40,)
    p.bounded("c", (100,), final=True)
    assert p.take("d") is None and p.exhausted
    # Closes come in any order; progress only over the contiguous head, in key order.
    assert p.closed("c", selected=7, emitted=7, last_key=(99,)) == []
    assert p.closed("b", selected=10, emitted=8, last_key=(39,)) == []
    assert p.closed("a", selected=10, emitted=10, last_key=(20,)) == [
        SpanDone(1, (20,), 10, 10, False),
        SpanDone(2, (40,), 10, 8, False),  # a closed range records its end, not its last row
        SpanDone(3, (100,), 7, 7, True),
    ]
    assert p.finished


def test_a_closed_range_that_grew_past_the_read_limit_is_split() -> None:
    p = plan()
    p.take("a")
    p.bounded("a", (50,), final=True)
    limit = range_read_limit(10)
    assert p.closed("a", selected=limit, emitted=limit, last_key=(30,)) == [
        SpanDone(1, (30,), limit, limit, False)
    ]
    assert not p.finished
    rest = p.take("r")
    assert rest is not None and rest.read is SpanRead.CLOSED
    assert (rest.after, rest.upto, rest.final) == ((30,), (50,), True)
    assert p.closed("r", selected=3, emitted=3, last_key=(45,)) == [SpanDone(2, (50,), 3, 3, True)]
    assert p.finished


def test_a_read_that_hit_the_limit_exactly_at_the_range_end_is_not_split() -> None:
    p = plan()
    p.take("a")
    p.bounded("a", (50,), final=True)
    limit = range_read_limit(10)
    [done] = p.closed("a", selected=limit, emitted=limit, last_key=(50,))
    assert done.final and p.finished


def test_a_voided_span_with_a_known_end_is_read_again_as_a_closed_range() -> None:
    p = plan()
    p.take("a")
    p.bounded("a", (20,), final=False)
    p.take("b")
    assert p.void("a")
    assert not p.void("a")  # once
    again = p.take("a2")  # before any new span
    assert again is not None and again.read is SpanRead.CLOSED and again.number == 1
    assert (again.after, again.upto) == (None, (20,))


def test_a_voided_span_without_an_end_is_planned_again_from_its_start() -> None:
    p = plan()
    p.take("a")
    p.bounded("a", (20,), final=False)
    b = p.take("b")
    assert b is not None and b.number == 2
    assert p.void("b")
    again = p.take("b2")
    assert again is not None and again.after == (20,) and again.read is SpanRead.BOUND
    assert again.number == 2


def test_a_window_whose_close_was_handled_is_not_voided() -> None:
    p = plan()
    p.take("a")
    p.bounded("a", (20,), final=False)
    p.closed("a", selected=10, emitted=10, last_key=(20,))
    assert not p.void("a")
    assert not p.void("unknown")


def test_reads_run_ahead_of_the_durable_key_by_at_most_max_ahead_spans() -> None:
    p = SpanPlan(None, 1, (1000,), 10, bound_ahead=True, max_ahead=3)
    for i, window in enumerate("abc"):
        assert p.take(window) is not None
        p.bounded(window, ((i + 1) * 10,), final=False)
    assert p.take("d") is None  # "a", the earliest, holds them back
    assert p.closed("c", selected=10, emitted=10, last_key=(30,)) == []
    assert p.take("d") is None
    assert p.void("b")
    again = p.take("b2")  # a re-read is within the plan: always allowed
    assert again is not None and again.after == (10,)
    assert len(p.closed("a", selected=10, emitted=10, last_key=(10,))) == 1
    after = p.take("e")  # two unrecorded ("b2", "c"), fewer than 3: a new span after "c"
    assert after is not None and after.after == (30,)


def test_closing_a_bound_span_before_its_bound_is_refused() -> None:
    p = plan()
    p.take("a")
    with pytest.raises(ValueError, match="bounded before"):
        p.closed("a", selected=1, emitted=1, last_key=(1,))


# --- a property: any interleaving converges to every key read once, in contiguous progress --


@dataclass
class _Flight:
    after: int | None
    read: SpanRead
    upto: int | None = None  # OPEN: None until read
    rows: list[int] | None = None
    answered: bool = False  # an OPEN read's answer handed to the plan


@dataclass
class _Sim:
    keys: list[int]  # the table, sorted
    max_key: int
    chunk: int
    parallel: int
    plan: SpanPlan
    progress: TableProgress
    flights: dict[str, _Flight] = field(default_factory=dict)
    recorded_rows: list[int] = field(default_factory=list)
    lasting: set[int] = field(default_factory=set)  # in the table since the start
    pending_rows: dict[int, list[int]] = field(default_factory=dict)  # by span number
    windows: int = 0

    def rows(self, after: int | None, upto: int, limit: int) -> list[int]:
        lo = 0 if after is None else bisect.bisect_right(self.keys, after)
        hi = bisect.bisect_right(self.keys, upto)
        return self.keys[lo:hi][:limit]


def _key(k: tuple[object, ...] | None) -> int | None:
    if k is None:
        return None
    value = k[0]
    assert isinstance(value, int)
    return value


@settings(max_examples=300, deadline=None)
@given(
    # Spaced out, so that rows can be inserted between any two.
    keys=st.lists(st.integers(0, 200).map(lambda k: k * 10), min_size=1, max_size=60, unique=True),
    chunk=st.integers(1, 6),
    parallel=st.integers(1, 4),
    data=st.data(),
)
def test_any_interleaving_reads_each_lasting_key_once_with_contiguous_progress(
    keys: list[int], chunk: int, parallel: int, data: st.DataObject
) -> None:
    keys.sort()
    max_key = keys[-1]
    lasting = set(keys)  # keys never deleted: each must be read by exactly one recorded span
    progress = TableProgress(table=TableId("s", "t"), signal_id="x", key_columns=["id"])
    progress.start((max_key,))
    sim = _Sim(
        keys,
        max_key,
        chunk,
        parallel,
        SpanPlan(
            None,
            1,
            (max_key,),
            chunk,
            bound_ahead=parallel > 1,
            max_ahead=data.draw(st.integers(1, 6)),
        ),
        progress,
        lasting=lasting,
    )
    voids = 0
    for _ in range(200):
        if sim.plan.finished:
            break
        # The simplest choice (first) moves the snapshot on, so that examples shrink well.
        actions = []
        if len(sim.flights) < parallel:
            actions.append("take")  # a no-op when no span may start now
        if sim.flights:
            actions.append("step")
            if voids < 5:
                actions.append("void")
        if any(f.upto is not None and f.rows is None for f in sim.flights.values()):
            actions.append("grow")
        actions += ["insert", "delete"]
        action = data.draw(st.sampled_from(actions))
        if action == "take":
            sim.windows += 1
            wid = f"w{sim.windows}"
            span = sim.plan.take(wid)
            if span is not None:  # None: max_ahead reached, or the newest span's end unknown
                sim.flights[wid] = _Flight(_key(span.after), span.read, _key(span.upto))
        elif action == "void" and sim.flights:
            wid = data.draw(st.sampled_from(sorted(sim.flights)))
            if sim.flights[wid].rows is None or data.draw(st.booleans()):
                assert sim.plan.void(wid)
                del sim.flights[wid]
                voids += 1
        elif action == "grow":
            # Rows inserted into a range between its bound and its read: past the read's
            # limit, the range is split (core.spans, 5.).
            wid = data.draw(
                st.sampled_from(
                    sorted(w for w, f in sim.flights.items() if f.upto is not None and not f.rows)
                )
            )
            f = sim.flights[wid]
            assert f.upto is not None
            low = -1 if f.after is None else f.after
            for k in range(f.upto - 1, low, -1)[: data.draw(st.integers(1, 3 * chunk))]:
                if k not in sim.keys:
                    bisect.insort(sim.keys, k)
        elif action == "insert":
            k = data.draw(st.integers(0, 2200))
            if k not in sim.keys:
                bisect.insort(sim.keys, k)
        elif action == "delete" and sim.keys:
            k = data.draw(st.sampled_from(sim.keys))
            sim.keys.remove(k)
            lasting.discard(k)
        elif action == "step" and sim.flights:
            _step(sim, data.draw(st.sampled_from(sorted(sim.flights))), data)
    # Drain: finish whatever is in flight, then read the rest one span at a time.
    for _ in range(3000):
        if sim.plan.finished:
            break
        if sim.flights:
            _step(sim, sorted(sim.flights)[0], None)
        else:
            sim.windows += 1
            wid = f"w{sim.windows}"
            span = sim.plan.take(wid)
            assert span is not None, "nothing in flight, not finished, yet nothing to take"
            sim.flights[wid] = _Flight(_key(span.after), span.read, _key(span.upto))
    assert sim.plan.finished
    assert progress.status is SnapshotStatus.DONE
    read = [k for k in sim.recorded_rows if k in lasting]
    assert sorted(read) == sorted(lasting), "a lasting key read twice or never"
    assert read == sorted(read), "recorded spans out of key order"


def _step(sim: _Sim, wid: str, data: st.DataObject | None) -> None:
    """Move one window on: bound it, read it, hand in an OPEN read's answer, or close it."""
    f = sim.flights[wid]
    span = sim.plan.span_of(wid)
    assert span is not None
    if f.read is SpanRead.BOUND and f.upto is None:
        ahead = sim.rows(f.after, sim.max_key, sim.chunk)
        bound = ahead[-1] if len(ahead) == sim.chunk else None
        f.upto = sim.max_key if bound is None else bound
        sim.plan.bounded(wid, (f.upto,), bound is None or bound == sim.max_key)
    elif f.rows is None:
        if f.read is SpanRead.OPEN:
            f.rows = sim.rows(f.after, sim.max_key, sim.chunk)
        else:
            assert f.upto is not None
            f.rows = sim.rows(f.after, f.upto, range_read_limit(sim.chunk))
    elif f.read is SpanRead.OPEN and not f.answered and (data is None or data.draw(st.booleans())):
        f.answered = True
        sim.plan.read_open(wid, len(f.rows), (f.rows[-1],) if f.rows else None)
    else:
        rows = f.rows
        sim.pending_rows[span.number] = rows
        done = sim.plan.closed(
            wid,
            selected=len(rows),
            emitted=len(rows),
            last_key=(rows[-1],) if rows else None,
        )
        del sim.flights[wid]
        last = _key(sim.progress.last_read_key)
        for d in done:
            sim.recorded_rows.extend(sim.pending_rows.pop(d.number))
            sim.progress.chunk_done(
                last_key=d.last_key,
                selected=d.selected,
                emitted=d.emitted,
                chunk_size=sim.chunk,
                final=d.final,
            )
            now = _key(sim.progress.last_read_key)
            assert last is None or now is None or now >= last, "progress went back"
            last = now
        if done and last is not None:
            # Every row recorded so far lies at or below the durable key, and every row there
            # since the start was read: a resume from it never skips one.
            assert all(k <= last for k in sim.recorded_rows)
            recorded = set(sim.recorded_rows)
            assert all(k in recorded for k in sim.lasting if k <= last), "a resume would skip"

"""Chunks read again while a transaction open at the engine's start is still open
(engine.start_guard): the waits between them, and the warning that says who holds the
snapshot up."""

from __future__ import annotations

import logging

import pytest

from signals.names import TableId
from snapshotter.core.visibility import OpenTransaction
from snapshotter.engine.start_guard import MAX_WAIT_S, StartGuardWait, held_up

T = TableId("public", "items")
ACTIVE = OpenTransaction(104, pid=4242, state="active", client=True, age_s=580.0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _waits(guard: StartGuardWait, clock: Clock, count: int) -> list[float]:
    """Read again ``count`` times, each as soon as the guard lets a new chunk go."""
    out = []
    for number in range(count):
        guard.read_again(T, number, [ACTIVE])
        start = clock.now
        while guard.holding():
            clock.now += 0.01
        out.append(round(clock.now - start, 1))
    return out


def test_the_wait_doubles_up_to_a_few_seconds() -> None:
    clock = Clock()
    guard = StartGuardWait(clock)
    assert not guard.holding()
    assert _waits(guard, clock, 8) == [0.2, 0.4, 0.8, 1.6, 3.2, MAX_WAIT_S, MAX_WAIT_S, MAX_WAIT_S]


def test_windows_read_before_the_wait_do_not_lengthen_it() -> None:
    clock = Clock()
    guard = StartGuardWait(clock)
    for number in range(3):  # three windows in flight, all missed the transaction
        guard.read_again(T, number, [ACTIVE])
    # One more during that wait: still the first (0.2 s); the read after it doubles.
    assert _waits(guard, clock, 2) == [0.2, 0.4]


def test_a_chunk_that_passes_ends_the_waits() -> None:
    clock = Clock()
    guard = StartGuardWait(clock)
    _waits(guard, clock, 4)
    guard.read_again(T, 9, [ACTIVE])
    guard.passed()
    assert not guard.holding()
    assert _waits(guard, clock, 1) == [0.2]


def test_a_reread_for_a_forgotten_transaction_does_not_wait() -> None:
    clock = Clock()
    guard = StartGuardWait(clock)
    guard.read_again(T, 1, [])
    assert not guard.holding()


def test_one_warning_after_half_a_minute_then_every_few_minutes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    guard = StartGuardWait(clock)
    with caplog.at_level(logging.INFO, logger="snapshotter.engine"):
        _waits(guard, clock, 9)  # 0.2 + 0.4 + ... + 5 + 5 + 5: 26.2 s
        assert not [r for r in caplog.records if r.levelno == logging.WARNING]
        _waits(guard, clock, 62)  # five more minutes of it
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("snapshot of public.items held up for 3")
    assert "xid 104 (pid 4242, active, open 10 min)" in warnings[0]
    assert "End it (COMMIT or ROLLBACK in its session" in warnings[0]
    assert "pg_read_all_stats" not in warnings[0]  # every state was visible
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert infos[0] == (
        "chunk 0 of public.items: re-read in 0.2 s (its snapshot missed transaction 104, "
        "open as the engine started: see core.visibility)"
    )


def test_the_warning_names_each_kind_of_transaction() -> None:
    missed = [
        OpenTransaction(7, pid=11, state=None),
        OpenTransaction(8, prepared="batch-42", age_s=7200.0),
        OpenTransaction(9),
        *(OpenTransaction(x, pid=x, state="active", client=True) for x in range(20, 26)),
    ]
    text = held_up(T, missed, 45.0, 60.0)
    assert "xid 7 (pid 11, state hidden from the engine's user)" in text
    assert "xid 8 (prepared transaction 'batch-42', open 2.0 h)" in text
    assert "xid 9 (no session shows it)" in text
    assert "xid 21 (pid 21, active), and 4 more." in text
    assert "granting pg_read_all_stats (or pg_monitor) to the engine's user" in text
    assert text.startswith("snapshot of public.items held up for 45 s")

"""The engine's watch over what the source's log carries (engine.watchdog): when it asks the
source, and what it makes of the answer. Times are passed in; no source, no engine."""

from __future__ import annotations

import logging
import time

import pytest

from signals.names import TableId
from snapshotter.engine.watchdog import (
    CoverageWatch,
    LogCoverageError,
    Overdue,
    Watchdog,
    overdue_after,
)

ORDERS = TableId("public", "orders")
ITEMS = TableId("public", "items")


def watchdog() -> Watchdog:
    return Watchdog(every_s=45.0, overdue_after_s=60.0)


def test_the_bound_is_a_minute_or_the_chunk_timeout() -> None:
    assert overdue_after(10.0) == 60.0
    assert overdue_after(300.0) == 300.0


def test_it_asks_every_so_often_from_the_first_tick() -> None:
    dog = watchdog()
    assert dog.tick(100.0, {}) is None  # the run's start checked already
    assert dog.tick(144.0, {}) is None
    assert dog.tick(145.0, {}) == []
    dog.asking(145.0, [])
    assert dog.tick(146.0, {}) is None
    assert dog.tick(189.0, {}) is None
    assert dog.tick(190.0, {}) == []


def test_a_window_waiting_past_the_bound_is_asked_about_once_per_bound() -> None:
    dog = watchdog()
    dog.tick(0.0, {})
    dog.asking(0.0, [])
    assert dog.tick(10.0, {"w1": ORDERS}) is None
    assert dog.tick(40.0, {"w1": ORDERS}) is None
    dog.asking(40.0, [])  # a periodic check in between
    overdue = dog.tick(70.0, {"w1": ORDERS})
    assert overdue == [Overdue("w1", ORDERS, 60.0)]
    dog.asking(70.0, overdue)
    assert dog.tick(71.0, {"w1": ORDERS}) is None
    assert dog.tick(114.0, {"w1": ORDERS}) is None
    assert dog.tick(129.0, {"w1": ORDERS}) == []  # 119 s: the periodic check, not w1 again
    dog.asking(129.0, [])
    assert dog.tick(130.0, {"w1": ORDERS}) == [Overdue("w1", ORDERS, 120.0)]


def test_a_window_that_closed_is_forgotten() -> None:
    dog = watchdog()
    dog.tick(0.0, {"w1": ORDERS})
    dog.asking(0.0, [])
    assert dog.tick(30.0, {}) is None  # its close watermark came
    # Another window, and the same id again later (it never is; still counted afresh).
    assert dog.tick(40.0, {"w1": ORDERS, "w2": ITEMS}) is None
    assert dog.tick(99.0, {"w1": ORDERS, "w2": ITEMS}) == []  # periodic only
    dog.asking(99.0, [])
    overdue = dog.tick(100.0, {"w1": ORDERS, "w2": ITEMS})
    assert overdue is not None
    assert {(o.window_id, o.waited_s) for o in overdue} == {("w1", 60.0), ("w2", 60.0)}


def test_problems_stop_the_engine_with_the_sources_lines() -> None:
    verdict = watchdog().answered(["change stream cs does not watch public.orders: run X"], [])
    assert verdict.stop is not None
    assert "change stream cs does not watch public.orders: run X" in verdict.stop
    assert "found by the check every 45 s" in verdict.stop and verdict.warnings == []
    overdue = [Overdue("w1", ORDERS, 61.0)]
    stop = watchdog().answered(["the signal table is not watched"], overdue).stop
    assert stop is not None
    assert "chunk window w1 of public.orders waited 61 s for its close watermark" in stop


def test_an_overdue_window_with_nothing_missing_is_warned_about_and_waited_for() -> None:
    overdue = [Overdue("w1", ORDERS, 61.4)]
    verdict = watchdog().answered([], overdue)
    assert verdict.stop is None
    (warning,) = verdict.warnings
    assert "w1" in warning and "public.orders" in warning and "61 s" in warning
    assert "still waiting" in warning and "reports nothing missing" in warning
    (unasked,) = watchdog().answered(None, overdue).warnings
    assert "could not be asked what its log lacks" in unasked and "still waiting" in unasked


def test_a_periodic_check_that_finds_nothing_says_nothing() -> None:
    assert watchdog().answered([], []).warnings == []
    assert watchdog().answered(None, []).warnings == []


class _Coverage:
    def __init__(self, answers: list[list[str]]) -> None:
        self.answers = answers
        self.asked = 0
        self.closed = False

    def problems(self) -> list[str]:
        self.asked += 1
        return self.answers.pop(0)

    def close(self) -> None:
        self.closed = True


def _poll_until_answered(watch: CoverageWatch, coverage: _Coverage, now: float) -> None:
    """Poll until the check's thread has answered and its answer was taken."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        watch.poll(now, {})
        thread = watch._thread
        if thread is not None and not thread.is_alive() and watch._answer is None:
            return
        time.sleep(0.01)
    raise AssertionError("the check never answered")


def test_the_watch_asks_on_a_thread_and_stops_on_a_problem() -> None:
    coverage = _Coverage([[], ["change stream cs does not watch the signal table"]])
    watch = CoverageWatch(Watchdog(every_s=45.0, overdue_after_s=60.0), coverage)
    watch.poll(0.0, {})
    assert coverage.asked == 0
    watch.poll(45.0, {})  # asks; nothing missing
    _poll_until_answered(watch, coverage, 46.0)
    assert coverage.asked == 1
    watch.poll(90.0, {})  # asks again: a problem now
    with pytest.raises(LogCoverageError, match="does not watch the signal table"):
        for _ in range(1000):
            watch.poll(91.0, {})
            time.sleep(0.01)
    watch.close()
    assert coverage.closed


def test_without_a_source_to_ask_an_overdue_window_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    watch = CoverageWatch(Watchdog(every_s=45.0, overdue_after_s=60.0), None)
    with caplog.at_level(logging.WARNING, logger="snapshotter.engine"):
        watch.poll(0.0, {"w1": ORDERS})
        watch.poll(59.0, {"w1": ORDERS})
        assert not caplog.records
        watch.poll(60.0, {"w1": ORDERS})
    (record,) = caplog.records
    assert "w1" in record.getMessage() and "public.orders" in record.getMessage()
    watch.close()

"""Progress, rate and time remaining of a snapshot (core.eta) from what state holds."""

from __future__ import annotations

import pytest

from signals.names import TableId
from snapshotter.core.eta import MIN_ELAPSED_MS, Eta, duration_text, eta, eta_note
from snapshotter.core.state import TableProgress

START = 1_700_000_000_000


def running(
    read: int, estimate: int | None, started: int | None = START, condition: str | None = None
) -> TableProgress:
    p = TableProgress(
        table=TableId("public", "orders"), signal_id="s", key_columns=["id"], filter=condition
    )
    p.start((10_000,))
    p.rows_read, p.estimated_rows, p.started_ms = read, estimate, started
    return p


def test_fraction_rate_and_time_remaining() -> None:
    e = eta(running(2_500, 10_000), START + 10_000)
    assert e == Eta(2_500, 10_000, 0.25, 250.0, 30.0)


def test_a_stale_estimate_never_says_done_nor_a_negative_time() -> None:
    e = eta(running(12_000, 10_000), START + 10_000)
    assert e.fraction == 0.99 and e.rows_per_s == 1_200.0
    assert e.seconds_remaining is None  # passed the estimate: unknown, not 0


def test_an_estimate_of_zero_for_a_running_snapshot_is_unknown() -> None:
    e = eta(running(500, 0), START + 5_000)
    assert e.fraction is None and e.seconds_remaining is None and e.rows_per_s == 100.0


def test_without_an_estimate_only_the_rate() -> None:
    e = eta(running(500, None), START + 5_000)
    assert (e.rows_total, e.fraction, e.seconds_remaining) == (None, None, None)
    assert e.rows_per_s == 100.0


@pytest.mark.parametrize(
    ("read", "started", "now"),
    [
        (0, START, START + 60_000),  # nothing read yet
        (100, None, START + 60_000),  # an old state: no start time
        (100, START, START + MIN_ELAPSED_MS - 1),  # too early
        (100, START, START - 5_000),  # a clock that went back
    ],
)
def test_no_rate_without_history(read: int, started: int | None, now: int) -> None:
    e = eta(running(read, 10_000, started), now)
    assert e.rows_per_s is None and e.seconds_remaining is None


def test_a_filter_makes_the_estimate_an_upper_bound() -> None:
    e = eta(running(1_000, 10_000, condition="region = 'eu'"), START + 10_000)
    assert e.upper_bound and e.fraction == 0.1 and e.seconds_remaining == 90.0
    assert not eta(running(1_000, None, condition="x"), START + 10_000).upper_bound


def test_done_is_whole_and_has_nothing_left() -> None:
    p = running(9_000, 10_000)
    p.chunk_done(last_key=(10_000,), selected=0, emitted=0, chunk_size=100)
    assert eta(p, START + 1) == Eta(9_000, 10_000, 1.0, None, 0.0)
    p.estimated_rows = None
    assert eta(p, START + 1).rows_total == 9_000


def test_paused_stopped_and_failed_have_no_time_remaining() -> None:
    p = running(1_000, 10_000)
    p.pause()
    paused = eta(p, START + 10_000)
    assert paused.rows_per_s == 100.0 and paused.seconds_remaining is None
    p.stop()
    stopped = eta(p, START + 10_000)
    assert stopped.fraction == 0.1 and stopped.rows_per_s is None
    assert stopped.seconds_remaining is None


def test_pending_has_nothing_but_rows() -> None:
    p = TableProgress(table=TableId("public", "t"), signal_id="s")
    assert eta(p, START) == Eta(0, None, None, None, None)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "?"),
        (-3, "0s"),
        (0.4, "0s"),
        (45, "45s"),
        (200, "3m20s"),
        (3_600, "1h00m"),
        (7_500, "2h05m"),
        (3 * 86_400 + 4 * 3_600 + 59, "3d04h"),
    ],
)
def test_durations_read_as_people_write_them(seconds: float | None, text: str) -> None:
    assert duration_text(seconds) == text


def test_the_log_line_note() -> None:
    assert eta_note(running(2_500, 10_000), START + 10_000) == (
        ", read 25% of ~10000, 250 rows/s, 30s left"
    )
    filtered = running(2_500, 10_000, condition="x")
    assert eta_note(filtered, START + 10_000) == (
        ", read >= 25% of ~10000, 250 rows/s, <= 30s left"
    )
    assert eta_note(running(0, None), START + 10_000) == ""

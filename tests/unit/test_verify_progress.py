"""verify's progress lines: a long read or comparison says how far it got, every few seconds."""

from __future__ import annotations

import logging

import pytest

from snapshotter.verify import progress


def test_a_long_read_logs_its_count_rate_and_share_of_the_file(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(progress, "EVERY_S", 0.0)
    monkeypatch.setattr(progress, "CHECK_EVERY", 2)
    position = iter((20, 50))  # asked only at the lines: after items 2 and 4
    ticker = progress.Ticker(
        "events read from the sink file", total_bytes=100, done_bytes=lambda: next(position)
    )
    with caplog.at_level(logging.INFO, logger="snapshotter.verify"):
        for _ in range(4):
            ticker.tick()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines  # every CHECK_EVERY items, once EVERY_S has passed
    assert lines[0].startswith("verify: events read from the sink file 2 so far (")
    assert lines[0].endswith(", 20% of the file)") and lines[1].endswith(", 50% of the file)")


def test_a_quick_verify_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="snapshotter.verify"):
        assert list(progress.ticking(range(25_000), "table rows compared")) == list(range(25_000))
    assert not caplog.records  # under EVERY_S: no line

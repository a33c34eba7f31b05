"""Outage retry (``snapshotter.engine.retry``) on a fake clock: the backoff doubles up to its
cap, the bound counts from the first failure of an outage, a failure long after the last
starts a new outage, and an answer ends it."""

from __future__ import annotations

import logging

import pytest

from snapshotter.engine import retry as engine_retry
from snapshotter.engine.retry import (
    OUTAGE_GAP_S,
    RETRY_FIRST_S,
    RETRY_MAX_S,
    SourceRetry,
    SourceUnavailableError,
    server_of,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def retry(clock: Clock, retry_for: float | None = 60.0) -> SourceRetry:
    return SourceRetry(server="db:5432/shop", retry_for=retry_for, clock=clock, sleep=clock.sleep)


def test_the_backoff_doubles_up_to_its_cap() -> None:
    clock = Clock()
    r = retry(clock)
    delays = []
    for _ in range(6):
        r.failed("chunk 1 of s.t", "connection refused")
        assert r.waiting()
        delays.append(r.wait_s())
        clock.now += r.wait_s()
        assert not r.waiting()
    assert delays[0] == RETRY_FIRST_S
    assert delays == [min(RETRY_FIRST_S * 2**i, RETRY_MAX_S) for i in range(6)]


def test_past_the_bound_the_engine_stops_with_a_message_that_says_what_to_do() -> None:
    clock = Clock()
    r = retry(clock, retry_for=10.0)
    r.failed("chunk 3 of s.t", "connection refused")
    clock.now += 9.9
    r.failed("chunk 3 of s.t", "connection refused")
    clock.now += 0.1
    with pytest.raises(SourceUnavailableError) as raised:
        r.failed("chunk 3 of s.t", "connection refused")
    message = str(raised.value)
    assert "db:5432/shop" in message and "unreachable for 10 s" in message
    assert "chunk 3 of s.t: connection refused" in message
    assert "snapshotter resume" in message


def test_an_answer_ends_the_outage(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "snapshotter.engine")
    clock = Clock()
    r = retry(clock, retry_for=10.0)
    r.failed("x", "down")
    clock.now += 8
    r.answered()
    assert not r.waiting()
    assert any("answers again after 8.0 s" in m for m in caplog.messages)
    # The next failure starts a new outage: its bound counts from now.
    clock.now += 1
    r.failed("x", "down")
    clock.now += 9
    r.failed("x", "down")  # 9 s into the new outage: not yet
    assert r.wait_s() == 2 * RETRY_FIRST_S


def test_a_failure_long_after_the_last_starts_a_new_outage() -> None:
    clock = Clock()
    r = retry(clock, retry_for=OUTAGE_GAP_S * 2)
    r.failed("x", "down")
    r.failed("x", "down")
    clock.now += OUTAGE_GAP_S + 1  # nothing retried in between (say, paused)
    r.failed("x", "down")
    assert r.wait_s() == RETRY_FIRST_S


def test_the_default_bound_is_read_when_the_retry_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_retry, "SOURCE_RETRY_FOR_S", 3.0)
    assert retry(Clock(), retry_for=None).retry_for == 3.0


def test_wait_out_retries_transient_errors_on_the_backoff() -> None:
    clock = Clock()
    r = retry(clock)
    answers: list[object] = [ConnectionError("down"), ConnectionError("down"), ["t"]]

    def call() -> list[str]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        assert isinstance(answer, list)
        return answer

    start = clock.now
    assert r.wait_out("listing", call, lambda e: isinstance(e, ConnectionError)) == ["t"]
    assert clock.now - start == RETRY_FIRST_S + 2 * RETRY_FIRST_S  # slept on the backoff
    assert not r.waiting()


def test_wait_out_raises_other_errors_at_once() -> None:
    r = retry(Clock())

    def call() -> None:
        raise PermissionError("no")

    with pytest.raises(PermissionError):
        r.wait_out("listing", call, lambda e: isinstance(e, ConnectionError))


def test_server_of_names_no_credentials() -> None:
    assert server_of("postgresql://u:secret@db:5432/shop") == "db:5432/shop"
    assert server_of("mysql://u@h/") == "h:default port/"
    assert server_of("::not a url::") == "the configured source.url"

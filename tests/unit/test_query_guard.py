"""The filter trust boundary without a server: the query guard's time limit and cancellation,
MySQL's per-statement time limit, and the init warnings of a too-powerful MySQL user."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from signals.names import TableId
from snapshotter.sources.base import ReadCancelled
from snapshotter.sources.mysql.dialect import timed_select
from snapshotter.sources.mysql.setup import ServerFacts, filter_reach
from snapshotter.sources.query_guard import Outcome, QueryGuard, timeout_error


class FakeQuery:
    """A 'query' that runs until cancelled or until ``seconds`` pass."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.cancels = 0

    def cancel(self) -> None:
        self.cancels += 1
        self.cancelled.set()

    def run(self, seconds: float) -> None:
        self.cancelled.wait(seconds)


def test_a_query_past_its_limit_is_cancelled_by_the_watchdog() -> None:
    guard, query = QueryGuard(grace_s=0.05), FakeQuery()
    started = time.monotonic()
    with guard.running(0.1, query.cancel) as guarded:
        query.run(10)
    took = time.monotonic() - started
    assert guarded.outcome is Outcome.TIMED_OUT
    assert query.cancels == 1
    assert 0.1 <= took < 2
    guard.close()


def test_a_query_within_its_limit_is_left_alone() -> None:
    guard, query = QueryGuard(grace_s=0.05), FakeQuery()
    for _ in range(20):
        with guard.running(1.0, query.cancel) as guarded:
            query.run(0.001)
        assert guarded.outcome is None
    time.sleep(0.2)  # no late cancel either
    assert query.cancels == 0
    guard.close()


def test_cancel_stops_the_running_query_and_refuses_later_ones_until_allowed() -> None:
    guard, query = QueryGuard(), FakeQuery()
    threading.Timer(0.1, guard.cancel).start()
    started = time.monotonic()
    with guard.running(60, query.cancel) as guarded:
        query.run(10)
    assert time.monotonic() - started < 2
    assert guarded.outcome is Outcome.CANCELLED
    with pytest.raises(ReadCancelled), guard.running(60, query.cancel):
        pass
    guard.allow()
    with guard.running(60, query.cancel) as guarded:
        pass
    assert guarded.outcome is None
    assert query.cancels == 1
    guard.close()


def test_a_cancel_between_queries_sends_nothing_and_holds_for_the_next() -> None:
    guard, query = QueryGuard(), FakeQuery()
    guard.cancel()
    assert query.cancels == 0
    with pytest.raises(ReadCancelled), guard.running(60, query.cancel):
        pass


def test_a_failing_cancel_request_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    guard = QueryGuard(grace_s=0.01)

    def broken() -> None:
        raise OSError("server unreachable")

    with guard.running(0.01, broken) as guarded:
        time.sleep(0.3)
    assert guarded.outcome is Outcome.TIMED_OUT
    assert "could not cancel" in caplog.text
    guard.close()


def test_the_watchdog_starts_again_after_close() -> None:
    guard, query = QueryGuard(grace_s=0.01), FakeQuery()
    guard.close()
    with guard.running(0.05, query.cancel) as guarded:
        query.run(5)
    assert guarded.outcome is Outcome.TIMED_OUT
    guard.close()


def test_the_timeout_error_says_what_where_and_the_fix() -> None:
    text = str(timeout_error("chunk query", TableId("shop", "orders"), 2.5, filtered=True))
    assert "chunk query on table shop.orders" in text
    assert "chunk_timeout_s = 2.5 s" in text
    assert "raise [source] chunk_timeout_s" in text and "filter" in text
    plain = str(timeout_error("max-key query", TableId("shop", "orders"), 300, filtered=False))
    assert "chunk_timeout_s = 300 s" in plain and "chunk_size" in plain


def test_mysql_statements_carry_their_own_time_limit() -> None:
    sql = "SELECT `t`.`id` FROM `t` WHERE (x = %(a0)s) LIMIT %(limit)s"
    assert timed_select(sql, 2.5, mariadb=True) == (
        "SET STATEMENT max_statement_time = 2.500 FOR " + sql
    )
    assert timed_select(sql, 2.5, mariadb=False) == (
        "SELECT /*+ MAX_EXECUTION_TIME(2500) */ `t`.`id` FROM `t` WHERE (x = %(a0)s) "
        "LIMIT %(limit)s"
    )
    assert "MAX_EXECUTION_TIME(1)" in timed_select(sql, 0.0001, mariadb=False)
    with pytest.raises(ValueError):
        timed_select("EXPLAIN " + sql, 1, mariadb=False)


FACTS = ServerFacts(
    version="8.4.2",
    is_mariadb=False,
    log_bin=True,
    server_id=1,
    user="cdc@%",
    database="shop",
    grants=("GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `cdc`@`%`",),
)


@pytest.mark.parametrize(
    ("grant", "held", "can"),
    [
        ("GRANT ALL PRIVILEGES ON *.* TO `cdc`@`%`", "ALL PRIVILEGES", "LOAD_FILE"),
        ("GRANT FILE ON *.* TO `cdc`@`%`", "FILE", "LOAD_FILE"),
        ("GRANT SELECT, SUPER ON *.* TO `cdc`@`%`", "SUPER", "SUPER"),
    ],
)
def test_a_user_a_filter_could_abuse_is_warned_about(grant: str, held: str, can: str) -> None:
    (problem,) = filter_reach(replace(FACTS, grants=(*FACTS.grants, grant)))
    assert problem.severity == "warning"
    assert f"holds {held} on *.*" in problem.what and can in problem.what
    assert "signal table" in problem.what
    assert "a user of its own" in problem.fix


@pytest.mark.parametrize(
    "grant",
    [
        "GRANT SELECT, INSERT, DELETE ON `shop`.* TO `cdc`@`%`",
        "GRANT ALL PRIVILEGES ON `shop`.* TO `cdc`@`%`",  # one database: no FILE, no SUPER
    ],
)
def test_a_dedicated_user_gets_no_filter_warning(grant: str) -> None:
    assert filter_reach(replace(FACTS, grants=(*FACTS.grants, grant))) == []

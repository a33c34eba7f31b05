"""What a Spanner change stream no longer carries (sources.spanner.setup.coverage_problems),
the FOR ALL check against the database's DDL, and which query errors mean a lost position
(sources.spanner.reader.lost_reason): pure, no emulator (tests/integration/
test_spanner_coverage.py runs them against it)."""

from __future__ import annotations

from google.api_core import exceptions as gexc

from signals.names import TableId
from snapshotter.sources.spanner.client import SpannerDialectKind
from snapshotter.sources.spanner.reader import lost_reason
from snapshotter.sources.spanner.setup import StreamFacts, coverage_problems, declared_for_all

G = SpannerDialectKind.GOOGLESQL
P = SpannerDialectKind.POSTGRESQL
SIGNAL = TableId("public", "debezium_signal")
ITEMS = TableId("public", "items")
ORDERS = TableId("public", "orders")
OTHER = TableId("public", "other")


def facts(tables: dict[TableId, bool], *, all_tables: bool = False) -> StreamFacts:
    return StreamFacts(True, all_tables, tables, {})


def test_a_stream_watching_everything_whole_has_no_problem() -> None:
    whole = facts({ITEMS: True, SIGNAL: True, OTHER: True})
    assert coverage_problems(G, "cs", whole, [ITEMS], SIGNAL) == []
    assert coverage_problems(G, "cs", facts({}, all_tables=True), [ITEMS], SIGNAL) == []


def test_a_captured_table_no_longer_watched_says_the_ddl_and_to_snapshot_it_again() -> None:
    (line,) = coverage_problems(G, "cs", facts({SIGNAL: True, OTHER: True}), [ITEMS], SIGNAL)
    assert line.startswith("change stream cs does not watch public.items: changes of it are")
    # SET FOR names every table: what it watches now, and what is missing.
    assert "Fix: ALTER CHANGE STREAM cs SET FOR `debezium_signal`, `items`, `other`;" in line
    assert (
        "then snapshot it again: snapshotter signal -c CONF execute-snapshot public.items" in line
    )


def test_the_signal_table_no_longer_watched_says_snapshots_cannot_go_on() -> None:
    (line,) = coverage_problems(P, "cs", facts({ITEMS: True}), [ITEMS], SIGNAL)
    assert "does not watch the signal table public.debezium_signal" in line
    assert "no snapshot can go on" in line
    assert line.endswith(
        'Fix: ALTER CHANGE STREAM cs SET FOR "public"."debezium_signal", "public"."items"'
    )


def test_one_line_per_table_and_some_columns_is_not_enough() -> None:
    lines = coverage_problems(G, "cs", facts({ORDERS: False}), [ITEMS, ORDERS], SIGNAL)
    assert [line.split(":")[0] for line in lines] == [
        "change stream cs does not watch the signal table public.debezium_signal",
        "change stream cs does not watch public.items",
        "change stream cs watches only some columns of public.orders",
    ]


def test_a_stream_that_is_gone_says_how_to_create_it() -> None:
    gone = StreamFacts(False, False, {}, {})
    (line,) = coverage_problems(G, "cs", gone, [ITEMS], SIGNAL)
    assert "change stream cs does not exist" in line
    assert "Fix: CREATE CHANGE STREAM cs FOR `debezium_signal`, `items`" in line
    assert "reset-stream -c CONF" in line


def test_for_all_is_read_from_the_streams_own_statement() -> None:
    ddl = [
        "CREATE TABLE a (\n  id INT64 NOT NULL,\n) PRIMARY KEY(id)",
        "CREATE CHANGE STREAM other FOR ALL",
        "CREATE CHANGE STREAM cs OPTIONS ( value_capture_type = 'NEW_ROW' )",
    ]
    assert declared_for_all(ddl, "cs") is False  # after DROP FOR ALL: no FOR clause
    assert declared_for_all(ddl, "other") is True
    assert declared_for_all(ddl, "missing") is None
    assert declared_for_all(["CREATE CHANGE STREAM cs\nFOR ALL"], "cs") is True
    assert declared_for_all(['CREATE CHANGE STREAM "cs" FOR a, b'], "cs") is False
    assert declared_for_all(["CREATE CHANGE STREAM cs_all FOR ALL"], "cs") is None


def test_which_query_errors_mean_the_saved_position_is_gone() -> None:
    too_old = gexc.OutOfRange(
        "Specified start_timestamp is too far in the past. Please specify a start_timestamp "
        "within the earliest read timestamp: 2026-11-28T02:47:51.852180975+00:00."
    )
    other_stream = gexc.InvalidArgument(
        "Specified partition_token is invalid, as it does not belong to the Change Stream "
        "associated with the TVF. Received partition_token: abc"
    )
    assert lost_reason(too_old) == str(too_old.message)
    assert lost_reason(other_stream) == (
        "Specified partition_token is invalid, as it does not belong to the Change Stream "
        "associated with the TVF."
    )
    # A start before a partition's own start is a bug of ours, not a lost position.
    assert lost_reason(gexc.OutOfRange("start_timestamp is invalid for the partition")) is None
    assert lost_reason(gexc.ServiceUnavailable("too far in the past")) is None
    assert lost_reason(ValueError("too far in the past")) is None

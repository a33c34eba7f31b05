"""Progress and ETA against the real servers: a snapshot's start records the database's row
estimate (PostgreSQL: pg_class.reltuples after ANALYZE; MySQL/MariaDB:
information_schema.TABLES.TABLE_ROWS) and its start time, and `status --json` shows rows
read against it, the rate and the time remaining."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.integration.engine_harness import Capture, CaptureFactory

pytestmark = pytest.mark.integration

ROWS = 3_000


def _items(cap: Capture) -> str:
    if cap.kind == "mysql":
        cap.sql(f"CREATE TABLE `{cap.schema}`.items (id int PRIMARY KEY, v varchar(40))")
        for start in range(1, ROWS + 1, 1000):
            values = ", ".join(f"({i}, 'v{i}')" for i in range(start, min(start + 1000, ROWS + 1)))
            cap.sql(f"INSERT INTO `{cap.schema}`.items VALUES {values}")
        cap.sql(f"ANALYZE TABLE `{cap.schema}`.items")
    else:
        cap.sql(f'CREATE TABLE "{cap.schema}".items (id int PRIMARY KEY, v text)')
        cap.sql(f'ALTER TABLE "{cap.schema}".items REPLICA IDENTITY FULL')
        cap.sql(
            f"INSERT INTO \"{cap.schema}\".items SELECT g, 'v' || g "
            f"FROM generate_series(1, {ROWS}) g"
        )
        cap.sql(f'ANALYZE "{cap.schema}".items')  # reltuples is -1 (unknown) until then
    return f"{cap.schema}.items"


def _status(cap: Capture, capsys: Any) -> dict[str, Any]:
    capsys.readouterr()
    assert cap.cli("status", "--json") == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


def _snapshot_records_estimate_and_start(cap: Capture, capsys: Any) -> None:
    table = _items(cap)
    cap.init()
    before = time.time_ns() // 1_000_000
    cap.execute(table)
    assert cap.run() == 0
    after = time.time_ns() // 1_000_000
    state = json.loads((cap.directory / "state" / "state.json").read_text(encoding="utf-8"))
    (progress,) = state["snapshots"]
    assert progress["status"] == "done" and progress["rows_read"] == ROWS
    # InnoDB's estimate comes from sampled pages: close, not exact.
    assert 0.7 * ROWS <= progress["estimated_rows"] <= 1.3 * ROWS, progress
    assert before <= progress["started_ms"] <= after
    (row,) = _status(cap, capsys)["snapshots"]
    assert row["estimated_rows"] == progress["estimated_rows"]
    assert row["rows_read"] == ROWS and row["percent"] == 100.0 and row["eta_s"] == 0
    assert row["estimate_upper_bound"] is False and row["started_at"] is not None
    assert "rows_per_s" in row


def test_pg_snapshot_records_the_row_estimate_and_its_start(
    capture: CaptureFactory, capsys: Any
) -> None:
    cap = capture(chunk_size=250)
    _snapshot_records_estimate_and_start(cap, capsys)
    # With a filter the estimate is still the whole table's: marked as an upper bound.
    cap.execute(f"{cap.schema}.items", filters=[f"{cap.schema}.items=id <= 500"])
    assert cap.run() == 0
    filtered = _status(cap, capsys)["snapshots"][-1]
    assert filtered["rows_read"] == 500 and filtered["estimate_upper_bound"] is True
    assert filtered["estimated_rows"] == ROWS


def test_mysql_snapshot_records_the_row_estimate_and_its_start(
    mysql_capture: CaptureFactory, capsys: Any
) -> None:
    _snapshot_records_estimate_and_start(mysql_capture(chunk_size=250), capsys)


def test_pg_estimates_unanalyzed_partitioned_and_grown_tables(pg_url: str, pg_schema: str) -> None:
    from signals.names import TableId
    from snapshotter.sources.base import TableSchema
    from snapshotter.sources.postgres.dialect import PostgresDialect

    dialect = PostgresDialect(pg_url, TableId(pg_schema, "sig"), "unused")

    def estimate(name: str) -> int | None:
        return dialect.estimated_rows(TableSchema(TableId(pg_schema, name), (), ()))

    def sql(statement: str) -> None:
        with dialect.engine.begin() as conn:
            conn.exec_driver_sql(statement)

    q = f'"{pg_schema}"'
    try:
        sql(f"CREATE TABLE {q}.plain (id int PRIMARY KEY)")
        sql(f"INSERT INTO {q}.plain SELECT generate_series(1, 2000)")
        sql(f"CREATE TABLE {q}.parts (id int PRIMARY KEY) PARTITION BY RANGE (id)")
        sql(f"CREATE TABLE {q}.parts_1 PARTITION OF {q}.parts FOR VALUES FROM (0) TO (1000)")
        sql(f"CREATE TABLE {q}.parts_2 PARTITION OF {q}.parts FOR VALUES FROM (1000) TO (9999)")
        sql(f"INSERT INTO {q}.parts SELECT generate_series(1, 3000)")
        assert estimate("plain") is None and estimate("parts") is None  # never analyzed
        sql(f"ANALYZE {q}.plain")
        sql(f"ANALYZE {q}.parts")
        assert estimate("plain") == 2000
        assert estimate("parts") == 3000  # the sum of the leaf partitions
        assert estimate("parts_1") == 999
        sql(f"INSERT INTO {q}.plain SELECT generate_series(2001, 4000)")
        grown = estimate("plain")  # scaled to the pages there are now, as the planner does
        assert grown is not None and 3000 <= grown <= 5000
        assert estimate("missing") is None
    finally:
        dialect.close()

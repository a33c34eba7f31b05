"""The convergence check on a real PostgreSQL: read a table of many types as the engine does,
write it as READ events through the JSONL sink, replay and compare; then change the table
and see the check say what differs."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, date, datetime, time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.abc import Buffer
from psycopg.adapt import Loader

from signals.names import TableId
from snapshotter.core.events import ChangeEvent, Op, SnapshotMarker, Source
from snapshotter.core.position import Position
from snapshotter.core.values import RawJson
from snapshotter.sinks.jsonl import JsonlSink
from snapshotter.sources.postgres.scan import read_table_rows
from snapshotter.sources.postgres.types import LoadContext
from snapshotter.verify.rows import compare, materialize

pytestmark = pytest.mark.integration

DDL = """
CREATE TABLE {t} (
    id int PRIMARY KEY,
    big bigint,
    amount numeric(12, 2),
    name text,
    flag bool,
    u uuid,
    d date,
    ts timestamptz,
    naive timestamp,
    b bytea,
    j jsonb,
    js json,
    f float8,
    c char(5),
    tm time,
    arr int[]
)
"""

INSERT = """
INSERT INTO {t} VALUES
 (1, 9223372036854775807, 1.50, 'plain', true, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
  '2024-01-02', '2024-01-02 03:04:05.123456+00', '2024-01-02 03:04:05', '\\x00ff10',
  '{{"b": 1.50, "a": [1, null, "x"]}}', '{{ "keep" :  "spacing",
  "n": 1.10 }}', 0.1, 'ab', '03:04:05.000600', '{{1,2,3}}'),
 (2, -1, 0.00, 'ünïcødé "quoted" \\ back', false, '00000000-0000-0000-0000-000000000000',
  '0001-01-01', '1999-12-31 23:59:59+05:30', '2000-02-29 00:00:00.000001', '',
  '[]', 'null', 'NaN', 'abcde', '00:00:00', '{{}}'),
 (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
 (4, 0, 12345678.99, E'line\\nbreak\\ttab', true, NULL, '2024-02-29',
  '2024-06-30 12:00:00+00', NULL, '\\x', '{{"deep": {{"x": [true, false]}}}}', '"s"',
  '-Infinity', NULL, '23:59:59.999999', NULL)
"""


def columns_of(pg_url: str, table: TableId) -> list[tuple[str, int]]:
    # A plain connection: LoadContext carries loaders only, so it cannot send parameters.
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute(
            """SELECT a.attname, a.atttypid::int FROM pg_attribute a
           WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped
           ORDER BY a.attnum""",
            [str(table)],
        ).fetchall()
    return [(name, oid) for name, oid in rows]


@pytest.fixture
def conn(pg_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(pg_url, context=LoadContext(), autocommit=True) as c:
        # Not UTC on purpose: the sink must still write timestamptz values in UTC.
        c.execute("SET TimeZone = 'Asia/Kolkata'")
        yield c


@pytest.fixture
def table(conn: psycopg.Connection[Any], pg_schema: str) -> TableId:
    tid = TableId(pg_schema, "many_types")
    conn.execute(DDL.format(t=tid).encode())
    conn.execute(INSERT.format(t=tid).encode())
    return tid


def write_snapshot(path: Path, table: TableId, rows: list[dict[str, Any]]) -> None:
    sink = JsonlSink(path, "demo", lambda _t: ["id"])
    sink.open(None)
    events = [
        ChangeEvent(
            Op.READ,
            Source(
                "postgresql",
                "demo",
                "snapshotter",
                table,
                Position(0x1000, 1, i),
                ts_ms=0,
                snapshot=SnapshotMarker.INCREMENTAL,
            ),
            ts_ms=0,
            key=(row["id"],),
            after=row,
        )
        for i, row in enumerate(rows)
    ]
    sink.write(events)
    sink.close()


def test_rows_load_in_the_value_model(
    pg_url: str, conn: psycopg.Connection[Any], table: TableId
) -> None:
    rows = {r["id"]: r for r in read_table_rows(conn, table, columns_of(pg_url, table))}
    one, two = rows[1], rows[2]
    assert one["big"] == 9223372036854775807
    assert one["amount"] == "1.50"  # numeric: text, scale kept
    assert one["u"] == "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
    assert one["d"] == date(2024, 1, 2)
    assert one["ts"] == datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    assert one["naive"] == datetime(2024, 1, 2, 3, 4, 5)
    assert one["b"] == b"\x00\xff\x10"
    assert isinstance(one["j"], RawJson) and one["j"].parsed() == {"b": 1.5, "a": [1, None, "x"]}
    assert isinstance(one["js"], RawJson) and "\n" in one["js"].text  # json keeps its text
    assert one["c"] == "ab   "  # bpchar keeps its padding
    assert one["tm"] == time(3, 4, 5, 600)
    assert one["arr"] == "{1,2,3}"
    assert two["f"] != two["f"]  # NaN
    assert all(v is None for k, v in rows[3].items() if k != "id")


def test_snapshot_converges_then_a_change_is_reported(
    pg_url: str, conn: psycopg.Connection[Any], table: TableId, tmp_path: Path
) -> None:
    columns = columns_of(pg_url, table)
    path = tmp_path / "out.jsonl"
    write_snapshot(path, table, list(read_table_rows(conn, table, columns)))
    topic = f"demo.{table.schema}.{table.table}"
    materialized = materialize(path, topic)
    assert materialized.ops == {"r": 4}

    verdict = compare(materialized, read_table_rows(conn, table, columns), ["id"])
    assert verdict.ok, verdict.render()
    assert verdict.render() == "converged: 4 rows match"

    conn.execute(f"UPDATE {table} SET amount = 1.5, ts = ts + interval '1 second' WHERE id = 1")
    conn.execute(f"DELETE FROM {table} WHERE id = 3")
    conn.execute(f"INSERT INTO {table} (id, j) VALUES (5, '{{\"x\": 1}}')")
    conn.execute(f'UPDATE {table} SET j = \'{{"deep": {{"x": [true, true]}}}}\' WHERE id = 4')

    verdict = compare(materialized, read_table_rows(conn, table, columns), ["id"])
    assert not verdict.ok
    assert (verdict.missing, verdict.extra, verdict.differing) == (1, 1, 2)
    assert verdict.missing_examples == ({"id": 5},)
    assert verdict.extra_examples == ({"id": 3},)
    diffs = {d.key["id"]: d for d in verdict.differing_examples}
    # numeric(12,2) stores 1.5 as 1.50: only the timestamp moved.
    assert [(c.column, c.table, c.output) for c in diffs[1].columns] == [
        ("ts", "2024-01-02T03:04:06.123456Z", "2024-01-02T03:04:05.123456Z")
    ]
    assert [(c.column, c.table, c.output) for c in diffs[4].columns] == [
        ("j", {"deep": {"x": [True, True]}}, {"deep": {"x": [True, False]}})
    ]
    text = verdict.render()
    assert text.startswith("NOT converged: 1 missing, 1 extra, 2 differ (table 4 rows, output 4")
    assert (
        'differ: key {"id": 1}: column ts: table "2024-01-02T03:04:06.123456Z", '
        'output "2024-01-02T03:04:05.123456Z"' in text
    )


def test_quoted_names_and_a_composite_key(
    pg_url: str, conn: psycopg.Connection[Any], pg_schema: str, tmp_path: Path
) -> None:
    table = TableId(pg_schema, "Mixed Case")
    conn.execute(
        f'CREATE TABLE {pg_schema}."Mixed Case" ("Region" text, "select" int, "v.x" numeric, '
        'PRIMARY KEY ("Region", "select"))'
    )
    conn.execute(f"INSERT INTO {pg_schema}.\"Mixed Case\" VALUES ('eu', 1, 1.0), ('us', 1, NULL)")
    columns = columns_of(pg_url, table)
    rows = list(read_table_rows(conn, table, columns))
    assert sorted(rows, key=lambda r: r["Region"]) == [
        {"Region": "eu", "select": 1, "v.x": "1.0"},
        {"Region": "us", "select": 1, "v.x": None},
    ]
    path = tmp_path / "out.jsonl"
    sink = JsonlSink(path, "demo", lambda _t: ["Region", "select"])
    sink.open(None)
    sink.write(
        [
            ChangeEvent(
                Op.READ,
                Source("postgresql", "demo", "db", table, Position(1, i), ts_ms=0),
                ts_ms=0,
                key=(r["Region"], r["select"]),
                after=r,
            )
            for i, r in enumerate(rows)
        ]
    )
    sink.close()
    verdict = compare(
        materialize(path, f"demo.{pg_schema}.Mixed Case"),
        read_table_rows(conn, table, columns),
        ["Region", "select"],
    )
    assert verdict.ok, verdict.render()


def test_a_connection_loading_differently_is_refused(pg_url: str, table: TableId) -> None:
    class RawIntLoader(Loader):
        def load(self, data: Buffer) -> str:
            return bytes(data).decode()

    with psycopg.connect(pg_url, context=LoadContext()) as conn:
        conn.adapters.register_loader("int4", RawIntLoader)
        with pytest.raises(ValueError, match="column 'id' would not load as the engine"):
            read_table_rows(conn, table, [("id", 23), ("ts", 1184)])

"""pgoutput from a real PostgreSQL through the parser and decoder.

The messages come from ``pg_logical_slot_peek_binary_changes`` (the same bytes a walsender
sends in XLogData frames). Besides the events themselves, this checks the project's rule
that chunk rows and log rows carry identical values: every decoded column must equal what a
``LoadContext`` connection SELECTs for it, as the chunk reader does.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import sql

from signals.names import TableId
from snapshotter.core.events import ChangeEvent, Op
from snapshotter.core.values import UNAVAILABLE_VALUE
from snapshotter.sources.log import Change, Commit, LogItem, Notice, TableShape
from snapshotter.sources.postgres import types as pg_types
from snapshotter.sources.postgres.decoder import PgOutputDecoder

pytestmark = pytest.mark.integration

HUGE = "".join(uuid.uuid4().hex for _ in range(400))  # 12,800 characters, stored out of line

COLUMNS = """
    id int PRIMARY KEY,
    big bigint,
    num numeric(14, 4),
    txt text,
    vc varchar(20),
    ch char(5),
    flag bool,
    u uuid,
    d date,
    ts timestamp,
    tstz timestamptz,
    t time,
    raw bytea,
    jb jsonb,
    js json,
    arr int[],
    mood {schema}.mood,
    f8 float8,
    iv interval,
    huge text
"""

ROW_1 = {
    "big": 9_007_199_254_740_993,
    "num": "12345678.1234",
    "txt": "héllo, wörld",
    "vc": "var",
    "ch": "ab",
    "flag": True,
    "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
    "d": "2024-02-29",
    "ts": "2024-02-29 13:14:15.123456",
    "tstz": "2024-02-29 13:14:15.654321+05:30",
    "t": "23:59:59.999999",
    "raw": b"\x00\xff\x10",
    "jb": '{"b": "x", "a": [1, 2.50, null]}',
    "js": '{"a":  1.50 }',
    "arr": "{1,NULL,3}",
    "mood": "happy",
    "f8": 0.1,
    "iv": "1 day 02:03:04",
    "huge": HUGE,
}


@dataclass
class Scenario:
    table: TableId
    items: list[LogItem]
    frames: list[tuple[int, int, bytes]]  # (lsn, xid, data) as the slot returned them
    reference: dict[int, dict[str, Any]]  # id -> the row as the chunk reader would load it


def _reference_row(url: str, table: TableId, oids: dict[str, int], id_: int) -> dict[str, Any]:
    """The row as the chunk SELECT loads it: natively loaded types as themselves, every other
    type as the text of its output function (``pg_types.OUTPUT_TEXT``), both through the
    shared loaders."""
    with psycopg.connect(url, context=pg_types.LoadContext()) as conn:
        out = {}
        for name, oid in oids.items():
            column = sql.Identifier(name)
            expr = (
                column
                if pg_types.loaded_natively(oid)
                else sql.SQL(pg_types.OUTPUT_TEXT).format(column)
            )
            # The LoadContext map has loaders only (no dumpers): no query parameters.
            query = sql.SQL("SELECT {} FROM {}.{} WHERE id = {}").format(
                expr,
                sql.Identifier(table.schema or ""),
                sql.Identifier(table.table),
                sql.SQL(str(int(id_))),
            )
            row = conn.execute(query).fetchone()
            assert row is not None
            out[name] = pg_types.finish_value(oid, row[0])
        return out


@pytest.fixture
def scenario(pg_url: str, pg_schema: str) -> Iterator[Scenario]:
    table = TableId(pg_schema, "everything")
    slot = f"snap_test_{uuid.uuid4().hex[:12]}"
    pub = f"snap_pub_{uuid.uuid4().hex[:12]}"
    qt = sql.SQL("{}.{}").format(sql.Identifier(pg_schema), sql.Identifier(table.table))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TYPE {}.mood AS ENUM ('sad', 'happy')").format(
                sql.Identifier(pg_schema)
            )
        )
        conn.execute(
            sql.SQL("CREATE TABLE {} (" + COLUMNS.format(schema="{schema}") + ")").format(
                qt, schema=sql.Identifier(pg_schema)
            )
        )
        # Out of line and uncompressed: the value is TOASTed however well it compresses.
        conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN huge SET STORAGE EXTERNAL").format(qt))
        conn.execute(
            sql.SQL(
                "CREATE PUBLICATION {} FOR TABLE {} WITH (publish_via_partition_root = true)"
            ).format(sql.Identifier(pub), qt)
        )
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        try:
            catalog = conn.execute(
                "SELECT attname, atttypid::int, format_type(atttypid, atttypmod) "
                "FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
                "AND NOT attisdropped ORDER BY attnum",
                (f"{pg_schema}.{table.table}",),
            ).fetchall()
            oids = {name: oid for name, oid, _ in catalog}
            types = {name: type_name for name, _, type_name in catalog}
            reference = _make_changes(conn, pg_url, qt, table, oids, types)
            rows = conn.execute(
                "SELECT (lsn - '0/0')::bigint, xid::text::bigint, data "
                "FROM pg_logical_slot_peek_binary_changes("
                "%s, NULL, NULL, 'proto_version', '1', 'publication_names', %s)",
                (slot, pub),
            ).fetchall()
        finally:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            conn.execute(sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(pub)))
    decoder = PgOutputDecoder(
        name="it",
        database="snapshotter",
        key_columns=lambda t: ("id",) if t == table else None,
    )
    items = [item for lsn, _, data in rows for item in decoder.feed(data, lsn)]
    yield Scenario(table, items, rows, reference)


def _make_changes(
    conn: psycopg.Connection[Any],
    url: str,
    qt: sql.Composable,
    table: TableId,
    oids: dict[str, int],
    types: dict[str, str],
) -> dict[int, dict[str, Any]]:
    """Each statement is its own transaction (autocommit), except the first inserts."""
    names = list(ROW_1)
    insert = sql.SQL("INSERT INTO {} (id, {}) VALUES (%s, {})").format(
        qt,
        sql.SQL(", ").join(map(sql.Identifier, names)),
        # format_type() spells the column's type as SQL, quoted where needed.
        sql.SQL(", ").join(sql.SQL("CAST(%s AS " + types[n] + ")") for n in names),
    )
    with conn.transaction():
        conn.execute(insert, [1, *ROW_1.values()])
        conn.execute(sql.SQL("INSERT INTO {} (id) VALUES (2), (3)").format(qt))
    reference = {i: _reference_row(url, table, oids, i) for i in (1, 2)}
    conn.execute(sql.SQL("UPDATE {} SET txt = 'changed' WHERE id = 1").format(qt))  # TOAST 'u'
    conn.execute(sql.SQL("UPDATE {} SET id = 10 WHERE id = 1").format(qt))  # a key change
    conn.execute(sql.SQL("DELETE FROM {} WHERE id = 3").format(qt))  # old key only
    conn.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY FULL").format(qt))
    conn.execute(sql.SQL("UPDATE {} SET txt = 'again' WHERE id = 10").format(qt))  # TOAST filled
    reference[10] = _reference_row(url, table, oids, 10)
    conn.execute(sql.SQL("DELETE FROM {} WHERE id = 2").format(qt))  # whole old row
    conn.execute(sql.SQL("TRUNCATE {}").format(qt))
    return reference


def changes(items: list[LogItem]) -> list[ChangeEvent]:
    return [item.event for item in items if isinstance(item, Change)]


def test_events_in_order(scenario: Scenario) -> None:
    got = [(e.op, e.key) for e in changes(scenario.items)]
    assert got == [
        (Op.CREATE, (1,)),
        (Op.CREATE, (2,)),
        (Op.CREATE, (3,)),
        (Op.UPDATE, (1,)),
        (Op.DELETE, (1,)),  # the key change: delete of the old key...
        (Op.CREATE, (10,)),  # ...then create of the new one
        (Op.DELETE, (3,)),
        (Op.UPDATE, (10,)),
        (Op.DELETE, (2,)),
        (Op.TRUNCATE, None),
    ]
    assert all(e.table == scenario.table for e in changes(scenario.items))


def test_table_shapes(scenario: Scenario) -> None:
    shapes = [item for item in scenario.items if isinstance(item, TableShape)]
    assert shapes[0].full_identity is False
    assert shapes[-1].full_identity is True  # re-announced after REPLICA IDENTITY FULL
    assert [name for name, _ in shapes[0].columns] == ["id", *ROW_1]


def test_values_equal_the_chunk_readers(scenario: Scenario) -> None:
    events = changes(scenario.items)
    for event, id_ in ((events[0], 1), (events[1], 2), (events[7], 10)):
        assert event.after is not None
        expected = scenario.reference[id_]
        assert set(event.after) == set(expected)
        for column, value in expected.items():
            got = event.after[column]
            assert (type(got), got) == (type(value), value), column
    assert events[0].after is not None and events[0].after["ch"] == "ab   "  # padding kept


def test_unchanged_toast(scenario: Scenario) -> None:
    events = changes(scenario.items)
    plain_update, key_delete, key_create, full_update = events[3], events[4], events[5], events[7]
    # Default identity: the log has no value for the untouched TOASTed column.
    assert plain_update.before is None
    assert plain_update.after is not None and plain_update.after["huge"] == UNAVAILABLE_VALUE
    assert plain_update.after["txt"] == "changed"
    assert key_delete.before == {"id": 1}
    assert key_create.after is not None and key_create.after["huge"] == UNAVAILABLE_VALUE
    notices = [item for item in scenario.items if isinstance(item, Notice)]
    assert len(notices) == 1 and "REPLICA IDENTITY FULL" in notices[0].message
    # REPLICA IDENTITY FULL: the old row carries the value, and the decoder fills it in.
    assert full_update.before is not None and full_update.before["huge"] == HUGE
    assert full_update.after is not None and full_update.after["huge"] == HUGE
    assert full_update.after["txt"] == "again"
    full_delete = events[8]
    assert full_delete.before is not None and full_delete.before["txt"] is None
    assert set(full_delete.before) == {"id", *ROW_1}


def test_positions_commits_and_sources(scenario: Scenario) -> None:
    positioned = [
        item.event.position if isinstance(item, Change) else item.position
        for item in scenario.items
        if isinstance(item, Change | Commit)
    ]
    assert all(a < b for a, b in itertools.pairwise(positioned))
    commits = [item for item in scenario.items if isinstance(item, Commit)]
    # Seven transactions changed the table; PostgreSQL < 15 also sends the empty ALTER TABLE.
    assert {c.xid for c in commits} >= {
        item.xid for item in scenario.items if isinstance(item, Change)
    }
    assert len({item.xid for item in scenario.items if isinstance(item, Change)}) == 7
    frame_xids = {xid for _, xid, _ in scenario.frames}
    now_ms = time.time() * 1000
    for done in commits:
        assert done.xid in frame_xids
        assert isinstance(done.resume["lsn"], int) and done.resume["lsn"] > done.position.parts[0]
        assert now_ms - 120_000 < done.ts_ms <= now_ms  # a Unix-ms commit time, just now
    frame_lsns = {lsn for lsn, _, _ in scenario.frames}
    for event in changes(scenario.items):
        assert event.source.details["lsn"] in frame_lsns
        assert event.source.details["txId"] in frame_xids
        assert event.source.to_dict()["snapshot"] == "false"
        assert event.source.ts_ms == next(
            c.ts_ms for c in commits if c.xid == event.source.details["txId"]
        )

"""BinlogDecoder on hand-built mysql-replication events (no server).

The decoder dispatches on mysql-replication's event classes, so the fakes are real instances
made without parsing a packet (``object.__new__``) with the attributes the decoder reads set
by hand. Row images go to the name-mangled slot behind the read-only ``rows`` property; the
events of uncaptured tables are a subclass whose ``rows`` fails the test when touched.
"""

from __future__ import annotations

import datetime as dt
import itertools
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from pymysqlreplication.column import Column
from pymysqlreplication.constants import NONE_SOURCE
from pymysqlreplication.event import (
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    QueryEvent,
    RotateEvent,
    XidEvent,
)
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

from signals.names import TableId
from snapshotter.core.events import Op
from snapshotter.core.position import Position
from snapshotter.core.values import RawJson
from snapshotter.sources.log import Change, Commit, LogItem, Notice, Progress, TableShape
from snapshotter.sources.mysql import types as mt
from snapshotter.sources.mysql.decoder import BinlogDecoder, BinlogError
from snapshotter.sources.mysql.positions import binlog_offset

FILE = "binlog.000007"
NEXT_FILE = "binlog.000008"
SERVER_ID = 1
TS = 1_700_000_000  # event timestamps are seconds
CLOCK_MS = 42

# -- fake events -------------------------------------------------------------------------------


def _packet(end: int, size: int = 40, server_id: int = SERVER_ID) -> SimpleNamespace:
    return SimpleNamespace(log_pos=end, event_size=size, server_id=server_id)


def _event(cls: type, end: int, size: int = 40, **attrs: Any) -> Any:
    event = object.__new__(cls)
    event.packet = _packet(end, size)
    event.event_size = size
    event.timestamp = TS
    for name, value in attrs.items():
        setattr(event, name, value)
    return event


def col(
    name: str | None, type_: int, set_values: Sequence[str] | None = None, bits: int = 0
) -> Any:
    return Column(name=name, type=type_, set_values=set_values, bits=bits)


class _UntouchableWrite(WriteRowsEvent):
    @property
    def rows(self) -> Any:
        raise AssertionError("the rows of an uncaptured table were decoded")


class _UntouchableUpdate(UpdateRowsEvent):
    @property
    def rows(self) -> Any:
        raise AssertionError("the rows of an uncaptured table were decoded")


class _UntouchableDelete(DeleteRowsEvent):
    @property
    def rows(self) -> Any:
        raise AssertionError("the rows of an uncaptured table were decoded")


_UNTOUCHABLE = {
    WriteRowsEvent: _UntouchableWrite,
    UpdateRowsEvent: _UntouchableUpdate,
    DeleteRowsEvent: _UntouchableDelete,
}


def _none_sources(values: dict[str, Any]) -> dict[str, str]:
    return {k: NONE_SOURCE.NULL for k, v in values.items() if v is None}


@dataclass
class TableMap:
    """One table map: rows events of it share its ``columns`` list (as mysql-replication's
    do), and a new TableMap (new table id, new list) is what an ALTER produces."""

    table_id: int
    schema: str
    table: str
    columns: list[Any]
    primary_key: Any = "id"
    untouchable: bool = False
    sizes: list[int] = field(default_factory=list)

    def _rows_event(self, cls: type, end: int, rows: list[dict[str, Any]]) -> Any:
        if self.untouchable:
            cls = _UNTOUCHABLE[cls]
        event = _event(
            cls,
            end,
            table_id=self.table_id,
            schema=self.schema,
            table=self.table,
            columns=self.columns,
            primary_key=self.primary_key,
        )
        if not self.untouchable:
            event._RowsEvent__rows = rows
        return event

    def write(self, end: int, *rows: dict[str, Any]) -> Any:
        return self._rows_event(
            WriteRowsEvent,
            end,
            [{"values": dict(r), "none_sources": _none_sources(r)} for r in rows],
        )

    def delete(self, end: int, *rows: dict[str, Any]) -> Any:
        return self._rows_event(
            DeleteRowsEvent,
            end,
            [{"values": dict(r), "none_sources": _none_sources(r)} for r in rows],
        )

    def update(self, end: int, *pairs: tuple[dict[str, Any], dict[str, Any]]) -> Any:
        return self._rows_event(
            UpdateRowsEvent,
            end,
            [
                {
                    "before_values": dict(b),
                    "after_values": dict(a),
                    "before_none_sources": _none_sources(b),
                    "after_none_sources": _none_sources(a),
                }
                for b, a in pairs
            ],
        )


def xid(end: int) -> Any:
    return _event(XidEvent, end, size=31, xid=123)


def mariadb_gtid(end: int, gtid: str) -> Any:
    return _event(MariadbGtidEvent, end, size=38, gtid=gtid)


def mysql_gtid(end: int, sid: uuid.UUID, gno: int) -> Any:
    return _event(GtidEvent, end, size=79, sid=sid.bytes, gno=gno)


def query(end: int, sql: str, schema: str | bytes = b"db") -> Any:
    return _event(QueryEvent, end, size=60 + len(sql), query=sql, schema=schema)


def rotate(next_binlog: str, position: int = 4) -> Any:
    event = _event(RotateEvent, 0, size=44, next_binlog=next_binlog, position=position)
    event.timestamp = 0
    return event


def heartbeat(end: int, ident: str = FILE) -> Any:
    event = _event(HeartbeatLogEvent, end, size=len(ident), ident=ident)
    event.timestamp = 0
    return event


# -- helpers -----------------------------------------------------------------------------------

T = TableId("db", "t")
U = TableId("db", "u")


def decoder(
    captured: Iterable[TableId] | None = None,
    key_columns: dict[TableId, Sequence[str]] | None = None,
    asked: list[TableId] | None = None,
) -> BinlogDecoder:
    chosen = {T} if captured is None else set(captured)
    keys = key_columns or {}

    def is_captured(table: TableId) -> bool:
        if asked is not None:
            asked.append(table)
        return table in chosen

    out = BinlogDecoder(
        "srv", captured=is_captured, key_columns=keys.get, clock_ms=lambda: CLOCK_MS
    )
    out.start(FILE)
    return out


def feed_all(dec: BinlogDecoder, events: Iterable[Any]) -> list[LogItem]:
    items: list[LogItem] = []
    for event in events:
        items.extend(dec.feed(event))
    return items


def changes(items: Iterable[LogItem]) -> list[Change]:
    return [i for i in items if isinstance(i, Change)]


def positioned(items: Iterable[LogItem]) -> list[Position]:
    out = []
    for item in items:
        if isinstance(item, Change):
            out.append(item.event.position)
        elif isinstance(item, Commit):
            out.append(item.position)
    return out


def simple_table(table_id: int = 100, table: str = "t", **kwargs: Any) -> TableMap:
    return TableMap(
        table_id,
        "db",
        table,
        [col("id", mt.LONG), col("name", mt.VARCHAR)],
        **kwargs,
    )


# -- rows --------------------------------------------------------------------------------------


def test_insert_update_delete_become_c_u_d_with_keys_and_source_details() -> None:
    dec = decoder()
    t = simple_table()
    items = feed_all(
        dec,
        [
            mariadb_gtid(200, "0-1-5"),
            t.write(300, {"id": 1, "name": "a"}, {"id": 2, "name": None}),
            t.update(400, ({"id": 1, "name": "a"}, {"id": 1, "name": "b"})),
            t.delete(500, {"id": 2, "name": None}),
            xid(531),
        ],
    )
    shape = items[0]
    assert shape == TableShape(T, (("id", mt.LONG), ("name", mt.VARCHAR)), True, ("id",))
    assert sum(isinstance(i, TableShape) for i in items) == 1  # announced once
    evs = [c.event for c in changes(items)]
    assert [(e.op, e.key, e.before, e.after) for e in evs] == [
        (Op.CREATE, (1,), None, {"id": 1, "name": "a"}),
        (Op.CREATE, (2,), None, {"id": 2, "name": None}),
        (Op.UPDATE, (1,), {"id": 1, "name": "a"}, {"id": 1, "name": "b"}),
        (Op.DELETE, (2,), {"id": 2, "name": None}, None),
    ]
    assert [e.position for e in evs] == [
        Position(7, 300, 0),
        Position(7, 300, 2),
        Position(7, 400, 0),
        Position(7, 500, 0),
    ]
    first = evs[0]
    assert first.table == T
    assert first.ts_ms == CLOCK_MS
    assert first.source.ts_ms == TS * 1000
    assert first.source.connector == "mysql"
    assert first.source.name == "srv"
    assert first.source.db == "db"
    assert dict(first.source.details) == {
        "server_id": SERVER_ID,
        "gtid": "0-1-5",
        "file": FILE,
        "binlog_pos": 300 - 40,  # the event's start
        "row": 0,
    }
    assert evs[1].source.details["row"] == 1
    assert all(c.xid == 0 for c in changes(items))
    assert isinstance(items[-1], Commit)


def test_key_order_comes_from_key_columns_then_the_table_map() -> None:
    columns = [col("a", mt.LONG), col("b", mt.VARCHAR), col("c", mt.LONG)]
    row = {"a": 1, "b": "x", "c": 3}
    # key_columns (the catalog's PK order) wins over the table map's (table order).
    dec = decoder(key_columns={T: ("b", "a")})
    t = TableMap(100, "db", "t", columns, primary_key=("a", "b"))
    items = dec.feed(t.write(300, row))
    assert items[0].key == ("b", "a")
    assert changes(items)[0].event.key == ("x", 1)
    # No key_columns (or naming a column the map lacks): the table map's primary key.
    for keys in (None, {T: ("zz",)}):
        dec = decoder(key_columns=keys)
        items = dec.feed(TableMap(101, "db", "t", columns, primary_key=("a", "b")).write(9, row))
        assert changes(items)[0].event.key == (1, "x")
    dec = decoder()
    items = dec.feed(TableMap(102, "db", "t", columns, primary_key="c").write(9, row))
    assert changes(items)[0].event.key == (3,)
    # No key at all: the whole row is the key.
    dec = decoder()
    items = dec.feed(TableMap(103, "db", "t", columns, primary_key="").write(9, row))
    assert items[0].key == ("a", "b", "c")
    assert changes(items)[0].event.key == (1, "x", 3)


def test_a_primary_key_change_is_a_delete_then_a_create() -> None:
    dec = decoder()
    t = simple_table()
    items = feed_all(
        dec,
        [
            t.update(
                400,
                ({"id": 1, "name": "a"}, {"id": 1, "name": "b"}),  # row 0: plain update
                ({"id": 2, "name": "x"}, {"id": 20, "name": "x"}),  # row 1: key change
                ({"id": 3, "name": "y"}, {"id": 3, "name": "z"}),  # row 2: plain update
            ),
            xid(431),
        ],
    )
    evs = [c.event for c in changes(items)]
    assert [(e.op, e.key, e.position) for e in evs] == [
        (Op.UPDATE, (1,), Position(7, 400, 0)),
        (Op.DELETE, (2,), Position(7, 400, 2)),
        (Op.CREATE, (20,), Position(7, 400, 3)),
        (Op.UPDATE, (3,), Position(7, 400, 4)),
    ]
    assert evs[1].before == {"id": 2, "name": "x"} and evs[1].after is None
    assert evs[2].before is None and evs[2].after == {"id": 20, "name": "x"}
    assert evs[1].source.details["row"] == evs[2].source.details["row"] == 1


@pytest.mark.parametrize(
    ("old", "new"),
    [("abc", "ABC"), ("abc", "abc "), ("é", "e"), ("ss", "ß")],
    ids=["case", "trailing-space", "accent", "expansion"],
)
def test_keys_equal_under_a_ci_pad_space_collation_still_change(old: str, new: str) -> None:
    # Exact stored values, no casefolding and no pad stripping: a key change to a value
    # the collation calls equal is still a delete of the old key and a create of the new.
    dec = decoder()
    t = TableMap(100, "db", "t", [col("k", mt.VARCHAR), col("v", mt.LONG)], primary_key="k")
    items = dec.feed(t.update(400, ({"k": old, "v": 1}, {"k": new, "v": 1})))
    evs = [c.event for c in changes(items)]
    assert [(e.op, e.key) for e in evs] == [(Op.DELETE, (old,)), (Op.CREATE, (new,))]
    assert [e.position for e in evs] == [Position(7, 400, 0), Position(7, 400, 1)]


def test_composite_key_change_in_one_column_only() -> None:
    dec = decoder(key_columns={T: ("a", "b")})
    t = TableMap(100, "db", "t", [col("a", mt.LONG), col("b", mt.VARCHAR)], primary_key=("a", "b"))
    items = dec.feed(t.update(400, ({"a": 1, "b": "x"}, {"a": 1, "b": "X"})))
    assert [(c.event.op, c.event.key) for c in changes(items)] == [
        (Op.DELETE, (1, "x")),
        (Op.CREATE, (1, "X")),
    ]


def test_positions_strictly_increase_across_events_rows_and_files() -> None:
    dec = decoder()
    t = simple_table()
    rows = [{"id": i, "name": str(i)} for i in range(5)]
    items = feed_all(
        dec,
        [
            mariadb_gtid(100, "0-1-1"),
            t.write(200, *rows[:3]),
            t.update(300, *[(r, {**r, "id": r["id"] + 100}) for r in rows[:3]]),
            t.delete(400, *[{**r, "id": r["id"] + 100} for r in rows[:3]]),
            xid(431),
            mariadb_gtid(470, "0-1-2"),
            query(560, "TRUNCATE TABLE t"),
            mariadb_gtid(600, "0-1-3"),
            t.write(700, rows[3]),
            xid(731),
            query(770, "FLUSH BINARY LOGS"),  # not DDL: nothing
            rotate(NEXT_FILE),
            # The new file starts over at small offsets.
            mariadb_gtid(120, "0-1-4"),
            t.write(180, rows[4]),
            t.update(220, (rows[4], {**rows[4], "name": "z"})),
            xid(251),
        ],
    )
    positions = positioned(items)
    assert len(positions) == 3 + 6 + 3 + 1 + 2 + 1 + 1 + 1 + 1 + 1
    assert all(a < b for a, b in itertools.pairwise(positions)), positions
    assert {p.parts[0] for p in positions} == {7, 8}
    assert positions[-1] == Position(8, 251, 0)
    # Positions are unique, and tokens sort as positions do.
    tokens = [p.token for p in positions]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


def test_events_without_a_position_inside_a_transaction_still_rise_below_the_commit() -> None:
    """MariaDB 11.4 writes log_pos 0 into the table maps and rows events of a transaction
    (copied from its cache): their positions follow the GTID event's by the events' sizes,
    rise event by event, stay below the commit's real one, and come again the same."""
    t = simple_table()
    rows = [{"id": i, "name": str(i)} for i in range(4)]

    def stream() -> list[Any]:
        return [
            mariadb_gtid(1000, "0-1-1"),
            t.write(0, *rows[:2]),
            t.update(0, (rows[0], {**rows[0], "name": "x"})),
            t.delete(0, rows[1]),
            xid(1400),
            mariadb_gtid(1450, "0-1-2"),
            t.write(0, rows[2], rows[3]),
            xid(1600),
        ]

    positions = positioned(feed_all(decoder(), stream()))
    assert len(positions) == 2 + 1 + 1 + 1 + 2 + 1
    assert all(a < b for a, b in itertools.pairwise(positions)), positions
    assert positions[0].parts[1] > 1000 and positions[4] == Position(7, 1400, 0)
    assert positioned(feed_all(decoder(), stream())) == positions


def test_a_stream_resumed_at_a_position_counts_unpositioned_events_from_it() -> None:
    """A (re)connection starts with a rotate to the saved file and position: events after it
    that carry no position (log_pos 0) count from that start, never from 0, so nothing
    resumed there goes back before the saved position."""
    t = simple_table()
    dec = decoder()
    feed_all(dec, [rotate(FILE, position=5000)])
    positions = positioned(feed_all(dec, [t.write(0, {"id": 1, "name": "a"}), xid(5200)]))
    assert positions[0].parts[1] > 5000 and positions[-1] == Position(7, 5200, 0), positions


def test_the_same_transaction_decoded_again_gets_the_same_positions() -> None:
    t = simple_table()

    def stream() -> list[Any]:
        return [
            mariadb_gtid(100, "0-1-1"),
            t.write(200, {"id": 1, "name": "a"}),
            t.update(300, ({"id": 1, "name": "a"}, {"id": 2, "name": "a"})),
            xid(331),
        ]

    first = positioned(feed_all(decoder(), stream()))
    again = positioned(feed_all(decoder(), stream()))
    assert first == again


# -- transactions ------------------------------------------------------------------------------


def test_xid_is_a_commit_with_resume_at_its_end_and_log_offset() -> None:
    dec = decoder()
    t = simple_table()
    items = feed_all(
        dec,
        [mariadb_gtid(200, "0-1-9"), t.write(300, {"id": 1, "name": "a"}), xid(331)],
    )
    commit = items[-1]
    assert commit == Commit(
        xid=0,
        position=Position(7, 331, 0),
        resume={"file": FILE, "pos": 331, "gtid": "0-1-9"},
        ts_ms=TS * 1000,
        log_offset=binlog_offset(FILE, 331),
    )
    assert commit.log_offset == (7 << 32) | 331
    assert all(commit.position >= c.event.position for c in changes(items))
    assert not dec.in_transaction


def test_commit_without_gtid_has_no_gtid_in_resume() -> None:
    dec = decoder()
    (commit,) = dec.feed(xid(331))
    assert commit.resume == {"file": FILE, "pos": 331}


def test_begin_and_commit_queries_frame_a_non_transactional_transaction() -> None:
    dec = decoder()
    t = simple_table()
    assert dec.feed(query(100, "BEGIN")) == []
    assert dec.in_transaction
    items = dec.feed(t.write(200, {"id": 1, "name": "a"}))
    assert len(changes(items)) == 1
    (commit,) = dec.feed(query(260, "COMMIT"))
    assert isinstance(commit, Commit) and commit.position == Position(7, 260, 0)
    assert commit.resume == {"file": FILE, "pos": 260}
    assert not dec.in_transaction
    # SAVEPOINT and friends inside a transaction: nothing, and the transaction stays open.
    dec.feed(query(300, "BEGIN"))
    assert dec.feed(query(350, "SAVEPOINT s1")) == []
    assert dec.in_transaction


def test_gtids_of_mysql_and_mariadb_go_to_details_and_resume() -> None:
    sid = uuid.UUID("3e11fa47-71ca-11e1-9e33-c80aa9429562")
    t = simple_table()
    for gtid_event, expected in (
        (mysql_gtid(100, sid, 23), "3e11fa47-71ca-11e1-9e33-c80aa9429562:23"),
        (mariadb_gtid(100, "0-1-42"), "0-1-42"),
    ):
        dec = decoder()
        assert dec.feed(gtid_event) == []
        assert dec.in_transaction
        items = feed_all(dec, [t.write(200, {"id": 1, "name": "a"}), xid(231)])
        assert changes(items)[0].event.source.details["gtid"] == expected
        assert items[-1].resume == {"file": FILE, "pos": 231, "gtid": expected}


def test_rotate_switches_file_for_details_resume_and_offsets() -> None:
    dec = decoder()
    t = simple_table()
    dec.feed(rotate(NEXT_FILE))
    items = feed_all(dec, [t.write(200, {"id": 1, "name": "a"}), xid(231)])
    change = changes(items)[0]
    assert change.event.position == Position(8, 200, 0)
    assert change.event.source.details["file"] == NEXT_FILE
    assert items[-1].resume == {"file": NEXT_FILE, "pos": 231}
    assert items[-1].log_offset == (8 << 32) | 231


# -- TRUNCATE and DDL --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "schema"),
    [
        ("TRUNCATE t", b"db"),
        ("TRUNCATE TABLE t", "db"),
        ("truncate table t", b"db"),
        ("TRUNCATE TABLE db.t", b"other"),
        ("TRUNCATE TABLE db . t", b""),
        ("TRUNCATE `t`", b"db"),
        ("TRUNCATE TABLE `db`.`t`", b"other"),
        ("  TRUNCATE\n TABLE `db`.t  ", b"other"),
    ],
)
def test_truncate_of_a_captured_table_is_a_t_event_and_a_commit(sql: str, schema: Any) -> None:
    dec = decoder()
    dec.feed(mariadb_gtid(100, "0-1-3"))
    items = dec.feed(query(200, sql, schema))
    assert len(items) == 2
    change, commit = items
    assert isinstance(change, Change) and isinstance(commit, Commit)
    assert change.event.op is Op.TRUNCATE
    assert change.event.table == T
    assert change.event.key is None and change.event.before is None and change.event.after is None
    assert change.event.position == Position(7, 200, 0)
    assert commit.position == Position(7, 200, 1)
    assert commit.resume == {"file": FILE, "pos": 200, "gtid": "0-1-3"}
    assert not dec.in_transaction


def test_truncate_of_a_quoted_name_with_backticks_inside() -> None:
    odd = TableId("my db", "we`ird")
    dec = decoder(captured={odd})
    items = dec.feed(query(200, "TRUNCATE TABLE `my db`.`we``ird`", b"db"))
    assert [type(i) for i in items] == [Change, Commit]
    assert items[0].event.table == odd


@pytest.mark.parametrize(
    ("sql", "schema"),
    [("TRUNCATE TABLE u", b"db"), ("TRUNCATE TABLE other.t", b"db"), ("TRUNCATE t", b"")],
)
def test_truncate_of_an_uncaptured_table_is_only_a_commit(sql: str, schema: bytes) -> None:
    dec = decoder()
    items = dec.feed(query(200, sql, schema))
    assert items == [
        Commit(0, Position(7, 200, 0), {"file": FILE, "pos": 200}, TS * 1000, (7 << 32) | 200)
    ]


def test_alter_table_is_a_notice_and_the_next_rows_re_announce_the_shape() -> None:
    dec = decoder()
    t = simple_table()
    first = feed_all(dec, [t.write(200, {"id": 1, "name": "a"}), xid(231)])
    assert isinstance(first[0], TableShape)
    # Same table map again: no new shape.
    again = feed_all(dec, [t.write(300, {"id": 2, "name": "b"}), xid(331)])
    assert not any(isinstance(i, TableShape) for i in again)

    dec.feed(mariadb_gtid(360, "0-1-9"))
    items = dec.feed(query(400, "ALTER TABLE `t` ADD COLUMN extra int", b"db"))
    assert [type(i) for i in items] == [Notice, Commit]
    notice, commit = items
    assert notice.table == T
    assert "ALTER TABLE `t` ADD COLUMN extra int" in notice.message
    assert commit.position == Position(7, 400, 1)

    altered = TableMap(101, "db", "t", [*t.columns, col("extra", mt.LONG)])
    items = dec.feed(altered.write(500, {"id": 3, "name": "c", "extra": 7}))
    assert items[0] == TableShape(
        T, (("id", mt.LONG), ("name", mt.VARCHAR), ("extra", mt.LONG)), True, ("id",)
    )
    assert changes(items)[0].event.after == {"id": 3, "name": "c", "extra": 7}


def test_ddl_that_keeps_the_columns_still_re_announces_the_shape() -> None:
    dec = decoder()
    t = simple_table()
    dec.feed(t.write(200, {"id": 1, "name": "a"}))
    items = dec.feed(query(300, "ALTER TABLE db.t ADD INDEX (name)"))
    assert isinstance(items[0], Notice)
    # The same table map object (nothing changed): the shape comes again anyway.
    items = dec.feed(t.write(400, {"id": 2, "name": "b"}))
    assert isinstance(items[0], TableShape)


@pytest.mark.parametrize(
    "sql",
    [
        "DROP TABLE `t` /* generated by server */",
        "DROP TABLE IF EXISTS db.t",
        "RENAME TABLE t TO t_old",
        "ALTER ONLINE TABLE t ADD COLUMN x int",
        "alter table `db`.`t` drop column name",
    ],
)
def test_ddl_on_a_captured_table_is_a_notice(sql: str) -> None:
    dec = decoder()
    items = dec.feed(query(300, sql))
    assert [type(i) for i in items] == [Notice, Commit]
    assert items[0].table == T


@pytest.mark.parametrize(
    "sql",
    ["ALTER TABLE u ADD COLUMN x int", "DROP TABLE other.t", "CREATE TABLE u (id int)"],
)
def test_ddl_on_other_tables_is_only_a_commit(sql: str) -> None:
    dec = decoder()
    dec.feed(mariadb_gtid(250, "0-1-1"))
    items = dec.feed(query(300, sql))
    assert [type(i) for i in items] == [Commit]
    assert items[0].position == Position(7, 300, 0)
    assert not dec.in_transaction


@pytest.mark.parametrize(
    ("sql", "kinds"),
    [
        ("/* app: cleanup */ TRUNCATE TABLE t", [Change, Commit]),
        ("/* migration 42 */ ALTER TABLE t ADD COLUMN x int", [Notice, Commit]),
        ("/* tool */ CREATE TABLE u (id int)", [Commit]),
    ],
)
def test_ddl_with_a_leading_comment_is_still_ddl(sql: str, kinds: list[type]) -> None:
    dec = decoder()
    dec.feed(mariadb_gtid(100, "0-1-3"))
    items = dec.feed(query(200, sql))
    assert [type(i) for i in items] == kinds
    assert not dec.in_transaction


def test_create_table_asks_captured_again() -> None:
    chosen: set[TableId] = set()
    asked: list[TableId] = []

    def is_captured(table: TableId) -> bool:
        asked.append(table)
        return table in chosen

    dec = BinlogDecoder("srv", captured=is_captured, key_columns=lambda t: None)
    dec.start(FILE)
    n = simple_table(200, "n", untouchable=True)
    assert dec.feed(n.write(100, {"id": 1, "name": "a"})) == []
    assert dec.feed(n.write(150, {"id": 1, "name": "a"})) == []
    assert asked == [TableId("db", "n")]  # cached
    # The table is dropped and created again; it matches the selection now.
    chosen.add(TableId("db", "n"))
    dec.feed(query(200, "CREATE TABLE n (id int primary key, name varchar(10))"))
    n2 = simple_table(201, "n")
    items = dec.feed(n2.write(300, {"id": 1, "name": "a"}))
    assert [c.event.key for c in changes(items)] == [(1,)]


# -- uncaptured tables ---------------------------------------------------------------------------


def test_rows_of_uncaptured_tables_are_never_decoded() -> None:
    asked: list[TableId] = []
    dec = decoder(asked=asked)
    u = simple_table(300, "u", untouchable=True)
    t = simple_table(100, "t")
    items = feed_all(
        dec,
        [
            mariadb_gtid(100, "0-1-1"),
            u.write(200),
            u.update(250),
            u.delete(300),
            t.write(400, {"id": 1, "name": "a"}),
            u.write(450),
            xid(481),
        ],
    )
    assert [type(i) for i in items] == [TableShape, Change, Commit]
    assert items[0].table == T
    assert sorted(asked, key=str) == [T, U]  # each asked once


# -- values ------------------------------------------------------------------------------------


def test_value_conversions_to_the_value_model() -> None:
    columns = [
        col("id", mt.LONG),
        col("ts", mt.TIMESTAMP2),
        col("ts_old", mt.TIMESTAMP),
        col("dt", mt.DATETIME2),
        col("tags", mt.SET, set_values=["a", "b", "c"]),
        col("flags", mt.BIT, bits=4),
        col("wide", mt.BIT, bits=12),
        col("doc", mt.JSON),
    ]
    naive = dt.datetime(2024, 5, 6, 7, 8, 9, 123456)
    values = {
        "id": 1,
        "ts": naive,
        "ts_old": dt.datetime(1999, 1, 1),
        "dt": naive,
        "tags": {"c", "a"},
        "flags": "0101",
        "wide": "000100000001",
        "doc": {"a": [1, 2.5, None, "x", True], "é": {}},
    }
    t = TableMap(100, "db", "t", columns)
    dec = decoder()
    (change,) = changes(dec.feed(t.write(200, values)))
    after = change.event.after
    assert after["ts"] == naive.replace(tzinfo=dt.UTC)
    assert after["ts"].tzinfo is dt.UTC
    assert after["ts_old"] == dt.datetime(1999, 1, 1, tzinfo=dt.UTC)
    assert after["dt"] == naive and after["dt"].tzinfo is None  # DATETIME stays naive
    assert after["tags"] == "a,c"  # definition order, not the set's
    assert after["flags"] == b"\x05"
    assert after["wide"] == b"\x01\x01"
    assert after["doc"] == RawJson('{"a": [1, 2.5, null, "x", true], "é": {}}')
    assert after["doc"].parsed() == values["doc"]


def test_set_values_empty_null_and_all_members() -> None:
    columns = [col("id", mt.LONG), col("tags", mt.SET, set_values=["x", "y", "z"])]
    t = TableMap(100, "db", "t", columns)
    dec = decoder()
    rows = [
        {"values": {"id": 1, "tags": None}, "none_sources": {"tags": NONE_SOURCE.EMPTY_SET}},
        {"values": {"id": 2, "tags": None}, "none_sources": {"tags": NONE_SOURCE.NULL}},
        {"values": {"id": 3, "tags": {"z", "y", "x"}}, "none_sources": {}},
        {"values": {"id": 4, "tags": {"y"}}, "none_sources": {}},
    ]
    event = t.write(200)
    event._RowsEvent__rows = rows
    got = [c.event.after["tags"] for c in changes(dec.feed(event))]
    assert got == ["", None, "x,y,z", "y"]


def test_json_text_bytes_and_nested_bytes() -> None:
    t = TableMap(100, "db", "t", [col("id", mt.LONG), col("doc", mt.JSON)])
    dec = decoder()
    docs = ['{"k": 1}', b'[1, "two"]', {b"key": [b"v", 1.5]}, None, "null"]
    rows = [{"id": i, "doc": d} for i, d in enumerate(docs)]
    got = [c.event.after["doc"] for c in changes(dec.feed(t.write(200, *rows)))]
    assert got == [
        RawJson('{"k": 1}'),
        RawJson('[1, "two"]'),
        RawJson('{"key": ["v", 1.5]}'),
        None,
        RawJson("null"),
    ]


def test_nulls_are_not_converted() -> None:
    columns = [
        col("id", mt.LONG),
        col("ts", mt.TIMESTAMP2),
        col("flags", mt.BIT, bits=3),
        col("doc", mt.JSON),
    ]
    t = TableMap(100, "db", "t", columns)
    row = {"id": 1, "ts": None, "flags": None, "doc": None}
    (change,) = changes(decoder().feed(t.write(200, row)))
    assert change.event.after == row


def test_converted_values_in_both_images_of_an_update() -> None:
    columns = [col("id", mt.LONG), col("ts", mt.TIMESTAMP2)]
    t = TableMap(100, "db", "t", columns)
    a, b = dt.datetime(2020, 1, 1), dt.datetime(2021, 1, 1)
    (change,) = changes(decoder().feed(t.update(200, ({"id": 1, "ts": a}, {"id": 1, "ts": b}))))
    assert change.event.before["ts"] == a.replace(tzinfo=dt.UTC)
    assert change.event.after["ts"] == b.replace(tzinfo=dt.UTC)


def test_timestamp_key_is_converted_before_keying() -> None:
    t = TableMap(100, "db", "t", [col("at", mt.TIMESTAMP2)], primary_key="at")
    naive = dt.datetime(2020, 1, 1)
    (change,) = changes(decoder().feed(t.write(200, {"at": naive})))
    assert change.event.key == (naive.replace(tzinfo=dt.UTC),)


# -- heartbeats ----------------------------------------------------------------------------------


def test_heartbeat_is_progress_only_outside_a_transaction() -> None:
    dec = decoder()
    t = simple_table()
    assert dec.feed(heartbeat(1000, FILE + "\x00")) == [
        Progress(resume={"file": FILE, "pos": 1000}, log_offset=(7 << 32) | 1000)
    ]
    dec.feed(mariadb_gtid(1100, "0-1-2"))
    dec.feed(t.write(1200, {"id": 1, "name": "a"}))
    assert dec.feed(heartbeat(1200)) == []  # a transaction is open
    dec.feed(xid(1231))
    assert dec.feed(heartbeat(1231)) == [
        Progress(resume={"file": FILE, "pos": 1231, "gtid": "0-1-2"}, log_offset=(7 << 32) | 1231)
    ]
    assert dec.feed(heartbeat(50, NEXT_FILE)) == []  # not the file we are in
    assert dec.feed(heartbeat(50, "")) == []


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize("missing", [None, "UNKNOWN_COL1"])
def test_missing_column_names_ask_for_full_row_metadata(missing: str | None) -> None:
    t = TableMap(100, "db", "t", [col("id", mt.LONG), col(missing, mt.VARCHAR)])
    with pytest.raises(BinlogError, match="binlog_row_metadata=FULL"):
        decoder().feed(t.write(200, {"id": 1, missing: "a"}))


def test_missing_column_names_of_uncaptured_tables_do_not_matter() -> None:
    u = TableMap(300, "db", "u", [col(None, mt.LONG)], untouchable=True)
    assert decoder().feed(u.write(200)) == []


def test_unknown_events_are_ignored() -> None:
    dec = decoder()
    assert dec.feed(object()) == []
    assert dec.feed(SimpleNamespace(packet=_packet(10))) == []

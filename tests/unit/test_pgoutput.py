"""pgoutput parsing and decoding, on hand-built protocol version 1 messages."""

from __future__ import annotations

import contextlib
import itertools
import struct
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from signals.names import TableId
from snapshotter.core.events import ChangeEvent, Op, SnapshotMarker
from snapshotter.core.position import Position
from snapshotter.core.values import UNAVAILABLE_VALUE, RawJson
from snapshotter.sources.log import Change, Commit, LogItem, Notice, TableShape
from snapshotter.sources.postgres import pgoutput as pgo
from snapshotter.sources.postgres.decoder import PgOutputDecoder, pg_time_to_unix_ms
from snapshotter.sources.postgres.pgoutput import UNCHANGED_TOAST, PgOutputError, parse_message

# -- a pgoutput encoder, the mirror of PostgreSQL's proto.c ----------------------------------


def cstr(text: str) -> bytes:
    return text.encode() + b"\0"


def tuple_data(values: Sequence[pgo.TupleValue]) -> bytes:
    out = [struct.pack(">h", len(values))]
    for value in values:
        if value is None:
            out.append(b"n")
        elif value is UNCHANGED_TOAST:
            out.append(b"u")
        else:
            out.append(b"t" + struct.pack(">i", len(value)) + value)
    return b"".join(out)


def begin(final_lsn: int, ts_us: int, xid: int) -> bytes:
    return b"B" + struct.pack(">QqI", final_lsn, ts_us, xid)


def commit(commit_lsn: int, end_lsn: int, ts_us: int, flags: int = 0) -> bytes:
    return b"C" + struct.pack(">BQQq", flags, commit_lsn, end_lsn, ts_us)


def origin(lsn: int, name: str) -> bytes:
    return b"O" + struct.pack(">Q", lsn) + cstr(name)


def relation(
    oid: int, namespace: str, name: str, identity: str, columns: Sequence[tuple[int, str, int, int]]
) -> bytes:
    out = b"R" + struct.pack(">I", oid) + cstr(namespace) + cstr(name) + identity.encode()
    out += struct.pack(">h", len(columns))
    for flags, column, type_oid, modifier in columns:
        out += bytes([flags]) + cstr(column) + struct.pack(">Ii", type_oid, modifier)
    return out


def type_message(oid: int, namespace: str, name: str) -> bytes:
    return b"Y" + struct.pack(">I", oid) + cstr(namespace) + cstr(name)


def insert(oid: int, new: Sequence[pgo.TupleValue]) -> bytes:
    return b"I" + struct.pack(">I", oid) + b"N" + tuple_data(new)


def update(
    oid: int,
    new: Sequence[pgo.TupleValue],
    old: Sequence[pgo.TupleValue] | None = None,
    kind: str = "O",
) -> bytes:
    out = b"U" + struct.pack(">I", oid)
    if old is not None:
        out += kind.encode() + tuple_data(old)
    return out + b"N" + tuple_data(new)


def delete(oid: int, old: Sequence[pgo.TupleValue], kind: str = "K") -> bytes:
    return b"D" + struct.pack(">I", oid) + kind.encode() + tuple_data(old)


def truncate(oids: Sequence[int], options: int = 0) -> bytes:
    return b"T" + struct.pack(f">IB{len(oids)}I", len(oids), options, *oids)


def logical_message(flags: int, lsn: int, prefix: str, content: bytes) -> bytes:
    return (
        b"M"
        + struct.pack(">BQ", flags, lsn)
        + cstr(prefix)
        + struct.pack(">i", len(content))
        + (content)
    )


# -- parsing ---------------------------------------------------------------------------------

COLUMNS = [(1, "id", 23, -1), (0, "name", 25, -1), (0, "doc", 3802, -1), (0, "body", 25, -1)]

EXAMPLES: list[tuple[bytes, pgo.PgOutputMessage]] = [
    (begin(0x1_0000_0010, 777_000_123, 42), pgo.Begin(0x1_0000_0010, 777_000_123, 42)),
    (commit(0x10, 0x48, -5), pgo.Commit(0, 0x10, 0x48, -5)),
    (origin(0x99, "node-a"), pgo.Origin(0x99, "node-a")),
    (
        relation(16384, "public", "tëst", "d", COLUMNS),
        pgo.Relation(
            16384,
            "public",
            "tëst",
            "d",
            tuple(pgo.RelationColumn(f, n, o, m) for f, n, o, m in COLUMNS),
        ),
    ),
    (relation(7, "", "empty", "n", []), pgo.Relation(7, "", "empty", "n", ())),
    (type_message(90001, "public", "mood"), pgo.Type(90001, "public", "mood")),
    (
        insert(16384, [b"1", None, b"", UNCHANGED_TOAST]),
        pgo.Insert(16384, (b"1", None, b"", UNCHANGED_TOAST)),
    ),
    (update(5, [b"2"]), pgo.Update(5, None, None, (b"2",))),
    (update(5, [b"2"], [b"1"], "K"), pgo.Update(5, (b"1",), "K", (b"2",))),
    (update(5, [b"2", None], [b"1", b"x"], "O"), pgo.Update(5, (b"1", b"x"), "O", (b"2", None))),
    (delete(5, [b"1", None], "K"), pgo.Delete(5, (b"1", None), "K")),
    (delete(5, [b"1", b"x"], "O"), pgo.Delete(5, (b"1", b"x"), "O")),
    (truncate([5, 6, 7], 3), pgo.Truncate(3, (5, 6, 7))),
    (truncate([]), pgo.Truncate(0, ())),
    (logical_message(1, 0x55, "wm", b"\x00\xffhi"), pgo.Message(1, 0x55, "wm", b"\x00\xffhi")),
    (insert(1, []), pgo.Insert(1, ())),
]


@pytest.mark.parametrize(("data", "expected"), EXAMPLES)
def test_every_message_kind_parses(data: bytes, expected: pgo.PgOutputMessage) -> None:
    assert parse_message(data) == expected
    assert parse_message(bytearray(data)) == expected
    assert parse_message(memoryview(data)) == expected


def test_relation_column_key_flag() -> None:
    rel = parse_message(relation(1, "s", "t", "f", COLUMNS))
    assert isinstance(rel, pgo.Relation)
    assert [c.is_key for c in rel.columns] == [True, False, False, False]


def test_unchanged_toast_marker_repr() -> None:
    assert repr(UNCHANGED_TOAST) == "UNCHANGED_TOAST"


@pytest.mark.parametrize(("data", "expected"), EXAMPLES)
def test_every_truncation_is_an_error_naming_type_and_offset(
    data: bytes, expected: pgo.PgOutputMessage
) -> None:
    name = type(expected).__name__
    for cut in range(1, len(data)):
        with pytest.raises(PgOutputError, match=rf"pgoutput {name} message, offset \d+"):
            parse_message(data[:cut])


@pytest.mark.parametrize(("data", "expected"), EXAMPLES)
def test_trailing_bytes_are_an_error(data: bytes, expected: pgo.PgOutputMessage) -> None:
    with pytest.raises(PgOutputError, match=rf"offset {len(data)}: 2 unexpected bytes"):
        parse_message(data + b"\0\0")


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"", "empty pgoutput message"),
        (b"Z123", r"pgoutput type 'Z' message, offset 0: unknown message type"),
        (b"S\0\0\0\1\1", "Stream Start messages are not part of protocol version 1"),
        (b"b" + bytes(20), "Begin Prepare messages are not part of protocol version 1"),
        (
            b"I\0\0\0\1N\0\1b\0\0\0\1x",
            r"Insert message, offset 8: binary column value \('b'\)",
        ),
        (b"I\0\0\0\1N\0\1q", r"Insert message, offset 8: unknown column value kind b'q'"),
        (b"I\0\0\0\1N\xff\xff", "Insert message, offset 6: negative column count -1"),
        (b"I\0\0\0\1X\0\0", r"Insert message, offset 5: expected the new tuple \('N'\)"),
        (
            b"I\0\0\0\1N\0\1t\xff\xff\xff\xff",
            "offset 9: text value of length -1 overruns the message",
        ),
        (b"I\0\0\0\1N\0\1t\0\0\0\5abc", "text value of length 5 overruns the message"),
        (b"U\0\0\0\1K\0\0X\0\0", r"Update message, offset 8: expected the new tuple \('N'\)"),
        (b"D\0\0\0\1N\0\0", r"Delete message, offset 5: expected the old key \('K'\)"),
        (relation(1, "s", "t", "x", []), "Relation message, offset 9: unknown replica identity"),
        (b"Y\0\0\0\1\xff\0t\0", "Type message, offset 5: string is not valid UTF-8"),
        (b"T\0\0\1\0\0\0\0\0\1", "Truncate message, offset 6: 256 relation OIDs overrun"),
        (
            b"M\1" + bytes(8) + b"p\0\0\0\0\x09abc",
            "Message message, offset 12: content of length 9 overruns",
        ),
    ],
)
def test_garbage_is_a_clear_error(data: bytes, problem: str) -> None:
    with pytest.raises(PgOutputError, match=problem):
        parse_message(data)


tuple_values = st.lists(
    st.one_of(st.none(), st.just(UNCHANGED_TOAST), st.binary(max_size=40)), max_size=30
)


@given(tuple_values, st.integers(0, 2**32 - 1))
def test_insert_round_trip(values: list[pgo.TupleValue], oid: int) -> None:
    assert parse_message(insert(oid, values)) == pgo.Insert(oid, tuple(values))


@given(tuple_values, st.none() | tuple_values, st.sampled_from(["K", "O"]))
def test_update_and_delete_round_trip(
    new: list[pgo.TupleValue], old: list[pgo.TupleValue] | None, kind: Literal["K", "O"]
) -> None:
    parsed = parse_message(update(3, new, old, kind))
    if old is None:
        assert parsed == pgo.Update(3, None, None, tuple(new))
    else:
        assert parsed == pgo.Update(3, tuple(old), kind, tuple(new))
        assert parse_message(delete(3, old, kind)) == pgo.Delete(3, tuple(old), kind)


@given(st.binary(max_size=60))
def test_random_bytes_parse_or_raise_pgoutput_error(data: bytes) -> None:
    with contextlib.suppress(PgOutputError):
        parse_message(data)


# -- decoding --------------------------------------------------------------------------------

OID = 16384
TABLE = TableId("public", "t")
LSN = 0x1_6B37_4D48
END = LSN + 0x30
TS_US = 768_000_000_123_456  # 2024-05-02 ~21:20 UTC, as microseconds since 2000-01-01
TS_MS = pg_time_to_unix_ms(TS_US)


def make_decoder(keys: Sequence[str] | None = ("id",)) -> PgOutputDecoder:
    """A decoder whose catalog knows ``keys`` as public.t's primary key, and no other table."""
    return PgOutputDecoder(
        name="srv",
        database="app",
        key_columns=lambda table: keys if table == TABLE else None,
        clock_ms=lambda: 1234,
    )


def open_txn(decoder: PgOutputDecoder, *, lsn: int = LSN, xid: int = 900) -> list[LogItem]:
    items = decoder.feed(begin(lsn, TS_US, xid), lsn - 0x100)
    return items + decoder.feed(relation(OID, "public", "t", "d", COLUMNS), lsn - 0x100)


def events(items: Sequence[LogItem]) -> list[ChangeEvent]:
    return [item.event for item in items if isinstance(item, Change)]


def only_event(items: Sequence[LogItem]) -> ChangeEvent:
    (event,) = events(items)
    return event


def row(id_: int, name: str | None, doc: str | None, body: str | None) -> dict[str, Any]:
    return {
        "id": id_,
        "name": name,
        "doc": None if doc is None else RawJson(doc),
        "body": body,
    }


def test_timestamps_are_unix_milliseconds() -> None:
    assert pg_time_to_unix_ms(0) == 946_684_800_000
    expected = datetime(2024, 5, 2, tzinfo=UTC).timestamp() * 1000
    assert pg_time_to_unix_ms(int((expected - 946_684_800_000) * 1000)) == expected


def test_relation_yields_table_shape() -> None:
    decoder = make_decoder()
    assert decoder.feed(relation(OID, "public", "t", "f", COLUMNS), 1) == [
        TableShape(TABLE, (("id", 23), ("name", 25), ("doc", 3802), ("body", 25)), True, ("id",))
    ]
    shape = decoder.feed(relation(5, "", "pg_thing", "d", []), 1)
    assert shape == [TableShape(TableId("pg_catalog", "pg_thing"), (), False)]


def test_insert_and_commit() -> None:
    decoder = make_decoder()
    assert open_txn(decoder)[0] == TableShape(
        TABLE, (("id", 23), ("name", 25), ("doc", 3802), ("body", 25)), False, ("id",)
    )
    items = decoder.feed(insert(OID, [b"7", "é".encode(), b'{"a": 1.50}', None]), LSN - 0x50)
    event = only_event(items)
    assert event.op is Op.CREATE
    assert event.key == (7,)
    assert event.before is None
    assert event.after == row(7, "é", '{"a": 1.50}', None)
    assert event.ts_ms == 1234
    assert event.source.to_dict() == {
        "version": "snapshotter-0.1",
        "connector": "postgresql",
        "name": "srv",
        "ts_ms": TS_MS,
        "snapshot": "false",
        "db": "app",
        "schema": "public",
        "table": "t",
        "lsn": LSN - 0x50,
        "txId": 900,
        "pos": Position(LSN, 0).token,
    }
    assert event.source.snapshot is SnapshotMarker.FALSE
    assert items[0] == Change(event, 900)
    assert decoder.feed(commit(LSN, END, TS_US + 1000), LSN) == [
        Commit(
            xid=900,
            position=Position(LSN, 1),
            resume={"lsn": END},
            ts_ms=TS_MS + 1,
            log_offset=END,
        )
    ]


def test_empty_transaction_commits_at_seq_zero() -> None:
    decoder = make_decoder()
    decoder.feed(begin(LSN, TS_US, 5), 0)
    (item,) = decoder.feed(commit(LSN, END, TS_US), 0)
    assert isinstance(item, Commit) and item.position == Position(LSN, 0)


def test_update_without_old_tuple() -> None:
    decoder = make_decoder()
    open_txn(decoder)
    event = only_event(decoder.feed(update(OID, [b"7", b"n", b"[]", b"b"]), LSN))
    assert (event.op, event.key, event.before) == (Op.UPDATE, (7,), None)
    assert event.after == row(7, "n", "[]", "b")


def test_update_with_full_old_row_same_key() -> None:
    decoder = make_decoder()
    open_txn(decoder)
    old = [b"7", b"o", b"{}", b"b"]
    event = only_event(decoder.feed(update(OID, [b"7", b"n", b"{}", b"b"], old, "O"), LSN))
    assert event.op is Op.UPDATE
    assert event.before == row(7, "o", "{}", "b")
    assert event.after == row(7, "n", "{}", "b")


def test_primary_key_change_is_delete_then_create() -> None:
    decoder = make_decoder()
    open_txn(decoder)
    decoder.feed(insert(OID, [b"1", b"a", None, None]), LSN)
    items = decoder.feed(update(OID, [b"2", b"a", None, None], [b"1", None, None, None], "K"), LSN)
    deleted, created = events(items)
    assert (deleted.op, deleted.key, deleted.before, deleted.after) == (
        Op.DELETE,
        (1,),
        {"id": 1},  # an old key tuple carries only the identity columns
        None,
    )
    assert (created.op, created.key, created.before) == (Op.CREATE, (2,), None)
    assert created.after == row(2, "a", None, None)
    assert [deleted.position, created.position] == [Position(LSN, 1), Position(LSN, 2)]
    (done,) = decoder.feed(commit(LSN, END, TS_US), LSN)
    assert isinstance(done, Commit) and done.position == Position(LSN, 3)


def test_primary_key_change_with_full_old_row() -> None:
    decoder = make_decoder()
    open_txn(decoder)
    old = [b"1", b"a", None, b"big"]
    deleted, created = events(
        decoder.feed(update(OID, [b"2", b"a", None, UNCHANGED_TOAST], old, "O"), LSN)
    )
    assert deleted.before == row(1, "a", None, "big")
    assert created.after == row(2, "a", None, "big")  # TOAST filled from the old row


def test_unchanged_toast_filled_from_full_old_row() -> None:
    decoder = make_decoder()
    open_txn(decoder)
    old = [b"7", b"o", b'{"k": "v"}', b"x" * 9000]
    new: list[pgo.TupleValue] = [b"7", b"n", UNCHANGED_TOAST, UNCHANGED_TOAST]
    items = decoder.feed(update(OID, new, old, "O"), LSN)
    assert not [i for i in items if isinstance(i, Notice)]
    event = only_event(items)
    assert event.after == row(7, "n", '{"k": "v"}', "x" * 9000)
    assert event.before == row(7, "o", '{"k": "v"}', "x" * 9000)


def test_unchanged_toast_without_old_row_is_unavailable_with_one_notice() -> None:
    decoder = make_decoder()
    open_txn(decoder)
    new = [b"7", b"n", None, UNCHANGED_TOAST]
    first = decoder.feed(update(OID, new), LSN)
    event = only_event(first)
    assert event.after == {"id": 7, "name": "n", "doc": None, "body": UNAVAILABLE_VALUE}
    (notice,) = [i for i in first if isinstance(i, Notice)]
    assert notice.table == TABLE
    assert "body" in notice.message and "REPLICA IDENTITY FULL" in notice.message
    assert notice.details == {"columns": ["body"]}
    again = decoder.feed(update(OID, new), LSN)
    assert [type(i) for i in again] == [Change]  # once per table is enough


def test_unchanged_toast_in_old_row_too_is_unavailable() -> None:
    decoder = make_decoder()
    open_txn(decoder)
    old = [b"7", b"o", None, UNCHANGED_TOAST]
    items = decoder.feed(update(OID, [b"7", b"n", None, UNCHANGED_TOAST], old, "O"), LSN)
    event = only_event(items)
    assert event.after is not None and event.after["body"] == UNAVAILABLE_VALUE
    assert event.before is not None and event.before["body"] == UNAVAILABLE_VALUE
    assert any(isinstance(i, Notice) for i in items)


def test_delete_with_old_key_and_with_old_row() -> None:
    decoder = make_decoder()
    open_txn(decoder)
    by_key = only_event(decoder.feed(delete(OID, [b"3", None, None, None], "K"), LSN))
    assert (by_key.op, by_key.key, by_key.before, by_key.after) == (
        Op.DELETE,
        (3,),
        {"id": 3},
        None,
    )
    full = only_event(decoder.feed(delete(OID, [b"4", b"w", b"1", b"b"], "O"), LSN))
    assert (full.key, full.before) == ((4,), row(4, "w", "1", "b"))
    assert [by_key.position, full.position] == [Position(LSN, 0), Position(LSN, 1)]


def test_truncate_is_one_event_per_relation_in_order() -> None:
    decoder = make_decoder()
    open_txn(decoder)
    decoder.feed(relation(OID + 1, "other", "u", "d", [(1, "k", 20, -1)]), LSN)
    items = decoder.feed(truncate([OID + 1, OID], 1), LSN - 8)
    assert [(e.op, e.table, e.key, e.position) for e in events(items)] == [
        (Op.TRUNCATE, TableId("other", "u"), None, Position(LSN, 0)),
        (Op.TRUNCATE, TABLE, None, Position(LSN, 1)),
    ]


def test_messages_without_items() -> None:
    decoder = make_decoder()
    open_txn(decoder)
    assert decoder.feed(origin(1, "o"), LSN) == []
    assert decoder.feed(type_message(9, "public", "mood"), LSN) == []
    assert decoder.feed(logical_message(1, LSN, "p", b"x"), LSN) == []


def test_key_falls_back_to_identity_columns_then_whole_row() -> None:
    decoder = make_decoder(keys=None)
    open_txn(decoder)
    assert only_event(decoder.feed(insert(OID, [b"5", b"a", None, None]), LSN)).key == (5,)
    decoder.feed(relation(OID, "public", "t", "d", [(0, "a", 23, -1), (0, "b", 25, -1)]), LSN)
    # A table without any identity: the whole row, NULLs included, is the key.
    whole_row: tuple[object, ...] | None = only_event(
        decoder.feed(insert(OID, [b"5", None]), LSN)
    ).key
    assert whole_row == (5, None)


def test_catalog_key_beats_identity_flags() -> None:
    decoder = make_decoder(keys=("name", "id"))
    open_txn(decoder)
    assert only_event(decoder.feed(insert(OID, [b"5", b"a", None, None]), LSN)).key == ("a", 5)


def test_relation_replaced_with_new_columns() -> None:
    decoder = make_decoder()
    open_txn(decoder)
    shape = decoder.feed(
        relation(OID, "public", "t", "f", [(1, "id", 23, -1), (0, "v", 16, -1)]), 0
    )
    assert shape == [TableShape(TABLE, (("id", 23), ("v", 16)), True, ("id",))]
    assert only_event(decoder.feed(insert(OID, [b"1", b"t"]), LSN)).after == {"id": 1, "v": True}


def test_positions_strictly_increase_across_transactions() -> None:
    decoder = make_decoder()
    positions: list[Position] = []
    for n, lsn in enumerate([LSN, LSN + 0x100, LSN + 0x200]):
        open_txn(decoder, lsn=lsn, xid=900 + n)
        feed = [
            insert(OID, [b"1", None, None, None]),
            update(OID, [b"2", None, None, None], [b"1", None, None, None], "K"),
            update(OID, [b"2", b"x", None, UNCHANGED_TOAST]),
            delete(OID, [b"2", None, None, None]),
            truncate([OID]),
            commit(lsn, lsn + 8, TS_US),
        ]
        for data in feed:
            for item in decoder.feed(data, lsn - 1):
                if isinstance(item, Change):
                    positions.append(item.event.position)
                elif isinstance(item, Commit):
                    positions.append(item.position)
    assert len(positions) == 3 * 7
    assert all(a < b for a, b in itertools.pairwise(positions))


@pytest.mark.parametrize(
    ("feed", "problem"),
    [
        (
            [insert(OID, [b"1", None, None, None])],
            "Insert for relation 16384 outside a transaction",
        ),
        ([begin(LSN, 0, 1), begin(LSN + 1, 0, 2)], "Begin of transaction 2 while transaction 1"),
        ([commit(LSN, END, 0)], "Commit at LSN 0x16b374d48 outside a transaction"),
        ([begin(LSN, 0, 1), commit(LSN + 1, END, 0)], "does not match its Begin"),
        ([begin(LSN, 0, 1), insert(99, [])], "relation 99, which no Relation message described"),
        ([begin(LSN, 0, 1), truncate([99])], "Truncate for relation 99"),
    ],
)
def test_protocol_order_errors(feed: list[bytes], problem: str) -> None:
    decoder = make_decoder()
    with pytest.raises(PgOutputError, match=problem):
        for data in feed:
            decoder.feed(data, 0)


def test_tuple_width_must_match_relation() -> None:
    decoder = make_decoder()
    open_txn(decoder)
    with pytest.raises(PgOutputError, match="tuple of 2 columns, but its Relation message"):
        decoder.feed(insert(OID, [b"1", None]), LSN)


def test_unloadable_value_is_kept_as_text_with_a_notice() -> None:
    # e.g. a timestamp of 'infinity': outside Python's range. The stream must go on.
    decoder = make_decoder()
    open_txn(decoder)
    items = decoder.feed(insert(OID, [b"one", None, None, None]), LSN)
    change, notice = items
    assert isinstance(change, Change) and change.event.after is not None
    assert change.event.after["id"] == "one"
    assert isinstance(notice, Notice)
    assert "column 'id' (type OID 23)" in notice.message and "as text" in notice.message
    again = decoder.feed(insert(OID, [b"two", None, None, None]), LSN + 1)
    assert len(again) == 1  # one notice per table and column


def test_key_column_missing_from_relation() -> None:
    decoder = make_decoder(keys=("nope",))
    with pytest.raises(PgOutputError, match=r"key columns \['nope'\] are not among"):
        decoder.feed(relation(OID, "public", "t", "d", COLUMNS), 0)


def test_old_key_without_the_primary_key_is_an_error() -> None:
    decoder = make_decoder(keys=("name",))  # the identity (flagged "id") lacks "name"
    open_txn(decoder)
    with pytest.raises(PgOutputError, match=r"old key lacks key columns \['name'\]"):
        decoder.feed(delete(OID, [b"1", None, None, None], "K"), LSN)


def test_broken_message_passes_parse_error_through() -> None:
    with pytest.raises(PgOutputError, match="Insert message"):
        make_decoder().feed(b"I\0", 0)

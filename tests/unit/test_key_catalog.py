"""The key catalog (``snapshotter.engine.key_catalog``) alone: the decoder's key (the primary
key, described once), the paging key windows compare, the surrogate key a table without a
primary key is keyed by (before and after a restart), and the key names a sink writes."""

from __future__ import annotations

import pyarrow as pa

from signals.names import TableId
from snapshotter.core.events import ChangeEvent, Op, Source
from snapshotter.core.position import Position
from snapshotter.core.state import TableProgress
from snapshotter.engine.key_catalog import KeyCatalog
from snapshotter.sources.base import ColumnInfo, TableSchema
from snapshotter.sources.log import TableShape

SIGNALS = TableId("s", "debezium_signal")
KEYED = TableId("s", "keyed")
BARE = TableId("s", "bare")  # no primary key


def schema(table: TableId, primary_key: tuple[str, ...]) -> TableSchema:
    columns = tuple(ColumnInfo(n, "bigint", 20, False, pa.int64()) for n in ("id", "code", "v"))
    return TableSchema(table, columns, primary_key)


class Describe:
    def __init__(self) -> None:
        self.calls: list[TableId] = []
        self.down = False

    def __call__(self, table: TableId) -> TableSchema:
        self.calls.append(table)
        if self.down:
            raise ConnectionError("down")
        return schema(table, ("id",) if table == KEYED else ())


def catalog() -> tuple[KeyCatalog, Describe]:
    describe = Describe()
    return KeyCatalog(describe, SIGNALS), describe


def event(table: TableId, op: Op = Op.UPDATE, key: tuple[int, ...] | None = (1,)) -> ChangeEvent:
    source = Source("postgresql", "test", "db", table, Position(1), 0)
    if op is Op.TRUNCATE:
        return ChangeEvent(op, source, 0, None)
    before = {"id": 1, "code": 6, "v": 1}
    after = None if op is Op.DELETE else {"id": 1, "code": 7, "v": 2}
    return ChangeEvent(op, source, 0, key, before=before, after=after)


def test_the_decoders_key_is_the_primary_key_described_once() -> None:
    keys, describe = catalog()
    assert keys.primary_key(KEYED) == ("id",)
    assert keys.primary_key(KEYED) == ("id",)
    assert describe.calls == [KEYED]
    assert keys.primary_key(BARE) is None  # the decoder falls back to the identity columns
    assert keys.primary_key(SIGNALS) == ("id",)  # never described


def test_a_failed_describe_is_asked_again() -> None:
    keys, describe = catalog()
    describe.down = True
    assert keys.primary_key(KEYED) is None
    describe.down = False
    assert keys.primary_key(KEYED) == ("id",)
    assert describe.calls == [KEYED, KEYED]


def test_a_surrogate_key_keys_the_tables_events_once_its_snapshot_started() -> None:
    keys, _ = catalog()
    assert keys.key_names(BARE) == ()
    keys.table_started(BARE, schema(BARE, ()), ("code",))
    assert keys.key_names(BARE) == ("code",)
    assert keys.paging_key(BARE) == ("code",)
    rekeyed = keys.rekeyed(event(BARE))
    assert rekeyed.key == (7,)  # of the after row
    assert keys.rekeyed(event(BARE, Op.DELETE)).key == (6,)  # of the before row
    truncate = event(BARE, Op.TRUNCATE)
    assert keys.rekeyed(truncate) is truncate


def test_a_table_with_a_primary_key_is_not_rekeyed_by_its_paging_key() -> None:
    keys, _ = catalog()
    keys.table_started(KEYED, schema(KEYED, ("id",)), ("code",))  # paged by code
    original = event(KEYED)
    assert keys.rekeyed(original) is original
    assert keys.paging_key(KEYED) == ("code",)
    assert keys.key_names(KEYED) == ("id",)


def test_surrogate_keys_survive_a_restart_through_state_unless_the_snapshot_failed() -> None:
    done = TableProgress(table=BARE, signal_id="a", surrogate_key="code", key_columns=["code"])
    failed = TableProgress(
        table=TableId("s", "other"), signal_id="b", surrogate_key="code", key_columns=["code"]
    )
    failed.fail("boom")
    keys, _ = catalog()
    keys.remember_surrogates([done, failed])
    assert keys.key_names(BARE) == ("code",)
    assert keys.rekeyed(event(BARE)).key == (7,)
    assert keys.paging_key(TableId("s", "other")) is None


def test_the_paging_key_of_an_unfinished_snapshot_comes_from_state() -> None:
    keys, _ = catalog()
    resumed = TableProgress(table=KEYED, signal_id="a", key_columns=["code"])
    resumed.start((100,))
    waiting = TableProgress(table=BARE, signal_id="b", surrogate_key="v")  # not described yet
    keys.refresh_unfinished([resumed, waiting])
    assert keys.paging_key(KEYED) == ("code",)
    assert keys.paging_key(BARE) == ("v",)
    resumed.stop()
    keys.refresh_unfinished([resumed, waiting])
    assert keys.paging_key(KEYED) is None  # the primary key: the decoder's event key


def test_window_keys_compare_by_the_paging_key_of_both_rows() -> None:
    keys, _ = catalog()
    assert keys.window_keys(event(KEYED, key=(1,))) == [(1,)]  # no paging key: the event key
    keys.table_started(KEYED, schema(KEYED, ("id",)), ("code",))
    assert keys.window_keys(event(KEYED)) == [(6,), (7,)]  # before, after
    assert keys.window_keys(event(KEYED, Op.TRUNCATE)) == []


def test_the_logs_key_is_what_a_sink_names_until_a_surrogate_replaces_it() -> None:
    keys, _ = catalog()
    shape = TableShape(BARE, (("id", 20), ("code", 20), ("v", 20)), True, key=("id", "code", "v"))
    assert keys.shape_seen(shape) is None
    assert keys.key_names(BARE) == ("id", "code", "v")  # the identity the decoder keyed by
    changed = TableShape(BARE, (("id", 20), ("code", 20)), True, key=("id", "code"))
    assert keys.shape_seen(changed) is shape
    keys.table_started(BARE, schema(BARE, ()), ("code",))
    assert keys.key_names(BARE) == ("code",)

"""BinlogLogReader end to end on a real server: what it streams (captured tables only, new
tables, TRUNCATE, ALTER), positions across binlog rotation, reconnects (a killed dump
connection, a failing stream, a server restart) delivering every change exactly once,
restarting from a saved commit, and the error for a purged binlog.

Every test waits with a deadline for what it expects, never a fixed sleep. Tests share the
server with others: each reader has its own replication server id, tests only kill their
own reader's dump thread, and nothing purges binlogs.
"""

from __future__ import annotations

import itertools
import os
import random
import re
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pymysql
import pytest
import sqlalchemy as sa

from signals.names import TableId
from snapshotter.core.events import ChangeEvent, Op
from snapshotter.core.position import Position
from snapshotter.sources.log import Change, Commit, LogItem, Notice, Progress, TableShape
from snapshotter.sources.mysql import reader as binlog_reader
from snapshotter.sources.mysql.decoder import BinlogDecoder
from snapshotter.sources.mysql.dialect import MySqlDialect
from snapshotter.sources.mysql.positions import binlog_file_number
from snapshotter.sources.mysql.reader import BinlogLogReader, BinlogReaderError

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
UTF8 = "DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci"
TIMEOUT = 20.0


# -- helpers -----------------------------------------------------------------------------------


def run(engine: sa.Engine, database: str, *statements: str) -> None:
    """Statements as written, in one transaction, in ``database``."""
    with engine.begin() as conn:
        conn.exec_driver_sql(f"USE `{database}`")
        for statement in statements:
            conn.exec_driver_sql(statement, execution_options={"no_parameters": True})


def insert_ids(engine: sa.Engine, database: str, table: str, ids: Sequence[int]) -> None:
    """One transaction inserting ``ids`` (values ``v<id>``)."""
    values = ", ".join(f"({i}, 'v{i}')" for i in ids)
    run(engine, database, f"INSERT INTO `{table}` (id, v) VALUES {values}")


def new_server_id() -> int:
    # Distinct per reader: the server drops an older dump of the same server id.
    return random.SystemRandom().randrange(100_000, 2**31 - 1)


class Tap:
    """A reader and everything it handed over so far."""

    def __init__(self, reader: BinlogLogReader) -> None:
        self.reader = reader
        self.items: list[LogItem] = []

    def until(self, done: Callable[[Tap], bool], timeout: float = TIMEOUT) -> Tap:
        deadline = time.monotonic() + timeout
        while not done(self):
            left = deadline - time.monotonic()
            assert left > 0, f"timed out; the reader handed over: {self.items[-30:]}"
            self.items.extend(self.reader.read(min(0.5, left)))
        return self

    def changes(self, table: str | None = None) -> list[ChangeEvent]:
        return [
            i.event
            for i in self.items
            if isinstance(i, Change) and (table is None or i.event.table.table == table)
        ]

    def ids(self, table: str) -> list[int]:
        out = []
        for event in self.changes(table):
            row = event.after if event.after is not None else event.before
            if row is not None:
                out.append(row["id"])
        return out

    def has_id(self, table: str, wanted: int) -> Callable[[Tap], bool]:
        return lambda tap: wanted in tap.ids(table)

    @property
    def commits(self) -> list[Commit]:
        return [i for i in self.items if isinstance(i, Commit)]

    def shapes(self, table: str) -> list[TableShape]:
        return [i for i in self.items if isinstance(i, TableShape) and i.table.table == table]


def positions(items: Sequence[LogItem]) -> list[Position]:
    out = []
    for item in items:
        if isinstance(item, Change):
            out.append(item.event.position)
        elif isinstance(item, Commit):
            out.append(item.position)
    return out


def assert_strictly_increasing(items: Sequence[LogItem]) -> None:
    seen = positions(items)
    bad = [(a, b) for a, b in itertools.pairwise(seen) if not a < b]
    assert not bad, f"positions not strictly increasing (duplicates?): {bad[:5]}"


@pytest.fixture
def dialect(mysql_url: str, mysql_db: str) -> Iterator[MySqlDialect]:
    url = sa.make_url(mysql_url).set(database=mysql_db)
    out = MySqlDialect(url, TableId(None, "debezium_signal"))
    yield out
    out.close()


@pytest.fixture
def open_tap(dialect: MySqlDialect, mysql_db: str) -> Iterator[Callable[..., Tap]]:
    """Start a reader (closed after the test): by default from the binlog's current end,
    capturing the tables of this test's database, keyed by their primary keys."""
    readers: list[BinlogLogReader] = []

    def open_(
        start: Mapping[str, Any] | None = None,
        captured: Callable[[TableId], bool] | None = None,
        reconnect_for: float = 60.0,
    ) -> Tap:
        def keys(table: TableId) -> Sequence[str] | None:
            try:
                return dialect.describe(table).primary_key or None
            except Exception:
                return None

        decoder = BinlogDecoder(
            "test",
            captured=captured or (lambda t: t.schema == mysql_db),
            key_columns=keys,
        )
        reader = BinlogLogReader(
            dialect.connect_args(),
            server_id=new_server_id(),
            decoder=decoder,
            start=dict(start) if start is not None else dialect.binlog_start(),
            reconnect_for=reconnect_for,
        )
        readers.append(reader)
        return Tap(reader)

    yield open_
    for reader in readers:
        reader.close()


@pytest.fixture
def table_t(mysql_engine: sa.Engine, mysql_db: str) -> str:
    run(
        mysql_engine,
        mysql_db,
        f"CREATE TABLE t (id int NOT NULL PRIMARY KEY, v varchar(20)) {UTF8}",
    )
    return "t"


def server_gtid_prefix(engine: sa.Engine) -> str:
    with engine.connect() as conn:
        domain, server_id = conn.exec_driver_sql("SELECT @@gtid_domain_id, @@server_id").one()
    return f"{domain}-{server_id}-"


# -- what is streamed --------------------------------------------------------------------------


def test_streams_captured_tables_only_with_gtids_and_commits(
    open_tap: Callable[..., Tap], mysql_engine: sa.Engine, mysql_db: str, table_t: str
) -> None:
    run(
        mysql_engine,
        mysql_db,
        f"CREATE TABLE u (id int NOT NULL PRIMARY KEY, v varchar(20)) {UTF8}",
    )
    tap = open_tap(captured=lambda t: t == TableId(mysql_db, "t"))
    insert_ids(mysql_engine, mysql_db, "u", [1, 2])
    insert_ids(mysql_engine, mysql_db, "t", [1, 2, 3])
    run(
        mysql_engine,
        mysql_db,
        "UPDATE t SET v = 'changed' WHERE id = 2",
        "UPDATE u SET v = 'changed'",
        "DELETE FROM t WHERE id = 3",
    )
    insert_ids(mysql_engine, mysql_db, "u", [3])
    insert_ids(mysql_engine, mysql_db, "t", [99])  # the marker: everything before it was read
    tap.until(tap.has_id("t", 99))

    assert {e.table for e in tap.changes()} == {TableId(mysql_db, "t")}
    assert [(e.op, e.key) for e in tap.changes()] == [
        (Op.CREATE, (1,)),
        (Op.CREATE, (2,)),
        (Op.CREATE, (3,)),
        (Op.UPDATE, (2,)),
        (Op.DELETE, (3,)),
        (Op.CREATE, (99,)),
    ]
    update = tap.changes()[3]
    assert update.before == {"id": 2, "v": "v2"} and update.after == {"id": 2, "v": "changed"}
    assert tap.shapes("t") == [
        TableShape(TableId(mysql_db, "t"), (("id", 3), ("v", 15)), True, ("id",))
    ]
    assert not tap.shapes("u")
    assert_strictly_increasing(tap.items)

    # GTIDs look like MariaDB's domain-server-sequence and grow by transaction.
    prefix = server_gtid_prefix(mysql_engine)
    gtids = [e.source.details["gtid"] for e in tap.changes()]
    assert all(re.fullmatch(re.escape(prefix) + r"\d+", g) for g in gtids), gtids
    sequences = [int(g.rsplit("-", 1)[1]) for g in gtids]
    assert sequences[0] == sequences[1] == sequences[2] < sequences[3] == sequences[4]
    assert sequences[4] < sequences[5]
    # Each transaction with changes of t ends in a commit whose resume names its GTID.
    for event in tap.changes():
        after = [c for c in tap.commits if c.position > event.position]
        assert after and after[0].resume["gtid"] == event.source.details["gtid"]
        assert after[0].resume["file"] == event.source.details["file"]
    assert all(c.xid == 0 for c in tap.items if isinstance(c, Change))


def test_a_table_created_after_start_streams_without_restart(
    open_tap: Callable[..., Tap], mysql_engine: sa.Engine, mysql_db: str
) -> None:
    tap = open_tap()  # captures every table of the database, existing or not
    run(mysql_engine, mysql_db, f"CREATE TABLE late (id int NOT NULL PRIMARY KEY, v text) {UTF8}")
    insert_ids(mysql_engine, mysql_db, "late", [1, 2])
    run(mysql_engine, mysql_db, "UPDATE late SET v = 'x' WHERE id = 1")
    tap.until(lambda tap: len(tap.changes("late")) == 3)
    assert [(e.op, e.key) for e in tap.changes("late")] == [
        (Op.CREATE, (1,)),
        (Op.CREATE, (2,)),
        (Op.UPDATE, (1,)),
    ]
    assert len(tap.shapes("late")) == 1
    assert [name for name, _ in tap.shapes("late")[0].columns] == ["id", "v"]


def test_rotation_mid_stream_keeps_positions_increasing_and_loses_nothing(
    open_tap: Callable[..., Tap], mysql_engine: sa.Engine, mysql_db: str, table_t: str
) -> None:
    tap = open_tap()
    for first in range(1, 21, 5):
        insert_ids(mysql_engine, mysql_db, "t", range(first, first + 5))
    with mysql_engine.connect() as conn:
        conn.exec_driver_sql("FLUSH BINARY LOGS")
    for first in range(21, 41, 5):
        insert_ids(mysql_engine, mysql_db, "t", range(first, first + 5))
    tap.until(tap.has_id("t", 40))
    assert tap.ids("t") == list(range(1, 41))
    assert_strictly_increasing(tap.items)
    files = [e.source.details["file"] for e in tap.changes("t")]
    numbers = [binlog_file_number(f) for f in files]
    assert numbers == sorted(numbers)
    assert numbers[20] > numbers[19]  # the rotation came between the two halves
    assert [e.position.parts[0] for e in tap.changes("t")] == numbers
    # Resume points follow the file they are in.
    last = tap.commits[-1]
    assert last.resume["file"] == files[-1]
    assert last.log_offset >> 32 == numbers[-1]


def test_truncate_is_a_t_event(
    open_tap: Callable[..., Tap], mysql_engine: sa.Engine, mysql_db: str, table_t: str
) -> None:
    tap = open_tap()
    insert_ids(mysql_engine, mysql_db, "t", [1, 2])
    run(mysql_engine, mysql_db, "TRUNCATE TABLE t")
    insert_ids(mysql_engine, mysql_db, "t", [3])
    tap.until(tap.has_id("t", 3))
    events = tap.changes("t")
    assert [e.op for e in events] == [Op.CREATE, Op.CREATE, Op.TRUNCATE, Op.CREATE]
    truncate = events[2]
    assert truncate.table == TableId(mysql_db, "t") and truncate.key is None
    commit = next(c for c in tap.commits if c.position > truncate.position)
    assert commit.position == Position(*truncate.position.parts[:2], 1)
    assert_strictly_increasing(tap.items)


def test_truncate_with_a_leading_comment_is_a_t_event(
    open_tap: Callable[..., Tap], mysql_engine: sa.Engine, mysql_db: str, table_t: str
) -> None:
    tap = open_tap()
    insert_ids(mysql_engine, mysql_db, "t", [1])
    run(mysql_engine, mysql_db, "/* app: cleanup */ TRUNCATE TABLE t")
    insert_ids(mysql_engine, mysql_db, "t", [2])
    tap.until(tap.has_id("t", 2))
    assert [e.op for e in tap.changes("t")] == [Op.CREATE, Op.TRUNCATE, Op.CREATE]


def test_alter_table_add_column_announces_the_new_shape(
    open_tap: Callable[..., Tap], mysql_engine: sa.Engine, mysql_db: str, table_t: str
) -> None:
    tap = open_tap()
    insert_ids(mysql_engine, mysql_db, "t", [1])
    run(mysql_engine, mysql_db, "ALTER TABLE t ADD COLUMN extra int NULL DEFAULT 7")
    run(mysql_engine, mysql_db, "INSERT INTO t (id, v, extra) VALUES (2, 'v2', 8)")
    run(mysql_engine, mysql_db, "UPDATE t SET v = 'x' WHERE id = 1")
    tap.until(lambda tap: len(tap.changes("t")) == 3)
    shapes = tap.shapes("t")
    assert [[n for n, _ in s.columns] for s in shapes] == [["id", "v"], ["id", "v", "extra"]]
    notices = [i for i in tap.items if isinstance(i, Notice)]
    assert len(notices) == 1 and notices[0].table == TableId(mysql_db, "t")
    assert "ADD COLUMN extra" in notices[0].message
    # Item order: old shape, insert, notice, new shape, insert, update.
    kinds = [type(i).__name__ for i in tap.items if not isinstance(i, Commit | Progress)]
    assert kinds == ["TableShape", "Change", "Notice", "TableShape", "Change", "Change"]
    second, update = tap.changes("t")[1:]
    assert second.after == {"id": 2, "v": "v2", "extra": 8}
    assert update.before == {"id": 1, "v": "v1", "extra": 7}
    assert_strictly_increasing(tap.items)


# -- restarts and reconnects -------------------------------------------------------------------


def test_resume_from_a_saved_commit_replays_nothing_before_it(
    open_tap: Callable[..., Tap], mysql_engine: sa.Engine, mysql_db: str, table_t: str
) -> None:
    first = open_tap()
    insert_ids(mysql_engine, mysql_db, "t", [1, 2, 3])
    insert_ids(mysql_engine, mysql_db, "t", [4, 5, 6])
    insert_ids(mysql_engine, mysql_db, "t", [7, 8, 9])
    first.until(first.has_id("t", 9))
    after_a = next(c for c in first.commits if c.position > first.changes("t")[2].position)
    assert after_a.position < first.changes("t")[3].position
    first.reader.close()

    again = open_tap(start=after_a.resume)
    again.until(again.has_id("t", 9))
    assert again.ids("t") == [4, 5, 6, 7, 8, 9]
    # The table map is read again: the first item for t is its shape, then B decodes.
    assert isinstance(again.items[0], TableShape | Progress)
    assert again.shapes("t") and again.items.index(again.shapes("t")[0]) < again.items.index(
        next(i for i in again.items if isinstance(i, Change))
    )
    # Positions are those of the first reading.
    assert [e.position for e in again.changes("t")] == [e.position for e in first.changes("t")[3:]]
    assert [dict(e.after) for e in again.changes("t")] == [
        dict(e.after) for e in first.changes("t")[3:]
    ]


@pytest.mark.parametrize("which", ["purged", "nonexistent"])
def test_a_resume_point_in_a_missing_binlog_file_raises_with_the_fix(
    which: str, open_tap: Callable[..., Tap], dialect: MySqlDialect, mysql_engine: sa.Engine
) -> None:
    with mysql_engine.connect() as conn:
        logs = [str(r[0]) for r in conn.exec_driver_sql("SHOW BINARY LOGS")]
    base, _, _ = logs[0].rpartition(".")
    oldest = binlog_file_number(logs[0])
    assert oldest >= 1
    number = oldest - 1 if which == "purged" else binlog_file_number(logs[-1]) + 1000
    missing = f"{base}.{number:06d}"
    assert missing not in logs
    tap = open_tap(start={"file": missing, "pos": 4})
    deadline = time.monotonic() + TIMEOUT
    with pytest.raises(BinlogReaderError) as raised:
        while time.monotonic() < deadline:
            tap.items.extend(tap.reader.read(0.5))
    message = str(raised.value)
    assert missing in message
    assert "purged" in message and "expire" in message
    assert "fresh state" in message and "snapshot the tables again" in message
    # The failure sticks: the next read raises it again.
    with pytest.raises(BinlogReaderError):
        tap.reader.read(0.1)


def test_no_start_point_is_refused(dialect: MySqlDialect) -> None:
    decoder = BinlogDecoder("test", captured=lambda t: True, key_columns=lambda t: None)
    with pytest.raises(BinlogReaderError, match="no binlog start point"):
        BinlogLogReader(dialect.connect_args(), server_id=1234567, decoder=decoder, start={})


def dump_thread_of(tap: Tap, engine: sa.Engine, not_id: int | None = None) -> int:
    """The server thread of the reader's binlog dump (waits for it to connect). MariaDB's
    PROCESSLIST does not show a replica's server id: the dump connection's own thread id,
    checked to be a 'Binlog Dump' command, identifies it."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        stream = tap.reader._stream
        conn = getattr(stream, "_stream_connection", None) if stream is not None else None
        if conn is not None and conn.open:
            thread = conn.thread_id()
            with engine.connect() as db:
                command = db.exec_driver_sql(
                    f"SELECT COMMAND FROM information_schema.PROCESSLIST WHERE ID = {int(thread)}"
                ).scalar()
            if command == "Binlog Dump" and thread != not_id:
                return int(thread)
        assert time.monotonic() < deadline, "the reader's binlog dump thread did not show up"
        tap.items.extend(tap.reader.read(0.2))


def kill(engine: sa.Engine, thread: int) -> None:
    with engine.connect() as conn:
        conn.exec_driver_sql(f"KILL {int(thread)}")


def test_a_killed_dump_connection_reconnects_and_delivers_exactly_once(
    open_tap: Callable[..., Tap], mysql_engine: sa.Engine, mysql_db: str, table_t: str
) -> None:
    tap = open_tap()
    for first in range(1, 31, 10):
        insert_ids(mysql_engine, mysql_db, "t", range(first, first + 10))
    tap.until(tap.has_id("t", 30))
    killed = dump_thread_of(tap, mysql_engine)
    kill(mysql_engine, killed)
    for first in range(31, 61, 10):
        insert_ids(mysql_engine, mysql_db, "t", range(first, first + 10))
    tap.until(tap.has_id("t", 60))
    assert tap.ids("t") == list(range(1, 61))
    assert_strictly_increasing(tap.items)
    # A new dump connection serves the reader.
    assert dump_thread_of(tap, mysql_engine, not_id=killed) != killed
    insert_ids(mysql_engine, mysql_db, "t", [61])
    tap.until(tap.has_id("t", 61))
    assert tap.ids("t") == list(range(1, 62))


def test_a_dump_killed_inside_a_large_transaction_delivers_exactly_once(
    open_tap: Callable[..., Tap],
    mysql_engine: sa.Engine,
    mysql_db: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Small batches and a short queue: the reader stops reading the socket a few rows into
    # a ~16 MB transaction, more than the socket buffers hold, so the server is still
    # sending it when its dump is killed; the stream goes on from inside the transaction.
    monkeypatch.setattr(binlog_reader, "_BATCH", 5)
    monkeypatch.setattr(binlog_reader, "_QUEUE_BATCHES", 2)
    rows, pad = 8000, "x" * 1000
    run(
        mysql_engine,
        mysql_db,
        f"CREATE TABLE big (id int NOT NULL PRIMARY KEY, pad text NOT NULL) {UTF8}",
        f"INSERT INTO big SELECT seq, '{pad}' FROM seq_1_to_{rows}",
    )
    tap = open_tap()
    killed = dump_thread_of(tap, mysql_engine)
    run(mysql_engine, mysql_db, "UPDATE big SET pad = CONCAT(pad, id)")  # one transaction
    deadline = time.monotonic() + TIMEOUT
    decoder = tap.reader._decoder
    # Until the reader is inside the transaction and blocked on the full queue.
    while not (decoder.in_transaction and tap.reader._queue.full()):
        assert time.monotonic() < deadline, "the reader never blocked inside the transaction"
        if not decoder.in_transaction:
            tap.items.extend(tap.reader.read(0.05))  # heartbeats' progress before it
        else:
            time.sleep(0.05)
    kill(mysql_engine, killed)
    tap.until(lambda tap: len(tap.changes("big")) >= rows, timeout=60)
    updates = tap.changes("big")
    assert all(e.op is Op.UPDATE for e in updates)
    assert [e.key[0] for e in updates] == list(range(1, rows + 1))
    assert all(e.after["pad"] == pad + str(e.key[0]) for e in updates)
    assert_strictly_increasing(tap.items)
    assert dump_thread_of(tap, mysql_engine, not_id=killed) != killed


class _FailOnce:
    """Makes the reader's stream raise a lost connection once, at the given rows event."""

    def __init__(self, schema: str, at_rows_event: int) -> None:
        self.schema = schema
        self.at = at_rows_event
        self.rows_events = 0
        self.streams = 0
        self.failed = False

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        plan = self
        real = binlog_reader.BinLogStreamReader

        class Flaky(real):  # type: ignore[misc, valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                plan.streams += 1

            def fetchone(self) -> Any:
                event = super().fetchone()
                if isinstance(event, binlog_reader.WriteRowsEvent) and event.schema == plan.schema:
                    plan.rows_events += 1
                    if plan.rows_events == plan.at and not plan.failed:
                        plan.failed = True
                        raise pymysql.err.OperationalError(2013, "injected: connection lost")
                return event

        monkeypatch.setattr(binlog_reader, "BinLogStreamReader", Flaky)


def test_a_lost_stream_reconnects_from_the_last_boundary_and_skips_what_was_queued(
    open_tap: Callable[..., Tap],
    mysql_engine: sa.Engine,
    mysql_db: str,
    table_t: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Batches of 3 items: part of the big transaction is handed over before the failure,
    # so the reconnect (from the commit before it) reads it again and must skip that part.
    monkeypatch.setattr(binlog_reader, "_BATCH", 3)
    plan = _FailOnce(mysql_db, at_rows_event=8)
    plan.install(monkeypatch)
    tap = open_tap()
    insert_ids(mysql_engine, mysql_db, "t", [1, 2])
    with mysql_engine.begin() as conn:  # one transaction of 12 rows events
        conn.exec_driver_sql(f"USE `{mysql_db}`")
        for first in range(10, 130, 10):
            conn.exec_driver_sql(
                "INSERT INTO t (id, v) VALUES "
                + ", ".join(f"({i}, 'v{i}')" for i in range(first, first + 10))
            )
    insert_ids(mysql_engine, mysql_db, "t", [500])
    tap.until(tap.has_id("t", 500), timeout=30)
    assert plan.failed and plan.streams == 2
    assert tap.ids("t") == [1, 2, *range(10, 130), 500]
    assert_strictly_increasing(tap.items)
    assert len(tap.shapes("t")) == 1  # not announced again after the reconnect


# -- a server restart --------------------------------------------------------------------------


def _services(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    # Without SNAPSHOTTER_MYSQL_URL: with it, the launcher would leave the server alone. The
    # port and directory settings stay, so it speaks of the server the URL names (checked).
    env = {k: v for k, v in os.environ.items() if k != "SNAPSHOTTER_MYSQL_URL"}
    return subprocess.run(
        [str(REPO / "scripts" / "services"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )


def _we_started_the_server(url: str) -> str | None:
    """None when scripts/services started the server ``url`` names (so it may restart it),
    else why not."""
    own = _services("url", "mysql", timeout=60).stdout.strip().splitlines()
    if not own or sa.make_url(own[-1]) != sa.make_url(url):
        return f"the tests use {url}, not the server scripts/services runs: never restart it"
    status = _services("status", "mysql", timeout=60)
    said = (status.stdout + status.stderr).strip()
    if "started by this script" not in said or "not started by this script" in said:
        return f"the server was not started by scripts/services ({said!r}): never restart it"
    return None


def test_a_server_restart_reconnects_and_delivers_everything(
    open_tap: Callable[..., Tap],
    mysql_engine: sa.Engine,
    mysql_db: str,
    table_t: str,
    mysql_url: str,
) -> None:
    """Restarts MariaDB (``scripts/services down mysql`` + ``up mysql``) while a reader
    streams. Only a server that scripts/services started may be restarted (never a server
    someone else runs): outside CI the test skips otherwise, in CI (where scripts/test starts
    it) that is a failure."""
    why_not = _we_started_the_server(mysql_url)
    if why_not is not None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(why_not + " (CI=true: integration tests never skip)", pytrace=False)
        pytest.skip(why_not)
    tap = open_tap(reconnect_for=240.0)
    insert_ids(mysql_engine, mysql_db, "t", [1, 2, 3])
    tap.until(tap.has_id("t", 3))
    try:
        down = _services("down", "mysql")
        assert down.returncode == 0, down.stderr
    finally:
        up = _services("up", "mysql")
    assert up.returncode == 0, up.stderr
    mysql_engine.dispose()  # pooled connections died with the server
    insert_ids(mysql_engine, mysql_db, "t", [4, 5, 6])
    tap.until(tap.has_id("t", 6), timeout=240)
    assert tap.ids("t") == [1, 2, 3, 4, 5, 6]
    assert_strictly_increasing(tap.items)

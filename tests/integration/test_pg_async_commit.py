"""PostgreSQL with ``synchronous_commit = off`` (issue 26), in a database of the test's own
with that default (``ALTER DATABASE``; the server's settings are left alone):

* ``run --until-caught-up`` lands every transaction whose commit returned before it asked
  for the log's end (its target was the flushed WAL position, which async commits are past);
* the engine's watermark commits are flushed at once whatever the database says (an async
  watermark comes back through the log only after the WAL writer ran: 3-4x slower
  snapshots), and never wait for a synchronous standby (``local``, not ``on``).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from snapshotter.sources.postgres.dialect import PostgresDialect
from snapshotter.sources.postgres.slots import lsn_value
from tests.integration.engine_harness import Capture

pytestmark = pytest.mark.integration


@pytest.fixture
def async_db(pg_url: str, pg_engine: sa.Engine) -> Iterator[str]:
    """The URL of a new database whose sessions commit with ``synchronous_commit = off``."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with pg_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        conn.exec_driver_sql(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    yield sa.make_url(pg_url).set(database=name).render_as_string(hide_password=False)
    with pg_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def async_capture(async_db: str, tmp_path: Path) -> Iterator[Capture]:
    """A capture in ``async_db``'s public schema (its slot dropped before the database)."""
    cap = Capture(async_db, "public", tmp_path, chunk_size=100)
    try:
        yield cap
    finally:
        cap.cleanup()


def _setting(url: str) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SHOW synchronous_commit").fetchone()
    assert row is not None
    return str(row[0])


def test_until_caught_up_lands_every_commit_that_returned_before_it(
    async_capture: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer commits updates asynchronously (``SET synchronous_commit = off`` too) as fast
    as it can while ``run --until-caught-up`` starts, settles and asks for the log's end: the
    update whose commit returned last before that call is in the output."""
    cap = async_capture
    assert _setting(cap.url) == "off"
    cap.sql("CREATE TABLE public.counter (id int PRIMARY KEY, n int NOT NULL)")
    cap.sql("INSERT INTO public.counter VALUES (1, 0)")
    cap.init()
    returned = [0]  # the value of the newest update whose commit returned
    stop = threading.Event()

    def write() -> None:
        with psycopg.connect(cap.url, autocommit=True) as conn:
            conn.execute("SET synchronous_commit = off")
            n = 0
            while not stop.is_set():
                n += 1
                conn.execute("UPDATE public.counter SET n = %s WHERE id = 1", (n,))
                returned[0] = n

    asked: list[int] = []  # returned[0] when the engine asked for the log's end
    log_end = PostgresDialect.log_end

    def recorded(self: PostgresDialect) -> int:
        asked.append(returned[0])
        return log_end(self)

    monkeypatch.setattr(PostgresDialect, "log_end", recorded)
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        while returned[0] < 1000:  # writing at full speed before the engine starts
            stop.wait(0.01)
        assert cap.run(timeout=300) == 0
    finally:
        stop.set()
        writer.join(30)
    assert asked, "the engine never asked for the log's end"
    landed = [e["value"]["after"]["n"] for e in cap.events("counter")]
    assert landed, "no update landed"
    assert max(landed) >= asked[-1], (
        f"caught up at n = {max(landed)}, but n = {asked[-1]} had committed before the "
        f"engine asked for the log's end ({len(landed)} updates landed)"
    )


def test_watermark_commits_are_flushed_locally_whatever_the_database_says(
    async_capture: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each watermark transaction runs with ``synchronous_commit = local`` (asked inside it,
    as its INSERT is made) in a database whose default is ``off``."""
    from snapshotter.sources import sql_common
    from snapshotter.sources.postgres import dialect as pg_dialect

    cap = async_capture
    cap.sql("CREATE TABLE public.items (id int PRIMARY KEY, name text NOT NULL)")
    cap.sql("ALTER TABLE public.items REPLICA IDENTITY FULL")  # TOAST-able name
    cap.sql("INSERT INTO public.items SELECT g, 'item ' || g FROM generate_series(1, 450) g")
    cap.init()
    cap.execute("public.items")
    seen: list[str] = []
    insert_signal = sql_common.insert_signal

    def inside(conn: sa.Connection, table: Any, watermark: Any) -> str:
        seen.append(str(conn.exec_driver_sql("SHOW synchronous_commit").scalar_one()))
        return insert_signal(conn, table, watermark)

    # Wherever the dialect's watermark write takes it from.
    monkeypatch.setattr(sql_common, "insert_signal", inside)
    monkeypatch.setattr(pg_dialect, "insert_signal", inside, raising=False)
    assert cap.run() == 0
    assert len(seen) >= 2 * 5, seen  # an open and a close watermark per chunk, 5 chunks
    assert set(seen) == {"local"}, seen
    assert _setting(cap.url) == "off"  # the database's own default is unchanged
    verdict = cap.verify("items")
    assert verdict.ok, verdict.render()


def test_log_end_is_past_an_async_commit_and_decodable(async_capture: Capture) -> None:
    """The log end asked right after an async commit returned is at or past that commit,
    and already flushed (the stream can reach it without waiting for the WAL writer)."""
    cap = async_capture
    cap.sql("CREATE TABLE public.t (id int PRIMARY KEY, n int)")
    dialect = PostgresDialect(cap.url, cap.table_id("debezium_signal"), cap.publication)
    try:
        with psycopg.connect(cap.url, autocommit=True) as conn:
            for n in range(200):
                conn.execute("INSERT INTO public.t VALUES (%s, 0)", (n,))
            row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
            assert row is not None
            committed = lsn_value(row[0])  # past the last commit record
            end = dialect.log_end()
            flushed = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
            assert flushed is not None
    finally:
        dialect.close()
    assert end >= committed
    assert lsn_value(flushed[0]) >= end

"""What the engine asks PostgreSQL as it starts (sources/postgres/open_xacts.py, rule 4 across
restarts in core.visibility): the transactions open then, which of them may be a commit
before the log's resume point (in doubt), and what a role without pg_read_all_stats sees of
other roles' sessions."""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from snapshotter.core.visibility import OpenAtStart, PgSnapshot, RecentTransactions
from snapshotter.sources.postgres.open_xacts import open_at_start

pytestmark = pytest.mark.integration


def _writer(url: str) -> tuple[psycopg.Connection[Any], int]:
    """A session that wrote (a temporary table: an xid, no grant needed) and stays idle in
    its transaction; with that xid (64 bits)."""
    conn = psycopg.connect(url)
    conn.execute("CREATE TEMP TABLE pending (i int)")
    row = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
    assert row is not None
    return conn, int(row[0])


def _snapshot_now(url: str) -> PgSnapshot:
    """What a chunk read now would record."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT pg_current_snapshot()::text").fetchone()
        assert row is not None
        return PgSnapshot.parse(row[0])


def _missed(asked: OpenAtStart, url: str, xid: int) -> tuple[bool, bool]:
    """Whether a chunk read now misses ``xid``, and whether it is read again for it (other
    sessions of the shared server may hold it up too: only ``xid`` counts here)."""
    history = RecentTransactions()
    history.started(asked)
    chunk = _snapshot_now(url)
    short = xid % (1 << 32)
    return not chunk.sees(short), short in {t.xid for t in history.missed_at_start(chunk)}


def _session_of(asked: OpenAtStart, xid: int) -> Any:
    (session,) = [s for s in asked.sessions if s.xid == xid % (1 << 32)]
    return session


def test_a_session_idle_in_its_transaction_is_listed_but_not_in_doubt(
    pg_url: str, pg_engine: sa.Engine
) -> None:
    writer, xid = _writer(pg_url)
    try:
        asked = open_at_start(pg_engine)
        missed, read_again = _missed(asked, pg_url, xid)
        pid = writer.info.backend_pid
    finally:
        writer.close()
    # Usually the newest xid: at or past xmax of a snapshot taken before the question's own
    # xid ended, unlisted there; listed in this one.
    assert xid in asked.snapshot.xip and xid < asked.assigned < asked.snapshot.xmax
    session = _session_of(asked, xid)
    assert (session.pid, session.state, session.client) == (pid, "idle in transaction", True)
    assert session.age_s is not None and session.age_s >= 0
    assert xid % (1 << 32) not in asked.in_doubt()
    assert missed and not read_again  # it cannot be a commit before the resume point


def test_a_session_running_a_statement_in_its_transaction_is_in_doubt(
    pg_url: str, pg_engine: sa.Engine
) -> None:
    writer, xid = _writer(pg_url)
    pid = writer.info.backend_pid
    # 'active', as a session executing its COMMIT (stuck after the commit record) shows.
    sleeping = threading.Thread(target=lambda: _quietly(writer, "SELECT pg_sleep(60)"), daemon=True)
    sleeping.start()
    try:
        _wait_for_state(pg_engine, pid, "active")
        asked = open_at_start(pg_engine)
        missed, read_again = _missed(asked, pg_url, xid)
    finally:
        with pg_engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_cancel_backend(:pid)"), {"pid": pid})
        sleeping.join(10)
        writer.close()
    assert _session_of(asked, xid).state == "active"
    assert xid % (1 << 32) in asked.in_doubt()
    assert missed and read_again


def _quietly(conn: psycopg.Connection[Any], statement: str) -> None:
    with contextlib.suppress(psycopg.Error):
        conn.execute(statement)


def _wait_for_state(engine: sa.Engine, pid: int, state: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            now = conn.execute(
                sa.text("SELECT state FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
            ).scalar()
        if now == state:
            return
        time.sleep(0.05)
    raise AssertionError(f"backend {pid} never became {state!r}")


@pytest.fixture
def two_roles(pg_url: str, pg_engine: sa.Engine) -> Iterator[tuple[sa.Engine, str]]:
    """An engine logged in as a role without pg_read_all_stats, and the URL of another role
    (login only): the writer's sessions are another role's for the engine."""
    tag = uuid.uuid4().hex[:10]
    watcher, writer, password = f"w_{tag}", f"x_{tag}", secrets.token_hex(12)
    with pg_engine.begin() as conn:
        for role in (watcher, writer):
            conn.exec_driver_sql(f"CREATE ROLE \"{role}\" LOGIN PASSWORD '{password}'")
    url = sa.make_url(pg_url)
    as_watcher = sa.create_engine(
        url.set(drivername="postgresql+psycopg", username=watcher, password=password)
    )
    try:
        yield (
            as_watcher,
            url.set(username=writer, password=password).render_as_string(hide_password=False),
        )
    finally:
        as_watcher.dispose()
        with pg_engine.begin() as conn:
            for role in (watcher, writer):
                conn.exec_driver_sql(f'DROP OWNED BY "{role}"')
                conn.exec_driver_sql(f'DROP ROLE "{role}"')


def test_another_roles_session_stays_in_doubt_without_pg_read_all_stats(
    pg_url: str, pg_engine: sa.Engine, two_roles: tuple[sa.Engine, str]
) -> None:
    """PostgreSQL 15 shows every session's backend_xid to every role, but its state only to
    members of its role and of pg_read_all_stats: hidden, the engine stays conservative."""
    as_watcher, writer_url = two_roles
    writer, xid = _writer(writer_url)
    pid = writer.info.backend_pid
    try:
        hidden = open_at_start(as_watcher)
        watcher = as_watcher.url.username
        with pg_engine.begin() as conn:
            conn.exec_driver_sql(f'GRANT pg_read_all_stats TO "{watcher}"')
        as_watcher.dispose()  # new sessions, with the role's new membership
        shown = open_at_start(as_watcher)
    finally:
        writer.close()
    session = _session_of(hidden, xid)
    assert (session.pid, session.state, session.client) == (pid, None, False)
    assert xid % (1 << 32) in hidden.in_doubt()
    assert _session_of(shown, xid).state == "idle in transaction"
    assert xid % (1 << 32) not in shown.in_doubt()

"""``[source] failover_slot``: PostgreSQL 17+ creates the slot with failover = true; an older
server refuses it at init with the fix; an existing slot made without it is reported. Runs
on whichever PostgreSQL the tests use (scripts/matrix: 14 and 18 in CI besides 15)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from signals.names import TableId
from snapshotter.sources.postgres import catalog as pg_catalog
from snapshotter.sources.postgres import setup as pg_setup

pytestmark = pytest.mark.integration


@pytest.fixture
def slot(pg_engine: sa.Engine) -> Iterator[str]:
    name = f"fs_{uuid.uuid4().hex[:10]}"
    yield name
    pg_setup.drop_slot(pg_engine, name)


def _version(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return pg_catalog.server_version(conn)


def _failover_problems(engine: sa.Engine, table: TableId, slot: str) -> list[pg_setup.Problem]:
    problems = pg_setup.check_prerequisites(engine, [table], slot, None, failover=True)
    return [p for p in problems if "failover" in p.what]


def test_a_failover_slot_on_postgres_17_or_later_is_made_so_and_refused_before(
    pg_engine: sa.Engine, pg_schema: str, slot: str
) -> None:
    with pg_engine.begin() as conn:
        conn.execute(sa.text(f'CREATE TABLE "{pg_schema}".t (id int PRIMARY KEY)'))
    table = TableId(pg_schema, "t")
    problems = _failover_problems(pg_engine, table, slot)
    if _version(pg_engine) < 170000:
        (problem,) = problems
        assert problem.severity == "error" and "PostgreSQL 17" in problem.what, problem
        assert "failover_slot = false" in problem.fix, problem
        return
    assert not problems, problems
    assert pg_setup.ensure_slot(pg_engine, slot, failover=True) == "created"
    with pg_engine.connect() as conn:
        failover = conn.execute(
            sa.text("SELECT failover FROM pg_replication_slots WHERE slot_name = :s"), {"s": slot}
        ).scalar_one()
    assert failover is True
    assert not _failover_problems(pg_engine, table, slot)  # as wanted: nothing to say


def test_an_existing_slot_without_failover_on_postgres_17_or_later_is_reported(
    pg_engine: sa.Engine, pg_schema: str, slot: str
) -> None:
    with pg_engine.begin() as conn:
        conn.execute(sa.text(f'CREATE TABLE "{pg_schema}".t (id int PRIMARY KEY)'))
    assert pg_setup.ensure_slot(pg_engine, slot) == "created"  # without failover
    problems = _failover_problems(pg_engine, TableId(pg_schema, "t"), slot)
    if _version(pg_engine) < 170000:  # refused for the version, nothing said of the slot
        assert [p.severity for p in problems] == ["error"], problems
        return
    (problem,) = problems
    assert problem.severity == "warning" and slot in problem.what, problem
    assert "pg_drop_replication_slot" in problem.fix, problem

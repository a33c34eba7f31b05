"""The Cloud Spanner emulator scripts/services starts takes databases of both dialects with
change streams, commits and reads back (the spanner_emulator / spanner_database fixtures)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable

import pytest

from tests.conftest import REPO, SPANNER_INSTANCE, SPANNER_PROJECT, SpannerDatabase

pytestmark = pytest.mark.integration

GOOGLESQL_DDL = [
    "CREATE TABLE orders (id INT64 NOT NULL, note STRING(MAX), amount NUMERIC,"
    " ct TIMESTAMP OPTIONS (allow_commit_timestamp = true)) PRIMARY KEY (id)",
    "CREATE CHANGE STREAM orders_cs FOR orders OPTIONS (value_capture_type = 'OLD_AND_NEW_VALUES')",
]
POSTGRESQL_DDL = [
    "CREATE TABLE orders (id bigint NOT NULL, note varchar, amount numeric,"
    " ct spanner.commit_timestamp, PRIMARY KEY (id))",
    "CREATE CHANGE STREAM orders_cs FOR orders WITH (value_capture_type = 'OLD_AND_NEW_VALUES')",
]


@pytest.mark.parametrize(
    ("dialect", "ddl"),
    [("googlesql", GOOGLESQL_DDL), ("postgresql", POSTGRESQL_DDL)],
    ids=["googlesql", "postgresql"],
)
def test_database_with_change_stream_commits_and_reads_back(
    spanner_emulator: str,
    spanner_database: Callable[..., SpannerDatabase],
    dialect: str,
    ddl: list[str],
) -> None:
    from decimal import Decimal

    from google.cloud import spanner

    assert os.environ["SPANNER_EMULATOR_HOST"] == spanner_emulator
    db = spanner_database(dialect, ddl)
    assert (db.project, db.instance, db.dialect) == (SPANNER_PROJECT, SPANNER_INSTANCE, dialect)
    database = db.database
    database.reload()
    # The emulator reports GoogleSQL databases as DATABASE_DIALECT_UNSPECIFIED (0).
    assert database.database_dialect.name in (
        ("POSTGRESQL",)
        if dialect == "postgresql"
        else ("GOOGLE_STANDARD_SQL", "DATABASE_DIALECT_UNSPECIFIED")
    )

    with database.batch() as batch:
        batch.insert(
            "orders",
            columns=["id", "note", "amount", "ct"],
            values=[[1, "first", Decimal("12.50"), spanner.COMMIT_TIMESTAMP]],
        )
    committed = batch.committed
    assert committed is not None

    streams = (
        "SELECT change_stream_name FROM information_schema.change_streams"
        if dialect == "postgresql"
        else "SELECT CHANGE_STREAM_NAME FROM INFORMATION_SCHEMA.CHANGE_STREAMS"
    )
    with database.snapshot() as snap:  # single use, strong
        rows = list(snap.execute_sql("SELECT id, note, amount, ct FROM orders ORDER BY id"))
    with database.snapshot() as snap:
        names = [row[0] for row in snap.execute_sql(streams)]

    assert len(rows) == 1
    row_id, note, amount, ct = rows[0]
    assert (row_id, note, Decimal(amount)) == (1, "first", Decimal("12.50"))
    assert ct == committed  # the commit timestamp the row holds is the batch's
    assert names == ["orders_cs"]


def test_services_status_reports_spanner_running(spanner_emulator: str) -> None:
    result = subprocess.run(
        [str(REPO / "scripts" / "services"), "status", "spanner"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "SNAPSHOTTER_SPANNER_EMULATOR_HOST": spanner_emulator},
    )
    assert result.returncode == 0, result.stderr
    assert f"spanner: up at {spanner_emulator}" in result.stderr, result.stderr

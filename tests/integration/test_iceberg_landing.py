"""The Iceberg landing format against real servers: the convergence run (random concurrent
writer: inserts, updates, deletes, key changes) on PostgreSQL and MariaDB landed as Iceberg
tables, judged through the catalog with Spark SQL and without Spark by pyiceberg (the
harness's ``landed_rows``), and by ``snapshotter verify`` (which reads both too); the catalog
a user names; what a landing writes (merge-on-read: deletion vectors, no data file
rewritten); maintenance. Crashes between a landing's commits: tests/integration/test_faults.py
(``iceberg`` cases)."""

from __future__ import annotations

import pytest

from tests.integration.test_convergence import Source, _matrix, source, spark_converges

__all__ = ["source"]  # the fixture, used by name

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    "scenario",
    _matrix(
        [pytest.param(s, id=s) for s in ("items", "composite", "typed", "wide")],
        {"items"},  # CI: on both databases; the other key shapes with the full matrix
    ),
)
def test_the_iceberg_landing_converges_under_a_concurrent_random_writer(
    source: Source, scenario: str
) -> None:
    spark_converges(source, scenario, fmt="iceberg")

"""The spark sink beyond local mode: the convergence run (random concurrent writer, key
changes included) landed on a standalone Spark cluster (a master and two 1-core workers,
scripts/services up spark) and through Spark Connect (its server runs on that cluster), on
PostgreSQL and MariaDB. CI runs the "items" scenario on PostgreSQL (the landing past the
decoder is the same for both; MariaDB's rows reach the cluster in the Iceberg case below and
in tests/integration/test_executor_reads.py); the full matrix, every scenario on both:

    SNAPSHOTTER_CLUSTER_MATRIX=full scripts/test tests/integration/test_spark_cluster.py

Iceberg through Spark Connect (the server scripts/services starts loads Delta's and Iceberg's
jars and SQL extensions): in CI on MariaDB, the full matrix on both. Delta through Connect is
refused (its Connect server plugin is not published for this Spark).
"""

from __future__ import annotations

import os

import pytest

from tests.integration.test_convergence import Source, source, source_named, spark_converges

__all__ = ["source"]  # the fixture, used by name

pytestmark = pytest.mark.integration

SCENARIOS = (
    ["items", "composite", "typed", "wide"]
    if os.environ.get("SNAPSHOTTER_CLUSTER_MATRIX") == "full"
    else ["items"]
)
FULL = os.environ.get("SNAPSHOTTER_CLUSTER_MATRIX") == "full"
DBS = ["postgres", "mysql"] if FULL else ["postgres"]
DBS_THROUGH_CONNECT = ["postgres", "mysql"] if FULL else ["mysql"]


@pytest.mark.parametrize("source", DBS, indirect=True)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_landing_on_a_standalone_cluster_converges(
    source: Source, scenario: str, spark_master: str
) -> None:
    spark_converges(source, scenario, spark=spark_master)


@pytest.mark.parametrize("source", DBS, indirect=True)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_landing_through_spark_connect_converges(
    source: Source, scenario: str, spark_remote: str
) -> None:
    spark_converges(source, scenario, spark=spark_remote)


@pytest.mark.parametrize("db", DBS_THROUGH_CONNECT)
def test_iceberg_through_spark_connect_converges(
    request: pytest.FixtureRequest, db: str, spark_remote: str
) -> None:
    """Iceberg landed through Spark Connect, under the random writer: MERGE INTO and
    Iceberg's procedures run on the server (started with Iceberg's jars and extensions), the
    linked appends beside it (the same file system)."""
    spark_converges(source_named(request, db), "items", spark=spark_remote, fmt="iceberg")


def test_delta_through_spark_connect_is_refused_with_the_way_out(
    request: pytest.FixtureRequest, spark_remote: str
) -> None:
    """Delta's Python API needs a Connect server plugin that is not published for this
    Spark: the run fails at once, saying so and what to use instead, not at the first MERGE
    with "No handler found for extension"."""
    from snapshotter.config import SparkConfig
    from snapshotter.sinks.spark.lander import Lander, LandingError
    from snapshotter.sinks.spark.session import spark_session

    spark = spark_session(SparkConfig(remote=spark_remote))
    with pytest.raises(LandingError, match=r"cannot land through Spark Connect.*\[spark\] master"):
        Lander(spark, "/tmp/unused-lake", "delta")


def test_a_process_moves_between_spark_connect_and_local_mode(spark_remote: str) -> None:
    """One process, one Spark at a time: a local session after a Spark Connect one (PySpark
    marks a process that used Connect as Connect-only; the session module undoes that), and
    back. Tests and benches move between them; a CI run once failed every later local-mode
    test after the Connect tests."""
    from snapshotter.config import SparkConfig
    from snapshotter.sinks.spark.session import spark_session

    assert spark_session(SparkConfig(remote=spark_remote)).range(10).count() == 10
    local = spark_session(SparkConfig(master="local[1]"))
    assert local.range(7).count() == 7 and hasattr(local, "sparkContext")
    assert spark_session(SparkConfig(remote=spark_remote)).range(5).count() == 5
    assert spark_session(SparkConfig(master="local[2]")).range(3).count() == 3

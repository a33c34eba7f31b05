"""The Delta landing format against real servers: the convergence run (random concurrent
writer: inserts, updates, deletes, key changes) on PostgreSQL and MariaDB, judged by Spark's
Delta reader and without Spark by deltalake (delta-rs, the harness's ``landed_rows``) and by
``snapshotter verify``; a first snapshot lands as appends (no MERGE); deletion vectors and
Change Data Feed are on; the tables registered in a catalog a user names."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.test_convergence import (
    FULL_MATRIX,
    Source,
    _matrix,
    source,
    spark_converges,
)

__all__ = ["source"]  # the fixture, used by name

pytestmark = pytest.mark.integration


# CI: PostgreSQL (MariaDB into Delta: the fault suite's Delta case, the type matrix in full);
# the other key shapes and MariaDB with the full matrix.
@pytest.mark.parametrize(
    "source", ["postgres", "mysql"] if FULL_MATRIX else ["postgres"], indirect=True
)
@pytest.mark.parametrize(
    "scenario",
    _matrix([pytest.param(s, id=s) for s in ("items", "composite", "typed", "wide")], {"items"}),
)
def test_the_delta_landing_converges_under_a_concurrent_random_writer(
    source: Source, scenario: str
) -> None:
    spark_converges(source, scenario, fmt="delta")


@pytest.mark.parametrize("source", ["postgres"], indirect=True)
def test_a_first_snapshot_appends_and_later_changes_merge_with_deletion_vectors(
    source: Source,
) -> None:
    cap = source.capture(
        chunk_size=500,
        sink="spark",
        sink_format="delta",
        sink_config='catalog = "spark_catalog"',
    )
    table = source.create(cap, "items", 3000)
    cap.init()
    cap.execute(f"{cap.schema}.{table.name}")
    assert cap.run(timeout=300) == 0
    first = "SELECT id FROM {s}.items ORDER BY id"
    source.sql(cap, f"UPDATE {{s}}.items SET name = name || '!' WHERE id IN ({first} LIMIT 10)")
    source.sql(cap, f"DELETE FROM {{s}}.items WHERE id IN ({first} DESC LIMIT 10)")
    assert cap.run(timeout=300) == 0
    lander = cap.lander()
    path = f"{lander.table_path(cap.table_id('items'))}/current"
    spark = lander.spark
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()
    operations = [r["operation"] for r in history]
    # Created, the snapshot appended (no MERGE), then the changes merged.
    assert "MERGE" not in operations[: operations.index("WRITE") + 1], operations
    assert operations[-1] == "MERGE", operations
    merge: dict[str, Any] = history[-1]["operationMetrics"]
    # Deletion vectors mark the rows replaced; no row was copied into a rewritten file.
    assert int(merge["numTargetDeletionVectorsAdded"]) > 0, merge
    assert int(merge["numTargetRowsCopied"]) == 0, merge
    properties = spark.sql(f"SHOW TBLPROPERTIES delta.`{path}`").collect()
    on = {r["key"]: r["value"] for r in properties}
    assert on.get("delta.enableDeletionVectors") == "true"
    assert on.get("delta.enableChangeDataFeed") == "true"
    # Change Data Feed: the updates' pre- and post-images.
    feed = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 0)
        .load(path)
        .where("_change_type IN ('update_preimage', 'update_postimage')")
        .count()
    )
    assert feed == 20, feed
    # Registered in the catalog named: the session's, as <schema>.<table>.
    assert spark.table(f"spark_catalog.`{cap.schema}`.items").count() == 2990
    assert spark.table(f"spark_catalog.`{cap.schema}`.items_changelog").count() > 3000
    assert cap.landed_rows("items") == cap.source_rows("items")

"""The Iceberg landing format against real servers: the convergence run (random concurrent
writer: inserts, updates, deletes, key changes) on PostgreSQL and MariaDB landed as Iceberg
tables, judged through the catalog with Spark SQL and without Spark by pyiceberg (the
harness's ``landed_rows``), and by ``snapshotter verify`` (which reads both too); the catalog
a user names; what a landing writes (merge-on-read: deletion vectors, no data file
rewritten); maintenance; a reader during landings (pyiceberg and Spark SQL). Columns added,
widened and dropped while streaming: tests/integration/test_schema_changes.py. Crashes
between a landing's commits: tests/integration/test_faults.py (``iceberg`` cases). The
lander alone (maintenance policy, a user's catalog, landing again):
tests/integration/test_iceberg_tables.py."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from snapshotter.config import SparkConfig
from snapshotter.sinks.spark.session import spark_session
from tests.integration.engine_harness import SPARK_MASTER
from tests.integration.test_convergence import (
    CHANGES,
    CHUNK,
    ROWS,
    Source,
    Timer,
    _on_each_source,
    snapshot_under_writer,
    source,
    spark_converges,
    wait_for,
)

__all__ = ["source"]  # the fixture, used by name

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("source", "scenario"),
    _on_each_source(
        [pytest.param(s, id=s) for s in ("items", "composite", "typed", "wide")],
        # CI: PostgreSQL (MariaDB's rows land in Iceberg through Spark Connect in
        # test_spark_cluster.py); the other key shapes, both databases, with the full matrix
        {"postgres-items"},
    ),
    indirect=["source"],
)
def test_the_iceberg_landing_converges_under_a_concurrent_random_writer(
    source: Source, scenario: str
) -> None:
    spark_converges(source, scenario, fmt="iceberg")


class _Reader(threading.Thread):
    """Reads the current-state table over and over while the engine lands it, taking turns:
    with pyiceberg from the newest metadata file a Hadoop catalog names (no Spark), and
    with Spark SQL through a catalog of this process over the same warehouse (its table
    cache off, so each query sees the newest commit). In any one read no key twice, and
    per key never an older ``__pos`` after a newer one was read."""

    def __init__(self, table_dir: Path, key: list[str], spark: SparkSession, name: str) -> None:
        super().__init__(daemon=True, name="iceberg-reader")
        self.table_dir, self.key = table_dir, key
        self.spark, self.name = spark, name
        self.stop = threading.Event()
        self.seen: dict[tuple[Any, ...], str] = {}
        self.versions: set[str] = set()
        self.reads = {"pyiceberg": 0, "spark": 0}
        self.problems: list[str] = []

    def _newest(self) -> Path | None:
        hint = self.table_dir / "metadata" / "version-hint.text"
        if not hint.exists():
            return None
        version = hint.read_text(encoding="utf-8").strip()
        return self.table_dir / "metadata" / f"v{version}.metadata.json"

    def _pyiceberg(self) -> tuple[str, list[dict[str, Any]]] | None:
        from pyiceberg.table import StaticTable

        metadata = self._newest()
        if metadata is None:
            return None
        self.versions.add(metadata.name)
        scan = StaticTable.from_metadata(str(metadata)).scan(selected_fields=(*self.key, "__pos"))
        return metadata.name, scan.to_arrow().to_pylist()

    def _spark(self) -> tuple[str, list[dict[str, Any]]] | None:
        if not self.spark.catalog.tableExists(self.name):
            return None
        columns = ", ".join(f"`{c}`" for c in (*self.key, "__pos"))
        rows = self.spark.sql(f"SELECT {columns} FROM {self.name}").collect()
        return "spark", [r.asDict() for r in rows]

    def run(self) -> None:
        turn = 0
        while not self.stop.is_set() and len(self.problems) < 5:
            reader = ("pyiceberg", "spark")[turn % 2]
            turn += 1
            read = self._pyiceberg() if reader == "pyiceberg" else self._spark()
            if read is None:
                time.sleep(0.1)
                continue
            version, rows = read
            self.reads[reader] += 1
            keys = [tuple(r[k] for k in self.key) for r in rows]
            if len(set(keys)) != len(keys):
                self.problems.append(f"{version}: {len(keys) - len(set(keys))} keys twice")
            for key, row in zip(keys, rows, strict=True):
                before = self.seen.get(key)
                if before is not None and row["__pos"] < before:
                    self.problems.append(f"{version}: key {key} went back to an older row")
                self.seen[key] = max(before or "", row["__pos"])


@pytest.mark.parametrize("source", ["postgres"], indirect=True)
def test_a_reader_during_landing_and_maintenance_never_sees_a_key_twice_or_going_back(
    source: Source,
) -> None:
    """The snapshot under the random writer, then the writer and the engine going on with
    maintenance at every idle second: a reader of every table version meanwhile."""
    cap = source.capture(
        chunk_size=CHUNK,
        sink="spark",
        sink_format="iceberg",
        sink_config="compact_idle_s = 1\nmaintenance_interval_s = 0",
    )
    warehouse = cap.directory / "lake"
    spark = spark_session(SparkConfig(master=SPARK_MASTER), iceberg=True)
    for key, value in {
        "": "org.apache.iceberg.spark.SparkCatalog",
        ".type": "hadoop",
        ".warehouse": str(warehouse),
        ".cache-enabled": "false",
    }.items():
        spark.conf.set(f"spark.sql.catalog.reader27{key}", value)
    reader = _Reader(
        warehouse / cap.schema / "items",
        list(source.tables["items"].key),
        spark,
        f"reader27.`{cap.schema}`.items",
    )
    reader.start()
    try:
        table, _, pacer = snapshot_under_writer(source, cap, "items", Timer(), timeout=240)
        writer = source.writer(cap, table, ROWS, changes=None, seed=7, rate=300)
        with writer:
            engine = cap.start()
            wait_for(lambda: len(reader.versions) >= 8, "8 table versions", timeout=120)
            assert engine.stop(timeout=120) == 0
        assert cap.run(timeout=120) == 0
    finally:
        reader.stop.set()
        reader.join(60)
    assert not reader.problems, reader.problems
    assert reader.reads["pyiceberg"] >= 5 and reader.reads["spark"] >= 5, reader.reads
    assert pacer.during >= CHANGES
    assert cap.landed_rows(table.name) == cap.source_rows(table.name)


# The statements per database: the table, the widening, the drop.

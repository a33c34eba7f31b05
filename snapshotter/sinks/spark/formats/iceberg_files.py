"""Appends to an Iceberg table as Parquet files pyarrow writes into the table's data
directory, registered in one commit: no Spark job re-encoding the rows on the JVM.

The commit is made with Iceberg's Java API through the session's JVM (``_commit_files``: the
files' column metrics read from their footers by ``ParquetUtil.fileMetrics``, one
``AppendFiles`` commit), which is what Iceberg's ``add_files`` procedure does without the
procedure's Spark job listing the directory and reading the footers on executors: 0.05-0.1 s
per commit here where ``add_files`` took 0.3-0.45 s, quiet, for a 32k-row file (and a 1M-row
snapshot lands each file twice: the changelog and the current state). Where there is no JVM
in this process (Spark Connect) or the table is partitioned, ``add_files`` registers them.

Why: a snapshot's first landing appends every row twice (the changelog, the current state);
by Spark that took 3.5 s per 1M rows and table in local[2], where pyarrow writes the file in
about 0.3 s and ``add_files`` (reading its footer for the column metrics, one commit) takes
about 1 s. The files carry no Iceberg field ids: the first append sets the table's default
name mapping (``schema.name-mapping.default``), as ``add_files`` does, which Iceberg keeps up
with later schema changes, and every Iceberg reader (Spark, pyiceberg, Trino...) resolves
such files by column name.

Only where it is exactly what a Spark append would write: a table on this machine's file
system and staged rows of the table's columns and types (``staged_arrow``); otherwise False
and the caller appends with Spark (a column added or widened at the source, a table in a
remote catalog's object store)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path

import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql.pandas.types import to_arrow_schema

from snapshotter.sinks.spark.files import WRITE_OPTIONS, place_file
from snapshotter.sinks.spark.formats.staged_arrow import (
    as_schema,
    as_they_are,
    local_path,
    read_arrow,
)
from snapshotter.sinks.spark.latest import quote


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _quiet_catalog_lookup(spark: SparkSession) -> None:
    """``add_files`` first tries the ``parquet`` of `` `parquet`.`<dir>` `` as a catalog name,
    and Iceberg's Spark3Util logs that miss as a WARN with a 20-line stack trace at every
    append; the user's log gets none of it (errors still show)."""
    try:
        jvm = spark._jvm
        if jvm is None:
            return
        level = jvm.org.apache.logging.log4j.Level.ERROR
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            "org.apache.iceberg.spark.Spark3Util", level
        )
    except Exception:  # no JVM here (Spark Connect): nothing to quiet
        return


class FileAppender:
    """Appends by ``add_files`` into the tables of one Iceberg catalog."""

    def __init__(self, spark: SparkSession, catalog: str) -> None:
        self.spark = spark
        self.catalog = catalog
        self._locations: dict[str, str | None] = {}  # table name: its local directory
        self._local = pafs.LocalFileSystem()
        _quiet_catalog_lookup(spark)

    def _location(self, name: str) -> str | None:
        if name not in self._locations:
            rows = self.spark.sql(f"DESCRIBE TABLE EXTENDED {name}").collect()
            found = [str(r["data_type"]) for r in rows if r["col_name"] == "Location"]
            self._locations[name] = local_path(found[0]) if found else None
        return self._locations[name]

    def append(
        self, name: str, files: Sequence[Path | str], drop: Sequence[str] = ()
    ) -> list[int] | None:
        """The staged ``files``' rows (without the ``drop`` columns) appended to the table
        ``name`` (quoted, with its catalog) in one commit; the sizes of the data files it
        added. None: not done (see above)."""
        location = self._location(name)
        if location is None:
            return None
        schema = to_arrow_schema(self.spark.table(name).schema)
        # A directory of its own per append: add_files registers every file of the
        # directory it is given.
        directory = Path(location) / "data" / f"snapshotter-{uuid.uuid4().hex}"
        if not any(c in schema.names for c in drop) and as_they_are(files, schema):
            # The staged files are the table's rows as they are (a snapshot's changelog,
            # the stager's current-state copy of a chunk): linked in, not written again.
            directory.mkdir(parents=True)
            for n, path in enumerate(files):
                place_file(self._local, Path(path), str(directory), f"part-{n:05d}.parquet")
        else:
            rows = read_arrow(files, drop)
            if rows is None:
                return None
            rows = as_schema(rows, schema)
            if rows is None:
                return None
            directory.mkdir(parents=True)
            pq.write_table(rows, directory / "part-00000.parquet", **WRITE_OPTIONS)
        added = sorted(f for f in directory.iterdir() if not f.name.startswith(("_", ".")))
        if not _commit_files(self.spark, name, added):
            source = "`parquet`.`" + str(directory).replace("`", "``") + "`"
            # The whole name: a procedure resolves 'schema.table' trying schema as a catalog.
            self.spark.sql(
                f"CALL {quote(self.catalog)}.system.add_files(table => {_sql_string(name)}, "
                f"source_table => {_sql_string(source)}, check_duplicate_files => false)"
            ).collect()
        return [entry.stat().st_size for entry in added]


_NAME_MAPPING = "schema.name-mapping.default"


def _commit_files(spark: SparkSession, name: str, files: Sequence[Path]) -> bool:
    """Append the Parquet ``files`` (in the table's data directory) to the Iceberg table
    ``name`` in one commit by Iceberg's Java API, as ``add_files`` would register them: their
    metrics from their footers, columns resolved by the table's name mapping (set here
    first, as ``add_files`` sets it). False: not done (no JVM here, a partitioned table)."""
    try:
        jvm = spark._jvm
    except Exception:  # a Spark Connect session has none
        return False
    if jvm is None:
        return False
    iceberg = jvm.org.apache.iceberg
    table = iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, name)
    if not table.spec().isUnpartitioned():
        return False
    mapping_json = table.properties().get(_NAME_MAPPING)
    if mapping_json is None:
        mapping = iceberg.mapping.MappingUtil.create(table.schema())
        mapping_json = iceberg.mapping.NameMappingParser.toJson(mapping)
        table.updateProperties().set(_NAME_MAPPING, mapping_json).commit()
    else:
        mapping = iceberg.mapping.NameMappingParser.fromJson(mapping_json)
    metrics_config = iceberg.MetricsConfig.forTable(table)
    append = table.newAppend()
    # The files' paths as Iceberg's own writers record them here ("file:/..." under a
    # table located at "file:/..."): a path without a scheme would be resolved against
    # whatever default file system a later reader has (HDFS's on a cluster).
    scheme = "file:" if str(table.location()).startswith("file:") else ""
    for path in files:
        location = f"{scheme}{path}"
        metrics = iceberg.parquet.ParquetUtil.fileMetrics(
            table.io().newInputFile(location), metrics_config, mapping
        )
        append.appendFile(
            iceberg.DataFiles.builder(table.spec())
            .withPath(location)
            .withFormat(iceberg.FileFormat.PARQUET)
            .withFileSizeInBytes(path.stat().st_size)
            .withMetrics(metrics)
            .build()
        )
    append.commit()
    return True

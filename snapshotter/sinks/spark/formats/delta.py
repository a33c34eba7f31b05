"""The Delta format: the changelog and the current state as Delta tables, under
``<path>/<schema>.<table>/changelog`` and ``.../current``.

* The changelog is appended per landing, replacing exactly the batches it lands
  (``replaceWhere __batch BETWEEN lo AND hi``), so landing a batch twice changes nothing.
* Appends (the changelog, READ rows of new keys) are written from Arrow by delta-rs where
  it can do what Spark would (``delta_arrow``: a local table of the staged schema), by Spark
  otherwise; merges always by Spark.
* The current state: deletion vectors and Change Data Feed on (set at creation, and on a
  table an older version created, when this process first writes it). A local table is
  created by writing its first commit (``delta_create``), not by Spark. READ rows of keys the
  table never had (a first snapshot) are appended with no merge (``formats.split``); the rest
  is one MERGE per landing under the position rule (``formats.merge``), so merging again
  matches nothing; with deletion vectors a MERGE marks the rows it replaces instead of
  rewriting their files.
* Idempotent appends: each carries Delta's transaction identifiers (``txnAppId`` = this
  process's landing of this table, ``txnVersion`` = the last batch), so an append that
  committed before its landing failed is skipped by Delta when the landing is retried. After
  a crash nothing is appended: appends go only into a table this process created (the next
  run merges everything, which is idempotent).
* With ``[sink] catalog`` the two tables are registered there (``<catalog>.<schema>.<table>``
  and ``..._changelog``, external tables at their locations).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from snapshotter.sinks.spark.formats.delta_arrow import append, replace_batches
from snapshotter.sinks.spark.formats.delta_create import create_table
from snapshotter.sinks.spark.formats.delta_links import append_files, last_batch
from snapshotter.sinks.spark.formats.merge import key_bounds, latest_changes
from snapshotter.sinks.spark.formats.split import is_split, split_appends
from snapshotter.sinks.spark.formats.staged import read_staged, widened, with_dropped
from snapshotter.sinks.spark.formats.staged_arrow import local_path, read_arrow
from snapshotter.sinks.spark.latest import quote
from snapshotter.sinks.spark.types import BATCH, BEFORE, POS

if TYPE_CHECKING:
    from signals.names import TableId
    from snapshotter.sinks.spark.appends import KnownKeys
    from snapshotter.sinks.spark.lander import TableMeta
    from snapshotter.sinks.spark.staging import StagedTable

CURRENT_PROPERTIES = {
    "delta.enableDeletionVectors": "true",
    "delta.enableChangeDataFeed": "true",
}
CHANGELOG_SUFFIX = "_changelog"


class DeltaCatalogError(RuntimeError):
    """``[sink] catalog`` names no catalog of the session; the message says what to set."""


class DeltaTables:
    """The Delta tables under one landing root."""

    def __init__(self, spark: SparkSession, catalog: str | None = None) -> None:
        self.spark = spark
        self.catalog = catalog
        if catalog not in (None, "spark_catalog") and (
            spark.conf.get(f"spark.sql.catalog.{catalog}", None) is None
        ):
            raise DeltaCatalogError(
                f'[sink] catalog = "{catalog}" is not a Spark catalog of this session: set '
                f"spark.sql.catalog.{catalog} (and its settings) under [spark] conf, or remove "
                "catalog to keep the Delta tables by path only"
            )
        self._run = uuid.uuid4().hex  # this process's landings (txnAppId)
        self._appended_through: dict[str, int] = {}  # per current table: batches appended
        self._changelog_through: dict[str, int] = {}  # per changelog: its last batch
        self._checked: set[str] = set()  # current tables whose properties were looked at
        self._registered: set[TableId] = set()  # in the catalog, by this process

    def _is_delta(self, path: str) -> bool:
        local = local_path(path)
        if local is not None:  # without a Spark call: a landing asks several times
            # A commit, not the directory alone: a crash while the first commit was being
            # written (delta_create) leaves an empty _delta_log, which is no table yet.
            log = Path(local) / "_delta_log"
            return (log / f"{0:020d}.json").exists() or (log / "_last_checkpoint").exists()
        from delta.tables import DeltaTable

        return bool(DeltaTable.isDeltaTable(self.spark, path))

    def _properties(self, path: str) -> dict[str, str]:
        local = local_path(path)
        if local is not None:  # delta-rs reads the log in milliseconds; Spark's detail()
            import deltalake  # took 2-4 s, at every run's first landing of the table

            settings = deltalake.DeltaTable(local).metadata().configuration
            return {k: v for k, v in settings.items() if v is not None}
        from delta.tables import DeltaTable

        found = DeltaTable.forPath(self.spark, path).detail().collect()[0]["properties"]
        return dict(found)

    def schema(self, path: str) -> StructType | None:
        """The schema of the Delta table at ``path`` (None: there is none)."""
        if not self._is_delta(path):
            return None
        local = local_path(path)
        if local is not None:
            # delta-rs reads the log in milliseconds, Spark in 0.1-0.2 s at every landing;
            # a Delta schema is Spark's StructType in JSON (the protocol's own definition).
            import deltalake

            text = deltalake.DeltaTable(local).schema().to_json()
            return StructType.fromJson(json.loads(text))
        return self.spark.read.format("delta").load(path).schema

    def widen(self, base: str, staged: StructType) -> None:
        """The table's two Delta tables rewritten with the columns ``staged`` widens (a
        column widened at the source: int to bigint, a decimal's precision raised), once.
        Not Delta's type widening feature: delta-rs (``deltalake``) refuses to read a table
        that has it."""
        for part in ("changelog", "current"):
            path = f"{base}/{part}"
            if self._is_delta(path):
                rows = widened(self.spark.read.format("delta").load(path), staged)
                (
                    rows.write.format("delta")
                    .mode("overwrite")
                    .option("overwriteSchema", "true")
                    .save(path)
                )

    def fresh(self, base: str) -> bool:
        """Whether the current-state table does not exist (appends may start it)."""
        return not self._is_delta(f"{base}/current")

    def land(
        self,
        table: TableId,
        base: str,
        meta: TableMeta,
        parts: Sequence[tuple[int, StagedTable]],
        lo: int,
        hi: int,
        truncated_at: str | None,
        known: KnownKeys | None,
    ) -> tuple[int, bool]:
        """Land batches ``lo..hi`` of the table at ``base``. Returns the rows appended with
        no merge, and whether ``known`` may still be used for the next landing."""
        files = [str(s.file) for _, s in parts]
        frame: list[DataFrame] = []

        def staged() -> DataFrame:
            """The staged rows as Spark reads them (a column widened between them: read
            wide); only built when Spark is needed (a Spark call of 0.1-0.7 s)."""
            if not frame:
                frame.append(read_staged(self.spark, files))
            return frame[0]

        changelog = f"{base}/changelog"
        local = local_path(changelog) is not None
        if local and not self._is_delta(changelog):
            create_table(changelog, staged().schema, {})
        if not self._link_changelog(changelog, files, lo, hi):
            rows_in = read_arrow(files) if local else None
            if rows_in is None or not replace_batches(changelog, rows_in, lo, hi):
                writer = staged().write.format("delta").option("mergeSchema", "true")
                if self._is_delta(changelog):
                    writer.mode("overwrite").option(
                        "replaceWhere", f"{quote(BATCH)} >= {lo} AND {quote(BATCH)} <= {hi}"
                    ).save(changelog)
                else:
                    writer.mode("append").save(changelog)
            del rows_in
        current = f"{base}/current"
        self._prepare(current, staged)
        appended, merged, keep = split_appends(parts, known, self._appended_through.get(current, 0))
        rows = 0
        try:
            if appended:
                self._append(current, appended, hi)
                self._appended_through[current] = hi
                rows = sum(pq.ParquetFile(p).metadata.num_rows for p in appended)
            if truncated_at is not None:
                from delta.tables import DeltaTable

                DeltaTable.forPath(self.spark, current).delete(F.col(POS) < F.lit(truncated_at))
            if merged:
                changes = read_staged(self.spark, [str(p) for p in merged])
                # A column dropped at the source: NULL in the rows it updates, as in those
                # it inserts (not the value from before the drop).
                changes = with_dropped(changes, self.schema(current))
                bounds = key_bounds(merged, meta.key_columns)
                self._merge(current, meta, changes, truncated_at, bounds)
        finally:
            for path in (*appended, *merged):
                if is_split(path):
                    path.unlink(missing_ok=True)
        if self.catalog is not None and table not in self._registered:
            self._register(table, base)
            self._registered.add(table)
        return rows, keep

    def _link_changelog(self, changelog: str, files: Sequence[str], lo: int, hi: int) -> bool:
        """Batches ``lo..hi`` added to the changelog as their staged files (``delta_links``)
        where it holds none of them: its last batch, from its files' statistics once per
        process, then followed. False: not done (the caller replaces them by predicate)."""
        through = self._changelog_through.pop(changelog, None)
        if through is None:
            through = last_batch(changelog)
        if through is None or lo <= through:
            return False
        app_id = f"snapshotter-{self._run}-{changelog}"
        if not append_files(changelog, [Path(f) for f in files], app_id, hi):
            return False
        self._changelog_through[changelog] = hi
        return True

    def _append(self, current: str, files: Sequence[Path], hi: int) -> None:
        """READ rows of new keys appended (the files themselves where they hold the table's
        schema: ``delta_links``; else by delta-rs when it can: ``delta_arrow``), as
        transaction ``hi`` of this process's landings of the table."""
        app_id = f"snapshotter-{self._run}-{current}"
        if append_files(current, files, app_id, hi):
            return
        rows = read_arrow(files, drop=[BEFORE]) if local_path(current) is not None else None
        if rows is not None and append(current, rows, app_id, hi):
            return
        (
            read_staged(self.spark, [str(p) for p in files])  # a column widened: read wide
            .drop(BEFORE)  # a changelog column: not in the current state
            .write.format("delta")
            .mode("append")
            .option("mergeSchema", "true")
            .option("txnAppId", app_id)
            .option("txnVersion", hi)
            .save(current)
        )

    def _prepare(self, current: str, batch: Callable[[], DataFrame]) -> None:
        """The current-state table created with deletion vectors and Change Data Feed on, or
        (first written by this process) turned on for a table an older version made."""
        if current in self._checked:
            return
        from delta.tables import DeltaTable

        if not self._is_delta(current):
            if create_table(current, batch().drop(BEFORE).schema, CURRENT_PROPERTIES):
                self._checked.add(current)
                return
            builder = DeltaTable.createIfNotExists(self.spark).location(current)
            builder = builder.addColumns(batch().drop(BEFORE).schema)
            for key, value in CURRENT_PROPERTIES.items():
                builder = builder.property(key, value)
            builder.execute()
        else:
            have = self._properties(current)
            missing = {k: v for k, v in CURRENT_PROPERTIES.items() if have.get(k) != v}
            if missing:
                settings = ", ".join(f"'{k}' = '{v}'" for k, v in missing.items())
                self.spark.sql(f"ALTER TABLE delta.{quote(current)} SET TBLPROPERTIES ({settings})")
        self._checked.add(current)

    def _merge(
        self,
        current: str,
        meta: TableMeta,
        batch: DataFrame,
        truncated_at: str | None,
        bounds: Mapping[str, tuple[Any, Any]],
    ) -> None:
        from delta.tables import DeltaTable

        changes, clauses = latest_changes(batch, meta, truncated_at, bounds=bounds)
        (
            DeltaTable.forPath(self.spark, current)
            .alias("t")
            .merge(changes.alias("s"), clauses.on)
            .whenMatchedDelete(condition=clauses.delete_when)
            .whenMatchedUpdate(condition=clauses.update_when, set=clauses.updates)
            .whenNotMatchedInsert(condition=clauses.insert_when, values=clauses.inserts)
            .execute()
        )

    def names(self, table: TableId) -> tuple[str, str]:
        """The two tables' names in ``[sink] catalog`` (quoted): current, changelog."""
        assert self.catalog is not None
        parts = (quote(self.catalog), quote(table.schema or ""))
        return (
            ".".join((*parts, quote(table.table))),
            ".".join((*parts, quote(table.table + CHANGELOG_SUFFIX))),
        )

    def _register(self, table: TableId, base: str) -> None:
        current, changelog = self.names(table)
        self.spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {current.rsplit('.', 1)[0]}")
        for name, path in ((current, f"{base}/current"), (changelog, f"{base}/changelog")):
            location = path.replace("'", "\\'")
            self.spark.sql(f"CREATE TABLE IF NOT EXISTS {name} USING delta LOCATION '{location}'")

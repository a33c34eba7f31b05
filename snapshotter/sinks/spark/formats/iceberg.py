"""The Iceberg format: per source table two Apache Iceberg tables in a Spark catalog,
``<catalog>.<schema>.<table>`` (the current state) and ``<catalog>.<schema>.<table>_changelog``
(every event, append-only).

* The catalog: ``[sink] catalog``, one the user configured under ``[spark] conf`` (REST, Hive,
  Glue, Nessie...), or by default ``snapshotter``, a Hadoop (path) catalog whose warehouse is
  the landing root, set up here at run time (catalogs are read from the session's settings
  when first used; Iceberg's jars and SQL extensions are loaded at session start, see
  ``session``). In a process that lands into two roots, the second gets a catalog of its own
  (``snapshotter_<hash>``): a catalog's warehouse cannot change once used.
* The changelog: each landing replaces exactly the batches it lands (one atomic
  ``overwrite(__batch BETWEEN lo AND hi)``), so landing a batch twice changes nothing.
* The current state: format-version 3, merge-on-read for MERGE, UPDATE and DELETE, so a
  landing writes in proportion to its batch (new data files for what changed, deletion
  vectors for what they replace; no data file is rewritten). READ rows of keys the table
  never had are appended with no merge (``appends.KnownKeys`` decides, as for Parquet); the
  rest is merged under the position rule (``formats.merge``): a row is replaced only by an
  event of a higher ``__pos``, so merging again matches nothing.
* Maintenance (``maintain``), when the lander is idle, at most once per
  ``maintenance_interval_s`` per table: ``rewrite_data_files`` (small files, and data files
  with deletion vectors, rewritten), ``expire_snapshots`` (older than
  ``snapshot_retention_s``, the last ``snapshots_kept`` always kept).

Crash safety: every commit is atomic. A table is appended to only while this process has
landed it from its start (its metadata did not exist and nor did the table): after a crash
between commits the table exists, and every row goes through the merge, which is idempotent.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, StructType

from snapshotter.common.faults import failpoint
from snapshotter.sinks.spark.appends import KnownKeys
from snapshotter.sinks.spark.formats.iceberg_files import FileAppender
from snapshotter.sinks.spark.formats.merge import (
    inserted_rows,
    key_bounds,
    latest_changes,
    split_by_presence,
    split_worthwhile,
)
from snapshotter.sinks.spark.formats.split import is_split, split_appends
from snapshotter.sinks.spark.formats.staged import read_staged, widens
from snapshotter.sinks.spark.latest import quote
from snapshotter.sinks.spark.types import BATCH, BEFORE, POS

if TYPE_CHECKING:
    from signals.names import TableId
    from snapshotter.sinks.spark.lander import TableMeta
    from snapshotter.sinks.spark.staging import StagedTable

log = logging.getLogger(__name__)

DEFAULT_CATALOG = "snapshotter"
CHANGELOG_SUFFIX = "_changelog"
# The current state: deletes and updates as deletion vectors (format 3), never rewriting a
# data file at landing; maintenance folds them in.
CURRENT_PROPERTIES = {
    "format-version": "3",
    "write.delete.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.merge.mode": "merge-on-read",
}
CHANGELOG_PROPERTIES = {"format-version": "3"}
_SOURCE = "`__snapshotter_s`"  # the batch's side of a MERGE
# rewrite_data_files: a file group is rewritten once it has this many small files; a data file
# once the policy's share of its rows is deleted (``delete-ratio-threshold``: its deletion
# vector folded in). Not on any delete (``delete-file-threshold`` 1): 10,000 changes spread
# over a 4M-row table would rewrite every file of it at every maintenance.
# A file is small below 16 MB (Iceberg's default: 75% of the 512 MB target): a snapshot's
# files (one per staged batch, tens of MB, linked as staged) are no small files to rewrite;
# the small ones are a log batch's merge output. (At 384 MB, a 4M-row snapshot's files were
# all rewritten by the maintenance right after it: 32 s.)
SMALL_FILE_BYTES = 16 * 1024 * 1024
REWRITE_OPTIONS = {"min-input-files": "5", "min-file-size-bytes": str(SMALL_FILE_BYTES)}


@dataclass(frozen=True)
class IcebergPolicy:
    """``[sink]``'s Iceberg settings."""

    catalog: str | None = None
    maintenance_interval_s: float = 600.0
    snapshot_retention_s: float = 7 * 86_400.0
    snapshots_kept: int = 10
    rewrite_delete_ratio: float = 0.3


class IcebergError(RuntimeError):
    """The catalog cannot be used as configured; the message says what to set."""


def _hadoop_catalog(spark: SparkSession, root: str) -> str:
    """The name of a Hadoop catalog whose warehouse is ``root``, set up in the session."""
    warehouse = root if "://" in root else str(Path(root).resolve())
    name = DEFAULT_CATALOG
    taken = spark.conf.get(f"spark.sql.catalog.{name}.warehouse", None)
    if taken is not None and taken != warehouse:
        name = f"{DEFAULT_CATALOG}_{hashlib.sha256(warehouse.encode()).hexdigest()[:8]}"
    spark.conf.set(f"spark.sql.catalog.{name}", "org.apache.iceberg.spark.SparkCatalog")
    spark.conf.set(f"spark.sql.catalog.{name}.type", "hadoop")
    spark.conf.set(f"spark.sql.catalog.{name}.warehouse", warehouse)
    return name


class IcebergTables:
    """The Iceberg tables under one landing root."""

    def __init__(self, spark: SparkSession, root: str, policy: IcebergPolicy) -> None:
        self.spark = spark
        self.policy = policy
        if policy.catalog is None:
            self.catalog = _hadoop_catalog(spark, root)
        else:
            self.catalog = policy.catalog
            if spark.conf.get(f"spark.sql.catalog.{self.catalog}", None) is None:
                raise IcebergError(
                    f'[sink] catalog = "{self.catalog}" is not a Spark catalog of this session: '
                    f"set spark.sql.catalog.{self.catalog} = "
                    '"org.apache.iceberg.spark.SparkCatalog" and its type or uri under [spark] '
                    "conf, or remove catalog to use the landing path as a Hadoop catalog"
                )
        self._maintained_at: dict[TableId, float] = {}  # monotonic time of the last
        self._landed: set[TableId] = set()  # landed since their last maintenance
        self._appended_through: dict[TableId, int] = {}  # batches appended (a retried land)
        self._changelog_through: dict[TableId, int] = {}  # the changelog's last batch, as
        # this process landed it
        self._files = FileAppender(spark, self.catalog)
        self._namespaces: set[str] = set()  # created (or found) by this process
        # Tables this process created and has only appended files to since (add_files): per
        # table its snapshots at most and its data files' sizes. Their maintenance is known to
        # have nothing to do without asking the metadata tables (0.25 s per table).
        self._whole: dict[str, tuple[int, list[int]]] = {}

    # ------------------------------------------------------------------ names

    def current_name(self, table: TableId) -> str:
        """The current-state table's name, quoted: ``catalog.schema.table``."""
        return ".".join(quote(p) for p in (self.catalog, table.schema or "", table.table))

    def changelog_name(self, table: TableId) -> str:
        return ".".join(
            quote(p) for p in (self.catalog, table.schema or "", table.table + CHANGELOG_SUFFIX)
        )

    def _exists(self, name: str) -> bool:
        return bool(self.spark.catalog.tableExists(name))

    def _namespace(self, table: TableId) -> None:
        """The table's namespace created if it is not there, once per process (before the
        two tables' landings run side by side: not a race between them to create it)."""
        namespace = self.current_name(table).rsplit(".", 1)[0]
        if namespace not in self._namespaces:
            self.spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {namespace}")
            self._namespaces.add(namespace)

    def _create(self, name: str, like: DataFrame, properties: dict[str, str]) -> None:
        writer = like.limit(0).writeTo(name).using("iceberg")
        for key, value in properties.items():
            writer = writer.tableProperty(key, value)
        writer.create()
        self._whole[name] = (1, [])  # an empty table: one snapshot, if any

    def _add_files(self, name: str, files: Sequence[Path | str], drop: Sequence[str] = ()) -> bool:
        """``FileAppender.append``, followed in ``_whole``."""
        added = self._files.append(name, files, drop)
        if added is None:
            return False
        whole = self._whole.get(name)
        if whole is not None:
            self._whole[name] = (whole[0] + 1, [*whole[1], *added])
        return True

    def _rewritten(self, name: str) -> None:
        """The table is written otherwise than by appended files: its maintenance asks."""
        self._whole.pop(name, None)

    def _evolve(self, name: str, batch: DataFrame) -> None:
        """Columns of ``batch`` the table does not have yet, added (a column added at the
        source); rows landed before read NULL there. Columns widened at the source (int to
        bigint, float to double, a decimal's precision raised), widened in the table: an
        Iceberg type promotion, a metadata change (rows landed before read as the wider
        type). A column dropped at the source stays (``_conform``: NULL from then on)."""
        self._evolve_field(name, [], self.spark.table(name).schema, batch.schema)

    def _evolve_field(self, name: str, path: list[str], before: DataType, after: DataType) -> None:
        """The table's columns (``path`` empty), one column or a struct's field typed
        ``before`` brought to the staged ``after``: a struct's new fields added, its fields
        widened (a struct of the row's columns, such as a before-image, follows its table's
        changes)."""
        if isinstance(before, StructType) and isinstance(after, StructType):
            fields = {f.name: f.dataType for f in before.fields}
            for field in after.fields:
                was = fields.get(field.name)
                if was is None:
                    column = ".".join(quote(p) for p in (*path, field.name))
                    self.spark.sql(
                        f"ALTER TABLE {name} ADD COLUMN {column} {field.dataType.simpleString()}"
                    )
                elif was != field.dataType:
                    self._evolve_field(name, [*path, field.name], was, field.dataType)
            return
        if not widens(before, after):
            raise IcebergError(
                f"{name}: column {'.'.join(path)} is {after.simpleString()} at the source but "
                f"{before.simpleString()} in the table, and Iceberg widens only int to "
                "bigint, float to double and a decimal's precision; land the table into "
                "another path (or catalog)"
            )
        column = ".".join(quote(p) for p in path)
        self.spark.sql(f"ALTER TABLE {name} ALTER COLUMN {column} TYPE {after.simpleString()}")

    def _conform(self, name: str, rows: DataFrame) -> DataFrame:
        """``rows`` with the table's columns it lacks as NULLs (a column dropped at the
        source, or added after these rows were staged), typed as the table has them; so
        too a struct's fields (a before-image of the row's columns)."""
        have = {f.name: f.dataType for f in rows.schema.fields}
        table = self.spark.table(name).schema.fields
        missing = [f for f in table if f.name not in have]
        for field in table:
            staged = have.get(field.name)
            if not isinstance(field.dataType, StructType) or not isinstance(staged, StructType):
                continue
            inner = set(staged.fieldNames())
            if not set(field.dataType.fieldNames()) - inner:
                continue
            column = F.col(quote(field.name))
            rebuilt = F.struct(
                *[
                    column.getField(f.name).alias(f.name)
                    if f.name in inner
                    else F.lit(None).cast(f.dataType).alias(f.name)
                    for f in field.dataType.fields
                ]
            )
            rows = rows.withColumn(field.name, F.when(column.isNull(), None).otherwise(rebuilt))
        if not missing:
            return rows
        return rows.select("*", *[F.lit(None).cast(f.dataType).alias(f.name) for f in missing])

    # ------------------------------------------------------------------ landing

    def fresh(self, table: TableId) -> bool:
        """Whether the current-state table does not exist (appends may start it)."""
        return not self._exists(self.current_name(table))

    def land(
        self,
        table: TableId,
        meta: TableMeta,
        parts: Sequence[tuple[int, StagedTable]],
        lo: int,
        hi: int,
        truncated_at: str | None,
        known: KnownKeys | None,
    ) -> tuple[int, bool]:
        """Land batches ``lo..hi`` of ``table``. Returns the rows appended without a merge,
        and whether ``known`` may still be used for the next landing."""
        files = [str(s.file) for _, s in parts]
        batch = read_staged(self.spark, files)
        self._namespace(table)
        # The two tables' commits run side by side: each is mostly the driver waiting on its
        # own metadata (a snapshot's landing: two add_files of 0.3-0.6 s). Either may commit
        # without the other before a crash; the landing again after it is the same either
        # way (the changelog's batches replaced, the current state merged by position).
        changelog = ThreadPoolExecutor(1, thread_name_prefix="iceberg-changelog")
        try:
            logged = changelog.submit(self._land_changelog, table, batch, files, lo, hi)
            try:
                rows, keep = self._land_current(table, meta, parts, batch, hi, truncated_at, known)
            finally:
                wait([logged])
            logged.result()  # its failure, if any, once the current state's is known
        finally:
            changelog.shutdown()
        self._landed.add(table)
        return rows, keep

    def _land_changelog(
        self, table: TableId, batch: DataFrame, files: Sequence[str], lo: int, hi: int
    ) -> None:
        changelog = self.changelog_name(table)
        if self._exists(changelog):
            self._evolve(changelog, batch)
            conformed = self._conform(changelog, batch)
            self._replace_batches(table, changelog, conformed, lo, hi, files)
        else:
            self._create(changelog, batch, CHANGELOG_PROPERTIES)
            if not self._add_files(changelog, files):
                self._rewritten(changelog)
                batch.writeTo(changelog).append()
        self._changelog_through[table] = max(self._changelog_through.get(table, hi), hi)
        failpoint("spark.iceberg.changelog")  # committed (the current state: maybe not)

    def _land_current(
        self,
        table: TableId,
        meta: TableMeta,
        parts: Sequence[tuple[int, StagedTable]],
        batch: DataFrame,
        hi: int,
        truncated_at: str | None,
        known: KnownKeys | None,
    ) -> tuple[int, bool]:
        current = self.current_name(table)
        state = batch.drop(BEFORE)  # the current state's columns: no before-images
        if not self._exists(current):
            self._create(current, state, CURRENT_PROPERTIES)
        else:
            self._evolve(current, state)
        appended, merged, keep = split_appends(parts, known, self._appended_through.get(table, 0))
        rows = 0
        try:
            if appended:
                if not self._add_files(current, appended, drop=[BEFORE]):
                    self._rewritten(current)
                    rows_in = read_staged(self.spark, [str(p) for p in appended]).drop(BEFORE)
                    self._conform(current, rows_in).writeTo(current).append()
                self._appended_through[table] = hi
                failpoint("spark.iceberg.appended")  # committed; the merge not yet
                rows = sum(pq.ParquetFile(p).metadata.num_rows for p in appended)
            if truncated_at is not None:
                self._rewritten(current)
                self.spark.sql(
                    f"DELETE FROM {current} WHERE {quote(POS)} < :truncated",
                    args={"truncated": truncated_at},
                )
            if merged:
                self._rewritten(current)
                changes = read_staged(self.spark, [str(p) for p in merged])
                # A column dropped at the source: NULL in the rows it updates, as in those
                # it inserts (not the value from before the drop).
                bounds = key_bounds(merged, meta.key_columns)
                rows_in = self._conform(current, changes)
                size = _data_bytes(self.spark, current)
                by_presence = split_worthwhile(merged, meta.key_columns, bounds, size)
                log.debug(
                    "%s: %s merged (%s bytes)", current, "split" if by_presence else "one", size
                )
                _merge(self.spark, current, meta, rows_in, truncated_at, bounds, by_presence)
        finally:
            for path in (*appended, *merged):
                if is_split(path):
                    path.unlink(missing_ok=True)
        return rows, keep

    def _replace_batches(
        self,
        table: TableId,
        changelog: str,
        rows: DataFrame,
        lo: int,
        hi: int,
        files: Sequence[str],
    ) -> None:
        """Batches ``lo..hi`` of the changelog replaced by ``rows``, in one commit.

        The changelog holds none of them (every landing but one after a crash): an overwrite
        by filter, which deletes nothing (the files' ``__batch`` bounds tell Iceberg so
        without reading them). It holds some (landed again after a crash): the files holding
        them may hold other batches too (landed together, or rewritten together by
        maintenance), and an overwrite by filter drops whole files only (Iceberg refuses
        "some, but not all, rows match"); so a MERGE instead, whose row-level delete of
        those batches and insert of ``rows`` are one commit."""
        span = F.col(BATCH).between(lo, hi)
        # The changelog's last batch, asked once per process (a crash may have left batches
        # the metadata does not know), then followed: no Spark job per landing to ask
        # whether it holds some of lo..hi.
        through = self._changelog_through.get(table)
        if through is None:
            last = self.spark.table(changelog).agg(F.max(F.col(BATCH))).collect()[0][0]
            through = self._changelog_through[table] = int(last or 0)
        if lo > through or not self.spark.table(changelog).where(span).limit(1).collect():
            if not self._add_files(changelog, files):  # the staged files, as they are
                self._rewritten(changelog)
                rows.writeTo(changelog).overwrite(span)
            return
        self._rewritten(changelog)
        (
            rows.alias(_SOURCE.strip("`"))
            .mergeInto(changelog, F.lit(False))
            .whenNotMatched()
            .insertAll()
            .whenNotMatchedBySource(F.col(f"{changelog}.{quote(BATCH)}").between(lo, hi))
            .delete()
            .merge()
        )

    # ------------------------------------------------------------------ maintenance

    def maintenance_due(self, table: TableId | None = None) -> bool:
        tables = self._landed if table is None else {table} & self._landed
        now = time.monotonic()
        return any(
            now - self._maintained_at.get(t, -1e18) >= self.policy.maintenance_interval_s
            for t in tables
        )

    def maintain_due(self) -> list[TableId]:
        """Maintain every table due (see ``maintenance_due``); returns them."""
        done = [t for t in sorted(self._landed, key=str) if self.maintenance_due(t)]
        for table in done:
            self.maintain(table)
        return done

    def maintain(self, table: TableId) -> None:
        started = time.monotonic()
        log.info("%s: maintaining its Iceberg tables (rewriting small and delete files)", table)
        older = datetime.fromtimestamp(time.time() - self.policy.snapshot_retention_s, UTC)
        settings = {
            **REWRITE_OPTIONS,
            "delete-ratio-threshold": str(self.policy.rewrite_delete_ratio),
        }
        options = ", ".join(f"'{k}', '{v}'" for k, v in settings.items())
        for name in (self.current_name(table), self.changelog_name(table)):
            if not self._exists(name):
                continue
            # The whole name: a procedure resolves 'schema.table' trying schema as a catalog.
            ident = name.replace("\\", "\\\\").replace("'", "\\'")
            whole = self._whole.get(name)
            if whole is not None:
                small = sum(1 for size in whole[1] if size < SMALL_FILE_BYTES)
                if small < int(REWRITE_OPTIONS["min-input-files"]) and (
                    whole[0] <= self.policy.snapshots_kept
                ):
                    continue  # nothing to rewrite or expire
            self._rewritten(name)  # maintained: asked from now on
            files, deletes, snapshots = self._files_and_snapshots(name)
            if deletes or files >= int(REWRITE_OPTIONS["min-input-files"]):
                self.spark.sql(
                    f"CALL {quote(self.catalog)}.system.rewrite_data_files("
                    f"table => '{ident}', options => map({options}))"
                ).collect()
            if snapshots > self.policy.snapshots_kept:
                self.spark.sql(
                    f"CALL {quote(self.catalog)}.system.expire_snapshots(table => '{ident}', "
                    f"older_than => TIMESTAMP '{older:%Y-%m-%d %H:%M:%S.%f}', "
                    f"retain_last => {self.policy.snapshots_kept})"
                ).collect()
        self._maintained_at[table] = time.monotonic()
        self._landed.discard(table)
        log.info("%s: Iceberg tables maintained in %.1f s", table, time.monotonic() - started)

    def _files_and_snapshots(self, name: str) -> tuple[int, int, int]:
        """The table's small data files, delete files and snapshots, from its metadata tables: a
        procedure with nothing to do still plans for seconds (a first snapshot's tables,
        two or three large files and as many snapshots, were "maintained" in 1-3 s)."""
        counts = self.spark.sql(
            f"SELECT (SELECT count(*) FROM {name}.files WHERE content = 0 "
            f"AND file_size_in_bytes < {SMALL_FILE_BYTES}), "
            f"(SELECT count(*) FROM {name}.files WHERE content <> 0), "
            f"(SELECT count(*) FROM {name}.snapshots)"
        ).first()
        assert counts is not None
        return int(counts[0]), int(counts[1]), int(counts[2])

    # ------------------------------------------------------------------ reading

    def metadata_location(self, table: TableId) -> str | None:
        """Where the current-state table's newest metadata file is (for readers outside
        Spark: ``pyiceberg.table.StaticTable.from_metadata``); None: no such table."""
        name = self.current_name(table)
        if not self._exists(name):
            return None
        newest = self.spark.sql(
            f"SELECT file FROM {name}.metadata_log_entries ORDER BY timestamp DESC LIMIT 1"
        ).collect()
        return str(newest[0]["file"]) if newest else None

    def current(self, table: TableId) -> DataFrame:
        return self.spark.table(self.current_name(table))

    def changelog(self, table: TableId) -> DataFrame:
        return self.spark.table(self.changelog_name(table))


def _data_bytes(spark: SparkSession, name: str) -> int | None:
    """The size of the Iceberg table ``name``'s files, by its current snapshot's summary
    (``total-files-size``; 0: no snapshot yet); None: not recorded. By Iceberg's Java API
    where this process has the JVM (no Spark job), else from the ``snapshots`` metadata
    table (Spark Connect)."""
    try:
        return _files_size(spark, name)
    except Exception:  # only a hint for how to merge: a landing never fails on it
        log.debug("%s: the size of its files is not known", name, exc_info=True)
        return None


def _files_size(spark: SparkSession, name: str) -> int | None:
    try:
        jvm = spark._jvm
    except Exception:  # a Spark Connect session has none
        jvm = None
    if jvm is not None:
        table = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, name)
        table.refresh()
        snapshot = table.currentSnapshot()
        size = None if snapshot is None else snapshot.summary().get("total-files-size")
        return 0 if snapshot is None else None if size is None else int(size)
    newest = spark.sql(
        f"SELECT summary['total-files-size'] AS size FROM {name}.snapshots "
        "ORDER BY committed_at DESC LIMIT 1"
    ).first()
    if newest is None:
        return 0
    return None if newest["size"] is None else int(newest["size"])


def _merge(
    spark: SparkSession,
    current: str,
    meta: TableMeta,
    batch: DataFrame,
    truncated_at: str | None,
    bounds: Mapping[str, tuple[Any, Any]],
    by_presence: bool,
) -> None:
    """A landing's log rows merged into the current state under the position rule: one
    MERGE, or (``by_presence``: ``merge.split_worthwhile``) its present keys merged with
    WHEN MATCHED clauses only and its new keys appended."""
    changes, clauses = latest_changes(
        batch, meta, truncated_at, target=current, source=_SOURCE, bounds=bounds
    )
    if by_presence:
        present, new = split_by_presence(changes, spark.table(current), meta.key_columns, bounds)
        if not present.isEmpty():
            (
                F.broadcast(present)
                .alias(_SOURCE.strip("`"))
                .mergeInto(current, clauses.on)
                .whenMatched(clauses.delete_when)
                .delete()
                .whenMatched(clauses.update_when)
                .update(clauses.updates)  # type: ignore[arg-type]
                .merge()
            )
        rows = inserted_rows(new, clauses, _SOURCE)
        if not rows.isEmpty():
            rows.writeTo(current).append()
        return
    (
        changes.alias(_SOURCE.strip("`"))
        .mergeInto(current, clauses.on)
        .whenMatched(clauses.delete_when)
        .delete()
        .whenMatched(clauses.update_when)
        .update(clauses.updates)  # type: ignore[arg-type]
        .whenNotMatched(clauses.insert_when)
        .insert(clauses.inserts)  # type: ignore[arg-type]
        .merge()
    )

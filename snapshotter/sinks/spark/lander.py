"""Landing staged batches with Spark: per source table, a changelog and a current state.

Layout under the landing root (a local path or any Hadoop-compatible URI)::

    <root>/<schema>.<table>/
        _snapshotter.json      what was landed: key, format, base, buckets, tail size
        changelog/             every event, with __op, __pos, __ts_ms, __snapshot, __batch
        current/               the current state: per key the event with the highest __pos,
                               deletes removed

Both are Parquet directories (``format = "parquet"``) or Delta tables (``"delta"``); with
``"iceberg"`` they are two Iceberg tables in a catalog (``formats.iceberg``) and only
``_snapshotter.json`` is here. Each format's own code is in ``formats``.

Landing costs in proportion to the batch, not the table:

* The changelog is appended per batch. Each landing overwrites exactly the batches it lands
  (Parquet: one file per batch, ``changelog/batch-<N>.parquet`` with ``__batch`` inside,
  replaced by a rename over it, ``formats.parquet_changelog``; Delta:
  ``replaceWhere __batch BETWEEN lo AND hi``), so landing a batch twice changes nothing.
  Parquet files are written with pyarrow: a staged batch already is Parquet of the landed
  schema, and a Spark job per landing cost more JVM CPU than the whole engine spent on the
  same rows.
* Delta and Iceberg: READ rows of keys the table never had are appended; the rest is one
  MERGE per landing, guarded by position (a row is replaced only by a higher ``__pos``), so
  a second landing matches nothing (``formats.delta``, ``formats.iceberg``).
* Parquet has no MERGE, and rewriting the current state per batch would cost the whole table
  each time. So the current state is kept as a *base* (a compacted copy, bucketed by a hash
  of the key: one file per bucket directly in ``current/``, ``formats.parquet``) plus the
  changelog *tail* after it, and read merged (``current_state``): per key the row with the
  highest position. When the tail reaches ``compact_ratio`` of the base (and
  ``compact_min_rows``), it is folded in, rewriting only the buckets its keys fall in. A
  plain Parquet reader of ``current/`` (``spark.read.parquet``, ``pyarrow.dataset``,
  ``pandas.read_parquet``, knowing nothing of snapshotter) sees the state as of the last
  compaction, never a key twice; ``current_state`` sees the exact state, and ``snapshotter
  verify`` checks both. So that plain readers see the exact state too whenever the engine is
  stopped or quiet, every tail is folded in when the sink closes (``compact_idle``: after
  ``run --until-caught-up``, ``SIGTERM``) and when nothing has landed for a while (the
  sink's idle compaction).
* Crash safety of ``current/``: a compaction writes the touched buckets hidden, records
  itself as pending in ``_snapshotter.json`` (the commit), then renames each bucket over its
  old file (``formats.parquet``). A crash before the commit leaves a hidden directory no
  metadata names (a *stray*); after it, a pending compaction. A lander that writes starts
  by taking over every table under the root (``take_over``, the sink does it when it opens,
  whether or not the run lands the table again): a pending compaction is rolled forward,
  strays are removed, a changelog of the older layout is rewritten, and every table's
  metadata is loaded, so the closing compaction folds in every tail, a tail the crash left
  included.
* Parquet, appends that need no merge: while a table never landed before gets nothing but
  READ rows of keys it never had (a first snapshot without log traffic on the table:
  ``landing.appends`` decides, exactly), those rows are written straight into the base as
  files of their own (``<base>.b<batch>-*``, replaced when the batch lands again), besides
  the changelog: ``current/`` stays exact with no Spark job at all; the next compaction
  puts them into their buckets. The first row that
  needs a merge ends this for the table, and it lands through the tail from then on.
* Compaction waits while the sink says the table is being snapshotted
  (``hold_compaction``), so the snapshot's rows are compacted once after it
  (``compact_released``) instead of at every step of the table's growth.

Columns added, dropped or widened at the source while streaming: each landing compares its
staged batches with the landed table first (``formats.schema_changes``: ``[sink]
schema_changes``, the change recorded in ``_snapshotter.json``).

Unchanged TOAST values (``__unavailable``) take the value of the key's previous event, from
the same landing or from the state before it, but never from before a delete of the key (a
key change can delete a key and create it again for another row). Where there is no such
event the column stays NULL and listed in ``__unavailable``: never the placeholder text.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow.fs as pafs
from pyspark.sql import DataFrame, SparkSession

from signals.names import TableId
from snapshotter.common.faults import failpoint
from snapshotter.sinks.spark import bases
from snapshotter.sinks.spark.appends import KnownKeys
from snapshotter.sinks.spark.formats import parquet, parquet_changelog, parquet_landing
from snapshotter.sinks.spark.formats import schema_changes as schemas
from snapshotter.sinks.spark.formats.delta import DeltaTables
from snapshotter.sinks.spark.formats.iceberg import IcebergPolicy, IcebergTables
from snapshotter.sinks.spark.latest import quote, reduce_latest
from snapshotter.sinks.spark.staging import StagedBatch, StagedTable

log = logging.getLogger(__name__)

Format = Literal["parquet", "delta", "iceberg"]

META_FILE = "_snapshotter.json"
META_VERSION = 1
_SAFE = re.compile(r"[A-Za-z0-9_\-]")


class LandingError(RuntimeError):
    """Landed data that cannot be used as asked; the message says why and what to do."""


def _encode(part: str) -> str:
    return "".join(
        c if _SAFE.fullmatch(c) else "".join(f"~{b:02x}" for b in c.encode()) for c in part
    )


def table_dir_name(table: TableId) -> str:
    """``schema.table`` with anything but letters, digits, ``_`` and ``-`` as ``~hex``."""
    if table.schema is None:
        raise LandingError(f"table {table} has no schema")
    return f"{_encode(table.schema)}.{_encode(table.table)}"


@dataclass
class TableMeta:
    """What was landed for one table (``_snapshotter.json``)."""

    schema: str
    table: str
    format: Format
    key_columns: list[str]
    landed_through: int = 0  # the last batch landed
    base: int | None = None  # parquet: the batch the base was compacted at (its directory)
    # parquet: the last batch whose rows the base holds all of, when READ rows of new keys
    # were appended to it after that compaction (None: ``base``)
    base_through: int | None = None
    appended_through: int | None = None  # parquet: the last batch with rows appended to it
    base_rows: int = 0
    # changelog rows after the base that the base does not hold (an upper bound): what a
    # compaction has to merge
    tail_rows: int = 0
    truncated_at: str | None = None  # the position of the last truncate landed
    # parquet: the base's name: ``base-<base>``, its files ``current/base-<base>.*`` (a
    # compaction at the batch the base is already named after writes beside it,
    # ``base-<base>-<tag>``, never over what it reads); a directory of an older layout:
    # ``__base=<base>`` (an earlier layout), and None: ``v=<base>`` (sinks.spark.bases)
    base_dir: str | None = None
    unavailable_columns: list[str] = field(default_factory=list)  # ever landed unavailable
    # parquet: the bucket count of a bucketed base (None: not bucketed, an earlier
    # layout), the truncate its last compaction applied, and a compaction committed but
    # not wholly in place (``formats.parquet.Pending``, rolled forward by ``_writing``)
    buckets: int | None = None
    compacted_truncate: str | None = None
    pending: dict[str, Any] | None = None
    # columns added, dropped or widened at the source while streaming, oldest first
    # (``formats.schema_changes``); parquet: a rewrite of the files in a new schema begun
    schema_changes: list[dict[str, Any]] = field(default_factory=list)
    rewrite_pending: bool = False

    @property
    def covered(self) -> int | None:
        """The last batch the base holds (changelog rows after it are the tail)."""
        return self.base if self.base_through is None else self.base_through

    def to_json(self) -> str:
        return json.dumps({"version": META_VERSION, **self.__dict__}, indent=1)

    @classmethod
    def from_json(cls, text: str, where: str) -> TableMeta:
        raw = json.loads(text)
        if raw.pop("version", None) != META_VERSION:
            raise LandingError(f"{where}: not a landing metadata file of version {META_VERSION}")
        return cls(**raw)


@dataclass(frozen=True, slots=True)
class Landed:
    """What one call of ``Lander.land`` did."""

    batches: tuple[int, ...]
    rows: int
    seconds: float
    compacted: tuple[str, ...] = ()
    compact_seconds: float = 0.0


class Lander:
    def __init__(
        self,
        spark: SparkSession,
        root: str,
        fmt: Format = "parquet",
        *,
        compact_ratio: float = 0.5,
        compact_min_rows: int = 100_000,
        iceberg: IcebergPolicy | None = None,
        catalog: str | None = None,
        buckets: int = 0,
        schema_changes: schemas.Mode = "evolve",
    ) -> None:
        self.spark = spark
        self.root = root.rstrip("/")
        self.format = fmt
        self.compact_ratio = compact_ratio
        self.compact_min_rows = compact_min_rows
        self.buckets = buckets  # parquet: a new base's bucket count (0: from its size)
        self.schema_changes = schema_changes  # [sink] schema_changes
        self._fs, self._fs_root = pafs.FileSystem.from_uri(self.root)
        self._metas: dict[TableId, TableMeta] = {}
        # Tables whose compaction waits (the sink: while they are being snapshotted, so a
        # snapshot's rows are compacted once, after it, not again at every step of growth).
        self.hold_compaction: Callable[[TableId], bool] = lambda table: False
        # parquet: tables never landed before this process: the keys landed since, to tell
        # READ rows that are appends needing no merge (``landing.appends``).
        self._known: dict[TableId, KnownKeys] = {}
        self._writes_checked: set[TableId] = set()  # tables ``_writing`` has looked at
        self._iceberg = None  # the iceberg format's tables (in a catalog)
        if fmt == "iceberg":
            self._iceberg = IcebergTables(spark, self.root, iceberg or IcebergPolicy())
        if fmt == "delta" and type(spark).__module__.startswith("pyspark.sql.connect"):
            # Delta's Python API (create, merge, delete) needs Delta's Connect server plugin,
            # which Maven Central does not publish for Spark 4.1 (delta-connect-server: 404).
            raise LandingError(
                'format = "delta" cannot land through Spark Connect ([spark] remote): Delta\'s '
                "Connect server plugin is not available for this Spark; use [spark] master (a "
                'cluster or local mode), or format = "iceberg" or "parquet" with Connect'
            )
        self._delta = DeltaTables(spark, catalog) if fmt == "delta" else None
        self.parquet_schemas = schemas.ParquetSchemas(self._fs)

    @property
    def iceberg(self) -> IcebergTables:
        """The Iceberg tables (format "iceberg" only)."""
        if self._iceberg is None:
            raise LandingError(f"{self.root} is landed as {self.format}, not as Iceberg tables")
        return self._iceberg

    # ------------------------------------------------------------------ paths and metadata

    def table_path(self, table: TableId) -> str:
        return f"{self.root}/{table_dir_name(table)}"

    def _fs_path(self, table: TableId, *parts: str) -> str:
        return "/".join([self._fs_root.rstrip("/"), table_dir_name(table), *parts])

    def meta(self, table: TableId) -> TableMeta | None:
        cached = self._metas.get(table)
        if cached is not None:
            return cached
        path = self._fs_path(table, META_FILE)
        try:
            with self._fs.open_input_stream(path) as f:
                text = f.read().decode("utf-8")
        except (FileNotFoundError, OSError):
            return None
        meta = TableMeta.from_json(text, path)
        self._metas[table] = meta
        return meta

    def _writing(self, table: TableId, meta: TableMeta | None) -> None:
        """Before this lander first writes a table: clear what a crash left in it. Never done
        by a lander that only reads (verify, status): it would race a running engine's
        compaction."""
        if table in self._writes_checked:
            return
        self._writes_checked.add(table)
        if meta is not None and meta.format == "parquet":
            parquet.finish(self, table, meta)  # a compaction committed before a crash
            parquet_changelog.migrate(self._fs, self._fs_path(table, "changelog"), table)
            current = self._fs_path(table, "current")
            bases.remove_strays(self._fs, current, base_name(meta), table=table, crashed=True)

    def take_over(self) -> list[TableId]:
        """Before this lander writes anything (the sink, when it opens): every table landed
        under the root gets what a crash left in it cleared (``_writing``: a compaction cut
        short leaves a stray base) and its metadata loaded, so that ``compact_idle`` at the
        sink's close covers every table with a tail or a base of an older layout, whether
        this run lands it again or not. Returns the tables."""
        tables = self.tables()
        for table in tables:
            self._writing(table, self.meta(table))
        return tables

    def _save_meta(self, table: TableId, meta: TableMeta) -> None:
        self._fs.create_dir(self._fs_path(table), recursive=True)
        path = self._fs_path(table, META_FILE)
        tmp = path + ".tmp"
        with self._fs.open_output_stream(tmp) as f:
            f.write(meta.to_json().encode("utf-8"))
        self._fs.move(tmp, path)
        self._metas[table] = meta

    def tables(self) -> list[TableId]:
        """Tables with landed data."""
        return landed_tables(self.root)

    # ------------------------------------------------------------------ landing

    def land(self, batches: Sequence[StagedBatch]) -> Landed:
        """Land consecutive staged batches (oldest first) in one go per table. Idempotent:
        landing batches again that were landed already changes nothing."""
        started = time.monotonic()
        if not batches:
            return Landed((), 0, 0.0)
        by_table: dict[TableId, list[tuple[int, StagedTable]]] = {}
        for batch in batches:
            for part in batch.tables:
                by_table.setdefault(part.table, []).append((batch.seq, part))
        lo, hi = batches[0].seq, batches[-1].seq
        rows = 0
        due: list[TableId] = []
        for table, parts in by_table.items():
            rows += sum(s.rows for _, s in parts)
            if self._land_table(table, parts, lo, hi) and not self.hold_compaction(table):
                due.append(table)
        landed_at = time.monotonic()
        compacted = []
        for table in due:
            self.compact(table)
            compacted.append(str(table))
        done = time.monotonic()
        return Landed(
            tuple(b.seq for b in batches),
            rows,
            landed_at - started,
            tuple(compacted),
            done - landed_at,
        )

    def _land_table(
        self, table: TableId, parts: list[tuple[int, StagedTable]], lo: int, hi: int
    ) -> bool:
        """Land one table's part of batches lo..hi; True when its base is due a compaction."""
        staged = [s for _, s in parts]
        keys = list(staged[-1].key_columns)
        meta = self.meta(table)
        self._writing(table, meta)
        if meta is None:
            meta = TableMeta(table.schema or "", table.table, self.format, keys)
            if (
                self.format == "parquet"
                or (self._iceberg is not None and self._iceberg.fresh(table))
                or (self._delta is not None and self._delta.fresh(self.table_path(table)))
            ):
                self._known[table] = KnownKeys(keys)
        if meta.format != self.format:
            raise LandingError(
                f"{self.table_path(table)} was landed as {meta.format}, but [sink] format is "
                f"{self.format}; set it back, or land into another path"
            )
        if meta.key_columns != keys:
            raise LandingError(
                f"{table}: its key is now ({', '.join(keys)}) but {self.table_path(table)} was "
                f"landed keyed by ({', '.join(meta.key_columns)}); land it into another path"
            )
        truncated_at = _last_truncate(staged)
        if truncated_at is not None and (
            meta.truncated_at is None or truncated_at > meta.truncated_at
        ):
            meta.truncated_at = truncated_at
        for column in _unavailable_columns(staged):
            if column not in meta.unavailable_columns:
                meta.unavailable_columns.append(column)
        target = schemas.before_landing(self, table, meta, parts)
        appended = 0  # rows that went straight into the base (parquet)
        if self._iceberg is not None:
            appended, usable = self._iceberg.land(
                table, meta, parts, lo, hi, truncated_at, self._known.get(table)
            )
            if not usable:
                self._known.pop(table, None)
        elif self._delta is not None:
            appended, usable = self._delta.land(
                table,
                self.table_path(table),
                meta,
                parts,
                lo,
                hi,
                truncated_at,
                self._known.get(table),
            )
            if not usable:
                self._known.pop(table, None)
        else:
            appended = parquet_landing.land(self, table, meta, parts, lo, target)
        failpoint("spark.land")
        meta.landed_through = max(meta.landed_through, hi)
        meta.tail_rows += sum(s.rows for s in staged) - appended
        self._save_meta(table, meta)
        return self.compaction_due(meta)

    def compaction_due(self, meta: TableMeta, *, idle: bool = False) -> bool:
        """Whether the tail is worth folding into a new base: while landing, once it reaches
        ``compact_ratio`` of the base and ``compact_min_rows``; when idle (the sink closes),
        any tail is, so ``current/`` is a plain, exact table after a run (a tail below the
        ratio would leave a plain reader thousands of rows behind), and so is a base of
        an older layout (``sinks.spark.bases``)."""
        if self.format != "parquet" or meta.format != "parquet":
            return False
        if meta.tail_rows == 0 or meta.covered == meta.landed_through:
            # Nothing to fold in; when idle, a base of an older layout is rewritten in this
            # one (pyarrow and pandas read nothing of ``__base=<batch>``).
            return idle and _legacy_base(meta)
        if idle:
            return True
        return meta.tail_rows >= max(self.compact_min_rows, self.compact_ratio * meta.base_rows)

    def compact_idle(self, *, respect_holds: bool = False) -> list[TableId]:
        """Compact every table with a tail (see ``compaction_due``): the sink calls this when
        it closes, and when nothing has landed for a while (then ``respect_holds``: not the
        tables being snapshotted)."""
        if self._iceberg is not None:  # table maintenance instead
            return self._iceberg.maintain_due()
        done = []
        for table, meta in list(self._metas.items()):
            if respect_holds and self.hold_compaction(table):
                continue
            if self.compaction_due(meta, idle=True):
                self.compact(table)
                done.append(table)
        return done

    def has_tails(self) -> bool:
        """Whether a plain reader of some table's ``current/`` would miss landed rows (Iceberg:
        whether a table is due its maintenance)."""
        if self._iceberg is not None:
            return self._iceberg.maintenance_due()
        return any(self.compaction_due(meta, idle=True) for meta in self._metas.values())

    def waiting_compactions(self) -> list[TableId]:
        """Tables due a compaction (held or not): what a landing left for later."""
        return [table for table, meta in self._metas.items() if self.compaction_due(meta)]

    def compact_released(self) -> list[TableId]:
        """Compact the tables that are due and no longer held (``hold_compaction``): what
        waited for a snapshot to end. The sink calls this when the lander is idle."""
        done = []
        for table, meta in list(self._metas.items()):
            if self.compaction_due(meta) and not self.hold_compaction(table):
                self.compact(table)
                done.append(table)
        return done

    # ------------------------------------------------------------------ compaction (parquet)

    def compact(self, table: TableId) -> None:
        """Fold the changelog tail into the base, bucket by bucket (``formats.parquet``)."""
        meta = self.meta(table)
        if meta is None or self.format != "parquet":
            return
        self._writing(table, meta)
        if meta.covered == meta.landed_through and not _legacy_base(meta):
            return
        parquet.compact(self, table, meta)

    def _merged(self, table: TableId, meta: TableMeta) -> DataFrame:
        base = base_name(meta)
        names: list[str] = []
        if base is not None:
            current = self._fs_path(table, "current")
            files = [base] if bases.is_legacy(base) else bases.files(self._fs, current, base)
            names = [f.rsplit("/", 1)[-1] for f in files]  # a base of no rows may have none
        rows = parquet.base_rows(self, table, names)
        return parquet.merged(self, meta, [rows, parquet.tail(self, table, meta, None)])

    # ------------------------------------------------------------------ reading

    def current_state(self, table: TableId) -> DataFrame | None:
        """The table's current state (columns and meta columns), exact as of the last landed
        batch; None when nothing was landed for it."""
        meta = self.meta(table)
        if meta is None:
            return None
        if self._iceberg is not None:
            return self._iceberg.current(table)
        if self.format == "delta":
            return self.spark.read.format("delta").load(f"{self.table_path(table)}/current")
        return self._merged(table, meta)

    def changelog(self, table: TableId) -> DataFrame | None:
        if self.meta(table) is None:
            return None
        if self._iceberg is not None:
            return self._iceberg.changelog(table)
        path = f"{self.table_path(table)}/changelog"
        if self.format == "delta":
            return self.spark.read.format("delta").load(path)
        return parquet_changelog.read(self.spark, path, self._fs, self._fs_path(table, "changelog"))


def landed_tables(root: str) -> list[TableId]:
    """Tables with landed data under ``root`` (read without Spark)."""
    fs, fs_root = pafs.FileSystem.from_uri(root.rstrip("/"))
    found = []
    for info in fs.get_file_info(pafs.FileSelector(fs_root, allow_not_found=True)):
        if info.type is pafs.FileType.Directory:
            meta_path = f"{info.path}/{META_FILE}"
            if fs.get_file_info(meta_path).type is pafs.FileType.File:
                with fs.open_input_stream(meta_path) as f:
                    meta = TableMeta.from_json(f.read().decode("utf-8"), meta_path)
                found.append(TableId(meta.schema, meta.table))
    return sorted(found, key=str)


def base_name(meta: TableMeta) -> str | None:
    """The directory under current/ of the table's base (None: no base)."""
    if meta.base is None:
        return None
    return meta.base_dir or bases.legacy_base_dir(meta.base)


def _legacy_base(meta: TableMeta) -> bool:
    """Whether the table's base is of a layout some plain readers cannot read."""
    name = base_name(meta)
    return name is not None and bases.is_legacy(name)


def _last_truncate(staged: Sequence[StagedTable]) -> str | None:
    return max((s.truncated_at for s in staged if s.truncated_at is not None), default=None)


def _unavailable_columns(staged: Sequence[StagedTable]) -> list[str]:
    return list(dict.fromkeys(c for s in staged for c in s.unavailable))


__all__ = [
    "Landed",
    "Lander",
    "LandingError",
    "TableMeta",
    "base_name",
    "quote",
    "reduce_latest",
]

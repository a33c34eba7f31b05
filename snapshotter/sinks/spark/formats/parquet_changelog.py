"""The Parquet changelog: one file per landed batch, ``changelog/batch-<N, 12 digits>.parquet``,
``__batch`` (bigint, as everywhere) a column inside it.

Flat files with the batch inside, not partition directories: pyarrow (``pyarrow.dataset``,
``pyarrow.parquet.read_table``) and pandas skip directories whose names start with ``_``, so
they read nothing of an earlier layout (``changelog/__batch=N/``), and Spark read
``__batch`` from the directory name as an int (bigint in ``current/``). Now every plain
reader reads the changelog whole with its default options, and no partition column leaks.

Landing a batch again replaces its file by a rename over it (same name): a reader sees the
batch once, the old rows or the new. A batch landed by an older version as several files
``batch-<N>.part-<k>.parquet`` (rows read on executors, landed by Spark then) is still read,
and its files go when the batch is landed again.

A changelog of the older layout is still read (``read``), and rewritten in this one by the
first lander that writes the table (``migrate``, from ``Lander.take_over``).
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from snapshotter.sinks.spark.files import WRITE_OPTIONS, parquet_files, place_file
from snapshotter.sinks.spark.types import BATCH

log = logging.getLogger(__name__)

PREFIX = "batch-"
LEGACY = f"{BATCH}="  # a partition directory of that earlier layout


def file_name(batch: int, part: int | None = None) -> str:
    if part is None:
        return f"{PREFIX}{batch:012d}.parquet"
    return f"{PREFIX}{batch:012d}.part-{part:05d}.parquet"


def batch_of(info: pafs.FileInfo) -> int | None:
    """The batch an entry of ``changelog/`` holds (None: not a batch's)."""
    name: str = info.base_name
    if info.type is pafs.FileType.Directory:
        digits = name[len(LEGACY) :] if name.startswith(LEGACY) else ""
    elif info.type is pafs.FileType.File and name.startswith(PREFIX) and name.endswith(".parquet"):
        digits = name[len(PREFIX) : len(PREFIX) + 12]
    else:
        return None
    return int(digits) if digits.isdigit() else None


def _entries(fs: pafs.FileSystem, directory: str) -> list[tuple[int, pafs.FileInfo]]:
    selector = pafs.FileSelector(directory, allow_not_found=True)
    found = []
    for info in fs.get_file_info(selector):
        batch = batch_of(info)
        if batch is not None:
            found.append((batch, info))
    return sorted(found, key=lambda e: (e[0], e[1].base_name))


def _remove(fs: pafs.FileSystem, info: pafs.FileInfo) -> None:
    if info.type is pafs.FileType.Directory:
        fs.delete_dir(info.path)
    else:
        fs.delete_file(info.path)


def replace(fs: pafs.FileSystem, directory: str, batch: int, rows: pa.Table) -> None:
    """Make ``rows`` (``__batch`` included) the changelog's rows of ``batch``."""
    fs.create_dir(directory, recursive=True)
    name = file_name(batch)
    hidden = f"{directory}/.{name}.{uuid.uuid4().hex[:8]}.tmp"
    pq.write_table(rows, hidden, filesystem=fs, **WRITE_OPTIONS)
    fs.move(hidden, f"{directory}/{name}")  # over a landing of the batch before: atomic
    for seq, info in _entries(fs, directory):
        if seq == batch and info.base_name != name:
            _remove(fs, info)  # Spark's part files of an earlier landing, or the old layout


def replace_with_file(fs: pafs.FileSystem, directory: str, batch: int, staged: Path) -> None:
    """Make the staged file ``staged`` (already of the changelog's schema, ``__batch``
    included) the changelog's rows of ``batch``: linked or copied, not encoded again (a
    snapshot's 1M rows: no 0.3 s write, no 0.4 s read)."""
    name = file_name(batch)
    place_file(fs, staged, directory, name)
    for seq, info in _entries(fs, directory):
        if seq == batch and info.base_name != name:
            _remove(fs, info)


def read(
    spark: SparkSession,
    uri: str,
    fs: pafs.FileSystem,
    directory: str,
    after: int | None = None,
    upto: int | None = None,
) -> DataFrame | None:
    """The changelog's rows of batches ``after`` (excluded) to ``upto``, ``__batch`` bigint;
    only their files are read. None: no such batch."""
    files: list[str] = []
    legacy: list[str] = []
    for batch, info in _entries(fs, directory):
        if (after is None or batch > after) and (upto is None or batch <= upto):
            (legacy if info.type is pafs.FileType.Directory else files).append(info.base_name)
    parts = []
    reader = spark.read.option("mergeSchema", "true")
    if files:
        parts.append(reader.parquet(*[f"{uri}/{f}" for f in files]))
    if legacy:
        old = reader.option("basePath", uri).parquet(*[f"{uri}/{d}" for d in legacy])
        parts.append(old.withColumn(BATCH, F.col(BATCH).cast("long")))
    if not parts:
        return None
    out = parts[0]
    for part in parts[1:]:
        out = out.unionByName(part, allowMissingColumns=True)
    return out


def migrate(fs: pafs.FileSystem, directory: str, table: object) -> int:
    """Rewrite batches of the older layout (``__batch=N/``) as files of this one; how many.
    A crash between writing a batch's file and deleting its directory leaves both: the
    directory goes, the file (renamed in whole) stays."""
    done = 0
    entries = _entries(fs, directory)
    have = {seq for seq, info in entries if info.type is pafs.FileType.File}
    for seq, info in entries:
        if info.type is not pafs.FileType.Directory:
            continue
        if seq not in have:
            tables = []
            for path in sorted(parquet_files(fs, info.path)):
                with fs.open_input_file(path) as f:
                    tables.append(pq.read_table(f))
            rows = pa.concat_tables(tables, promote_options="default")
            if BATCH in rows.column_names:
                rows = rows.drop_columns([BATCH])
            rows = rows.append_column(
                pa.field(BATCH, pa.int64(), nullable=False), _batches(seq, rows.num_rows)
            )
            replace(fs, directory, seq, rows)
        else:
            fs.delete_dir(info.path)
        done += 1
    if done:
        log.info("%s: %d changelog batches rewritten as changelog/batch-<N>.parquet", table, done)
    return done


def _batches(seq: int, rows: int) -> pa.Array:
    return pa.array([seq] * rows, pa.int64())

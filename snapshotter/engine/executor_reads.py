"""Chunk reads on Spark executors (``[snapshot] executors = N``).

One window's key range is cut into N sub-ranges (``engine.workers._read_remote``) and read by
N Spark tasks at once, each on an executor: it connects to the source itself, reads its
sub-range in a READ ONLY transaction of its own (the dialect's chunk read, the same SQL and
value conversion as the engine's), converts the rows to the landed columns there, and
writes them as one Parquet file into the staging directory. Only a line per task comes back
to the engine: the rows read, the last key, what the transaction's snapshot missed
(PostgreSQL), where the file is. The rows themselves never pass through the engine: at the
close watermark the spark sink applies the window's drops to the files with Spark
(``sinks.spark.remote_reads``).

The Spark job runs on a chunk worker thread between the watermarks: every task's transaction
begins after the open watermark committed (the job starts after it) and has ended when the
job returns (before the close watermark is written). A task that fails makes the job fail:
the window is voided and read again, as any failed chunk read.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from snapshotter.common.faults import failpoint, fault_armed
from snapshotter.config import Config, SourceConfig
from snapshotter.core.keys import Key, decode_key, encode_key
from snapshotter.core.visibility import AllSnapshots, PgSnapshot, ReadVisibility
from snapshotter.core.window import RAW_KEY_PREFIX, ROW_INDEX, StagedRows
from snapshotter.engine.workers import RemoteChunk
from snapshotter.sources.base import ChunkSpec

log = logging.getLogger("snapshotter.chunks")

# One task's line back to the engine.
RESULT_SCHEMA = pa.schema(
    [
        ("index", pa.int64()),
        ("file", pa.string()),
        ("rows", pa.int64()),
        ("last_key", pa.string()),  # typed key JSON (core.keys); null: no row
        ("visibility", pa.string()),  # pg_snapshot text; null: not PostgreSQL
        ("key_types", pa.binary()),  # the raw key columns' Arrow schema (IPC)
        ("limited", pa.bool_()),  # the read stopped at its row limit
    ]
)
RESULT_DDL = (
    "index long, file string, rows long, last_key string, visibility string, "
    "key_types binary, limited boolean"
)
# A READ row's index within its window: the sub-range's number above these bits, its row in
# the sub-range below (positions need only be unique and ordered within the window).
INDEX_BITS = 40
EXECUTOR_FAULT_DELAY_S = 0.5


class ExecutorReadError(RuntimeError):
    """A sub-range read on an executor failed; the message is the task's error."""


class SparkExecutorReads:
    """``RemoteReads`` on Spark: ``tasks`` sub-ranges per window, one Spark task each."""

    def __init__(self, config: Config, tasks: int) -> None:
        self.tasks = tasks
        self._source = config.source
        self._spark = config.spark
        self._delta = config.sink.format == "delta"
        self._iceberg = config.sink.format == "iceberg"
        self._directory = Path(config.staging_dir) / "reads"
        # What executors wrote for windows of an earlier run: those windows are void (read
        # again, under new ids) or their rows were staged already.
        shutil.rmtree(self._directory, ignore_errors=True)

    def read(
        self, spec: ChunkSpec, ranges: Sequence[tuple[Key | None, Key]], window_id: str
    ) -> RemoteChunk:
        from snapshotter.sinks.spark.session import spark_session

        directory = self._directory / window_id
        shutil.rmtree(directory, ignore_errors=True)  # a read of this window before a crash
        directory.mkdir(parents=True)
        spark = spark_session(self._spark, delta=self._delta, iceberg=self._iceberg)
        reader = _TaskReader(self._source, spec, list(ranges), str(directory))
        started = time.monotonic()
        job = spark.range(0, len(ranges), 1, len(ranges)).mapInArrow(reader, RESULT_DDL)
        if fault_armed("executor.reads"):
            # The fault suite kills the engine while the executors read: the job runs on a
            # thread of its own, and the point is reached once it is under way.
            done: list[Any] = []
            thread = threading.Thread(target=lambda: done.append(job.collect()), daemon=True)
            thread.start()
            thread.join(EXECUTOR_FAULT_DELAY_S)
            failpoint("executor.reads")
            thread.join()
            lines = done[0] if done else job.collect()
        else:
            lines = job.collect()
        chunk = _chunk(sorted((row.asDict() for row in lines), key=lambda r: r["index"]))
        log.debug(
            "window %s: %d sub-ranges, %d rows read on executors in %.2f s",
            window_id,
            len(ranges),
            chunk.staged.selected,
            time.monotonic() - started,
        )
        return chunk


def _chunk(lines: list[dict[str, Any]]) -> RemoteChunk:
    """The tasks' lines as one window's chunk: the files in key order, up to the first
    sub-range that stopped at its row limit (the rest of the range is read again later, as
    a span of its own: core.spans 5.)."""
    files: list[str] = []
    selected = 0
    last_key: Key | None = None
    covered: Key | None = None
    snapshots: list[ReadVisibility] = []
    key_types = pa.ipc.read_schema(pa.py_buffer(lines[0]["key_types"]))
    for line in lines:
        if line["rows"]:
            files.append(line["file"])
            selected += line["rows"]
            last_key = decode_key(json.loads(line["last_key"]))
        if line["visibility"] is not None:
            snapshots.append(PgSnapshot.parse(line["visibility"]))
        if line["limited"]:
            covered = last_key
            break
    visibility: ReadVisibility | None = None
    if snapshots:
        visibility = snapshots[0] if len(snapshots) == 1 else AllSnapshots(tuple(snapshots))
    staged = StagedRows(tuple(files), selected, last_key, key_types, covered)
    return RemoteChunk(staged, visibility)


class _TaskReader:
    """The function each Spark task runs (``mapInArrow``): its input holds the numbers of
    the sub-ranges it reads. Pickled to the executors with what it needs, nothing more."""

    def __init__(
        self,
        source: SourceConfig,
        spec: ChunkSpec,
        ranges: list[tuple[Key | None, Key]],
        directory: str,
    ) -> None:
        self.source = source
        self.spec = spec
        self.ranges = ranges
        self.directory = directory

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield read_sub_range(self.source, self.spec, self.ranges, index, self.directory)


def read_sub_range(
    source: SourceConfig,
    spec: ChunkSpec,
    ranges: Sequence[tuple[Key | None, Key]],
    index: int,
    directory: str,
) -> pa.RecordBatch:
    """On an executor: read sub-range ``index`` with a connection of its own, write its
    rows (landed columns, raw key columns, READ indexes) to one Parquet file; its line."""
    from snapshotter.sinks.spark.types import landed_columns, read_rows_to_landed_data
    from snapshotter.sources.connector import connector_for

    after, upto = ranges[index]
    sub = ChunkSpec(spec.schema, spec.key_columns, after, upto, spec.condition, spec.limit)
    dialect = connector_for(source).open_dialect()
    try:
        chunk = dialect.read_chunk(sub)
    finally:
        dialect.close()
    rows = chunk.rows
    count = rows.num_rows
    names = [c.name for c in landed_columns(spec.schema)]
    arrays = read_rows_to_landed_data(spec.schema, rows)
    raw_keys = rows.select(list(spec.key_columns))
    arrays += raw_keys.columns
    names += [RAW_KEY_PREFIX + c for c in spec.key_columns]
    arrays.append(pa.array(range(index << INDEX_BITS, (index << INDEX_BITS) + count), pa.int64()))
    names.append(ROW_INDEX)
    path = os.path.join(directory, f"part-{index:05d}.parquet")
    if count:
        hidden = os.path.join(directory, f".part-{index:05d}.tmp")
        pq.write_table(pa.Table.from_arrays(arrays, names=names), hidden, use_dictionary=False)
        os.replace(hidden, path)
    visibility = chunk.visibility
    text = None
    if isinstance(visibility, PgSnapshot):
        xip = ",".join(str(x) for x in sorted(visibility.xip))
        text = f"{visibility.xmin}:{visibility.xmax}:{xip}"
    elif visibility is not None:
        raise ExecutorReadError(f"cannot send a {type(visibility).__name__} back to the engine")
    last_key = None
    if chunk.last_key is not None:
        last_key = json.dumps(encode_key(chunk.last_key))
    line = {
        "index": [index],
        "file": [path],
        "rows": [count],
        "last_key": [last_key],
        "visibility": [text],
        "key_types": [raw_keys.schema.serialize().to_pybytes()],
        "limited": [count >= spec.limit and chunk.last_key != upto],
    }
    return pa.RecordBatch.from_pydict(line, schema=RESULT_SCHEMA)


def executor_reads(config: Config) -> SparkExecutorReads | None:
    """The configured executor reads, if any."""
    tasks = config.snapshot.executors
    return SparkExecutorReads(config, tasks) if tasks > 0 else None

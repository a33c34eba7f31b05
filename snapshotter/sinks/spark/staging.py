"""Staged batches: Arrow tables written as Parquet files on local disk, made durable before the
engine's state may record them.

A batch is a directory ``batch-<seq>`` holding one Parquet file per source table and a
``manifest.json``. It is written under a temporary name, every file is fsynced, and the
directory is renamed into place (then the staging directory is fsynced), so a batch is
either complete or absent: a crash leaves at most a ``.tmp-*`` directory, removed on the
next open. Batches are numbered in the order they were staged, which is log order.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from signals.names import TableId
from snapshotter.common.faults import failpoint
from snapshotter.sinks.spark.files import WRITE_OPTIONS
from snapshotter.sinks.spark.types import BEFORE, OP, POS, UNAVAILABLE

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
_PREFIX = "batch-"
# Rows per row group of a staged file: Spark reads a file in as many tasks as it has row
# groups (at most), so a snapshot's 1M-row batch in pyarrow's default single row group was
# read and written into Delta/Iceberg by one task while the other cores idled.
STAGED_ROW_GROUP = 128 * 1024


class StagingError(RuntimeError):
    """A staging directory that cannot be used; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class StagedTable:
    table: TableId
    key_columns: tuple[str, ...]
    file: Path
    rows: int
    truncated_at: str | None  # the position of the batch's last truncate of the table
    # Columns some rows lack because the log did not carry them (unchanged TOAST values).
    unavailable: tuple[str, ...]
    # A part of READ rows only (a snapshot's chunks) also as the current state holds them
    # (no before-images), written by the stager beside ``file``: the lander links it into
    # the table where all of them are appends, instead of reading and writing them again.
    current_file: Path | None = None


@dataclass(frozen=True, slots=True)
class StagedBatch:
    seq: int
    directory: Path
    tables: tuple[StagedTable, ...]
    bytes: int

    def table(self, table: TableId) -> StagedTable | None:
        for staged in self.tables:
            if staged.table == table:
                return staged
        return None


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _reads_only(data: pa.Table) -> bool:
    """Whether a staged part is READ rows only (with the before-image column they never
    fill), so the current state's copy of it is worth writing beside it."""
    if not data.num_rows or BEFORE not in data.column_names:
        return False
    return bool(pc.all(pc.equal(data.column(OP), "r")).as_py())


def _table_json(table: TableId) -> dict[str, Any]:
    return {"schema": table.schema, "table": table.table}


def _take_files(write: Callable[[str], None], scratch: Path, into: Path) -> int:
    """Run ``write`` into ``scratch`` (a directory it creates), move the Parquet files it
    wrote into ``into``; their rows, from the files' footers."""
    write(str(scratch))
    rows = 0
    if scratch.exists():
        for n, part in enumerate(sorted(scratch.glob("part-*.parquet"))):
            rows += pq.ParquetFile(part).metadata.num_rows
            os.replace(part, into / f"part-w{n:05d}.parquet")
        shutil.rmtree(scratch)
    return rows


class StagingArea:
    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def open(self) -> None:
        """Create the directory, and drop what a crash left half written."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for leftover in self.directory.glob(".tmp-*"):
            shutil.rmtree(leftover, ignore_errors=True)

    def stage(
        self,
        seq: int,
        tables: Sequence[tuple[TableId, Sequence[str], pa.Table]],
        written: Mapping[TableId, Callable[[str], None]] | None = None,
    ) -> StagedBatch:
        """Write one batch durably; returns it once its directory is renamed into place.
        ``written``: tables with more rows that a writer puts as Parquet files into a new
        directory it is given (Spark, for READ rows read on executors); such a table is
        staged as a directory of files instead of one file."""
        written = written or {}
        final = self.directory / f"{_PREFIX}{seq:012d}"
        if final.exists():
            raise StagingError(f"staged batch {final} exists already; was it staged twice?")
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{_PREFIX}{seq:012d}-", dir=self.directory))
        try:
            entries = []
            staged = []
            total = 0
            for i, (table, key_columns, data) in enumerate(tables):
                name = f"t{i}.parquet"
                path = tmp / name
                current_name: str | None = None
                rows = data.num_rows
                write = written.get(table)
                if write is not None:
                    name = f"t{i}"
                    path = tmp / name
                    path.mkdir()
                    if data.num_rows:
                        pq.write_table(
                            data,
                            path / "part-local.parquet",
                            use_dictionary=False,
                            row_group_size=STAGED_ROW_GROUP,
                        )
                    rows += _take_files(write, tmp / f".{name}.written", path)
                    size = 0
                    for part in path.iterdir():
                        _fsync_path(part)
                        size += part.stat().st_size
                    _fsync_path(path)
                else:
                    # Local, short-lived, read once: no dictionaries (most landed columns,
                    # and __pos always, are near unique, where building one first is wasted
                    # work): a 200k-row batch writes in 55 ms instead of 72 and reads in 38
                    # instead of 90.
                    pq.write_table(
                        data, path, use_dictionary=False, row_group_size=STAGED_ROW_GROUP
                    )
                    _fsync_path(path)
                    size = path.stat().st_size
                    if _reads_only(data):
                        current_name = f"t{i}.current.parquet"
                        current_path = tmp / current_name
                        pq.write_table(data.drop_columns([BEFORE]), current_path, **WRITE_OPTIONS)
                        _fsync_path(current_path)
                        size += current_path.stat().st_size
                total += size
                # Said in the manifest, so the lander need not read the files to know.
                truncated_at = pc.max(
                    pc.filter(data.column(POS), pc.equal(data.column(OP), "t"))
                ).as_py()
                unavailable = tuple(
                    name
                    for name in pc.unique(pc.list_flatten(data.column(UNAVAILABLE))).to_pylist()
                    if name is not None
                )
                entries.append(
                    {
                        "table": _table_json(table),
                        "key_columns": list(key_columns),
                        "file": name,
                        "rows": rows,
                        "truncated_at": truncated_at,
                        "unavailable": list(unavailable),
                        "current_file": current_name,
                    }
                )
                staged.append(
                    StagedTable(
                        table,
                        tuple(key_columns),
                        final / name,
                        rows,
                        truncated_at,
                        unavailable,
                        None if current_name is None else final / current_name,
                    )
                )
            manifest = tmp / MANIFEST
            manifest.write_text(
                json.dumps(
                    {"version": MANIFEST_VERSION, "batch": seq, "bytes": total, "tables": entries},
                    indent=1,
                ),
                encoding="utf-8",
            )
            _fsync_path(manifest)
            _fsync_path(tmp)
            failpoint("sink.flush")
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _fsync_path(self.directory)
        return StagedBatch(seq, final, tuple(staged), total)

    def batches(self) -> list[StagedBatch]:
        """The complete staged batches, oldest first."""
        found = []
        for path in self.directory.glob(f"{_PREFIX}*"):
            found.append(self._read(path))
        return sorted(found, key=lambda b: b.seq)

    def remove(self, batch: StagedBatch) -> None:
        shutil.rmtree(batch.directory)

    def discard_after(self, seq: int) -> list[int]:
        """Drop batches staged after ``seq`` (the state never recorded them: the log replays
        their events); returns their numbers."""
        dropped = []
        for batch in self.batches():
            if batch.seq > seq:
                shutil.rmtree(batch.directory)
                dropped.append(batch.seq)
        if dropped:
            _fsync_path(self.directory)
        return dropped

    def _read(self, path: Path) -> StagedBatch:
        try:
            raw = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
            if raw.get("version") != MANIFEST_VERSION:
                raise StagingError(
                    f"staged batch {path} has manifest version {raw.get('version')!r}; this "
                    f"snapshotter reads version {MANIFEST_VERSION}: land it with the version "
                    "that staged it"
                )
            tables = tuple(
                StagedTable(
                    TableId(e["table"]["schema"], e["table"]["table"]),
                    tuple(e["key_columns"]),
                    path / e["file"],
                    int(e["rows"]),
                    e["truncated_at"],
                    tuple(e["unavailable"]),
                    None if e.get("current_file") is None else path / e["current_file"],
                )
                for e in raw["tables"]
            )
            return StagedBatch(int(raw["batch"]), path, tables, int(raw["bytes"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StagingError(
                f"staged batch {path} is unreadable ({exc}); it was complete when renamed into "
                "place, so something else changed it: restore it, or remove it and start over "
                "without the state"
            ) from None

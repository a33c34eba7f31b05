"""Which staged files land as appends and which through a merge (the Delta and Iceberg
formats): with ``appends.KnownKeys`` of a table this process started, each staged part's
READ rows of keys never landed are appended, the rest merged; a part with both is written
apart beside the staged file (pyarrow), so Spark reads each set whole.

A part staged as a directory (``[snapshot] executors``: READ rows read and written by Spark
executors, ``remote_reads``) holds ``part-local.parquet`` (the rows that passed through the
engine: log rows, windows read locally) and the executors' files ``part-w*.parquet``. The
local file is planned first (its log keys become known before any window is judged: a
window's rows of such a key are then merged), then each executor file as a whole: only its
key, ``__op`` and ``__pos`` columns are read here, so its rows still never pass through the
engine, and it is appended as it is when every row of it is an append, merged otherwise."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from snapshotter.sinks.spark.appends import Key, KnownKeys
from snapshotter.sinks.spark.staging import StagedTable
from snapshotter.sinks.spark.types import OP, POS

# The parts written apart (Spark skips files whose names start with "." or "_", even when
# named, so these do not).
SPLIT = "split-"
# The executors' files in a part staged as a directory (``staging._take_files``).
EXECUTOR_FILES = "part-w*.parquet"
LOCAL_FILE = "part-local.parquet"


def is_split(path: Path) -> bool:
    """Whether ``path`` was written by ``split_appends`` (the caller removes it once landed)."""
    return path.name.startswith(SPLIT)


class _Splitter:
    """The files of one landing, sorted into appends and merges as ``known`` allows."""

    def __init__(self, known: KnownKeys | None) -> None:
        self.known = known
        self.appended: list[Path] = []
        self.merged: list[Path] = []

    def file(self, seq: int, path: Path, apart: Path, current: Path | None = None) -> None:
        """A file of rows that passed through the engine: its appends written apart when
        it holds others too, as ``apart`` + ``-appends.parquet`` / ``-merged.parquet``;
        appended whole, as ``current`` (the stager's copy without before-images) if given."""
        if self.known is None:
            self.merged.append(path)
            return
        # Keys, operations and positions decide; the other columns are read only when
        # the file is split.
        plan = self.known.plan(pq.read_table(path, columns=[*self.known.keys, OP, POS]))
        if plan is None:
            self.known = None
            self.merged.append(path)
            return
        if plan.appended == plan.rows:
            self.appended.append(current or path)
        elif plan.appended:
            rows = pq.read_table(path)
            others = np.ones(rows.num_rows, dtype=bool)
            others[plan.appends.to_numpy()] = False
            target = apart.with_name(f"{apart.name}-appends.parquet")
            pq.write_table(rows.take(plan.appends), target)
            self.appended.append(target)
            target = apart.with_name(f"{apart.name}-merged.parquet")
            pq.write_table(rows.filter(pa.array(others)), target)
            self.merged.append(target)
        else:
            self.merged.append(path)
        self._record(plan.ranges, seq)

    def executor_file(self, seq: int, path: Path) -> None:
        """A file the executors wrote: appended whole, or merged whole."""
        if self.known is None:
            self.merged.append(path)
            return
        rows = pq.read_table(path, columns=[*self.known.keys, OP, POS])
        plan = self.known.plan(rows)
        if plan is None:
            self.known = None
            self.merged.append(path)
            return
        (self.appended if plan.appended == rows.num_rows else self.merged).append(path)
        self._record(plan.ranges, seq)

    def _record(self, ranges: Sequence[tuple[Key, Key]], seq: int) -> None:
        if self.known is not None and not self.known.record(ranges, seq):
            self.known = None


def split_appends(
    parts: Sequence[tuple[int, StagedTable]], known: KnownKeys | None, appended_through: int
) -> tuple[list[Path], list[Path], bool]:
    """The files to append and to merge, and whether ``known`` may be used for the next
    landing. Without ``known`` everything is merged; a part of a batch up to
    ``appended_through`` (appended by a landing that then failed, retried now) too: merging
    is idempotent, appending twice is not."""
    splitter = _Splitter(known)
    for seq, part in parts:
        if seq <= appended_through:
            splitter.known = None
        # Written beside the part, never into a directory part (read whole elsewhere).
        apart = part.file.parent / f"{SPLIT}{part.file.stem}"
        if not part.file.is_dir():
            splitter.file(seq, part.file, apart, part.current_file)
            continue
        local = part.file / LOCAL_FILE
        if local.exists():
            splitter.file(seq, local, apart)
        for path in sorted(part.file.glob(EXECUTOR_FILES)):
            splitter.executor_file(seq, path)
    return splitter.appended, splitter.merged, splitter.known is not None

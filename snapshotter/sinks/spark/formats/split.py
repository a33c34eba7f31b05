"""Which staged files land as appends and which through a merge (the Delta and Iceberg
formats): with ``appends.KnownKeys`` of a table this process started, each staged part's
READ rows of keys never landed are appended, the rest merged; a part with both is written
apart beside the staged file (pyarrow), so Spark reads each set whole."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from snapshotter.sinks.spark.appends import KnownKeys
from snapshotter.sinks.spark.staging import StagedTable

# The parts written apart (Spark skips files whose names start with "." or "_", even when
# named, so these do not).
SPLIT = "split-"


def is_split(path: Path) -> bool:
    """Whether ``path`` was written by ``split_appends`` (the caller removes it once landed)."""
    return path.name.startswith(SPLIT)


def split_appends(
    parts: Sequence[tuple[int, StagedTable]], known: KnownKeys | None, appended_through: int
) -> tuple[list[Path], list[Path], bool]:
    """The files to append and to merge, and whether ``known`` may be used for the next
    landing. Without ``known`` everything is merged; a part of a batch up to
    ``appended_through`` (appended by a landing that then failed, retried now) too: merging
    is idempotent, appending twice is not."""
    appended: list[Path] = []
    merged: list[Path] = []
    for seq, part in parts:
        if known is None or part.file.is_dir() or seq <= appended_through:
            known = None
            merged.append(part.file)
            continue
        rows = pq.read_table(part.file)
        plan = known.plan(rows)
        if plan is None:
            known = None
            merged.append(part.file)
            continue
        if plan.appended == rows.num_rows:
            appended.append(part.file)
        elif plan.appended:
            others = np.ones(rows.num_rows, dtype=bool)
            others[plan.appends.to_numpy()] = False
            target = part.file.parent / f"{SPLIT}{part.file.stem}-appends.parquet"
            pq.write_table(rows.take(plan.appends), target)
            appended.append(target)
            target = part.file.parent / f"{SPLIT}{part.file.stem}-merged.parquet"
            pq.write_table(rows.filter(pa.array(others)), target)
            merged.append(target)
        else:
            merged.append(part.file)
        if not known.record(plan.ranges, seq):
            known = None
    return appended, merged, known is not None

"""``merge.key_bounds``: the per-key-column range a MERGE's target side is narrowed to (so
Delta and Iceberg skip files by their statistics), only for types whose literal compares as
the column does, and never narrower than the batch's keys."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from snapshotter.sinks.spark.formats.merge import (
    SPLIT_TARGET_BYTES,
    key_bounds,
    split_worthwhile,
)


def _file(path: Path, rows: dict[str, pa.Array]) -> Path:
    pq.write_table(pa.table(rows), path)
    return path


def test_bounds_span_every_file_and_skip_nulls_and_unsafe_types(tmp_path: Path) -> None:
    ts = pa.array([datetime(2024, 1, 1, tzinfo=UTC), None], pa.timestamp("us", tz="UTC"))
    first = _file(
        tmp_path / "a.parquet",
        {"tenant": pa.array([3, None], pa.int32()), "code": pa.array(["m", "b"]), "at": ts},
    )
    second = _file(
        tmp_path / "b.parquet",
        {"tenant": pa.array([7, 1], pa.int32()), "code": pa.array(["z", "c"]), "at": ts},
    )
    bounds = key_bounds([first, second], ["tenant", "code", "at"])
    assert bounds == {"tenant": (1, 7), "code": ("b", "z")}  # no timestamp literal


def test_no_bounds_without_files_or_for_a_directory_part(tmp_path: Path) -> None:
    assert key_bounds([], ["id"]) == {}
    (tmp_path / "part").mkdir()
    assert key_bounds([tmp_path / "part"], ["id"]) == {}


def test_changes_spread_thinly_are_split_and_a_narrow_range_is_one_merge(tmp_path: Path) -> None:
    staged = tmp_path / "batch.parquet"
    pq.write_table(pa.table({"tenant": [1, 5, 10], "id": [3, 500_000, 999_999]}), staged)
    keys = ["tenant", "id"]
    spread = key_bounds([staged], keys)  # 10 tenants x ~1M ids for 3 changes
    large = SPLIT_TARGET_BYTES
    assert split_worthwhile([staged], keys, spread, large)
    assert not split_worthwhile([staged], keys, {"tenant": (1, 1), "id": (1, 40)}, large)
    assert split_worthwhile([staged], ["name"], {}, large)  # no integer key: counted as spread
    assert not split_worthwhile([], keys, spread, large)


def test_a_small_or_unknown_target_is_one_merge_however_spread_the_changes(
    tmp_path: Path,
) -> None:
    """A small table is shuffled cheaply by one MERGE: the split's extra jobs and second
    commit would make every landing of a random writer's changes slower."""
    staged = tmp_path / "batch.parquet"
    pq.write_table(pa.table({"id": [3, 500_000, 999_999]}), staged)
    spread = key_bounds([staged], ["id"])
    assert split_worthwhile([staged], ["id"], spread, SPLIT_TARGET_BYTES)
    assert not split_worthwhile([staged], ["id"], spread, SPLIT_TARGET_BYTES - 1)
    assert not split_worthwhile([staged], ["id"], spread, 0)  # no snapshot yet
    assert not split_worthwhile([staged], ["id"], spread, None)  # size not recorded

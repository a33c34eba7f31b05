"""``formats.split.split_appends`` with parts staged as directories (``[snapshot]
executors``): an executor file of READ rows of keys never landed is appended whole, as the
executors wrote it; one holding a key the local rows (log rows) or an earlier window landed
is merged whole; the local file is planned first and split as a file part is; nothing is
written into the directory (it is read whole by the changelog's landing). Pure (pyarrow)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from signals.names import TableId
from snapshotter.sinks.spark.appends import KnownKeys
from snapshotter.sinks.spark.formats.split import split_appends
from snapshotter.sinks.spark.staging import StagedTable
from tests.unit.test_landing_appends import Segment, part

TABLE = TableId("public", "items")


def staged_dir(where: Path, local: list[Segment], windows: list[list[Segment]]) -> StagedTable:
    """A part staged as ``_take_files`` stages one: the local rows, then executor files."""
    where.mkdir(parents=True)
    if local:
        pq.write_table(part(local), where / "part-local.parquet")
    for n, window in enumerate(windows):
        pq.write_table(part(window), where / f"part-w{n:05d}.parquet")
    return StagedTable(TABLE, ("k0",), where, 0, None, ())


def names(paths: list[Path]) -> list[str]:
    return [f"{p.parent.name}/{p.name}" for p in paths]


def test_executor_files_of_new_keys_are_appended_whole(tmp_path: Path) -> None:
    d = staged_dir(
        tmp_path / "b1" / "t0",
        [(1, [(5,)], "c")],  # a log insert of key 5, before the windows closed
        [
            [(2, [(k,) for k in range(0, 10)], "r")],  # holds key 5: merged whole
            [(3, [(k,) for k in range(10, 20)], "r")],  # new keys: appended as is
        ],
    )
    appended, merged, usable = split_appends([(1, d)], KnownKeys(["k0"]), 0)
    assert names(appended) == ["t0/part-w00001.parquet"]
    assert names(merged) == ["t0/part-local.parquet", "t0/part-w00000.parquet"]
    assert usable
    assert sorted(p.name for p in d.file.iterdir()) == [
        "part-local.parquet",
        "part-w00000.parquet",
        "part-w00001.parquet",
    ]


def test_a_window_over_keys_an_earlier_batch_landed_is_merged(tmp_path: Path) -> None:
    known = KnownKeys(["k0"])
    first = staged_dir(tmp_path / "b1" / "t0", [], [[(2, [(k,) for k in range(0, 10)], "r")]])
    again = staged_dir(tmp_path / "b2" / "t0", [], [[(4, [(k,) for k in range(8, 12)], "r")]])
    appended, merged, usable = split_appends([(1, first), (2, again)], known, 0)
    assert names(appended) == ["t0/part-w00000.parquet"]
    assert [p.parent.parent.name for p in appended] == ["b1"]
    assert [p.parent.parent.name for p in merged] == ["b2"]
    assert usable


def test_a_local_file_with_both_is_split_beside_the_directory(tmp_path: Path) -> None:
    d = staged_dir(
        tmp_path / "b1" / "t0",
        [(1, [(k,) for k in range(0, 4)], "r"), (2, [(1,)], "u")],
        [[(3, [(k,) for k in range(10, 14)], "r")]],
    )
    appended, merged, _ = split_appends([(1, d)], KnownKeys(["k0"]), 0)
    # Apart, beside the directory: a reader of the directory never reads a row twice.
    assert [p.parent for p in (*appended, *merged) if p.name.startswith("split-")] == [
        tmp_path / "b1",
        tmp_path / "b1",
    ]
    assert names(appended) == ["b1/split-t0-appends.parquet", "t0/part-w00000.parquet"]
    assert names(merged) == ["b1/split-t0-merged.parquet"]
    assert pq.read_table(appended[0]).num_rows == 4
    assert pq.read_table(merged[0]).column("k0").to_pylist() == [1]


def test_nothing_is_appended_without_known_keys_or_when_retried(tmp_path: Path) -> None:
    d = staged_dir(tmp_path / "b1" / "t0", [], [[(2, [(k,) for k in range(0, 10)], "r")]])
    for known, appended_through in ((None, 0), (KnownKeys(["k0"]), 1)):
        appended, merged, usable = split_appends([(1, d)], known, appended_through)
        assert appended == []
        assert names(merged) == ["t0/part-w00000.parquet"]
        assert not usable

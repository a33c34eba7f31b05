"""The files of a Parquet table's ``current/`` (snapshotter.sinks.spark.bases), on a local
filesystem through pyarrow: which base each file belongs to, publishing a compaction's
output, appends, and the strays a crash leaves (issue 26)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from snapshotter.sinks.spark import bases

FS = pafs.LocalFileSystem()


def _write(path: Path, ids: list[int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), path)


def test_a_published_base_lies_flat_in_current_and_every_plain_reader_reads_it(
    tmp_path: Path,
) -> None:
    current = tmp_path / "current"
    name = bases.base_name_for(7)
    assert name == "base-000000000007"
    written = current / f"{bases.WRITING}{name}"
    _write(written / "part-00000-a.snappy.parquet", [1, 2])
    _write(written / "part-00001-b.snappy.parquet", [3])
    (written / "_SUCCESS").write_text("")
    (written / ".part-00000-a.snappy.parquet.crc").write_text("")
    bases.publish(FS, str(current), name)
    assert sorted(p.name for p in current.iterdir()) == [
        f"{name}.part-00000-a.snappy.parquet",
        f"{name}.part-00001-b.snappy.parquet",
    ]
    bases.append(FS, str(current), name, 9, pa.table({"id": pa.array([4], pa.int64())}))
    assert bases.rows(FS, str(current), name) == 4
    assert len(bases.files(FS, str(current), name)) == 3
    assert sorted(pq.read_table(current).column("id").to_pylist()) == [1, 2, 3, 4]
    assert pq.read_table(current).column_names == ["id"]  # no partition column
    assert bases.drop_appended(FS, str(current), name, 9) == 1
    assert bases.rows(FS, str(current), name) == 3
    assert bases.strays(FS, str(current), name) == []


def test_what_a_crash_leaves_is_a_stray_of_another_base_and_goes(tmp_path: Path) -> None:
    current = tmp_path / "current"
    named, new = bases.base_name_for(7), bases.base_name_for(9) + "-ab12cd34"
    _write(current / f"{named}.part-0.parquet", [1, 2])
    _write(current / f"{named}.b000000000008-x.parquet", [3])
    _write(current / f"{new}.part-0.parquet", [1, 2, 3])  # published, never named
    _write(current / f"{bases.WRITING}{bases.base_name_for(10)}" / "part-0.parquet", [1])
    _write(current / "__base=000000000005" / "part-0.parquet", [1])  # an older layout's
    _write(current / f".{new}.b000000000011-y.parquet.tmp", [4])  # an append not renamed
    _write(current / "notes.parquet", [9])  # not a base's: left alone
    assert bases.strays(FS, str(current), named) == sorted(
        ["__base=000000000005", new, bases.base_name_for(10)]
    )
    removed = bases.remove_strays(FS, str(current), named, table="t", crashed=True)
    assert removed == sorted(["__base=000000000005", new, bases.base_name_for(10)])
    assert sorted(p.name for p in current.iterdir()) == sorted(
        [f"{named}.part-0.parquet", f"{named}.b000000000008-x.parquet", "notes.parquet"]
    )


def test_a_base_of_an_older_layout_is_a_directory_still_read_and_appended_to(
    tmp_path: Path,
) -> None:
    current = tmp_path / "current"
    legacy = "__base=000000000003"
    assert bases.is_legacy(legacy) and bases.is_legacy(bases.legacy_base_dir(3))
    assert not bases.is_legacy(bases.base_name_for(3))
    _write(current / legacy / "part-0.parquet", [1, 2])
    bases.append(FS, str(current), legacy, 4, pa.table({"id": pa.array([5], pa.int64())}))
    assert bases.rows(FS, str(current), legacy) == 3
    assert bases.drop_appended(FS, str(current), legacy, 4) == 1
    assert bases.strays(FS, str(current), legacy) == []

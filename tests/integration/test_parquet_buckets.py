"""Issue 27: Parquet ``current/`` is bucketed by a hash of the key, and a compaction rewrites
only the buckets whose keys changed; a plain reader (``pyarrow.dataset`` with its defaults)
reading ``current/`` while batches land and compactions run never reads a key twice nor an
older version of a row after a newer one. Real Spark, files read by pyarrow."""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from snapshotter.sinks.spark.formats import parquet
from snapshotter.sinks.spark.formats.parquet import bucket_file_name, bucket_of, file_unit
from tests.integration.test_landing_appends import TABLE, Lake, chunk, log

pytestmark = pytest.mark.integration

BUCKETS = 4


def lake_of(tmp_path: Path) -> Lake:
    lake = Lake(tmp_path)
    lake.lander.buckets = BUCKETS
    return lake


def current(lake: Lake) -> Path:
    return Path(lake.lander.table_path(TABLE)) / "current"


def plain(lake: Lake) -> dict[int, str]:
    """``current/`` as ``pyarrow.dataset`` reads it with its defaults, keys checked once."""
    rows = ds.dataset(str(current(lake)), format="parquet").to_table(["id", "name"]).to_pylist()
    state = {r["id"]: r["name"] for r in rows}
    assert len(state) == len(rows), "a key twice in current/"
    return state


def files(lake: Lake) -> dict[str, tuple[int, int]]:
    """The files of current/: name -> (inode, mtime)."""
    return {
        f.name: (f.stat().st_ino, f.stat().st_mtime_ns)
        for f in current(lake).iterdir()
        if not f.name.startswith((".", "_"))
    }


def test_a_compaction_rewrites_only_the_buckets_its_keys_fall_in(tmp_path: Path) -> None:
    lake = lake_of(tmp_path)
    lake.lander.land([lake.stage(1, chunk(range(200), 100))])  # appended, not bucketed yet
    lake.lander.land([lake.stage(2, [log("u", 1, 200), log("d", 2, 201)])])
    lake.lander.compact(TABLE)  # the first bucketing: every bucket written
    meta = lake.lander.meta(TABLE)
    assert meta is not None and meta.base_dir is not None
    assert (meta.buckets, meta.pending, meta.tail_rows, meta.base_rows) == (BUCKETS, None, 0, 199)
    name = meta.base_dir
    assert sorted(files(lake)) == [bucket_file_name(name, i) for i in range(BUCKETS)]
    expected = {k: f"r{k}" for k in range(200)} | {1: "log1"}
    del expected[2]
    assert plain(lake) == expected
    recorded = json.loads((Path(lake.lander.table_path(TABLE)) / "_snapshotter.json").read_text())
    assert recorded["buckets"] == BUCKETS

    # Two keys change: their buckets (by Spark's hash, the one the lander uses) are rewritten,
    # the others neither read nor written.
    changed = [5, 7]
    keys = lake.spark.createDataFrame([(k,) for k in changed], "id bigint")
    touched = {r[0] for r in keys.select(bucket_of(["id"], BUCKETS)).collect()}
    before = files(lake)
    lake.lander.land([lake.stage(3, [log("u", 5, 300), log("d", 7, 301)])])
    lake.lander.compact(TABLE)
    after = files(lake)
    assert sorted(after) == sorted(before)  # the same names: replaced in place
    for i in range(BUCKETS):
        f = bucket_file_name(name, i)
        if i in touched:
            assert after[f][0] != before[f][0], f"bucket {i} was not rewritten"
        else:
            assert after[f] == before[f], f"bucket {i} has no changed key but was rewritten"
    expected[5] = "log5"
    del expected[7]
    assert plain(lake) == expected
    assert lake.state() == expected
    meta = lake.lander.meta(TABLE)
    assert meta is not None and (meta.base, meta.tail_rows, meta.base_rows) == (3, 0, 198)


def _units(lake: Lake, name: str) -> dict[tuple[int, int], tuple[int, int]]:
    """The bucket part files of current/: (bucket, part) -> (inode, mtime)."""
    found = {}
    for file_name, stat in files(lake).items():
        unit = file_unit(name, file_name)
        assert unit is not None, f"{file_name}: not a part file of {name}"
        found[unit] = stat
    return found


def test_a_compaction_rewrites_only_the_parts_whose_key_range_holds_a_changed_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bucket written whole by pyarrow (a snapshot's files, in key order) is parts of
    PART_ROWS rows, each a range of keys; a change rewrites, per touched bucket, the parts
    whose footer range holds a changed key and the last part (new keys go there), and leaves
    the others as they are; a last part that outgrows PART_ROWS goes on in a new part."""
    monkeypatch.setattr(parquet, "PART_ROWS", 10)
    lake = Lake(tmp_path)
    lake.lander.buckets = 1
    lake.lander.land([lake.stage(1, chunk(range(100), 100))])  # appended, not bucketed yet
    lake.lander.land([lake.stage(2, [log("u", 0, 200)])])
    lake.lander.compact(TABLE)  # the first bucketing: parts of 10 keys, in key order
    meta = lake.lander.meta(TABLE)
    assert meta is not None and meta.base_dir is not None
    name = meta.base_dir
    before = _units(lake, name)
    assert sorted(before) == [(0, p) for p in range(10)]
    ranges = {}
    for unit in before:
        ids = pq.read_table(current(lake) / bucket_file_name(name, *unit)).column("id")
        ranges[unit] = (min(ids.to_pylist()), max(ids.to_pylist()))
    # Keys 41 and 47 are in one part; 99 in the last (whose range is every key: key 0's new
    # row went there, after the parts of READ rows); 100 and 101 are new (the last part).
    [middle] = [u for u, (lo, hi) in ranges.items() if lo <= 41 <= hi and u != (0, 9)]
    assert ranges[middle][0] <= 47 <= ranges[middle][1]
    events = [log("u", 41, 300), log("d", 47, 301), log("u", 99, 302)]
    events += [log("c", 100, 303), log("c", 101, 304)]
    lake.lander.land([lake.stage(3, events)])
    lake.lander.compact(TABLE)
    after = _units(lake, name)
    rewritten = {u for u in before if after[u][0] != before[u][0]}
    assert rewritten == {middle, (0, 9)}, f"rewritten: {sorted(rewritten)}"
    assert set(after) - set(before) == {(0, 10)}  # the last part outgrew 10 rows
    expected = {k: f"r{k}" for k in range(100)} | {0: "log0", 41: "log41", 99: "log99"}
    expected |= {100: "log100", 101: "log101"}
    del expected[47]
    assert plain(lake) == expected
    assert lake.state() == expected
    middle_ids = pq.read_table(current(lake) / bucket_file_name(name, *middle)).column("id")
    assert 41 in middle_ids.to_pylist(), "a changed key left the part it was in"
    meta = lake.lander.meta(TABLE)
    assert meta is not None and (meta.base_rows, meta.pending) == (101, None)


@pytest.mark.parametrize("part_rows", [None, 8])
def test_a_reader_during_landings_and_compactions_never_reads_a_key_twice_or_back_in_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, part_rows: int | None
) -> None:
    if part_rows is not None:  # buckets of many parts: parts rewritten, new parts added
        monkeypatch.setattr(parquet, "PART_ROWS", part_rows)
    lake = lake_of(tmp_path)
    keys = range(300)
    lake.lander.land([lake.stage(1, chunk(keys, 100))])
    path = str(current(lake))
    stop = threading.Event()
    problems: list[str] = []
    reads = [0]
    newest: dict[int, str] = {}  # per key, the newest __pos read so far

    def reader() -> None:
        while not stop.is_set():
            try:
                rows = ds.dataset(path, format="parquet").to_table(["id", "__pos"]).to_pylist()
            except (OSError, ValueError):
                continue  # a file listed, then replaced or superseded before it was opened
            reads[0] += 1
            seen: set[int] = set()
            for r in rows:
                key, pos = r["id"], r["__pos"]
                if key in seen:
                    problems.append(f"read {reads[0]}: key {key} twice")
                seen.add(key)
                if pos < newest.get(key, ""):
                    problems.append(f"read {reads[0]}: key {key} at {pos} after {newest[key]}")
                newest[key] = max(pos, newest.get(key, ""))

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    rng = random.Random(27)
    expected = {k: f"r{k}" for k in keys}
    pos = 1000
    try:
        for seq in range(2, 9):
            events = []
            for key in rng.sample(list(keys), 15):
                pos += 1
                if key in expected and rng.random() < 0.3:
                    events.append(log("d", key, pos))
                    del expected[key]
                else:
                    events.append(log("u" if key in expected else "c", key, pos, f"s{seq}-"))
                    expected[key] = f"s{seq}-{key}"
            lake.lander.land([lake.stage(seq, events)])
            lake.lander.compact(TABLE)
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not problems, problems[:5]
    assert reads[0] >= 3, f"the reader read {reads[0]} times"
    assert plain(lake) == expected


def test_a_table_of_the_previous_layout_is_read_then_rewritten_in_this_one(
    tmp_path: Path,
) -> None:
    """The layout before issue 27: the changelog as partition directories ``__batch=N/``
    (which pyarrow.dataset does not read: a name starting with ``_``) and a flat, unbucketed
    base. A lander that only reads reads it; one that writes rewrites the changelog one file
    per batch at take-over, and the next compaction buckets the base."""
    import pyarrow.parquet as pq

    from snapshotter.sinks.spark.lander import Lander

    lake = lake_of(tmp_path)
    lake.lander.land([lake.stage(1, chunk(range(50), 100))])
    lake.lander.land([lake.stage(2, [log("u", 3, 200), log("d", 4, 201)])])
    changelog = Path(lake.lander.table_path(TABLE)) / "changelog"
    for seq in (1, 2):  # back to the layout before: the batch in the directory's name
        name = changelog / f"batch-{seq:012d}.parquet"
        rows = pq.read_table(name)
        (changelog / f"__batch={seq}").mkdir()
        pq.write_table(
            rows.drop_columns(["__batch"]), changelog / f"__batch={seq}" / "part-0.parquet"
        )
        name.unlink()
    assert ds.dataset(str(changelog), format="parquet").count_rows() == 0
    expected = {k: f"r{k}" for k in range(50)} | {3: "log3"}
    del expected[4]

    reader = Lander(lake.spark, lake.lander.root, "parquet")  # reads, writes nothing
    old = reader.changelog(TABLE)
    assert old is not None and old.count() == 52
    assert old.schema["__batch"].dataType.simpleString() == "bigint"
    state = reader.current_state(TABLE)
    assert state is not None
    assert {r["id"]: r["name"] for r in state.toArrow().to_pylist()} == expected

    writer = Lander(lake.spark, lake.lander.root, "parquet", buckets=BUCKETS)
    assert writer.take_over() == [TABLE]
    assert sorted(p.name for p in changelog.iterdir()) == [
        "batch-000000000001.parquet",
        "batch-000000000002.parquet",
    ]
    events = ds.dataset(str(changelog), format="parquet").to_table()
    assert events.num_rows == 52 and events.schema.field("__batch").type == pa.int64()
    assert writer.compact_idle() == [TABLE]
    meta = writer.meta(TABLE)
    assert meta is not None and meta.buckets == BUCKETS and meta.base_dir is not None
    assert sorted(files(lake)) == [bucket_file_name(meta.base_dir, i) for i in range(BUCKETS)]
    assert plain(lake) == expected


def test_a_bucket_of_parts_rewritten_whole_never_shows_a_key_twice_between_renames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full compaction of a bucketed base with READ rows appended since rewrites each
    bucket whole, its rows spread over parts numbered afresh: a plain reader after each of
    finish's renames never reads a key twice (the old parts go before any new one is
    renamed in), and the end state is the table's."""
    monkeypatch.setattr(parquet, "PART_ROWS", 10)
    lake = Lake(tmp_path)
    lake.lander.buckets = 1
    lake.lander.land([lake.stage(1, chunk(range(100), 100))])
    lake.lander.land([lake.stage(2, [log("u", 0, 200)])])
    lake.lander.compact(TABLE)  # parts of 10 keys
    meta = lake.lander.meta(TABLE)
    assert meta is not None and meta.base_dir is not None
    second = pq.read_table(current(lake) / bucket_file_name(meta.base_dir, 0, 1))
    shrunk = sorted(second.column("id").to_pylist())[:8]
    lake.lander.land([lake.stage(3, [log("d", k, 300 + i) for i, k in enumerate(shrunk)])])
    lake.lander.compact(TABLE)  # part 1 keeps 2 rows: parts no longer of 10 rows each
    lake.lander.land([lake.stage(4, chunk(range(100, 101), 400))])  # READ rows appended
    lake.lander.land([lake.stage(5, [log("u", 99, 500)])])
    twice: list[tuple[str, int]] = []
    real_finish = parquet.finish

    class Watched:
        """The lander's filesystem, a plain read of current/ after each rename."""

        def __init__(self, fs: Any) -> None:
            self._fs = fs

        def __getattr__(self, name: str) -> Any:
            return getattr(self._fs, name)

        def move(self, source: str, target: str) -> None:
            self._fs.move(source, target)
            ids = ds.dataset(str(current(lake)), format="parquet").to_table(["id"])
            keys = ids.column("id").to_pylist()
            twice.append((target.rsplit("/", 1)[-1], len(keys) - len(set(keys))))

    def finish(lander: Any, table: Any, meta: Any) -> None:
        real, lander._fs = lander._fs, Watched(lander._fs)
        try:
            real_finish(lander, table, meta)
        finally:
            lander._fs = real

    monkeypatch.setattr(parquet, "finish", finish)
    lake.lander.compact(TABLE)  # full: READ rows were appended
    renamed = [name for name, _ in twice if ".bucket-" in name]
    assert len(renamed) >= 5, twice  # the bucket's parts, renamed one by one
    assert [(n, d) for n, d in twice if d] == [], twice
    expected = {k: f"r{k}" for k in range(101)} | {0: "log0", 99: "log99"}
    for k in shrunk:
        del expected[k]
    assert plain(lake) == expected

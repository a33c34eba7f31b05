"""Which part files of a bucket a compaction rewrites (``parquet_fold.touched_parts``): every
part that holds one of the bucket's changed keys, whatever the key's types, never fewer (a
key left out would be written again into the last part: in two files), and the bucket's last
part always (new keys go there). Property-tested against an oracle that opens every part;
parts written by pyarrow as the compaction writes them (no Spark)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from snapshotter.sinks.spark.formats.parquet import BUCKET
from snapshotter.sinks.spark.formats.parquet_fold import touched_parts

KEYS = ["k1", "k2", "k3"]
SCHEMA = pa.schema(
    [
        ("k1", pa.int64()),
        ("k2", pa.string()),
        ("k3", pa.timestamp("us", tz="UTC")),
        ("d", pa.decimal128(12, 2)),
    ]
)
EPOCH = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)

key = st.tuples(
    st.integers(-(2**40), 2**40),
    st.text("abcé ", max_size=4),
    st.integers(0, 10**6).map(lambda s: EPOCH + dt.timedelta(seconds=s)),
)


def _write(path: Path, keys: list[tuple[int, str, dt.datetime]], statistics: bool) -> None:
    rows = pa.table(
        {
            "k1": [k[0] for k in keys],
            "k2": [k[1] for k in keys],
            "k3": [k[2] for k in keys],
            "d": [Decimal("1.50")] * len(keys),
        },
        schema=SCHEMA,
    )
    pq.write_table(rows, path, row_group_size=3, write_statistics=statistics)


@settings(max_examples=60, deadline=None)
@given(
    parts=st.lists(st.lists(key, max_size=8, unique=True), min_size=1, max_size=5),
    others=st.lists(key, max_size=6),
    no_statistics=st.sets(st.integers(0, 4)),
    picks=st.lists(st.integers(0, 1000), max_size=6),
)
def test_every_part_holding_a_changed_key_is_rewritten_with_the_last(
    tmp_path_factory: object,
    parts: list[list[tuple[int, str, dt.datetime]]],
    others: list[tuple[int, str, dt.datetime]],
    no_statistics: set[int],
    picks: list[int],
) -> None:
    directory = Path(tmp_path_factory.mktemp("parts"))  # type: ignore[attr-defined]
    # A key is in one part only, as in a bucket.
    seen: set[tuple[int, str, dt.datetime]] = set()
    listing: dict[int, str] = {}
    for number, keys in enumerate(parts):
        mine = [k for k in keys if k not in seen]
        seen.update(mine)
        path = directory / f"p{number}.parquet"
        _write(path, mine, statistics=number not in no_statistics)
        listing[number] = str(path)
    held = sorted(seen)
    changed_keys = [held[p % len(held)] for p in picks] if held else []
    changed_keys += others  # keys no part holds: new ones
    changed = pa.table(
        {
            "k1": pa.array([k[0] for k in changed_keys], pa.int64()),
            "k2": pa.array([k[1] for k in changed_keys], pa.string()),
            # The tail's keys come from Spark: timestamps of another unit and zone.
            "k3": pa.array([k[2] for k in changed_keys], pa.timestamp("ns")),
            BUCKET: pa.array([3] * len(changed_keys), pa.int64()),
        }
    )
    picked = touched_parts(pafs.LocalFileSystem(), {3: listing}, [3], KEYS, changed)
    assert all(source.bucket == 3 and source.path == listing[source.part] for source in picked)
    got = {source.part for source in picked}
    # The oracle: open every part, look for every changed key.
    wanted = {max(listing)}
    for number, part_path in listing.items():
        rows = pq.read_table(part_path).select(KEYS).to_pylist()
        keys_in = {(r["k1"], r["k2"], r["k3"]) for r in rows}
        if keys_in & set(changed_keys):
            wanted.add(number)
    assert wanted <= got, f"parts holding changed keys left out: {sorted(wanted - got)}"
    # And no part is read whose footer rules every changed key out.
    for number in got - wanted:
        if number in no_statistics:
            continue  # no statistics: it may hold any key
        table = pq.read_table(listing[number])
        if table.num_rows == 0:
            raise AssertionError(f"part {number} has no rows, yet it was picked")
        inside = pa.array([True] * len(changed_keys), pa.bool_())
        for name in KEYS:
            column = changed.column(name).cast(SCHEMA.field(name).type)
            low, high = pc.min_max(table.column(name)).values()
            inside = pc.and_(
                inside, pc.and_(pc.greater_equal(column, low), pc.less_equal(column, high))
            )
        assert pc.any(inside).as_py(), f"part {number}: no changed key in its footer's range"


def test_a_part_holding_a_nan_key_is_picked_for_it(tmp_path: Path) -> None:
    """Parquet statistics leave NaN out of a float column's range, yet NaN is a key (a
    PostgreSQL float8 key may hold it): the part holding it must be rewritten, or its new
    row would go to the last part as a new key, the old one staying."""
    first, last = tmp_path / "p0.parquet", tmp_path / "p1.parquet"
    pq.write_table(pa.table({"k": pa.array([1.0, float("nan"), 3.0])}), first)
    pq.write_table(pa.table({"k": pa.array([10.0, 11.0])}), last)
    changed = pa.table(
        {"k": pa.array([float("nan")]), BUCKET: pa.array([0], pa.int64())},
    )
    listing = {0: {0: str(first), 1: str(last)}}
    picked = touched_parts(pafs.LocalFileSystem(), listing, [0], ["k"], changed)
    assert {source.part for source in picked} == {0, 1}

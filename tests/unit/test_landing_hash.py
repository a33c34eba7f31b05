"""The verify hash of landed rows (``snapshotter.verify.row_hash.hash_rows``): one function on
both sides, so equal values must hash alike whatever their Arrow representation, and any
difference in a value must show."""

from __future__ import annotations

import struct
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from snapshotter.verify import row_hash
from snapshotter.verify.row_hash import BUCKETS, bucket_of, hash_rows

ROWS: dict[str, list[Any]] = {
    "id": [1, 2, 3, -4],
    "name": ["plain", "ünïcødé", "", None],
    "amount": [Decimal("1.50"), Decimal("-0.01"), None, Decimal("12345678.99")],
    "at": [
        datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC),
        datetime(1999, 12, 31, 18, 29, 59, tzinfo=UTC),
        None,
        datetime(1970, 1, 1, tzinfo=UTC),
    ],
    "naive": [datetime(2024, 1, 2, 3, 4, 5), None, datetime(1, 1, 1), datetime(9999, 12, 31)],
    "blob": [b"\x00\xff", b"", None, b"x" * 1000],
    "f": [0.1, float("nan"), float("-inf"), -0.0],
    "flag": [True, False, None, True],
    "d": [date(2024, 2, 29), date(1, 1, 1), None, date(1970, 1, 1)],
    "tags": [["a", "b"], [], None, ["a,b"]],
}

TYPES: dict[str, pa.DataType] = {
    "id": pa.int64(),
    "name": pa.string(),
    "amount": pa.decimal128(12, 2),
    "at": pa.timestamp("us", tz="UTC"),
    "naive": pa.timestamp("us"),
    "blob": pa.binary(),
    "f": pa.float64(),
    "flag": pa.bool_(),
    "d": pa.date32(),
    "tags": pa.list_(pa.string()),
}


def table(rows: dict[str, list[Any]] | None = None, **types: pa.DataType) -> pa.Table:
    rows = rows or ROWS
    return pa.table({n: pa.array(v, type=types.get(n, TYPES[n])) for n, v in rows.items()})


def hashes(
    data: pa.Table | pa.RecordBatch, keys: tuple[str, ...] = ("id",)
) -> tuple[list[int], list[int]]:
    key, row = hash_rows(data, keys)
    assert key.type == pa.int64() and row.type == pa.int64()
    return key.to_pylist(), row.to_pylist()


def with_value(column: str, index: int, value: Any) -> dict[str, list[Any]]:
    rows = {n: list(v) for n, v in ROWS.items()}
    rows[column][index] = value
    return rows


BASE = hashes(table())


def test_hashes_are_distinct_per_row_and_bucket_into_range() -> None:
    key, row = BASE
    assert len(set(key)) == len(key) and len(set(row)) == len(row)
    buckets = bucket_of(pa.array(key, pa.int64())).to_pylist()
    assert all(0 <= b < BUCKETS for b in buckets)


def test_chunked_sliced_and_batched_tables_hash_alike() -> None:
    whole = table()
    chunked = pa.concat_tables([whole.slice(0, 1), whole.slice(1, 2), whole.slice(3)])
    assert chunked.column("name").num_chunks == 3
    assert hashes(chunked) == BASE
    batch = whole.combine_chunks().to_batches()[0]
    assert hashes(batch) == BASE
    # A slice hashes as the same rows built fresh (offsets into shared buffers).
    sliced = whole.slice(1, 2)
    fresh = pa.table({n: pa.array(sliced.column(n).to_pylist(), TYPES[n]) for n in ROWS})
    assert hashes(sliced) == hashes(fresh) == (BASE[0][1:3], BASE[1][1:3])


@pytest.mark.parametrize(
    "column, other_type",
    [
        ("id", pa.int32()),
        ("id", pa.int16()),
        ("name", pa.large_string()),
        ("name", pa.dictionary(pa.int32(), pa.string())),
        ("blob", pa.large_binary()),
        ("amount", pa.decimal128(38, 2)),
        ("amount", pa.decimal256(40, 2)),
        ("at", pa.timestamp("ns", tz="UTC")),
        ("at", pa.timestamp("us", tz="+05:30")),  # the same instants, another zone label
        ("at", pa.timestamp("us", tz="America/New_York")),
        ("naive", pa.timestamp("ms")),  # its values are whole milliseconds
        ("d", pa.date64()),
        ("tags", pa.large_list(pa.large_string())),
    ],
)
def test_equivalent_representations_hash_alike(column: str, other_type: pa.DataType) -> None:
    assert hashes(table(ROWS, **{column: other_type})) == BASE


def test_the_same_instant_in_another_zone_hashes_alike() -> None:
    at = ROWS["at"][0]
    elsewhere = at.astimezone(timezone(timedelta(hours=-7)))
    rows = with_value("at", 0, elsewhere)
    assert hashes(table(rows)) == BASE


def test_zeros_and_nans_are_normalised() -> None:
    rows = with_value("f", 3, 0.0)  # was -0.0
    assert hashes(table(rows)) == BASE
    other_nan = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000001))[0]
    rows = with_value("f", 1, other_nan)
    assert hashes(table(rows)) == BASE
    as_float32 = table(with_value("f", 0, 0.5), f=pa.float32())
    assert hashes(as_float32) == hashes(table(with_value("f", 0, 0.5)))


@pytest.mark.parametrize(
    "column, index, value",
    [
        ("id", 3, 4),
        ("name", 0, "plaiN"),
        ("name", 0, "lpain"),  # the same bytes, in another order
        ("name", 2, None),  # '' is not NULL
        ("name", 3, ""),
        ("amount", 0, Decimal("1.51")),
        ("amount", 2, Decimal("0.00")),  # 0 is not NULL
        ("at", 0, datetime(2024, 1, 2, 3, 4, 5, 123457, tzinfo=UTC)),
        ("naive", 0, datetime(2024, 1, 2, 3, 4, 6)),
        ("blob", 0, b"\x00\xfe"),
        ("blob", 1, b"\x00"),
        ("blob", 3, b"x" * 999 + b"y"),
        ("f", 0, 0.1000000001),
        ("f", 1, 0.0),
        ("flag", 0, False),
        ("d", 0, date(2024, 3, 1)),
        ("tags", 0, ["b", "a"]),
        ("tags", 3, ["a", "b"]),  # ["a,b"] is one element
        ("tags", 1, None),
        ("tags", 1, [""]),
    ],
)
def test_any_changed_value_changes_the_row_hash(column: str, index: int, value: Any) -> None:
    key, row = hashes(table(with_value(column, index, value)))
    assert row[index] != BASE[1][index]
    assert [r for i, r in enumerate(row) if i != index] == [
        r for i, r in enumerate(BASE[1]) if i != index
    ]
    if column != "id":
        assert key == BASE[0]  # the key hash covers the key only
    else:
        assert key[index] != BASE[0][index]


def test_values_moved_between_columns_change_the_hash() -> None:
    rows = {"id": [1], "a": ["xy"], "b": [""]}
    moved = {"id": [1], "a": ["x"], "b": ["y"]}
    swapped = {"id": [1], "a": [""], "b": ["xy"]}
    results = {tuple(hashes(pa.table(r))[1]) for r in (rows, moved, swapped)}
    assert len(results) == 3


def test_composite_keys_hash_in_key_order() -> None:
    data = pa.table({"a": [1, 2], "b": [2, 1]})
    ab, _ = hashes(data, ("a", "b"))
    ba, _ = hashes(data, ("b", "a"))
    assert ab[0] != ab[1]  # (1, 2) is not (2, 1)
    assert ab[0] == ba[1]


def test_large_values_are_hashed_in_slices_with_the_same_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = pa.table({"id": [1, 2, 3, 4], "doc": ["a" * 50, "b" * 5, "", "c" * 70]})
    whole = hashes(data)
    monkeypatch.setattr(row_hash, "_SLICE_BYTES", 16)
    assert hashes(data) == whole


def test_an_empty_table_has_no_hashes() -> None:
    assert hashes(table().slice(0, 0)) == ([], [])


def test_unhashable_types_are_named() -> None:
    data = pa.table({"id": [1], "m": pa.array([[("a", 1)]], pa.map_(pa.string(), pa.int64()))})
    with pytest.raises(TypeError, match="map"):
        hash_rows(data, ("id",))


# --- a plain-Python model of the hash, value by value ---------------------------------------

M = 1 << 64


def mix(x: int) -> int:
    x ^= x >> 30
    x = x * row_hash._MIX1 % M
    x ^= x >> 27
    x = x * row_hash._MIX2 % M
    return x ^ (x >> 31)


def model_value(value: Any) -> int:
    if value is None:
        return mix(row_hash._NULL)
    if isinstance(value, int):
        return mix(value % M)
    if isinstance(value, datetime):
        return mix((value - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1) % M)
    data = value.encode() if isinstance(value, str) else value
    total = sum(mix((i << 8) | b) for i, b in enumerate(data)) % M
    return mix(total ^ mix((len(data) + row_hash._LENGTH) % M))


def model_fold(seed: int, values: list[int]) -> int:
    out = seed
    for v in values:
        out = mix((out * row_hash._GOLDEN + v) % M)
    return out


def signed(x: int) -> int:
    return x - M if x >= 1 << 63 else x


def test_the_vectorised_hash_is_the_plain_model() -> None:
    """Byte sums per value are differences of one running sum over all bytes: check them
    (and the rest) against the definition, value by value."""
    rows: dict[str, list[Any]] = {
        "id": [1, -2, 2**63 - 1, 0],
        "name": ["x", "", None, "ünïcødé" * 30],
        "b": [b"\x00", None, b"ab", b""],
        "at": [datetime(1970, 1, 1, tzinfo=UTC), None, datetime(2024, 5, 6, 7, tzinfo=UTC), None],
    }
    data = pa.table(
        {
            "id": pa.array(rows["id"], pa.int64()),
            "name": pa.array(rows["name"], pa.string()),
            "b": pa.array(rows["b"], pa.binary()),
            "at": pa.array(rows["at"], pa.timestamp("us", tz="UTC")),
        }
    )
    key, row = hashes(data)
    for i in range(data.num_rows):
        values = [model_value(rows[n][i]) for n in rows]
        assert key[i] == signed(model_fold(row_hash._KEY_SEED, values[:1]))
        assert row[i] == signed(model_fold(row_hash._ROW_SEED, values))


def test_the_hash_is_pinned() -> None:
    """Both sides must compute the same bits, possibly with different pyarrow versions (the
    driver's and Spark's workers'): if these values change, the function changed, and the
    change must be deliberate."""
    data = pa.table({"id": [1], "name": ["x"], "at": pa.array([0], pa.timestamp("us", "UTC"))})
    assert hashes(data) == ([-8818487343691016808], [1651442517756661393])


def test_the_hash_module_imports_nothing_of_snapshotter() -> None:
    """Spark ships it to workers by value, where snapshotter need not be installed."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(row_hash.__file__).read_text())
    imported = [
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    ]
    assert not [m for m in imported if m and m.split(".")[0] in ("snapshotter", "signals")]

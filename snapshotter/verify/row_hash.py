"""The row hash of ``snapshotter verify`` for the Spark sink (``verify.spark``): a 64-bit key
hash and row hash per row, bit-identical for a source chunk hashed here and for the landed
state hashed by Spark's Python workers, and the bucket a key hash falls in.

Pure pyarrow, vectorised (no per-value Python). Nothing here may import other snapshotter
modules: Spark ships this module to its workers by value (``verify.sides._hash_udf``), where
snapshotter need not be installed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

BUCKET_BITS = 16
BUCKETS = 1 << BUCKET_BITS  # fine enough that a few differing rows narrow to few keys

_U64 = pa.uint64()
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_NULL = 0x6E756C6C5F76616C  # what a NULL hashes from
_LENGTH = 0x6C656E6774685F5F  # mixed with a variable-length value's length
_ROW_SEED = 0x726F775F68617368
_KEY_SEED = 0x6B65795F68617368
# Variable-length values are hashed byte by byte (8 bytes of working memory per byte): values
# are taken in slices of about this many bytes, so a chunk of large documents stays bounded.
_SLICE_BYTES = 4 * 1024 * 1024


def _u64(value: int) -> pa.Scalar:
    return pa.scalar(value, _U64)


def mix64(x: pa.Array) -> pa.Array:
    """SplitMix64's finaliser over uint64 (a bijection that spreads every input bit)."""
    x = pc.bit_wise_xor(x, pc.shift_right(x, _u64(30)))
    x = pc.multiply(x, _u64(_MIX1))  # unchecked arithmetic wraps modulo 2**64
    x = pc.bit_wise_xor(x, pc.shift_right(x, _u64(27)))
    x = pc.multiply(x, _u64(_MIX2))
    return pc.bit_wise_xor(x, pc.shift_right(x, _u64(31)))


def _as_u64(array: pa.Array) -> pa.Array:
    """An integer array's 64 bits as uint64 (two's complement for negatives)."""
    if array.type == _U64:
        return array
    return array.cast(pa.int64()).view(_U64)


def _plain(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One contiguous array of the values (chunks combined, dictionaries decoded)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks else pa.array([], array.type)
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    return array


def _offsets(array: pa.Array) -> pa.Array:
    """int64 offsets (length + 1) of a large_binary array, for its slice."""
    buffer = array.buffers()[1]
    return pa.Array.from_buffers(pa.int64(), len(array) + 1, [None, buffer], offset=array.offset)


def _segment_hashes(offsets: pa.Array, terms: Callable[[pa.Array], pa.Array]) -> pa.Array:
    """One uint64 per segment ``offsets[i]..offsets[i+1]`` of some element sequence: the
    length mixed with the sum (mod 2**64) of ``mix64(term)`` over the segment, where
    ``terms(positions)`` gives each element's term from its position within its segment.

    Sums per segment are differences of one running sum, so this stays vectorised."""
    start = offsets[0].as_py()
    relative = pc.subtract(offsets, start)
    total = relative[-1].as_py() if len(relative) else 0
    parents = pc.list_parent_indices(
        pa.LargeListArray.from_arrays(relative, pa.nulls(total, pa.null()))
    )
    index = pc.indices_nonzero(pa.repeat(True, total))
    positions = pc.subtract(index, pc.take(relative, parents).cast(_U64))
    running = pc.cumulative_sum(mix64(terms(positions)))  # wraps modulo 2**64
    running = pa.concat_arrays([pa.array([0], _U64), running])
    ends, starts = relative.slice(1), relative.slice(0, len(relative) - 1)
    sums = pc.subtract(pc.take(running, ends), pc.take(running, starts))
    lengths = pc.subtract(ends, starts).cast(_U64)
    return mix64(pc.bit_wise_xor(sums, mix64(pc.add(lengths, _u64(_LENGTH)))))


def _bytes_hashes(array: pa.Array) -> pa.Array:
    """Strings and binaries: a hash of each value's bytes (and length)."""
    array = array.cast(pa.large_binary())
    offsets = _offsets(array)
    first, last = offsets[0].as_py(), offsets[-1].as_py()
    if last - first > _SLICE_BYTES and len(array) > 1:
        return _in_slices(array, offsets, _bytes_hashes)
    data = array.buffers()[2]
    stored = pa.Array.from_buffers(pa.uint8(), last, [None, data]) if data else None
    codes = (
        stored.slice(first, last - first).cast(_U64) if stored is not None else pa.array([], _U64)
    )

    def terms(positions: pa.Array) -> pa.Array:
        # (position, byte) packed injectively: the same bytes elsewhere hash differently.
        return pc.bit_wise_or(pc.shift_left(positions, _u64(8)), codes)

    return _segment_hashes(offsets, terms)


def _in_slices(
    array: pa.Array, offsets: pa.Array, hashes: Callable[[pa.Array], pa.Array]
) -> pa.Array:
    """``hashes`` over consecutive slices of at most ``_SLICE_BYTES`` each (or one value)."""
    bounds = offsets.to_pylist()
    parts = []
    begin = 0
    for end in range(1, len(array) + 1):
        if bounds[end] - bounds[begin] > _SLICE_BYTES and end - 1 > begin:
            parts.append(hashes(array.slice(begin, end - 1 - begin)))
            begin = end - 1
    parts.append(hashes(array.slice(begin, len(array) - begin)))
    return pa.concat_arrays(parts)


def _list_hashes(array: pa.Array) -> pa.Array:
    """Lists: a hash of the element hashes, each mixed with its position in the list."""
    array = array.cast(pa.large_list(array.type.value_type))
    offsets = array.offsets
    first, last = offsets[0].as_py(), offsets[-1].as_py()
    children = value_hashes(array.values.slice(first, last - first))

    def terms(positions: pa.Array) -> pa.Array:
        return pc.add(children, pc.multiply(positions, _u64(_GOLDEN)))

    return _segment_hashes(offsets, terms)


def _fold(columns: Sequence[pa.Array], seed: int, rows: int) -> pa.Array:
    """Column hashes combined in order (the same values in other columns hash differently)."""
    out = pa.repeat(_u64(seed), rows)
    for column in columns:
        out = mix64(pc.add(pc.multiply(out, _u64(_GOLDEN)), column))
    return out


def _float_bits(array: pa.Array) -> pa.Array:
    values = array.cast(pa.float64())
    values = pc.add(values, 0.0)  # -0.0 + 0.0 is 0.0: both zeros hash alike
    values = pc.if_else(pc.is_nan(values), float("nan"), values)  # one NaN bit pattern
    return values.view(_U64)


def _hash_by_type(array: pa.Array) -> pa.Array:
    """The uint64 hash of each non-NULL value (NULL where the value is NULL or unhashed)."""
    kind = array.type
    if pa.types.is_boolean(kind):
        return mix64(array.cast(_U64))
    if pa.types.is_integer(kind):
        return mix64(_as_u64(array))
    if pa.types.is_floating(kind):
        return mix64(_float_bits(array))
    if pa.types.is_timestamp(kind):
        # Microseconds since the epoch, UTC for zoned types: the zone name is a label.
        micros = array.cast(pa.timestamp("us", kind.tz), safe=False)
        return mix64(_as_u64(micros.cast(pa.int64())))
    if pa.types.is_date(kind):
        return mix64(_as_u64(array.cast(pa.date32()).cast(pa.int32())))
    if pa.types.is_time(kind):
        return mix64(_as_u64(array.cast(pa.time64("us"), safe=False).cast(pa.int64())))
    if pa.types.is_duration(kind):
        return mix64(_as_u64(array.cast(pa.duration("us"), safe=False).cast(pa.int64())))
    if pa.types.is_decimal(kind):
        # Its text keeps the scale ("1.50"): any precision of the same scale hashes alike.
        return _bytes_hashes(array.cast(pa.string()))
    if (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_fixed_size_binary(kind)
    ):
        return _bytes_hashes(array)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _list_hashes(array)
    if pa.types.is_struct(kind):
        fields = [value_hashes(child) for child in array.flatten()]
        return _fold(fields, _ROW_SEED, len(array))
    raise TypeError(f"values of type {kind} cannot be hashed for verify")


def value_hashes(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A uint64 hash per value (NULLs all hash alike), the same for equal values in
    equivalent representations."""
    array = _plain(array)
    null = mix64(pa.array([_NULL], _U64))[0]
    if pa.types.is_null(array.type):
        return pa.repeat(null, len(array))
    return pc.if_else(pc.is_null(array), null, _hash_by_type(array))


def hash_rows(
    data: pa.Table | pa.RecordBatch, key_columns: Sequence[str]
) -> tuple[pa.Array, pa.Array]:
    """Per row, a 64-bit key hash (of ``key_columns``, in that order) and a 64-bit row hash
    (of every column, in table order), as two int64 arrays.

    Equal values hash alike whatever their Arrow representation: chunked or not; timestamps
    of any unit and zone label at the same instant (microseconds since the epoch); dates;
    any integer width; floats with -0.0 as 0.0 and one NaN; decimals by their text (scale
    kept); strings and binaries by their bytes; dictionaries by their values; lists by their
    elements in order. Column names do not enter the hash, so both sides must give columns
    in the same order."""
    names = list(data.schema.names)
    hashes = {name: value_hashes(data.column(i)) for i, name in enumerate(names)}
    rows = data.num_rows
    missing = [k for k in key_columns if k not in hashes]
    if missing:
        raise KeyError(f"no key column(s) {missing} among {names}")
    key = _fold([hashes[k] for k in key_columns], _KEY_SEED, rows)
    row = _fold([hashes[n] for n in names], _ROW_SEED, rows)
    return key.view(pa.int64()), row.view(pa.int64())


def bucket_of(key_hash: pa.Array) -> pa.Array:
    """The bucket (0 .. BUCKETS-1) of int64 key hashes: their low bits."""
    return pc.bit_wise_and(key_hash, pa.scalar(BUCKETS - 1, pa.int64()))

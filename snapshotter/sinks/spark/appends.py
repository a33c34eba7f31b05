"""Which landed rows are appends that need no merge: READ rows of keys the table never had.

A snapshot reads a table in chunks of disjoint key ranges. Where the table was never landed
before, a chunk's READ rows whose keys no landed row ever had can go into the table's
current state as they are, with no reduction per key (the Parquet landing's compaction, a
Spark job of about a JVM second per 100k rows): per key, the current state is the row of
the highest position, and such a key has no other row.

``KnownKeys`` decides that exactly without keeping the keys: it keeps sorted, disjoint
ranges ``[lowest, highest]`` covering every key landed so far: one per chunk of READ rows,
one point per key of a log row (update, delete, ...). A staged part is cut into segments in
log order: runs of READ rows sharing a close watermark (a chunk: the ``__pos`` prefix they
share) and runs of other rows. A READ run is an append when its keys are not NULL, distinct,
and its range overlaps no known range (those of earlier segments of the same part
included); every segment's keys become known, appended or not. Log rows never are appends.
Memory and time stay bounded: past MAX_RANGES known ranges (log traffic on the table), the
table has no appends any more (``record`` says so).

Ranges are compared as Python tuples, so only key types whose Python order is Arrow's sort
order take part (integers, decimals, strings - code point order is UTF-8 byte order -,
binary, dates, timestamps, booleans); a float key (NaN, -0.0) never does. A chunk whose
range overlaps another's because the database orders keys by a collation other than code
points is not an append: refusing is always safe, only slower.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from snapshotter.sinks.spark.types import OP, POS

Key = tuple[Any, ...]
_READ_SUFFIX = 17  # "-" and the row index's 16 hex digits after the close watermark's token
MAX_RANGES = 20_000  # about 2 MB of keys; merged in a few ms per landing
# A chunk holding more keys than this that log rows landed before is no append at all (the
# rows are picked out one key at a time).
MAX_LOGGED_IN_CHUNK = 256


def orderable(schema: pa.Schema, keys: Sequence[str]) -> bool:
    """Whether keys of these types compare the same in Python as in Arrow's sort."""
    for name in keys:
        if schema.get_field_index(name) < 0:
            return False
        t = schema.field(name).type
        if not (
            pa.types.is_integer(t)
            or pa.types.is_decimal(t)
            or pa.types.is_string(t)
            or pa.types.is_binary(t)
            or pa.types.is_date(t)
            or pa.types.is_timestamp(t)
            or pa.types.is_boolean(t)
        ):
            return False
    return True


@dataclass(frozen=True, slots=True)
class Plan:
    """What a staged part holds: the rows to append (their indices, in order), and the key
    ranges to record once it has landed."""

    appends: pa.Array  # int64 row indices
    ranges: tuple[tuple[Key, Key], ...]
    rows: int  # rows in the part

    @property
    def appended(self) -> int:
        return len(self.appends)


def _segments(rows: pa.Table) -> list[tuple[int, int, bool]]:
    """``(offset, length, is_read_run)`` of the part's segments, in order."""
    count = rows.num_rows
    if count == 0:
        return []
    is_read = pc.equal(rows.column(OP), "r").combine_chunks()
    # The close watermark's token for READ rows; "" for the others (one run of log rows).
    closes = pc.if_else(
        is_read,
        pc.utf8_slice_codeunits(rows.column(POS).combine_chunks(), 0, -_READ_SUFFIX),
        "",
    )
    changed = pc.or_(
        pc.not_equal(closes.slice(1), closes.slice(0, count - 1)),
        pc.not_equal(is_read.slice(1), is_read.slice(0, count - 1)),
    )
    starts = [0, *(i + 1 for i in pc.indices_nonzero(changed).to_pylist())]
    ends = [*starts[1:], count]
    reads = is_read.to_pylist()
    return [(s, e - s, bool(reads[s])) for s, e in zip(starts, ends, strict=True)]


def _sorted_keys(keys: pa.Table) -> pa.Table:
    order = pc.sort_indices(keys, sort_keys=[(name, "ascending") for name in keys.column_names])
    return keys.take(order)


def _distinct(ordered: pa.Table) -> bool:
    count = ordered.num_rows
    if count < 2:
        return True
    same = None
    for column in ordered.columns:
        equal = pc.equal(column.slice(1), column.slice(0, count - 1))
        same = equal if same is None else pc.and_(same, equal)
    return same is None or not pc.any(same).as_py()


def _other_than(keys: pa.Table, landed: Sequence[Key]) -> pa.Array:
    """Indices (int64) of the rows of ``keys`` whose key is none of ``landed``."""
    found = pa.repeat(pa.scalar(False), keys.num_rows)
    for key in landed:
        same = pa.repeat(pa.scalar(True), keys.num_rows)
        for column, value in zip(keys.columns, key, strict=True):
            same = pc.and_(same, pc.equal(column, pa.scalar(value, type=column.type)))
        found = pc.or_(found, same)
    return pc.indices_nonzero(pc.invert(found)).cast(pa.int64())


def _row(table: pa.Table, index: int) -> Key:
    return tuple(column[index].as_py() for column in table.columns)


class KnownKeys:
    """Ranges covering every key landed for one table (see the module docstring)."""

    def __init__(self, keys: Sequence[str]) -> None:
        self.keys = tuple(keys)
        self._lows: list[Key] = []  # sorted, disjoint: _highs[i] belongs to _lows[i]
        self._highs: list[Key] = []
        self._batches: list[int] = []  # the earliest staged batch each range holds keys of

    def __len__(self) -> int:
        return len(self._lows)

    def _landed_within(
        self, low: Key, high: Key, earlier: Sequence[tuple[Key, Key]]
    ) -> list[Key] | None:
        """The keys landed between ``low`` and ``high`` (known ranges and ``earlier`` ones),
        when all are single keys (log rows, one-row chunks), at most MAX_LOGGED_IN_CHUNK;
        None when a range of several keys reaches in (another chunk: its keys are not
        known one by one)."""
        keys: list[Key] = []
        # Disjoint and sorted, so the highs are sorted too: from the first range ending at
        # or above ``low``, while they start at or below ``high``.
        at = bisect.bisect_left(self._highs, low)
        while at < len(self._lows) and self._lows[at] <= high:
            if self._lows[at] != self._highs[at]:
                return None
            keys.append(self._lows[at])
            at += 1
        for lo, hi in earlier:
            if lo <= high and low <= hi:
                if lo != hi:
                    return None
                keys.append(lo)
        return keys if len(keys) <= MAX_LOGGED_IN_CHUNK else None

    def plan(self, rows: pa.Table) -> Plan | None:
        """What of ``rows`` (a staged part: landed schema, log order) is appended; None
        when the keys cannot be ranged (a type Python cannot order as Arrow does, a value
        Python cannot hold): then nothing of the table is, from here on."""
        if not orderable(rows.schema, self.keys):
            return None
        keys = rows.select(list(self.keys))
        appends: list[pa.Array] = []
        ranges: list[tuple[Key, Key]] = []
        try:
            for offset, length, is_read in _segments(rows):
                segment = keys.slice(offset, length)
                if any(column.null_count for column in segment.columns):
                    return None  # a truncate (no key): nothing is an append from here on
                ordered = _sorted_keys(segment)
                low, high = _row(ordered, 0), _row(ordered, length - 1)
                if is_read:
                    landed = self._landed_within(low, high, ranges)
                    if landed is not None and _distinct(ordered):
                        appends.append(pc.add(_other_than(segment, landed), offset))
                    ranges.append((low, high))
                else:
                    ranges.extend(
                        (key, key) for key in zip(*segment.to_pydict().values(), strict=True)
                    )
        except (TypeError, ValueError, OverflowError):  # a value Python cannot hold or order
            return None
        indices = pa.concat_arrays(appends) if appends else pa.array([], type=pa.int64())
        return Plan(indices, tuple(ranges), rows.num_rows)

    def record(self, ranges: Sequence[tuple[Key, Key]], batch: int) -> bool:
        """Add ranges (from ``plan``) of staged batch ``batch``, once its rows landed;
        False when that makes more than MAX_RANGES (stop using this table's)."""
        if not ranges:
            return True
        # Two sorted runs: Python's sort merges them in linear time.
        entries = sorted(
            [
                *zip(self._lows, self._highs, self._batches, strict=True),
                *sorted((low, high, batch) for low, high in ranges),
            ]
        )
        lows: list[Key] = []
        highs: list[Key] = []
        batches: list[int] = []
        for low, high, seq in entries:
            if highs and low <= highs[-1]:  # overlapping: one range holding both
                highs[-1] = max(highs[-1], high)
                batches[-1] = min(batches[-1], seq)
            else:
                lows.append(low)
                highs.append(high)
                batches.append(seq)
        self._lows, self._highs, self._batches = lows, highs, batches
        return len(lows) <= MAX_RANGES

    def forget_from(self, batch: int) -> None:
        """Forget the ranges of staged batches ``batch`` and later (their rows are taken
        out, to be landed again). A range merged with an earlier batch's stays: knowing a
        key that is not there only refuses more."""
        kept = [i for i, seq in enumerate(self._batches) if seq < batch]
        self._lows = [self._lows[i] for i in kept]
        self._highs = [self._highs[i] for i in kept]
        self._batches = [self._batches[i] for i in kept]

"""JSON text of a READ batch, built column by column with Arrow compute.

A chunk's READ rows (:class:`~snapshotter.core.window.ReadBatch`) reach the JSON sinks as one
Arrow table. Encoding them row by row (a ``ChangeEvent`` per row, then ``encode_value``)
costs about 20 µs a row; here each column becomes one Arrow string array of JSON fragments
(a value's JSON text, ``null`` for SQL NULL) in a few vectorised calls, and whole lines are
assembled with ``binary_join_element_wise``: the row object, the key object and the envelope
are constants of the batch interleaved with those fragment columns. Only the position token
varies in the ``source`` block (``ReadBatch.position_tokens``).

The output is byte for byte what :mod:`snapshotter.sinks.encoding` writes for the same rows
as events (the per-row path stays the reference; a property test holds both to it). Where
Arrow's own formatting differs from Python's (floats: Arrow writes ``1`` for ``1.0``), a
column takes a per-value path that calls the reference encoder itself, and so does any
column type this module does not know; a row converter that cannot be applied column-wise
sends the whole batch through the reference path.

Per type, as the reference writes them (see :mod:`snapshotter.sinks.encoding`):

* ints and bools: Arrow's cast to string is Python's ``repr``;
* strings: JSON string escaping (``\\``, ``"``, control characters) done with
  ``replace_substring``; a column holding a control character escapes those rows in Python
  (rare: JSON writes them as ``\\uXXXX``);
* decimals: Arrow's cast to string writes what ``str(Decimal)`` writes, scientific notation
  included (``1E-7``);
* timestamps, dates, times: Arrow's cast (``YYYY-MM-DD HH:MM:SS.ffffff``) with ``T`` for
  the space, the fraction dropped when it is zero, ``Z`` for an aware value (Arrow keeps
  instants in UTC);
* durations (MySQL TIME): ``[-]HH:MM:SS[.ffffff]`` from integer arithmetic;
* floats, binary (base64) and everything else: per value, through the reference encoder.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from snapshotter.core.values import RawJson
from snapshotter.core.window import ReadBatch
from snapshotter.sinks.encoding import encode_json, encode_value_text

# Line pieces are large_string: a chunk of big rows may pass the 2 GiB of a string array.
_TEXT = pa.large_string()
_EMPTY = pa.scalar("", _TEXT)
_NULL = pa.scalar("null", _TEXT)
_QUOTE = pa.scalar('"', _TEXT)
_CONTROL = re.compile(rb"[\x00-\x1f]")
_MICROS_PER = {"s": 1_000_000, "ms": 1_000, "us": 1}


def _lit(text: str) -> pa.Scalar:
    return pa.scalar(text, _TEXT)


class NotColumnar(Exception):
    """The batch's row converter cannot be applied column by column: encode it per row."""


# --- column fragments -----------------------------------------------------------------------


def _per_value(values: Sequence[Any], json_text: bool) -> pa.Array:
    """The reference encoder, one value at a time (types Arrow cannot format as Python does)."""
    return pa.array([encode_value_text(v, json_text) for v in values], _TEXT)


def _string_data(array: pa.Array) -> pa.Buffer:
    """The bytes of a string array's values, back to back (no copy)."""
    offsets, data = array.buffers()[1], array.buffers()[2]
    if offsets is None or data is None or len(array) == 0:
        return pa.py_buffer(b"")
    view = memoryview(offsets)
    ends = view.cast("q") if pa.types.is_large_string(array.type) else view.cast("i")
    start, end = ends[array.offset], ends[array.offset + len(array)]
    return data.slice(start, end - start)


def _strings(array: pa.Array) -> pa.Array:
    """JSON string literals of a string array (nulls stay null)."""
    array = array.cast(_TEXT)
    data = _string_data(array).to_pybytes()
    escaped = array
    if b"\\" in data:
        escaped = pc.replace_substring(escaped, "\\", "\\\\")
    if b'"' in data:
        escaped = pc.replace_substring(escaped, '"', '\\"')
    quoted = pc.binary_join_element_wise(_QUOTE, escaped, _QUOTE, _EMPTY)
    if _CONTROL.search(data) is not None:
        # JSON escapes control characters as \n, \t... or \u00XX: those rows in Python.
        has = pc.match_substring_regex(array, "[\\x00-\\x1f]")
        has = pc.fill_null(has, False)
        texts = [encode_json(v) for v in pc.filter(array, has).to_pylist()]
        quoted = pc.replace_with_mask(quoted, has, pa.array(texts, _TEXT))
    return quoted


def _formatted(array: pa.Array, zone: bool) -> pa.Array:
    """Arrow's ``YYYY-MM-DD HH:MM:SS.ffffff`` / ``HH:MM:SS.ffffff`` text as ``isoformat``
    writes it: ``T`` between date and time, no fraction when it is zero."""
    text = pc.cast(array, _TEXT)
    text = pc.replace_substring(text, " ", "T", max_replacements=1)
    text = pc.replace_substring(text, ".000000", "")
    return pc.binary_join_element_wise(_QUOTE, text, _lit('Z"' if zone else '"'), _EMPTY)


def _pad(values: pa.Array, width: int) -> pa.Array:
    return pc.utf8_lpad(pc.cast(values, _TEXT), width, "0")


def _durations(array: pa.Array) -> pa.Array | None:
    """MySQL TIME text (``encoding.time_text``) of a duration array; None to go per value."""
    scale = _MICROS_PER.get(array.type.unit)
    if scale is None:
        return None
    micros = pc.multiply(array.cast(pa.int64()), scale)
    try:
        size = pc.abs_checked(micros)
    except pa.ArrowInvalid:  # the most negative int64: leave it to Python
        return None
    hours = pc.divide(size, 3_600_000_000)
    rest = pc.subtract(size, pc.multiply(hours, 3_600_000_000))
    minutes = pc.divide(rest, 60_000_000)
    rest = pc.subtract(rest, pc.multiply(minutes, 60_000_000))
    seconds = pc.divide(rest, 1_000_000)
    fraction = pc.subtract(rest, pc.multiply(seconds, 1_000_000))
    sign = pc.if_else(pc.less(micros, 0), _lit("-"), _EMPTY)
    tail = pc.if_else(
        pc.equal(fraction, 0),
        _EMPTY,
        pc.binary_join_element_wise(_lit("."), _pad(fraction, 6), _EMPTY),
    )
    colon = _lit(":")
    parts = (sign, _pad(hours, 2), colon, _pad(minutes, 2), colon, _pad(seconds, 2), tail)
    return pc.binary_join_element_wise(_QUOTE, *parts, _QUOTE, _EMPTY)


def _typed(array: pa.Array, json_text: bool) -> pa.Array | None:
    """Fragments of a column by its Arrow type, nulls still null; None: no columnar way."""
    kind = array.type
    if pa.types.is_dictionary(kind):
        return _typed(array.dictionary_decode(), json_text)
    if pa.types.is_null(kind):
        return pa.nulls(len(array), _TEXT)
    if pa.types.is_boolean(kind):
        return pc.if_else(array, _lit("true"), _lit("false"))
    if pa.types.is_integer(kind):
        return pc.cast(array, _TEXT)
    if pa.types.is_decimal(kind):
        return pc.binary_join_element_wise(_QUOTE, pc.cast(array, _TEXT), _QUOTE, _EMPTY)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return _strings(array)
    if pa.types.is_string_view(kind):
        return _strings(array.cast(_TEXT))
    if pa.types.is_timestamp(kind) and kind.unit in _MICROS_PER:
        # Arrow holds the UTC instant whatever the zone: format it as a naive value.
        naive = array.cast(pa.timestamp(kind.unit)).cast(pa.timestamp("us"))
        return _formatted(naive, zone=kind.tz is not None)
    if pa.types.is_date32(kind) or pa.types.is_date64(kind):
        return _formatted(array.cast(pa.date32()), zone=False)
    if pa.types.is_time(kind) and kind.unit in _MICROS_PER:
        return _formatted(array.cast(pa.time64("us")), zone=False)
    if pa.types.is_duration(kind):
        return _durations(array)
    return None


def column_fragments(
    array: pa.Array | pa.ChunkedArray,
    json_text: bool = False,
    convert: Callable[[Any], Any] | None = None,
) -> pa.Array:
    """Each value's JSON text as the reference encoder writes it (``null`` for NULL).

    ``convert`` turns a value of the column into the value model first (JSON text into
    :class:`RawJson`...); such a column goes per value. ``json_text``: JSON documents as
    strings holding their text (the Kafka sink's option)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if convert is not None:
        return _per_value([convert(v) for v in array.to_pylist()], json_text)
    typed = _typed(array, json_text)
    if typed is None:
        return _per_value(array.to_pylist(), json_text)
    return pc.fill_null(typed, _NULL) if typed.null_count else typed


# --- whole rows -----------------------------------------------------------------------------


def column_converters(convert: Any) -> Mapping[str, Callable[[Any], Any]]:
    """The per-column value converters of a batch's row converter (``columns`` of
    ``sources.sql_common.ColumnsConverter``); NotColumnar when it has none."""
    if convert is None:
        return {}
    columns = getattr(convert, "columns", None)
    if not isinstance(columns, Mapping):
        raise NotColumnar
    return columns


@dataclass(frozen=True, slots=True)
class BatchJson:
    """A batch's JSON pieces, one array element per row (large_string, no nulls)."""

    keys: pa.Array  # the key object, ``{"id":7}``
    values: pa.Array  # the envelope, ``{"before":null,"after":{...},...}``

    def __len__(self) -> int:
        return len(self.values)


def join(*parts: pa.Array | pa.Scalar | str) -> pa.Array:
    """Concatenate, element-wise, arrays and constant texts."""
    pieces = [_lit(p) if isinstance(p, str) else p for p in parts]
    merged: list[pa.Array | pa.Scalar] = []
    for piece in pieces:  # adjacent constants joined once here, not once per row
        if merged and isinstance(piece, pa.Scalar) and isinstance(merged[-1], pa.Scalar):
            merged[-1] = _lit(merged[-1].as_py() + piece.as_py())
        else:
            merged.append(piece)
    return pc.binary_join_element_wise(*merged, _EMPTY)


def object_parts(
    names: Sequence[str], fragments: Sequence[pa.Array]
) -> list[pa.Array | pa.Scalar | str]:
    """The parts of a JSON object per row: ``{"a":`` f1 ``,"b":`` f2 ``}``."""
    parts: list[pa.Array | pa.Scalar | str] = []
    for index, (name, fragment) in enumerate(zip(names, fragments, strict=True)):
        parts.append(("{" if index == 0 else ",") + encode_json(str(name)) + ":")
        parts.append(fragment)
    parts.append("}" if names else "{}")
    return parts


def encode_batch(
    batch: ReadBatch, key_names: Sequence[str], *, json_text: bool = False
) -> BatchJson:
    """The batch's keys and envelopes as the reference encoder writes the batch's events
    (``key`` named ``key_names`` with the values of the batch's key columns).

    NotColumnar when the batch's converter is opaque (a caller then encodes per row)."""
    converters = column_converters(batch.convert)
    rows = batch.rows
    fragments = {
        name: column_fragments(rows.column(name), json_text, converters.get(name))
        for name in rows.column_names
    }
    after = object_parts(rows.column_names, list(fragments.values()))
    source = batch.template.to_dict()
    del source["pos"]  # always the last field: the one that varies per row
    opening = encode_json(source)[:-1] + ("," if source else "") + '"pos":"'
    values = join(
        '{"before":null,"after":',
        *after,
        ',"source":',
        opening,
        batch.position_tokens().cast(_TEXT),
        f'"}},"op":"r","ts_ms":{int(batch.ts_ms)}}}',
    )
    key_fragments = [fragments[c] for c in batch.key_columns]
    keys = join(*object_parts(key_names, key_fragments))
    return BatchJson(keys, values)


def texts(array: pa.Array) -> list[str]:
    """The elements as Python strings."""
    out: list[str] = array.to_pylist()
    return out


def as_bytes(array: pa.Array) -> list[bytes]:
    """The elements as UTF-8 bytes (messages), without a Python str per element."""
    out: list[bytes] = array.cast(pa.large_binary()).to_pylist()
    return out


def concatenated(array: pa.Array) -> bytes:
    """All elements back to back, as one bytes object (a whole file's worth of lines)."""
    data: bytes = _string_data(array.cast(_TEXT)).to_pybytes()
    return data


__all__ = [
    "BatchJson",
    "NotColumnar",
    "RawJson",
    "as_bytes",
    "column_fragments",
    "concatenated",
    "encode_batch",
    "join",
    "texts",
]

"""The JSON encoding of events shared by the sinks that write JSON (JSONL, Kafka).

Values (see ``snapshotter.core.values``) are written as:

* str, int, bool, None: as JSON; a finite float as a JSON number (``repr`` precision);
* a NaN or infinite float: the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (JSON has
  no such numbers, and a bare ``NaN`` token would make the text unreadable to strict parsers);
* ``Decimal`` and ``UUID`` (should a reader produce them): their ``str``;
* bytes: standard base64 with padding;
* an aware datetime: converted to UTC, ISO-8601 with a ``Z``, with microseconds only when
  they are non-zero (as ``datetime.isoformat``): ``2024-01-02T03:04:05.123456Z``,
  ``2024-01-02T03:04:05Z``;
* a naive datetime, a date, a time: ``isoformat()`` (no zone for naive values);
* a timedelta (MySQL's TIME, a signed duration): ``[-]HH:MM:SS[.ffffff]`` as MySQL writes it,
  hours past 24 included (``-838:59:59``);
* :class:`RawJson`: its text embedded as JSON, byte for byte, except that a raw CR or LF
  (only possible as whitespace between tokens of valid JSON, e.g. from PostgreSQL's ``json``
  type, which keeps its input text) becomes a space, so one event stays one line. With
  ``json_as_text`` (a sink option) the document is written as a JSON string holding its text
  instead, as Debezium writes ``io.debezium.data.Json`` columns.

The envelope (:func:`encode_value`) is, with keys in this order::

    {"before": {...} | null, "after": {...} | null, "source": {...},
     "op": "c" | "u" | "d" | "r" | "t", "ts_ms": <int>}

and the key (:func:`encode_key`) the key columns in key order, ``{"id": 7}``.
"""

from __future__ import annotations

import base64
import json
import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from snapshotter.core.events import ChangeEvent
from snapshotter.core.values import RawJson

# --- values -------------------------------------------------------------------------
#
# The fast path hands a whole row to the C encoder, which calls ``default`` only for values
# that are not JSON types. A RawJson becomes a placeholder string there, and its text is put
# in place of the placeholder afterwards, so JSON documents are never parsed and re-encoded
# (which would cost time and could change numbers). The placeholder is random per process;
# when a row's own data happens to contain it, the counts disagree and the row takes the
# slow path, so a collision can never corrupt output.

_TOKEN = f"<rawjson-{uuid.uuid4().hex}>"  # '<' and '>' once each: no self-overlap for count()
_PLACEHOLDER = f'"{_TOKEN}"'


def _encode_special(value: Any) -> Any:
    """A non-JSON value of the value model as a JSON value (RawJson excluded)."""
    # datetime before date: a datetime is a date.
    if isinstance(value, datetime):
        text = value.isoformat()
        if value.tzinfo is None:
            return text
        if text.endswith("+00:00"):  # already UTC (the value model's promise): the cheap way
            return text[:-6] + "Z"
        return value.astimezone(UTC).replace(tzinfo=None).isoformat() + "Z"
    if isinstance(value, date | time):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, Decimal | UUID):
        return str(value)
    if isinstance(value, timedelta):  # MySQL TIME: -838:59:59 .. 838:59:59
        return time_text(value)
    raise TypeError(f"cannot write a value of type {type(value).__name__} to JSON")


def time_text(value: timedelta) -> str:
    """A MySQL TIME (a signed duration) as MySQL writes it: ``[-]HH:MM:SS[.ffffff]``, hours
    past 24 as they are (``-838:59:59``), microseconds only when non-zero."""
    micros = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    sign = "-" if micros < 0 else ""
    seconds, fraction = divmod(abs(micros), 1_000_000)
    minutes, second = divmod(seconds, 60)
    hours, minute = divmod(minutes, 60)
    text = f"{sign}{hours:02d}:{minute:02d}:{second:02d}"
    return f"{text}.{fraction:06d}" if fraction else text


def _default_fast(value: Any) -> Any:
    if type(value) is RawJson:
        return _TOKEN
    return _encode_special(value)


def _default_plain(value: Any) -> Any:
    if isinstance(value, RawJson):
        raise TypeError("a RawJson value nested inside another value cannot be written")
    return _encode_special(value)


def _make_encoder(default: Callable[[Any], Any]) -> Callable[[Any], str]:
    """``json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False,
    default=default)`` without its per-call setup.

    ``JSONEncoder.encode`` builds a new C encoder on every call, which costs about as much as
    encoding a small row; the C encoder itself is reusable, so build it once. No circular
    check (rows are flat). Falls back to the public API where the C encoder is missing.
    """
    public = json.JSONEncoder(
        ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=default
    ).encode
    c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
    if c_make_encoder is None:  # pragma: no cover - CPython has it
        return public
    try:
        encoder = c_make_encoder(
            None,  # markers: no circular-reference check
            default,
            json.encoder.encode_basestring,  # the C one; ensure_ascii=False
            None,  # indent
            ":",  # key separator
            ",",  # item separator
            False,  # sort_keys
            False,  # skipkeys
            False,  # allow_nan
        )
    except TypeError:  # pragma: no cover - a future CPython changed the private signature
        return public

    def encode(value: Any) -> str:
        # The C encoder returns a str for a str top level and a tuple of chunks otherwise.
        chunks = encoder(value, 0)
        return chunks if isinstance(chunks, str) else "".join(chunks)

    return encode


_FAST = _make_encoder(_default_fast)
_PLAIN = _make_encoder(_default_plain)
_NON_FINITE = {"nan": '"NaN"', "inf": '"Infinity"', "-inf": '"-Infinity"'}


def _raw_text(raw: RawJson) -> str:
    text = raw.text
    if "\n" in text or "\r" in text:
        # Valid JSON has CR/LF only as whitespace between tokens (never raw inside a string).
        text = text.replace("\r", " ").replace("\n", " ")
    return text


def _encode_one(value: Any) -> str:
    if isinstance(value, RawJson):
        return _raw_text(value)
    if isinstance(value, float) and not math.isfinite(value):
        return _NON_FINITE[repr(value)]
    return _PLAIN(value)


def encode_value_text(value: Any, json_text: bool = False) -> str:
    """One value of a row as :func:`encode_row` writes it (``json_text``: a JSON document
    as a string holding its text, as :func:`json_as_text` makes of it)."""
    if json_text and type(value) is RawJson:
        return _PLAIN(value.text)
    return _encode_one(value)


def _encode_row_slow(row: Mapping[str, Any]) -> str:
    parts = [_PLAIN(str(name)) + ":" + _encode_one(v) for name, v in row.items()]
    return "{" + ",".join(parts) + "}"


def encode_row(row: Mapping[str, Any] | None) -> str:
    """One row (column name -> value) as a JSON object text, exactly as the sink writes it.

    This is the single encoder of the value model: the sink uses it for ``key``, ``before``
    and ``after``, and ``snapshotter.verify.rows`` for the table side, so both compare alike.
    """
    if row is None:
        return "null"
    if type(row) is not dict:  # the C encoder takes only a real dict as an object
        row = dict(row)
    try:
        text = _FAST(row)
    except ValueError:  # a NaN or infinite float (allow_nan=False)
        return _encode_row_slow(row)
    if _TOKEN not in text:
        return text
    raws = [v for v in row.values() if type(v) is RawJson]
    if text.count(_TOKEN) != len(raws):  # the data itself holds the token (or nested RawJson)
        return _encode_row_slow(row)
    pieces = text.split(_PLACEHOLDER)
    out = [pieces[0]]
    for raw, piece in zip(raws, pieces[1:], strict=True):
        out.append(_raw_text(raw))
        out.append(piece)
    return "".join(out)


def encode_json(value: Any) -> str:
    """Any JSON-able value of the value model (no RawJson, no non-finite floats) as text."""
    return _PLAIN(value)


def json_as_text(row: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """``row`` with its JSON documents as their text (str) instead of :class:`RawJson`."""
    if row is None or not any(type(v) is RawJson for v in row.values()):
        return row
    return {k: v.text if type(v) is RawJson else v for k, v in row.items()}


class KeyMismatchError(ValueError):
    """An event's key values do not fit the table's key columns."""


def encode_key(columns: Sequence[str], key: Sequence[Any]) -> str:
    """The message key: the key columns and values as one JSON object (Debezium's shape)."""
    if len(columns) != len(key):
        raise KeyMismatchError(
            f"{len(key)} key values, but the table's key columns are {list(columns)}"
        )
    return encode_row(dict(zip(columns, key, strict=True)))


def encode_value(event: ChangeEvent, *, json_text: bool = False) -> str:
    """The event's envelope as JSON text (see the module docstring)."""
    before, after = event.before, event.after
    if json_text:
        before, after = json_as_text(before), json_as_text(after)
    # Assembled by hand so rows go through encode_row (RawJson, NaN) while the key order
    # stays fixed. Op values are plain letters: no escaping needed.
    return (
        f'{{"before":{encode_row(before)},"after":{encode_row(after)},'
        f'"source":{_PLAIN(event.source.to_dict())},'
        f'"op":"{event.op.value}","ts_ms":{int(event.ts_ms)}}}'
    )

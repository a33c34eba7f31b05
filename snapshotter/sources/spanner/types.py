"""Spanner column types: one value model for chunk rows and change-stream mods.

A chunk read (the client library's typed values) and a change stream's mods (JSON) hand over
the same stored value in different shapes. Per column this module says what the engine's
value model is and how each side reaches it, so a READ row and a log row of the same stored
row are equal:

=================  ========================  =========================  ======================
type (GoogleSQL /  chunk side (client)       mod side (JSON)            value model
PostgreSQL)
=================  ========================  =========================  ======================
INT64 / bigint     int                       decimal string             int
FLOAT64 / float8   float                     number (NaN, ±Inf: null    float
                                             on the emulator)
FLOAT32 / real     float                     number                     float (float32)
BOOL / boolean     bool                      bool                       bool
STRING / varchar   str                       str                        str
BYTES / bytea      base64 bytes              base64 string              bytes
DATE / date        date                      "YYYY-MM-DD"               date
TIMESTAMP /        datetime (ns)             RFC 3339 text (whole       aware UTC datetime
timestamptz                                  seconds on the emulator)   (microseconds)
NUMERIC / numeric  Decimal                   decimal string             str (exact text)
JSON / jsonb       parsed document           JSON text                  RawJson (compact,
                                                                        sorted keys)
ARRAY<T> / T[]     list                      list of strings, NULL as   str: a JSON array of
                                             "NULL" (emulator)          the element values
others             str()                     str                        str
=================  ========================  =========================  ======================

Key values are bound to queries with the column's own type (``param_type``), so Spanner
compares them in its own order.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa

from snapshotter.core.values import RawJson

Convert = Callable[[Any], Any]

# What the emulator writes into an INSERT's mod for a commit-timestamp column instead of the
# commit timestamp (measured, emulator 1.5.28); Cloud Spanner writes the timestamp.
COMMIT_TIMESTAMP_PLACEHOLDER = "9999-12-31T23:59:59Z"

_ARRAY_G = re.compile(r"^ARRAY<(.+)>$")
_LENGTH = re.compile(r"\(.*\)$")
# PostgreSQL-dialect type names -> the GoogleSQL family they are.
_PG_FAMILY = {
    "bigint": "INT64",
    "int8": "INT64",
    "double precision": "FLOAT64",
    "float8": "FLOAT64",
    "real": "FLOAT32",
    "float4": "FLOAT32",
    "boolean": "BOOL",
    "bool": "BOOL",
    "character varying": "STRING",
    "varchar": "STRING",
    "text": "STRING",
    "bytea": "BYTES",
    "date": "DATE",
    "timestamp with time zone": "TIMESTAMP",
    "timestamptz": "TIMESTAMP",
    "spanner.commit_timestamp": "TIMESTAMP",
    "numeric": "NUMERIC",
    "jsonb": "JSON",
}
_FAMILY_CODE = {
    "INT64": 1,
    "FLOAT64": 2,
    "FLOAT32": 3,
    "BOOL": 4,
    "STRING": 5,
    "BYTES": 6,
    "DATE": 7,
    "TIMESTAMP": 8,
    "NUMERIC": 9,
    "JSON": 10,
    "ARRAY": 11,
}


@dataclass(frozen=True, slots=True)
class SpannerType:
    """A column's type: its family (GoogleSQL's name, "INT64", ...), and for an array the
    element's."""

    family: str
    element: SpannerType | None = None

    @property
    def code(self) -> int:
        """A small number per family (``ColumnInfo.type_code``)."""
        return _FAMILY_CODE.get(self.family, 0)


def parse_type(spanner_type: str) -> SpannerType:
    """``information_schema.columns.spanner_type`` of either dialect as a SpannerType."""
    text = spanner_type.strip()
    array = _ARRAY_G.match(text)
    if array:
        return SpannerType("ARRAY", parse_type(array.group(1)))
    if text.endswith("[]"):
        return SpannerType("ARRAY", parse_type(text[:-2]))
    lowered = _LENGTH.sub("", text).strip().lower()
    if lowered in _PG_FAMILY:
        return SpannerType(_PG_FAMILY[lowered])
    return SpannerType(_LENGTH.sub("", text).strip().upper())


def arrow_type(t: SpannerType) -> pa.DataType:
    return {
        "INT64": pa.int64(),
        "FLOAT64": pa.float64(),
        "FLOAT32": pa.float32(),
        "BOOL": pa.bool_(),
        "BYTES": pa.binary(),
        "DATE": pa.date32(),
        "TIMESTAMP": pa.timestamp("us", tz="UTC"),
    }.get(t.family, pa.string())


def param_type(t: SpannerType) -> Any:
    """The client library's parameter type for binding a value of ``t`` (a key bound)."""
    from google.cloud.spanner_v1 import param_types

    return {
        "INT64": param_types.INT64,
        "FLOAT64": param_types.FLOAT64,
        "FLOAT32": param_types.FLOAT32,
        "BOOL": param_types.BOOL,
        "STRING": param_types.STRING,
        "BYTES": param_types.BYTES,
        "DATE": param_types.DATE,
        "TIMESTAMP": param_types.TIMESTAMP,
        "NUMERIC": param_types.NUMERIC,
    }.get(t.family)


def key_binding(t: SpannerType, value: Any) -> Any:
    """A key value of the value model as the client library binds it."""
    if value is None:
        return None
    if t.family == "BYTES":
        return base64.b64encode(value)
    if t.family == "NUMERIC":
        return Decimal(value)
    return value


# --- the chunk side --------------------------------------------------------------------------


def _timestamp(value: Any) -> dt.datetime:
    # DatetimeWithNanoseconds is a datetime with the nanoseconds beside it: microseconds
    # are kept, as in the value model.
    return dt.datetime(
        value.year,
        value.month,
        value.day,
        value.hour,
        value.minute,
        value.second,
        value.microsecond,
        tzinfo=dt.UTC,
    )


def _json_text(document: Any) -> RawJson:
    return RawJson(json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False))


def _jsonable(t: SpannerType, value: Any) -> Any:
    """An array element of the value model as JSON can hold it."""
    if value is None:
        return None
    if t.family == "BYTES":
        return base64.b64encode(value).decode("ascii")
    if t.family in ("DATE", "TIMESTAMP"):
        return value.isoformat()
    if t.family == "JSON":
        return json.loads(value.text)
    if t.family in ("INT64", "FLOAT64", "FLOAT32", "BOOL", "STRING"):
        return value
    return str(value)


def _array_text(t: SpannerType, values: list[Any]) -> str:
    return json.dumps([_jsonable(t, v) for v in values], separators=(",", ":"), ensure_ascii=False)


def read_converter(t: SpannerType) -> Convert | None:
    """What turns a chunk read's value into the value model; None: it is already."""
    family = t.family
    if family in ("INT64", "FLOAT64", "FLOAT32", "BOOL", "STRING", "DATE"):
        return None
    if family == "BYTES":
        return lambda v: None if v is None else base64.b64decode(v)
    if family == "TIMESTAMP":
        return lambda v: None if v is None else _timestamp(v)
    if family == "JSON":
        # The client parses the document into a JsonObject; its own serialize() gives JSON
        # text (None for a JSON null, stored as the text "null").
        return lambda v: None if v is None else _json_text(json.loads(v.serialize() or "null"))
    if family == "ARRAY":
        assert t.element is not None
        element = read_converter(t.element)
        inner = t.element

        def array(v: Any) -> Any:
            if v is None:
                return None
            items = list(v) if element is None else [element(x) for x in v]
            return _array_text(inner, items)

        return array
    return lambda v: None if v is None else str(v)


# --- the mod side ----------------------------------------------------------------------------


def parse_timestamp(text: str) -> dt.datetime:
    """RFC 3339 with up to nine fraction digits (Spanner's) as an aware UTC datetime,
    microseconds kept."""
    text = text.strip()
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    head, sep, rest = text.partition(".")
    if sep:
        digits = re.match(r"\d*", rest)
        assert digits is not None
        fraction = digits.group(0)
        text = f"{head}.{(fraction + '000000')[:6]}{rest[len(fraction) :]}"
    return dt.datetime.fromisoformat(text).astimezone(dt.UTC)


def _mod_float(v: Any) -> Any:
    if v is None:
        return None
    return float(v)  # a number, or "NaN" / "Infinity" text


def mod_converter(t: SpannerType) -> Convert:
    """What turns a mod's JSON value into the value model."""
    family = t.family
    if family == "INT64":
        return lambda v: None if v is None else int(v)
    if family in ("FLOAT64", "FLOAT32"):
        return _mod_float
    if family == "BOOL":
        return lambda v: None if v is None else bool(v)
    if family == "BYTES":
        return lambda v: None if v is None else base64.b64decode(v)
    if family == "DATE":
        return lambda v: None if v is None else dt.date.fromisoformat(v)
    if family == "TIMESTAMP":
        return lambda v: None if v is None else parse_timestamp(v)
    if family == "JSON":
        return lambda v: None if v is None else _json_text(json.loads(v))
    if family == "ARRAY":
        assert t.element is not None
        inner = t.element
        element = mod_converter(inner)
        textless = inner.family not in ("STRING", "JSON")

        def array(v: Any) -> Any:
            if v is None:
                return None
            # The emulator writes a NULL element as the text "NULL": read as NULL where
            # the element type has no such text (not for STRING elements).
            items = [None if x is None or (x == "NULL" and textless) else element(x) for x in v]
            return _array_text(inner, items)

        return array
    return lambda v: None if v is None else str(v)

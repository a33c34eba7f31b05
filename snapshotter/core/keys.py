"""Typed primary-key values to and from JSON, so state files stay readable and exact.

Every value is written as ``{"type": ..., "value": ...}``: a key read back has the same
Python type it was written with (a Decimal keeps its scale, bytes stay bytes, an aware
timestamp keeps its offset). No pickle: state is meant to be read by people and by other
tools.

A NaN float is a key value like any other (PostgreSQL's float types order NaN above every
number, and a primary key may hold it). NaN never equals NaN, so every NaN a key holds is
the one object :data:`NAN`: tuples holding it then compare and hash equal (Python compares
tuple items by identity first), which is what sets of keys and key equality need.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable, Sequence
from datetime import date, datetime, time, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any, cast
from uuid import UUID

KeyValue = int | Decimal | str | bytes | UUID | date | datetime | time | timedelta | bool | float
Key = tuple[KeyValue, ...]

# The one NaN keys hold (see the module docstring).
NAN = float("nan")
_MICROSECOND = timedelta(microseconds=1)


class KeyCodecError(ValueError):
    """A key value that cannot be written to, or read from, typed JSON."""


def encode_value(value: object) -> dict[str, Any]:
    # Order matters: bool is an int, datetime is a date.
    match value:
        case bool():
            return {"type": "bool", "value": value}
        case int():
            return {"type": "int", "value": value}
        case float():
            # repr round-trips exactly; JSON has no inf/nan, so keep them as text too.
            return {"type": "float", "value": "nan" if math.isnan(value) else repr(value)}
        case Decimal():
            return {"type": "decimal", "value": str(value)}
        case str():
            return {"type": "text", "value": value}
        case bytes() | bytearray() | memoryview():
            return {"type": "bytes", "value": base64.b64encode(bytes(value)).decode("ascii")}
        case UUID():
            return {"type": "uuid", "value": str(value)}
        case datetime():
            kind = "timestamp" if value.tzinfo is None else "timestamptz"
            return {"type": kind, "value": value.isoformat()}
        case date():
            return {"type": "date", "value": value.isoformat()}
        case time():
            kind = "time" if value.tzinfo is None else "timetz"
            return {"type": kind, "value": value.isoformat()}
        case timedelta():  # MySQL's TIME: a signed duration, kept to the microsecond
            return {"type": "duration", "value": value // _MICROSECOND}
        case None:
            raise KeyCodecError("a primary-key value is NULL; key columns must be NOT NULL")
    raise KeyCodecError(f"cannot store a key value of type {type(value).__name__}")


def canonical_value(value: object) -> object:
    """``value``, with a NaN float as :data:`NAN`."""
    if type(value) is float and value != value:
        return NAN
    return value


def _decode_float(text: str) -> float:
    if text.lower() == "nan":
        return NAN
    out = float(text)
    if math.isnan(out):  # "-nan" and the like: only "nan" is written
        raise KeyCodecError(f"{text!r} is not a float as keys are written")
    return out


def _decode_duration(value: object) -> KeyValue:
    if not isinstance(value, int) or isinstance(value, bool):
        return _wrong("duration", value)
    return timedelta(microseconds=value)


def _decode_decimal(text: str) -> Decimal:
    try:
        return Decimal(text)
    except InvalidOperation:
        raise KeyCodecError(f"{text!r} is not a decimal") from None


def _offset_checked(
    kind: str, parse: Callable[[str], datetime | time], *, aware: bool
) -> Callable[[str], KeyValue]:
    """``parse``, refusing a value with (naive kinds) or without (aware kinds) a UTC offset."""

    def decode(text: str) -> KeyValue:
        out = parse(text)
        if (out.tzinfo is not None) != aware:
            raise KeyCodecError(f"{kind} {text!r} needs {'a' if aware else 'no'} UTC offset")
        return out

    return decode


def _from_text(kind: str, parse: Callable[[str], KeyValue]) -> Callable[[object], KeyValue]:
    """A decoder for values written as JSON strings: anything else is an error, not coerced."""

    def decode(value: object) -> KeyValue:
        if not isinstance(value, str):
            return _wrong(kind, value)
        return parse(value)

    return decode


_DECODERS: dict[str, Callable[[object], KeyValue]] = {
    "bool": lambda v: v if isinstance(v, bool) else _wrong("bool", v),
    "int": lambda v: v if isinstance(v, int) and not isinstance(v, bool) else _wrong("int", v),
    "float": _from_text("float", _decode_float),
    "decimal": _from_text("decimal", _decode_decimal),
    "text": _from_text("text", str),
    "bytes": _from_text("bytes", lambda v: base64.b64decode(v, validate=True)),
    "uuid": _from_text("uuid", UUID),
    "timestamp": _from_text(
        "timestamp", _offset_checked("timestamp", datetime.fromisoformat, aware=False)
    ),
    "timestamptz": _from_text(
        "timestamptz", _offset_checked("timestamptz", datetime.fromisoformat, aware=True)
    ),
    "date": _from_text("date", date.fromisoformat),
    "time": _from_text("time", _offset_checked("time", time.fromisoformat, aware=False)),
    "timetz": _from_text("timetz", _offset_checked("timetz", time.fromisoformat, aware=True)),
    "duration": _decode_duration,
}


def _wrong(kind: str, value: object) -> KeyValue:
    raise KeyCodecError(f"{value!r} is not a valid {kind} value")


def decode_value(obj: object) -> KeyValue:
    if not isinstance(obj, dict) or set(obj) != {"type", "value"}:
        raise KeyCodecError(f'a key value must be {{"type": ..., "value": ...}}, got {obj!r}')
    decoder = _DECODERS.get(obj["type"]) if isinstance(obj["type"], str) else None
    if decoder is None:
        raise KeyCodecError(f"unknown key value type {obj['type']!r}")
    try:
        value: KeyValue = decoder(obj["value"])
    except KeyCodecError:
        raise
    except (ValueError, TypeError) as exc:
        raise KeyCodecError(f"bad {obj['type']} key value {obj['value']!r}: {exc}") from None
    return value


def _require_sequence(key: object) -> None:
    # A str or bytes is a sequence too, but never a key: it would become one column per char.
    if isinstance(key, str | bytes | bytearray | memoryview) or not isinstance(key, Sequence):
        raise KeyCodecError(f"a key is a tuple of column values, not {type(key).__name__}")


def encode_key(key: Sequence[object]) -> list[dict[str, Any]]:
    _require_sequence(key)
    if not key:
        raise KeyCodecError("a key has at least one column")
    return [encode_value(v) for v in key]


def decode_key(obj: object) -> Key:
    if not isinstance(obj, list) or not obj:
        raise KeyCodecError(f"a key must be a non-empty JSON list, got {obj!r}")
    return tuple(decode_value(v) for v in obj)


def normalize_key(key: Sequence[object]) -> Key:
    """A key as a tuple of storable values (bytes-likes become bytes, a NaN :data:`NAN`);
    checks every value."""
    _require_sequence(key)
    out: list[KeyValue] = []
    for value in key:
        if isinstance(value, bytearray | memoryview):
            value = bytes(value)
        value = canonical_value(value)
        encode_value(value)  # raises for NULL and unsupported types
        out.append(cast(KeyValue, value))
    if not out:
        raise KeyCodecError("a key has at least one column")
    return tuple(out)

"""Typed primary-key values to and from JSON, so state files stay readable and exact.

Every value is written as ``{"type": ..., "value": ...}``: a key read back has the same
Python type it was written with (a Decimal keeps its scale, bytes stay bytes, an aware
timestamp keeps its offset). No pickle: state is meant to be read by people and by other
tools.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence
from datetime import date, datetime, time
from decimal import Decimal, InvalidOperation
from typing import Any, cast
from uuid import UUID

KeyValue = int | Decimal | str | bytes | UUID | date | datetime | time | bool | float
Key = tuple[KeyValue, ...]


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
            if math.isnan(value):  # NaN != NaN: it cannot identify a row, nor be read back
                raise KeyCodecError("NaN cannot be a key value")
            # repr round-trips exactly; JSON has no inf/nan, so keep them as text too.
            return {"type": "float", "value": repr(value)}
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
        case None:
            raise KeyCodecError("a primary-key value is NULL; key columns must be NOT NULL")
    raise KeyCodecError(f"cannot store a key value of type {type(value).__name__}")


def _decode_float(text: str) -> float:
    out = float(text)
    if math.isnan(out):
        raise KeyCodecError("NaN cannot be a key value")
    return out


def _decode_decimal(text: str) -> Decimal:
    try:
        return Decimal(text)
    except InvalidOperation:
        raise KeyCodecError(f"{text!r} is not a decimal") from None


def _decode_aware(text: str) -> datetime:
    out = datetime.fromisoformat(text)
    if out.tzinfo is None:
        raise KeyCodecError(f"timestamptz {text!r} has no UTC offset")
    return out


_DECODERS: dict[str, Any] = {
    "bool": lambda v: v if isinstance(v, bool) else _wrong("bool", v),
    "int": lambda v: v if isinstance(v, int) and not isinstance(v, bool) else _wrong("int", v),
    "float": _decode_float,
    "decimal": _decode_decimal,
    "text": lambda v: v if isinstance(v, str) else _wrong("text", v),
    "bytes": lambda v: base64.b64decode(v, validate=True),
    "uuid": lambda v: UUID(v) if isinstance(v, str) else _wrong("uuid", v),
    "timestamp": datetime.fromisoformat,
    "timestamptz": _decode_aware,
    "date": date.fromisoformat,
    "time": time.fromisoformat,
    "timetz": time.fromisoformat,
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


def encode_key(key: Sequence[object]) -> list[dict[str, Any]]:
    if not key:
        raise KeyCodecError("a key has at least one column")
    return [encode_value(v) for v in key]


def decode_key(obj: object) -> Key:
    if not isinstance(obj, list) or not obj:
        raise KeyCodecError(f"a key must be a non-empty JSON list, got {obj!r}")
    return tuple(decode_value(v) for v in obj)


def normalize_key(key: Sequence[object]) -> Key:
    """A key as a tuple of storable values (bytes-likes become bytes); checks every value."""
    out: list[KeyValue] = []
    for value in key:
        if isinstance(value, bytearray | memoryview):
            value = bytes(value)
        encode_value(value)  # raises for NULL and unsupported types
        out.append(cast(KeyValue, value))
    if not out:
        raise KeyCodecError("a key has at least one column")
    return tuple(out)

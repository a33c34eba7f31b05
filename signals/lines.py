"""Signals as JSON lines (the file channel) or messages (the Kafka channel), without IO:
complete lines cut from bytes read, each line or message parsed into the three fields a
signal table row has (``parse_signal``'s input).

One line (one message) is one signal in Debezium's file- and Kafka-channel shape::

    {"id": "snap-1", "type": "execute-snapshot", "data": {"data-collections": ["public.t"]}}

``data`` may also be a JSON string holding the object (as the signal table's column does) or
absent. A line not yet ended by a newline is not read: a writer may be half-way through it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

MAX_LINE_BYTES = 1_000_000  # a longer line is refused, not buffered without end


@dataclass(frozen=True)
class SignalLine:
    """One complete line (message): where it is (its byte offset in the file, or its offset
    in the topic; ``where``, for messages: "line 3", "offset 17"), and the row it stands
    for (``id``, ``type``, ``data``: as a signal table row has them) or why it is none
    (``problem``, which starts with ``where``)."""

    offset: int
    where: str
    id: object = None
    type: object = None
    data: str | None = None
    problem: str | None = None


def complete_lines(
    buffer: bytes, offset: int, first_line: int
) -> tuple[list[SignalLine], int, int]:
    """The complete lines of ``buffer`` (read from byte ``offset`` of the file; its first line
    is line ``first_line``), parsed; blank lines skipped. Returns them, the offset after the
    last complete line, and the number of the line that starts there. A line too long to
    ever be a signal is returned as a problem and passed over once it ends."""
    found: list[SignalLine] = []
    start = 0
    number = first_line
    while True:
        end = buffer.find(b"\n", start)
        if end < 0:
            break
        raw = buffer[start:end]
        if raw.strip():
            found.append(parse_line(raw, offset + start, f"line {number}"))
        start = end + 1
        number += 1
    return found, offset + start, number


def parse_line(raw: bytes, offset: int, where: str) -> SignalLine:
    """One line (message) as a signal row, or the reason it is not one."""

    def problem(text: str) -> SignalLine:
        return SignalLine(offset, where, problem=f"{where}: {text}")

    if len(raw) > MAX_LINE_BYTES:
        return problem(f"longer than {MAX_LINE_BYTES} bytes; a signal is one short JSON object")
    try:
        value = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return problem("not UTF-8 text; write each signal as a JSON object in UTF-8")
    except json.JSONDecodeError as exc:
        return problem(
            f"not JSON ({exc.msg} at column {exc.colno}); write each signal as one JSON object "
            'on one line, e.g. {"id": "s1", "type": "execute-snapshot", "data": {...}}'
        )
    if not isinstance(value, dict):
        return problem(
            f"a JSON {type(value).__name__}, not an object; write each signal as "
            '{"id": ..., "type": ..., "data": {...}}'
        )
    unknown = sorted(set(value) - {"id", "type", "data"})
    if unknown:
        return problem(
            f"unknown field(s) {', '.join(map(repr, unknown))}; a signal has id, type and data"
        )
    data = value.get("data")
    text = data if isinstance(data, str) or data is None else json.dumps(data)
    return SignalLine(offset, where, id=value.get("id"), type=value.get("type"), data=text)

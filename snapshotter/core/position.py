"""Positions in one source's log: totally ordered, and serialized so text order is log order.

A position is a tuple of unsigned 64-bit integers compared left to right. Each log reader
chooses what the parts mean, and uses the same number of parts for every event it emits:

* PostgreSQL: ``(commit LSN of the transaction, sequence of the event inside it)``.
* MySQL/MariaDB: e.g. ``(binlog file number, event offset, row in the event, ...)``, with
  room for what one binlog row turns into (a key change becomes a delete and a create) or
  for events packed inside a compressed transaction payload.

READ rows emitted at a close watermark get the watermark's position plus one more part (the
row's index), so they sort after the watermark and before the next log event:
``(L, s) < (L, s, 0) < (L, s, 1) < ... < (L, s + 1)``.

The token writes each part as 16 lower-case hex digits joined by ``-``. Every part has the
same width, so comparing tokens as strings compares the tuples, even when one is a prefix of
the other (``"a-b"`` sorts before ``"a-b-0"``). A sink can keep "the event with the highest
position" with a plain string max.
"""

from __future__ import annotations

import re
from functools import total_ordering

import pyarrow as pa
import pyarrow.compute as pc

_U64 = (1 << 64) - 1
_TOKEN = re.compile(r"[0-9a-f]{16}(?:-[0-9a-f]{16})*")


class PositionError(ValueError):
    """A position out of range, or a token that is not one."""


@total_ordering
class Position:
    __slots__ = ("_parts", "_token")
    _parts: tuple[int, ...]
    _token: str | None

    def __init__(self, *parts: int) -> None:
        if not parts:
            raise PositionError("a position has at least one part")
        for part in parts:
            if not isinstance(part, int) or isinstance(part, bool) or not 0 <= part <= _U64:
                raise PositionError(f"position part {part!r} is not in 0..{_U64}")
        object.__setattr__(self, "_parts", parts)
        object.__setattr__(self, "_token", None)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("a Position is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("a Position is immutable")

    def __reduce__(self) -> tuple[type[Position], tuple[int, ...]]:
        # copy, deepcopy and pickle rebuild through __init__; their default restores the
        # slot with setattr, which an immutable Position refuses.
        return (Position, self._parts)

    @property
    def parts(self) -> tuple[int, ...]:
        return self._parts

    @property
    def token(self) -> str:
        token = self._token
        if token is None:  # computed once: sinks write it for every event
            token = "-".join(f"{part:016x}" for part in self._parts)
            object.__setattr__(self, "_token", token)
        return token

    @classmethod
    def from_token(cls, token: str) -> Position:
        if not isinstance(token, str) or _TOKEN.fullmatch(token) is None:
            raise PositionError(f"{token!r} is not a position token")
        return cls(*(int(part, 16) for part in token.split("-")))

    def read_row(self, index: int) -> Position:
        """The position of READ row ``index`` (0-based) emitted at this close watermark."""
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index <= _U64:
            raise PositionError(f"read row index {index!r} is not in 0..{_U64}")
        # The parts are already checked: skip __init__ (this runs once per READ row).
        out = object.__new__(Position)
        object.__setattr__(out, "_parts", (*self._parts, index))
        object.__setattr__(out, "_token", None)
        return out

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Position):
            return NotImplemented
        return self._parts == other._parts

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Position):
            return NotImplemented
        return self._parts < other._parts

    def __hash__(self) -> int:
        return hash(self._parts)

    def __repr__(self) -> str:
        return f"Position{self._parts!r}" if len(self._parts) > 1 else f"Position({self._parts[0]})"

    def __str__(self) -> str:
        return self.token


# --- READ row tokens, column-wise -----------------------------------------------------------
#
# A chunk's READ rows get ``<close token>-<row index as 16 hex digits>``. Formatting each index
# in Python costs a string per row; instead the index is split into four 16-bit digits, each
# looked up in a table of the 65,536 four-hex-digit strings and joined by Arrow, so a whole
# chunk's tokens are built in a few vectorised calls.

_HEX4: pa.Array | None = None
_INDEX: pa.Array = pa.array([], type=pa.uint64())  # 0, 1, 2, ...: sliced, grown on demand


def _hex4() -> pa.Array:
    global _HEX4
    if _HEX4 is None:
        _HEX4 = pa.array([f"{i:04x}" for i in range(1 << 16)], type=pa.string())
    return _HEX4


def _indexes(count: int) -> pa.Array:
    global _INDEX
    if len(_INDEX) < count:
        size = max(count, 2 * len(_INDEX), 1 << 16)
        one = pa.scalar(1, type=pa.uint64())
        _INDEX = pc.subtract(pc.cumulative_sum(pa.repeat(one, size)), one)
    return _INDEX.slice(0, count)


def read_tokens(close: Position, count: int) -> pa.Array:
    """The tokens of READ rows ``0 .. count - 1`` at close watermark ``close``: equal to
    ``close.read_row(i).token`` for each ``i``, as one Arrow string array."""
    if count < 0:
        raise PositionError(f"read row count {count} is negative")
    if count == 0:
        return pa.array([], type=pa.string())
    index = _indexes(count)
    table = _hex4()
    # 16-bit digits above the largest index are "0000" for every row: part of the prefix.
    used = max(1, ((count - 1).bit_length() + 15) // 16)
    digits = [
        table.take(pc.bit_wise_and(pc.shift_right(index, 16 * d), 0xFFFF))
        for d in reversed(range(used))
    ]
    prefix = pa.scalar(close.token + "-" + "0000" * (4 - used), type=pa.string())
    return pc.binary_join_element_wise(prefix, *digits, pa.scalar("", type=pa.string()))

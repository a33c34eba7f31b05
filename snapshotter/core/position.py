"""Positions in one source's log: totally ordered, and serialized so text order is log order.

A position is three unsigned integers compared in turn:

* ``major``: PostgreSQL: the commit LSN of the event's transaction.
  MySQL/MariaDB: the binlog file's sequence number (``mysql-bin.000042`` → 42).
* ``minor``: PostgreSQL: the event's sequence number inside its transaction.
  MySQL/MariaDB: the offset of the row event in the binlog file.
* ``row``: the row inside a log event (MySQL row events carry several rows; 0 for PostgreSQL);
  READ rows emitted at a close watermark take the rows just after the watermark's own row, so
  they sort after the watermark and before the next log event.

The token is fixed-width lower-case hex, ``MMMMMMMMMMMMMMMM-mmmmmmmmmmmmmmmm-rrrrrrrr``, so
sorting tokens as strings sorts positions (a sink can keep "the event with the highest
position" with a plain string max).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_U64 = (1 << 64) - 1
_U32 = (1 << 32) - 1
_TOKEN = re.compile(r"([0-9a-f]{16})-([0-9a-f]{16})-([0-9a-f]{8})")


class PositionError(ValueError):
    """A position out of range, or a token that is not one."""


@dataclass(frozen=True, slots=True, order=True)
class Position:
    major: int
    minor: int
    row: int = 0

    def __post_init__(self) -> None:
        for name, value, limit in (
            ("major", self.major, _U64),
            ("minor", self.minor, _U64),
            ("row", self.row, _U32),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= limit:
                raise PositionError(f"position {name} {value!r} is not in 0..{limit}")

    @property
    def token(self) -> str:
        return f"{self.major:016x}-{self.minor:016x}-{self.row:08x}"

    @classmethod
    def from_token(cls, token: str) -> Position:
        m = _TOKEN.fullmatch(token)
        if m is None:
            raise PositionError(f"{token!r} is not a position token")
        return cls(int(m[1], 16), int(m[2], 16), int(m[3], 16))

    def read_row(self, index: int) -> Position:
        """The position of READ row ``index`` (0-based) emitted at this close watermark."""
        return Position(self.major, self.minor, self.row + 1 + index)

    def __str__(self) -> str:
        return self.token

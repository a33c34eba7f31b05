"""Value types events carry besides plain Python scalars.

The value model every reader produces (chunk rows and log rows alike, so a READ row and a
log row of the same table are indistinguishable):

* int, float, bool, str, bytes, ``datetime.date``, naive ``datetime`` (timestamp without
  time zone), aware ``datetime`` in UTC (timestamptz), naive ``datetime.time``;
* exact numerics, uuids, intervals, arrays and every type without a native mapping as the
  database's own text form (``str``), as Debezium does with ``decimal.handling.mode=string``:
  no float rounding, no scale lost, and the text is the same from the chunk SELECT and from
  the log because both come from the type's output function;
* JSON documents as :class:`RawJson`, the database's JSON text, so sinks embed it as JSON
  without re-parsing (and without float rounding).
* ``None`` for SQL NULL.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class RawJson:
    """A JSON document as the database wrote it (valid JSON text)."""

    text: str

    def parsed(self) -> Any:
        return json.loads(self.text)


# Debezium's placeholder for a value the log did not carry (PostgreSQL unchanged TOAST under
# a replica identity that does not log the old value). Sinks must not take it as data.
UNAVAILABLE_VALUE = "__debezium_unavailable_value"

"""PostgreSQL values: one set of psycopg loaders for chunk rows and log rows alike.

The chunk SELECT (text format) and pgoutput (text tuples) both hand us each value as the
type's text output. Both paths load that text with the *same* loaders, chosen by type OID
here, so a READ row and a log row of the same table carry identical Python types (see
``snapshotter.core.values`` for the value model). Types without a native mapping stay as
their text, which both paths produce identically.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from psycopg import postgres
from psycopg.abc import Buffer
from psycopg.adapt import AdaptersMap, Loader, Transformer
from psycopg.types import bool as pg_bool
from psycopg.types import datetime as pg_datetime
from psycopg.types import numeric as pg_numeric
from psycopg.types import string as pg_string

from snapshotter.core.keys import NAN
from snapshotter.core.values import RawJson

INVALID_OID = 0
JSON_OIDS = frozenset({114, 3802})  # json, jsonb


@dataclass(frozen=True, slots=True)
class PgType:
    """How one PostgreSQL type is loaded and buffered."""

    loader: type[Loader]
    arrow: pa.DataType


_TEXT = PgType(pg_string.TextLoader, pa.string())


class FloatLoader(Loader):
    """float4 / float8: every NaN as the one NaN keys use (``snapshotter.core.keys.NAN``),
    so a key holding NaN equals itself: an update of a NaN-keyed row is an update, not a
    key change, and the row's keys match wherever keys are compared."""

    def load(self, data: Buffer) -> float:
        value = float(data if isinstance(data, bytes) else bytes(data))
        return NAN if value != value else value


# Type OID -> loader and Arrow type. Everything else is text (exact, and equal on both paths).
PG_TYPES: dict[int, PgType] = {
    16: PgType(pg_bool.BoolLoader, pa.bool_()),  # bool
    20: PgType(pg_numeric.IntLoader, pa.int64()),  # int8
    21: PgType(pg_numeric.IntLoader, pa.int64()),  # int2
    23: PgType(pg_numeric.IntLoader, pa.int64()),  # int4
    26: PgType(pg_numeric.IntLoader, pa.int64()),  # oid
    700: PgType(FloatLoader, pa.float64()),  # float4
    701: PgType(FloatLoader, pa.float64()),  # float8
    25: _TEXT,  # text
    1043: _TEXT,  # varchar
    1042: _TEXT,  # bpchar: kept as sent (a cast to text would strip its padding)
    19: _TEXT,  # name
    18: _TEXT,  # "char"
    17: PgType(pg_string.ByteaLoader, pa.binary()),  # bytea
    1082: PgType(pg_datetime.DateLoader, pa.date32()),  # date
    1114: PgType(pg_datetime.TimestampLoader, pa.timestamp("us")),  # timestamp
    1184: PgType(pg_datetime.TimestamptzLoader, pa.timestamp("us", tz="UTC")),  # timestamptz
    1083: PgType(pg_datetime.TimeLoader, pa.time64("us")),  # time
}


def loaded_natively(oid: int) -> bool:
    """Whether values of this type are loaded by type; every other column is selected as
    :data:`OUTPUT_TEXT`, the text its type's output function writes, which is what pgoutput
    sends, so both paths hold the same text."""
    return oid in PG_TYPES


# The text of a value as its type's output function writes it, for a column ``{0}``:
# ``concat`` writes a non-text argument with its output function, and ``num_nonnulls`` tells
# NULL from a composite whose fields are all NULL (which ``IS NULL`` would take for NULL).
# Not ``CAST({0} AS text)``: for inet, bool and bpchar (or a domain over them, whose values
# come as the domain's type) the cast to text is a function that writes another text than
# the output function: '10.0.0.1/32' for '10.0.0.1', 'true' for 't', no trailing blanks.
OUTPUT_TEXT = "CASE WHEN num_nonnulls({0}) = 1 THEN concat({0}) END"


def pg_type(oid: int) -> PgType:
    return PG_TYPES.get(oid, _TEXT)


def arrow_type(oid: int) -> pa.DataType:
    return pg_type(oid).arrow


def adapters() -> AdaptersMap:
    """A loader map with exactly the loaders above and text for every other OID.

    Give it to a connection (``psycopg.connect(..., context=LoadContext())``) or to a
    :class:`Transformer` for log tuples; the text-format loaders are the same either way.
    """
    amap = AdaptersMap(types=postgres.types)
    amap.register_loader(INVALID_OID, pg_string.TextLoader)
    for oid, pg in PG_TYPES.items():
        amap.register_loader(oid, pg.loader)
    for oid in JSON_OIDS:
        amap.register_loader(oid, pg_string.TextLoader)
    return amap


class LoadContext:
    """An adaptation context carrying :func:`adapters` (psycopg's ``AdaptContext``)."""

    def __init__(self) -> None:
        self._adapters = adapters()

    @property
    def adapters(self) -> AdaptersMap:
        return self._adapters

    @property
    def connection(self) -> None:
        return None


def transformer() -> Any:
    """A psycopg Transformer (``.get_loader(oid, 0).load(text)``) with :func:`adapters`."""
    return Transformer(LoadContext())


def finish_value(oid: int, value: Any) -> Any:
    """The loaded value as events carry it: JSON text becomes :class:`RawJson`."""
    if value is not None and oid in JSON_OIDS:
        return RawJson(value)
    return value

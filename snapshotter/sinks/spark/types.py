"""What a source table lands as: its Arrow (and so Parquet and Spark) schema, and events as
Arrow tables of that schema.

The landed schema comes from the source catalog (``TableSchema``), never from the values of a
batch, so a table lands with the same types whatever its first batch held. Both kinds of row,
READ rows from chunk SELECTs and rows from the log decoder, are in the value model
(``snapshotter.core.values``) and go through this one conversion, so they land with identical
types by construction.

Each catalog Arrow type lands as itself except where Parquet or Spark has no such type:

========================  ==========================  =========================================
catalog (reader) type      landed type                 why
========================  ==========================  =========================================
time64 (PG ``time``)       string ``HH:MM:SS.ffffff``  Spark has no time-of-day type
duration (MySQL ``TIME``)  string ``[-]H:MM:SS.ffffff`` Spark reads no Parquet duration
uint64 (``BIGINT UNSIGNED``) decimal(20, 0)            Spark has no unsigned 64-bit integer
decimal256 (p > 38)        string                      Spark decimals stop at 38 digits
string of PG ``numeric(p,s)``, p <= 38   decimal(max(p, s), s)  exact numerics stay numbers
========================  ==========================  =========================================

``timestamptz`` lands as a UTC timestamp (Spark ``TimestampType``), ``timestamp`` without zone
as ``TimestampNTZType``, bytes as binary, JSON as its text (Spark has no JSON type).

Each landed row also has:

* ``__op``: c, u, d, r or t; ``__pos``: the event's position token (text order = log order);
  ``__ts_ms``: the envelope's ``ts_ms``; ``__snapshot``: ``source.snapshot`` ("false",
  "incremental");
* ``__unavailable``: the columns whose value the log did not carry (PostgreSQL's unchanged
  TOAST values, in an update or in the create of a key change), landed as NULL and resolved
  from the key's previous state when landing; where there is none (a new key, or the key was
  deleted since) the column stays NULL and listed here: Debezium's placeholder text is never
  landed as data; NULL when none;
* ``__batch``: the staged batch the row came in (landing is idempotent per batch).

A delete lands the key columns (from the event's key) and what the log gave of the old row; a
truncate lands NULL in every column.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from snapshotter.core.events import ChangeEvent, Op
from snapshotter.core.values import UNAVAILABLE_VALUE, RawJson
from snapshotter.core.window import ReadBatch, StagedReadBatch
from snapshotter.sources.base import ColumnInfo, TableSchema

log = logging.getLogger(__name__)

OP = "__op"
POS = "__pos"
TS_MS = "__ts_ms"
SNAPSHOT = "__snapshot"
UNAVAILABLE = "__unavailable"
BATCH = "__batch"
# The changelog's before-image of an update or a delete (Debezium's ``before``): a struct of
# the table's columns, NULL for READ rows, creates, truncates and events whose source gave
# none. Only in the changelog: the current state is the latest row per key.
BEFORE = "__before"

META_FIELDS: tuple[pa.Field, ...] = (
    pa.field(OP, pa.string(), nullable=False),
    pa.field(POS, pa.string(), nullable=False),
    pa.field(TS_MS, pa.int64(), nullable=False),
    pa.field(SNAPSHOT, pa.string(), nullable=False),
    pa.field(UNAVAILABLE, pa.list_(pa.string())),
    pa.field(BATCH, pa.int64(), nullable=False),
)
META_COLUMNS = tuple(f.name for f in META_FIELDS)
# The partition column of a base in the layout of issues 19 to 25, ``current/__base=<batch>``
# (a name of the landing's own, so it could never shadow a column of the table, as
# ``v=<batch>`` did for a table with a column ``v``). Bases are flat files now
# (sinks.spark.bases); the name stays reserved, as older landings still have it.
BASE_PARTITION = "__base"
RESERVED_COLUMNS = (*META_COLUMNS, BEFORE, BASE_PARTITION)

_PG_NUMERIC_OID = 1700
_NUMERIC = re.compile(r"^numeric\((\d+)(?:,\s*(\d+))?\)$")


class LandingTypeError(ValueError):
    """Values that do not fit the table's landed types; the message names table and column."""


class ValuesDoNotFit(LandingTypeError):
    """Under ``strict_values``: values that would land as NULL, as they do not fit their
    column's type (the column may have been widened at the source since it was described)."""


_STRICT: ContextVar[bool] = ContextVar("strict_values", default=False)


@contextmanager
def strict_values() -> Iterator[None]:
    """Values that do not fit their column raise ``ValuesDoNotFit`` instead of landing as
    NULL (the sink then describes the table again, and converts with its new types)."""
    token = _STRICT.set(True)
    try:
        yield
    finally:
        _STRICT.reset(token)


def _unfit(table: str, column: str) -> None:
    if _STRICT.get():
        raise ValuesDoNotFit(f"{table}: values of column {column!r} do not fit its type")


@dataclass(frozen=True, slots=True)
class LandedColumn:
    name: str
    source_type: pa.DataType  # the catalog's Arrow type: what reader values build into
    landed_type: pa.DataType


def landed_columns(schema: TableSchema) -> tuple[LandedColumn, ...]:
    return tuple(LandedColumn(c.name, c.arrow_type, _landed_type(c)) for c in schema.columns)


def landed_schema(schema: TableSchema) -> pa.Schema:
    """The landed schema of a table: its columns (all nullable: deletes and truncates land
    without them), then the meta columns."""
    for column in schema.columns:
        if column.name in RESERVED_COLUMNS:
            raise LandingTypeError(
                f"{schema.table}: column {column.name!r} has the name of a landing column; "
                "rename it to land this table"
            )
    fields = [pa.field(c.name, c.landed_type) for c in landed_columns(schema)]
    return pa.schema([*fields, *META_FIELDS, pa.field(BEFORE, pa.struct(fields))])


def _before_struct(schema: TableSchema, rows: Sequence[Mapping[str, Any] | None]) -> pa.Array:
    """``__before`` for ``rows`` (None: NULL)."""
    fields = [pa.field(c.name, c.landed_type) for c in landed_columns(schema)]
    if all(r is None for r in rows):
        return pa.nulls(len(rows), pa.struct(fields))
    mask = pa.array([r is None for r in rows], type=pa.bool_())
    return pa.StructArray.from_arrays(rows_to_landed(schema, rows), fields=fields, mask=mask)


def _landed_type(column: ColumnInfo) -> pa.DataType:
    source = column.arrow_type
    if pa.types.is_time(source) or pa.types.is_duration(source):
        return pa.string()
    if pa.types.is_uint64(source):
        return pa.decimal128(20, 0)
    if pa.types.is_decimal256(source):
        return pa.string()
    if pa.types.is_string(source) and column.type_code == _PG_NUMERIC_OID:
        match = _NUMERIC.match(column.type_name)
        if match:
            # PostgreSQL 15+ allows a scale above the precision (numeric(3,5): |v| < 0.01),
            # which Parquet and Spark refuse; decimal(s, s) holds the same values.
            scale = int(match.group(2) or 0)
            precision = max(int(match.group(1)), scale)
            if precision <= 38:
                return pa.decimal128(precision, scale)
    return source


# --- values to Arrow ------------------------------------------------------------------------


def _duration_text(value: timedelta) -> str:
    """MySQL's own TIME text: ``[-]H:MM:SS.ffffff`` (hours may exceed 24)."""
    micros = value // timedelta(microseconds=1)
    sign = "-" if micros < 0 else ""
    micros = abs(micros)
    seconds, fraction = divmod(micros, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hours, minute = divmod(minutes, 60)
    return f"{sign}{hours}:{minute:02d}:{second:02d}.{fraction:06d}"


def _two(values: pa.Array) -> pa.Array:
    return pc.utf8_lpad(values.cast(pa.string()), width=2, padding="0")


def _duration_texts(array: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """``_duration_text`` of every value of a ``duration("us")`` array, column-wise."""
    micros = array.cast(pa.int64())
    sign = pc.if_else(pc.less(micros, 0), "-", "")
    # Integer division truncates toward zero: split the magnitude, the sign goes in front.
    rest = pc.abs_checked(micros)
    seconds = pc.divide(rest, 1_000_000)
    fraction = pc.subtract(rest, pc.multiply(seconds, 1_000_000))
    minutes = pc.divide(seconds, 60)
    second = pc.subtract(seconds, pc.multiply(minutes, 60))
    hours = pc.divide(minutes, 60)
    minute = pc.subtract(minutes, pc.multiply(hours, 60))
    return pc.binary_join_element_wise(
        sign,
        hours.cast(pa.string()),
        ":",
        _two(minute),
        ":",
        _two(second),
        ".",
        pc.utf8_lpad(fraction.cast(pa.string()), width=6, padding="0"),
        "",
    )


def _plain(value: Any) -> Any:
    return value.text if type(value) is RawJson else value


def _source_array(table: str, column: LandedColumn, values: list[Any]) -> pa.Array:
    """``values`` (value model) as an array of the catalog type, as chunk reads build it."""
    if pa.types.is_duration(column.source_type):
        return pa.array(
            [None if v is None else _duration_text(v) for v in values], type=pa.string()
        )
    try:
        return pa.array(values, type=column.source_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        pass
    # JSON documents arrive as RawJson (their text lands).
    plain = [_plain(v) for v in values]
    try:
        return pa.array(plain, type=column.source_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        pass
    # A value Python could not hold in the column's type (PostgreSQL's timestamp 'infinity'
    # arrives as text): it lands as NULL, said in the log, and the stream goes on.
    fitted: list[Any] = []
    bad: list[Any] = []
    for value in plain:
        try:
            pa.array([value], type=column.source_type)
            fitted.append(value)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
            fitted.append(None)
            bad.append(value)
    _unfit(table, column.name)
    log.warning(
        "%s: %d value(s) of column %r do not fit its type %s (e.g. %.40r) and land as NULL",
        table,
        len(bad),
        column.name,
        column.source_type,
        bad[0],
    )
    return pa.array(fitted, type=column.source_type)


def _landed_array(table: str, column: LandedColumn, array: pa.Array) -> pa.Array:
    if array.type == column.landed_type:
        return array
    if pa.types.is_decimal256(array.type):
        # Arrow's cast writes small values in scientific notation ("1.23E-7", "0E-30"):
        # land the plain text the database shows, every digit of the scale.
        return pa.array(
            [None if v is None else format(v, "f") for v in array.to_pylist()], type=pa.string()
        )
    try:
        return array.cast(column.landed_type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    # Value by value: PostgreSQL numeric(p,s) also holds NaN (and, unconstrained by this
    # type, nothing else that a decimal cannot): such values land as NULL, said in the log.
    out: list[Any] = []
    bad = 0
    for value in array:
        try:
            out.append(pa.array([value.as_py()], type=array.type).cast(column.landed_type)[0])
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            out.append(None)
            bad += 1
    if bad:
        _unfit(table, column.name)
        log.warning(
            "%s: %d value(s) of column %r do not fit its landed type %s (e.g. numeric NaN) "
            "and land as NULL; the changelog keeps the same NULL",
            table,
            bad,
            column.name,
            column.landed_type,
        )
    return pa.array([None if v is None else v.as_py() for v in out], type=column.landed_type)


def rows_to_landed(schema: TableSchema, rows: Sequence[Mapping[str, Any] | None]) -> list[pa.Array]:
    """The table's columns, landed, for ``rows`` in the value model (None: a row of NULLs).
    Columns a row lacks are NULL; columns the catalog does not know are ignored."""
    table = str(schema.table)
    arrays = []
    for column in landed_columns(schema):
        name = column.name
        values = [None if r is None else r.get(name) for r in rows]
        arrays.append(_landed_array(table, column, _source_array(table, column, values)))
    return arrays


def _read_column(table: str, column: LandedColumn, rows: pa.Table) -> pa.Array:
    """One column of a READ batch (Arrow storage values, as the chunk reader built them) as
    ``_source_array`` builds the same values of a log row: the same array, since both are
    the catalog type; a duration as its text, column-wise."""
    if column.name not in rows.column_names:
        # A column described since the chunk was read (added at the source): the log path
        # lands a row without it as NULL.
        return pa.nulls(rows.num_rows, column.source_type)
    chunked = rows.column(column.name)
    array = chunked.chunk(0) if chunked.num_chunks == 1 else chunked.combine_chunks()
    if array.type != column.source_type:
        # Not what the chunk reader promises (ChunkRows.rows holds the catalog types): go
        # the way of log rows, value by value, so the landed values are the same anyway.
        return _source_array(table, column, array.to_pylist())
    if pa.types.is_duration(array.type):
        if array.type.unit == "us":
            return _duration_texts(array)
        return _source_array(table, column, array.to_pylist())
    return array


def read_batch_to_landed(schema: TableSchema, batch: ReadBatch, seq: int) -> pa.Table:
    """A READ batch's rows as a table of the landed schema, in the batch's (key) order,
    column-wise: no Python object per row.

    The same table as ``events_to_landed`` of ``batch.events()`` (tests/unit
    test_landing_read_batch.py): the columns go through the same casts, the value model's
    conversion of a chunk row (``batch.convert``: JSON text to RawJson) is undone by the
    landing (RawJson lands as its text) so it is skipped, and READ rows carry no
    unavailable values (they come from a SELECT)."""
    rows = batch.rows
    count = rows.num_rows
    arrays = read_rows_to_landed_data(schema, rows)
    meta = [
        pa.repeat(pa.scalar(Op.READ.value, pa.string()), count),
        batch.position_tokens(),
        pa.repeat(pa.scalar(int(batch.ts_ms), pa.int64()), count),
        pa.repeat(pa.scalar(batch.template.snapshot.value, pa.string()), count),
        pa.nulls(count, pa.list_(pa.string())),
        pa.repeat(pa.scalar(seq, pa.int64()), count),
    ]
    landed = landed_schema(schema)
    before = pa.nulls(count, landed.field(BEFORE).type)  # READ rows have no before-image
    return pa.Table.from_arrays([*arrays, *meta, before], schema=landed)


def read_rows_to_landed_data(schema: TableSchema, rows: pa.Table) -> list[pa.Array]:
    """Chunk rows (Arrow storage values) as the landed data columns, column-wise: what
    ``read_batch_to_landed`` lands, without the meta columns (a chunk read on an executor
    lands them at its close, ``sinks.spark.remote_reads``)."""
    table = str(schema.table)
    return [
        _landed_array(table, column, _read_column(table, column, rows))
        for column in landed_columns(schema)
    ]


def read_batch_unknown_columns(schema: TableSchema, batch: ReadBatch) -> set[str]:
    """Columns of a READ batch the catalog does not know: one look at the batch's schema."""
    return set(batch.rows.column_names).difference(schema.column_names)


def unknown_columns(schema: TableSchema, events: Iterable[ChangeEvent]) -> set[str]:
    """Columns that rows of ``events`` have and the catalog does not (a column added since
    the table was described: describe it again)."""
    known = set(schema.column_names)
    count = len(known)
    unknown: set[str] = set()
    for event in events:
        for row in (event.after, event.before):
            if row is not None and (len(row) > count or not known.issuperset(row)):
                unknown.update(c for c in row if c not in known)
    return unknown


Pieces = Sequence[list[ChangeEvent] | ReadBatch | StagedReadBatch]


def missing_columns(schema: TableSchema, pieces: Pieces) -> set[str]:
    """Columns of the catalog that the pieces' log rows after an event lack (a column
    dropped since the table was described, or a partial row image; READ batches have them
    all): one length check per row."""
    count = len(schema.column_names)
    missing: set[str] = set()
    for piece in pieces:
        if isinstance(piece, (ReadBatch, StagedReadBatch)):
            continue
        for event in piece:
            if event.after is not None and len(event.after) < count:
                missing.update(c for c in schema.column_names if c not in event.after)
    return missing


def pieces_to_landed(
    schema: TableSchema, keys: Sequence[str], pieces: Pieces, seq: int
) -> list[pa.Table]:
    """The pieces read on this process (not on executors) as landed rows."""
    return [
        read_batch_to_landed(schema, piece, seq)
        if isinstance(piece, ReadBatch)
        else events_to_landed(schema, keys, piece, seq)
        for piece in pieces
        if not isinstance(piece, StagedReadBatch)
    ]


def _is_placeholder(value: Any) -> bool:
    return type(value) is str and value == UNAVAILABLE_VALUE


def _holds_placeholder(row: Mapping[str, Any]) -> bool:
    # ``in`` first: one C-level pass (every event goes through here).
    return UNAVAILABLE_VALUE in row.values() and any(_is_placeholder(v) for v in row.values())


def events_to_landed(
    schema: TableSchema,
    key_columns: Sequence[str],
    events: Sequence[ChangeEvent],
    batch: int,
) -> pa.Table:
    """One table's events, in order, as a table of its landed schema."""
    rows: list[Mapping[str, Any] | None] = []
    befores: list[Mapping[str, Any] | None] = []
    unavailable: list[list[str] | None] = []
    for event in events:
        before = event.before if event.op in (Op.UPDATE, Op.DELETE) else None
        if before is not None and _holds_placeholder(before):  # never the placeholder text
            before = {c: None if _is_placeholder(v) else v for c, v in before.items()}
        befores.append(before)
        if event.op is Op.TRUNCATE:
            rows.append(None)
            unavailable.append(None)
            continue
        row = event.after if event.after is not None else event.before
        missing: list[str] | None = None
        if event.op is not Op.READ and row is not None and _holds_placeholder(row):
            # Any log event, not only an update: a key change is logged as a delete of the
            # old key and a create of the new one, whose row carries the placeholder for an
            # unchanged TOAST value too. READ rows come from a SELECT: real values.
            missing = [c for c, v in row.items() if _is_placeholder(v)]
            row = {c: None if c in missing else v for c, v in row.items()}
        if event.key is not None and (
            row is None or any(c not in row for c in key_columns) or event.op is Op.DELETE
        ):
            # The key columns always land, from the event's key (a delete's old row may
            # carry only part of the row, or a surrogate key may be what keys the table).
            row = {**(row or {}), **dict(zip(key_columns, event.key, strict=True))}
        rows.append(row)
        unavailable.append(missing)
    arrays = rows_to_landed(schema, rows)
    meta = [
        pa.array([e.op.value for e in events], type=pa.string()),
        pa.array([e.source.position.token for e in events], type=pa.string()),
        pa.array([int(e.ts_ms) for e in events], type=pa.int64()),
        pa.array([e.source.snapshot.value for e in events], type=pa.string()),
        pa.array(unavailable, type=pa.list_(pa.string())),
        pa.array([batch] * len(events), type=pa.int64()),
    ]
    before = _before_struct(schema, befores)
    return pa.Table.from_arrays([*arrays, *meta, before], schema=landed_schema(schema))


__all__ = [
    "BASE_PARTITION",
    "BATCH",
    "BEFORE",
    "META_COLUMNS",
    "OP",
    "POS",
    "RESERVED_COLUMNS",
    "SNAPSHOT",
    "TS_MS",
    "UNAVAILABLE",
    "LandedColumn",
    "LandingTypeError",
    "events_to_landed",
    "landed_columns",
    "landed_schema",
    "read_batch_to_landed",
    "read_batch_unknown_columns",
    "rows_to_landed",
    "unknown_columns",
]

"""PostgreSQL's chunk connection: max-key, chunk and EXPLAIN queries read straight into Arrow.

The ADBC PostgreSQL driver (``adbc-driver-postgresql``: libpq and C) parses the server's
binary results into Arrow columns; no Python object is made per value. Measured on a
200k-row, 6-column table in 4096-row chunks (``bench/read_bench.py chunk``), CPU time of
this process: about 3x less than psycopg with the text loaders (the chunk read this
replaced), 2x less than psycopg's binary format with its C loaders, 5x less than psycopg's
``COPY ... (FORMAT BINARY)`` rows.

A READ row must equal the log row of the same stored row, and pgoutput sends each value as
its type's output text, which the log decoder loads with ``pg_types``' loaders. The chunk
SELECT (``postgres._output``) therefore reads in binary only the types whose binary value
is exactly what those loaders make of the text (:data:`BINARY_EXACT`), reads floats and oid
as :func:`how_read` says, and selects every other type as its output text
(``pg_types.OUTPUT_TEXT``), as before. :func:`to_schema` then casts the driver's Arrow
types to the table's (``TableSchema.arrow_schema()``: int2/int4 to int64) and refuses, as
the loaders do, values Python cannot hold (dates and timestamps outside the years 1-9999,
'infinity', the time 24:00:00), which binary results would otherwise carry.
"""

from __future__ import annotations

import contextlib
import enum
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import adbc_driver_manager
import adbc_driver_postgresql.dbapi as adbc
import pyarrow as pa
import pyarrow.compute as pc

# What the driver raises (adbc_driver_manager's DB-API errors derive from it).
AdbcError = adbc_driver_manager.Error

# Type OIDs read in binary as they are: the driver's Arrow value is the value pg_types'
# loader makes of the output text. (float8 too while extra_float_digits > 0, the shortest
# text that reads back exactly: how_read.) Every one is a type pg_types loads by type
# (pg_types.PG_TYPES).
BINARY_EXACT = frozenset(
    {
        16,  # bool
        20,  # int8
        21,  # int2
        23,  # int4
        25,  # text
        1043,  # varchar
        1042,  # bpchar: binary is the stored, padded text
        19,  # name
        17,  # bytea
        1082,  # date (range-checked)
        1114,  # timestamp (range-checked)
        1184,  # timestamptz, as UTC microseconds (range-checked)
        1083,  # time (range-checked: 24:00:00)
    }
)
_FLOAT4, _FLOAT8, _OID = 700, 701, 26

# The Python-representable range of each Arrow type the driver returns for dates and times,
# in the type's own unit (days; microseconds), and what the loaders refuse outside it.
_DAY_MIN = (datetime(1, 1, 1) - datetime(1970, 1, 1)).days
_DAY_MAX = (datetime(9999, 12, 31) - datetime(1970, 1, 1)).days
_US_MIN = _DAY_MIN * 86_400_000_000
_US_MAX = (_DAY_MAX + 1) * 86_400_000_000 - 1
_RANGES: dict[str, tuple[int, int, str]] = {
    "date32[day]": (_DAY_MIN, _DAY_MAX, "a date outside the years 1-9999 (or infinity)"),
    "timestamp": (_US_MIN, _US_MAX, "a timestamp outside the years 1-9999 (or infinity)"),
    "time64[us]": (0, 86_399_999_999, "the time 24:00:00"),
}


class Unrepresentable(ValueError):
    """A value the log decoder's loaders cannot load either (the snapshot fails with it)."""


class Read(enum.Enum):
    """How the chunk SELECT writes a column for the driver."""

    AS_IS = "as is"  # BINARY_EXACT
    FLOAT_TEXT = "CAST(CAST(c AS text) AS double precision)"
    TEXT = "CAST(c AS text)"  # read as text, made a double here (to_schema)
    BIGINT = "CAST(c AS bigint)"
    OUTPUT_TEXT = "pg_types.OUTPUT_TEXT"


def how_read(oid: int, float_text: bool) -> Read:
    """How a column of type ``oid`` is selected. float4 through its output text to float8:
    the log decoder reads that text as a double (0.1, not float4's 0.100000001...); float8
    as its text when ``float_text`` (extra_float_digits <= 0 rounds the text, and the
    rounded maximum, 1.79769313486232e+308, reads as inf in Python but is out of range for
    the server), parsed here as the decoder does; oid as bigint (the driver reads oid as a
    signed int32); "char" as its output text (its binary value is one raw byte, its text
    escapes bytes above 127), like every type pg_types does not load by type."""
    if oid in BINARY_EXACT:
        return Read.AS_IS
    if oid == _FLOAT4:
        return Read.FLOAT_TEXT
    if oid == _FLOAT8:
        return Read.TEXT if float_text else Read.AS_IS
    if oid == _OID:
        return Read.BIGINT
    return Read.OUTPUT_TEXT


def to_schema(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """The driver's Arrow table as ``schema`` (same columns, in order): integer widths and
    time zones cast, driver metadata dropped; Unrepresentable for a date, timestamp or time
    the log decoder could not load."""
    columns = []
    for name, column, field in zip(schema.names, table.columns, schema, strict=True):
        _check_range(name, column)
        if pa.types.is_string(column.type) and pa.types.is_floating(field.type):
            column = _parse_floats(column)  # Read.TEXT
        columns.append(column if column.type == field.type else column.cast(field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _parse_floats(column: pa.ChunkedArray) -> pa.Array:
    """Float text as the log decoder's loader parses it (Python's float: 'NaN', 'Infinity'
    and an out-of-range rounded maximum as inf). Per value, but only for float8 columns
    under extra_float_digits <= 0."""
    return pa.array(
        [None if text is None else float(text) for text in column.to_pylist()], pa.float64()
    )


def _check_range(name: str, column: pa.ChunkedArray) -> None:
    kind = column.type
    key = "timestamp" if pa.types.is_timestamp(kind) else str(kind)
    limits = _RANGES.get(key)
    if limits is None or column.null_count == len(column):
        return
    if pa.types.is_timestamp(kind) and kind.unit != "us":
        raise Unrepresentable(f"column {name!r}: unexpected Arrow type {kind}")
    low, high, what = limits
    storage = pa.int32() if key == "date32[day]" else pa.int64()
    bounds = pc.min_max(column.cast(storage))
    if bounds["min"].as_py() < low or bounds["max"].as_py() > high:
        raise Unrepresentable(f"column {name!r} holds {what}")


def last_row_key(table: pa.Table, key_columns: Sequence[str]) -> tuple[Any, ...] | None:
    """The key of the table's last row as Python values, an aware datetime in
    ``datetime.UTC`` (what the text loaders give); None for no rows."""
    if table.num_rows == 0:
        return None
    last = table.slice(table.num_rows - 1, 1)
    values = []
    for name in key_columns:
        value = last.column(name)[0].as_py()
        if isinstance(value, datetime) and value.tzinfo is not None:
            value = value.astimezone(UTC)
        values.append(value)
    return tuple(values)


def error_message(exc: AdbcError) -> str:
    """The server's message (primary text, then its detail and hint), without the driver's
    prefix, the statement and the SQLSTATE it appends; the driver's text when the server
    sent none (a lost connection)."""
    fields = {}
    for name, value in getattr(exc, "details", None) or ():
        if isinstance(name, bytes) and isinstance(value, bytes):
            fields[name.decode("ascii", "replace")] = value.decode("utf-8", "replace")
    primary = fields.get("PG_DIAG_MESSAGE_PRIMARY")
    if primary is None:
        text = str(exc).split("\nQuery was:", 1)[0]
        return text.partition(": ")[2].strip() or text.strip()
    parts = [primary]
    for label, name in (("DETAIL", "PG_DIAG_MESSAGE_DETAIL"), ("HINT", "PG_DIAG_MESSAGE_HINT")):
        if name in fields:
            parts.append(f"{label}: {fields[name]}")
    return "\n".join(parts)


class ArrowConnection:
    """One ADBC connection (autocommit: transactions are ours, BEGIN to COMMIT)."""

    def __init__(self, conninfo: str, cancel_timeout_s: float) -> None:
        self._conn = adbc.connect(conninfo, autocommit=True)
        self._control = self._conn.cursor()  # BEGIN, COMMIT, scripts
        self._query = self._conn.cursor()
        self._cancel_timeout_s = cancel_timeout_s
        self.broken = False  # the connection failed: close it, connect anew
        self.closed = False
        # float8 columns through their output text (the session's extra_float_digits <= 0):
        # set by the dialect after connecting.
        self.float_text = False

    def script(self, sql: str) -> None:
        """Run ``sql`` (one or more statements; their rows, if any, are dropped)."""
        self._run(lambda: self._control.executescript(sql))

    def fetch(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
        """``sql``'s rows as the driver's Arrow table; ``params``: ``$1``, ``$2``, ...
        (bound, never in the SQL text)."""

        def run() -> pa.Table:
            self._query.execute(sql, tuple(params) if params else None)
            return self._query.fetch_arrow_table()

        return self._run(run)

    def _run(self, call: Any) -> Any:
        try:
            return call()
        except AdbcError as exc:
            # No SQLSTATE: libpq's own error (the connection is gone); class 08: lost.
            state = getattr(exc, "sqlstate", None)
            if state is None or state.startswith("08"):
                self.broken = True
            raise

    def cancel(self) -> None:
        """Cancel the running query (from another thread), waiting at most the cancel
        timeout for the request to be delivered (libpq's PQcancel has none of its own)."""
        failure: list[BaseException] = []

        def send() -> None:
            try:
                self._conn.adbc_cancel()
            except BaseException as exc:
                failure.append(exc)

        thread = threading.Thread(target=send, name="snapshotter-pg-cancel", daemon=True)
        thread.start()
        thread.join(self._cancel_timeout_s)
        if thread.is_alive():
            raise TimeoutError(f"no answer to the cancel request in {self._cancel_timeout_s} s")
        if failure:
            raise failure[0]

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for closing in (self._query.close, self._control.close, self._conn.close):
            # A broken connection: nothing left to release.
            with contextlib.suppress(AdbcError, RuntimeError):
                closing()

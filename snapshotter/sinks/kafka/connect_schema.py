"""Kafka Connect schemas for the Kafka sink's ``schemas = true`` mode.

Kafka Connect's ``JsonConverter`` with ``schemas.enable=true`` wraps every key and value as
``{"schema": <schema>, "payload": <data>}``. These functions build the schema part for a
table's key and for its change-event envelope, in the types a Debezium connector declares
when configured to write values the way snapshotter writes them (see docs/sinks.md,
"For a Debezium consumer"): ``decimal.handling.mode=string``, ``time.precision.mode=isostring``,
``binary.handling.mode=bytes`` (the JsonConverter writes bytes as base64, as snapshotter
does) and JSON columns as ``io.debezium.data.Json`` strings.

Pure: column descriptions in, plain dicts out; the sink serializes them once per table.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from snapshotter.sources.base import ColumnInfo, TableSchema

# Integer columns by the database's type name (both databases buffer them as int64).
_INT_WIDTH = {
    # PostgreSQL (format_type spelling)
    "smallint": "int16",
    "integer": "int32",
    "bigint": "int64",
    "oid": "int64",
    # MySQL / MariaDB (COLUMN_TYPE without the display width)
    "tinyint": "int16",
    "mediumint": "int32",
    "int": "int32",
}
# One width up for unsigned MySQL types, as Debezium does (BIGINT UNSIGNED: a Decimal).
_UNSIGNED_WIDTH = {"int16": "int32", "int32": "int64", "int64": "int64"}
_FLOAT32 = {"real", "float"}
_JSON_TYPES = {"json", "jsonb"}

# The ``source`` block's fields with a fixed type; any other detail is typed by its value.
_SOURCE_TYPES = {
    "version": "string",
    "connector": "string",
    "name": "string",
    "ts_ms": "int64",
    "snapshot": "string",
    "db": "string",
    "schema": "string",
    "table": "string",
    "pos": "string",  # snapshotter's position token (text order = log order)
    # PostgreSQL
    "lsn": "int64",
    "txId": "int64",
    "xmin": "int64",
    # MySQL
    "server_id": "int64",
    "gtid": "string",
    "file": "string",
    "binlog_pos": "int64",
    "row": "int32",
    "thread": "int64",
    "query": "string",
}
_SOURCE_REQUIRED = {"version", "connector", "name", "ts_ms", "db", "pos"}
_SOURCE_NAMES = {
    "postgresql": "io.debezium.connector.postgresql.Source",
    "mysql": "io.debezium.connector.mysql.Source",
}


_MODIFIERS = re.compile(r"\s+(unsigned|zerofill)\b")


def _base_type(type_name: str) -> tuple[str, bool]:
    """``"int(10) unsigned"`` -> ``("int", True)``; ``"integer"`` -> ``("integer", False)``;
    ``"enum('a)b','c')"`` -> ``("enum", False)`` (only the text outside the parentheses
    counts: enum and set members may hold anything)."""
    name = type_name.lower().strip()
    head, paren, _ = name.partition("(")
    outside = head + (name[name.rfind(")") + 1 :] if paren else "")
    unsigned = bool(re.search(r"\bunsigned\b", outside))
    return _MODIFIERS.sub("", head).strip(), unsigned


def column_schema(column: ColumnInfo, *, optional: bool | None = None) -> dict[str, Any]:
    """The Connect schema of one column's values as the sink writes them."""
    arrow = column.arrow_type
    base, unsigned = _base_type(column.type_name)
    schema: dict[str, Any]
    if pa.types.is_boolean(arrow):
        schema = {"type": "boolean"}
    elif pa.types.is_integer(arrow):
        if base == "year":
            schema = {"type": "int32", "name": "io.debezium.time.Year", "version": 1}
        elif base == "bigint" and unsigned:
            # Past int64: Connect's Decimal with scale 0 (Debezium's
            # bigint.unsigned.handling.mode=precise); JsonConverter reads it from the number.
            schema = {
                "type": "bytes",
                "name": "org.apache.kafka.connect.data.Decimal",
                "version": 1,
                "parameters": {"scale": "0"},
            }
        else:
            width = _INT_WIDTH.get(base, "int64")
            schema = {"type": _UNSIGNED_WIDTH[width] if unsigned else width}
    elif pa.types.is_floating(arrow):  # Connect's names: "float" (32 bits), "double"
        schema = {"type": "float" if base in _FLOAT32 else "double"}
    elif pa.types.is_timestamp(arrow):
        name = "ZonedTimestamp" if arrow.tz is not None else "IsoTimestamp"
        schema = {"type": "string", "name": f"io.debezium.time.{name}", "version": 1}
    elif pa.types.is_date(arrow):
        schema = {"type": "string", "name": "io.debezium.time.IsoDate", "version": 1}
    elif pa.types.is_time(arrow) or pa.types.is_duration(arrow):
        schema = {"type": "string", "name": "io.debezium.time.IsoTime", "version": 1}
    elif pa.types.is_binary(arrow) or pa.types.is_large_binary(arrow):
        schema = {"type": "bytes"}
    elif base in _JSON_TYPES:
        schema = {"type": "string", "name": "io.debezium.data.Json", "version": 1}
    elif base == "uuid":
        schema = {"type": "string", "name": "io.debezium.data.Uuid", "version": 1}
    elif base == "enum":
        schema = {"type": "string", "name": "io.debezium.data.Enum", "version": 1}
    elif base == "set":
        schema = {"type": "string", "name": "io.debezium.data.EnumSet", "version": 1}
    else:  # text, exact numerics (decimal.handling.mode=string) and every other type's text
        schema = {"type": "string"}
    schema["optional"] = column.nullable if optional is None else optional
    return schema


def _struct(fields: list[dict[str, Any]], name: str, *, optional: bool) -> dict[str, Any]:
    return {"type": "struct", "fields": fields, "optional": optional, "name": name}


def key_schema(topic: str, table: TableSchema, key_columns: Sequence[str]) -> dict[str, Any]:
    """The message key's schema: the key columns, in key order, never optional."""
    fields = [
        {**column_schema(table.column(name), optional=False), "field": name} for name in key_columns
    ]
    return _struct(fields, f"{topic}.Key", optional=False)


def row_schema(topic: str, table: TableSchema, key_columns: Sequence[str]) -> dict[str, Any]:
    """The schema of ``before`` and ``after``: every column, in table order.

    Columns outside the key are optional whatever their NOT NULL says: the ``before`` of a
    PostgreSQL delete under REPLICA IDENTITY DEFAULT holds the key columns only, and a
    schema must describe every payload it comes with.
    """
    keys = set(key_columns)
    fields = [
        {**column_schema(c, optional=None if c.name in keys else True), "field": c.name}
        for c in table.columns
    ]
    return _struct(fields, f"{topic}.Value", optional=True)


def source_schema(source: Mapping[str, Any]) -> dict[str, Any]:
    """The ``source`` block's schema, for the fields this event's source has."""
    fields = []
    for name, value in source.items():
        kind = _SOURCE_TYPES.get(name)
        if kind is None:
            kind = (
                "boolean"
                if isinstance(value, bool)
                else "int64"
                if isinstance(value, int)
                else "double"
                if isinstance(value, float)
                else "string"
            )
        fields.append({"type": kind, "optional": name not in _SOURCE_REQUIRED, "field": name})
    connector = str(source.get("connector", ""))
    name = _SOURCE_NAMES.get(connector, f"io.snapshotter.{connector or 'source'}.Source")
    return _struct(fields, name, optional=False)


def envelope_schema(
    topic: str, table: TableSchema, key_columns: Sequence[str], source: Mapping[str, Any]
) -> dict[str, Any]:
    """The value's schema: Debezium's envelope (no ``transaction`` block)."""
    row = row_schema(topic, table, key_columns)
    fields = [
        {**row, "field": "before"},
        {**row, "field": "after"},
        {**source_schema(source), "field": "source"},
        {"type": "string", "optional": False, "field": "op"},
        {"type": "int64", "optional": True, "field": "ts_ms"},
    ]
    return {**_struct(fields, f"{topic}.Envelope", optional=False), "version": 1}

"""A change stream query's rows as typed records (pure: parsing apart from the query).

GoogleSQL's ``READ_<stream>`` returns one ``ChangeRecord`` column: an array of structs, each
with three arrays of which one is non-empty (``data_change_record``, ``heartbeat_record``,
``child_partitions_record``); the client hands structs over as positional lists, named by
the result's field types. The PostgreSQL dialect's ``spanner.read_json_<stream>`` returns
one JSON document per row, with one of the same three names. Both carry the same fields.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from snapshotter.sources.spanner.merge import Child
from snapshotter.sources.spanner.types import SpannerType, parse_timestamp

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_US = dt.timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class ColumnType:
    name: str
    type: SpannerType
    is_primary_key: bool


@dataclass(frozen=True, slots=True)
class Mod:
    keys: Mapping[str, Any]
    new_values: Mapping[str, Any]
    old_values: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class DataChange:
    commit_us: int
    transaction: str  # the server transaction id
    sequence: int  # the record's sequence inside its transaction
    table: str  # as the stream names it: "orders", "sch.orders"
    columns: tuple[ColumnType, ...]
    mods: tuple[Mod, ...]
    mod_type: str  # INSERT, UPDATE, DELETE
    value_capture_type: str
    records_in_transaction: int
    partitions_in_transaction: int


@dataclass(frozen=True, slots=True)
class Heartbeat:
    at_us: int


@dataclass(frozen=True, slots=True)
class ChildPartitions:
    start_us: int
    children: tuple[Child, ...]


Record = DataChange | Heartbeat | ChildPartitions


def micros(value: Any) -> int:
    """A change record's timestamp (a datetime, or RFC 3339 text in the PostgreSQL
    dialect's JSON) as microseconds since the epoch."""
    if isinstance(value, str):
        value = parse_timestamp(value)
    return int((value - _EPOCH) // _US)


def transaction_order(transaction: str) -> int:
    """The transaction's place among those of one commit timestamp, as one position part:
    any fixed order is right (transactions that commit at the same timestamp touch
    different rows), this one fits in 64 bits."""
    return int.from_bytes(hashlib.blake2b(transaction.encode(), digest_size=8).digest(), "big")


def _type(raw: Mapping[str, Any]) -> SpannerType:
    code = str(raw.get("code", ""))
    element = raw.get("array_element_type")
    if code == "ARRAY" and isinstance(element, Mapping):
        return SpannerType("ARRAY", _type(element))
    return SpannerType(code)


def _data_change(raw: Mapping[str, Any]) -> DataChange:
    columns = tuple(
        ColumnType(str(c["name"]), _type(c["type"]), bool(c["is_primary_key"]))
        for c in raw["column_types"]
    )
    mods = tuple(
        Mod(m.get("keys") or {}, m.get("new_values") or {}, m.get("old_values") or {})
        for m in raw["mods"]
    )
    return DataChange(
        commit_us=micros(raw["commit_timestamp"]),
        transaction=str(raw["server_transaction_id"]),
        sequence=int(raw["record_sequence"]),
        table=str(raw["table_name"]),
        columns=columns,
        mods=mods,
        mod_type=str(raw["mod_type"]),
        value_capture_type=str(raw["value_capture_type"]),
        records_in_transaction=int(raw["number_of_records_in_transaction"]),
        partitions_in_transaction=int(raw["number_of_partitions_in_transaction"]),
    )


def _child_partitions(raw: Mapping[str, Any]) -> ChildPartitions:
    start = micros(raw["start_timestamp"])
    children = tuple(
        Child(str(c["token"]), start, frozenset(map(str, c.get("parent_partition_tokens") or ())))
        for c in raw["child_partitions"]
    )
    return ChildPartitions(start, children)


def _records(kind: str, raw: Mapping[str, Any]) -> Record:
    if kind == "data_change_record":
        return _data_change(raw)
    if kind == "heartbeat_record":
        return Heartbeat(micros(raw["timestamp"]))
    return _child_partitions(raw)


_KINDS = ("data_change_record", "heartbeat_record", "child_partitions_record")


def _named(value: Any, field_type: Any) -> Any:
    """A GoogleSQL struct or array value with its fields named (the client returns
    positional lists)."""
    from google.cloud.spanner_v1 import TypeCode

    if value is None:
        return None
    if field_type.code == TypeCode.ARRAY:
        return [_named(v, field_type.array_element_type) for v in value]
    if field_type.code == TypeCode.STRUCT:
        return {
            f.name: _named(v, f.type_)
            for f, v in zip(field_type.struct_type.fields, value, strict=True)
        }
    return value


def googlesql_records(row: Sequence[Any], field_type: Any) -> Iterator[Record]:
    """The records of one GoogleSQL result row (``field_type``: the ChangeRecord column's
    type, ``result.fields[0].type_``)."""
    for change_record in _named(row[0], field_type) or ():
        for kind in _KINDS:
            for raw in change_record.get(kind) or ():
                yield _records(kind, raw)


def postgresql_records(row: Sequence[Any]) -> Iterator[Record]:
    """The records of one PostgreSQL-dialect result row (a JSON document)."""
    document = row[0]
    for kind in _KINDS:
        raw = document.get(kind)
        if raw:
            yield _records(kind, raw)

"""A change stream's data change records as Debezium-envelope events (pure: no IO).

One record holds the mods of one table and one mod type in one transaction; each mod is one
event: INSERT -> ``c``, UPDATE -> ``u``, DELETE -> ``d`` (a primary key never changes in
Spanner: a new key is a delete and an insert). What ``before`` and ``after`` hold follows
the change stream's value capture type:

* ``NEW_ROW``: ``after`` is the whole new row; an update has no ``before``, a delete's
  ``before`` holds the key (other columns NULL), as PostgreSQL's default replica identity.
* ``NEW_ROW_AND_OLD_VALUES``: as ``NEW_ROW``, and ``before`` is the whole old row (the new
  row with the changed columns' old values).
* ``OLD_AND_NEW_VALUES``: an update carries only the columns it changed; the others are
  Debezium's unavailable-value placeholder in ``after`` and ``before`` (the Spark sink
  takes the key's previous value, as for PostgreSQL's unchanged TOAST values).

Positions are ``(commit timestamp in µs, transaction order, record sequence, mod index)``:
the merged stream's order (``merge.RecordKey``), with a part per mod.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from signals.names import TableId
from snapshotter.core.events import ChangeEvent, Op, Source
from snapshotter.core.keys import Key
from snapshotter.core.position import Position
from snapshotter.core.values import UNAVAILABLE_VALUE
from snapshotter.sources.log import Change
from snapshotter.sources.spanner.records import ColumnType, DataChange, transaction_order
from snapshotter.sources.spanner.types import (
    COMMIT_TIMESTAMP_PLACEHOLDER,
    Convert,
    SpannerType,
    mod_converter,
)

DEFAULT_SCHEMA = "public"
_OPS = {"INSERT": Op.CREATE, "UPDATE": Op.UPDATE, "DELETE": Op.DELETE}
FULL_NEW_ROW = frozenset({"NEW_ROW", "NEW_ROW_AND_OLD_VALUES"})
WITH_OLD_VALUES = frozenset({"NEW_ROW_AND_OLD_VALUES", "OLD_AND_NEW_VALUES"})


def table_id(stream_name: str) -> TableId:
    """A table as the change stream names it (``orders``, ``sch.orders``)."""
    schema, dot, table = stream_name.rpartition(".")
    return TableId(schema if dot else DEFAULT_SCHEMA, table)


class SpannerDecoder:
    def __init__(
        self,
        name: str,
        database: str,
        *,
        captured: Callable[[TableId], bool],
        key_columns: Callable[[TableId], Sequence[str] | None],
        columns_of: Callable[[TableId], Sequence[str]],
        clock_ms: Callable[[], int],
    ) -> None:
        self._name = name
        self._database = database
        self._captured = captured
        self._key_columns = key_columns
        self._columns_of = columns_of  # a table's columns in order (the catalog's)
        self._clock_ms = clock_ms
        self._converters: dict[tuple[str, SpannerType], Convert] = {}

    def changes(self, record: DataChange, partition: str) -> list[Change]:
        table = table_id(record.table)
        if not self._captured(table):
            return []
        op = _OPS[record.mod_type]
        columns = self._columns(table, record.columns)
        types = {c.name: c.type for c in record.columns}
        key_names = tuple(self._key_columns(table) or ()) or tuple(
            c.name for c in record.columns if c.is_primary_key
        )
        order = transaction_order(record.transaction)
        ts_ms = record.commit_us // 1000
        out: list[Change] = []
        for index, mod in enumerate(record.mods):
            keys = self._convert(types, mod.keys, record.commit_us)
            new = self._convert(types, mod.new_values, record.commit_us)
            old = self._convert(types, mod.old_values, record.commit_us)
            before, after = self._rows(op, record.value_capture_type, columns, keys, new, old)
            keyed = after if after is not None else before
            assert keyed is not None
            source = Source(
                "spanner",
                self._name,
                self._database,
                table,
                Position(record.commit_us, order, record.sequence, index),
                ts_ms,
                details={
                    "txId": record.transaction,
                    "record_sequence": record.sequence,
                    "mod": index,
                    "partition": partition,
                    "commit_timestamp_us": record.commit_us,
                },
            )
            key = cast(Key, tuple(keyed.get(k) for k in key_names))
            event = ChangeEvent(op, source, self._clock_ms(), key, before, after)
            out.append(Change(event, 0))
        return out

    def _columns(self, table: TableId, reported: Sequence[ColumnType]) -> Sequence[str]:
        try:
            columns = self._columns_of(table)
        except Exception:  # dropped meanwhile: what the record reports is all there is
            columns = ()
        return columns or [c.name for c in reported]

    def _convert(
        self, types: Mapping[str, SpannerType], values: Mapping[str, Any], commit_us: int
    ) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, value in values.items():
            t = types.get(name, SpannerType("STRING"))
            if t.family == "TIMESTAMP" and value == COMMIT_TIMESTAMP_PLACEHOLDER:
                # The emulator's stand-in for the commit timestamp written on insert.
                value = _rfc3339(commit_us)
            conv = self._converters.get((name, t))
            if conv is None:
                conv = self._converters[(name, t)] = mod_converter(t)
            out[name] = conv(value)
        return out

    @staticmethod
    def _rows(
        op: Op,
        capture: str,
        columns: Sequence[str],
        keys: dict[str, Any],
        new: dict[str, Any],
        old: dict[str, Any],
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        def whole(values: Mapping[str, Any], missing: Any) -> dict[str, Any]:
            row = {c: values.get(c, missing) for c in columns}
            row.update(keys)
            return row

        if op is Op.CREATE:
            return None, whole(new, None)
        if op is Op.DELETE:
            return whole(old, None), None
        if capture in FULL_NEW_ROW:
            after = whole(new, None)
            if capture not in WITH_OLD_VALUES:
                return None, after
            before = dict(after)
            before.update(old)
            return before, after
        # OLD_AND_NEW_VALUES: only the changed columns are known.
        return whole(old, UNAVAILABLE_VALUE), whole(new, UNAVAILABLE_VALUE)


def _rfc3339(us: int) -> str:
    import datetime as dt

    at = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=us)
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")

"""Change events in Debezium's envelope: ``before``, ``after``, ``source``, ``op``, ``ts_ms``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from signals.names import TableId
from snapshotter.core.keys import Key
from snapshotter.core.position import Position

Row = Mapping[str, Any]

ENVELOPE_VERSION = "snapshotter-0.1"


class Op(StrEnum):
    CREATE = "c"
    UPDATE = "u"
    DELETE = "d"
    READ = "r"
    TRUNCATE = "t"


class SnapshotMarker(StrEnum):
    """``source.snapshot``: "false" for log events, "incremental" for chunk READ rows."""

    FALSE = "false"
    INCREMENTAL = "incremental"


# What every connector's ``source`` block has; ``details`` adds to these, never replaces them.
_ENVELOPE_SOURCE_FIELDS = frozenset(
    {"version", "connector", "name", "ts_ms", "snapshot", "db", "schema", "table", "pos"}
)


@dataclass(frozen=True, slots=True)
class Source:
    """The ``source`` block: where an event came from and where it sits in the log.

    ``details`` carries what only one connector has (PostgreSQL ``lsn``, ``txId``; MySQL
    ``file``, ``pos``, ``gtid``, ``server_id``...). ``pos`` in the envelope is always the
    position token, whose text order is log order.
    """

    connector: str
    name: str
    db: str
    table: TableId
    position: Position
    ts_ms: int
    snapshot: SnapshotMarker = SnapshotMarker.FALSE
    details: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        clash = _ENVELOPE_SOURCE_FIELDS & set(self.details)
        if clash:
            raise ValueError(f"source details may not redefine {sorted(clash)}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": ENVELOPE_VERSION,
            "connector": self.connector,
            "name": self.name,
            "ts_ms": self.ts_ms,
            "snapshot": self.snapshot.value,
            "db": self.db,
            "schema": self.table.schema,
            "table": self.table.table,
            **self.details,
            "pos": self.position.token,
        }


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    """One change to one row (or a TRUNCATE of the whole table).

    ``key`` is the primary key of the row the event is about (of ``after`` for c/u/r, of
    ``before`` for d; None for t): the message key sinks use. A primary-key change is never
    one event: readers emit a delete of the old key, then a create of the new one, as
    Debezium does, so every consumer that upserts by key stays right.
    """

    op: Op
    source: Source
    ts_ms: int
    key: Key | None
    before: Row | None = None
    after: Row | None = None

    def __post_init__(self) -> None:
        if self.op is Op.TRUNCATE:
            if self.key is not None or self.before is not None or self.after is not None:
                raise ValueError("a truncate event carries no key and no row")
            return
        if self.key is None:
            raise ValueError(f"an {self.op.value!r} event needs the row's key")
        if self.op is Op.DELETE and self.after is not None:
            raise ValueError("a delete event has no 'after' row")
        if self.op is not Op.DELETE and self.after is None:
            raise ValueError(f"an {self.op.value!r} event needs an 'after' row")

    @property
    def table(self) -> TableId:
        return self.source.table

    @property
    def position(self) -> Position:
        return self.source.position

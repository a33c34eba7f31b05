"""Typed signals, as rows of the Debezium-compatible signal table turn into.

Each signal writes itself back as an ``(id, type, data)`` row with ``to_row``, so parsing can
be tested as a round trip. The parser (``signals.parser.parse_signal``) is the single
validator: the CLI builds a ``data`` dict from its arguments and runs it, as JSON, through the
parser like any row read from the table; it then inserts the parsed signal with
``signals.table.insert_signal``, which writes the row ``to_row`` gives. So a row snapshotter
inserts is always ``to_row`` of a signal the parser accepted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from signals.names import TableSelector


class SignalType(StrEnum):
    EXECUTE_SNAPSHOT = "execute-snapshot"
    STOP_SNAPSHOT = "stop-snapshot"
    PAUSE_SNAPSHOT = "pause-snapshot"
    RESUME_SNAPSHOT = "resume-snapshot"
    LOG = "log"
    # Written by the engine itself around each chunk SELECT (Debezium's names, so a signal
    # table shared with Debezium tooling reads the same).
    WINDOW_OPEN = "snapshot-window-open"
    WINDOW_CLOSE = "snapshot-window-close"


# The types a user writes; the window types are the engine's own.
USER_SIGNAL_TYPES = (
    SignalType.EXECUTE_SNAPSHOT,
    SignalType.STOP_SNAPSHOT,
    SignalType.PAUSE_SNAPSHOT,
    SignalType.RESUME_SNAPSHOT,
    SignalType.LOG,
)


class SnapshotType(StrEnum):
    INCREMENTAL = "incremental"


@dataclass(frozen=True, slots=True)
class AdditionalCondition:
    """A row filter for one table; SQL by design, appended as ``AND (<filter>)``."""

    data_collection: TableSelector
    filter: str


@dataclass(frozen=True, slots=True)
class ExecuteSnapshot:
    id: str
    data_collections: tuple[TableSelector, ...]
    snapshot_type: SnapshotType = SnapshotType.INCREMENTAL
    additional_conditions: tuple[AdditionalCondition, ...] = ()
    surrogate_key: str | None = None
    type: SignalType = field(default=SignalType.EXECUTE_SNAPSHOT, init=False)

    def data(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "data-collections": [str(s) for s in self.data_collections],
            "type": self.snapshot_type.value,
        }
        if self.additional_conditions:
            out["additional-conditions"] = [
                {"data-collection": str(c.data_collection), "filter": c.filter}
                for c in self.additional_conditions
            ]
        if self.surrogate_key is not None:
            out["surrogate-key"] = self.surrogate_key
        return out


@dataclass(frozen=True, slots=True)
class StopSnapshot:
    """Stops the snapshot of the named tables, or of every table when none is named."""

    id: str
    data_collections: tuple[TableSelector, ...] = ()
    snapshot_type: SnapshotType = SnapshotType.INCREMENTAL
    type: SignalType = field(default=SignalType.STOP_SNAPSHOT, init=False)

    def data(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.snapshot_type.value}
        if self.data_collections:
            out["data-collections"] = [str(s) for s in self.data_collections]
        return out


@dataclass(frozen=True, slots=True)
class PauseSnapshot:
    id: str
    snapshot_type: SnapshotType = SnapshotType.INCREMENTAL
    type: SignalType = field(default=SignalType.PAUSE_SNAPSHOT, init=False)

    def data(self) -> dict[str, Any]:
        return {"type": self.snapshot_type.value}


@dataclass(frozen=True, slots=True)
class ResumeSnapshot:
    id: str
    snapshot_type: SnapshotType = SnapshotType.INCREMENTAL
    type: SignalType = field(default=SignalType.RESUME_SNAPSHOT, init=False)

    def data(self) -> dict[str, Any]:
        return {"type": self.snapshot_type.value}


@dataclass(frozen=True, slots=True)
class LogSignal:
    """Asks the engine to write ``message`` to its log (handy to mark a point in the stream)."""

    id: str
    message: str
    type: SignalType = field(default=SignalType.LOG, init=False)

    def data(self) -> dict[str, Any]:
        return {"message": self.message}


class WatermarkKind(StrEnum):
    OPEN = "open"
    CLOSE = "close"


@dataclass(frozen=True, slots=True)
class Watermark:
    """The engine's own open/close row around a chunk SELECT; ``id`` is ``<window>-<kind>``.

    A window id is a UUID (36 characters), so ``<uuid>-close`` fits the 42-character id
    column exactly, as in Debezium. ``token`` (in ``data`` as ``{"token": ...}``) is a random
    secret the engine chose for this one row and kept to itself until the row committed: a
    row with the right id but not the right token was not written by the engine (see
    ``snapshotter.core.window.ChunkWindow.accepts``). Rows without one read as token None.
    """

    window_id: str
    kind: WatermarkKind
    token: str | None = None

    @property
    def id(self) -> str:
        return f"{self.window_id}-{self.kind.value}"

    @property
    def type(self) -> SignalType:
        if self.kind is WatermarkKind.OPEN:
            return SignalType.WINDOW_OPEN
        return SignalType.WINDOW_CLOSE

    def data(self) -> dict[str, Any]:
        return {} if self.token is None else {"token": self.token}


Signal = ExecuteSnapshot | StopSnapshot | PauseSnapshot | ResumeSnapshot | LogSignal


@dataclass(frozen=True, slots=True)
class SignalError:
    """A signal row that could not be accepted. A value, never raised: the stream goes on."""

    signal_id: str
    signal_type: str
    problem: str

    def __str__(self) -> str:
        return f"signal {self.signal_id!r} ({self.signal_type}): {self.problem}"


def to_row(signal: Signal | Watermark) -> tuple[str, str, str]:
    """The ``(id, type, data)`` row that stands for ``signal`` in the signal table."""
    return signal.id, signal.type.value, json.dumps(signal.data(), separators=(",", ":"))

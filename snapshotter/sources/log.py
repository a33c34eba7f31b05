"""What log readers hand the engine: changes with their transaction, commits, shape changes.

A reader turns the database's log into a sequence of these items, in log order. Every
``Change`` carries a fully positioned ``ChangeEvent``; positions strictly increase across the
whole sequence (a primary-key change is two events: a delete, then a create).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from signals.names import TableId
from snapshotter.core.events import ChangeEvent
from snapshotter.core.position import Position


@dataclass(frozen=True, slots=True)
class Change:
    event: ChangeEvent
    xid: int  # the transaction that made it (PostgreSQL: 32-bit xid; MySQL: 0)


@dataclass(frozen=True, slots=True)
class Commit:
    """The end of a transaction. Everything up to ``position`` has been handed over; a
    restart from ``resume`` replays nothing before it."""

    xid: int
    position: Position  # >= the position of every change of the transaction
    resume: Mapping[str, Any]  # the reader's restart point after this transaction
    ts_ms: int = 0
    log_offset: int = 0  # where the log is after this transaction, comparable with log_end


@dataclass(frozen=True, slots=True)
class TableShape:
    """The log announced (or re-announced) a table's columns (pgoutput Relation message)."""

    table: TableId
    columns: tuple[tuple[str, int], ...]  # (name, type code) in table order
    full_identity: bool  # whether updates/deletes carry the whole old row
    key: tuple[str, ...] = ()  # the columns the reader keys this table's events by


@dataclass(frozen=True, slots=True)
class Progress:
    """The reader has seen the log up to here with no transaction open (e.g. a keepalive):
    a restart from ``resume`` is safe, and ``log_offset`` can be compared with the log end."""

    resume: Mapping[str, Any]
    log_offset: int


@dataclass(frozen=True, slots=True)
class Notice:
    """Something the user should know about, not an error of the stream (e.g. an unchanged
    TOAST value the log did not carry)."""

    table: TableId | None
    message: str
    details: Mapping[str, Any] = field(default_factory=dict)


LogItem = Change | Commit | TableShape | Progress | Notice


class LogReaderError(RuntimeError):
    """The log cannot be read on; the message says why and what to do. A saved position the
    server no longer has is a :class:`~snapshotter.sources.positions.StreamPositionLost`
    kept as the ``__cause__``, so the CLI can name the config file and the tables."""


class LogReader(Protocol):
    def read(self, timeout: float) -> list[LogItem]:
        """Items available now, waiting at most ``timeout`` seconds for the first."""
        ...

    def confirm(self, resume: Mapping[str, Any]) -> None:
        """State has durably recorded everything up to ``resume``: the database may free the
        log before it."""
        ...

    def request_progress(self) -> None:
        """Ask the server to report how far it has read, so a ``Progress`` item follows soon."""
        ...

    def close(self) -> None: ...


# What opens a log reader: from the saved restart point, keying each table's events by the
# columns the engine names (None: the table's own key).
KeyColumns = Callable[[TableId], Sequence[str] | None]
OpenReader = Callable[[Mapping[str, Any], KeyColumns], LogReader]

"""Debezium's notifications of incremental snapshots, derived from the engine's state.

The engine keeps no notification logic: each state it saves (at a checkpoint the sink has
acknowledged) goes to an observer, and the notifications are what changed between the last
view of that state and this one (``diff``). So they follow the state exactly as it is saved
and shown by ``status``, whatever path the engine took to get there, and a crash never rolls
back behind them (the engine resumes from the newest saved state).

Records are Debezium's (``io.debezium.pipeline.notification.Notification``)::

    {"id": <the execute-snapshot signal's id>, "aggregate_type": "Incremental Snapshot",
     "type": STARTED | IN_PROGRESS | TABLE_SCAN_COMPLETED | PAUSED | RESUMED | ABORTED
             | COMPLETED,
     "additional_data": {"connector_name": <source name>, ...: <strings>},
     "timestamp": <epoch ms>}

As in Debezium, ``id`` is the signal's id (all notifications of one snapshot share it),
table lists are joined by "," (``data_collections``), keys are their values joined by ","
(``maximum_key``, ``last_processed_key``; a NULL part as ``<null>``), and every record
carries ``connector_name``. What ``additional_data`` holds per type:

* STARTED: ``data_collections`` (every table of the signal).
* IN_PROGRESS (a chunk closed; one for several recorded between two views, with the
  newest keys): ``data_collections`` (the signal's unfinished tables),
  ``current_collection_in_progress``, ``maximum_key``, ``last_processed_key``.
* TABLE_SCAN_COMPLETED (a table done or failed): ``data_collections``,
  ``scanned_collection``, ``total_rows_scanned`` (the rows the chunk SELECTs returned),
  ``status``: SUCCEEDED, EMPTY (no rows), or for a failed table NO_PRIMARY_KEY,
  UNKNOWN_SCHEMA (no such table), SKIPPED (not a table the engine may snapshot: a view, an
  uncaptured table, TOAST-able columns without REPLICA IDENTITY FULL...) or SQL_EXCEPTION
  (anything else; ``status`` and the log say what).
* PAUSED / RESUMED: ``data_collections`` (the signal's unfinished tables).
* ABORTED (stop-snapshot): ``data_collections`` (the tables it stopped).
* COMPLETED: nothing more. Sent once every table of the signal is finished, unless the
  last of them were stopped: ABORTED is then the signal's last notification.

Identity: the same signal id may be sent again later (Debezium's examples reuse
``ad-hoc-1``), so a snapshot record is told apart from an older one of the same signal and
table by the caller's ``key`` (the engine's observer uses the record object itself: the
engine changes its records in place). Records first seen in one view with the same signal
id are one snapshot request.

Restart: the first view is the state as loaded (``View.of``), so a resumed run sends
nothing for what happened before it, and no second STARTED.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from snapshotter.core.keys import Key
from snapshotter.core.state import EngineState, SnapshotStatus, TableProgress

AGGREGATE_TYPE = "Incremental Snapshot"
LIST_DELIMITER = ","
NULL_PART = "<null>"


class NotificationType(StrEnum):
    STARTED = "STARTED"
    IN_PROGRESS = "IN_PROGRESS"
    TABLE_SCAN_COMPLETED = "TABLE_SCAN_COMPLETED"
    PAUSED = "PAUSED"
    RESUMED = "RESUMED"
    ABORTED = "ABORTED"
    COMPLETED = "COMPLETED"


class ScanStatus(StrEnum):
    """Debezium's ``TableScanCompletionStatus``."""

    EMPTY = "EMPTY"
    NO_PRIMARY_KEY = "NO_PRIMARY_KEY"
    SKIPPED = "SKIPPED"
    SQL_EXCEPTION = "SQL_EXCEPTION"
    SUCCEEDED = "SUCCEEDED"
    UNKNOWN_SCHEMA = "UNKNOWN_SCHEMA"


@dataclass(frozen=True, slots=True)
class Notification:
    id: str
    type: NotificationType
    additional_data: dict[str, str]
    timestamp: int  # epoch ms
    aggregate_type: str = AGGREGATE_TYPE

    def to_dict(self) -> dict[str, Any]:
        """The record as Debezium's sink channel writes its value (field order as there)."""
        return {
            "id": self.id,
            "aggregate_type": self.aggregate_type,
            "type": self.type.value,
            "additional_data": dict(self.additional_data),
            "timestamp": self.timestamp,
        }


def render_key(key: Key | None) -> str:
    """A key as Debezium renders ``maximum_key`` / ``last_processed_key``: its values joined
    by "," (``<null>`` for a NULL part, and for no key at all)."""
    if key is None:
        return NULL_PART
    return LIST_DELIMITER.join(NULL_PART if v is None else _text(v) for v in key)


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes | bytearray):
        return value.hex()
    return str(value)


# Words of the engine's (and the signal planner's) error messages, in the order they are
# tried: the first that occurs decides. Everything else failed in SQL.
_FAILURE_STATUS: tuple[tuple[str, ScanStatus], ...] = (
    ("has no primary key", ScanStatus.NO_PRIMARY_KEY),
    ("does not exist", ScanStatus.UNKNOWN_SCHEMA),
    ("only tables can be snapshotted", ScanStatus.SKIPPED),
    ("is not captured", ScanStatus.SKIPPED),
    ("signal table itself cannot be snapshotted", ScanStatus.SKIPPED),
    # PostgreSQL: TOAST-able columns without REPLICA IDENTITY FULL (sources/postgres/setup).
    ("refused: it has TOAST-able columns", ScanStatus.SKIPPED),
)


def failure_status(error: str | None) -> ScanStatus:
    """Debezium's completion status for a table whose snapshot failed with ``error``."""
    text = error or ""
    for words, status in _FAILURE_STATUS:
        if words in text:
            return status
    return ScanStatus.SQL_EXCEPTION


@dataclass(frozen=True, slots=True)
class Seen:
    """What a view keeps of one snapshot record."""

    signal_id: str
    table: str
    status: SnapshotStatus
    chunk_id: int
    request: int  # the snapshot request (signal) it belongs to: see the module docstring


@dataclass(frozen=True)
class View:
    """The snapshots as last seen, by record key, in state order."""

    records: dict[Hashable, Seen] = field(default_factory=dict)
    # Requests whose last notification (COMPLETED, or a final ABORTED) went out, or that
    # were already over in the first view.
    over: frozenset[int] = frozenset()
    next_request: int = 0

    @classmethod
    def of(cls, state: EngineState, key: Callable[[TableProgress], Hashable] = id) -> View:
        """The first view: the state as loaded (nothing in it is news)."""
        empty = cls()
        records, next_request = _seen(empty, state.snapshots, key)
        requests: dict[int, list[Seen]] = {}
        for seen in records.values():
            requests.setdefault(seen.request, []).append(seen)
        over = frozenset(r for r, members in requests.items() if _all_finished(members))
        return cls(records, over, next_request)


def _all_finished(members: Sequence[Seen]) -> bool:
    return all(m.status.finished for m in members)


def _seen(
    before: View, snapshots: Sequence[TableProgress], key: Callable[[TableProgress], Hashable]
) -> tuple[dict[Hashable, Seen], int]:
    """Every record as ``Seen``: known ones keep their request, new ones of one signal id
    share a new one."""
    next_request = before.next_request
    new_requests: dict[str, int] = {}
    out: dict[Hashable, Seen] = {}
    for progress in snapshots:
        k = key(progress)
        old = before.records.get(k)
        if old is not None:
            request = old.request
        else:
            request = new_requests.get(progress.signal_id, -1)
            if request < 0:
                request = new_requests[progress.signal_id] = next_request
                next_request += 1
        out[k] = Seen(
            progress.signal_id, str(progress.table), progress.status, progress.chunk_id, request
        )
    return out, next_request


def diff(
    before: View,
    state: EngineState,
    *,
    connector: str,
    now_ms: int,
    key: Callable[[TableProgress], Hashable] = id,
) -> tuple[list[Notification], View]:
    """The notifications between ``before`` and ``state``, in order, and the new view.

    Per request, in the order its records are in the state: STARTED (new request); PAUSED /
    RESUMED; per record IN_PROGRESS (more chunks closed) and TABLE_SCAN_COMPLETED (done,
    failed); ABORTED (records stopped now); COMPLETED (all finished, not ended by a stop).
    ``key`` tells records apart (``id``: the caller keeps the records of ``before`` alive).
    """
    records, next_request = _seen(before, state.snapshots, key)
    progress_of = {key(p): p for p in state.snapshots}
    requests: dict[int, list[Hashable]] = {}
    for k, seen in records.items():
        requests.setdefault(seen.request, []).append(k)
    out: list[Notification] = []
    over = set(before.over)

    def note(signal_id: str, kind: NotificationType, **data: str) -> None:
        out.append(Notification(signal_id, kind, {**data, "connector_name": connector}, now_ms))

    for request, keys in requests.items():
        members = [records[k] for k in keys]
        signal_id = members[0].signal_id
        if request >= before.next_request:  # first seen now
            note(
                signal_id,
                NotificationType.STARTED,
                data_collections=LIST_DELIMITER.join(m.table for m in members),
            )
        if request in over:
            continue

        # Pause and resume first: chunks that closed since happened after them (or were
        # already in flight when the pause came).
        paused = resumed = False
        for k in keys:
            old, now = before.records.get(k), records[k]
            if old is None or now.status is old.status:
                continue
            if now.status is SnapshotStatus.PAUSED:
                paused = True
            elif old.status is SnapshotStatus.PAUSED and not now.status.finished:
                resumed = True
        unfinished = LIST_DELIMITER.join(m.table for m in members if not m.status.finished)
        if paused:
            note(signal_id, NotificationType.PAUSED, data_collections=unfinished)
        if resumed:
            note(signal_id, NotificationType.RESUMED, data_collections=unfinished)
        stopped: list[str] = []
        for k in keys:
            now = records[k]
            old = before.records.get(k)
            was_status = old.status if old is not None else SnapshotStatus.PENDING
            was_chunks = old.chunk_id if old is not None else 0
            progress = progress_of[k]
            if now.chunk_id > was_chunks and not was_status.finished:
                note(
                    signal_id,
                    NotificationType.IN_PROGRESS,
                    data_collections=LIST_DELIMITER.join(
                        m.table for m in members if not m.status.finished or m is now
                    ),
                    current_collection_in_progress=now.table,
                    maximum_key=render_key(progress.max_key),
                    last_processed_key=render_key(progress.last_read_key),
                )
            if now.status is was_status or was_status.finished:
                continue
            if now.status in (SnapshotStatus.DONE, SnapshotStatus.FAILED):
                note(
                    signal_id,
                    NotificationType.TABLE_SCAN_COMPLETED,
                    data_collections=LIST_DELIMITER.join(
                        m.table for m in members if not m.status.finished or m is now
                    ),
                    scanned_collection=now.table,
                    total_rows_scanned=str(progress.rows_read),
                    status=_scan_status(progress).value,
                )
            elif now.status is SnapshotStatus.STOPPED:
                stopped.append(now.table)
        if stopped:
            note(signal_id, NotificationType.ABORTED, data_collections=LIST_DELIMITER.join(stopped))
        if _all_finished(members):
            if not stopped:
                note(signal_id, NotificationType.COMPLETED)
            over.add(request)
    # A request whose records are all gone (history pruned) needs no memory.
    live = {seen.request for seen in records.values()}
    return out, View(records, frozenset(over & live), next_request)


def _scan_status(progress: TableProgress) -> ScanStatus:
    if progress.status is SnapshotStatus.FAILED:
        return failure_status(progress.error)
    if progress.max_key is None or progress.rows_read == 0:
        return ScanStatus.EMPTY
    return ScanStatus.SUCCEEDED

"""Snapshot progress and stream state, as versioned JSON that people can read.

One ``TableProgress`` per table being snapshotted, in the order the tables run. Keys are
written with the typed key codec (``{"type": "decimal", "value": "12.30"}``), the stream
position as its token. The rules that keep a snapshot moving live here:

* ``last_read_key`` advances to the last key the chunk SELECT *returned*, not the last key
  that survived the window: when the log drops every row of a chunk (hot keys), the next
  chunk still starts after it, so a snapshot never loops.
* A chunk is done when it returned fewer rows than asked for, or reached the maximum key
  recorded at the start. Keys are never ordered in Python (collations differ); equality
  with the maximum key is only a shortcut that saves one empty query. With parallel reads
  (``core.spans``) chunks are closed key ranges, recorded in key order only, and the engine
  says which one is the last.
* A signal is executed once: each processed signal id is kept with the log position it was
  seen at, and the same id at that position or before (a replay after a restart) is
  skipped, while the same id inserted again later (Debezium's docs reuse ids like
  ``ad-hoc-1``) runs again. Entries older than where the log can replay from are pruned.
* Pause is engine-wide, as in Debezium: every unfinished snapshot pauses, and a snapshot
  requested while paused waits until ``resume-snapshot``.
* History is bounded (``prune_history``): of the finished snapshots (done, stopped, failed)
  the newest ``KEEP_FINISHED_PER_TABLE`` per table are kept, and at most ``MAX_FINISHED`` in
  all; an unfinished snapshot is never dropped, nor a table's newest surrogate-key snapshot
  that did not fail (it decides how that table's events are keyed). Signal problems keep the
  newest ``MAX_SIGNAL_PROBLEMS``, each message cut to ``MAX_PROBLEM_CHARS``.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    StrictBool,
)

from signals.names import TableId, TableNameError, parse_table_name
from snapshotter.core.keys import Key, decode_key, encode_key, normalize_key
from snapshotter.core.position import Position

STATE_VERSION: Literal[1] = 1


class StateError(ValueError):
    """A state file that cannot be read, or a transition the snapshot's status forbids."""


def _validate_key(value: object) -> Key:
    if isinstance(value, tuple):
        return normalize_key(value)
    return decode_key(value)


def _validate_table(value: object) -> TableId:
    if isinstance(value, TableId):
        return value
    if not isinstance(value, str):
        raise ValueError("a table is written as a 'schema.table' string")
    try:
        table = parse_table_name(value)
    except TableNameError as exc:
        raise ValueError(str(exc)) from None
    if table.schema is None:
        raise ValueError(f"table {value!r} in state must be schema-qualified")
    return table


TypedKey = Annotated[Key, PlainValidator(_validate_key), PlainSerializer(encode_key)]
StoredTable = Annotated[TableId, PlainValidator(_validate_table), PlainSerializer(str)]


class SnapshotStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    PAUSED = "paused"
    DONE = "done"
    STOPPED = "stopped"
    FAILED = "failed"

    @property
    def finished(self) -> bool:
        return self in (SnapshotStatus.DONE, SnapshotStatus.STOPPED, SnapshotStatus.FAILED)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TableProgress(_Model):
    table: StoredTable
    signal_id: str
    status: SnapshotStatus = SnapshotStatus.PENDING
    # The columns chunks are paged by; empty until the engine has described the table.
    key_columns: list[str] = Field(default_factory=list)
    surrogate_key: str | None = None  # the signal's surrogate-key, kept for resume
    filter: str | None = None  # the signal's additional condition, kept for resume
    max_key: TypedKey | None = None
    last_read_key: TypedKey | None = None
    chunk_id: int = 0  # chunks completed so far; the next chunk is number chunk_id + 1
    rows_emitted: int = 0
    # Rows the chunk SELECTs returned; rows_read - rows_emitted were dropped by in-window
    # log events (their newer values went out as log events instead).
    rows_read: int = 0
    # The table's row count from the database's statistics when the snapshot started (None:
    # unknown), and when it started (epoch ms): for progress, rate and ETA (core.eta).
    estimated_rows: int | None = None
    started_ms: int | None = None
    # When it finished (done, stopped or failed; epoch ms): for its duration in ``status``
    # and to tell a run's own snapshots from earlier ones. None: unfinished, or finished in
    # a state written before this was recorded.
    finished_ms: int | None = None
    error: str | None = None

    def _require(self, *allowed: SnapshotStatus, action: str) -> None:
        if self.status not in allowed:
            raise StateError(
                f"cannot {action} the snapshot of {self.table}: it is {self.status.value}"
            )

    def start(self, max_key: Key | None) -> None:
        """Record the maximum key (None: the table, under its filter, is empty) and run."""
        self._require(SnapshotStatus.PENDING, action="start")
        if not self.key_columns:
            raise StateError(f"{self.table}: key columns must be known before the start")
        if max_key is not None and len(max_key) != len(self.key_columns):
            raise StateError(
                f"{self.table}: maximum key {max_key!r} does not match key "
                f"columns {self.key_columns}"
            )
        self.max_key = max_key
        self.status = SnapshotStatus.RUNNING if max_key is not None else SnapshotStatus.DONE

    def chunk_done(
        self,
        *,
        last_key: Key | None,
        selected: int,
        emitted: int,
        chunk_size: int,
        final: bool | None = None,
    ) -> None:
        """A window closed and its READ rows are durable in the sink: move on.

        ``final``: whether this was the last chunk, when the caller knows (a closed key range
        read whole, ``core.spans``: a range can return fewer rows than ``chunk_size`` and not
        be the last); None decides by the rule above."""
        self._require(SnapshotStatus.RUNNING, SnapshotStatus.PAUSED, action="finish a chunk of")
        if selected and last_key is None:
            raise StateError("a chunk that selected rows has a last key")
        if emitted > selected:
            raise StateError(f"a chunk emitted {emitted} of {selected} selected rows")
        self.chunk_id += 1
        self.rows_emitted += emitted
        self.rows_read += selected
        if last_key is not None:
            self.last_read_key = normalize_key(last_key)
        if final is None:
            final = selected < chunk_size or (
                last_key is not None and self.last_read_key == self.max_key
            )
        if final:
            self.status = SnapshotStatus.DONE

    def pause(self) -> None:
        self._require(SnapshotStatus.RUNNING, SnapshotStatus.PENDING, action="pause")
        self.status = SnapshotStatus.PAUSED

    def resume(self) -> None:
        """Undo a pause: back to running, or to pending if it was paused before it started
        (a running snapshot always has a maximum key; an empty table went straight to done)."""
        self._require(SnapshotStatus.PAUSED, action="resume")
        self.status = SnapshotStatus.RUNNING if self.max_key is not None else SnapshotStatus.PENDING

    def stop(self) -> None:
        self._require(
            SnapshotStatus.PENDING, SnapshotStatus.RUNNING, SnapshotStatus.PAUSED, action="stop"
        )
        self.status = SnapshotStatus.STOPPED

    def fail(self, error: str) -> None:
        self._require(
            SnapshotStatus.PENDING, SnapshotStatus.RUNNING, SnapshotStatus.PAUSED, action="fail"
        )
        self.status = SnapshotStatus.FAILED
        self.error = error


def _validate_token(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError("a position is written as its token string")
    return Position.from_token(value).token


PositionToken = Annotated[str, PlainValidator(_validate_token)]


class StreamState(_Model):
    position: PositionToken | None = None  # the last position durable in the sink
    # What the log reader needs to start again from ``position`` (PostgreSQL: the slot's
    # confirmed LSN; MySQL: binlog file, offset and GTID set). The dialect owns its shape.
    resume: dict[str, Any] = Field(default_factory=dict)


class SignalProblem(_Model):
    """A signal the engine could not act on, kept so ``status`` shows it."""

    signal_id: str
    signal_type: str
    message: str
    position: PositionToken | None = None


MAX_SIGNAL_PROBLEMS = 50
MAX_PROBLEM_CHARS = 2_000
KEEP_FINISHED_PER_TABLE = 3
MAX_FINISHED = 1_000


class EngineState(_Model):
    version: Literal[1] = STATE_VERSION
    stream: StreamState = Field(default_factory=StreamState)
    paused: StrictBool = False
    snapshots: list[TableProgress] = Field(default_factory=list)
    # signal id -> the position token of the signal row in the log when it was processed
    processed_signals: dict[str, PositionToken] = Field(default_factory=dict)
    signal_problems: list[SignalProblem] = Field(default_factory=list)  # newest last
    # The file and Kafka signal channels ([signals]): per channel ("file:<path>",
    # "kafka:<topic>"), how far it is acted on (the file's bytes, the topic's next offset),
    # saved with the checkpoint that holds what those signals did, so each acts once.
    signal_channels: dict[str, Annotated[int, Field(ge=0)]] = Field(default_factory=dict)
    # What the sink said at the checkpoint this state belongs to (e.g. the JSONL byte offset).
    sink: dict[str, Any] = Field(default_factory=dict)

    def add_problem(self, problem: SignalProblem) -> None:
        if len(problem.message) > MAX_PROBLEM_CHARS:
            cut = len(problem.message) - MAX_PROBLEM_CHARS
            problem = problem.model_copy(
                update={"message": f"{problem.message[:MAX_PROBLEM_CHARS]}... ({cut} more)"}
            )
        self.signal_problems = [*self.signal_problems, problem][-MAX_SIGNAL_PROBLEMS:]

    def prune_history(self) -> list[TableProgress]:
        """Drop old finished snapshot records (see the module docstring); returns them."""
        per_table: dict[TableId, int] = {}
        surrogate_kept: set[TableId] = set()
        finished = 0
        keep: list[TableProgress] = []
        dropped: list[TableProgress] = []
        for progress in reversed(self.snapshots):  # newest first
            table = progress.table
            if not progress.status.finished:
                keep.append(progress)
                continue
            keys_events = (
                progress.surrogate_key is not None
                and bool(progress.key_columns)
                and progress.status is not SnapshotStatus.FAILED
                and table not in surrogate_kept
            )
            if keys_events:
                surrogate_kept.add(table)
            seen = per_table.get(table, 0)
            if keys_events or (seen < KEEP_FINISHED_PER_TABLE and finished < MAX_FINISHED):
                per_table[table] = seen + 1
                finished += 1
                keep.append(progress)
            else:
                dropped.append(progress)
        if dropped:
            keep.reverse()
            self.snapshots = keep
        return dropped

    def progress(self, table: TableId) -> TableProgress | None:
        """The newest snapshot record of ``table``."""
        for progress in reversed(self.snapshots):
            if progress.table == table:
                return progress
        return None

    def add(self, progress: TableProgress) -> None:
        """Queue a table's snapshot; it waits, paused, if the engine is paused."""
        if self.paused:
            progress.pause()
        self.snapshots.append(progress)

    def active(self) -> TableProgress | None:
        """The snapshot that chunks are read for now: the first pending or running one."""
        if self.paused:
            return None
        for progress in self.snapshots:
            if progress.status in (SnapshotStatus.PENDING, SnapshotStatus.RUNNING):
                return progress
        return None

    def pause(self) -> None:
        if self.paused:
            raise StateError("the incremental snapshot is already paused")
        self.paused = True
        for progress in self.snapshots:
            if progress.status in (SnapshotStatus.PENDING, SnapshotStatus.RUNNING):
                progress.pause()

    def resume(self) -> None:
        if not self.paused:
            raise StateError("the incremental snapshot is not paused")
        self.paused = False
        for progress in self.snapshots:
            if progress.status is SnapshotStatus.PAUSED:
                progress.resume()

    def was_processed(self, signal_id: str, position: Position) -> bool:
        """Whether this signal row, seen at ``position``, was executed already."""
        seen = self.processed_signals.get(signal_id)
        return seen is not None and position.token <= seen

    def mark_processed(self, signal_id: str, position: Position) -> None:
        self.processed_signals[signal_id] = position.token

    def prune_processed(self, replay_from: Position) -> None:
        """Forget signals the log can no longer replay: those before ``replay_from``."""
        oldest = replay_from.token
        self.processed_signals = {
            sid: token for sid, token in self.processed_signals.items() if token >= oldest
        }

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> EngineState:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise StateError(f"state is not valid JSON: {exc}") from None
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: Any) -> EngineState:
        version = raw.get("version") if isinstance(raw, dict) else None
        if not isinstance(version, int) or isinstance(version, bool):
            raise StateError("state has no integer 'version'; is this a snapshotter state file?")
        if version < 1:
            raise StateError(f"state version {version} is not a snapshotter state version")
        if version > STATE_VERSION:
            raise StateError(
                f"state version {version} was written by a newer snapshotter "
                f"(this one reads up to {STATE_VERSION}); upgrade snapshotter"
            )
        for step in range(version, STATE_VERSION):
            raw = _MIGRATIONS[step](raw)
        try:
            state = cls.model_validate(raw)
        except ValueError as exc:
            raise StateError(f"state does not validate: {exc}") from None
        # A paused snapshot in an engine that is not paused could never resume (and the
        # reverse would read chunks during a pause): refuse such a file rather than stall.
        statuses = {p.status for p in state.snapshots}
        if not state.paused and SnapshotStatus.PAUSED in statuses:
            raise StateError("state is inconsistent: a snapshot is paused but the engine is not")
        if state.paused and statuses & {SnapshotStatus.PENDING, SnapshotStatus.RUNNING}:
            raise StateError(
                "state is inconsistent: the engine is paused but a snapshot is pending or running"
            )
        return state


# _MIGRATIONS[n] turns a version-n state dict into version n+1. Keep old state files as test
# fixtures when adding one.
_MIGRATIONS: dict[int, Any] = {}

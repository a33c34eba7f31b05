"""Debezium's incremental-snapshot notifications (``snapshotter.core.notifications``) sent
to the channels ``[notifications] channels`` names:

* "log": one INFO line per notification on the logger ``snapshotter.notifications``, the
  record as JSON.
* "table": a row per notification in ``[notifications] table`` in the source database
  (``snapshotter init`` creates it), written by a thread of its own over a connection of its
  own: the engine hands rows to a queue and never waits on the database.
* "sink": the sink's notification stream (``sinks.base.SinkNotifications``): Kafka, a
  topic; JSONL, a file beside the events; Spark, Parquet files under the landing root.

A channel that fails says so in one log line and the engine goes on: notifications report
on the snapshot, they never hold it up.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import sqlalchemy as sa

from signals.names import TableId
from snapshotter.config import Config
from snapshotter.core.notifications import Notification, View, diff
from snapshotter.core.state import EngineState, TableProgress
from snapshotter.sinks.base import notify_sink
from snapshotter.sources.setup_common import drop_table_if_exists

if TYPE_CHECKING:
    from snapshotter.engine import Engine

log = logging.getLogger("snapshotter.engine")
notifications_log = logging.getLogger("snapshotter.notifications")

# Rows the table channel may hold unwritten (a database that is down): past it, new ones are
# dropped (counted, and said once) rather than grow without bound.
TABLE_QUEUE_ROWS = 10_000
CLOSE_WAIT_S = 5.0  # at close, how long the table channel may take to write what it holds
RETRY_FIRST_S, RETRY_MAX_S = 1.0, 30.0  # after a failed insert, the rows are tried again
INSERT_ROWS = 1_000  # rows per INSERT statement (5 parameters each: well inside 65,535)


def notification_table(name: TableId, metadata: sa.MetaData | None = None) -> sa.Table:
    """The table channel's table: Debezium's record, one row each; ``seq`` orders them
    (several may share a millisecond), ``additional_data`` is a JSON object as text. ``seq``
    is an identity column (AUTO_INCREMENT on MySQL): inserting needs INSERT only, where a
    serial column's sequence would need USAGE too."""
    return sa.Table(
        name.table,
        metadata or sa.MetaData(),
        sa.Column(
            "seq",
            # SQLite (unit tests) numbers rows itself only in an INTEGER primary key.
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            sa.Identity(),
            primary_key=True,
        ),
        sa.Column("id", sa.String(255), nullable=False),
        sa.Column("aggregate_type", sa.String(64), nullable=False),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("additional_data", sa.Text, nullable=False),
        sa.Column("timestamp", sa.BigInteger, nullable=False),
        schema=name.schema,
    )


def create_notification_table(conn: sa.Connection, name: TableId) -> bool:
    """Create the notification table unless it exists; whether it was created."""
    table = notification_table(name)
    if sa.inspect(conn).has_table(table.name, schema=table.schema):
        return False
    table.create(conn)
    return True


def drop_notification_table(engine: sa.Engine, name: TableId) -> bool:
    """Drop the notification table if it exists (``teardown``); whether it existed."""
    return drop_table_if_exists(engine, notification_table(name))


def table_row(record: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": record["id"],
        "aggregate_type": record["aggregate_type"],
        "type": record["type"],
        "additional_data": json.dumps(record["additional_data"], ensure_ascii=False),
        "timestamp": record["timestamp"],
    }


class Channel(Protocol):
    name: str

    def send(self, records: Sequence[Mapping[str, Any]]) -> None: ...

    def close(self) -> None: ...


class LogChannel:
    name = "log"

    def send(self, records: Sequence[Mapping[str, Any]]) -> None:
        for record in records:
            notifications_log.info("%s", json.dumps(record, ensure_ascii=False))

    def close(self) -> None:
        pass


class TableChannel:
    """Inserts rows into the notification table from a thread of its own."""

    name = "table"

    def __init__(self, connect: Callable[[], sa.Engine], table: TableId) -> None:
        self._connect = connect
        self._table = table
        self._queue: queue.Queue[Sequence[Mapping[str, Any]] | None] = queue.Queue()
        self._held = 0  # rows queued, not yet written
        self._dropped = 0
        self._lock = threading.Lock()
        self._failing: str | None = None  # the last failure said, until a write succeeds
        self._thread = threading.Thread(target=self._run, name="notifications-table", daemon=True)
        self._thread.start()

    def send(self, records: Sequence[Mapping[str, Any]]) -> None:
        with self._lock:
            if self._held + len(records) > TABLE_QUEUE_ROWS:
                if not self._dropped:
                    log.warning(
                        "notifications: %d rows wait for table %s; dropping new ones until "
                        "it takes them (see the error above)",
                        self._held,
                        self._table,
                    )
                self._dropped += len(records)
                return
            self._held += len(records)
        self._queue.put(list(records))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(CLOSE_WAIT_S)
        if self._thread.is_alive():
            log.warning(
                "notifications: %d rows for table %s not written within %.0f s of stopping",
                self._held,
                self._table,
                CLOSE_WAIT_S,
            )

    def _run(self) -> None:
        engine: sa.Engine | None = None
        table = notification_table(self._table)
        pending: list[Mapping[str, Any]] = []  # taken from the queue, not yet written
        wait = RETRY_FIRST_S
        closing = False
        deadline: float | None = None  # once stopping: the last moment to try again
        try:
            while not closing:
                try:  # block for work; with rows held back by a failure, only until a retry
                    item = self._queue.get(timeout=wait if pending else None)
                except queue.Empty:
                    item = []
                while item is not None:  # what came in meanwhile goes in the same insert
                    pending.extend(item)
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                closing = item is None
                if not pending:
                    continue
                try:
                    if engine is None:
                        engine = self._connect()
                    _insert(engine, table, pending)
                except Exception as exc:
                    self._failed(exc, engine)
                    if closing:  # a few more tries, within the time close waits
                        if deadline is None:
                            deadline = time.monotonic() + CLOSE_WAIT_S * 0.8
                        if time.monotonic() + wait < deadline:
                            time.sleep(wait)
                            closing = False
                            self._queue.put(None)  # seen again after the retry
                    wait = min(wait * 2, RETRY_MAX_S)
                    continue
                if self._failing is not None:
                    log.info("notifications: writing to table %s again", self._table)
                    self._failing = None
                wait = RETRY_FIRST_S
                with self._lock:
                    self._held -= len(pending)
                    dropped, self._dropped = self._dropped, 0
                pending = []
                if dropped:
                    log.warning("notifications: %d were dropped for table %s", dropped, self._table)
            if pending:
                log.warning(
                    "notifications: %d rows for table %s not written at stop (see the error above)",
                    len(pending),
                    self._table,
                )
        finally:
            if engine is not None:
                engine.dispose()

    def _failed(self, exc: Exception, engine: sa.Engine | None) -> None:
        from snapshotter.common.errors import is_privilege_error, source_reason

        reason = source_reason(exc) if isinstance(exc, sa.exc.DBAPIError) else str(exc)
        reason = reason.strip().splitlines()[0] if reason.strip() else type(exc).__name__
        if reason == self._failing:
            return  # said once until it works again
        self._failing = reason
        if engine is not None and is_privilege_error(exc):
            from snapshotter.sources.privileges import grant_for

            fix = f"run as an administrator: {grant_for(engine, self._table, ('INSERT',))}"
        elif _missing_table(exc):
            fix = "run `snapshotter init` to create it"
        else:
            fix = "check that the source answers and the table takes rows (they are tried again)"
        log.error(
            'notifications: cannot write to table %s (%s); %s, or take "table" out of '
            "[notifications] channels. The engine goes on",
            self._table,
            reason,
            fix,
        )


def _missing_table(exc: Exception) -> bool:
    """Whether the source said the table does not exist (PostgreSQL 42P01, MySQL 1146)."""
    orig = getattr(exc, "orig", None)
    if getattr(orig, "sqlstate", None) == "42P01":
        return True
    args: tuple[Any, ...] = tuple(getattr(orig, "args", ()))
    return bool(args) and args[0] == 1146


def _insert(engine: sa.Engine, table: sa.Table, records: Sequence[Mapping[str, Any]]) -> None:
    """One multi-row INSERT per ``INSERT_ROWS`` rows, in one transaction. Not executemany:
    psycopg runs that in pipeline mode, and a failed insert (a missing table) then also
    prints "error ignored terminating Pipeline" warnings to stderr."""
    rows = [table_row(r) for r in records]
    with engine.begin() as conn:
        for start in range(0, len(rows), INSERT_ROWS):
            conn.execute(sa.insert(table).values(rows[start : start + INSERT_ROWS]))


class SinkChannel:
    """The sink's own notification stream; called on the engine's thread, as ``write`` is."""

    name = "sink"

    def __init__(self, topic: str) -> None:
        self._topic = topic
        self._sink: object | None = None
        self._failing: str | None = None

    def attach(self, sink: object) -> None:
        self._sink = sink

    def send(self, records: Sequence[Mapping[str, Any]]) -> None:
        if self._sink is None:
            return
        try:
            taken = notify_sink(self._sink, records, self._topic)
        except Exception as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            if reason != self._failing:
                self._failing = reason
                log.error(
                    'notifications: the sink did not take them (%s); take "sink" out of '
                    "[notifications] channels if it cannot. The engine goes on",
                    reason,
                )
            return
        self._failing = None
        if not taken:
            log.warning(
                'notifications: the %s sink cannot take notifications; take "sink" out of '
                "[notifications] channels",
                type(self._sink).__name__,
            )
            self._sink = None  # said once

    def close(self) -> None:
        pass


class Notifier:
    """The engine's observer that turns state changes into notifications for the channels.

    ``start(engine)`` takes the loaded state as the first view and asks the engine for every
    state it saves (``Engine.observe_saves``); each saved state (``saved``) sends what
    changed since. Only saved states: the engine saves a state once the sink has made what
    it covers durable, so a crash rolls back at most to the last state saved, never behind
    what was notified (an IN_PROGRESS ``last_processed_key`` never goes back, nothing is
    sent twice). Records are told apart by the engine's own record objects (it changes them
    in place; a saved state's records are copies, mapped back to them); the view keeps those
    it has seen alive, so an object id is never reused for another record while it is
    remembered."""

    def __init__(
        self,
        channels: Sequence[Channel],
        *,
        connector: str,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        self.channels = list(channels)
        self._connector = connector
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._view: View | None = None
        self._alive: list[TableProgress] = []
        self._signature: tuple[object, ...] = ()
        self._engine: Engine | None = None

    def start(self, engine: Engine) -> None:
        self._engine = engine
        for channel in self.channels:
            if isinstance(channel, SinkChannel):
                channel.attach(engine.sink)
        self._baseline(engine.state, engine.state.snapshots, id)
        engine.observe_saves(self.saved)

    def _baseline(
        self,
        state: EngineState,
        live: Sequence[TableProgress],
        key: Callable[[TableProgress], Hashable],
    ) -> None:
        self._view = View.of(state, key)
        self._alive = list(live)

    def saved(self, state: EngineState, live: Sequence[TableProgress]) -> None:
        """A state the engine saved; ``live``: its records' originals, in the same order."""
        pairs = zip(state.snapshots, live, strict=True)
        originals = {id(copy): id(record) for copy, record in pairs}
        self._observe(state, live, lambda p: originals[id(p)])

    def __call__(self, state: EngineState) -> None:
        """Observe ``state`` whose records are the engine's own (tests, simple callers)."""
        self._observe(state, state.snapshots, id)

    def _observe(
        self,
        state: EngineState,
        live: Sequence[TableProgress],
        key: Callable[[TableProgress], Hashable],
    ) -> None:
        if self._view is None:  # never started: this is the first view
            self._baseline(state, live, key)
            return
        # Most calls change nothing, which this tells cheaply (a finished record never
        # changes again; new records are new objects).
        signature = (
            tuple(map(id, live)),
            tuple((p.status, p.chunk_id) for p in state.snapshots if not p.status.finished),
        )
        if signature == self._signature:
            return
        self._signature = signature
        try:
            notes, self._view = diff(
                self._view, state, connector=self._connector, now_ms=self._clock_ms(), key=key
            )
        except Exception:  # a bug here must not stop the engine
            log.exception("notifications: cannot derive them from the state; none sent")
            self._baseline(state, live, key)
            return
        self._alive = list(live)
        if notes:
            self.send(notes)

    def send(self, notes: Sequence[Notification]) -> None:
        records = [n.to_dict() for n in notes]
        for channel in self.channels:
            try:
                channel.send(records)
            except Exception:
                log.exception("notifications: the %s channel failed", channel.name)

    def close(self) -> None:
        """Close the channels (the table channel writes what it holds, briefly). The engine
        observed its last step already, and its sink is closed by now."""
        for channel in self.channels:
            try:
                channel.close()
            except Exception:
                log.exception("notifications: closing the %s channel failed", channel.name)


def sink_topic(config: Config) -> str:
    """The sink channel's topic: ``[notifications] topic``, else ``<source name>.notifications``."""
    return config.notifications.topic or f"{config.source.topic_prefix}.notifications"


def notifier_for(config: Config) -> Notifier | None:
    """The notifier of ``[notifications]``; None when no channel is configured."""
    wanted = config.notifications.channels
    if not wanted:
        return None
    channels: list[Channel] = []
    for name in wanted:
        if name == "log":
            channels.append(LogChannel())
        elif name == "table":
            from snapshotter.sources.connect import create_engine

            channels.append(
                TableChannel(partial(create_engine, config.source), config.notification_table_id)
            )
        elif name == "sink":
            channels.append(SinkChannel(sink_topic(config)))
    return Notifier(channels, connector=config.source.topic_prefix)


def observe(
    notifier: Notifier | None, on_start: Callable[[Engine], None] | None
) -> Callable[[Engine], None] | None:
    """``on_start`` with the notifier's start added (which asks the engine for its saves)."""
    if notifier is None:
        return on_start
    found: Notifier = notifier

    def start(engine: Engine) -> None:
        found.start(engine)
        if on_start is not None:
            on_start(engine)

    return start

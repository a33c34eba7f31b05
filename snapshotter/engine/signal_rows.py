"""The rows the log brings of the signal table: parsed, each user signal acted on once
(``signal_actions``), watermark rows handed back to the engine (they are the chunk windows',
``window_close``), and a row the engine cannot act on kept as a problem for ``status``.
Signals of the file and Kafka channels (``signal_channels``) are acted on by the same rules.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from signals import SignalError, Watermark, parse_signal
from signals.lines import SignalLine
from signals.model import Signal
from signals.names import TableId
from snapshotter.config import Config
from snapshotter.core.events import ChangeEvent
from snapshotter.core.position import Position
from snapshotter.engine.failures import Failures
from snapshotter.engine.live_state import LiveState
from snapshotter.engine.outcome import RunOutcome
from snapshotter.engine.retry import SourceRetry, SourceUnavailableError
from snapshotter.engine.scheduler import Scheduler
from snapshotter.engine.signal_actions import SignalActions, SignalContext
from snapshotter.engine.signal_channels import open_channels
from snapshotter.engine.snapshot_scope import snapshot_scope
from snapshotter.engine.workers import Task
from snapshotter.sources.base import Dialect

log = logging.getLogger("snapshotter.engine")

CHANNEL_POLL_S = 0.2  # how often the file and Kafka channels are looked at


class SignalRows:
    def __init__(
        self,
        *,
        config: Config,
        live: LiveState,
        dialect: Dialect,
        retry: SourceRetry,
        scheduler: Scheduler,
        outcome: RunOutcome,
        failures: Failures,
        cancel_tasks: Callable[[Callable[[Task], bool]], None],
        snapshots_added: Callable[[], None],
    ) -> None:
        """``cancel_tasks``: cancels the running reads of the chunk tasks that match (a
        stop-snapshot); ``snapshots_added``: the engine refreshes the keys it compares."""
        self._live = live
        self._state = state = live.state
        self._dialect = dialect
        self._failures = failures
        self._channels = config.signals.channels
        self._table_channel = "table" in self._channels
        self._readers = open_channels(config, self._state)
        self._next_read = 0.0
        # What execute-snapshot is planned against: the config's, as `signal` checks it.
        scope = snapshot_scope(config.source, config.own_tables)
        self._actions = SignalActions.default(
            SignalContext(
                state=state,
                outcome=outcome,
                problem=failures.signal,
                list_tables=lambda: retry.wait_out(
                    "listing tables for execute-snapshot", dialect.list_tables, dialect.is_transient
                ),
                relation_kinds=self._relation_kinds,
                drop_run=scheduler.drop_run,
                cancel_tasks=cancel_tasks,
                snapshots_added=snapshots_added,
                captured=scope.captured,
                captured_text=scope.captured_text,
                signal_table=scope.signal_table,
                default_schema=scope.default_schema,
                own_tables=scope.own_tables,
                wall_ms=live.wall_ms,
            )
        )

    def arrived(self, event: ChangeEvent) -> Watermark | None:
        """Act on a row inserted into the signal table (``event``); a watermark row is
        returned, for the engine's windows."""
        row = event.after or {}
        signal = parse_signal(
            row.get("id"),
            row.get("type"),
            row.get("data"),
            dollar_quotes=self._dialect.dollar_quotes,
        )
        if isinstance(signal, Watermark):
            return signal
        if isinstance(signal, SignalError):
            self._failures.signal(
                signal.signal_id, signal.signal_type, signal.problem, event.position
            )
            return None
        if not self._table_channel:
            log.warning(
                "signal %s (%s) in the signal table ignored: [signals] channels does not list "
                '"table"; send it by %s, or add "table" to channels',
                signal.id,
                signal.type.value,
                " or ".join(self._channels),
            )
            return None
        self._act(signal, event.position)
        return None

    def read_channels(self, now: float) -> None:
        """Act on what the file and Kafka channels got since the last read (at most every
        ``CHANNEL_POLL_S``); only between transactions, where a checkpoint may follow."""
        if not self._readers or now < self._next_read or self._live.in_transaction:
            return
        self._next_read = now + CHANNEL_POLL_S
        token = self._state.stream.position
        position = Position.from_token(token) if token else Position(0)
        for reader in self._readers:
            lines = reader.read()
            if reader.offset == self._state.signal_channels.get(reader.key, 0):
                continue
            for line in lines:
                try:
                    self.from_channel(line, reader.label, position)
                except SourceUnavailableError:
                    # The engine stops with state saved: saved to before this line, so the
                    # next run acts on it (the lines before it are done).
                    reader.rewind(line.offset)
                    self._live.signal_channel_read(reader.key, line.offset)
                    raise
            self._live.signal_channel_read(reader.key, reader.offset)

    def from_channel(self, line: SignalLine, channel: str, position: Position) -> None:
        """Act on a line of a file or a message of a topic (``channel``: how messages name
        it), read when the log was at ``position``."""
        if line.problem is not None:
            self._failures.signal("?", "?", f"{channel}, {line.problem}", position)
            return
        signal = parse_signal(
            line.id, line.type, line.data, dollar_quotes=self._dialect.dollar_quotes
        )
        where = f"{channel}, {line.where}"
        if isinstance(signal, SignalError):
            self._failures.signal(
                signal.signal_id, signal.signal_type, f"{where}: {signal.problem}", position
            )
            return
        if isinstance(signal, Watermark):
            self._failures.signal(
                signal.window_id,
                f"snapshot-window-{signal.kind.value}",
                f"{where}: a watermark is the engine's own row in the signal table, never a "
                "signal to send; remove it",
                position,
            )
            return
        # No dedup by id here: the channel's saved offset is what keeps a line from acting
        # twice (a reused id, later in the file or topic, acts again, as in Debezium).
        self._dispatch(signal, position)

    def close(self) -> None:
        """Release the channels' readers (a Kafka consumer)."""
        for reader in self._readers:
            reader.close()

    def _act(self, signal: Signal, position: Position) -> None:
        if self._state.was_processed(signal.id, position):
            return
        self._live.signal_processed(signal.id, position)
        self._dispatch(signal, position)

    def _dispatch(self, signal: Signal, position: Position) -> None:
        log.info("signal %s (%s) received", signal.id, signal.type.value)
        try:
            self._actions.dispatch(signal, position)
        except SourceUnavailableError:
            raise  # the engine stops with state saved; the signal is read again on resume
        except Exception as exc:
            # A bug met by one signal must not end the stream: the same row would be read
            # again, and end it again, after every restart.
            log.exception("signal %s could not be handled", signal.id)
            self._failures.signal(
                signal.id, signal.type.value, f"internal error: {exc!r}", position
            )

    def _relation_kinds(self, tables: Sequence[TableId]) -> Mapping[TableId, str]:
        """Why names the listing lacks are not tables (a view, ...): only for the message,
        so a failure here leaves the plain "does not exist"."""
        try:
            return self._dialect.relation_kinds(tables)
        except Exception:
            log.debug("could not look up the kinds of %d relations", len(tables), exc_info=True)
            return {}

"""The rows the log brings of the signal table: parsed, each user signal acted on once
(``signal_actions``), watermark rows handed back to the engine (they are the chunk windows',
``window_close``), and a row the engine cannot act on kept as a problem for ``status``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from signals import SignalError, Watermark, parse_signal
from signals.names import TableId
from snapshotter.config import Config
from snapshotter.core.events import ChangeEvent
from snapshotter.engine.failures import Failures
from snapshotter.engine.live_state import LiveState
from snapshotter.engine.outcome import RunOutcome
from snapshotter.engine.retry import SourceRetry, SourceUnavailableError
from snapshotter.engine.scheduler import Scheduler
from snapshotter.engine.signal_actions import SignalActions, SignalContext
from snapshotter.engine.snapshot_scope import snapshot_scope
from snapshotter.engine.workers import Task
from snapshotter.sources.base import Dialect

log = logging.getLogger("snapshotter.engine")


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
        if self._state.was_processed(signal.id, event.position):
            return None
        self._live.signal_processed(signal.id, event.position)
        log.info("signal %s (%s) received", signal.id, signal.type.value)
        try:
            self._actions.dispatch(signal, event.position)
        except SourceUnavailableError:
            raise  # the engine stops with state saved; the signal is read again on resume
        except Exception as exc:
            # A bug met by one signal must not end the stream: the same row would be read
            # again, and end it again, after every restart.
            log.exception("signal %s could not be handled", signal.id)
            self._failures.signal(
                signal.id, signal.type.value, f"internal error: {exc!r}", event.position
            )
        return None

    def _relation_kinds(self, tables: Sequence[TableId]) -> Mapping[TableId, str]:
        """Why names the listing lacks are not tables (a view, ...): only for the message,
        so a failure here leaves the plain "does not exist"."""
        try:
            return self._dialect.relation_kinds(tables)
        except Exception:
            log.debug("could not look up the kinds of %d relations", len(tables), exc_info=True)
            return {}

"""Whether the source's log carries what the engine needs, for any source: the signal table
(without it no signal and no watermark arrives) and every captured table (else its changes
are missing). Each connector says what its log lacks (``Connector.log_coverage_problems``);
this module asks it:

* before ``run`` and ``resume`` stream (:func:`refuse_uncovered`, from
  ``runner.build_engine``): a run that would miss changes does not start, and the error
  names the fix;
* while the engine runs, through the :class:`CoverageProbe` it hands the engine
  (``engine.watchdog`` asks it every so often, off the streaming thread, and when a close
  watermark is overdue).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from signals.names import TableId
from snapshotter.config import Config
from snapshotter.engine.watchdog import LogCoverageError, coverage_message
from snapshotter.sources.base import Dialect
from snapshotter.sources.connector import ConnectError, Connector, connector_for
from snapshotter.sources.positions import error_reason
from snapshotter.sources.setup_common import captured_by

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10


def captured_now(config: Config, dialect: Dialect) -> list[TableId]:
    """The tables ``source.tables`` selects in the source now (a configured name that does
    not exist has no changes to miss), without the signal table."""
    source = config.source
    signal_table = source.signal_table_id
    captured = captured_by(source.tables, source.default_schema, signal_table)
    return [t for t in dialect.list_tables() if t != signal_table and captured(t)]


class CoverageProbe:
    """Asks the connector what its log lacks, over connections of its own (opened at the
    first question, kept for the run): the engine asks from a thread of its own."""

    def __init__(self, config: Config, connector: Connector | None = None) -> None:
        self._config = config
        self.connector = connector or connector_for(config.source)
        self._handle: Any = None
        self._dialect: Dialect | None = None
        # A check still running when the engine closes releases the connections itself,
        # when it ends (close does not wait for a slow source).
        self._lock = threading.Lock()
        self._closed = False
        self._busy = False

    def problems(self) -> list[str]:
        connector = self.connector
        with self._lock:
            if self._closed:
                return []
            self._busy = True
        try:
            if self._dialect is None:
                self._dialect = connector.open_dialect()
            if self._handle is None:
                self._handle = connector.connect(timeout_s=CONNECT_TIMEOUT_S)
            tables = captured_now(self._config, self._dialect)
            return connector.log_coverage_problems(self._handle, tables)
        finally:
            with self._lock:
                self._busy = False
                if self._closed:
                    self._release()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if not self._busy:
                self._release()

    def _release(self) -> None:
        if self._handle is not None:
            self.connector.dispose(self._handle)
            self._handle = None
        if self._dialect is not None:
            self._dialect.close()
            self._dialect = None


def refuse_uncovered(config: Config, dialect: Dialect) -> CoverageProbe:
    """Before the engine streams: LogCoverageError (closing ``dialect``, nothing else is open
    yet) when the log lacks the signal table or a captured table, with the fix. Returns the
    probe the engine asks while it runs. A source that cannot be asked now is left to the
    log reader's own error, and to the engine's checks."""
    probe = CoverageProbe(config)
    connector = probe.connector
    try:
        problems = probe.problems()
    except ConnectError as exc:
        log.warning("could not check what the source's log carries: %s", exc)
        return probe
    except connector.errors as exc:
        log.warning("could not check what the source's log carries: %s", error_reason(exc))
        return probe
    if problems:
        probe.close()
        dialect.close()
        raise LogCoverageError(coverage_message(problems, None))
    return probe

"""Whether the source's log carries what the engine needs, for any source: the signal table
(without it no signal and no watermark arrives) and every captured table (else its changes
are missing). Each connector says what its log lacks (``Connector.log_coverage_problems``);
this module asks it:

* before ``run`` and ``resume`` stream (``app.log_coverage.check_before_streaming``, from
  ``runner.build_engine``): a run that would miss changes does not start, and the error
  names the fix (a PostgreSQL publication of ours is repaired instead);
* while the engine runs, through the :class:`CoverageProbe` it hands the engine
  (``engine.watchdog`` asks it every so often, off the streaming thread, and when a close
  watermark is overdue).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from snapshotter.app.log_coverage import tables_to_cover
from snapshotter.config import Config
from snapshotter.engine.state_store import StateStore
from snapshotter.sources.base import Dialect
from snapshotter.sources.connector import Connector, connector_for

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10


class CoverageProbe:
    """Asks the connector what its log lacks, over connections of its own (opened at the
    first question, kept for the run): the engine asks from a thread of its own."""

    def __init__(
        self, config: Config, state_file: Path, connector: Connector | None = None
    ) -> None:
        self._config = config
        self._state_file = state_file  # the saved state: what the output holds
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
            state = StateStore(self._state_file).load()
            tables = tables_to_cover(self._config, connector, self._dialect.list_tables, state)
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

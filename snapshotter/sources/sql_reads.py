"""The lifecycle of a max-key, chunk or bound read on a SQL dialect's chunk connection,
written once; each database fills in small hooks.

One read: take the connection's lock (the chunk connection serves one query at a time),
connect if needed, build the statement for that connection, run it under the query guard
(the time limit and cancellation, ``query_guard``) in a read-only transaction of its own,
check after a filter that the session still writes values as the log does, then clean up:
a connection whose query was cancelled is dropped (a late cancel must not hit a later
query), a filtered one gets its session reset (whatever the filter did stays out of later
reads), a broken one is dropped. The driver's error becomes a TableError (what the query
did: bad filter, permissions, data, the time limit), ReadCancelled (stop-snapshot,
shutdown) or a ChunkReadError worth a retry (the connection or server failed).

The hooks, per database:

* ``_statement_dialect``: what the chunk statements are compiled for (their paramstyle);
* ``_open_connection``: a new chunk connection with the session's own settings, and the
  values of ``_watched_session`` in it;
* ``_is_usable`` / ``_close_connection``: whether a connection can serve another read;
  close it, quietly;
* ``_canceller``: how the guard stops the connection's running statement (PostgreSQL: a
  cancel request; MySQL: ``KILL QUERY`` from a connection of its own);
* ``_read_transaction`` / ``_fetch``: the read-only transaction, and the statement run in
  it (with the server's own time limit);
* ``_session_values`` / ``_reset_session``: the watched session values now; the session as
  new after a filter;
* ``_driver_errors``, ``_server_timed_out``, ``_error_text`` and ``_transient_error`` (of
  ``SqlDialect``): what the driver raises, which of its errors is the server's time limit,
  its message, and which mean a lost connection.
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

import sqlalchemy as sa

from signals.names import TableId
from snapshotter.common.faults import failpoint
from snapshotter.sources.base import ChunkReadError, TableError
from snapshotter.sources.query_guard import (
    CANCEL_TIMEOUT_S,
    GuardedQuery,
    Outcome,
    QueryGuard,
    cancelled_error,
    session_changed_error,
    timeout_error,
)
from snapshotter.sources.sql_common import CHUNK_QUERY, SqlDialect, StatementCache

ConnT = TypeVar("ConnT")  # the driver's chunk connection
RowsT = TypeVar("RowsT")  # what ``_fetch`` returns (the rows, and what else the read gives)
# A statement as run: its SQL and its parameters, in the driver's paramstyle.
Statement = tuple[str, Any]


@dataclass(frozen=True, slots=True)
class WatchedSession:
    """The session values a filter must not change (they change the values read or how
    they are written, so its rows would differ from the log's): their ``names``, what they
    are (``kind``: "setting" or "variable"), and the ``fix`` the error suggests."""

    kind: str
    names: tuple[str, ...]
    fix: str


class GuardedReads(SqlDialect, Generic[ConnT, RowsT]):
    """The reads of a SQL dialect's chunk connection (see the module docstring)."""

    _watched_session: ClassVar[WatchedSession]
    _driver_errors: ClassVar[tuple[type[BaseException], ...]]  # what the driver raises

    def __init__(self, chunk_timeout_s: float) -> None:
        self.chunk_timeout_s = chunk_timeout_s
        self._engine: sa.Engine | None = None  # the catalog's and watermarks' (``engine``)
        self._conn: ConnT | None = None
        self._conn_lock = threading.Lock()  # the chunk connection serves one query at a time
        self._guard = QueryGuard()  # time limit and cancellation of its queries
        # The watched session values of a new connection (None: not known).
        self._clean_session: tuple[Any, ...] | None = None
        self._statements = StatementCache(self._statement_dialect)

    # --- hooks ----------------------------------------------------------------------------

    @abstractmethod
    def _statement_dialect(self) -> sa.Dialect:
        """The SQLAlchemy dialect the chunk statements are compiled for."""

    @abstractmethod
    def _open_connection(self) -> tuple[ConnT, tuple[Any, ...] | None]:
        """A new chunk connection with the session's own settings, and the values of
        ``_watched_session`` in it (None when the server gave none)."""

    @staticmethod
    @abstractmethod
    def _is_usable(conn: ConnT) -> bool:
        """Whether ``conn`` is open and not broken."""

    @staticmethod
    @abstractmethod
    def _close_connection(conn: ConnT) -> None:
        """Close ``conn``, whatever state it is in; never raises the driver's errors."""

    @abstractmethod
    def _canceller(self, conn: ConnT) -> Callable[[], None]:
        """What stops the statement running on ``conn``, from another thread."""

    @abstractmethod
    def _read_transaction(self, conn: ConnT) -> AbstractContextManager[None]:
        """The read-only transaction of one read: begun on entry, ended on exit."""

    @abstractmethod
    def _fetch(self, conn: ConnT, statement: Statement) -> RowsT:
        """Run ``statement`` in the read transaction, under the server's time limit."""

    @abstractmethod
    def _session_values(self, conn: ConnT) -> tuple[Any, ...] | None:
        """The values of ``_watched_session`` now."""

    @abstractmethod
    def _reset_session(self, conn: ConnT) -> bool:
        """Undo what a filter may have left in the session; False when that left it unlike
        a new one (a new connection is needed)."""

    @abstractmethod
    def _server_timed_out(self, exc: BaseException, query: GuardedQuery | None) -> bool:
        """Whether ``exc`` is the server's own statement time limit."""

    @abstractmethod
    def _error_text(self, exc: BaseException) -> str:
        """The driver's error as the snapshot's error shows it."""

    # --- the read -------------------------------------------------------------------------

    def _read(
        self,
        table: TableId,
        what: str,
        statement: Callable[[ConnT], Statement],
        filtered: bool,
    ) -> RowsT:
        """Run the statement ``statement(conn)`` builds for the chunk connection in one
        read-only transaction under the time limit; what ``_fetch`` makes of it.
        ``filtered``: the SQL holds a signal's filter, so the session is checked before
        the rows are used and reset after (whatever the filter did to it stays out of later
        reads). ``what`` names the query in errors."""
        with self._conn_lock:
            query: GuardedQuery | None = None
            try:
                conn = self._connection()
                sql_and_params = statement(conn)
                cancel = self._canceller(conn)
                with (
                    self._guard.running(self.chunk_timeout_s, cancel) as query,
                    self._read_transaction(conn),
                ):
                    rows = self._fetch(conn, sql_and_params)
                    if filtered:
                        self._check_session(conn, table)
                    if what == CHUNK_QUERY:
                        failpoint("chunk.select")
            except self._driver_errors as exc:
                raise self._failure(table, what, exc, query, filtered) from exc
            finally:
                self._after_read(query, filtered)
            assert query is not None
            if query.outcome is not None:  # cancelled, though the query got to its end
                raise self._outcome_error(query.outcome, table, what, filtered)
        return rows

    def _connection(self) -> ConnT:
        conn = self._conn
        if conn is None or not self._is_usable(conn):
            if conn is not None:
                self._close_connection(conn)
            self._conn = None
            conn, self._clean_session = self._open_connection()
            self._conn = conn
        return conn

    def _check_session(self, conn: ConnT, table: TableId) -> None:
        now = self._session_values(conn)
        if self._clean_session is None or now is None:
            return
        watched = self._watched_session
        error = session_changed_error(
            table, watched.kind, watched.names, self._clean_session, now, watched.fix
        )
        if error is not None:
            raise error

    def _after_read(self, query: GuardedQuery | None, filtered: bool) -> None:
        """After a cancelled query, a new connection (a late cancel must not hit a later
        query); after a filtered one, a clean session; after a broken one, a new one."""
        conn = self._conn
        if conn is None:
            return
        if self._is_usable(conn):
            cancelled = query is not None and query.outcome is not None
            try:
                # A reset that leaves the session unlike a new one: a new connection.
                if cancelled or (filtered and not self._reset_session(conn)):
                    self._close_connection(conn)
            except self._driver_errors:
                # Whatever the filter left is gone with the session.
                self._close_connection(conn)
        if not self._is_usable(conn):
            self._close_connection(conn)
            self._conn = None  # reconnect on the next read

    def _failure(
        self,
        table: TableId,
        what: str,
        exc: BaseException,
        query: GuardedQuery | None,
        filtered: bool,
    ) -> Exception:
        """A TableError for what the query did (bad filter, permissions, data, the time
        limit); ReadCancelled when the guard cancelled it on request; a ChunkReadError,
        worth a retry, when the connection or server failed."""
        if query is not None and query.outcome is not None:
            return self._outcome_error(query.outcome, table, what, filtered)
        if self._server_timed_out(exc, query):
            return self._outcome_error(Outcome.TIMED_OUT, table, what, filtered)
        message = f"{what} on table {table} failed: {self._error_text(exc)}"
        if self._transient_error(exc):
            if self._conn is not None:
                self._close_connection(self._conn)
            self._conn = None  # reconnect on the next read
            return ChunkReadError(message)
        return TableError(message)

    def _outcome_error(
        self, outcome: Outcome, table: TableId, what: str, filtered: bool
    ) -> Exception:
        """ReadCancelled for a query the guard cancelled on request; a TableError for one
        past the time limit."""
        if outcome is Outcome.CANCELLED:
            return cancelled_error(what, table)
        return timeout_error(what, table, self.chunk_timeout_s, filtered)

    # --- stopping -------------------------------------------------------------------------

    def cancel_reads(self) -> None:
        self._guard.cancel()

    def allow_reads(self) -> None:
        self._guard.allow()

    def close(self) -> None:
        self._guard.close()
        # Not forever: a query whose cancel failed may still hold the lock (the reading
        # thread is a daemon; the server ends the query when the connection goes).
        if self._conn_lock.acquire(timeout=CANCEL_TIMEOUT_S):
            try:
                if self._conn is not None:
                    self._close_connection(self._conn)
                    self._conn = None
            finally:
                self._conn_lock.release()
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

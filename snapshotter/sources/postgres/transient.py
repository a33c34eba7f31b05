"""Which PostgreSQL errors mean "the server is away, try again": a lost or refused
connection, a server shutting down, starting up or crashed, a terminated backend, no free
connection slot. Not: what the query did, an authentication or permission failure, a
missing database. For the chunk reads (``reads``), the catalog and watermark connections
(``dialect``) and the log reader (``reader``)."""

from __future__ import annotations

import adbc_driver_manager
import psycopg

from snapshotter.sources.postgres import arrow as pg_arrow

# Server errors that mean the server is going away, coming back or out of connection slots
# (a restart, a terminated backend, a crash of another backend): worth retrying. Class 08 is
# a lost or refused connection.
_TRANSIENT_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "53300"})
# libpq reports a failed connection attempt without a SQLSTATE: these words in its message
# mean the server answered and refused us, which no retry fixes.
_REFUSED = (
    "authentication failed",
    "pg_hba.conf",
    "does not exist",
    "permission denied",
    "must be superuser",
    "replication role",
    "no password supplied",
)


def pg_error_is_transient(sqlstate: str | None, message: str) -> bool:
    """Whether a PostgreSQL error (its SQLSTATE, None for what libpq reports itself, such as
    a refused or dropped connection) means the connection was lost or the server is
    restarting or unavailable, rather than a problem a retry cannot fix."""
    if sqlstate is None:
        lowered = message.lower()
        return not any(word in lowered for word in _REFUSED)
    return sqlstate.startswith("08") or sqlstate in _TRANSIENT_SQLSTATES


def driver_error_is_transient(error: BaseException) -> bool:
    """Whether ``error``, raised by psycopg (the catalog and watermark connections) or the
    ADBC driver (the chunk connection), is one to retry."""
    if isinstance(error, psycopg.Error):
        if error.sqlstate is None and not isinstance(error, psycopg.OperationalError):
            return False  # a client-side error of ours (a closed cursor, a bad parameter)
        return pg_error_is_transient(error.sqlstate, str(error))
    if isinstance(error, pg_arrow.AdbcError):
        sqlstate = getattr(error, "sqlstate", None)
        if sqlstate is None and not isinstance(error, adbc_driver_manager.OperationalError):
            return False  # a client-side error of ours (a parameter it cannot bind)
        return pg_error_is_transient(sqlstate, str(error))
    return False

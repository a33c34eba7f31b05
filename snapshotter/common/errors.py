"""Errors a user can cause, said in one or two lines: what failed, where, and what to do.

The CLI turns any exception that reaches it into such a line (:func:`explain`); tracebacks
are for ``-v``. Writers of files (state, sink, staging) word their own disk errors with
:func:`disk_error`, since an ``OSError`` raised by a write names no path.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from snapshotter.common.redact import mask_url

# PostgreSQL SQLSTATEs: the connection (class 08), the login (28), an unknown database.
_PG_CONNECT = ("08", "28", "3D000", "57P03")
_PG_PRIVILEGE = "42501"
# MySQL/MariaDB error codes: cannot connect or log in; and privileges refused.
_MY_CONNECT = frozenset({1040, 1044, 1045, 1049, 1129, 1130, 1698, 2002, 2003, 2005, 2006, 2013})
_MY_PRIVILEGE = frozenset({1142, 1143, 1211, 1227, 1370, 1410})


@dataclass(frozen=True, slots=True)
class Explained:
    """What to print for an exception; ``expected``: a user's error, no traceback hint."""

    text: str
    expected: bool


def first_line(text: str) -> str:
    lines = [" ".join(line.split()) for line in str(text).strip().splitlines()]
    return next((line for line in lines if line), "")


def is_disk_full(exc: BaseException) -> bool:
    return (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)) or (
        "No space left on device" in str(exc) or "Disk quota exceeded" in str(exc)
    )


def disk_error(exc: OSError, path: str | Path, what: str, setting: str) -> str:
    """An ``OSError`` from writing ``what`` at ``path`` as one line, with the fix.
    ``setting`` is the config key that chooses the place (``[state] dir``...)."""
    if is_disk_full(exc):
        return (
            f"no space left on the device holding {what} {path}: free space there (or set "
            f"{setting} to another disk), then run `snapshotter resume`; what was saved "
            "before is intact"
        )
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (
            f"cannot write {what} {path}: {exc.strerror or exc}; give this user write access "
            f"there (or set {setting} elsewhere)"
        )
    reason = exc.strerror or first_line(str(exc)) or type(exc).__name__
    return f"cannot write {what} {path}: {reason}; check the place ({setting})"


def _db_error(exc: BaseException) -> tuple[BaseException, str | None] | None:
    """The driver's error behind ``exc`` and the statement it ran, if it is a DB error."""
    import psycopg
    import pymysql

    statement = None
    if isinstance(exc, sa.exc.StatementError):
        statement = exc.statement
        exc = exc.orig if exc.orig is not None else exc
    if isinstance(exc, psycopg.Error | pymysql.err.Error | sa.exc.DBAPIError):
        return exc, statement
    return None


def _codes(exc: BaseException) -> tuple[str | None, int | None]:
    """(PostgreSQL SQLSTATE, MySQL error code) of a driver error."""
    import psycopg

    if isinstance(exc, psycopg.Error):
        return exc.sqlstate, None
    args = getattr(exc, "args", ())
    if args and isinstance(args[0], int):
        return None, args[0]
    return None, None


def _driver_message(exc: BaseException) -> str:
    args: tuple[object, ...] = tuple(getattr(exc, "args", ()))
    if len(args) >= 2 and isinstance(args[0], int):  # pymysql: (code, message)
        return f"{first_line(str(args[1]))} (MySQL error {args[0]})"
    return first_line(str(exc)) or type(exc).__name__


def _what(statement: str | None) -> str:
    if not statement:
        return ""
    text = " ".join(statement.split())
    return f" (running: {text[:80]}{'...' if len(text) > 80 else ''})"


def is_privilege_error(exc: BaseException) -> bool:
    """Whether the source refused a statement for a privilege its user lacks."""
    found = _db_error(exc)
    if found is None:
        return False
    sqlstate, code = _codes(found[0])
    return sqlstate == _PG_PRIVILEGE or code in _MY_PRIVILEGE


def source_reason(exc: BaseException) -> str:
    """The server's message of a source error, one line."""
    found = _db_error(exc)
    return _driver_message(found[0]) if found else first_line(str(exc))


def explain_db(exc: BaseException, url: str | None) -> Explained | None:
    """A source error: cannot connect, refused a privilege, or another failure."""
    found = _db_error(exc)
    if found is None:
        return None
    driver, statement = found
    sqlstate, code = _codes(driver)
    where = f"the source at {mask_url(url)}" if url else "the source"
    reason = _driver_message(driver)
    connecting = (sqlstate is None and code is None and statement is None) or (
        (sqlstate or "").startswith(_PG_CONNECT) or code in _MY_CONNECT
    )
    if sqlstate == _PG_PRIVILEGE or code in _MY_PRIVILEGE:
        return Explained(
            f"{where} refused a privilege: {reason}{_what(statement)}; grant it to the "
            "configured user (docs/sources.md: Prerequisites) or use a user that has it",
            True,
        )
    if connecting:
        return Explained(
            f"cannot connect to {where}: {reason}; check source.url (host, port, user, "
            "password, database) and that the server is up",
            True,
        )
    return Explained(f"{where} failed: {reason}{_what(statement)}", True)


def explain(exc: BaseException, url: str | None = None) -> Explained:
    """One or two lines for any exception that reached the CLI."""
    db = explain_db(exc, url)
    if db is not None:
        return db
    if isinstance(exc, OSError) and not type(exc).__module__.startswith(("snapshotter", "signals")):
        path = exc.filename
        if path is not None and is_disk_full(exc):
            return Explained(disk_error(exc, path, "the file", "its place in the config"), True)
        if path is not None:
            return Explained(f"{exc.strerror or first_line(str(exc))}: {path}", True)
        if is_disk_full(exc):
            return Explained(
                "no space left on device: free space (state dir, sink path, staging, Spark's "
                "local dir), then run `snapshotter resume`",
                True,
            )
    spanner = _explain_google(exc)
    if spanner is not None:
        return spanner
    text = first_line(str(exc))
    if type(exc).__module__.startswith(("snapshotter", "signals")) and text:
        # Our own errors are written for users: what, where, what to do.
        return Explained(str(exc).strip(), True)
    return Explained(f"{type(exc).__name__}: {text or 'no message'}", False)


def _explain_google(exc: BaseException) -> Explained | None:
    """An error Spanner (Google's API) answered: what it said, and what to check."""
    if not type(exc).__module__.startswith("google.api_core"):
        return None
    name = type(exc).__name__
    said = first_line(str(getattr(exc, "message", None) or exc))
    hints = {
        "NotFound": "check source.url (project, instance, database) and the table names",
        "PermissionDenied": "give the credentials the roles docs/spanner.md lists",
        "Unauthenticated": "check the credentials (Application Default Credentials)",
        "ServiceUnavailable": "check emulator_host / SPANNER_EMULATOR_HOST or the network",
    }
    hint = hints.get(name)
    return Explained(f"Spanner {name}: {said}" + (f"; {hint}" if hint else ""), hint is not None)

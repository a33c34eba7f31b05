"""Which database errors mean "the server is away, try again" (the engine retries the chunk,
the snapshot goes on) and which are problems no retry fixes (the snapshot fails, or the log
reader stops at once). The messages are what real servers and drivers say."""

from __future__ import annotations

import psycopg
import pymysql
import pytest
import sqlalchemy as sa

from signals.names import TableId
from snapshotter.sources.base import ChunkReadError, TableError
from snapshotter.sources.mysql.dialect import MySqlDialect
from snapshotter.sources.postgres.dialect import PostgresDialect, pg_error_is_transient

REFUSED = (
    'connection failed: connection to server at "127.0.0.1", port 55999 failed: Connection '
    "refused\n\tIs the server running on that host and accepting TCP/IP connections?"
)
CLOSED = (
    "consuming input failed: server closed the connection unexpectedly\n\tThis probably "
    "means the server terminated abnormally\n\tbefore or while processing the request."
)


def _at(message: str) -> str:
    return f'connection failed: connection to server at "127.0.0.1", port 5432 failed: {message}'


@pytest.mark.parametrize(
    ("sqlstate", "message", "transient"),
    [
        (None, REFUSED, True),
        (None, CLOSED, True),
        (None, _at("FATAL:  the database system is starting up"), True),
        (None, _at("FATAL:  the database system is shutting down"), True),
        (None, _at("FATAL:  the database system is in recovery mode"), True),
        (None, _at("FATAL:  sorry, too many clients already"), True),
        (None, _at('FATAL:  password authentication failed for user "x"'), False),
        (None, _at('FATAL:  no pg_hba.conf entry for host "10.0.0.1", user "x"'), False),
        (None, _at('FATAL:  database "nodb" does not exist'), False),
        (None, _at('FATAL:  role "nobody" does not exist'), False),
        (None, _at("fe_sendauth: no password supplied"), False),
        ("57P01", "terminating connection due to administrator command", True),
        ("57P02", "terminating connection because of crash of another server process", True),
        ("57P03", "the database system is starting up", True),
        ("08006", "connection failure", True),
        ("53300", "too many connections for role", True),
        ("42704", 'replication slot "s" does not exist', False),
        ("42501", "permission denied for table t", False),
        ("42601", 'syntax error at or near "="', False),
        ("57014", "canceling statement due to statement timeout", False),
        ("55000", 'can no longer get changes from replication slot "s"', False),
    ],
)
def test_postgres_errors(sqlstate: str | None, message: str, transient: bool) -> None:
    assert pg_error_is_transient(sqlstate, message) is transient


@pytest.fixture
def pg() -> PostgresDialect:
    return PostgresDialect("postgresql://u:p@127.0.0.1:1/db", TableId("public", "s"), "p")


@pytest.fixture
def my() -> MySqlDialect:
    return MySqlDialect("mysql://u:p@127.0.0.1:1/db", TableId("db", "s"))


def _sa(cls: type[sa.exc.DBAPIError], orig: BaseException, **kw: bool) -> sa.exc.DBAPIError:
    return cls("SELECT 1", {}, orig, **kw)  # type: ignore[arg-type]


def test_postgres_dialect_looks_through_wrappers(pg: PostgresDialect) -> None:
    refused = psycopg.OperationalError(REFUSED)
    assert pg.is_transient(refused)
    assert pg.is_transient(_sa(sa.exc.OperationalError, refused))
    assert pg.is_transient(psycopg.errors.AdminShutdown("terminating connection"))
    assert pg.is_transient(ChunkReadError("chunk query on table t failed: ..."))
    lost = sa.exc.DBAPIError(
        "SELECT 1", {}, psycopg.DatabaseError("x"), connection_invalidated=True
    )
    assert pg.is_transient(lost)
    try:
        raise TableError("chunk query on table t failed") from refused
    except TableError as wrapped:
        assert pg.is_transient(wrapped)  # what it wraps decides
    assert not pg.is_transient(TableError("table t does not exist"))
    assert not pg.is_transient(psycopg.errors.UndefinedColumn('column "nope" does not exist'))
    assert not pg.is_transient(_sa(sa.exc.ProgrammingError, psycopg.errors.SyntaxError("x")))
    assert not pg.is_transient(
        psycopg.OperationalError(_at("FATAL:  password authentication failed"))
    )
    assert not pg.is_transient(psycopg.ProgrammingError("the query has 1 placeholder"))
    assert not pg.is_transient(ValueError("x"))


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (pymysql.err.OperationalError(2003, "Can't connect to MySQL server on '127.0.0.1'"), True),
        (pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query"), True),
        (pymysql.err.OperationalError(2006, "MySQL server has gone away"), True),
        (pymysql.err.OperationalError(1053, "Server shutdown in progress"), True),
        (pymysql.err.OperationalError(1927, "Connection was killed"), True),
        (pymysql.err.OperationalError(1040, "Too many connections"), True),
        (pymysql.err.InterfaceError(0, ""), True),
        (pymysql.err.OperationalError(1045, "Access denied for user 'u'@'localhost'"), False),
        (pymysql.err.OperationalError(1049, "Unknown database 'nodb'"), False),
        (pymysql.err.ProgrammingError(1064, "You have an error in your SQL syntax"), False),
        (pymysql.err.OperationalError(1054, "Unknown column 'nope' in 'where clause'"), False),
        (ChunkReadError("chunk query on table t failed: (2013) Lost connection"), True),
        (TableError("chunk query on table t failed: (1054) Unknown column"), False),
    ],
)
def test_mysql_errors(my: MySqlDialect, error: BaseException, transient: bool) -> None:
    assert my.is_transient(error) is transient
    if isinstance(error, pymysql.err.Error):
        assert my.is_transient(_sa(sa.exc.OperationalError, error)) is transient

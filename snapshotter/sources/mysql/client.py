"""The client library of MySQL's chunk connection: mysqlclient when installed, else pymysql.

mysqlclient (``MySQLdb``, a C extension over libmysqlclient / libmariadb) parses result rows
in C; pymysql parses them in Python. Measured on a 200k-row, 6-column table in 4096- and
10240-row chunks (``bench/read_bench.py chunk``, same SQL, same Arrow build): about 2.4x
less CPU time per chunk read with mysqlclient. It is an optional extra
(``pip install 'snapshotter[mysqlclient]'``: it compiles against the client library's
headers); without it, pymysql reads chunks as before.

Both return the same Python values for every column type of the value model
(``my_types``), once mysqlclient's converters are made to do what pymysql's do where they
differ (:func:`_conversions`): a DATE, DATETIME or TIMESTAMP with a zero part comes back as
its text (mysqlclient: None, which for a zero TIMESTAMP would lose the binlog's epoch, and
in a key column would pass for NULL), and MySQL 8's JSON as text (mysqlclient: bytes).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pymysql
import pymysql.cursors
import sqlalchemy as sa

try:  # the optional C client
    import MySQLdb
    import MySQLdb.connections
    import MySQLdb.converters
    import MySQLdb.cursors
    import MySQLdb.times
    from MySQLdb.constants import FIELD_TYPE
except ImportError:  # pragma: no cover - depends on the installation
    MySQLdb = None

PYMYSQL = "pymysql"
MYSQLCLIENT = "mysqlclient"

# COM_RESET_CONNECTION (MySQL 5.7+, MariaDB 10.2.4+; pymysql has no helper for it): the
# session as new (variables, user variables, GET_LOCK locks, temporary tables) without a new
# connection: about 0.1 ms where a reconnect takes 20 ms.
_COM_RESET_CONNECTION = 0x1F


def available() -> tuple[str, ...]:
    """The client libraries installed, the preferred first."""
    return (MYSQLCLIENT, PYMYSQL) if MySQLdb is not None else (PYMYSQL,)


def default() -> str:
    return available()[0]


def errors(name: str) -> tuple[type[BaseException], ...]:
    """What the library raises for a server or connection error."""
    if name == MYSQLCLIENT:
        assert MySQLdb is not None
        return (MySQLdb.Error,)
    return (pymysql.err.Error,)


def all_errors() -> tuple[type[BaseException], ...]:
    """What any installed library raises."""
    found: tuple[type[BaseException], ...] = (pymysql.err.Error,)
    if MySQLdb is not None:
        found += (MySQLdb.Error,)
    return found


def error_code(exc: BaseException) -> int | None:
    """The MySQL error number of a client library's error (both put it first in args)."""
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def closed_error(exc: BaseException) -> bool:
    """pymysql's InterfaceError (0, ''): the connection was closed under it."""
    return isinstance(exc, pymysql.err.InterfaceError) or (
        MySQLdb is not None and isinstance(exc, MySQLdb.InterfaceError)
    )


def connect(name: str, url: sa.URL, **extra: Any) -> Any:
    """A chunk connection with library ``name`` to ``url`` (a SQLAlchemy MySQL URL, any
    driver), autocommit, utf8mb4. The connection arguments come from SQLAlchemy's own
    dialect for that library (host, port, TLS options of the URL, ...)."""
    if name == MYSQLCLIENT:
        if MySQLdb is None:
            raise ImportError("mysqlclient is not installed (pip install mysqlclient)")
        kwargs = _connect_args(url, "mysql+mysqldb")
        kwargs.update(charset="utf8mb4", autocommit=True, conv=_conversions())
        # bytes parameters as _binary'...' (pymysql's way): a VARBINARY key bound as a plain
        # string would be read in the connection's character set.
        kwargs["binary_prefix"] = True
        kwargs.update(extra)
        return MySQLdb.connect(**kwargs)
    kwargs = _connect_args(url, "mysql+pymysql")
    kwargs.update(charset="utf8mb4", autocommit=True)
    kwargs.update(extra)
    return pymysql.connect(**kwargs)


def _connect_args(url: sa.URL, drivername: str) -> dict[str, Any]:
    driver_url = url.set(drivername=drivername)
    dialect = sa.create_engine(driver_url, module=_module(drivername)).dialect
    _, kwargs = dialect.create_connect_args(driver_url)
    return dict(kwargs)


def _module(drivername: str) -> Any:
    if drivername == "mysql+mysqldb":
        assert MySQLdb is not None
        return MySQLdb
    return pymysql


def name_of(conn: Any) -> str:
    return (
        MYSQLCLIENT
        if MySQLdb is not None and isinstance(conn, MySQLdb.connections.Connection)
        else PYMYSQL
    )


def dict_cursor(conn: Any) -> Any:
    """A cursor returning rows as dicts."""
    if name_of(conn) == MYSQLCLIENT:
        return conn.cursor(MySQLdb.cursors.DictCursor)
    return conn.cursor(pymysql.cursors.DictCursor)


def is_open(conn: Any) -> bool:
    return bool(conn.open)


def close_quietly(conn: Any) -> None:
    with contextlib.suppress(*all_errors()):
        conn.close()


def reset_session(conn: Any, url: sa.URL) -> bool:
    """The session as new, keeping the connection: pymysql sends COM_RESET_CONNECTION;
    mysqlclient, which does not wrap it, COM_CHANGE_USER as the same user (the same reset:
    session and user variables, GET_LOCK locks, temporary tables, and one authentication
    round trip). False when it cannot (a new connection is needed)."""
    if name_of(conn) == MYSQLCLIENT:
        kwargs = _connect_args(url, "mysql+mysqldb")  # SQLAlchemy's names: passwd, db
        conn.change_user(kwargs.get("user", ""), kwargs.get("passwd", ""), kwargs.get("db", ""))
        return True
    execute_command = getattr(conn, "_execute_command", None)
    read_ok = getattr(conn, "_read_ok_packet", None)
    if execute_command is None or read_ok is None:
        return False
    execute_command(_COM_RESET_CONNECTION, b"")
    read_ok()
    return True


def _keep_text(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """A mysqlclient date converter that returns the text it cannot parse (pymysql's way)."""

    def convert(text: str) -> Any:
        value = parse(text)
        return text if value is None else value

    return convert


def _json_text(data: bytes | str) -> str:
    return data.decode("utf-8") if isinstance(data, bytes) else data


def _conversions() -> dict[Any, Any]:
    assert MySQLdb is not None
    conv = dict(MySQLdb.converters.conversions)
    for field in (FIELD_TYPE.DATETIME, FIELD_TYPE.TIMESTAMP):
        conv[field] = _keep_text(MySQLdb.times.DateTime_or_None)
    conv[FIELD_TYPE.DATE] = _keep_text(MySQLdb.times.Date_or_None)
    conv[FIELD_TYPE.JSON] = _json_text
    return conv

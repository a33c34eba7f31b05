"""The MySQL / MariaDB dialect: the catalog (``tables``), the chunk connection's reads
(``reads``), and the watermarks and log position, composed into one
:class:`snapshotter.sources.base.Dialect`.

Two kinds of connection:

* a SQLAlchemy engine (``mysql+pymysql``) for the catalog and watermark inserts;
* one connection for the max-key and chunk SELECTs (``reads``), each in its own ``START
  TRANSACTION READ ONLY``.

Identifiers are quoted by SQLAlchemy; key values are bound parameters (``chunk_sql``).

Chunk SELECTs see every transaction binlogged before the open watermark: with
``binlog_order_commits`` (``snapshotter init`` checks it) InnoDB commits in binlog order, so
no visibility bookkeeping is needed (``commits_visible_in_log_order``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from signals.names import TableId
from snapshotter.sources.base import Dialect, TableError
from snapshotter.sources.mysql import client as my_client
from snapshotter.sources.mysql.chunk_sql import key_bound, timed_select
from snapshotter.sources.mysql.positions import binlog_end, binlog_offset
from snapshotter.sources.mysql.reads import MySqlReads
from snapshotter.sources.mysql.tables import ColumnType, MySqlTables
from snapshotter.sources.query_guard import DEFAULT_TIMEOUT_S

__all__ = ["ColumnType", "MySqlDialect", "key_bound", "mysql_url", "timed_select"]


def mysql_url(url: str | sa.URL) -> sa.URL:
    """``mysql://`` / ``mariadb://`` URLs with the pymysql driver snapshotter uses."""
    parsed = sa.make_url(url)
    return parsed.set(drivername="mysql+pymysql")


class MySqlDialect(MySqlTables, MySqlReads):
    """:class:`snapshotter.sources.base.Dialect` for MySQL 8 and MariaDB 10.5+."""

    connector = "mysql"
    dollar_quotes = False
    commits_visible_in_log_order = True

    def __init__(
        self,
        url: str | sa.URL,
        signal_table: TableId,
        chunk_timeout_s: float = DEFAULT_TIMEOUT_S,
        client: str | None = None,
    ) -> None:
        super().__init__(chunk_timeout_s)
        self.url = mysql_url(url)
        # The chunk connection's client library (my_client): the fastest installed unless
        # named.
        if client is not None and client not in my_client.available():
            raise ValueError(f"MySQL client library {client!r} is not installed")
        self.client = client or my_client.default()
        database = self.url.database
        if not database:
            raise TableError(f"the source URL {self.url!r} names no database")
        self._default_schema = database
        self.signal_table = signal_table.with_default_schema(database)
        self._types = {}

    @property
    def database(self) -> str:
        return self._default_schema

    @database.setter
    def database(self, value: str) -> None:
        self._default_schema = value

    # --- connections ---------------------------------------------------------------------

    @property
    def engine(self) -> sa.Engine:
        if self._engine is None:
            self._engine = sa.create_engine(
                self.url,
                pool_pre_ping=True,
                pool_size=2,
                connect_args={"charset": "utf8mb4"},
            )
        return self._engine

    def connect_args(self) -> dict[str, Any]:
        """pymysql.connect() arguments for this URL (host, port, user, password, ...)."""
        _, kwargs = self.engine.dialect.create_connect_args(self.url)
        kwargs = dict(kwargs)
        kwargs["charset"] = "utf8mb4"
        return kwargs

    # --- writes and the log ----------------------------------------------------------------

    def ensure_captured(self, tables: Sequence[TableId]) -> list[TableId]:
        """The binlog carries every table: nothing to add (the log reader decodes the tables
        ``source.tables`` selects, new ones included)."""
        return []

    def binlog_start(self) -> dict[str, Any]:
        """Where a reader that starts now begins: the binlog's current end."""
        return binlog_end(self.engine)

    def log_end(self) -> int:
        start = self.binlog_start()
        return binlog_offset(start["file"], start["pos"])

    def lag_bytes(self, resume: Mapping[str, Any]) -> int | None:
        """Binlog bytes after the restart point; None when it is in another file (file
        sizes in between are not known) or there is none."""
        if not resume.get("file"):
            return None
        start = binlog_offset(str(resume["file"]), int(resume.get("pos", 0)))
        end = self.log_end()
        return end - start if end >> 32 == start >> 32 else None


def _is_a_dialect(dialect: MySqlDialect) -> Dialect:
    """Never called: makes mypy check that MySqlDialect implements the protocol."""
    return dialect

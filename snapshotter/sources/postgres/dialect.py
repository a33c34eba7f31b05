"""The PostgreSQL dialect: the catalog (``tables``), the chunk connection's reads
(``reads``), and the watermarks, capture and log position, composed into one
:class:`snapshotter.sources.base.Dialect`.

Two kinds of connection:

* a SQLAlchemy engine for the catalog, watermark inserts and publication changes;
* one ADBC connection (``pg_arrow``) for the max-key and chunk SELECTs (``reads``).

SQL is built with SQLAlchemy Core (every identifier quoted by the library) and compiled with
``$n`` parameters; key values are bound parameters, each cast to its column's type so the
planner compares in that type and range-scans the key's index (``chunk_sql``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from signals.names import TableId
from snapshotter.core.visibility import OpenAtStart
from snapshotter.sources.base import Dialect
from snapshotter.sources.postgres import commits as pg_commits
from snapshotter.sources.postgres import open_xacts as pg_open_xacts
from snapshotter.sources.postgres import publications as pg_publications
from snapshotter.sources.postgres import setup as pg_setup
from snapshotter.sources.postgres.reads import PgReads
from snapshotter.sources.postgres.tables import DEFAULT_SCHEMA, PgTables
from snapshotter.sources.postgres.transient import pg_error_is_transient
from snapshotter.sources.query_guard import DEFAULT_TIMEOUT_S

__all__ = ["DEFAULT_SCHEMA", "PostgresDialect", "pg_error_is_transient"]


class PostgresDialect(PgTables, PgReads):
    """:class:`snapshotter.sources.base.Dialect` for PostgreSQL (13+)."""

    connector = "postgresql"
    dollar_quotes = True
    commits_visible_in_log_order = False

    def __init__(
        self,
        url: str | sa.URL,
        signal_table: TableId,
        publication: str,
        chunk_timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        super().__init__(chunk_timeout_s)
        self.url = pg_setup.psycopg_url(url)
        self.signal_table = signal_table.with_default_schema(DEFAULT_SCHEMA)
        self.publication = publication
        self._database: str | None = None

    # --- connections ---------------------------------------------------------------------

    @property
    def engine(self) -> sa.Engine:
        if self._engine is None:
            self._engine = sa.create_engine(self.url, pool_pre_ping=True, pool_size=2)
        return self._engine

    @property
    def database(self) -> str:
        if self._database is None:
            with self.engine.connect() as conn:
                self._database = str(conn.execute(sa.text("SELECT current_database()")).scalar())
        return self._database

    @database.setter
    def database(self, value: str) -> None:
        self._database = value

    def unfinished_xids(self) -> OpenAtStart:
        return pg_open_xacts.open_at_start(self.engine)

    # --- capture and the log ------------------------------------------------------------

    def ensure_captured(self, tables: Sequence[TableId]) -> list[TableId]:
        wanted = [t.with_default_schema(DEFAULT_SCHEMA) for t in tables]
        with self.engine.begin() as conn:
            missing = pg_publications.missing_from_publication(conn, self.publication, wanted)
            pg_publications.add_tables(conn, self.publication, missing)
        return missing

    def _watermark_transaction(self, conn: sa.Connection) -> None:
        """A watermark row is committed with a local WAL flush whatever
        ``synchronous_commit`` says (``pg_commits``: an async watermark would wait for the
        WAL writer to come back)."""
        pg_commits.flush_at_commit(conn)

    def log_end(self) -> int:
        """A WAL position past every transaction committed before the call, already
        decodable (``pg_commits.committed_end``; not the flushed position, which async
        commits can be past)."""
        return pg_commits.committed_end(self.engine)

    def lag_bytes(self, resume: Mapping[str, Any]) -> int | None:
        """WAL bytes after the restart point (the slot's confirmed LSN)."""
        lsn = resume.get("lsn")
        return max(0, pg_commits.wal_end(self.engine) - (lsn if isinstance(lsn, int) else 0))


def _is_a_dialect(dialect: PostgresDialect) -> Dialect:
    """Never called: makes mypy check that PostgresDialect implements the protocol."""
    return dialect

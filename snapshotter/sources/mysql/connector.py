"""MySQL's and MariaDB's connector (``sources.connector.Connector``): the dialect, the binlog
reader (captured tables only), ``init``'s checks and the binlog position it records, and the
binlog as the stream position (``positions``). The binlog needs no capture objects: there is
no slot or publication to create or drop."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from signals.names import TableId
from snapshotter.config import MySqlSource
from snapshotter.sources.base import Dialect
from snapshotter.sources.connector import Capture, Connector, SetupCheck
from snapshotter.sources.log import KeyColumns, LogReader, OpenReader
from snapshotter.sources.mysql import coverage, positions
from snapshotter.sources.mysql import setup as my_setup
from snapshotter.sources.mysql.dialect import MySqlDialect, mysql_url
from snapshotter.sources.positions import NewStart
from snapshotter.sources.setup_common import captured_by, resolve_tables
from snapshotter.sources.sql_connector import SqlConnector

log = logging.getLogger(__name__)


class MySqlConnector(SqlConnector):
    kind = "mysql"
    log_name = "binlog"
    dollar_quotes = MySqlDialect.dollar_quotes

    def __init__(self, source: MySqlSource) -> None:
        self.source = source

    # --- connections and the engine's parts ---------------------------------------------

    def sqlalchemy_url(self) -> sa.URL:
        return mysql_url(self.source.url)

    def connect_args(self) -> dict[str, Any]:
        return {"charset": "utf8mb4"}

    def open_dialect(self) -> MySqlDialect:
        source = self.source
        return MySqlDialect(
            source.url,
            signal_table=source.signal_table_id,
            chunk_timeout_s=source.chunk_timeout_s,
        )

    def server_id(self) -> int:
        """The configured replication client id, or a random one in 5400..6399 (Debezium's
        habit) when unset."""
        chosen = self.source.server_id
        ids = my_setup.RANDOM_CLIENT_IDS
        return chosen if chosen is not None else random.randrange(ids.start, ids.stop)

    def reader_opener(self, dialect: Dialect) -> OpenReader:
        from snapshotter.sources.mysql.decoder import BinlogDecoder
        from snapshotter.sources.mysql.reader import BinlogLogReader

        # The reader reads the binlog's end and the catalog through the dialect this
        # connector opened.
        assert isinstance(dialect, MySqlDialect)
        source = self.source
        captured = captured_by(source.tables, source.default_schema, source.signal_table_id)

        def open_reader(resume: Mapping[str, Any], key_columns: KeyColumns) -> LogReader:
            start = dict(resume)
            if not start.get("file"):
                start = dict(dialect.binlog_start())
                log.warning(
                    "no saved binlog position (snapshotter init records one): streaming from "
                    "the current end of the binlog, %s at %s",
                    start["file"],
                    start["pos"],
                )
            decoder = BinlogDecoder(
                source.topic_prefix,
                captured=captured,
                key_columns=key_columns,
                column_types=dialect.catalog_types,
            )
            return BinlogLogReader(
                dialect.connect_args(),
                server_id=self.server_id(),
                decoder=decoder,
                start=start,
            )

        return open_reader

    # --- snapshotter init -----------------------------------------------------------------

    def signal_table_grant(self, user: str) -> str:
        schema = self.source.signal_table_id.schema
        return f"GRANT CREATE, INSERT, SELECT ON `{schema}`.* TO '{user}'@'%'"

    def check_setup(self, engine: sa.Engine) -> SetupCheck:
        """The binlog settings and privileges (``setup.check_prerequisites``)."""
        source = self.source
        signal_table = source.signal_table_id
        dialect = MySqlDialect(engine.url, signal_table=signal_table)
        try:
            tables = [
                t
                for t in resolve_tables(dialect, source.tables, source.default_schema)
                if t != signal_table
            ]
        finally:
            dialect.close()
        problems = my_setup.check_prerequisites(engine, client_server_id=source.server_id)
        return SetupCheck(tables, problems)

    def create_capture(self, engine: sa.Engine, tables: Sequence[TableId]) -> Capture:
        """Nothing to create; a warning for each table without a primary key, and the
        binlog's current end for the state (so signals sent between ``init`` and ``run`` are
        not missed)."""
        dialect = MySqlDialect(engine.url, signal_table=self.source.signal_table_id)
        try:
            warnings = [
                f'{table} has no primary key: snapshot it with a "surrogate-key" (a NOT '
                "NULL column with a unique index)"
                for table in tables
                if not dialect.describe(table).primary_key
            ]
        finally:
            dialect.close()
        return Capture(warnings=warnings, start=positions.binlog_end(engine))

    # --- the saved stream position --------------------------------------------------------

    def has_saved_position(self, resume: Mapping[str, Any]) -> bool:
        return positions.has_saved_position(resume)

    def position_problem(self, engine: sa.Engine, resume: Mapping[str, Any]) -> str | None:
        return positions.problem_now(engine, resume)

    def position_backlog(
        self, engine: sa.Engine, dialect: Dialect, resume: Mapping[str, Any]
    ) -> int | None:
        return positions.backlog_now(engine, resume)

    def position_warnings(
        self,
        engine: sa.Engine,
        saved: Callable[[], Mapping[str, Any]],
        threshold_mb: int,
        config: str,
    ) -> list[str]:
        # The state before the binlog files: a file the saved position names exists by the
        # time it is saved, so it is in a list read after (read before, a rotation could
        # leave it out: a false "purged").
        resume = saved()
        with engine.connect() as conn:
            logs = my_setup.binary_logs(conn)
            retention = my_setup.binlog_retention(conn)
        return positions.binlog_warnings(resume, logs, retention, threshold_mb, config)

    def move_to_log_end(self, engine: sa.Engine, dialect: Dialect) -> NewStart:
        return positions.move_to_log_end(engine)

    # --- snapshotter teardown -------------------------------------------------------------

    def capture_objects(self) -> list[str]:
        return []

    def refuse_drop(self, engine: sa.Engine) -> None:
        return None

    def log_coverage_problems(self, handle: sa.Engine, tables: Sequence[TableId]) -> list[str]:
        """The binlog's database filters (``coverage``): the binlog carries every database
        unless the server's binlog-do-db / binlog-ignore-db leave one out."""
        return coverage.coverage_problems(handle, self.source.signal_table_id, tables)

    def drop_capture(self, engine: sa.Engine) -> list[str]:
        return []


def _is_a_connector(connector: MySqlConnector) -> Connector:
    """Never called: makes mypy check that MySqlConnector implements the protocol."""
    return connector

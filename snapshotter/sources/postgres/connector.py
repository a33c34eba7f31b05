"""PostgreSQL's connector (``sources.connector.Connector``): the dialect, the pgoutput reader
on the configured slot and publication, ``init``'s checks and objects (publication, then
slot), and the slot as the stream position (``positions``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from signals.names import TableId
from snapshotter.config import PostgresSource
from snapshotter.sources.base import Dialect
from snapshotter.sources.connector import (
    Capture,
    Connector,
    PublishedLog,
    SetupCheck,
)
from snapshotter.sources.log import KeyColumns, LogReader, OpenReader
from snapshotter.sources.positions import NewStart
from snapshotter.sources.postgres import catalog as pg_catalog
from snapshotter.sources.postgres import positions, publications
from snapshotter.sources.postgres import setup as pg_setup
from snapshotter.sources.postgres.dialect import PostgresDialect
from snapshotter.sources.setup_common import SetupError, resolve_tables
from snapshotter.sources.sql_connector import SqlConnector


class PostgresConnector(SqlConnector):
    kind = "postgres"
    log_name = "replication slot"
    dollar_quotes = PostgresDialect.dollar_quotes

    def __init__(self, source: PostgresSource) -> None:
        self.source = source

    # --- connections and the engine's parts ---------------------------------------------

    def sqlalchemy_url(self) -> sa.URL:
        return pg_setup.psycopg_url(self.source.url)

    def connect_args(self) -> dict[str, Any]:
        return {}

    def libpq_url(self) -> str:
        """The source URL as libpq (the replication connection) takes it."""
        url = sa.make_url(self.source.url).set(drivername="postgresql")
        return url.render_as_string(hide_password=False)

    def open_dialect(self) -> PostgresDialect:
        source = self.source
        return PostgresDialect(
            self.sqlalchemy_url(),
            signal_table=source.signal_table_id,
            publication=source.publication,
            chunk_timeout_s=source.chunk_timeout_s,
        )

    def reader_opener(self, dialect: Dialect) -> OpenReader:
        from snapshotter.sources.postgres.decoder import PgOutputDecoder
        from snapshotter.sources.postgres.reader import PgLogReader

        source = self.source

        def open_reader(resume: Mapping[str, Any], key_columns: KeyColumns) -> LogReader:
            decoder = PgOutputDecoder(
                name=source.topic_prefix, database=dialect.database, key_columns=key_columns
            )
            return PgLogReader(
                self.libpq_url(),
                slot=source.slot,
                publication=source.publication,
                decoder=decoder,
                start_lsn=int(resume.get("lsn", 0)),
            )

        return open_reader

    # --- snapshotter init -----------------------------------------------------------------

    def signal_table_grant(self, user: str) -> str:
        return f'GRANT CREATE ON SCHEMA "{self.source.signal_table_id.schema}" TO "{user}"'

    def check_setup(self, engine: sa.Engine) -> SetupCheck:
        source = self.source
        signal_table = source.signal_table_id
        dialect = PostgresDialect(
            engine.url, signal_table=signal_table, publication=source.publication
        )
        try:
            tables = [
                t
                for t in resolve_tables(dialect, source.tables, source.default_schema)
                if t != signal_table  # only inserts of it matter: no replica identity needed
            ]
        finally:
            dialect.close()
        return SetupCheck(
            tables,
            pg_setup.check_prerequisites(
                engine, tables, source.slot, source.publication, source.failover_slot
            ),
        )

    def create_capture(self, engine: sa.Engine, tables: Sequence[TableId]) -> Capture:
        """The publication (with the signal table), then the slot: the slot last, as it
        starts keeping WAL the moment it exists, and must see the publication."""
        source = self.source
        published = [*tables, source.signal_table_id]
        change = publications.ensure_publication(engine, source.publication, published)
        slot = pg_setup.ensure_slot(engine, source.slot, source.failover_slot)
        return Capture(
            done=[str(change), f"replication slot {source.slot}: {slot}"],
            created=[("publication", source.publication)] if change.created else [],
        )

    # --- the saved stream position --------------------------------------------------------

    def has_saved_position(self, resume: Mapping[str, Any]) -> bool:
        return positions.has_saved_position(resume)

    def position_problem(self, engine: sa.Engine, resume: Mapping[str, Any]) -> str | None:
        return positions.problem_now(engine, self.source.slot, resume)

    def position_backlog(
        self, engine: sa.Engine, dialect: Dialect, resume: Mapping[str, Any]
    ) -> int | None:
        return dialect.lag_bytes(resume)

    def position_warnings(
        self,
        engine: sa.Engine,
        saved: Callable[[], Mapping[str, Any]],
        threshold_mb: int,
        config: str,
    ) -> list[str]:
        slot = self.source.slot
        facts = positions.slot_facts(engine, slot)
        # The state after the slot: a running engine confirms a position to the slot only
        # once state has saved it, so a state read after the slot is never behind it (read
        # before, the slot could have moved past it meanwhile: a false "created again").
        return positions.slot_warnings(slot, facts, saved(), threshold_mb, config)

    def move_to_log_end(self, engine: sa.Engine, dialect: Dialect) -> NewStart:
        return positions.move_to_log_end(
            engine, self.source.slot, self.source.publication, self.source.failover_slot
        )

    # --- snapshotter teardown -------------------------------------------------------------

    def capture_objects(self) -> list[str]:
        return [f"replication slot {self.source.slot}", f"publication {self.source.publication}"]

    def refuse_drop(self, engine: sa.Engine) -> None:
        positions.refuse_active_slot(engine, self.source.slot)

    def log_coverage_problems(self, handle: sa.Engine, tables: Sequence[TableId]) -> list[str]:
        """What the publication lacks (``publications.coverage_gaps``): the signal table,
        captured tables, published operations, whole rows."""
        signal_table = self.source.signal_table_id
        return self._gaps(handle, tables).lines(signal_table)

    def _gaps(self, engine: sa.Engine, tables: Sequence[TableId]) -> publications.Gaps:
        source = self.source
        with engine.connect() as conn:
            return publications.coverage_gaps(
                conn, source.publication, source.signal_table_id, tables
            )

    def repair_log_coverage(self, handle: sa.Engine, tables: Sequence[TableId]) -> list[str]:
        source = self.source
        with handle.begin() as conn:
            gaps = publications.coverage_gaps(
                conn, source.publication, source.signal_table_id, tables
            )
            lines = gaps.lines(source.signal_table_id)
            if not lines or not gaps.exists:
                # Without the publication the log reader cannot start at all, and says so
                # itself (after what the role lacks, REPLICATION first): nothing to repair.
                return []
            if not gaps.repairable:
                if gaps.exists and not gaps.owned and gaps.missing:
                    lines.append(
                        f"(the publication {source.publication} is another role's: snapshotter "
                        "changes only a publication its role owns)"
                    )
                raise SetupError("; ".join(lines))
            statement = publications.repair(conn, gaps)
        return [statement] if statement else []

    def other_publications(self, handle: sa.Engine, table: TableId) -> list[str]:
        with handle.connect() as conn:
            found = publications.publications_with(conn, table)
        return [p for p in found if p != self.source.publication]

    def drop_capture(self, engine: sa.Engine) -> list[str]:
        return positions.drop_capture(engine, self.source.slot, self.source.publication)

    def drop_capture_keeping(self, handle: sa.Engine, keep_publication: bool) -> list[str]:
        source = self.source
        if not keep_publication:
            return self.drop_capture(handle)
        lines = positions.drop_capture(handle, source.slot, None)
        with handle.connect() as conn:
            there = publications.publication_exists(conn, source.publication)
        if there:
            lines.append(
                f"publication {source.publication}: kept: `snapshotter init` did not create it "
                "(it was there before); if nothing else uses it, drop it yourself: DROP "
                f"PUBLICATION {pg_catalog.quote_name(source.publication)};"
            )
        else:
            lines.append(f"publication {source.publication}: already gone")
        return lines


def _is_a_connector(connector: PostgresConnector) -> Connector:
    """Never called: makes mypy check that PostgresConnector implements the protocol."""
    return connector


def _publishes_its_log(connector: PostgresConnector) -> PublishedLog:
    """Never called: makes mypy check that PostgresConnector implements PublishedLog."""
    return connector

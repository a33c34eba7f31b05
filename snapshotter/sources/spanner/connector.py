"""Cloud Spanner's connector (``sources.connector.Connector``): the dialect, the change-stream
reader, ``init``'s checks (the signal table is created, the change stream only checked),
and the change stream's retention as the limit of a saved position.

The source handle ``connect`` gives is a :class:`SpannerDialect` (the client library's
database behind it): Spanner has no SQLAlchemy engine here.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from google.api_core import exceptions as gexc

from signals.model import Signal, Watermark
from signals.names import TableId
from snapshotter.config import SpannerSource
from snapshotter.core.position import Position
from snapshotter.sources.base import Dialect
from snapshotter.sources.connector import Capture, ConnectError, Connector, SetupCheck
from snapshotter.sources.log import KeyColumns, LogReader, LogReaderError, OpenReader
from snapshotter.sources.positions import NewStart, to_go_on
from snapshotter.sources.setup_common import captured_by, resolve_tables
from snapshotter.sources.spanner import client as sp_client
from snapshotter.sources.spanner import setup as sp_setup
from snapshotter.sources.spanner.dialect import SpannerDialect
from snapshotter.sources.spanner.positions import iso as _iso
from snapshotter.sources.spanner.positions import restart_us as _restart_us
from snapshotter.sources.spanner.positions import retention_s
from snapshotter.sources.spanner.reader import resume_start, unreadable_from

log = logging.getLogger(__name__)


class SpannerConnector:
    kind = "spanner"
    log_name = "change stream"
    # Checked as a PostgreSQL-dialect database reads it (the stricter of the two readings).
    dollar_quotes = True
    errors: tuple[type[Exception], ...] = (gexc.GoogleAPIError,)

    def __init__(self, source: SpannerSource) -> None:
        self.source = source
        self.target = sp_client.target_of(source)

    @property
    def change_stream(self) -> str:
        stream = self.source.change_stream
        assert stream is not None  # the config requires it for kind "spanner"
        return str(stream)

    # --- connections and the engine's parts ---------------------------------------------

    def connect(self, timeout_s: float | None = None) -> SpannerDialect:
        dialect = self.open_dialect()
        try:
            dialect.kind  # noqa: B018 - reads the database: it exists and answers
        except gexc.NotFound:
            dialect.close()
            raise ConnectError(
                f"Spanner database {self.target} does not exist; create it, or fix source.url"
            ) from None
        except gexc.GoogleAPIError as exc:
            dialect.close()
            raise ConnectError(
                f"cannot reach Spanner database {self.target}: {sp_client.reason(exc)}; check "
                "source.url, emulator_host / SPANNER_EMULATOR_HOST and the credentials"
            ) from None
        return dialect

    def dispose(self, handle: Any) -> None:
        handle.close()

    def open_dialect(self) -> SpannerDialect:
        source = self.source
        return SpannerDialect(
            self.target,
            signal_table=source.signal_table_id,
            chunk_timeout_s=source.chunk_timeout_s,
            change_stream=self.change_stream,
        )

    def reader_opener(self, dialect: Dialect) -> OpenReader:
        from snapshotter.sources.spanner.decoder import SpannerDecoder
        from snapshotter.sources.spanner.reader import SpannerLogReader

        assert isinstance(dialect, SpannerDialect)
        source = self.source
        stream = self.change_stream
        captured = captured_by(source.tables, source.default_schema, source.signal_table_id)

        def open_reader(resume: Mapping[str, Any], key_columns: KeyColumns) -> LogReader:
            start = dict(resume)
            if start.get("change_stream") not in (None, stream):
                raise LogReaderError(
                    f"the state streams change stream {start['change_stream']}, the config "
                    f"names {stream}: {to_go_on('CONF')}"
                )
            if _restart_us(start) is None:
                start = resume_start(dialect.server_time_us(), stream)
                log.warning(
                    "no saved change-stream position (snapshotter init records one): streaming "
                    "change stream %s from now, %s",
                    stream,
                    _iso(start["start_us"]),
                )
            decoder = SpannerDecoder(
                source.topic_prefix,
                dialect.database,
                captured=captured,
                key_columns=key_columns,
                columns_of=dialect.columns_of,
                clock_ms=lambda: int(dt.datetime.now(dt.UTC).timestamp() * 1000),
            )
            return SpannerLogReader(
                database=sp_client.open_database(self.target),
                dialect=dialect.kind,
                change_stream=stream,
                heartbeat_ms=source.heartbeat_ms,
                decoder=decoder,
                resume=start,
            )

        return open_reader

    # --- the signal table -----------------------------------------------------------------

    def create_signal_table(self, handle: Any) -> bool:
        return bool(handle.create_signal_table())

    def insert_signal(self, handle: Any, signal: Signal | Watermark) -> str:
        return str(handle.insert_signal(signal))

    def signal_rows(self, handle: Any) -> list[tuple[Any, Any, Any]]:
        rows: list[tuple[Any, Any, Any]] = handle.signal_rows()
        return rows

    def drop_signal_table(self, handle: Any) -> bool:
        return bool(handle.drop_signal_table())

    def handle_user(self, handle: Any) -> str:
        return "the credentials snapshotter runs with"

    # --- snapshotter init -----------------------------------------------------------------

    def signal_table_grant(self, user: str) -> str:
        return (
            f"give {user} a role that may change the schema (roles/spanner.databaseAdmin), "
            "or have an administrator run the DDL"
        )

    def check_setup(self, handle: Any) -> SetupCheck:
        source = self.source
        signal_table = source.signal_table_id
        tables = [
            t
            for t in resolve_tables(handle, source.tables, source.default_schema)
            if t != signal_table
        ]
        facts = handle.stream_facts(self.change_stream)
        problems = sp_setup.stream_problems(
            handle.kind, self.change_stream, facts, tables, signal_table
        )
        return SetupCheck(tables, problems)

    def create_capture(self, handle: Any, tables: Sequence[TableId]) -> Capture:
        facts = handle.stream_facts(self.change_stream)
        capture = facts.capture_type
        done = [
            f"change stream {self.change_stream}: watches "
            + ("every table" if facts.all_tables else ", ".join(map(str, sorted(facts.tables))))
            + f", value_capture_type {capture} (keeps changes "
            f"{retention_s(facts.options) // 3600} h)"
        ]
        return Capture(done=done, start=resume_start(handle.server_time_us(), self.change_stream))

    # --- the saved stream position --------------------------------------------------------

    def has_saved_position(self, resume: Mapping[str, Any]) -> bool:
        return _restart_us(resume) is not None

    def position_problem(self, handle: Any, resume: Mapping[str, Any]) -> str | None:
        stream = resume.get("change_stream") or self.change_stream
        facts = handle.stream_facts(stream)
        if not facts.exists:
            return f"change stream {stream} no longer exists"
        restart = _restart_us(resume)
        if restart is None:
            return None
        keep_s = retention_s(facts.options)
        age_s = (handle.server_time_us() - restart) / 1e6
        if age_s > keep_s:
            return (
                f"change stream {stream} keeps changes for {keep_s // 3600} h; the saved "
                f"position is {age_s / 3600:.1f} h old"
            )
        # A stream dropped and created again under the same name exists and keeps changes
        # as long, but only from its creation: ask it for the saved start (partitions
        # restart one microsecond before it).
        start = restart - 1 if resume.get("partitions") else restart
        said = unreadable_from(handle.db, handle.kind, stream, start)
        if said is not None:
            return (
                f"change stream {stream} cannot be read from the saved position (Spanner: "
                f"{said}); it was dropped and created again since, or its retention passed"
            )
        return None

    def position_backlog(
        self, handle: Any, dialect: Dialect, resume: Mapping[str, Any]
    ) -> int | None:
        return None

    def position_warnings(
        self,
        handle: Any,
        saved: Callable[[], Mapping[str, Any]],
        threshold_mb: int,
        config: str,
    ) -> list[str]:
        # The state first: its restart point only moves on, so the age measured after it
        # can only be overstated by the moment between the two reads.
        resume = saved()
        # (What the stream no longer watches is status's coverage warning: app.log_coverage.)
        warnings: list[str] = []
        problem = self.position_problem(handle, resume)
        if problem is not None:
            return [f"{problem}: {to_go_on(config)}"]
        restart = _restart_us(resume)
        if restart is None:
            return warnings
        facts = handle.stream_facts(resume.get("change_stream") or self.change_stream)
        keep_s = retention_s(facts.options)
        age_s = (handle.server_time_us() - restart) / 1e6
        if age_s > keep_s / 2:
            warnings.append(
                f"the saved position in change stream {self.change_stream} is "
                f"{age_s / 3600:.1f} h old, and the stream keeps {keep_s // 3600} h: run the "
                "engine before it is gone"
            )
        return warnings

    def move_to_log_end(self, handle: Any, dialect: Dialect) -> NewStart:
        now = handle.server_time_us()
        return NewStart(
            resume=resume_start(now, self.change_stream),
            position=Position(now),
            done=[f"change stream {self.change_stream}: streaming from {_iso(now)}"],
        )

    # --- snapshotter teardown -------------------------------------------------------------

    def capture_objects(self) -> list[str]:
        return []  # the change stream is the database owner's; teardown leaves it

    def refuse_drop(self, handle: Any) -> None:
        """Spanner refuses to drop a table a change stream names: say what to run first."""
        from snapshotter.sources.setup_common import SetupError

        stream = self.change_stream
        facts = handle.stream_facts(stream)
        signal_table = self.source.signal_table_id
        if facts.exists and signal_table in facts.tables:
            others = sorted(t for t in facts.tables if t != signal_table)
            alter = (
                sp_setup.stream_ddl(handle.kind, stream, others, alter=True)
                if others
                else f"DROP CHANGE STREAM {stream}"
            )
            raise SetupError(
                f"change stream {stream} watches the signal table {signal_table}, and Spanner "
                f"drops no table a change stream names: run `{alter}` (or DROP CHANGE STREAM "
                f"{stream}), then teardown again"
            )

    def log_coverage_problems(self, handle: Any, tables: Sequence[TableId]) -> list[str]:
        """The change stream must exist and watch the signal table and ``tables``, whole
        (``Connector.log_coverage_problems``); one line each with the DDL that fixes it."""
        stream = self.change_stream
        return sp_setup.coverage_problems(
            handle.kind, stream, handle.stream_facts(stream), tables, self.source.signal_table_id
        )

    def drop_capture(self, handle: Any) -> list[str]:
        return [f"change stream {self.change_stream}: kept (not created by init)"]


def _is_a_connector(connector: SpannerConnector) -> Connector:
    """Never called: makes mypy check that SpannerConnector implements the protocol."""
    return connector

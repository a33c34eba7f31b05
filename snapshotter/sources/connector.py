"""One connector per source (PostgreSQL, MySQL / MariaDB): what differs per database outside
the chunk SQL, behind one small interface, so the CLI, the runner and the position checks
ask the connector instead of branching on ``source.kind``.

A connector owns its source's dialect (``open_dialect``), the log reader factory
(``reader_opener``), the checks and objects of ``snapshotter init`` (``check_setup``,
``create_capture``), the saved stream position's checks (``position_problem``,
``position_warnings``, ``move_to_log_end``) and ``teardown``'s part (``drop_capture``).
``connector_for(source)`` picks it by the kind of ``[source]`` model: the one place that asks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, assert_never, runtime_checkable

from signals.model import Signal, Watermark
from signals.names import TableId
from snapshotter.config import MySqlSource, PostgresSource, SourceConfig, SpannerSource
from snapshotter.sources.base import Dialect
from snapshotter.sources.log import OpenReader
from snapshotter.sources.positions import NewStart
from snapshotter.sources.setup_common import Problem


@dataclass(frozen=True, slots=True)
class SetupCheck:
    """What ``snapshotter init`` found before creating anything."""

    tables: list[TableId]  # what source.tables selects now, without the signal table
    problems: list[Problem]  # prerequisites not met (errors) or at risk (warnings)


@dataclass(frozen=True, slots=True)
class Capture:
    """What ``snapshotter init`` created or found, once the prerequisites are met."""

    warnings: list[str] = field(default_factory=list)  # e.g. tables without a primary key
    done: list[str] = field(default_factory=list)  # one line per object: created or there
    # Where a first run streams from, for init to save in the state, when the log keeps no
    # position of ours (MySQL: the binlog's current end); None when it does (a slot).
    start: dict[str, Any] | None = None
    # What init created (not found there), as (kind, name): ("publication", "p"). Recorded,
    # so teardown drops only that (snapshotter.app.created).
    created: list[tuple[str, str]] = field(default_factory=list)


class ConnectError(Exception):
    """The source cannot be reached, or the database is not there; the message says what to
    check (never with a password)."""


# What ``Connector.connect`` returns and the setup, signal and position calls take: an
# SQLAlchemy engine for PostgreSQL and MySQL, the Spanner dialect for Spanner.
SourceHandle = Any


class Connector(Protocol):
    kind: str  # [source] kind: "postgres", "mysql", "spanner"
    # What holds the stream position, as messages name it: "replication slot", "binlog".
    log_name: str
    # Whether the database reads ``$$`` as a quote: signal filters are checked as it will.
    dollar_quotes: bool
    # What the source's calls raise when the database or the way to it fails (SQLAlchemy's
    # errors, Google's API errors): what the CLI reports as the source's answer.
    errors: tuple[type[Exception], ...]

    # --- connections and the engine's parts ---------------------------------------------

    def connect(self, timeout_s: float | None = None) -> SourceHandle:
        """A handle on the source for ``init``, ``signal``, ``status``, ``reset-stream`` and
        ``teardown``, checked to answer; ConnectError when it does not. ``timeout_s``: give
        up connecting after that long (``status`` must answer)."""
        ...

    def dispose(self, handle: SourceHandle) -> None:
        """Close what ``connect`` opened."""
        ...

    def open_dialect(self) -> Dialect:
        """The source's dialect (a connection and statement guard); close it when done."""
        ...

    def reader_opener(self, dialect: Dialect) -> OpenReader:
        """What opens the log reader from a saved restart point; ``dialect`` is one this
        connector opened (the reader reads the catalog and the log's end through it)."""
        ...

    # --- the signal table -----------------------------------------------------------------

    def create_signal_table(self, handle: SourceHandle) -> bool:
        """Create the signal table (Debezium's columns) unless it exists; whether it was
        created."""
        ...

    def insert_signal(self, handle: SourceHandle, signal: Signal | Watermark) -> str:
        """Insert a signal row and commit; its id."""
        ...

    def signal_rows(self, handle: SourceHandle) -> list[tuple[Any, Any, Any]]:
        """Every ``(id, type, data)`` row of the signal table, in id order."""
        ...

    def drop_signal_table(self, handle: SourceHandle) -> bool:
        """Drop the signal table if it exists; whether it existed."""
        ...

    def handle_user(self, handle: SourceHandle) -> str:
        """Who the handle acts as, for messages about privileges."""
        ...

    # --- snapshotter init -----------------------------------------------------------------

    def signal_table_grant(self, user: str) -> str:
        """The statement that lets ``user`` create the signal table."""
        ...

    def check_setup(self, engine: SourceHandle) -> SetupCheck:
        """The captured tables and the prerequisites not met; TableError for a configured
        table that does not exist. Changes nothing."""
        ...

    def create_capture(self, engine: SourceHandle, tables: Sequence[TableId]) -> Capture:
        """Create what the log reader needs (PostgreSQL: the publication, then the slot);
        SetupError with the fix when it cannot."""
        ...

    # --- the saved stream position --------------------------------------------------------

    def has_saved_position(self, resume: Mapping[str, Any]) -> bool:
        """Whether ``resume`` holds a position to resume from (else a first run starts
        fresh: at the slot, or at the binlog's end)."""
        ...

    def position_problem(self, engine: SourceHandle, resume: Mapping[str, Any]) -> str | None:
        """Why the source can no longer stream from ``resume`` (a saved position); None
        when it can."""
        ...

    def position_backlog(
        self, engine: SourceHandle, dialect: Dialect, resume: Mapping[str, Any]
    ) -> int | None:
        """Bytes of log after ``resume`` (a readable saved position); None if not known."""
        ...

    def position_warnings(
        self,
        engine: SourceHandle,
        saved: Callable[[], Mapping[str, Any]],
        threshold_mb: int,
        config: str,
    ) -> list[str]:
        """What ``status`` warns about the stream position (lost, at risk, far behind).
        ``saved`` reads the saved position from the state file, which a running engine keeps
        moving: the connector calls it before or after reading its own facts, in the order
        in which a moving engine cannot make the two look inconsistent (PostgreSQL: the slot
        first, as the engine confirms only positions it saved)."""
        ...

    def move_to_log_end(self, engine: SourceHandle, dialect: Dialect) -> NewStart:
        """Make the source stream from the current end of its log (``reset-stream``)."""
        ...

    # --- what the log carries ---------------------------------------------------------------

    def log_coverage_problems(self, handle: SourceHandle, tables: Sequence[TableId]) -> list[str]:
        """What the log no longer carries that the engine needs, one actionable line each
        (what, where, the fix): the signal table (without it no signal and no watermark
        arrives: a snapshot would wait forever) and any of ``tables`` (captured tables whose
        changes would be missing). [] when it carries them all. Changes nothing; asked by
        ``run`` at its start, by ``status``, and by the engine when a window's close
        watermark is overdue."""
        ...

    # --- snapshotter teardown -------------------------------------------------------------

    def capture_objects(self) -> list[str]:
        """What ``create_capture`` made and ``drop_capture`` drops, as people name it."""
        ...

    def refuse_drop(self, engine: SourceHandle) -> None:
        """SetupError when an object of ``capture_objects`` is in use (an engine streams
        from the slot) or is not ours to drop."""
        ...

    def drop_capture(self, engine: SourceHandle) -> list[str]:
        """Drop the ``capture_objects``: one line per object, "dropped" or "already gone"."""
        ...


@runtime_checkable
class PublishedLog(Protocol):
    """A source whose log carries only what a publication names (PostgreSQL): the
    publication can lose a table (a signal table dropped and created again), other
    publications can carry the same signal table, and the publication may be someone
    else's, which teardown then keeps."""

    def repair_log_coverage(self, handle: SourceHandle, tables: Sequence[TableId]) -> list[str]:
        """Add what ``log_coverage_problems`` found missing when the role may (it owns the
        publication and only tables are missing): the statements run. SetupError with
        ``log_coverage_problems``' lines when it cannot."""
        ...

    def other_publications(self, handle: SourceHandle, table: TableId) -> list[str]:
        """The publications other than the configured one that carry ``table``."""
        ...

    def drop_capture_keeping(self, handle: SourceHandle, keep_publication: bool) -> list[str]:
        """``drop_capture``, leaving the publication when ``keep_publication`` (init did not
        create it), with a line that says so."""
        ...


def connector_for(source: SourceConfig) -> Connector:
    """The connector of the source's kind (mypy checks every kind of SourceConfig has one).
    Imported when asked for: a PostgreSQL run never loads the MySQL client libraries."""
    if isinstance(source, PostgresSource):
        from snapshotter.sources.postgres.connector import PostgresConnector

        return PostgresConnector(source)
    if isinstance(source, MySqlSource):
        from snapshotter.sources.mysql.connector import MySqlConnector

        return MySqlConnector(source)
    if isinstance(source, SpannerSource):
        from snapshotter.sources.spanner.connector import SpannerConnector

        return SpannerConnector(source)
    assert_never(source)


def saved_position_text(resume: Mapping[str, Any]) -> str:
    """The saved restart point as people read it, with no config at hand (``status`` of a
    state file): a restart point names its own log, an LSN or a binlog file."""
    from snapshotter.sources.mysql.positions import position_text as binlog_text
    from snapshotter.sources.postgres.positions import position_text as lsn_text
    from snapshotter.sources.spanner.positions import position_text as stream_text

    return binlog_text(resume) or lsn_text(resume) or stream_text(resume) or "no saved position"

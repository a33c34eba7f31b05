"""``[source]``: the database the engine captures, one model per kind (PostgreSQL,
MySQL/MariaDB, Spanner) told apart by ``kind``: a key of another kind is refused by name.

``SourceConfig`` is the union; ``SOURCE_KINDS`` (read from it) is the one list of kinds.
"""

from __future__ import annotations

import re
from typing import Annotated, ClassVar, Literal, get_args

import sqlalchemy as sa
from pydantic import Field, field_validator, model_validator

from signals.names import TableId, TableNameError, parse_table_name, parse_table_selector
from snapshotter.common.redact import mask_url
from snapshotter.config.common import ConfigError, Section, checked_table_name, pattern

# A Spanner database's path in source.url (sqlalchemy-spanner's URL form).
SPANNER_PATH = re.compile(
    r"^projects/(?P<project>[a-z][a-z0-9\-]{4,61}[a-z0-9]|[A-Za-z0-9.:\-]+)"
    r"/instances/(?P<instance>[a-z][a-z0-9\-]{0,62})"
    r"/databases/(?P<database>[a-z][a-z0-9_\-]{0,28}[a-z0-9])$"
)

# What the names in [source] may be (the errors say the rule, not the regex).
SOURCE_NAME = pattern(
    r"^[A-Za-z0-9_.\-]+$",
    "letters, digits, '_', '.' and '-' (it prefixes the Kafka topics, as Debezium's topic.prefix)",
)
SLOT_NAME = pattern(
    r"^[a-z0-9_]{1,63}$",
    "lowercase letters, digits and underscores, at most 63 characters (a PostgreSQL "
    "replication slot name)",
)
PUBLICATION_NAME = pattern(
    r"^[A-Za-z_][A-Za-z0-9_]{0,62}$",
    "a letter or underscore, then letters, digits and underscores, at most 63 characters (a "
    "PostgreSQL publication name)",
)
CHANGE_STREAM_NAME = pattern(
    r"^[A-Za-z][A-Za-z0-9_]{0,127}$",
    "a letter, then letters, digits and underscores, at most 128 characters (a Spanner change "
    "stream name)",
)
EMULATOR_HOST = pattern(
    r"^[A-Za-z0-9.\-\[\]:]+:\d+$",
    'HOST:PORT, e.g. "localhost:9010" (the Spanner emulator\'s address)',
)


class SourceBase(Section):
    """The keys every kind of source has."""

    # How source.url is written, for the errors that show it.
    url_example: ClassVar[str]

    url: str = Field(min_length=1)
    # The logical name of this source: Debezium's topic prefix, ``source.name`` in events.
    # Defaults to the database name in the URL.
    name: str | None = Field(default=None, pattern=SOURCE_NAME)
    # Tables the engine captures and may snapshot: names or patterns (``public.*``,
    # ``/public\.orders_\d+/``). A signal's tables outside them are another pipeline's:
    # skipped with a note (docs/signals.md: Several pipelines).
    tables: list[str] = Field(default_factory=list)
    signal_table: str = "debezium_signal"
    chunk_size: int = Field(default=32768, ge=1, le=1_000_000)
    # The longest one max-key or chunk query may run (seconds), enforced by the server's
    # statement timeout and by the engine cancelling it: a filter (SQL from the signal
    # table) cannot hold the snapshot side for longer. Past it, that table's snapshot fails.
    chunk_timeout_s: float = Field(default=300, gt=0, le=86_400)
    # Chunk SELECTs in flight at once, each on a database connection of its own and inside
    # its own watermark window, while the stream flows (snapshotter.core.spans). Above 1, each
    # chunk's key range is found first (an index scan of chunk_size keys), then read whole.
    read_parallelism: int = Field(default=2, ge=1, le=16)
    # `snapshotter status` warns when more log than this waits unread behind the saved
    # position (PostgreSQL: WAL the slot retains; MySQL: binlog bytes after the position).
    backlog_warn_mb: int = Field(default=1024, ge=0)
    # Delete the engine's own watermark rows (two per chunk) from the signal table once their
    # window is finished, and those earlier runs left behind, in batches of this many rows,
    # off the stream. User signals (execute-snapshot ...) are never deleted.
    signal_cleanup: bool = True
    signal_cleanup_batch: int = Field(default=500, ge=1, le=100_000)

    @field_validator("url")
    @classmethod
    def _url_parses(cls, value: str) -> str:
        """A URL that cannot be used is said at load, masked (it holds the password)."""
        try:
            url = sa.make_url(value)
        except (sa.exc.ArgumentError, ValueError) as exc:
            # Not shown: what part of an unparsable text is the password cannot be told.
            reason = "its port is not a number" if isinstance(exc, ValueError) else "not a URL"
            raise ValueError(
                f"cannot be parsed ({reason}; not shown, as it may hold a password); write it "
                f"as {cls.url_example}"
            ) from None
        problem = cls._url_problem(url)
        if problem:
            raise ValueError(problem)
        return value

    @classmethod
    def _url_problem(cls, url: sa.URL) -> str | None:
        """What makes a parsed URL unusable for this kind (the whole message), or None."""
        return None

    @field_validator("signal_table")
    @classmethod
    def _parses(cls, value: str) -> str:
        return checked_table_name(value)

    @field_validator("tables")
    @classmethod
    def _selectors(cls, value: list[str]) -> list[str]:
        for item in value:
            try:
                parse_table_selector(item)
            except TableNameError as exc:
                raise ValueError(f"{item!r}: {exc}") from None
        return value

    @property
    def default_schema(self) -> str:
        """The schema an unqualified table name lives in."""
        return "public"

    @property
    def signal_table_id(self) -> TableId:
        return parse_table_name(self.signal_table).with_default_schema(self.default_schema)

    @property
    def topic_prefix(self) -> str:
        return self.name or sa.make_url(self.url).database or "snapshotter"


class PostgresSource(SourceBase):
    url_example: ClassVar[str] = "postgresql://USER:PASSWORD@HOST:PORT/DATABASE"

    kind: Literal["postgres"]
    slot: str = Field(default="snapshotter", pattern=SLOT_NAME)
    publication: str = Field(default="snapshotter", pattern=PUBLICATION_NAME)
    # PostgreSQL 17+: `init` creates the slot with failover = true, so a standby that syncs
    # slots (sync_replication_slots) keeps it through a failover.
    failover_slot: bool = False


class MySqlSource(SourceBase):
    """MySQL 8 and MariaDB 10.5+ (the binlog and the SQL they share)."""

    url_example: ClassVar[str] = "mysql://USER:PASSWORD@HOST:PORT/DATABASE"

    kind: Literal["mysql"]
    # The server id the binlog client registers with. It must differ from the server's and
    # every other replica's (a second client with the same id disconnects the first).
    # Unset: a random id in 5400..6399 per run, as Debezium picks.
    server_id: int | None = Field(default=None, ge=1, le=4_294_967_295)

    @classmethod
    def _url_problem(cls, url: sa.URL) -> str | None:
        if not url.database:
            return (
                f"{mask_url(url)} names no database (MySQL needs one: the default schema of "
                f"unqualified table names); write it as {cls.url_example}"
            )
        return None

    @property
    def default_schema(self) -> str:
        database = sa.make_url(self.url).database
        if not database:
            raise ConfigError(
                f"source.url {mask_url(self.url)} names no database ({self.url_example})"
            )
        return database


class SpannerSource(SourceBase):
    """Cloud Spanner, either dialect (docs/spanner.md). GoogleSQL's default schema has no
    name, and is called "public" here, as a PostgreSQL-dialect database's is."""

    url_example: ClassVar[str] = "spanner:///projects/PROJECT/instances/INSTANCE/databases/DATABASE"

    kind: Literal["spanner"]
    # The change stream the engine reads (it must watch the captured tables and the signal
    # table; `snapshotter init` checks it and prints the DDL when it does not).
    # Required: checked by _needs_a_change_stream, whose message says what it is.
    change_stream: str | None = Field(default=None, pattern=CHANGE_STREAM_NAME)
    # The emulator's host:port; unset: SPANNER_EMULATOR_HOST if set, else Cloud Spanner
    # itself (credentials as Google's client libraries find them).
    emulator_host: str | None = Field(default=None, pattern=EMULATOR_HOST)
    # How often each change-stream partition sends a heartbeat when it has no data
    # (milliseconds): how far behind the merged stream can be when a partition is idle.
    heartbeat_ms: int = Field(default=1000, ge=100, le=300_000)

    @classmethod
    def _url_problem(cls, url: sa.URL) -> str | None:
        if url.drivername != "spanner" or url.host or not SPANNER_PATH.match(url.database or ""):
            return (
                f"{mask_url(url)} is not a Spanner database; write it as {cls.url_example} (the "
                "emulator's host goes in emulator_host or SPANNER_EMULATOR_HOST)"
            )
        return None

    @model_validator(mode="after")
    def _needs_a_change_stream(self) -> SpannerSource:
        if self.change_stream is None:
            raise ValueError(
                "a spanner source needs change_stream, the name of the change stream that "
                "watches the tables (`snapshotter init` prints the DDL that creates it)"
            )
        return self

    @property
    def spanner_path(self) -> dict[str, str]:
        """project, instance and database of source.url."""
        found = SPANNER_PATH.match(sa.make_url(self.url).database or "")
        if found is None:
            raise ConfigError(f"source.url {mask_url(self.url)} is not a Spanner database")
        return found.groupdict()

    @property
    def topic_prefix(self) -> str:
        return self.name or self.spanner_path["database"]


def _kind(model: type[SourceBase]) -> str:
    kind: str = get_args(model.model_fields["kind"].annotation)[0]
    return kind


SOURCE_MODELS: tuple[type[SourceBase], ...] = (PostgresSource, MySqlSource, SpannerSource)
SourceConfig = Annotated[PostgresSource | MySqlSource | SpannerSource, Field(discriminator="kind")]
# The one list of source kinds, in the order errors name them.
SOURCE_KINDS: tuple[str, ...] = tuple(_kind(model) for model in SOURCE_MODELS)


def kind_of_key(key: str) -> str | None:
    """The kind whose [source] has ``key`` when it is not a key of every kind, else None."""
    if key in SourceBase.model_fields:
        return None
    owners = [m for m in SOURCE_MODELS if key in m.model_fields]
    return _kind(owners[0]) if len(owners) == 1 else None

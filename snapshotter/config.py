"""The configuration file (TOML), validated by pydantic into typed settings.

Strings may name environment variables as ``${NAME}`` (e.g. ``url = "${SNAPSHOTTER_PG_URL}"``),
so credentials need not live in the file; an unset variable is an error, not an empty string.
Any key can also be set from the environment as ``SNAPSHOTTER_<SECTION>_<KEY>`` (e.g.
``SNAPSHOTTER_SOURCE_URL``, ``SNAPSHOTTER_SOURCE_CHUNK_SIZE=2048``,
``SNAPSHOTTER_SOURCE_TABLES='["public.a", "public.b"]'``): the value is read as a TOML value
when it is one (numbers, booleans, arrays, quoted strings) and as a plain string otherwise.
Relative paths are relative to the directory of the config file.

Which ``SNAPSHOTTER_*`` variables are configuration (a typo must never be ignored silently):

* ``SNAPSHOTTER_SOURCE_*``, ``SNAPSHOTTER_SINK_*``, ``SNAPSHOTTER_STATE_*``,
  ``SNAPSHOTTER_SPARK_*``, ``SNAPSHOTTER_SNAPSHOT_*``, ``SNAPSHOTTER_METRICS_*`` and
  ``SNAPSHOTTER_NOTIFICATIONS_*`` set the key the rest names; a key
  the section does not have is an error ("did you mean ...").
* A variable whose first word is a misspelt section name (``SNAPSHOTTER_SORUCE_URL``) is an
  error too.
* A variable the file references as ``${NAME}`` is only that reference, whatever its name.
* Every other ``SNAPSHOTTER_*`` variable is not configuration and is ignored here: the
  project's scripts and tests use such names (``SNAPSHOTTER_PG_URL``, ``SNAPSHOTTER_FAULTS``,
  ``SNAPSHOTTER_SERVICES_DIR``...), and a config may reference any variable as ``${NAME}``.

Unknown keys are refused everywhere, with the nearest known key as a suggestion: in the file's
sections, and inside ``[sink] kafka = {...}`` (checked against the settings kafka-python's
producer, admin client and consumer accept, or with ``client = "confluent"`` by librdkafka).
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import os
import re
import tomllib
from collections.abc import Mapping, Set
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from signals.names import TableId, TableNameError, parse_table_name, parse_table_selector
from snapshotter.common.librdkafka import did_you_mean
from snapshotter.common.redact import mask_url

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
ENV_PREFIX = "SNAPSHOTTER_"
NOT_FINITE = "not a finite number (nan and inf are refused); give a number"

# The schema an unqualified name lives in, per source kind (MySQL: the URL's database).
# Spanner: a PostgreSQL-dialect database's default schema is "public"; GoogleSQL's default
# schema has no name, and is called "public" here too (docs/spanner.md).
DEFAULT_SCHEMA = {"postgres": "public", "spanner": "public"}
DEFAULT_JSONL = "snapshotter-events.jsonl"
_URL_EXAMPLES = {
    "postgres": "postgresql://USER:PASSWORD@HOST:PORT/DATABASE",
    "mysql": "mysql://USER:PASSWORD@HOST:PORT/DATABASE",
    "spanner": "spanner:///projects/PROJECT/instances/INSTANCE/databases/DATABASE",
}
# A Spanner database's path in source.url (sqlalchemy-spanner's URL form).
SPANNER_PATH = re.compile(
    r"^projects/(?P<project>[a-z][a-z0-9\-]{4,61}[a-z0-9]|[A-Za-z0-9.:\-]+)"
    r"/instances/(?P<instance>[a-z][a-z0-9\-]{0,62})"
    r"/databases/(?P<database>[a-z][a-z0-9_\-]{0,28}[a-z0-9])$"
)


def _table_name(value: str) -> str:
    """A table name setting (signal_table, notifications.table): refused unless it parses."""
    try:
        parse_table_name(value)
    except TableNameError as exc:
        raise ValueError(str(exc)) from None
    return value


class ConfigError(ValueError):
    """A configuration file that cannot be used; the message says where and why."""


class _Section(BaseModel):
    # allow_inf_nan=False: TOML reads nan and inf as numbers, and no setting means either (a
    # timeout of inf seconds overflows the waits that take it).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class SourceConfig(_Section):
    # "mysql" covers MySQL 8 and MariaDB 10.5+ (the binlog and the SQL they share);
    # "spanner" Cloud Spanner, either dialect (docs/spanner.md).
    kind: Literal["postgres", "mysql", "spanner"]
    url: str = Field(min_length=1)
    # The logical name of this source: Debezium's topic prefix, ``source.name`` in events.
    # Defaults to the database name in the URL.
    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.\-]+$")
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
    slot: str = Field(default="snapshotter", pattern=r"^[a-z0-9_]{1,63}$")
    publication: str = Field(default="snapshotter", pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
    # PostgreSQL 17+: `init` creates the slot with failover = true, so a standby that syncs
    # slots (sync_replication_slots) keeps it through a failover.
    failover_slot: bool = False
    # MySQL: the server id the binlog client registers with. It must differ from the
    # server's and every other replica's (a second client with the same id disconnects the
    # first). Unset: a random id in 5400..6399 per run, as Debezium picks.
    server_id: int | None = Field(default=None, ge=1, le=4_294_967_295)
    # `snapshotter status` warns when more log than this waits unread behind the saved
    # position (PostgreSQL: WAL the slot retains; MySQL: binlog bytes after the position).
    backlog_warn_mb: int = Field(default=1024, ge=0)
    # Delete the engine's own watermark rows (two per chunk) from the signal table once their
    # window is finished, and those earlier runs left behind, in batches of this many rows,
    # off the stream. User signals (execute-snapshot ...) are never deleted.
    signal_cleanup: bool = True
    signal_cleanup_batch: int = Field(default=500, ge=1, le=100_000)
    # Spanner: the change stream the engine reads (it must watch the captured tables and
    # the signal table; `snapshotter init` checks it and prints the DDL when it does not).
    change_stream: str | None = Field(default=None, pattern=r"^[A-Za-z][A-Za-z0-9_]{0,127}$")
    # Spanner: the emulator's host:port; unset: SPANNER_EMULATOR_HOST if set, else Cloud
    # Spanner itself (credentials as Google's client libraries find them).
    emulator_host: str | None = Field(default=None, pattern=r"^[A-Za-z0-9.\-\[\]:]+:\d+$")
    # Spanner: how often each change-stream partition sends a heartbeat when it has no
    # data (milliseconds): how far behind the merged stream can be when a partition is idle.
    heartbeat_ms: int = Field(default=1000, ge=100, le=300_000)

    @field_validator("url")
    @classmethod
    def _url_parses(cls, value: str, info: ValidationInfo) -> str:
        """A URL that cannot be used is said at load, masked (it holds the password)."""
        kind = info.data.get("kind", "postgres")
        example = _URL_EXAMPLES.get(kind, _URL_EXAMPLES["postgres"])
        try:
            url = sa.make_url(value)
        except (sa.exc.ArgumentError, ValueError) as exc:
            # Not shown: what part of an unparsable text is the password cannot be told.
            reason = "its port is not a number" if isinstance(exc, ValueError) else "not a URL"
            raise ValueError(
                f"cannot be parsed ({reason}; not shown, as it may hold a password); write it "
                f"as {example}"
            ) from None
        if kind == "mysql" and not url.database:
            raise ValueError(
                f"{mask_url(url)} names no database (MySQL needs one: the default schema of "
                f"unqualified table names); write it as {example}"
            )
        if kind == "spanner" and (
            url.drivername != "spanner" or url.host or not SPANNER_PATH.match(url.database or "")
        ):
            raise ValueError(
                f"{mask_url(url)} is not a Spanner database; write it as {example} (the "
                "emulator's host goes in emulator_host or SPANNER_EMULATOR_HOST)"
            )
        return value

    @model_validator(mode="after")
    def _spanner_keys(self) -> SourceConfig:
        spanner_only = ("change_stream", "emulator_host", "heartbeat_ms")
        if self.kind != "spanner":
            given = [k for k in spanner_only if k in self.model_fields_set]
            if given:
                raise ValueError(f'{", ".join(given)}: only for kind = "spanner"')
        elif self.change_stream is None:
            raise ValueError(
                "a spanner source needs change_stream, the name of the change stream that "
                "watches the tables (`snapshotter init` prints the DDL that creates it)"
            )
        return self

    @property
    def spanner_path(self) -> dict[str, str]:
        """project, instance and database of a spanner source.url."""
        found = SPANNER_PATH.match(sa.make_url(self.url).database or "")
        if found is None:
            raise ConfigError(f"source.url {mask_url(self.url)} is not a Spanner database")
        return found.groupdict()

    @field_validator("signal_table")
    @classmethod
    def _parses(cls, value: str) -> str:
        return _table_name(value)

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
        if self.kind == "mysql":
            database = sa.make_url(self.url).database
            if not database:
                raise ConfigError(
                    f"source.url {mask_url(self.url)} names no database ({_URL_EXAMPLES['mysql']})"
                )
            return database
        return DEFAULT_SCHEMA[self.kind]

    @property
    def signal_table_id(self) -> TableId:
        return parse_table_name(self.signal_table).with_default_schema(self.default_schema)

    @property
    def topic_prefix(self) -> str:
        if self.name:
            return self.name
        if self.kind == "spanner":
            return self.spanner_path["database"]
        database = sa.make_url(self.url).database
        return database or "snapshotter"


_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")


# The host of a master or Connect URL: a bracketed IPv6 address ("spark://[::1]:7077") or a
# name or IPv4 address.
_URL_HOST = re.compile(r"^[a-z][a-z0-9+.\-]*://(?:\[([^\]/]+)\]|([^\[\]/:@]+))")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an IP address, IPv6 without brackets) is this machine's
    loopback interface: localhost, 127.0.0.0/8, ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_uri(path: str) -> bool:
    """Whether ``path`` names a location by URI (``s3a://``, ``hdfs://``, ``file://``...)."""
    return bool(_URI.match(path))


# Kafka client settings the sink sets itself: the ordering and durability promises rest on
# them (or they are given by other [sink] keys).
KAFKA_RESERVED = frozenset(
    {
        "bootstrap_servers",
        "acks",
        "enable_idempotence",
        "retries",
        "max_in_flight_requests_per_connection",
        "key_serializer",
        "value_serializer",
        "partitioner",
        "transactional_id",
        "group_id",
        "enable_auto_commit",
        "auto_offset_reset",
        "key_deserializer",
        "value_deserializer",
        "isolation_level",
    }
)


# Client settings that take Python objects (classes, callables, lists of tuples): no TOML
# value can stand for them.
KAFKA_OBJECT_SETTINGS = frozenset(
    {
        "kafka_client",
        "selector",
        "ssl_context",
        "sasl_oauth_token_provider",
        "metric_reporters",
        "socket_options",
        "default_offset_commit_callback",
        "partition_assignment_strategy",
    }
)


def kafka_client_settings() -> frozenset[str]:
    """Every setting kafka-python's producer, admin client or consumer accepts (each client
    of the sink takes the ones it knows; see ``snapshotter.sinks.kafka.sink.client_settings``)."""
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

    return frozenset(
        name
        for client in (KafkaProducer, KafkaAdminClient, KafkaConsumer)
        for name in client.DEFAULT_CONFIG
    )


def kafka_setting_problem(
    name: str, *, client: str = "kafka-python", value: object = None
) -> str | None:
    """Why ``[sink] kafka`` cannot hold ``name`` (None: it can). With ``client =
    "confluent"`` the keys are librdkafka's, judged (with ``value``) by librdkafka itself."""
    if client == "confluent":
        from snapshotter.common.librdkafka import CONFLUENT_RESERVED, confluent_setting_problem

        if name in CONFLUENT_RESERVED:
            return (
                f"{name}: set by the sink itself (bootstrap.servers is a [sink] key; acks=all, "
                "idempotence and murmur2 partitioning keep each key's events in order and "
                "durable)"
            )
        return confluent_setting_problem(name, value)
    known = kafka_client_settings()
    if name in KAFKA_OBJECT_SETTINGS:
        return f"{name}: takes a Python object, which a config file cannot give"
    if name not in known:
        settable = known - KAFKA_RESERVED - KAFKA_OBJECT_SETTINGS
        return (
            f"{name}: not a kafka-python client setting{did_you_mean(name, settable)}; "
            "the keys are kafka-python's (security_protocol, sasl_mechanism, ssl_cafile...)"
        )
    return None


class SinkConfig(_Section):
    # "jsonl": one JSON line per event in a local file. "spark": staged Parquet landed by
    # Spark into a changelog and a current-state table per source table. "kafka": one topic
    # per table, Debezium's message shapes.
    kind: Literal["jsonl", "spark", "kafka"] = "jsonl"
    # jsonl: the file. spark: the landing root, a local path or any Hadoop-compatible URI.
    # Unset: "snapshotter-events.jsonl" (jsonl) or "lake" (spark).
    path: str = ""
    # spark: "parquet" (plain Parquet files, merge-on-read current state), "delta" or
    # "iceberg" (Apache Iceberg tables in a catalog: see catalog).
    format: Literal["parquet", "delta", "iceberg"] = "parquet"
    # spark, iceberg and delta formats: the Spark catalog the tables are kept in (delta:
    # registered in), one namespace per source schema: <catalog>.<schema>.<table> and
    # <catalog>.<schema>.<table>_changelog. Unset: iceberg, "snapshotter", a Hadoop (path)
    # catalog whose warehouse is path, set up by the sink (nothing to configure); delta, none
    # (tables by path). Any other name: a catalog configured under [spark] conf
    # (spark.sql.catalog.<name> = ...: REST, Hive, Glue, Nessie, Unity...).
    catalog: str | None = Field(default=None, min_length=1, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    # spark, iceberg format: table maintenance, run when the lander is idle (after
    # compact_idle_s of quiet, and when the sink closes) at most once per this many seconds
    # per table: data files and delete files rewritten (small files and deletion vectors
    # folded in), snapshots older than snapshot_retention_s expired (0: at every idle point).
    maintenance_interval_s: float = Field(default=600.0, ge=0, le=86_400 * 365)
    # spark, iceberg format: expire_snapshots keeps snapshots younger than this (time travel
    # reaches this far back), and always the last snapshots_kept.
    snapshot_retention_s: float = Field(default=86_400.0 * 7, ge=0, le=86_400 * 3650)
    snapshots_kept: int = Field(default=10, ge=1)
    # spark, iceberg format: maintenance rewrites a data file for its deleted rows once at
    # least this share of them is deleted (Iceberg's delete-ratio-threshold; 0.3 is Iceberg's
    # default): a few changes spread over a large table leave its files alone (their deletion
    # vectors stay, which readers apply), so maintenance costs the change, not the table.
    rewrite_delete_ratio: float = Field(default=0.3, gt=0, le=1)
    # spark: where batches are staged, a directory of this machine (staged files are fsynced
    # before the state records them) that Spark's executors can read too: on a cluster of
    # other machines, a shared mount. Unset: "_staging" under a local landing path (Spark
    # skips "_" directories), else <state dir>/staging.
    staging_path: Path | None = None
    # spark: the bound on staged, not yet landed data. Past it, the engine waits for Spark
    # (backpressure) instead of staging more.
    max_staged_mb: int = Field(default=512, ge=1)
    # spark, parquet format: compact a table's current state when the events landed since
    # its last compaction reach this fraction of its rows (and at least compact_min_rows).
    compact_ratio: float = Field(default=0.5, gt=0, le=1_000_000)
    compact_min_rows: int = Field(default=100_000, ge=0)
    # spark, parquet format: the bucket count of a table's current state (a key in bucket
    # pmod(xxhash64(key), buckets), a bucket part files of key ranges; a compaction rewrites
    # only the parts whose keys changed). 0: chosen at the table's first compaction from
    # its size, a power of two of about 4M rows each. Kept for the table's life.
    buckets: int = Field(default=0, ge=0, le=65_536)
    # spark: a column added, dropped or widened at the source while streaming: "evolve" (the
    # landed tables follow; a dropped column stays, NULL from then on) or "fail" (the
    # landing stops before the change; the batch stays staged). Flink CDC's names.
    schema_changes: Literal["evolve", "fail"] = "evolve"
    # spark, parquet format: fold every changelog tail into the current state once nothing
    # has landed for this many seconds, so a plain reader of current/ sees the exact state
    # while the engine runs (0: only when the engine stops).
    compact_idle_s: float = Field(default=10.0, ge=0, le=86_400)
    # kafka: the brokers, "host:port[,host:port...]".
    bootstrap_servers: str = ""
    # kafka: partitions and replication factor of the topics the sink creates (existing
    # topics are used as they are).
    partitions: int = Field(default=1, ge=1)
    replication: int = Field(default=1, ge=1)
    # kafka: wrap keys and values as {"schema": ..., "payload": ...}, as Kafka Connect's
    # JsonConverter does with schemas.enable=true.
    schemas: bool = False
    # kafka: JSON columns as the document itself ("embedded", as the jsonl sink writes them)
    # or as a string holding its text ("text", as Debezium does). Unset: "text" with
    # schemas (a Connect schema cannot describe an arbitrary document), else "embedded".
    json_columns: Literal["embedded", "text"] | None = None
    # kafka: the client library. "kafka-python" (pure Python, always installed) or
    # "confluent" (confluent-kafka, librdkafka in C: ~9x less CPU per message; install the
    # snapshotter[confluent] extra). Either keeps the same guarantees and message bytes.
    client: Literal["kafka-python", "confluent"] = "kafka-python"
    # kafka: more client settings, the chosen client's own: kafka-python's
    # (security_protocol, sasl_*, ssl_*, linger_ms, compression_type...; each client -
    # producer, admin, the verify consumer - takes the ones it knows) or, with client =
    # "confluent", librdkafka's ("security.protocol", "sasl.username", "linger.ms"...).
    kafka: dict[str, str | int | float | bool] = Field(default_factory=dict)
    # kafka: at most this much sent and not yet acknowledged (kafka-python's producer has no
    # bound of its own); past it the engine waits for Kafka before sending more.
    max_unacked_mb: int = Field(default=64, ge=1)

    @field_validator("kafka", mode="before")
    @classmethod
    def _finite_client_settings(cls, value: Any) -> Any:
        """A nan or inf client setting in one line (else the union of value types reports it
        four times over)."""
        if isinstance(value, Mapping):
            for name, item in value.items():
                if isinstance(item, float) and not math.isfinite(item):
                    raise ValueError(f"{name} = {item}: {NOT_FINITE}")
        return value

    @field_validator("kafka")
    @classmethod
    def _known_client_settings(
        cls, value: dict[str, str | int | float | bool], info: ValidationInfo
    ) -> dict[str, str | int | float | bool]:
        client = info.data.get("client", "kafka-python")
        if client == "confluent":  # librdkafka's settings (client is declared before kafka)
            from snapshotter.common.librdkafka import confluent_settings_problem

            problems = [kafka_setting_problem(n, client=client, value=v) for n, v in value.items()]
            if any(problems):
                raise ValueError("; ".join(p for p in problems if p))
            together = confluent_settings_problem(value) if value else None
            if together:
                raise ValueError(together)
            return value
        reserved = sorted(KAFKA_RESERVED & set(value))
        if reserved:
            raise ValueError(
                f"{', '.join(reserved)}: set by the sink itself (bootstrap_servers is a [sink] "
                "key; acks=all and idempotence keep each key's events in order and durable)"
            )
        problems = [kafka_setting_problem(name) for name in value]
        if any(problems):
            raise ValueError("; ".join(p for p in problems if p))
        return value

    @model_validator(mode="after")
    def _kafka_settings(self) -> SinkConfig:
        if self.kind != "kafka":
            return self
        if not self.bootstrap_servers.strip():
            raise ValueError(
                'the kafka sink needs bootstrap_servers, e.g. bootstrap_servers = "host:9092"'
            )
        if self.schemas and self.json_columns == "embedded":
            raise ValueError(
                'json_columns = "embedded" cannot go with schemas = true: a Connect schema '
                'cannot describe an arbitrary JSON document; use json_columns = "text"'
            )
        return self

    @model_validator(mode="after")
    def _catalog_for_tables(self) -> SinkConfig:
        if self.catalog is not None and (self.kind != "spark" or self.format == "parquet"):
            raise ValueError(
                f'catalog = "{self.catalog}": a catalog holds the tables of the spark sink\'s '
                'iceberg and delta formats; set kind = "spark" and format = "iceberg" or '
                '"delta", or remove it (parquet is plain directories)'
            )
        return self

    @property
    def json_as_text(self) -> bool:
        """kafka: whether JSON columns are written as strings holding their text."""
        if self.json_columns is None:
            return self.schemas
        return self.json_columns == "text"

    @property
    def local_path(self) -> Path:
        """The path as a local file (the jsonl sink); a URI is refused."""
        if is_uri(self.path):
            raise ConfigError(f"sink.path {self.path!r}: the {self.kind} sink writes local files")
        return Path(self.path)


class SparkConfig(_Section):
    # local[*] (default) or a cluster's master URL (spark://HOST:PORT, yarn, k8s://...): the
    # engine's process is Spark's driver.
    master: str = "local[*]"
    # Spark Connect instead of a driver in this process: "sc://HOST:PORT". The server's own
    # master runs the work; master must then stay unset.
    remote: str | None = Field(default=None, pattern=r"^sc://\S+$")
    app_name: str = "snapshotter"
    # Extra Spark configuration, e.g. {"spark.driver.memory" = "4g"}. Through Spark Connect
    # only settings a running session takes (spark.sql.*).
    conf: dict[str, str] = Field(default_factory=dict)
    # The longest starting Spark may take: the master or Connect server answering, the
    # session, and a first task run on an executor (a cluster whose cores other
    # applications hold runs none). Past it the engine (or verify) stops with the address
    # and the fix.
    start_timeout_s: float = Field(default=120.0, gt=0, le=3600, allow_inf_nan=False)

    @field_validator("master")
    @classmethod
    def _not_connect(cls, value: str) -> str:
        if value.startswith("sc://"):
            raise ValueError(
                f'{value!r} is a Spark Connect URL: set remote = "{value}" and leave master unset'
            )
        return value

    @model_validator(mode="after")
    def _one_of_master_and_remote(self) -> SparkConfig:
        if self.remote is not None and "master" in self.model_fields_set:
            raise ValueError(
                f"master {self.master!r} and remote {self.remote!r} are both set: with Spark "
                "Connect (remote) the server's master runs the work; remove master"
            )
        return self

    @property
    def url(self) -> str:
        """Where Spark runs: the Connect URL, else the master."""
        return self.remote or self.master

    @property
    def runs_elsewhere(self) -> bool:
        """Whether Spark's executors may run on other machines than this one: a cluster
        master or Connect server not on the loopback interface (yarn, k8s://, a spark:// or
        sc:// host other than localhost)."""
        url = self.url
        if url.startswith("local"):
            return False
        found = _URL_HOST.match(url)
        return found is None or not is_loopback(found.group(1) or found.group(2))


class SnapshotConfig(_Section):
    # Read each window's key range on Spark executors: cut into this many sub-ranges of
    # [source] chunk_size rows, read by as many Spark tasks at once, their rows written to
    # staging by the executors and landed without passing through the engine. 0: chunks are
    # read by the engine ([source] read_parallelism). Needs [sink] kind = "spark".
    executors: int = Field(default=0, ge=0, le=1024)


class StateConfig(_Section):
    dir: Path = Path("snapshotter-state")
    # How often the engine asks the sink to make its output durable and then saves state
    # (Debezium's offset.flush.interval.ms): after a crash, at most about this much output
    # is sent again.
    checkpoint_interval_ms: int = Field(default=1000, ge=10, le=600_000)
    # How long a stop (SIGTERM, SIGINT, or a failure) may take, from the request to the
    # process's exit: the last transaction, the final checkpoint, the sink's close. Past it
    # the process exits anyway; what was acknowledged is saved, the rest is done again by
    # the next run. A second SIGTERM/SIGINT exits at once.
    shutdown_timeout_s: float = Field(default=60.0, gt=0, le=86_400, allow_inf_nan=False)


class MetricsConfig(_Section):
    # The Prometheus endpoint of `run` / `resume` (http://host:port/metrics). None: off.
    # 0: a free port the system picks (logged at start; for tests).
    port: int | None = Field(default=None, ge=0, le=65_535)
    # The address it listens on; the loopback by default (the endpoint has no
    # authentication: "0.0.0.0" exposes it to the network).
    host: str = Field(default="127.0.0.1", min_length=1)


class NotificationsConfig(_Section):
    # Where Debezium-style notifications of incremental snapshots go (STARTED, IN_PROGRESS,
    # TABLE_SCAN_COMPLETED, PAUSED, RESUMED, ABORTED, COMPLETED; docs/operations.md):
    # "log" (one INFO line each, logger snapshotter.notifications), "table" (rows of
    # `table` in the source database, created by `snapshotter init`), "sink" (the sink's
    # own notification topic / file / table). Empty: off, as in Debezium.
    channels: list[Literal["log", "table", "sink"]] = Field(default_factory=list)
    # The table channel's table, in the source database (schema-qualified or in the
    # source's default schema, as signal_table). The engine never streams its changes; it
    # must be a table of its own (a captured table named here is refused).
    table: str = "debezium_notification"
    # The sink channel's Kafka topic (Debezium's notification.sink.topic.name). Unset:
    # "<source name>.notifications".
    topic: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.\-]{1,249}$")

    @field_validator("table")
    @classmethod
    def _table_parses(cls, value: str) -> str:
        return _table_name(value)

    @field_validator("channels")
    @classmethod
    def _once_each(cls, value: list[str]) -> list[str]:
        return list(dict.fromkeys(value))


class Config(_Section):
    source: SourceConfig
    sink: SinkConfig = Field(default_factory=SinkConfig)
    state: StateConfig = Field(default_factory=StateConfig)
    spark: SparkConfig = Field(default_factory=SparkConfig)
    snapshot: SnapshotConfig = Field(default_factory=SnapshotConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    notifications: NotificationsConfig = Field(default_factory=NotificationsConfig)

    @property
    def notification_table_id(self) -> TableId:
        """The notification table (``[notifications] table``), schema-qualified."""
        return parse_table_name(self.notifications.table).with_default_schema(
            self.source.default_schema
        )

    @property
    def own_tables(self) -> dict[TableId, str]:
        """The engine's own tables in the source besides the signal table, with what each
        is: the notification table, with the "table" channel. Never captured, never
        snapshotted."""
        if "table" not in self.notifications.channels:
            return {}
        return {self.notification_table_id: "the notification table ([notifications] table)"}

    @property
    def staging_dir(self) -> Path:
        if self.sink.staging_path is not None:
            return self.sink.staging_path
        if self.sink.kind == "spark" and self.sink.path and not is_uri(self.sink.path):
            return Path(self.sink.path) / "_staging"
        return self.state.dir / "staging"

    @model_validator(mode="after")
    def _notification_table_of_its_own(self) -> Config:
        if "table" not in self.notifications.channels:
            return self
        table = self.notification_table_id
        if table == self.source.signal_table_id:
            raise ValueError(
                f"notifications.table {self.notifications.table!r} is the signal table; name "
                'another, e.g. table = "debezium_notification"'
            )
        schema = self.source.default_schema
        for item in self.source.tables:
            selector = parse_table_selector(item)
            if isinstance(selector, TableId) and selector.with_default_schema(schema) == table:
                # Its changes would be dropped from the output (the engine's own rows), and
                # notifications written into a table of the application.
                raise ValueError(
                    f"notifications.table {self.notifications.table!r} is a captured table "
                    f"(source.tables names {item!r}): the notification table is the engine's "
                    'own; name another, e.g. table = "debezium_notification"'
                )
        return self

    @model_validator(mode="after")
    def _spanner_supports(self) -> Config:
        if self.source.kind != "spanner":
            return self
        if "table" in self.notifications.channels:
            raise ValueError(
                'notifications.channels: "table" writes to an SQL source; a spanner source '
                'has "log" and "sink"'
            )
        if self.snapshot.executors:
            raise ValueError(
                "snapshot.executors: Spark executors read chunks over JDBC, which a spanner "
                "source does not offer; set it to 0 (chunks are read by the engine)"
            )
        return self

    @model_validator(mode="after")
    def _executors_need_spark(self) -> Config:
        if self.snapshot.executors and self.sink.kind != "spark":
            raise ValueError(
                f"snapshot.executors = {self.snapshot.executors} reads chunks on Spark "
                f"executors, whose rows land only through the spark sink; set [sink] kind = "
                f'"spark", or snapshot.executors = 0 to read chunks in the engine'
            )
        return self

    @model_validator(mode="after")
    def _staging_the_executors_read(self) -> Config:
        """A landing on Spark elsewhere needs storage its executors see: refused at start,
        not found out at the first landing."""
        if (
            self.sink.kind == "spark"
            and self.spark.runs_elsewhere
            and self.sink.staging_path is None
            and not is_uri(self.sink.path or "lake")
        ):
            raise ValueError(
                f"sink.path {self.sink.path or 'lake'!r} is a local directory, but Spark runs "
                f"elsewhere ({self.spark.url}): its executors cannot read this machine's disk; "
                "set sink.path to shared storage (hdfs://, s3a://...) and sink.staging_path to "
                "a directory they also see (a shared mount), or run Spark here"
            )
        return self


def _expand(value: Any, where: str, environ: Mapping[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: _expand(v, f"{where}.{k}" if where else k, environ) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, f"{where}[{i}]", environ) for i, v in enumerate(value)]
    if isinstance(value, str):

        def lookup(m: re.Match[str]) -> str:
            name = m.group(1)
            if name not in environ:
                raise ConfigError(f"{where}: environment variable {name} is not set")
            return environ[name]

        return _ENV_REF.sub(lookup, value)
    return value


def _env_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _referenced(value: Any) -> set[str]:
    """The environment variables the file names as ``${NAME}``."""
    if isinstance(value, dict):
        return {name for v in value.values() for name in _referenced(v)}
    if isinstance(value, list):
        return {name for v in value for name in _referenced(v)}
    if isinstance(value, str):
        return set(_ENV_REF.findall(value))
    return set()


def _section_fields() -> dict[str, dict[str, str]]:
    """Per section: the upper-case key as a variable spells it -> the key."""
    return {
        name: {f.upper(): f for f in model.model_fields}
        for name, model in (
            ("source", SourceConfig),
            ("sink", SinkConfig),
            ("state", StateConfig),
            ("spark", SparkConfig),
            ("snapshot", SnapshotConfig),
            ("metrics", MetricsConfig),
            ("notifications", NotificationsConfig),
        )
    }


def _env_target(var: str, sections: dict[str, dict[str, str]]) -> tuple[str, str] | None:
    """The (section, key) a ``SNAPSHOTTER_*`` variable sets; None for a variable that is not
    configuration (see the module docstring); ConfigError for a misspelt one."""
    rest = var[len(ENV_PREFIX) :]
    for section, fields in sections.items():
        prefix = section.upper() + "_"
        if rest.startswith(prefix):
            key = rest[len(prefix) :]
            if key in fields:
                return section, fields[key]
            known = [f"{ENV_PREFIX}{section.upper()}_{k}" for k in fields]
            raise ConfigError(
                f"environment variable {var}: [{section}] has no key {key.lower()!r}"
                f"{did_you_mean(var, known)}; unset it or fix the name"
            )
    first = rest.split("_", 1)[0]
    close = difflib.get_close_matches(first, [s.upper() for s in sections], n=1, cutoff=0.75)
    if close and "_" in rest:
        raise ConfigError(
            f"environment variable {var}: no section {first.lower()!r} (did you mean "
            f"{ENV_PREFIX}{close[0]}_{rest.split('_', 1)[1]}?); unset it or fix the name"
        )
    return None


def _apply_env(
    raw: dict[str, Any], environ: Mapping[str, str], referenced: Set[str] = frozenset()
) -> dict[str, Any]:
    """Overlay ``SNAPSHOTTER_<SECTION>_<KEY>`` variables on the file's values (the rule for
    which variables count is in the module docstring)."""
    sections = _section_fields()
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    for var in sorted(environ):
        if not var.startswith(ENV_PREFIX) or var in referenced:
            continue
        target = _env_target(var, sections)
        if target is None:
            continue
        section, key = target
        values = out.setdefault(section, {})
        if isinstance(values, dict):
            values[key] = _env_value(environ[var])
    return out


def _resolve_paths(config: Config, base: Path) -> Config:
    path = config.sink.path or ("lake" if config.sink.kind == "spark" else DEFAULT_JSONL)
    if not is_uri(path):
        path = str(base / path)
    update: dict[str, Any] = {"path": path}
    if config.sink.staging_path is not None:
        update["staging_path"] = base / config.sink.staging_path
    sink = config.sink.model_copy(update=update)
    state = config.state.model_copy(update={"dir": base / config.state.dir})
    return config.model_copy(update={"sink": sink, "state": state})


def _problem(error: Mapping[str, Any]) -> str:
    """One pydantic error as ``where: what``; an unknown key with the nearest known one."""
    loc = tuple(str(p) for p in error["loc"])
    where = ".".join(loc) or "top level"
    if error["type"] == "extra_forbidden" and loc:
        sections = _section_fields()
        known = (
            list(Config.model_fields) if len(loc) == 1 else list(sections.get(loc[0], {}).values())
        )
        return f"{where}: unknown key{did_you_mean(loc[-1], known)}"
    if error["type"] == "finite_number":
        return f"{where}: {error['input']!r} is {NOT_FINITE}"
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}"


def parse_config(
    text: str,
    origin: str = "<config>",
    *,
    base_dir: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{origin}: not valid TOML: {exc}") from None
    try:
        env = os.environ if environ is None else environ
        raw = _apply_env(_expand(raw, "", env), env, _referenced(raw))
        config = Config.model_validate(raw)
    except ConfigError as exc:
        raise ConfigError(f"{origin}: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(_problem(e) for e in exc.errors())
        raise ConfigError(f"{origin}: {problems}") from None
    return _resolve_paths(config, base_dir if base_dir is not None else Path.cwd())


def load_config(path: str | Path) -> Config:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    return parse_config(text, str(path), base_dir=path.resolve().parent)

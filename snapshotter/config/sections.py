"""The smaller sections: ``[spark]``, ``[snapshot]``, ``[state]``, ``[metrics]``,
``[notifications]``, ``[signals]``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator, model_validator

from snapshotter.config.common import (
    URL_HOST,
    Section,
    checked_table_name,
    is_loopback,
    pattern,
)

if TYPE_CHECKING:
    from snapshotter.config.sink import SinkConfig
    from snapshotter.config.source import SourceConfig

CONNECT_URL = pattern(
    r"^sc://\S+$",
    'a Spark Connect URL, "sc://HOST:PORT", without spaces',
    show_value=False,  # it may carry a token (sc://host:port/;token=...)
)
TOPIC_NAME = pattern(
    r"^[A-Za-z0-9_.\-]{1,249}$",
    "letters, digits, '_', '.' and '-', at most 249 characters (a Kafka topic name)",
)


class SparkConfig(Section):
    # local[*] (default) or a cluster's master URL (spark://HOST:PORT, yarn, k8s://...): the
    # engine's process is Spark's driver.
    master: str = "local[*]"
    # Spark Connect instead of a driver in this process: "sc://HOST:PORT". The server's own
    # master runs the work; master must then stay unset.
    remote: str | None = Field(default=None, pattern=CONNECT_URL)
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
        found = URL_HOST.match(url)
        return found is None or not is_loopback(found.group(1) or found.group(2))


class SnapshotConfig(Section):
    # Read each window's key range on Spark executors: cut into this many sub-ranges of
    # [source] chunk_size rows, read by as many Spark tasks at once, their rows written to
    # staging by the executors and landed without passing through the engine. 0: chunks are
    # read by the engine ([source] read_parallelism). Needs [sink] kind = "spark".
    executors: int = Field(default=0, ge=0, le=1024)


class StateConfig(Section):
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


class MetricsConfig(Section):
    # The Prometheus endpoint of `run` / `resume` (http://host:port/metrics). None: off.
    # 0: a free port the system picks (logged at start; for tests).
    port: int | None = Field(default=None, ge=0, le=65_535)
    # The address it listens on; the loopback by default (the endpoint has no
    # authentication: "0.0.0.0" exposes it to the network).
    host: str = Field(default="127.0.0.1", min_length=1)


class NotificationsConfig(Section):
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
    topic: str | None = Field(default=None, pattern=TOPIC_NAME)

    @field_validator("table")
    @classmethod
    def _table_parses(cls, value: str) -> str:
        return checked_table_name(value)

    @field_validator("channels")
    @classmethod
    def _once_each(cls, value: list[str]) -> list[str]:
        return list(dict.fromkeys(value))


SignalChannel = Literal["table", "source", "file", "kafka"]


def _table_channel() -> list[SignalChannel]:
    return ["table"]


class SignalsConfig(Section):
    # Where the engine reads signals (execute-snapshot, stop-snapshot, pause-snapshot, ...),
    # Debezium's channel names (signal.enabled.channels): "source" or "table" (rows of the
    # source's signal table, read from the log in order), "file" (JSON lines appended to
    # `file`, one signal each, Debezium's shape: {"id": ..., "type": ..., "data": {...}}),
    # "kafka" (messages of that shape on partition 0 of `kafka_topic`, keyed by the
    # pipeline's name, [source] name). `snapshotter signal` writes to the first one listed.
    # The signal table stays the home of the watermark rows whatever the channels.
    channels: list[SignalChannel] = Field(default_factory=_table_channel, min_length=1)
    # The file channel's file (relative: to the configuration file's directory). Read from
    # where the last checkpoint left it, so each line is acted on once across restarts;
    # the engine never writes it.
    file: Path | None = None
    # The Kafka channel's topic (Debezium's signal.kafka.topic); unset: "<source name>-signal".
    kafka_topic: str | None = Field(default=None, pattern=TOPIC_NAME)
    # Its brokers, "host:port[,host:port...]"; unset: the Kafka sink's bootstrap_servers.
    kafka_bootstrap_servers: str | None = Field(default=None, min_length=1)

    @field_validator("channels")
    @classmethod
    def _once_each(cls, value: list[str]) -> list[str]:
        # "source" is Debezium's name for the table channel.
        return list(dict.fromkeys("table" if v == "source" else v for v in value))

    @model_validator(mode="after")
    def _file_named(self) -> SignalsConfig:
        if "file" in self.channels and self.file is None:
            raise ValueError(
                'channels lists "file" but no file is named: set file = "signals.jsonl" '
                "(JSON lines, one signal each)"
            )
        return self

    def topic_for(self, source: SourceConfig) -> str:
        """The Kafka channel's topic."""
        return self.kafka_topic or f"{source.topic_prefix}-signal"

    def bootstrap_servers_for(self, sink: SinkConfig) -> str | None:
        """The Kafka channel's brokers (None: none named)."""
        if self.kafka_bootstrap_servers:
            return self.kafka_bootstrap_servers
        return sink.bootstrap_servers if sink.kind == "kafka" else None

"""The whole file's model: every section, and the rules that span sections."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from signals.names import TableId, parse_table_name, parse_table_selector
from snapshotter.config.common import Section, is_uri
from snapshotter.config.sections import (
    MetricsConfig,
    NotificationsConfig,
    SignalsConfig,
    SnapshotConfig,
    SparkConfig,
    StateConfig,
)
from snapshotter.config.sink import SinkConfig
from snapshotter.config.source import SOURCE_MODELS, SourceConfig, SpannerSource


class Config(Section):
    source: SourceConfig
    sink: SinkConfig = Field(default_factory=SinkConfig)
    state: StateConfig = Field(default_factory=StateConfig)
    spark: SparkConfig = Field(default_factory=SparkConfig)
    snapshot: SnapshotConfig = Field(default_factory=SnapshotConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    notifications: NotificationsConfig = Field(default_factory=NotificationsConfig)
    signals: SignalsConfig = Field(default_factory=SignalsConfig)

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
    def _signal_brokers_named(self) -> Config:
        if "kafka" in self.signals.channels and not self.signals.bootstrap_servers_for(self.sink):
            raise ValueError(
                'signals.channels lists "kafka" but no brokers are named: set [signals] '
                'kafka_bootstrap_servers = "host:9092" (or use the Kafka sink, whose brokers '
                "it then reads)"
            )
        return self

    @model_validator(mode="after")
    def _spanner_supports(self) -> Config:
        if not isinstance(self.source, SpannerSource):
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


# Per section of the file, the models its keys come from ([source]: one per kind).
SECTION_MODELS: dict[str, tuple[type[Section], ...]] = {
    "source": SOURCE_MODELS,
    "sink": (SinkConfig,),
    "state": (StateConfig,),
    "spark": (SparkConfig,),
    "snapshot": (SnapshotConfig,),
    "metrics": (MetricsConfig,),
    "notifications": (NotificationsConfig,),
}

"""``[sink]``: where events go (JSONL, Spark, Kafka)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from snapshotter.config.common import NOT_FINITE, ConfigError, Section, is_uri, pattern
from snapshotter.config.kafka import (
    KAFKA_RESERVED,
    ClientChoice,
    KafkaClient,
    choose_client,
    kafka_setting_problem,
    settings_client,
)

CATALOG_NAME = pattern(
    r"^[A-Za-z_][A-Za-z0-9_]*$",
    "a letter or underscore, then letters, digits and underscores (a Spark catalog name)",
)


class SinkConfig(Section):
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
    catalog: str | None = Field(default=None, min_length=1, pattern=CATALOG_NAME)
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
    # kafka: the client library. "auto": confluent-kafka when it imports, else kafka-python
    # (but the one whose names the kafka settings below are written in, when there are any:
    # config.kafka.choose_client); the sink logs which. "kafka-python" (pure Python) or
    # "confluent" (confluent-kafka, librdkafka in C: ~9x less CPU per message). Either keeps
    # the same guarantees and message bytes.
    client: ClientChoice = "auto"
    # kafka: more client settings, the chosen client's own: kafka-python's
    # (security_protocol, sasl_*, ssl_*, linger_ms, compression_type...; each client -
    # producer, admin, the verify consumer - takes the ones it knows) or, with client =
    # "confluent" (or "auto" and dotted names), librdkafka's ("security.protocol",
    # "sasl.username", "linger.ms"...).
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
        client = info.data.get("client", "auto")
        if client == "auto":  # the names decide (choose_client), not what imports here
            client = settings_client(value) or "kafka-python"
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
    def kafka_client(self) -> KafkaClient:
        """kafka: the client the sink runs on (``client``, "auto" resolved: choose_client)."""
        return choose_client(self.client, self.kafka)[0]

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

"""The configured sink, by ``[sink] kind``: the one place that reads the kind to build a sink
(each sink's module is imported when asked for: a JSONL run never loads Kafka or Spark)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from signals.names import TableId
from snapshotter.config import Config
from snapshotter.config.kafka import CLIENT_PACKAGES, choose_client
from snapshotter.sinks.base import Sink
from snapshotter.sources.base import TableSchema

log = logging.getLogger(__name__)

Describe = Callable[[TableId], TableSchema]
KeyNames = Callable[[TableId], Sequence[str]]


def _jsonl(config: Config, describe: Describe, key_names: KeyNames) -> Sink:
    from snapshotter.sinks.jsonl import JsonlSink

    return JsonlSink(config.sink.local_path, config.source.topic_prefix, key_columns=key_names)


def _kafka(config: Config, describe: Describe, key_names: KeyNames) -> Sink:
    from snapshotter.sinks.kafka.sink import KafkaSink

    sink = config.sink
    client, why = choose_client(sink.client, sink.kafka)
    log.info("kafka sink: the %s client (%s)", CLIENT_PACKAGES[client], why)
    return KafkaSink(
        bootstrap_servers=sink.bootstrap_servers,
        topic_prefix=config.source.topic_prefix,
        key_columns=key_names,
        describe=describe,
        partitions=sink.partitions,
        replication=sink.replication,
        schemas=sink.schemas,
        json_as_text=sink.json_as_text,
        settings=sink.kafka,
        max_unflushed_bytes=sink.max_unacked_mb * 1024 * 1024,
        client=client,
    )


def _spark(config: Config, describe: Describe, key_names: KeyNames) -> Sink:
    from snapshotter.sinks.spark.sink import SparkSink

    return SparkSink.from_config(config, describe=describe, key_columns=key_names)


_SINKS: dict[str, Callable[[Config, Describe, KeyNames], Sink]] = {
    "jsonl": _jsonl,
    "kafka": _kafka,
    "spark": _spark,
}


def sink_for(config: Config, describe: Describe, key_names: KeyNames) -> Sink:
    """The sink ``[sink] kind`` names. ``describe`` gives a table's columns (Kafka's
    schemas, Spark's landed types); ``key_names`` the columns a table's events are keyed by
    (the engine's, which a signal's surrogate key can change)."""
    return _SINKS[config.sink.kind](config, describe, key_names)

"""Kafka helpers of the end-to-end bench (kafka-python's admin and consumer): the broker's
presence, a topic's message count, deleting a run's topics."""

from __future__ import annotations

import sys
from typing import Any

from signals.names import TableId


def servers(bootstrap: str) -> list[str]:
    return [s.strip() for s in bootstrap.split(",") if s.strip()]


def topic(prefix: str, schema: str, table: str) -> str:
    from snapshotter.sinks.kafka.sink import topic_name

    return topic_name(prefix, TableId(schema, table))


def admin(bootstrap: str) -> Any:
    from kafka.admin import KafkaAdminClient

    return KafkaAdminClient(bootstrap_servers=servers(bootstrap), request_timeout_ms=30_000)


def check_broker(bootstrap: str) -> None:
    """Fail early, with a hint, when no broker answers."""
    from kafka.errors import KafkaError

    try:
        admin(bootstrap).close()
    except KafkaError as exc:
        sys.exit(
            f"no Kafka broker at {bootstrap} ({type(exc).__name__}: {exc}): start one with "
            "scripts/services up kafka, pass --bootstrap, or leave kafka out of --sinks"
        )


def message_count(bootstrap: str, name: str) -> int:
    """End offset minus beginning offset, summed over the partitions (no transactions, so
    one offset per message)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=servers(bootstrap), enable_auto_commit=False, group_id=None
    )
    try:
        partitions = [TopicPartition(name, p) for p in consumer.partitions_for_topic(name) or ()]
        end = consumer.end_offsets(partitions)
        begin = consumer.beginning_offsets(partitions)
        return sum(end[tp] - begin[tp] for tp in partitions)
    finally:
        consumer.close()


def delete_topics(bootstrap: str, prefix: str) -> list[str]:
    """Delete every topic whose name starts with ``prefix``."""
    client = admin(bootstrap)
    try:
        names = sorted(t for t in client.list_topics() if t.startswith(prefix))
        if names:
            client.delete_topics(names, raise_errors=False)
        return names
    finally:
        client.close()

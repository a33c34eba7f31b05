"""The Kafka broker scripts/services starts takes topics, keyed writes and reads them back."""

from __future__ import annotations

import subprocess
import uuid
from collections import defaultdict

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from tests.conftest import REPO

pytestmark = pytest.mark.integration


def test_topic_with_partitions_keeps_per_key_order(kafka_bootstrap: str) -> None:
    topic = f"t_{uuid.uuid4().hex[:12]}"
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, request_timeout_ms=30000)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])
        producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", retries=5)
        keys = [f"key-{i}".encode() for i in range(6)]
        sent: dict[bytes, list[bytes]] = defaultdict(list)
        try:
            for seq in range(5):
                for key in keys:
                    value = f"{key.decode()}:{seq}".encode()
                    producer.send(topic, key=key, value=value).get(timeout=30)
                    sent[key].append(value)
            producer.flush()
        finally:
            producer.close()

        consumer = KafkaConsumer(
            bootstrap_servers=kafka_bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            consumer_timeout_ms=10000,
        )
        try:
            partitions = [TopicPartition(topic, p) for p in range(3)]
            consumer.assign(partitions)
            consumer.seek_to_beginning(*partitions)
            got: dict[bytes, list[bytes]] = defaultdict(list)
            partition_of: dict[bytes, set[int]] = defaultdict(set)
            total = sum(len(v) for v in sent.values())
            for count, record in enumerate(consumer, start=1):
                got[record.key].append(record.value)
                partition_of[record.key].add(record.partition)
                if count == total:
                    break
        finally:
            consumer.close()

        assert dict(got) == dict(sent)  # every message, each key's in the order sent
        assert all(len(p) == 1 for p in partition_of.values())  # a key stays on one partition
        described = admin.describe_topics([topic])
        assert len(described[0]["partitions"]) == 3
    finally:
        try:
            admin.delete_topics([topic])
        finally:
            admin.close()


def test_services_status_reports_kafka_running(kafka_bootstrap: str) -> None:
    result = subprocess.run(
        [str(REPO / "scripts" / "services"), "status", "kafka"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert f"kafka: up at {kafka_bootstrap}" in result.stderr, result.stderr

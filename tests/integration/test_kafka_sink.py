"""The Kafka sink's errors and topic handling on the real broker: what the user sees when the
brokers refuse a topic or cannot be reached, and an existing topic used as it is; with each
client (kafka-python, confluent-kafka), and a key's partition kept when the client changes."""

from __future__ import annotations

import logging
import socket
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from kafka.admin import KafkaAdminClient

from snapshotter.sinks.kafka.sink import KafkaSinkError
from tests.integration.engine_harness import Capture

pytestmark = pytest.mark.integration

CLIENTS = ["kafka-python", "confluent"]


@pytest.fixture(params=CLIENTS)
def client(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name == "confluent":
        pytest.importorskip("confluent_kafka")
    return name


def _table(cap: Capture, rows: int = 50) -> str:
    with psycopg.connect(cap.url, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{cap.schema}".t (id int PRIMARY KEY, v text)')
        conn.execute(f'ALTER TABLE "{cap.schema}".t REPLICA IDENTITY FULL')  # TOAST-able v
        conn.execute(
            f"INSERT INTO \"{cap.schema}\".t SELECT g, 'v' || g FROM generate_series(1, {rows}) g"
        )
    return f"{cap.schema}.t"


def _failure_of_a_snapshot(cap: Capture) -> str:
    """Snapshot a small table; the engine must stop with a KafkaSinkError: its message."""
    table = _table(cap)
    cap.init()
    cap.execute(table)
    with pytest.raises(KafkaSinkError) as failure:
        cap.run(timeout=120)
    return str(failure.value)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_a_replication_factor_the_cluster_cannot_give_stops_with_the_reason(
    capture: Any, kafka_bootstrap: str, client: str
) -> None:
    cap: Capture = capture(
        sink="kafka", kafka_bootstrap=kafka_bootstrap, kafka_partitions=1, kafka_client=client
    )
    cap.config_path.write_text(
        cap.config_path.read_text().replace("partitions = 1", "partitions = 1\nreplication = 3")
    )
    message = _failure_of_a_snapshot(cap)
    assert f"cannot create topic {cap.topic('t')}" in message, message
    assert "replication 3" in message and "InvalidReplicationFactor" in message, message
    assert "set [sink] replication to at most the number of brokers" in message, message


def test_an_existing_topic_is_used_as_it_is(
    capture: Any, kafka_bootstrap: str, caplog: pytest.LogCaptureFixture, client: str
) -> None:
    cap: Capture = capture(
        sink="kafka", kafka_bootstrap=kafka_bootstrap, kafka_partitions=3, kafka_client=client
    )
    table = _table(cap)
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        admin.create_topics(
            {cap.topic("t"): {"num_partitions": 2, "replication_factor": 1}},
            wait_for_metadata=True,
        )
    finally:
        admin.close()
    cap.init()
    cap.execute(table)
    with caplog.at_level(logging.WARNING, logger="snapshotter.sinks.kafka.topics"):
        assert cap.run(timeout=120) == 0
    assert "exists with 2 partitions ([sink] partitions = 3); using it as it is" in caplog.text
    verdict = cap.verify("t")
    assert verdict.ok and verdict.table_rows == 50, verdict.render()


def test_unreachable_brokers_are_named_in_the_error(
    capture: Any, tmp_path: Path, client: str
) -> None:
    bootstrap = f"127.0.0.1:{_closed_port()}"
    settings = {
        "kafka-python": "{bootstrap_timeout_ms = 3000, request_timeout_ms = 3000}",
        "confluent": '{"socket.timeout.ms" = 3000}',
    }
    cap: Capture = capture(
        sink="kafka",
        kafka_bootstrap=bootstrap,
        kafka_settings=settings[client],
        kafka_client=client,
    )
    message = _failure_of_a_snapshot(cap)
    assert f"cannot reach the Kafka brokers at {bootstrap}" in message, message
    assert "check [sink] bootstrap_servers" in message, message


@pytest.mark.parametrize(
    ("first", "then"),
    [("kafka-python", "kafka-python"), ("confluent", "confluent"), ("kafka-python", "confluent")],
)
def test_topics_are_named_after_the_source_and_keys_keep_their_partition(
    capture: Any, kafka_bootstrap: str, first: str, then: str
) -> None:
    """A composite key, 3 partitions: the key is {"a": ..., "b": ...} in key order, and
    the same key (updated, deleted) always lands on the same partition, also when the run
    that follows the snapshot uses the other client (both partition by murmur2)."""
    from tests.integration.test_convergence import consume_all

    if "confluent" in (first, then):
        pytest.importorskip("confluent_kafka")
    cap: Capture = capture(
        sink="kafka", kafka_bootstrap=kafka_bootstrap, kafka_partitions=3, kafka_client=first
    )
    tag = uuid.uuid4().hex[:6]
    with psycopg.connect(cap.url, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{cap.schema}".c (b text, a int, v int, PRIMARY KEY (a, b))')
        conn.execute(f'ALTER TABLE "{cap.schema}".c REPLICA IDENTITY FULL')  # TOAST-able b
        conn.execute(
            f"INSERT INTO \"{cap.schema}\".c SELECT '{tag}' || g, g, 0 "
            "FROM generate_series(1, 300) g"
        )
    cap.init()
    cap.execute(f"{cap.schema}.c")
    assert cap.run(timeout=120) == 0
    with psycopg.connect(cap.url, autocommit=True) as conn:
        conn.execute(f'UPDATE "{cap.schema}".c SET v = v + 1')
        conn.execute(f'DELETE FROM "{cap.schema}".c WHERE a % 2 = 0')
    cap.config_path.write_text(
        cap.config_path.read_text().replace(f'client = "{first}"', f'client = "{then}"')
    )
    assert cap.run(timeout=120) == 0
    messages = consume_all(kafka_bootstrap, cap.topic("c"))
    assert cap.topic("c").endswith(f".{cap.schema}.c")
    partitions: dict[bytes, set[int]] = {}
    for partition, _, key, _ in messages:
        assert key is not None
        assert key.decode().startswith('{"a":'), key  # key order, not column order
        partitions.setdefault(key, set()).add(partition)
    assert len(partitions) == 300
    assert all(len(p) == 1 for p in partitions.values())
    assert len({p for ps in partitions.values() for p in ps}) == 3
    # 300 r + 300 u + 150 d + 150 tombstones
    assert len(messages) == 900, len(messages)

"""The settings ``[sink] kafka = {...}`` may pass to a Kafka client, and which are refused;
which client ``[sink] client = "auto"`` picks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from snapshotter.common.librdkafka import did_you_mean

# The two clients the Kafka sink runs on (the sink's own Literal, snapshotter.sinks.kafka.
# clients.Client, is the same), and what [sink] client may say: either, or "auto".
KafkaClient = Literal["kafka-python", "confluent"]
ClientChoice = Literal["auto", "kafka-python", "confluent"]
CLIENT_PACKAGES: dict[KafkaClient, str] = {
    "kafka-python": "kafka-python",
    "confluent": "confluent-kafka",
}

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


def settings_client(settings: Mapping[str, object]) -> KafkaClient | None:
    """Whose names ``[sink] kafka`` is written in: librdkafka's when a name has a dot
    (``"linger.ms"``), kafka-python's when none has (``linger_ms``); None when it is empty.
    ``client = "auto"`` follows it, so settings are never read as the other client's."""
    if not settings:
        return None
    return "confluent" if any("." in name for name in settings) else "kafka-python"


def confluent_imports() -> bool:
    """Whether ``import confluent_kafka`` works (the package and its librdkafka)."""
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        return False
    return True


def choose_client(client: ClientChoice, settings: Mapping[str, object]) -> tuple[KafkaClient, str]:
    """The client the Kafka sink runs on, and why (the sink logs both). ``"auto"``: the one
    the ``[sink] kafka`` settings are written for, if any; else confluent-kafka when it
    imports (about a ninth of kafka-python's CPU per message), else kafka-python. Either
    client writes the same bytes to the same partitions, so the choice may change between
    runs."""
    if client != "auto":
        return client, f'[sink] client = "{client}"'
    written = settings_client(settings)
    if written == "kafka-python":
        return written, 'client = "auto": the [sink] kafka settings are kafka-python\'s names'
    if written == "confluent":
        return written, 'client = "auto": the [sink] kafka settings are librdkafka\'s names'
    if confluent_imports():
        return "confluent", 'client = "auto": confluent_kafka imports'
    return "kafka-python", (
        'client = "auto": confluent_kafka does not import, so kafka-python (pip install '
        "confluent-kafka for about a ninth of the CPU per message)"
    )

"""The settings ``[sink] kafka = {...}`` may pass to a Kafka client, and which are refused."""

from __future__ import annotations

from snapshotter.common.librdkafka import did_you_mean

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

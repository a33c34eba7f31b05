"""What librdkafka (the ``confluent`` Kafka client) may be given in ``[sink] kafka``: the
settings the sink's promises rest on, those a config file cannot hold, and librdkafka's own
judgement of the rest. Shared by the config, which refuses bad keys when it loads, and by the
Kafka sink, which builds its producer from them."""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable, Mapping
from typing import Any


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean X?)`` for the nearest known name, or nothing."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


CONFLUENT_FIXED: dict[str, Any] = {
    "acks": "all",
    "enable.idempotence": True,
    "max.in.flight.requests.per.connection": 5,
    "partitioner": "murmur2_random",  # Java's (and kafka-python's) partition of a key
}
# librdkafka settings the config refuses: the sink's promises rest on them (and their
# aliases), or they take Python callables, which a config file cannot give.
CONFLUENT_RESERVED = frozenset(
    {
        *CONFLUENT_FIXED,
        "bootstrap.servers",
        "metadata.broker.list",
        "request.required.acks",
        "max.in.flight",
        "delivery.report.only.error",  # acknowledgements come from delivery reports
        "transactional.id",
        "enable.gapless.guarantee",
        "retries",
        "message.send.max.retries",
        "group.id",  # the verify consumer's
        "enable.auto.commit",
    }
)
CONFLUENT_OBJECT_SETTINGS = frozenset(
    {
        "on_delivery",
        "error_cb",
        "stats_cb",
        "throttle_cb",
        "oauth_cb",
        "logger",
        "on_commit",
        "dr_cb",
        "dr_msg_cb",
    }
)
# For "did you mean": the librdkafka settings people set most (any property librdkafka
# knows is accepted; see its CONFIGURATION.md).
CONFLUENT_COMMON = (
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "sasl.password",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.password",
    "ssl.endpoint.identification.algorithm",
    "enable.ssl.certificate.verification",
    "client.id",
    "linger.ms",
    "batch.size",
    "batch.num.messages",
    "compression.type",
    "compression.codec",
    "message.max.bytes",
    "request.timeout.ms",
    "delivery.timeout.ms",
    "message.timeout.ms",
    "socket.timeout.ms",
    "socket.connection.setup.timeout.ms",
    "queue.buffering.max.messages",
    "queue.buffering.max.kbytes",
    "queue.buffering.max.ms",
    "retries",
    "retry.backoff.ms",
    "statistics.interval.ms",
    "debug",
    "fetch.max.bytes",
    "fetch.min.bytes",
)


def confluent_missing() -> str:
    return (
        'the confluent client ([sink] client = "confluent", or "auto" with librdkafka\'s dotted '
        "names in [sink] kafka) needs the confluent-kafka package, which does not import here: "
        'pip install confluent-kafka, or set client = "kafka-python" with kafka-python\'s names'
    )


def _librdkafka_refusal(settings: Mapping[str, Any]) -> str | None:
    """What librdkafka says of a client built with these settings (None: it takes them).
    Building a client checks every property; it connects to nothing until asked."""
    try:
        import confluent_kafka as confluent
    except ImportError:
        return confluent_missing()
    try:
        confluent.Producer(
            {**settings, "logger": logging.getLogger("snapshotter.sinks.kafka.clients.check")}
        )
    except confluent.KafkaException as exc:
        text: str = exc.args[0].str() if exc.args else str(exc)
        return text
    except (TypeError, ValueError) as exc:
        return str(exc)
    return None


def confluent_setting_problem(name: str, value: Any) -> str | None:
    """Why ``[sink] kafka`` cannot hold librdkafka setting ``name = value`` (None: it can, as
    far as the setting alone tells; :func:`confluent_settings_problem` judges them together).
    librdkafka itself judges the name and the value."""
    if name in CONFLUENT_OBJECT_SETTINGS:
        return f"{name}: takes a Python object, which a config file cannot give"
    refusal = _librdkafka_refusal({name: value})
    if refusal is None:
        return None
    if "No such configuration property" in refusal:
        return (
            f"{name}: not a librdkafka setting{did_you_mean(name, CONFLUENT_COMMON)}; "
            'with client = "confluent" the keys are librdkafka\'s (security.protocol, '
            "sasl.mechanism, ssl.ca.location...)"
        )
    if "Failed to create" in refusal:  # needs other settings beside it: judged together
        return None
    return f"{name}: {refusal}"


def confluent_settings_problem(settings: Mapping[str, Any]) -> str | None:
    """Why librdkafka refuses these settings together (one alone may need another, e.g.
    ``security.protocol = "SASL_SSL"`` a ``sasl.mechanism``); None: it takes them."""
    refusal = _librdkafka_refusal(settings)
    return None if refusal is None else f"librdkafka refuses these settings: {refusal}"

"""The Kafka client behind the Kafka sink: confluent-kafka (librdkafka, ``[sink] client =
"confluent"``) or kafka-python (``client = "kafka-python"``); ``"auto"``, the default, picks
one (``snapshotter.config.kafka.choose_client``: confluent-kafka when it imports).

Both give the sink the same promises: an idempotent producer with ``acks=all`` and at most 5
requests in flight (so retries neither reorder nor duplicate a partition's messages), keys
partitioned by murmur2 as Java clients do (librdkafka's ``murmur2_random`` computes the same
partition as kafka-python's default partitioner, so a run resumed with the other client
keeps every key on its partition), and sends grouped by checkpoint: a :class:`Sends` group
is settled once Kafka acknowledged every message in it.

Why two: kafka-python's ``send`` costs about 25 µs of Python per message (measured: ~40k
messages per CPU-second, the whole engine thread's budget); librdkafka's ``produce`` about
2 µs, with batching, compression and acknowledgements in its own C threads.

``[sink] kafka`` settings are the chosen client's own: kafka-python's names
(``security_protocol``...) or librdkafka's (``security.protocol``...). The confluent client
family does all the sink's talking to Kafka (producer, topic creation, the verify consumer),
so one set of settings serves all three.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from snapshotter.common.librdkafka import CONFLUENT_FIXED, confluent_missing

log = logging.getLogger(__name__)

Client = Literal["kafka-python", "confluent"]

# kafka-python producer settings the user may change with [sink] kafka = {...}.
PRODUCER_DEFAULTS: dict[str, Any] = {
    "linger_ms": 20,  # fill batches: a change stream comes in bursts
    "batch_size": 256 * 1024,
    "max_request_size": 1024 * 1024,  # the broker's default message.max.bytes
    "request_timeout_ms": 30_000,
    "delivery_timeout_ms": 120_000,
}
# Settings the sink's promises rest on (config refuses overriding them).
PRODUCER_FIXED: dict[str, Any] = {
    "acks": "all",
    "enable_idempotence": True,
    "max_in_flight_requests_per_connection": 5,  # the most idempotence keeps in order
}

# The same for librdkafka.
CONFLUENT_DEFAULTS: dict[str, Any] = {
    "linger.ms": 20,
    "request.timeout.ms": 30_000,
    "delivery.timeout.ms": 120_000,  # librdkafka's message.timeout.ms
    # librdkafka refuses to queue past 100k messages by default: the sink bounds what is
    # unacknowledged in bytes itself ([sink] max_unacked_mb), so allow many small ones.
    "queue.buffering.max.messages": 2_000_000,
}


class ClientError(Exception):
    """A client refused or failed a request; the sink words the message."""


class Unreachable(ClientError):
    """No broker answered."""


class TooLarge(ClientError):
    """A message larger than the producer allows (``setting`` raises the bound)."""

    def __init__(self, setting: str) -> None:
        super().__init__(setting)
        self.setting = setting


class SendTimeout(ClientError):
    """The client took no message in time (metadata never came, the queue stayed full)."""


class TopicError(ClientError):
    """Kafka refused to create a topic: the protocol's error code and message."""

    def __init__(self, code: int, message: str | None) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message


class Sends(Protocol):
    """The messages sent between two checkpoints."""

    def __len__(self) -> int: ...

    def settled(self) -> bool:
        """Whether Kafka acknowledged all of them; raises ClientError when one failed."""
        ...


class Producer(Protocol):
    def send(
        self, topic: str, key: bytes | None, value: bytes | None, partition: int | None
    ) -> None:
        """Queue one message (ClientError subclasses when it cannot be)."""
        ...

    def cut(self) -> Sends:
        """The group of messages sent since the previous cut."""
        ...

    def serve(self) -> None:
        """Let acknowledgements arrive (librdkafka reports them on poll)."""
        ...

    def flush(self, timeout: float) -> bool:
        """Wait until every message sent was acknowledged or failed; False on timeout."""
        ...

    def close(self, timeout: float) -> None:
        """Close, dropping what is still unsent after ``timeout``."""
        ...


class Admin(Protocol):
    def ensure_topic(self, name: str, partitions: int, replication: int) -> int | None:
        """Create the topic; None when it was created, else the partition count of the
        topic that already exists (TopicError when Kafka refuses)."""
        ...

    def close(self) -> None: ...


def servers(bootstrap: str) -> list[str]:
    return [s.strip() for s in bootstrap.split(",") if s.strip()]


# --- kafka-python ---------------------------------------------------------------------------


def client_settings(client: type, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The settings a kafka-python client class knows (each client refuses unknown ones;
    the config refuses a setting that no client knows)."""
    known = getattr(client, "DEFAULT_CONFIG", {})
    return {k: v for k, v in settings.items() if k in known}


@dataclass(slots=True)
class _Futures:
    """kafka-python's per-message futures, checked in order."""

    futures: list[Any]
    done: int = 0  # futures[:done] are acknowledged

    def __len__(self) -> int:
        return len(self.futures)

    def settled(self) -> bool:
        futures = self.futures
        while self.done < len(futures) and futures[self.done].is_done:
            future = futures[self.done]
            if future.failed():
                exc = future.exception
                raise ClientError(f"{type(exc).__name__}: {exc}")
            self.done += 1
        return self.done == len(futures)


class KafkaPythonProducer:
    """kafka-python's ``KafkaProducer`` (or a stand-in with its ``send``/``flush``/``close``)."""

    def __init__(self, producer: Any) -> None:
        from kafka.errors import KafkaError, KafkaTimeoutError, MessageSizeTooLargeError

        self._producer = producer
        self._futures: list[Any] = []
        self._errors = (MessageSizeTooLargeError, KafkaTimeoutError, KafkaError)

    @classmethod
    def connect(cls, bootstrap: str, settings: Mapping[str, Any]) -> KafkaPythonProducer:
        from kafka import KafkaProducer
        from kafka.errors import KafkaError

        config = {
            **PRODUCER_DEFAULTS,
            **client_settings(KafkaProducer, settings),
            **PRODUCER_FIXED,
        }
        try:
            return cls(KafkaProducer(bootstrap_servers=servers(bootstrap), **config))
        except KafkaError as exc:
            raise Unreachable(f"{type(exc).__name__}: {exc}") from None

    def send(
        self, topic: str, key: bytes | None, value: bytes | None, partition: int | None
    ) -> None:
        too_large, timeout, failed = self._errors
        try:
            future = self._producer.send(topic, key=key, value=value, partition=partition)
        except too_large:
            raise TooLarge("max_request_size") from None
        except timeout as exc:
            raise SendTimeout(str(exc)) from None
        except failed as exc:
            raise ClientError(str(exc)) from None
        self._futures.append(future)

    def cut(self) -> Sends:
        futures, self._futures = self._futures, []
        return _Futures(futures)

    def serve(self) -> None:
        pass  # kafka-python's sender thread completes the futures itself

    def flush(self, timeout: float) -> bool:
        from kafka.errors import KafkaTimeoutError

        try:
            self._producer.flush(timeout=timeout)
        except KafkaTimeoutError:
            return False
        return True

    def close(self, timeout: float) -> None:
        """Close, dropping what is still unsent after ``timeout`` (kafka-python's close
        raises when its flush times out, before it would force the sender closed)."""
        from kafka.errors import KafkaTimeoutError

        producer = self._producer
        try:
            producer.close(timeout=timeout)
        except KafkaTimeoutError:
            sender = getattr(producer, "_sender", None)
            if sender is not None:
                sender.force_close()
            producer._closed = True  # its __del__ would try (and fail) to flush again


class KafkaPythonAdmin:
    def __init__(self, bootstrap: str, settings: Mapping[str, Any]) -> None:
        from kafka.admin import KafkaAdminClient
        from kafka.errors import KafkaError

        try:
            self._admin = KafkaAdminClient(
                bootstrap_servers=servers(bootstrap),
                **client_settings(KafkaAdminClient, settings),
            )
        except KafkaError as exc:
            raise Unreachable(f"{type(exc).__name__}: {exc}") from None

    def ensure_topic(self, name: str, partitions: int, replication: int) -> int | None:
        from kafka.errors import KafkaError

        admin = self._admin
        try:
            result = admin.create_topics(
                {name: {"num_partitions": partitions, "replication_factor": replication}},
                raise_errors=False,
            )
        except KafkaError as exc:
            raise ClientError(str(exc)) from None
        outcome = result["topics"][0]
        code = outcome["error_code"]
        if code == 0:
            try:  # every partition has a leader before the first send
                admin.wait_for_topics([name])
            except KafkaError as exc:
                raise ClientError(f"created but not ready: {exc}") from None
            return None
        if code != TOPIC_ALREADY_EXISTS:
            raise TopicError(code, outcome.get("error_message"))
        described = admin.describe_topics([name])
        return len(described[0]["partitions"])

    def close(self) -> None:
        self._admin.close()


TOPIC_ALREADY_EXISTS = 36


def error_name(code: int) -> str:
    """A Kafka protocol error code's name as kafka-python has it (``InvalidReplicationFactor
    Error``), for either client."""
    from kafka.errors import for_code

    name: str = for_code(code).__name__
    return name


# --- confluent-kafka (librdkafka) -----------------------------------------------------------


def _confluent() -> Any:
    try:
        import confluent_kafka
    except ImportError:
        raise ClientError(confluent_missing()) from None
    return confluent_kafka


def _quiet(logger_name: str) -> logging.Logger:
    # librdkafka logs to stderr unless given a logger; route its lines to ours.
    return logging.getLogger(f"{__name__}.{logger_name}")


def confluent_config(bootstrap: str, settings: Mapping[str, Any], **more: Any) -> dict[str, Any]:
    return {
        **settings,
        **more,
        "bootstrap.servers": ",".join(servers(bootstrap)),
        "logger": _quiet("librdkafka"),
    }


class _Reports:
    """Delivery reports of one group of librdkafka sends (counted, not kept per message)."""

    __slots__ = ("delivered", "error", "size")

    def __init__(self) -> None:
        self.size = 0
        self.delivered = 0
        self.error: str | None = None

    def report(self, err: Any, msg: Any) -> None:
        if err is not None and self.error is None:
            self.error = f"{err.name()}: {err.str()}"
        self.delivered += 1

    def __len__(self) -> int:
        return self.size

    def settled(self) -> bool:
        if self.error is not None:
            raise ClientError(self.error)
        return self.delivered >= self.size


class ConfluentProducer:
    """confluent-kafka's ``Producer``. Delivery reports arrive on ``poll``/``flush``, each
    counted by the group its message was sent in."""

    POLL_EVERY = 1000  # sends between two polls (delivery reports must not pile up)

    def __init__(self, producer: Any, queue_timeout: float) -> None:
        confluent = _confluent()
        self._producer = producer
        self._group = _Reports()
        self._unpolled = 0
        self._queue_timeout = queue_timeout
        self._kafka_exception = confluent.KafkaException
        self._too_large = confluent.KafkaError.MSG_SIZE_TOO_LARGE

    @classmethod
    def connect(
        cls, bootstrap: str, settings: Mapping[str, Any], max_queued_bytes: int
    ) -> ConfluentProducer:
        confluent = _confluent()
        config = confluent_config(
            bootstrap,
            {
                **CONFLUENT_DEFAULTS,
                # the sink's own bound ([sink] max_unacked_mb) is librdkafka's too
                "queue.buffering.max.kbytes": max(1, max_queued_bytes // 1024),
                **settings,
            },
            **CONFLUENT_FIXED,
        )
        try:
            producer = confluent.Producer(config)
        except confluent.KafkaException as exc:
            raise ClientError(exc.args[0].str() if exc.args else str(exc)) from None
        timeout = float(config.get("socket.timeout.ms", 60_000)) / 1000
        try:  # librdkafka connects lazily: ask for metadata to know the brokers answer
            producer.list_topics(timeout=timeout)
        except confluent.KafkaException as exc:
            raise Unreachable(exc.args[0].str() if exc.args else str(exc)) from None
        delivery_ms = float(config.get("delivery.timeout.ms", 120_000))
        return cls(producer, delivery_ms / 1000)

    def send(
        self, topic: str, key: bytes | None, value: bytes | None, partition: int | None
    ) -> None:
        producer = self._producer
        report = self._group.report
        try:
            try:
                if partition is None:
                    producer.produce(topic, value, key, on_delivery=report)
                else:
                    producer.produce(topic, value, key, partition, on_delivery=report)
            except BufferError:  # librdkafka's queue is full: wait for acknowledgements
                self._wait_for_room(topic, value, key, partition)
        except self._kafka_exception as exc:
            error = exc.args[0]
            if error.code() == self._too_large:
                raise TooLarge("message.max.bytes") from None
            raise ClientError(f"{error.name()}: {error.str()}") from None
        self._group.size += 1
        self._unpolled += 1
        if self._unpolled >= self.POLL_EVERY:
            self._unpolled = 0
            producer.poll(0)

    def _wait_for_room(
        self, topic: str, value: bytes | None, key: bytes | None, partition: int | None
    ) -> None:
        producer = self._producer
        report = self._group.report
        deadline = time.monotonic() + self._queue_timeout
        while True:
            producer.poll(0.05)
            try:
                if partition is None:
                    producer.produce(topic, value, key, on_delivery=report)
                else:
                    producer.produce(topic, value, key, partition, on_delivery=report)
                return
            except BufferError:
                if time.monotonic() > deadline:
                    raise SendTimeout(
                        f"librdkafka's queue stayed full for {self._queue_timeout:.0f} s"
                    ) from None

    def cut(self) -> Sends:
        group, self._group = self._group, _Reports()
        return group

    def serve(self) -> None:
        self._unpolled = 0
        self._producer.poll(0)

    def flush(self, timeout: float) -> bool:
        self._unpolled = 0
        remaining: int = self._producer.flush(timeout)
        return remaining == 0

    def close(self, timeout: float) -> None:
        producer = self._producer
        if producer.flush(timeout):  # messages left: drop them (never acknowledged)
            producer.purge()
            producer.flush(0)


class ConfluentAdmin:
    def __init__(self, bootstrap: str, settings: Mapping[str, Any]) -> None:
        from confluent_kafka.admin import AdminClient

        confluent = _confluent()
        config = confluent_config(bootstrap, settings)
        try:
            self._admin = AdminClient(config)
        except confluent.KafkaException as exc:
            raise ClientError(exc.args[0].str() if exc.args else str(exc)) from None
        self._timeout = float(config.get("socket.timeout.ms", 60_000)) / 1000
        self._exception = confluent.KafkaException

    def ensure_topic(self, name: str, partitions: int, replication: int) -> int | None:
        from confluent_kafka.cimpl import NewTopic

        new = NewTopic(name, num_partitions=partitions, replication_factor=replication)
        try:
            future = self._admin.create_topics(
                [new], operation_timeout=self._timeout, request_timeout=self._timeout
            )[name]
            future.result()
            return None
        except self._exception as exc:
            error = exc.args[0]
            code = error.code()
            if code == TOPIC_ALREADY_EXISTS:
                return self._partition_count(name)
            if code < 0:  # librdkafka's own (transport, timeout)
                if code in _TRANSPORT_CODES:
                    raise Unreachable(f"{error.name()}: {error.str()}") from None
                raise ClientError(f"{error.name()}: {error.str()}") from None
            raise TopicError(code, error.str()) from None

    def _partition_count(self, name: str) -> int:
        try:
            metadata = self._admin.list_topics(topic=name, timeout=self._timeout)
        except self._exception as exc:
            raise ClientError(str(exc.args[0].str())) from None
        return len(metadata.topics[name].partitions)

    def close(self) -> None:
        pass  # the admin client is released with its last reference


_TRANSPORT_CODES = frozenset({-195, -185, -187})  # _TRANSPORT, _TIMED_OUT, _ALL_BROKERS_DOWN


def read_topic_confluent(
    bootstrap: str, topic: str, settings: Mapping[str, Any], timeout_s: float
) -> Iterator[tuple[int, int, bytes | None, bytes | None]]:
    """Every message of ``topic`` up to its end offsets at the start, partition by partition
    in offset order, as ``(partition, offset, key, value)`` (a missing topic has none)."""
    confluent = _confluent()
    consumer = confluent.Consumer(
        confluent_config(
            bootstrap,
            settings,
            **{"group.id": "snapshotter-verify", "enable.auto.commit": False},
        )
    )
    try:
        try:
            metadata = consumer.list_topics(topic=topic, timeout=timeout_s)
        except confluent.KafkaException as exc:
            raise Unreachable(exc.args[0].str() if exc.args else str(exc)) from None
        found = metadata.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            return
        for number in sorted(found.partitions):
            low, high = consumer.get_watermark_offsets(
                confluent.TopicPartition(topic, number), timeout=timeout_s
            )
            if high <= low:
                continue
            partition = confluent.TopicPartition(topic, number, low)
            consumer.assign([partition])
            position = low
            heard = time.monotonic()
            while position < high:
                # consume() waits until it has num_messages or the timeout passed: ask for
                # what is left, in short waits (offsets may have gaps, e.g. compacted ones).
                records = consumer.consume(num_messages=min(10_000, high - position), timeout=0.2)
                for record in records:
                    if record.error() is not None:
                        raise ClientError(f"reading {topic}: {record.error().str()}")
                    offset = record.offset()
                    if offset >= high:
                        break
                    yield number, offset, record.key(), record.value()
                    position = offset + 1
                if records:
                    heard = time.monotonic()
                    continue
                (now_at,) = consumer.position([partition])
                if now_at.offset > position:
                    position = now_at.offset
                elif time.monotonic() - heard > timeout_s:
                    raise ClientError(
                        f"reading {topic} partition {number}: nothing arrived for "
                        f"{timeout_s:g} s at offset {position} of {high}"
                    )
            consumer.unassign()
    finally:
        consumer.close()

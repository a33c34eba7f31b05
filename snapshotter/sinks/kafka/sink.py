"""The Kafka sink: one topic per table, messages a consumer written for Debezium can read.

* Topic ``<prefix>.<schema>.<table>`` (prefix: ``[source] name``), created on first use with
  ``[sink] partitions`` and ``replication`` (an existing topic is used as it is):
  :mod:`snapshotter.sinks.kafka.topics`.
* Key: the primary key as JSON, ``{"id": 7}`` (Debezium's key shape); value: the envelope as
  :mod:`snapshotter.sinks.encoding` writes it, the same text as the JSONL sink's ``value``.
  With ``schemas = true`` both are wrapped as ``{"schema": ..., "payload": ...}`` (Kafka
  Connect's JsonConverter with ``schemas.enable``; :mod:`snapshotter.sinks.kafka.connect_schema`).
* A delete is followed by a tombstone (same key, null value), so a compacted topic can drop
  the key. A truncate has no key: it is sent to every partition of the topic, so each
  partition's consumer sees it in order with that partition's rows.
* Order: the key's bytes choose the partition (murmur2, as Java clients do), so one key always
  goes to one partition; the producer is idempotent with ``acks=all``, so retries can neither
  reorder nor duplicate messages within a partition.
* A chunk's READ rows come as one Arrow batch: keys and values are built column-wise
  (:mod:`snapshotter.sinks.batch_json`), the same bytes as per-row events would give.
* The client is confluent-kafka (librdkafka) or kafka-python, as ``[sink] client`` says
  (``"auto"``: confluent-kafka when it imports): :mod:`snapshotter.sinks.kafka.clients`, same
  promises either way.
* Durability: :meth:`KafkaSink.checkpoint` records the sends made since the previous one and
  does not wait; :meth:`KafkaSink.acknowledged` returns a checkpoint once every send in it
  (and in all before it) was acknowledged by the brokers, so the state records only what
  Kafka has. A topic cannot be cut back: after a crash the log replays everything after the
  last acknowledged checkpoint, and messages sent after it appear again (at least once;
  a consumer that upserts by key converges, see :mod:`snapshotter.verify.kafka`).
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import repeat
from typing import Any

from signals.names import TableId
from snapshotter.common import faults
from snapshotter.common.librdkafka import confluent_settings_problem
from snapshotter.config import kafka_setting_problem
from snapshotter.core.events import ChangeEvent, Op
from snapshotter.core.values import UNAVAILABLE_VALUE, RawJson
from snapshotter.core.window import ReadBatch
from snapshotter.sinks import batch_json
from snapshotter.sinks.base import Ack, SinkItem, in_process
from snapshotter.sinks.encoding import KeyMismatchError, encode_key, encode_value
from snapshotter.sinks.kafka.clients import (
    CONFLUENT_DEFAULTS,
    PRODUCER_DEFAULTS,
    PRODUCER_FIXED,
    Client,
    ClientError,
    ConfluentProducer,
    KafkaPythonProducer,
    Producer,
    Sends,
    SendTimeout,
    TooLarge,
    Unreachable,
    client_settings,
)
from snapshotter.sinks.kafka.topics import KafkaSinkError, Topic, Topics, topic_name, unreachable
from snapshotter.sources.base import TableSchema

__all__ = [
    "PRODUCER_DEFAULTS",
    "PRODUCER_FIXED",
    "KafkaSink",
    "KafkaSinkError",
    "client_settings",
    "topic_name",
]

log = logging.getLogger(__name__)

ACK_SLACK_S = 10.0  # on top of the delivery timeout, before unacknowledged sends are an error

# One message: topic, key, value (None: a tombstone), partition (None: by the key).
Message = tuple[str, bytes | None, bytes | None, int | None]


# The Connect schemas of notification messages (Debezium's SchemaFactory's notification
# key and value schemas), for ``schemas = true``.
_NOTIFICATION_KEY_SCHEMA = {
    "type": "struct",
    "name": "io.debezium.connector.common.NotificationKey",
    "version": 1,
    "optional": False,
    "fields": [{"field": "id", "type": "string", "optional": False}],
}
_NOTIFICATION_VALUE_SCHEMA = {
    "type": "struct",
    "name": "io.debezium.connector.common.Notification",
    "version": 1,
    "optional": False,
    "fields": [
        {"field": "id", "type": "string", "optional": False},
        {"field": "aggregate_type", "type": "string", "optional": False},
        {"field": "type", "type": "string", "optional": False},
        {
            "field": "additional_data",
            "type": "map",
            "keys": {"type": "string", "optional": False},
            "values": {"type": "string", "optional": False},
            "optional": True,
        },
        {"field": "timestamp", "type": "int64", "optional": True},
    ],
}


@dataclass(slots=True)
class _Checkpoint:
    id: int
    sends: Sends
    taken: float  # time.monotonic() when taken


class KafkaSink:
    def __init__(
        self,
        *,
        bootstrap_servers: str,
        topic_prefix: str,
        key_columns: Callable[[TableId], Sequence[str] | None],
        describe: Callable[[TableId], TableSchema] | None = None,
        partitions: int = 1,
        replication: int = 1,
        schemas: bool = False,
        json_as_text: bool = False,
        settings: Mapping[str, Any] | None = None,
        max_unflushed_bytes: int = 64 * 1024 * 1024,
        client: Client = "kafka-python",
    ) -> None:
        if schemas and describe is None:
            raise ValueError("schemas = true needs describe (the table's columns)")
        self._bootstrap = bootstrap_servers
        self._key_columns = key_columns
        self._schemas = schemas
        self._json_text = json_as_text
        self._settings = dict(settings or {})
        self._client = client
        # Checked at config load too; here for sinks built in code: a setting the client does
        # not know (a misspelt security_protocol) must never be dropped silently.
        problems = [
            p
            for name, value in self._settings.items()
            if (p := kafka_setting_problem(name, client=client, value=value))
        ]
        if not problems and client == "confluent" and self._settings:
            together = confluent_settings_problem(self._settings)
            problems = [together] if together else []
        if problems:
            raise KafkaSinkError(f"[sink] kafka: {'; '.join(problems)}")
        self._producer: Producer | None = None
        self._topics = Topics(
            bootstrap_servers=bootstrap_servers,
            settings=self._settings,
            client=client,
            prefix=topic_prefix,
            partitions=partitions,
            replication=replication,
            key_columns=key_columns,
            describe=describe,
            schemas=schemas,
        )
        self._notification_topics: set[str] = set()  # created (or found) already
        self._pending: deque[_Checkpoint] = deque()
        self._checkpoint_id = 0
        self._messages = 0  # acknowledged, over the sink's life (carried by resume)
        self._failure: str | None = None  # why the sink cannot go on
        # kafka-python's producer queues without bound (it has no buffer_memory): past this
        # many bytes sent since everything was last acknowledged, the sink waits for Kafka
        # (and the engine reads no further log meanwhile: backpressure). librdkafka gets the
        # same bound for its queue.
        self._max_unflushed = max_unflushed_bytes
        self._unflushed = 0
        # How long a send may stay unacknowledged before the sink gives up: kafka-python's
        # own delivery timeout does not fire while the broker is unreachable (it keeps
        # retrying), so the sink keeps its own.
        if client == "confluent":
            delivery_ms = self._settings.get(
                "delivery.timeout.ms",
                self._settings.get("message.timeout.ms", CONFLUENT_DEFAULTS["delivery.timeout.ms"]),
            )
        else:
            delivery_ms = self._settings.get(
                "delivery_timeout_ms", PRODUCER_DEFAULTS["delivery_timeout_ms"]
            )
        self._ack_timeout_s = float(delivery_ms) / 1000 + ACK_SLACK_S

    # ------------------------------------------------------------------ Sink protocol

    def open(self, resume: Mapping[str, Any] | None) -> None:
        if self._producer is not None:
            raise KafkaSinkError("the Kafka sink is already open")
        if resume:
            self._messages = int(resume.get("messages", 0))
            log.info(
                "kafka: resuming after %d acknowledged messages; messages sent after the last "
                "acknowledged checkpoint may appear twice (at least once)",
                self._messages,
            )
        try:
            if self._client == "confluent":
                self._producer = ConfluentProducer.connect(
                    self._bootstrap, self._settings, self._max_unflushed
                )
            else:
                self._producer = KafkaPythonProducer.connect(self._bootstrap, self._settings)
        except Unreachable as exc:
            raise KafkaSinkError(unreachable(self._bootstrap, exc)) from None
        except ClientError as exc:
            raise KafkaSinkError(f"cannot start the Kafka producer: {exc}") from None

    def write(self, items: Sequence[SinkItem]) -> None:
        producer = self._producer
        if producer is None:
            raise KafkaSinkError("the Kafka sink is not open")
        names: dict[TableId, tuple[str, ...]] = {}
        messages: list[Message] = []
        for item in map(in_process, items):
            if isinstance(item, ReadBatch):
                if len(item):
                    messages.extend(self._batch_messages(item, names))
            else:
                self._event_messages(item, names, messages)
        if not messages:
            return
        faults.failpoint("sink.flush", before=lambda: self._send_half(messages))
        send = self._send
        limit = self._max_unflushed
        for topic, key, value, partition in messages:
            send(topic, key, value, partition)
            if self._unflushed > limit:
                self._wait_for_kafka()

    def _send_half(self, messages: Sequence[Message]) -> None:
        """Fault suite: half the batch is in Kafka (acknowledged), the rest never sent."""
        for topic, key, value, partition in messages[: len(messages) // 2]:
            self._send(topic, key, value, partition)
        assert self._producer is not None
        self._producer.flush(self._ack_timeout_s)

    def _wait_for_kafka(self) -> None:
        """Wait until Kafka acknowledged everything sent so far (bounds the memory the
        producer's queue holds)."""
        assert self._producer is not None
        if not self._producer.flush(self._ack_timeout_s):
            raise self._fail(
                f"Kafka did not acknowledge {self._unflushed} bytes of messages within "
                f"{self._ack_timeout_s:.0f} s"
            )
        self._unflushed = 0

    def checkpoint(self) -> int:
        if self._producer is None:
            raise KafkaSinkError("the Kafka sink is not open")
        self._checkpoint_id += 1
        self._pending.append(
            _Checkpoint(self._checkpoint_id, self._producer.cut(), time.monotonic())
        )
        return self._checkpoint_id

    def acknowledged(self) -> list[Ack]:
        if self._failure is not None:
            raise KafkaSinkError(self._failure)
        if self._producer is not None:
            self._producer.serve()
        acks = []
        while self._pending:
            head = self._pending[0]
            try:
                settled = head.sends.settled()
            except ClientError as exc:
                raise self._fail(f"Kafka did not acknowledge a message ({exc})") from None
            if not settled:
                waited = time.monotonic() - head.taken
                if waited > self._ack_timeout_s:
                    raise self._fail(
                        f"Kafka did not acknowledge messages sent {waited:.0f} s ago (the "
                        f"brokers at {self._bootstrap} are unreachable or refuse them)"
                    )
                break
            self._pending.popleft()
            self._messages += len(head.sends)
            acks.append(Ack(head.id, {"messages": self._messages}))
        return acks

    def metrics(self) -> Mapping[str, float]:
        """For the metrics endpoint (its thread): reads only (``list`` copies the deque in
        one step; a value one step old is all a scrape needs)."""
        pending = list(self._pending)
        return {
            # sent with a checkpoint Kafka has not acknowledged whole yet
            "unacked_messages": float(sum(len(c.sends) for c in pending)),
            # sent since the producer was last flushed; past the limit the sink waits
            "unflushed_bytes": float(self._unflushed),
            "unflushed_limit_bytes": float(self._max_unflushed),
        }

    def close(self) -> None:
        if self._producer is None:
            return
        try:
            if self._failure is None:
                self.checkpoint()
                self._wait_for_kafka()
        finally:
            self._producer.close(0 if self._failure else 5)
            self._producer = None
            self._topics.close()

    # ------------------------------------------------------------------ messages

    def notify(self, records: Sequence[Mapping[str, Any]], topic: str) -> None:
        """Notification records to ``topic`` (created as the table topics are), as
        Debezium's sink channel sends them: key ``{"id": ...}``, value the record; with
        ``schemas``, wrapped with their Connect schemas."""
        if self._producer is None:
            raise KafkaSinkError("the Kafka sink is not open")
        if topic not in self._notification_topics:
            self._topics.ensure(topic)
            self._notification_topics.add(topic)
        for record in records:
            key = {"id": record["id"]}
            if self._schemas:
                key_out: Any = {"schema": _NOTIFICATION_KEY_SCHEMA, "payload": key}
                value_out: Any = {"schema": _NOTIFICATION_VALUE_SCHEMA, "payload": record}
            else:
                key_out, value_out = key, record
            self._send(
                topic,
                json.dumps(key_out, separators=(",", ":")).encode("utf-8"),
                json.dumps(value_out, separators=(",", ":"), ensure_ascii=False).encode("utf-8"),
                None,
            )

    def _key_names(self, table: TableId, names: dict[TableId, tuple[str, ...]]) -> tuple[str, ...]:
        columns = names.get(table)
        if columns is None:
            found = self._key_columns(table)
            if not found:
                raise KafkaSinkError(f"no key columns known for {table}: cannot write its key")
            columns = names[table] = tuple(found)
        return columns

    def _event_messages(
        self, event: ChangeEvent, names: dict[TableId, tuple[str, ...]], out: list[Message]
    ) -> None:
        table = event.source.table
        topic = self._topics.of(table)
        if self._schemas and event.after is not None:
            self._topics.refresh_shape(topic, table, tuple(event.after))
        value = self._value(topic, event)
        if event.key is None:  # a truncate: to every partition, in order with its rows
            out.extend((topic.name, None, value, p) for p in range(topic.partitions))
            return
        columns = self._key_names(table, names)
        values: tuple[Any, ...] = tuple(event.key)
        if self._json_text and any(type(v) is RawJson for v in values):
            values = tuple(v.text if type(v) is RawJson else v for v in values)
        try:
            key_json = encode_key(columns, values)
        except KeyMismatchError as exc:
            raise KafkaSinkError(f"event for {table}: {exc}") from None
        key = (
            f'{{"schema":{topic.key_schema},"payload":{key_json}}}' if self._schemas else key_json
        ).encode("utf-8")
        out.append((topic.name, key, value, None))
        if event.op is Op.DELETE:
            out.append((topic.name, key, None, None))  # the tombstone

    def _batch_messages(
        self, batch: ReadBatch, names: dict[TableId, tuple[str, ...]]
    ) -> list[Message]:
        """A READ batch's messages, keys and values encoded column-wise (the same bytes as
        its events' messages). READ rows have no tombstone, and no placeholder for an
        unavailable value (a chunk SELECT reads every column)."""
        table = batch.table
        topic = self._topics.of(table)
        if self._schemas:
            self._topics.refresh_shape(topic, table, tuple(batch.rows.column_names))
        columns = self._key_names(table, names)
        if len(columns) != len(batch.key_columns):
            exc = KeyMismatchError(
                f"{len(batch.key_columns)} key values, but the table's key columns are "
                f"{list(columns)}"
            )
            raise KafkaSinkError(f"event for {table}: {exc}")
        try:
            encoded = batch_json.encode_batch(batch, columns, json_text=self._json_text)
        except batch_json.NotColumnar:  # a row converter only rows can go through
            out: list[Message] = []
            for event in batch.events():
                self._event_messages(event, names, out)
            return out
        keys, values = encoded.keys, encoded.values
        if self._schemas:
            keys = batch_json.join(f'{{"schema":{topic.key_schema},"payload":', keys, "}")
            schema = topic.value_schema(batch.template.to_dict())
            values = batch_json.join(f'{{"schema":{schema},"payload":', values, "}")
        return list(
            zip(
                repeat(topic.name),
                batch_json.as_bytes(keys),
                batch_json.as_bytes(values),
                repeat(None),
                strict=False,
            )
        )

    def _send(
        self, topic: str, key: bytes | None, value: bytes | None, partition: int | None
    ) -> None:
        assert self._producer is not None
        try:
            self._producer.send(topic, key, value, partition)
        except TooLarge as exc:
            size = len(value or b"") + len(key or b"")
            self._failure = (
                f"a message of {size} bytes for topic {topic} is larger than the producer "
                f"allows: raise [sink] kafka = {{{exc.setting} = ...}} and the topic's "
                "max.message.bytes (the broker's message.max.bytes), then run again"
            )
            raise KafkaSinkError(self._failure) from None
        except SendTimeout as exc:
            raise self._fail(
                f"the Kafka brokers at {self._bootstrap} took no messages for topic {topic} "
                f"in time ({exc})"
            ) from None
        except ClientError as exc:
            raise self._fail(f"sending to topic {topic} failed: {exc}") from None
        self._unflushed += len(key or b"") + len(value or b"")

    def _value(self, topic: Topic, event: ChangeEvent) -> bytes:
        if not self._schemas:
            return encode_value(event, json_text=self._json_text).encode("utf-8")
        if topic.binary_columns:
            event = _placeholder_as_bytes(event, topic.binary_columns)
        payload = encode_value(event, json_text=self._json_text)
        schema = topic.value_schema(event.source.to_dict())
        return f'{{"schema":{schema},"payload":{payload}}}'.encode()

    # ------------------------------------------------------------------ errors

    def _fail(self, what: str) -> KafkaSinkError:
        """Remember why the sink cannot go on (every later call says it again)."""
        self._failure = (
            f"{what}; the state keeps only what Kafka acknowledged: run again once the brokers "
            "take messages, and what followed is sent again (at least once)"
        )
        return KafkaSinkError(self._failure)


_PLACEHOLDER_BYTES = UNAVAILABLE_VALUE.encode("ascii")


def _placeholder_as_bytes(event: ChangeEvent, columns: Sequence[str]) -> ChangeEvent:
    """The unavailable-value placeholder in a binary column as its bytes (Debezium's way),
    so the payload fits the column's ``bytes`` schema (written as base64)."""

    def fix(row: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        if row is None or not any(row.get(c) == UNAVAILABLE_VALUE for c in columns):
            return row
        return {
            k: _PLACEHOLDER_BYTES if k in columns and v == UNAVAILABLE_VALUE else v
            for k, v in row.items()
        }

    before, after = fix(event.before), fix(event.after)
    if before is event.before and after is event.after:
        return event
    return replace(event, before=before, after=after)

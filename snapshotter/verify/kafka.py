"""Reading a Kafka sink's topic back as current state: what ``snapshotter verify`` does for
the kafka sink, and what a consumer of the topics should do.

The topic is read from the beginning up to the end offsets taken when reading starts, every
partition in offset order, and replayed as a consumer that upserts by key would:

* c/u/r put the row under its key; d removes it; a tombstone (null value) removes it too
  (after compaction it may be all that is left of a delete);
* a truncate (no key; sent to every partition) removes the rows of its partition only: the
  order of a truncate against rows of other partitions is not defined, but each partition
  holds all events of its keys, in order.

Messages are at least once: after a restart the events following the last acknowledged
checkpoint are sent again, so a key's ``source.pos`` may go back. Replaying them again in
order converges (the repeated suffix ends where the first copy did). The check tells a repeat
(an event of this key at this position and op seen before) from a real regression (an event
older than one already seen, never seen itself): only the latter is a violation.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from snapshotter.sinks.kafka.clients import (
    Client,
    ClientError,
    Unreachable,
    client_settings,
    read_topic_confluent,
)
from snapshotter.sinks.kafka.sink import KafkaSinkError
from snapshotter.verify.rows import (
    PLACEHOLDER_TEXT,
    PLACEHOLDER_TEXT_OR_BASE64,
    Materialized,
    PosViolation,
    VerifyError,
    canonical,
)


@dataclass(frozen=True, slots=True)
class Message:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


def read_topic(
    bootstrap_servers: str,
    topic: str,
    settings: Mapping[str, Any] | None = None,
    *,
    timeout_s: float = 60.0,
    client: Client = "kafka-python",
) -> Iterator[Message]:
    """Every message of ``topic`` up to its end offsets at the start, partition by partition
    in offset order (a missing topic has no messages), read with the sink's ``client`` (and
    so with its settings)."""
    if client == "confluent":
        try:
            for number, offset, key, value in read_topic_confluent(
                bootstrap_servers, topic, settings or {}, timeout_s
            ):
                yield Message(number, offset, key, value)
        except Unreachable as exc:
            raise KafkaSinkError(
                f"cannot reach the Kafka brokers at {bootstrap_servers} ({exc}); check [sink] "
                "bootstrap_servers"
            ) from None
        except ClientError as exc:
            raise KafkaSinkError(str(exc)) from None
        return
    from kafka import KafkaConsumer, TopicPartition
    from kafka.errors import KafkaError

    servers = [s.strip() for s in bootstrap_servers.split(",") if s.strip()]
    try:
        consumer = KafkaConsumer(
            bootstrap_servers=servers,
            enable_auto_commit=False,
            group_id=None,
            **client_settings(KafkaConsumer, settings or {}),
        )
    except KafkaError as exc:
        raise KafkaSinkError(
            f"cannot reach the Kafka brokers at {bootstrap_servers} ({exc}); check [sink] "
            "bootstrap_servers"
        ) from None
    try:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            return
        for number in sorted(partitions):
            tp = TopicPartition(topic, number)
            consumer.assign([tp])
            consumer.seek_to_beginning(tp)
            end = consumer.end_offsets([tp])[tp]
            position = consumer.position(tp)
            while position < end:
                batch = consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=10_000)
                records = batch.get(tp, [])
                if not records:
                    raise KafkaSinkError(
                        f"reading {topic} partition {number}: nothing arrived for {timeout_s:g} "
                        f"s at offset {position} of {end}"
                    )
                for record in records:
                    if record.offset >= end:
                        break
                    yield Message(number, record.offset, record.key, record.value)
                position = consumer.position(tp)
    finally:
        consumer.close()


def _payload(data: bytes, where: str, schemas: bool | None) -> Any:
    try:
        decoded = json.loads(data)
    except ValueError as exc:
        raise VerifyError(f"{where}: not JSON: {exc}") from None
    # schemas = true (JsonConverter's envelope): the data is the payload
    wrapped = isinstance(decoded, dict) and decoded.keys() == {"schema", "payload"}
    if schemas or (schemas is None and wrapped):
        if not wrapped:
            raise VerifyError(f"{where}: not a {{schema, payload}} message (schemas = true)")
        return decoded["payload"]
    return decoded


def materialize_messages(
    topic: str, messages: Iterable[Message], *, schemas: bool | None = None
) -> Materialized:
    """Replay a topic's messages (each partition in offset order) as current state.

    ``schemas``: whether messages are wrapped as ``{"schema", "payload"}`` (``[sink]
    schemas``); None tells by each message's shape."""
    out = Materialized(topic)
    # with schemas, a binary column's placeholder is its bytes, in base64
    placeholders = PLACEHOLDER_TEXT if schemas is False else PLACEHOLDER_TEXT_OR_BASE64
    partition_of: dict[str, int] = {}
    last_pos: dict[str, str] = {}
    seen: set[int] = set()
    for message in messages:
        where = f"{topic} partition {message.partition} offset {message.offset}"
        key = None if message.key is None else _payload(message.key, where, schemas)
        if message.value is None:  # a tombstone
            out.ops["tombstone"] += 1
            if key is not None:
                out.remove(canonical(key))
            continue
        value = _payload(message.value, where, schemas)
        try:
            op = value["op"]
            pos = value["source"]["pos"]
        except (KeyError, TypeError):
            raise VerifyError(f"{where}: not a sink event (no op or source.pos)") from None
        if not isinstance(op, str) or not isinstance(pos, str):
            raise VerifyError(f"{where}: op and source.pos must be strings: {op!r}, {pos!r}")
        out.ops[op] += 1
        if op == "t":
            for ck in [ck for ck, p in partition_of.items() if p == message.partition]:
                out.remove(ck)
                del partition_of[ck]
            continue
        if not isinstance(key, dict) or op not in ("c", "u", "r", "d"):
            raise VerifyError(f"{where}: an {op!r} event with key {key!r}")
        ck = canonical(key)
        event_id = hash((ck, pos, op))
        previous = last_pos.get(ck)
        if event_id in seen:  # sent again after a restart
            out.repeats += 1
        elif previous is not None and pos < previous:  # text order of tokens = log order
            out.pos_violations.append(
                PosViolation(key, previous, pos, message.offset, message.partition)
            )
        if previous is None or pos > previous:
            last_pos[ck] = pos
        seen.add(event_id)
        partition_of[ck] = message.partition
        if op == "d":
            out.remove(ck)
            continue
        after = value.get("after")
        if not isinstance(after, dict):
            raise VerifyError(f"{where}: an {op!r} event without an 'after' row")
        out.put(ck, key, after, placeholders)
    return out


def materialize_topic(
    bootstrap_servers: str,
    topic: str,
    settings: Mapping[str, Any] | None = None,
    *,
    schemas: bool | None = None,
    client: Client = "kafka-python",
) -> Materialized:
    """Read ``topic`` from the beginning and replay it (see the module docstring)."""
    messages = read_topic(bootstrap_servers, topic, settings, client=client)
    return materialize_messages(topic, messages, schemas=schemas)

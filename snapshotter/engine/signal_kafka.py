"""The Kafka channel's IO ([signals] channels "kafka"): signal messages on partition 0 of the
signal topic, as Debezium's Kafka signal channel reads them: the message key is the name of
the pipeline they are for (``[source] name``, Debezium's topic prefix; another key is another
pipeline's, skipped with a log line), the value one signal as JSON, ``{"id": ..., "type":
..., "data": {...}}`` (``signals.lines`` parses it).

Read from the offset state holds, saved with the checkpoint that holds what the signals did
(Debezium keeps it in the connector's offsets the same way), so a message acts once across
restarts; without one, from the topic's start. Kafka out of reach is logged (once a minute)
and tried again: the stream never waits for the signal channel."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from signals.lines import SignalLine, parse_line

log = logging.getLogger("snapshotter.engine")

RETRY_S = 60.0  # Kafka out of reach: looked at again (and logged) this often
MAX_RECORDS = 500  # per read
TIMEOUT_MS = 2000  # the longest a call to the brokers may wait
MISSING_RETRY_S = 2.0  # no topic yet: looked for again this often
FIRST_READ_S = 10.0  # the first read waits this long at most for the topic's end


def default_consumer(bootstrap_servers: str) -> Any:
    """A kafka-python consumer of no group (offsets are the engine's, in its state), of a
    plaintext cluster (no client settings yet)."""
    from kafka import KafkaConsumer

    servers = [s.strip() for s in bootstrap_servers.split(",") if s.strip()]
    # An offset the topic no longer holds (retention) starts at its earliest message, not
    # past every message there (kafka-python's default, "latest").
    # Short waits: the engine's thread reads the channel between log reads, so a broker out
    # of reach may hold the stream up for these at most (kafka-python's defaults: 30 s).
    return KafkaConsumer(
        bootstrap_servers=servers,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        bootstrap_timeout_ms=TIMEOUT_MS,
        request_timeout_ms=TIMEOUT_MS,
    )


class KafkaSignals:
    """The Kafka channel's reader (``signal_channels.ChannelReader``)."""

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        pipeline: str,
        offset: int,
        *,
        consumer: Callable[[str], Any] = default_consumer,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.key = f"kafka:{topic}"  # in state's signal_channels
        self.label = f"signal topic {topic}"
        self.offset = offset  # the next message to read
        self._bootstrap = bootstrap_servers
        self._topic = topic
        self._pipeline = pipeline
        self._new_consumer = consumer
        self._clock = clock
        self._consumer: Any = None
        self._end: int | None = None  # the topic's end when opened, until read up to it
        self._partition: Any = None
        self._retry_at = 0.0
        self._missing_logged = False

    def read(self) -> list[SignalLine]:
        """The signal messages for this pipeline since the last read; ``offset`` moves past
        every message read (this pipeline's or not)."""
        if self._consumer is None and not self._open():
            return []
        try:
            batches = self._poll()
        except Exception as exc:
            self._unreachable(exc)
            self.close()
            return []
        found: list[SignalLine] = []
        for batch in batches:
            for record in (r for records in batch.values() for r in records):
                self.offset = record.offset + 1
                key = record.key.decode("utf-8", "replace") if record.key is not None else None
                if key != self._pipeline:
                    log.info(
                        "%s, offset %d: for pipeline %r, not this one (%r); skipped",
                        self.label,
                        record.offset,
                        key,
                        self._pipeline,
                    )
                    continue
                if record.value:  # a tombstone carries no signal
                    found.append(parse_line(record.value, record.offset, f"offset {record.offset}"))
        return found

    def _poll(self) -> list[Any]:
        """What the topic has now; the first time, everything up to the end it had when
        opened (waiting up to ``FIRST_READ_S``): a signal sent before ``run --until-caught-up``
        must act before the engine finds itself caught up."""
        if self._end is None:
            return [self._consumer.poll(timeout_ms=0, max_records=MAX_RECORDS)]
        end, self._end = self._end, None
        deadline = self._clock() + FIRST_READ_S
        polled: list[Any] = []
        while (
            self._consumer.position(self._partition, timeout_ms=TIMEOUT_MS) < end
            and self._clock() < deadline
        ):
            polled.append(self._consumer.poll(timeout_ms=100, max_records=MAX_RECORDS))
        return polled

    def _open(self) -> bool:
        if self._clock() < self._retry_at:
            return False
        from kafka import TopicPartition

        consumer = None
        try:
            consumer = self._new_consumer(self._bootstrap)
            if not consumer.partitions_for_topic(self._topic):
                # No topic yet (`snapshotter signal` creates it): nothing to read, no error.
                consumer.close()
                self._retry_at = self._clock() + MISSING_RETRY_S
                if not self._missing_logged:
                    log.info("%s does not exist yet; waiting for it", self.label)
                    self._missing_logged = True
                return False
            partition = self._partition = TopicPartition(self._topic, 0)
            consumer.assign([partition])
            consumer.seek(partition, self.offset)
            ends = consumer.end_offsets([partition], timeout_ms=TIMEOUT_MS)
            self._end = int(ends.get(partition, 0))
        except Exception as exc:
            self._unreachable(exc)
            if consumer is not None:
                self._consumer = consumer
                self.close()  # its network thread too
            return False
        self._consumer = consumer
        return True

    def _unreachable(self, exc: Exception) -> None:
        self._retry_at = self._clock() + RETRY_S
        log.warning(
            "%s at %s cannot be read (%s); signals there wait, the stream goes on; trying again "
            "in %.0f s",
            self.label,
            self._bootstrap,
            exc,
            RETRY_S,
        )

    def rewind(self, offset: int) -> None:
        """Read again from ``offset`` (a message whose action did not complete)."""
        self.offset = offset
        self.close()  # the next read seeks there

    def close(self) -> None:
        if self._consumer is not None:
            try:
                self._consumer.close()
            except Exception:
                log.debug("closing the signal topic's consumer", exc_info=True)
            self._consumer = None

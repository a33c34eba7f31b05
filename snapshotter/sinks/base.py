"""The sink interface: write events, ask for durability, learn later what is durable.

Spark and Kafka acknowledge after the write, so the engine never assumes a write is durable:
it asks for a checkpoint, keeps the state as of that checkpoint, and saves that state only
when the sink acknowledges the checkpoint. On restart the sink is opened with what it said at
its last acknowledged checkpoint (``resume``), so it can discard anything written after it
(the JSONL file is cut back to that byte offset) - the log replays it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from snapshotter.core.events import ChangeEvent
from snapshotter.core.window import ReadBatch, StagedReadBatch

# What the engine hands a sink, in log order: log events one by one, and each chunk's READ
# rows as one columnar batch (at its close watermark's place in the log), or, for chunks
# read on Spark executors (``[snapshot] executors``), where those rows are (spark sink only).
SinkItem = ChangeEvent | ReadBatch | StagedReadBatch


def in_process(item: SinkItem) -> ChangeEvent | ReadBatch:
    """``item``, which a sink that is not Spark's can write; configuration keeps chunks
    read on executors away from them, so meeting one here is a bug."""
    if isinstance(item, StagedReadBatch):
        raise TypeError(
            f"READ rows of {item.table} read on Spark executors reached a sink that is not "
            'Spark\'s; [snapshot] executors needs [sink] kind = "spark"'
        )
    return item


@dataclass(frozen=True, slots=True)
class Ack:
    checkpoint: int  # the id ``Sink.checkpoint`` returned
    resume: Mapping[str, Any]  # what ``Sink.open`` needs to come back to this point (JSON-able)


class Sink(Protocol):
    def open(self, resume: Mapping[str, Any] | None) -> None:
        """Start writing; with ``resume`` (from the last saved state), first drop anything
        written after that acknowledged checkpoint."""
        ...

    def write(self, items: Sequence[SinkItem]) -> None:
        """Queue log events and READ batches, in order. Not durable until a checkpoint
        covering them is acked."""
        ...

    def checkpoint(self) -> int:
        """Ask for everything written so far to be made durable; returns a checkpoint id
        (increasing)."""
        ...

    def acknowledged(self) -> list[Ack]:
        """Checkpoints that became durable since the last call, oldest first."""
        ...

    def close(self) -> None:
        """Flush, make durable and release resources (acks of a final checkpoint are
        available from ``acknowledged`` before close returns)."""
        ...


@runtime_checkable
class SinkMetrics(Protocol):
    """What a sink may add to the metrics endpoint (optional: a sink without ``metrics``
    reports nothing of its own). Called from the endpoint's thread, not the engine's: read
    plain counters only, never wait on the sink's locks."""

    def metrics(self) -> Mapping[str, float]:
        """Gauges by name (``[a-z_]+``, in base units; exported as ``snapshotter_sink_<name>``),
        e.g. ``{"staged_bytes": 123.0}``."""
        ...


@runtime_checkable
class SinkBacklog(Protocol):
    """A sink that would rather be asked for a checkpoint before the interval is up
    (optional): one that makes rows durable on threads of its own, so a checkpoint
    started early overlaps its work with the engine's reading instead of leaving it all
    for the end of a snapshot. Called on the engine's thread, at transaction boundaries."""

    def checkpoint_wanted(self) -> bool:
        """Whether enough has been written since the last checkpoint to start one now."""
        ...


@runtime_checkable
class SinkNotifications(Protocol):
    """A sink that takes Debezium's notification records (``[notifications] channels``
    with "sink"; optional: ``notify_sink`` passes over a sink without ``notify``). Called on
    the engine's thread, between ``write`` calls, so it shares the sink's state safely; it
    must not wait long (a few records per chunk)."""

    def notify(self, records: Sequence[Mapping[str, Any]], topic: str) -> None:
        """Write notification records (``core.notifications.Notification.to_dict``) to the
        sink's notification stream named ``topic`` (each sink says where that is)."""
        ...


def notify_sink(sink: object, records: Sequence[Mapping[str, Any]], topic: str) -> bool:
    """Hand ``records`` to ``sink`` if it takes notifications; whether it does."""
    if not isinstance(sink, SinkNotifications):
        return False
    if records:
        sink.notify(records, topic)
    return True

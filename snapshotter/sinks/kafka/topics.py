"""The Kafka sink's topics: one per table, named ``<prefix>.<schema>.<table>``, created on first
use with ``[sink] partitions`` and ``replication`` (an existing topic is used as it is), and
with ``schemas = true`` the Connect schemas of its messages, described again when a row's
columns are not the table's as described."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from signals.names import TableId
from snapshotter.sinks.kafka import connect_schema
from snapshotter.sinks.kafka.clients import (
    Admin,
    Client,
    ClientError,
    ConfluentAdmin,
    KafkaPythonAdmin,
    TopicError,
    Unreachable,
    error_name,
)
from snapshotter.sources.base import TableSchema

log = logging.getLogger(__name__)


class KafkaSinkError(RuntimeError):
    """The sink cannot go on; the message says why and what to do."""


def topic_name(prefix: str, table: TableId) -> str:
    if table.schema is None:
        raise KafkaSinkError(f"event for table {table} without a schema")
    return f"{prefix}.{table.schema}.{table.table}"


def unreachable(bootstrap: str, exc: Exception) -> str:
    return (
        f"cannot reach the Kafka brokers at {bootstrap} ({exc}); check [sink] "
        "bootstrap_servers and that a broker is running"
    )


@dataclass(slots=True)
class Topic:
    name: str
    partitions: int
    # schemas mode: the table as described, and the serialized schemas
    table: TableSchema | None = None
    key_columns: tuple[str, ...] = ()
    binary_columns: tuple[str, ...] = ()
    key_schema: str = ""
    # column lists of events found not to match the table even after describing it again
    # (events older than an ALTER, replayed): not worth another catalog query
    stale_shapes: set[tuple[str, ...]] = field(default_factory=set)
    value_schemas: dict[tuple[str, ...], str] = field(default_factory=dict)

    def value_schema(self, source: Mapping[str, Any]) -> str:
        """The envelope's Connect schema, for a source block with these fields."""
        signature = tuple(source)
        schema = self.value_schemas.get(signature)
        if schema is None:
            assert self.table is not None
            schema = json.dumps(
                connect_schema.envelope_schema(self.name, self.table, self.key_columns, source),
                separators=(",", ":"),
                ensure_ascii=False,
            )
            self.value_schemas[signature] = schema
        return schema


class Topics:
    def __init__(
        self,
        *,
        bootstrap_servers: str,
        settings: Mapping[str, Any],
        client: Client,
        prefix: str,
        partitions: int,
        replication: int,
        key_columns: Callable[[TableId], Sequence[str] | None],
        describe: Callable[[TableId], TableSchema] | None,
        schemas: bool,
    ) -> None:
        self._bootstrap = bootstrap_servers
        self._settings = settings
        self._client = client
        self._prefix = prefix
        self._partitions = partitions
        self._replication = replication
        self._key_columns = key_columns
        self._describe = describe
        self._schemas = schemas
        self._admin: Admin | None = None
        self._topics: dict[TableId, Topic] = {}

    def of(self, table: TableId) -> Topic:
        """The table's topic, created (or found) on first use."""
        return self._topics.get(table) or self._open(table)

    def close(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None

    def _open(self, table: TableId) -> Topic:
        name = topic_name(self._prefix, table)
        partitions = self.ensure(name)
        topic = self._topics[table] = Topic(name, partitions)
        if self._schemas:
            self._describe_table(topic, table)
        return topic

    def _describe_table(self, topic: Topic, table: TableId) -> None:
        assert self._describe is not None
        described = self._describe(table)
        key = tuple(self._key_columns(table) or described.primary_key)
        topic.table = described
        topic.key_columns = key
        topic.binary_columns = tuple(
            c.name
            for c in described.columns
            if pa.types.is_binary(c.arrow_type) or pa.types.is_large_binary(c.arrow_type)
        )
        topic.key_schema = json.dumps(
            connect_schema.key_schema(topic.name, described, key), separators=(",", ":")
        )
        topic.value_schemas.clear()

    def refresh_shape(self, topic: Topic, table: TableId, columns: tuple[str, ...]) -> None:
        """Describe the table again when a row's columns are not the described ones (a
        column was added or dropped since). Only ``after`` rows tell: a delete's ``before``
        may hold the key columns only (PostgreSQL's REPLICA IDENTITY DEFAULT)."""
        assert topic.table is not None
        if columns == topic.table.column_names or columns in topic.stale_shapes:
            return
        self._describe_table(topic, table)
        if columns != topic.table.column_names:
            topic.stale_shapes.add(columns)

    def ensure(self, name: str) -> int:
        """Create the topic (configured partitions and replication) unless it exists;
        returns its partition count."""
        try:
            partitions = self._admin_client().ensure_topic(
                name, self._partitions, self._replication
            )
        except TopicError as exc:
            raise KafkaSinkError(self._not_created(name, exc.code, exc.message)) from None
        except Unreachable as exc:
            raise KafkaSinkError(unreachable(self._bootstrap, exc)) from None
        except ClientError as exc:
            raise KafkaSinkError(f"cannot create topic {name}: {exc}") from None
        if partitions is None:
            log.info(
                "kafka: created topic %s (%d partitions, replication %d)",
                name,
                self._partitions,
                self._replication,
            )
            return self._partitions
        if partitions != self._partitions:
            log.warning(
                "kafka: topic %s exists with %d partitions ([sink] partitions = %d); using it "
                "as it is",
                name,
                partitions,
                self._partitions,
            )
        return partitions

    def _admin_client(self) -> Admin:
        if self._admin is None:
            try:
                if self._client == "confluent":
                    self._admin = ConfluentAdmin(self._bootstrap, self._settings)
                else:
                    self._admin = KafkaPythonAdmin(self._bootstrap, self._settings)
            except Unreachable as exc:
                raise KafkaSinkError(unreachable(self._bootstrap, exc)) from None
            except ClientError as exc:
                raise KafkaSinkError(f"cannot start the Kafka admin client: {exc}") from None
        return self._admin

    def _not_created(self, name: str, code: int, message: str | None) -> str:
        error = error_name(code)
        detail = f"{error}: {message}" if message else error
        what = f"{self._partitions} partitions, replication {self._replication}"
        if "Authorization" in error:
            hint = (
                f"the sink may not create topics: create {name} yourself ({what}) or grant "
                "CREATE on it"
            )
        elif "Replication" in error:
            hint = "set [sink] replication to at most the number of brokers"
        elif "Partitions" in error:
            hint = "set [sink] partitions to a positive number the cluster allows"
        else:
            hint = f"create {name} yourself ({what})"
        return f"cannot create topic {name} ({what}): {detail}; {hint}"

"""The built-in convergence check for a configured source: materialize the sink's output for
one table and compare it with the table, row by row (``snapshotter verify``).

Meaningful once the engine has caught up with the log and the table is not being written
(otherwise the table is ahead of the output by the writes in flight).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from signals.names import TableId
from snapshotter.config import Config
from snapshotter.verify import Verdict, compare, materialize


def check_table(config: Config, table: TableId) -> Verdict:
    from snapshotter.runner import open_dialect

    source = config.source
    table = table.with_default_schema(source.default_schema)
    dialect = open_dialect(config)
    try:
        schema = dialect.describe(table)
        key = list(schema.primary_key) or [c.name for c in schema.columns]
        topic = f"{source.topic_prefix}.{table.schema}.{table.table}"
        if config.sink.kind == "kafka":
            from snapshotter.sinks.encoding import json_as_text
            from snapshotter.sinks.kafka_read import materialize_topic

            sink = config.sink
            output = materialize_topic(
                sink.bootstrap_servers, topic, sink.kafka, schemas=sink.schemas
            )
            rows: Iterable[Mapping[str, Any]] = dialect.scan(schema)
            if sink.json_as_text:  # JSON columns were written as strings of their text
                rows = (json_as_text(row) or row for row in rows)
            return compare(output, rows, key)
        output = materialize(config.sink.local_path, topic)
        return compare(output, dialect.scan(schema), key)
    finally:
        dialect.close()

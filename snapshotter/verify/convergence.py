"""The built-in convergence check for a configured source: materialize the sink's output for
one table and compare it with the table, row by row (``snapshotter verify``).

Meaningful once the engine has caught up with the log and the table is not being written
(otherwise the table is ahead of the output by the writes in flight).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from signals.names import TableId, TablePattern, parse_table_name, parse_table_selector
from snapshotter.config import Config
from snapshotter.sources.base import Dialect
from snapshotter.sources.setup_common import resolve_tables
from snapshotter.verify.progress import ticking
from snapshotter.verify.rows import (
    Materialized,
    TableKeyTwice,
    Verdict,
    VerifyError,
    compare,
    materialize,
)


def tables_to_verify(config: Config, dialect: Dialect, names: Sequence[str]) -> list[TableId]:
    """What ``snapshotter verify`` checks, the same for every sink: the named tables; without
    names, every table ``source.tables`` selects, both those at the source now and those the
    state has snapshotted (a table dropped since is reported, not skipped). The signal table
    and the notification table (the engine's own, never streamed) are not verified."""
    source = config.source
    default = source.default_schema
    if names:
        return [parse_table_name(n).with_default_schema(default) for n in names]
    found = dict.fromkeys(resolve_tables(dialect, source.tables, default))
    selectors = [
        s if isinstance(s, TablePattern) else s.with_default_schema(default)
        for s in map(parse_table_selector, source.tables)
    ]
    for table in snapshotted_tables(config):
        if any(s.matches(table) if isinstance(s, TablePattern) else s == table for s in selectors):
            found[table] = None
    found.pop(source.signal_table_id, None)
    for own in config.own_tables:
        found.pop(own, None)
    if not found:
        raise VerifyError(
            "no table to verify: source.tables selects no table at the source and none was "
            "snapshotted; name the tables to verify"
        )
    return sorted(found, key=str)


def snapshotted_tables(config: Config) -> list[TableId]:
    """Tables the saved state has snapshots of (none when there is no state)."""
    from snapshotter.engine.state_store import StateStore, state_path

    path = state_path(config)
    if not path.exists():
        return []
    return list(dict.fromkeys(p.table for p in StateStore(path).load().snapshots))


def surrogate_key(config: Config, table: TableId) -> tuple[str, ...] | None:
    """The surrogate key the engine keys ``table``'s events by (the state's last snapshot of
    it that names one and did not fail: the engine's own rule), or None."""
    from snapshotter.core.state import SnapshotStatus
    from snapshotter.engine.state_store import StateStore, state_path

    path = state_path(config)
    if not path.exists():
        return None
    found = None
    for p in StateStore(path).load().snapshots:
        if (
            p.table == table
            and p.surrogate_key
            and p.key_columns
            and p.status is not SnapshotStatus.FAILED
        ):
            found = tuple(p.key_columns)
    return found


log = logging.getLogger(__name__)


def _compare_scanned(
    output: Materialized,
    scan: Callable[[], Iterable[Mapping[str, Any]]],
    key: Sequence[str],
) -> Verdict:
    """``compare`` against a scan of the table; a scan that returns one key twice is run
    once more before the table is called keyless: once in CI a MariaDB 10.11 scan (one READ
    ONLY transaction, a quiet table just after crash recovery) returned a primary key twice,
    which no table with that key holds; the next scan is the table's real content."""
    try:
        return compare(output, ticking(scan(), "table rows compared"), key)
    except TableKeyTwice as exc:
        log.warning("%s; scanning the table once more", exc)
        return compare(output, ticking(scan(), "table rows compared"), key)


def check_table(config: Config, table: TableId) -> Verdict:
    from snapshotter.sources.connector import connector_for

    source = config.source
    table = table.with_default_schema(source.default_schema)
    dialect = connector_for(config.source).open_dialect()
    try:
        schema = dialect.describe(table)
        # The key the output is keyed by: the primary key; for a table without one, the
        # surrogate key of its snapshot (else the whole row, as its log events are keyed).
        surrogate = None if schema.primary_key else surrogate_key(config, table)
        key = list(schema.primary_key or surrogate or [c.name for c in schema.columns])
        topic = f"{source.topic_prefix}.{table.schema}.{table.table}"
        if config.sink.kind == "kafka":
            from snapshotter.sinks.encoding import json_as_text
            from snapshotter.verify.kafka import materialize_topic

            sink = config.sink
            output = materialize_topic(
                sink.bootstrap_servers,
                topic,
                sink.kafka,
                schemas=sink.schemas,
                client=sink.kafka_client,
            )

            def scan() -> Iterable[Mapping[str, Any]]:
                rows = dialect.scan(schema)
                if sink.json_as_text:  # JSON columns were written as strings of their text
                    return (json_as_text(row) or row for row in rows)
                return rows

            return _compare_scanned(output, scan, key)
        output = materialize(config.sink.local_path, topic, surrogate)
        return _compare_scanned(output, lambda: dialect.scan(schema), key)
    finally:
        dialect.close()

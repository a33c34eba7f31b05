"""``snapshotter teardown``: drop what ``init`` created, and nothing else.

The slot is the pipeline's (named by its config, refused while an engine streams from it)
and always goes. The publication, the signal table and the notification table go only when
``init`` recorded creating them in this database (``app.created``): an adopted one (a
Debezium connector's, another pipeline's, an administrator's) stays. A signal table another
publication still carries stays too: another pipeline reads its signals from it. Each table
kept is said with the reason and what to run instead. On MySQL and MariaDB, whose binlog
has no publications, signals in the table that name tables this pipeline does not capture
are the trace of another pipeline reading it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from signals import ExecuteSnapshot, StopSnapshot, parse_signal
from signals.names import TableId, parse_table_selector
from signals.plan import Selectors, listed
from signals.table import signal_table
from snapshotter.app import created
from snapshotter.app.own_tables import NOTIFICATION, SIGNAL, layout_refusal
from snapshotter.config import Config, PostgresSource
from snapshotter.sources.connector import Connector, PublishedLog, connector_for
from snapshotter.sources.positions import gone


@dataclass
class TeardownPlan:
    """What teardown drops and what it keeps (with why), decided before it asks."""

    drop: list[str] = field(default_factory=list)  # as people name them
    keep: list[str] = field(default_factory=list)  # one line each: what, why, what instead
    keep_publication: bool = False
    tables: list[tuple[str, TableId]] = field(default_factory=list)  # (kind, table) to drop


def plan_teardown(config: Config, engine: Any) -> TeardownPlan:
    source = config.source
    connector = connector_for(source)
    plan = TeardownPlan()
    objects = connector.capture_objects()
    if isinstance(source, PostgresSource) and isinstance(connector, PublishedLog):
        publication = f"publication {source.publication}"
        if publication in objects:
            plan.keep_publication = not created.was_created(
                config, "publication", source.publication
            )
            if plan.keep_publication:
                objects.remove(publication)
    plan.drop.extend(objects)
    wanted = [(SIGNAL, source.signal_table_id)]
    if "table" in config.notifications.channels:
        wanted.append((NOTIFICATION, config.notification_table_id))
    for kind, table in wanted:
        reason = _why_keep(config, engine, connector, kind, table)
        if reason is None:
            plan.drop.append(f"{kind} {table}")
            plan.tables.append((kind, table))
        else:
            plan.keep.append(f"{kind} {table}: kept: {reason}")
    return plan


def _why_keep(
    config: Config, engine: Any, connector: Connector, kind: str, table: TableId
) -> str | None:
    """Why teardown must not drop ``table``; None when it may (or it is gone already)."""
    if isinstance(engine, sa.Engine):
        with engine.connect() as conn:
            if not sa.inspect(conn).has_table(table.table, schema=table.schema):
                return None  # "already gone": nothing of anyone's to keep
    drop = f"DROP TABLE {_quoted(engine, table)};"
    if not created.was_created(config, kind, str(table)):
        return (
            "`snapshotter init` did not create it (it was there before, or was made before "
            f"init recorded what it creates); if nothing else uses it, drop it yourself: {drop}"
        )
    if kind == SIGNAL and isinstance(connector, PublishedLog):
        others = connector.other_publications(engine, table)
        if others:
            return (
                f"publication {', '.join(others)} still carries it (another pipeline or "
                "Debezium connector reads its signals there); it goes with the last "
                "teardown of those, or drop it yourself once nothing reads it: " + drop
            )
    if kind == SIGNAL:
        foreign = others_signals(config, connector.signal_rows(engine))
        if foreign:
            return (
                f"it holds signals for tables this pipeline does not capture "
                f"({listed(foreign)}): another pipeline reads signals from it; drop it "
                "yourself once nothing does: " + drop
            )
    if kind == SIGNAL:
        expected = signal_table(table)
    else:
        from snapshotter.app.notifications import notification_table

        expected = notification_table(table)
    if layout_refusal(engine, expected, kind, kind) is not None:
        return "its columns are no longer the ones init created (a table of the same name?)"
    return None


def others_signals(config: Config, rows: Iterable[tuple[Any, Any, Any]]) -> list[TableId]:
    """The tables that signal rows (execute-snapshot, stop-snapshot) name and this pipeline
    does not capture: another pipeline shares the signal table (on MySQL and MariaDB the
    only trace of it, since the binlog has no publications)."""
    source = config.source
    captured = Selectors(map(parse_table_selector, source.tables), source.default_schema)
    found: dict[TableId, None] = {}
    for row_id, row_type, data in rows:
        signal = parse_signal(row_id, row_type, data)
        if not isinstance(signal, ExecuteSnapshot | StopSnapshot):
            continue
        for selector in signal.data_collections:
            if isinstance(selector, TableId):
                table = selector.with_default_schema(source.default_schema)
                if not captured.selects(table) and table not in found:
                    found[table] = None
    return list(found)


def _quoted(engine: Any, table: TableId) -> str:
    if isinstance(engine, sa.Engine):
        quote = engine.dialect.identifier_preparer.quote
        return f"{quote(str(table.schema))}.{quote(table.table)}"
    return str(table)


def teardown(config: Config, engine: Any, plan: TeardownPlan) -> list[str]:
    """Drop what ``plan`` drops: the capture objects (the slot, never an active one; the
    publication unless kept), then the tables. Idempotent: one line per object dropped,
    "dropped" or "already gone" (``plan.keep`` says the rest)."""
    connector = connector_for(config.source)
    if isinstance(connector, PublishedLog):
        lines = connector.drop_capture_keeping(engine, plan.keep_publication)
    else:
        lines = connector.drop_capture(engine)
    if not plan.keep_publication and isinstance(config.source, PostgresSource):
        created.forget(config, "publication", config.source.publication)
    for kind, table in plan.tables:
        if kind == SIGNAL:
            dropped = connector.drop_signal_table(engine)
        else:
            from snapshotter.app.notifications import drop_notification_table

            dropped = drop_notification_table(engine, table)
        created.forget(config, kind, str(table))
        lines.append(f"{kind} {table}: {gone(dropped)}")
    return lines

"""What an execute-snapshot signal is planned against (``signals.plan.plan_snapshot``) that
comes from the configuration: the tables this pipeline captures, its signal table, default
schema and own tables. Built here once for the engine's signal actions and for ``snapshotter
signal``'s check before it sends one, so both judge a signal by the same rules."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from signals import ExecuteSnapshot
from signals.names import TableId, TableSet, parse_table_selector
from signals.plan import DescribeMissing, Selectors, SnapshotPlan, plan_snapshot
from snapshotter.config import SourceConfig


@dataclass(frozen=True)
class SnapshotScope:
    captured: Selectors  # source.tables
    captured_text: str  # ... as configured, for messages
    signal_table: TableId
    default_schema: str
    # The engine's own tables besides the signal table (the notification table) -> what it
    # is: never snapshotted.
    own_tables: Mapping[TableId, str]

    def plan(
        self,
        signal: ExecuteSnapshot,
        *,
        known: TableSet,
        unfinished: Mapping[TableId, str],
        describe_missing: DescribeMissing,
    ) -> SnapshotPlan:
        """``plan_snapshot`` for ``signal`` in this scope (see there for the arguments)."""
        return plan_snapshot(
            signal,
            known=known,
            captured=self.captured,
            signal_table=self.signal_table,
            default_schema=self.default_schema,
            unfinished=unfinished,
            describe_missing=describe_missing,
            own_tables=self.own_tables,
        )


def snapshot_scope(source: SourceConfig, own_tables: Mapping[TableId, str]) -> SnapshotScope:
    """The scope of ``source``; ``own_tables``: ``Config.own_tables``."""
    return SnapshotScope(
        captured=Selectors((parse_table_selector(t) for t in source.tables), source.default_schema),
        captured_text=repr(source.tables),
        signal_table=source.signal_table_id,
        default_schema=source.default_schema,
        own_tables=own_tables,
    )

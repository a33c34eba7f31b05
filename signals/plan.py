"""What an ``execute-snapshot`` asks for, resolved against the source's catalog.

The engine acts on the plan when it reads the signal from the log; ``snapshotter signal``
makes the same plan before it inserts the signal, so a signal the engine would refuse is
refused at once. Pure: the catalog comes in as a ``TableSet`` (one listing per signal), the
kinds of the relations that are not tables (views, ...) through ``describe_missing``, asked
once for all the names the listing lacks. The work is a hash lookup per named table and one
RE2 match per (pattern, candidate table), so a big signal costs time linear in its size.

Rules:

* Several pipelines may read one signal table (Debezium's default ``debezium_signal``): as a
  Debezium connector skips the tables it does not capture, a pipeline *skips* the tables of
  a signal that ``source.tables`` does not select but that exist (another pipeline's): no
  failed snapshot, no signal problem, one note in the log.
* An exact name (the default schema applied) is queued, skipped, or refused with the reason,
  which the engine records as that table's failed snapshot: the signal table itself, the
  engine's own tables (the notification table: its output), a captured name the catalog
  lacks (a view, a partition, ... said so), a name that exists nowhere; a table with an
  unfinished snapshot is a signal problem (that snapshot is not disturbed).
* A pattern selects the tables of the listing it matches that ``source.tables`` captures, as
  Debezium matches ``data-collections`` against its captured tables (never the signal table
  or the engine's own tables); one that matches only tables of others is skipped, one that
  matches no table at all is a signal problem.
* A table selected twice (by a name and a pattern, or two patterns) is queued once; its
  filter is that of the first ``additional-conditions`` entry that selects it.
* A signal that would queue more than ``MAX_TABLES_PER_SIGNAL`` tables, or raise the number
  of unfinished snapshots above ``MAX_UNFINISHED``, is refused as a whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from signals.model import AdditionalCondition, ExecuteSnapshot
from signals.names import TableId, TablePattern, TableSelector, TableSet

MAX_TABLES_PER_SIGNAL = 1_000
MAX_UNFINISHED = 10_000
_LISTED = 5  # how many tables a message names before "and N more"

DescribeMissing = Callable[[Sequence[TableId]], Mapping[TableId, str]]


@dataclass
class SnapshotPlan:
    queue: list[tuple[TableId, str | None]] = field(default_factory=list)  # table, filter
    refused: list[tuple[TableId, str]] = field(default_factory=list)  # table, reason
    problems: list[str] = field(default_factory=list)  # about the signal, not one table
    error: str | None = None  # the whole signal is refused: nothing queued, nothing refused
    # Names and patterns that select only tables this pipeline does not capture (another
    # pipeline's): left alone, as Debezium leaves them.
    skipped: list[TableSelector] = field(default_factory=list)


def with_default_schema(selector: TableSelector, schema: str) -> TableSelector:
    return selector.with_default_schema(schema) if isinstance(selector, TableId) else selector


class Selectors:
    """Table selectors (``source.tables``, a stop-snapshot's list) for many lookups: exact
    names in a set, patterns tried in turn."""

    def __init__(self, selectors: Iterable[TableSelector], default_schema: str) -> None:
        resolved = [with_default_schema(s, default_schema) for s in selectors]
        self.names = frozenset(s for s in resolved if isinstance(s, TableId))
        self.patterns = [s for s in resolved if isinstance(s, TablePattern)]

    def __bool__(self) -> bool:
        return bool(self.names or self.patterns)

    def selects(self, table: TableId) -> bool:
        return table in self.names or any(p.matches(table) for p in self.patterns)


def listed(tables: Sequence[object], limit: int = _LISTED) -> str:
    shown = ", ".join(str(t) for t in tables[:limit])
    more = len(tables) - limit
    return shown + (f" and {more} more" if more > 0 else "")


def _filters(
    conditions: Sequence[AdditionalCondition], default_schema: str
) -> Callable[[TableId], str | None]:
    exact: dict[TableId, tuple[int, str]] = {}
    patterns: list[tuple[int, TablePattern, str]] = []
    for index, condition in enumerate(conditions):
        selector = with_default_schema(condition.data_collection, default_schema)
        if isinstance(selector, TableId):
            exact.setdefault(selector, (index, condition.filter))
        else:
            patterns.append((index, selector, condition.filter))

    def filter_of(table: TableId) -> str | None:
        found = exact.get(table)
        for index, pattern, sql in patterns:
            if found is not None and index > found[0]:
                break
            if pattern.matches(table):
                return sql
        return found[1] if found is not None else None

    return filter_of


def plan_snapshot(
    signal: ExecuteSnapshot,
    *,
    known: TableSet,
    captured: Selectors,
    signal_table: TableId,
    default_schema: str,
    unfinished: Mapping[TableId, str],
    describe_missing: DescribeMissing,
    own_tables: Mapping[TableId, str] | None = None,
) -> SnapshotPlan:
    """The plan for ``signal``. ``unfinished``: table -> a description of its unfinished
    snapshot; ``own_tables``: the engine's own tables besides the signal table (the
    notification table) -> what it is, never a snapshot target."""
    own = {signal_table: "the signal table", **(own_tables or {})}
    plan = SnapshotPlan()
    chosen: dict[TableId, None] = {}  # in the signal's order, each table once
    names: list[TableId] = []
    for selector in signal.data_collections:
        selector = with_default_schema(selector, default_schema)
        if isinstance(selector, TableId):
            names.append(selector)
            chosen.setdefault(selector)
            continue
        matched = [t for t in known.matching(selector) if t not in own]
        inside = [t for t in matched if captured.selects(t)]
        if not matched:
            plan.problems.append(f"pattern {selector} matches no captured table, nor any other")
        elif not inside:
            plan.skipped.append(selector)
        for table in inside:
            chosen.setdefault(table)
        if len(chosen) > MAX_TABLES_PER_SIGNAL:
            break
    if len(chosen) > MAX_TABLES_PER_SIGNAL:
        plan.error = (
            f"the signal selects more than {MAX_TABLES_PER_SIGNAL} tables; one signal may "
            f"snapshot at most {MAX_TABLES_PER_SIGNAL}: split it into several signals"
        )
        plan.problems.clear()
        plan.skipped.clear()
        return plan
    missing = [t for t in dict.fromkeys(names) if t not in known and t not in own]
    kinds = describe_missing(missing) if missing else {}
    filter_of = _filters(signal.additional_conditions, default_schema)
    for table in chosen:
        if table not in own and not captured.selects(table) and (table in known or table in kinds):
            plan.skipped.append(table)  # it exists: another pipeline's table
            continue
        reason = _refusal(table, known, own, kinds)
        if reason is not None:
            plan.refused.append((table, reason))
        elif table in unfinished:
            plan.problems.append(
                f"{table} is already being snapshotted ({unfinished[table]}); stop that "
                "snapshot first to start it over"
            )
        else:
            plan.queue.append((table, filter_of(table)))
    if len(unfinished) + len(plan.queue) > MAX_UNFINISHED:
        return SnapshotPlan(
            error=f"{len(unfinished)} snapshots are unfinished and the signal would add "
            f"{len(plan.queue)}; at most {MAX_UNFINISHED} may wait at once: send it again "
            "once some have finished"
        )
    return plan


def _refusal(
    table: TableId, known: TableSet, own: Mapping[TableId, str], kinds: Mapping[TableId, str]
) -> str | None:
    if table in own:
        return (
            f"{table} is {own[table]}, the engine's own table: it is never snapshotted "
            "(nor captured)"
        )
    if table not in known:
        what = kinds.get(table)
        if what is not None:
            return f"{table} {what}"
        return f"table {table} does not exist (or the user cannot see it)"
    return None


def not_captured(table: TableId, captured_text: str) -> str:
    """Why this pipeline does not snapshot ``table``, with the fix."""
    return (
        f"table {table} is not captured: add it (or a pattern matching it) to `tables` in "
        f"the [source] section of the config (source.tables = {captured_text})"
    )

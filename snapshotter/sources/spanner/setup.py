"""What ``snapshotter init`` checks and creates in a Spanner database: the signal table, and
the change stream the engine reads (checked, never created or altered: it is the database
owner's DDL, and altering a stream changes what other readers see).

A change stream's value capture type decides what an event can hold:

* ``NEW_ROW_AND_OLD_VALUES`` (recommended): every event's ``after`` is the whole row, an
  update's and a delete's ``before`` the whole old row, as Debezium's other connectors.
* ``NEW_ROW``: whole ``after`` rows; no ``before`` for updates, only the key for deletes.
* ``OLD_AND_NEW_VALUES`` (Spanner's default): an update carries only the columns it
  changed; the others are Debezium's unavailable-value placeholder (the Spark sink fills
  them from the key's previous event; a Kafka consumer must do the same).
* ``NEW_VALUES``: refused: a delete carries no old values and an update only the changed
  columns' new ones.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from signals.names import TableId
from snapshotter.sources.base import TableError
from snapshotter.sources.positions import CONF, execute_snapshot_command, to_go_on
from snapshotter.sources.setup_common import Problem
from snapshotter.sources.spanner import sql
from snapshotter.sources.spanner.client import SpannerDialectKind

CAPTURE_TYPES = {
    "NEW_ROW_AND_OLD_VALUES": "whole rows before and after every change",
    "NEW_ROW": "whole rows after every change; no old values (an update has no before, a "
    "delete's before holds only the key)",
    "OLD_AND_NEW_VALUES": "only the changed columns of an update (the others are Debezium's "
    "unavailable-value placeholder, which the Spark sink fills from the row's previous "
    "event)",
}
RECOMMENDED = "NEW_ROW_AND_OLD_VALUES"
_EXCLUDES = ("exclude_insert", "exclude_update", "exclude_delete")
# A change stream's statement in the database's DDL (GetDatabaseDdl): its name, then the rest.
_CREATE_STREAM = re.compile(r"\s*CREATE\s+CHANGE\s+STREAM\s+[`\"]?(\w+)[`\"]?(.*)", re.I | re.S)
_FOR_ALL = re.compile(r"\bFOR\s+ALL\b", re.I)


@dataclass(frozen=True, slots=True)
class StreamFacts:
    """What ``information_schema`` says of one change stream."""

    exists: bool
    all_tables: bool  # FOR ALL
    tables: dict[TableId, bool]  # watched table -> all its columns watched
    options: dict[str, str]

    @property
    def capture_type(self) -> str:
        return self.options.get("value_capture_type", "OLD_AND_NEW_VALUES").upper()

    def watches(self, table: TableId) -> bool:
        return self.all_tables or table in self.tables


def signal_table_ddl(kind: SpannerDialectKind, table: TableId) -> str:
    """The signal table (Debezium's columns); a PostgreSQL-dialect database gets the same
    DDL as PostgreSQL."""
    if kind is SpannerDialectKind.POSTGRESQL:
        from signals.table import signal_table_ddl as sa_ddl

        return sa_ddl(table, "postgresql")
    name = sql.table_ref(kind, table)
    return (
        f"CREATE TABLE {name} (id STRING(42) NOT NULL, type STRING(32) NOT NULL, "
        "data STRING(MAX)) PRIMARY KEY (id)"
    )


def stream_ddl(
    kind: SpannerDialectKind, stream: str, tables: Sequence[TableId], *, alter: bool
) -> str:
    """``CREATE CHANGE STREAM`` (or ``ALTER ... SET FOR``) watching ``tables`` with the
    recommended capture type."""
    names = ", ".join(sql.table_ref(kind, t) for t in tables)
    if alter:
        return f"ALTER CHANGE STREAM {stream} SET FOR {names}"
    if kind is SpannerDialectKind.POSTGRESQL:
        return (
            f"CREATE CHANGE STREAM {stream} FOR {names} WITH (value_capture_type = '{RECOMMENDED}')"
        )
    return (
        f"CREATE CHANGE STREAM {stream} FOR {names} OPTIONS (value_capture_type = '{RECOMMENDED}')"
    )


def capture_type_ddl(kind: SpannerDialectKind, stream: str) -> str:
    if kind is SpannerDialectKind.POSTGRESQL:
        return f"ALTER CHANGE STREAM {stream} SET (value_capture_type = '{RECOMMENDED}')"
    return f"ALTER CHANGE STREAM {stream} SET OPTIONS (value_capture_type = '{RECOMMENDED}')"


def stream_problems(
    kind: SpannerDialectKind,
    stream: str,
    facts: StreamFacts,
    tables: Sequence[TableId],
    signal_table: TableId,
) -> list[Problem]:
    """Why the change stream cannot serve these tables and the signal table (errors), or
    what to know about it (warnings); each with the DDL that fixes it."""
    wanted = [*tables, signal_table]
    if not facts.exists:
        return [
            Problem(
                what=f"change stream {stream} does not exist",
                fix=f"create it: {stream_ddl(kind, stream, wanted, alter=False)}",
            )
        ]
    problems = []
    missing = [t for t in wanted if not facts.watches(t)]
    if missing:
        watched = sorted(set(facts.tables) | set(missing))
        problems.append(
            Problem(
                what=f"change stream {stream} does not watch "
                f"{', '.join(map(str, missing))}: their changes would be missing",
                fix=f"{stream_ddl(kind, stream, watched, alter=True)}",
            )
        )
    partial = [
        t for t in wanted if t in facts.tables and not facts.tables[t] and not facts.all_tables
    ]
    if partial:
        problems.append(
            Problem(
                what=f"change stream {stream} watches only some columns of "
                f"{', '.join(map(str, partial))}: events would miss the others",
                fix="watch whole tables: "
                + stream_ddl(kind, stream, sorted(facts.tables), alter=True),
            )
        )
    excluded = [o for o in _EXCLUDES if facts.options.get(o, "").lower() == "true"]
    if excluded:
        problems.append(
            Problem(
                what=f"change stream {stream} has {', '.join(excluded)}: those changes would "
                "be missing from the output",
                fix=f"ALTER CHANGE STREAM {stream} "
                + ("SET (" if kind is SpannerDialectKind.POSTGRESQL else "SET OPTIONS (")
                + ", ".join(f"{o} = false" for o in excluded)
                + ")",
            )
        )
    capture = facts.capture_type
    if capture == "NEW_VALUES":
        problems.append(
            Problem(
                what=f"change stream {stream} has value_capture_type NEW_VALUES: deletes carry "
                "no old values and updates only the changed columns, so events cannot be "
                "built",
                fix=capture_type_ddl(kind, stream),
            )
        )
    elif capture not in CAPTURE_TYPES:
        problems.append(
            Problem(
                what=f"change stream {stream} has value_capture_type {capture}, which "
                "snapshotter does not know",
                fix=capture_type_ddl(kind, stream),
            )
        )
    elif capture != RECOMMENDED:
        problems.append(
            Problem(
                what=f"change stream {stream} has value_capture_type {capture}: "
                f"{CAPTURE_TYPES[capture]}",
                fix=f"for whole rows before and after: {capture_type_ddl(kind, stream)}",
                severity="warning",
            )
        )
    return problems


def refuse_unwatched(dialect: object, tables: Sequence[TableId]) -> list[TableId]:
    """TableError for a table the change stream does not watch; nothing is ever added."""
    from snapshotter.sources.spanner.dialect import SpannerDialect

    assert isinstance(dialect, SpannerDialect)
    stream = dialect.change_stream
    if stream is None:
        return []
    facts = dialect.stream_facts(stream)
    missing = [t for t in tables if not facts.watches(t)]
    if missing:
        names = ", ".join(map(str, missing))
        watched = sorted(set(facts.tables) | set(missing) | {dialect.signal_table})
        raise TableError(
            f"change stream {stream} does not watch {names}: its changes would be missing; "
            f"{stream_ddl(dialect.kind, stream, watched, alter=True)}"
        )
    return []


def declared_for_all(statements: Sequence[str], stream: str) -> bool | None:
    """Whether the database's DDL (GetDatabaseDdl) creates ``stream`` ``FOR ALL``; None when
    it does not list the stream. The emulator's ``information_schema`` keeps saying ``FOR
    ALL`` after ``ALTER CHANGE STREAM ... DROP FOR ALL``, while the stream sends nothing."""
    for statement in statements:
        found = _CREATE_STREAM.match(statement)
        if found is not None and found.group(1).lower() == stream.lower():
            return _FOR_ALL.search(found.group(2)) is not None
    return None


def coverage_problems(
    kind: SpannerDialectKind,
    stream: str,
    facts: StreamFacts,
    tables: Sequence[TableId],
    signal_table: TableId,
) -> list[str]:
    """What the change stream no longer carries that the engine needs, one line each with
    the DDL that fixes it (``Connector.log_coverage_problems``): the stream itself, the
    signal table (no signal and no watermark would arrive: a snapshot would wait forever),
    the captured ``tables`` (their changes would be missing), each watched whole."""
    wanted = [signal_table, *(t for t in tables if t != signal_table)]
    if not facts.exists:
        create = stream_ddl(kind, stream, wanted, alter=False)
        return [
            f"change stream {stream} does not exist: no change reaches the engine. Fix: "
            f"{create}; then {to_go_on(CONF)}"
        ]
    fix = stream_ddl(kind, stream, sorted(set(facts.tables) | set(wanted)), alter=True)
    lines = []
    for table in wanted:
        if facts.all_tables or facts.tables.get(table) is True:
            continue
        what = "does not watch" if not facts.watches(table) else "watches only some columns of"
        if table == signal_table:
            lines.append(
                f"change stream {stream} {what} the signal table {table}: signals and "
                f"watermarks do not reach the engine, so no snapshot can go on. Fix: {fix}"
            )
        else:
            again = execute_snapshot_command(CONF, [str(table)])
            lines.append(
                f"change stream {stream} {what} {table}: changes of it are missing from the "
                f"output. Fix: {fix}; then snapshot it again: {again}"
            )
    return lines

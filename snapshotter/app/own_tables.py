"""The engine's own tables in the source, as ``init`` sets them up: the signal table and (with
the "table" notification channel) the notification table.

``init`` creates each unless it exists, and records what it created (``app.created``) so that
``teardown`` drops only that. An existing table is adopted only when its layout is the one
the engine writes (``sources.table_layout``): a user table that happens to carry the
configured name is refused with the fix, never written into. Then every privilege the engine
will use is checked, each missing one named with its GRANT (``sources.privileges``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from signals.names import TableId
from signals.table import signal_table
from snapshotter.app import created
from snapshotter.config import Config
from snapshotter.sources.connector import Connector, PublishedLog
from snapshotter.sources.setup_common import Problem

SIGNAL = "signal table"
NOTIFICATION = "notification table"


@dataclass
class Prepared:
    """What init did about the engine's own tables: lines to print, problems to report."""

    lines: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)


def prepare_tables(engine: Any, config: Config, connector: Connector) -> Prepared:
    """Create or adopt the signal table, then the notification table."""
    done = Prepared()
    _signal_table(engine, config, connector, done)
    if "table" in config.notifications.channels:
        _notification_table(engine, config, done)
    return done


def _signal_table(engine: Any, config: Config, connector: Connector, done: Prepared) -> None:
    from snapshotter.common.errors import is_privilege_error, source_reason

    table = config.source.signal_table_id
    try:
        made = connector.create_signal_table(engine)
    except connector.errors as exc:
        if not is_privilege_error(exc):
            raise
        grant = connector.signal_table_grant(connector.handle_user(engine))
        done.problems.append(
            Problem(
                what=f"cannot create the signal table {table}: {source_reason(exc)}",
                fix=f"{grant}; or have its owner create it (run `snapshotter init` as a user "
                "that may), then run init again",
            )
        )
        return
    expected = signal_table(table)
    if not _made_or_adopted(engine, config, done, made, expected, SIGNAL, "[source] signal_table"):
        return
    if not made and isinstance(connector, PublishedLog):
        others = connector.other_publications(engine, table)
        if others:
            done.problems.append(_shared(table, others))


def _notification_table(engine: Any, config: Config, done: Prepared) -> None:
    from snapshotter.app.notifications import create_notification_table, notification_table
    from snapshotter.common.errors import is_privilege_error, source_reason

    table = config.notification_table_id
    try:
        with engine.begin() as conn:
            made = create_notification_table(conn, table)
    except sa.exc.DBAPIError as exc:
        if not is_privilege_error(exc):
            raise
        user = engine.url.username or "the configured user"
        done.problems.append(
            Problem(
                what=f"cannot create the notification table {table}: {source_reason(exc)}",
                fix=f"let {user} create tables in {table.schema} (and insert into them); or "
                'have its owner create it, or take "table" out of '
                "[notifications] channels, then run init again",
            )
        )
        return
    expected = notification_table(table)
    _made_or_adopted(engine, config, done, made, expected, NOTIFICATION, "[notifications] table")


def _made_or_adopted(
    engine: Any,
    config: Config,
    done: Prepared,
    made: bool,
    expected: sa.Table,
    kind: str,
    setting: str,
) -> bool:
    """Record a table init created; or check the layout of one that was there (a problem
    when it is not one of ``kind``). Whether the table can be used."""
    table = TableId(expected.schema, expected.name)
    if made:
        created.remember(config, kind, str(table))
        done.lines.append(f"{kind} {table}: created")
        return True
    wrong = _layout(engine, expected, kind, setting)
    if wrong is not None:
        done.problems.append(wrong)
        return False
    done.lines.append(f"{kind} {table}: {_there(config, kind, table)}")
    return True


def _there(config: Config, kind: str, table: TableId) -> str:
    if created.was_created(config, kind, str(table)):
        return "already there"
    return "already there (not created by init: teardown keeps it)"


def layout_refusal(engine: Any, expected: sa.Table, kind: str, setting: str) -> str | None:
    """Why an existing ``kind`` cannot be used as is, with the fix (one line); None when its
    layout is the engine's, when it does not exist, or when the source is not SQL (Spanner
    makes its signal table itself)."""
    found = _layout(engine, expected, kind, setting)
    return None if found is None else f"{found.what}; {found.fix}"


def _layout(engine: Any, expected: sa.Table, kind: str, setting: str) -> Problem | None:
    from snapshotter.sources.table_layout import describe_layout, layout_problems

    if not isinstance(engine, sa.Engine):
        return None
    with engine.connect() as conn:
        if not sa.inspect(conn).has_table(expected.name, schema=expected.schema):
            return None
        problems = layout_problems(conn, expected)
    if not problems:
        return None
    name = f"{expected.schema}.{expected.name}" if expected.schema else expected.name
    return Problem(
        f"{setting} names {name}, an existing table that is not a {kind} "
        f"({'; '.join(problems)}; a {kind} has: {describe_layout(expected)}): the engine "
        "would write into it, and it is never adopted",
        f"name another table in {setting} (one that does not exist, for init to create), "
        "or give this one that layout",
    )


def _shared(table: TableId, publications: Sequence[str]) -> Problem:
    return Problem(
        f"the signal table {table} is also in publication {', '.join(publications)} (another "
        "pipeline or Debezium connector reads its signals): execute-snapshot and "
        "stop-snapshot name tables, and each pipeline acts only on the tables it captures, "
        "but pause-snapshot, resume-snapshot and log reach every pipeline that reads it",
        "to control this pipeline apart, give it a signal table of its own: [source] "
        'signal_table = "<schema>.<name>" (docs/signals.md: Several pipelines)',
        "warning",
    )


def privilege_problems(engine: Any, config: Config, tables: Sequence[TableId]) -> list[Problem]:
    """Each privilege the engine will use on the captured ``tables``, the signal table and
    the notification table that the user lacks, with its GRANT (SQL sources)."""
    from snapshotter.sources.privileges import missing_privileges, needs_of

    if not isinstance(engine, sa.Engine):
        return []
    notification = (
        config.notification_table_id if "table" in config.notifications.channels else None
    )
    needs = needs_of(tables, config.source.signal_table_id, notification)
    return missing_privileges(engine, needs)

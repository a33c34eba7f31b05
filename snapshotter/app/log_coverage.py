"""Whether the source's log carries what this pipeline needs (``Connector.
log_coverage_problems``): its signal table (without it no signal and no watermark arrives,
and a snapshot waits forever) and the tables it has snapshotted (their changes would be
missing from the output). A table never snapshotted yet is not asked for: the engine adds it
to the capture before its first chunk.

* ``run`` checks at start: where the source can repair it (a PostgreSQL publication the role
  owns lost a table) it does, logged; otherwise it refuses with the fix.
* ``status`` shows the problems as warnings; ``signal`` warns that a signal would be lost.
* ``run`` also refuses a notification table that is not one (``[notifications] table``
  naming a user table): the engine would write into it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from signals.names import TableId, parse_table_selector
from signals.plan import Selectors
from snapshotter.config import Config
from snapshotter.core.state import EngineState
from snapshotter.engine.watchdog import LogCoverageError, coverage_message
from snapshotter.sources.base import Dialect
from snapshotter.sources.connector import ConnectError, Connector, PublishedLog, connector_for
from snapshotter.sources.positions import error_reason
from snapshotter.sources.setup_common import SetupError, captured_by

log = logging.getLogger("snapshotter.engine")

CONNECT_TIMEOUT_S = 10


def watched_tables(config: Config, state: EngineState) -> list[TableId]:
    """The tables whose changes the output already holds: those with a snapshot in the state
    that ``source.tables`` still selects (not the engine's own tables), each once."""
    source = config.source
    captured = Selectors(map(parse_table_selector, source.tables), source.default_schema)
    own = {source.signal_table_id}
    if "table" in config.notifications.channels:
        own.add(config.notification_table_id)
    tables = (p.table for p in state.snapshots)
    return [t for t in dict.fromkeys(tables) if t not in own and captured.selects(t)]


def captured_now(config: Config, list_tables: Callable[[], list[TableId]]) -> list[TableId]:
    """The tables ``source.tables`` selects in the source now (a configured name that does
    not exist has no changes to miss), without the signal table."""
    source = config.source
    signal_table = source.signal_table_id
    captured = captured_by(source.tables, source.default_schema, signal_table)
    return [t for t in list_tables() if t != signal_table and captured(t)]


def tables_to_cover(
    config: Config,
    connector: Connector,
    list_tables: Callable[[], list[TableId]],
    state: EngineState,
) -> list[TableId]:
    """The tables the log must carry: every table captured now, where the log carries what
    the source's own capture names (a Spanner change stream, the binlog); where the engine
    adds a table to the capture before its first chunk (a PostgreSQL publication:
    ``PublishedLog``), the tables whose changes the output already holds (snapshotted)."""
    if isinstance(connector, PublishedLog):
        return watched_tables(config, state)
    return captured_now(config, list_tables)


def _notification_refusal(config: Config, engine: Any) -> list[str]:
    """The notification table's layout problem, if ``[notifications] table`` names a table
    that is not one."""
    if "table" not in config.notifications.channels:
        return []
    from snapshotter.app.notifications import notification_table
    from snapshotter.app.own_tables import NOTIFICATION, layout_refusal

    expected = notification_table(config.notification_table_id)
    refusal = layout_refusal(engine, expected, NOTIFICATION, "[notifications] table")
    return [] if refusal is None else [refusal]


def check_at_start(config: Config, dialect: Dialect, state: EngineState) -> None:
    """``run``'s check before streaming: LogCoverageError with the fix for what the log lacks
    and cannot be repaired here (SetupError for a notification table that is not one); what
    can be (tables a publication of ours lost) is, logged. A source that cannot be asked is
    left to the log reader's own error, and to the running engine's checks."""
    connector = connector_for(config.source)
    try:
        engine = connector.connect(timeout_s=CONNECT_TIMEOUT_S)
    except ConnectError as exc:
        log.warning("could not check what the log carries: %s", exc)
        return
    try:
        refusal = _notification_refusal(config, engine)
        if refusal:
            raise SetupError(refusal[0])
        tables = tables_to_cover(config, connector, dialect.list_tables, state)
        problems = connector.log_coverage_problems(engine, tables)
        if not problems:
            return
        if not isinstance(connector, PublishedLog):
            raise LogCoverageError(coverage_message(problems, None))
        try:
            repaired = connector.repair_log_coverage(engine, tables)
        except SetupError as exc:  # it may not: the problems, with the fix
            raise LogCoverageError(coverage_message(str(exc).split("; "), None)) from None
        for statement in repaired:
            log.warning(
                "the log lacked what this pipeline needs (%s); repaired: %s. Signals and "
                "changes written while it was missing are not in the log: send those signals "
                "again, and snapshot those tables again if their changes matter",
                "; ".join(problems),
                statement,
            )
    except connector.errors as exc:
        log.warning("could not check what the log carries: %s", error_reason(exc))
    finally:
        connector.dispose(engine)


def check_before_streaming(config: Config, dialect: Dialect, state_file: Path) -> None:
    """:func:`check_at_start` against the state saved in ``state_file``, closing ``dialect``
    when it raises: nothing else is open yet."""
    from snapshotter.engine.state_store import StateStore

    try:
        check_at_start(config, dialect, StateStore(state_file).load())
    except (SetupError, LogCoverageError):
        dialect.close()
        raise


def coverage_warnings(config: Config, state: EngineState) -> list[str]:
    """``status``'s warnings about what the log lacks; [] when the source cannot be asked
    (the stream position's warnings say so)."""
    connector = connector_for(config.source)
    try:
        engine = connector.connect(timeout_s=CONNECT_TIMEOUT_S)
    except ConnectError:
        return []
    dialect: Dialect | None = None
    try:
        if not isinstance(connector, PublishedLog):  # the tables captured now are asked for
            dialect = connector.open_dialect()
        tables = tables_to_cover(config, connector, _lister(dialect), state)
        problems = connector.log_coverage_problems(engine, tables)
        return problems + _notification_refusal(config, engine)
    except connector.errors as exc:
        return [f"could not check what the log carries: {error_reason(exc)}"]
    finally:
        if dialect is not None:
            dialect.close()
        connector.dispose(engine)


def _lister(dialect: Dialect | None) -> Callable[[], list[TableId]]:
    return (lambda: []) if dialect is None else dialect.list_tables


def signal_warnings(config: Config, engine: Any) -> list[str]:
    """What ``signal`` warns about before inserting: the log does not carry the signal table
    (the engine would never see the signal)."""
    connector = connector_for(config.source)
    try:
        return connector.log_coverage_problems(engine, [])
    except connector.errors as exc:
        return [f"could not check that the log carries the signal table: {error_reason(exc)}"]

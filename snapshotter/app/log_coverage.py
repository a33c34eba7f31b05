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
from pathlib import Path
from typing import Any

from signals.names import TableId, parse_table_selector
from signals.plan import Selectors
from snapshotter.config import Config
from snapshotter.core.state import EngineState
from snapshotter.sources.base import Dialect
from snapshotter.sources.connector import ConnectError, PublishedLog, connector_for
from snapshotter.sources.positions import error_reason
from snapshotter.sources.setup_common import SetupError

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


def _problems(config: Config, engine: Any, tables: list[TableId]) -> list[str]:
    connector = connector_for(config.source)
    return connector.log_coverage_problems(engine, tables) + _notification_refusal(config, engine)


def check_at_start(config: Config, state: EngineState) -> None:
    """``run``'s check before streaming: SetupError with the fix for what the log lacks and
    cannot be repaired here; what can be (tables a publication of ours lost) is, logged. A
    source that cannot be asked is left to the log reader's own error."""
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
        tables = watched_tables(config, state)
        problems = connector.log_coverage_problems(engine, tables)
        if not problems:
            return
        if not isinstance(connector, PublishedLog):
            raise SetupError("; ".join(problems))
        # Raises SetupError with the problems when it may not repair them.
        for statement in connector.repair_log_coverage(engine, tables):
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
        check_at_start(config, StateStore(state_file).load())
    except SetupError:
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
    try:
        return _problems(config, engine, watched_tables(config, state))
    except connector.errors as exc:
        return [f"could not check what the log carries: {error_reason(exc)}"]
    finally:
        connector.dispose(engine)


def signal_warnings(config: Config, engine: Any) -> list[str]:
    """What ``signal`` warns about before inserting: the log does not carry the signal table
    (the engine would never see the signal)."""
    connector = connector_for(config.source)
    try:
        return connector.log_coverage_problems(engine, [])
    except connector.errors as exc:
        return [f"could not check that the log carries the signal table: {error_reason(exc)}"]

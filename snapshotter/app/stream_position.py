"""Whether the log position the saved state resumes from can still be read, and what to say
and do when it cannot: ``run``'s check before the log reader opens, ``status``'s warnings and
``reset-stream``.

A PostgreSQL slot can be dropped, invalidated, or dropped and created again, or moved on by
another consumer; a binlog file can be purged. Either way the changes after the saved
position cannot be read any more, and starting anyway would skip them without a word. The
engine refuses, and the message names the way out: ``reset-stream`` (stream from the current
end of the log), then ``execute-snapshot`` of the tables whose changes may be missing.

Each source's connector decides from its own facts (``sources/postgres/positions.py``: the
slot; ``sources/mysql/positions.py``: the binlog files); this module ties those checks to
the saved state, the same for every source.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from snapshotter.config import Config
from snapshotter.core.position import Position
from snapshotter.core.state import EngineState, StateError
from snapshotter.sources.base import Dialect, TableError
from snapshotter.sources.connector import ConnectError, connector_for, saved_position_text
from snapshotter.sources.positions import (
    CONF,
    LostPosition,
    StreamPositionLost,
    error_reason,
)
from snapshotter.sources.setup_common import resolve_tables

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10  # status must answer even when the source does not


def tables_to_snapshot(captured: Sequence[str], state: EngineState) -> list[str]:
    """The tables whose changes may be missing after a lost position: every captured table,
    and any table with an unfinished snapshot, each once."""
    out = dict.fromkeys(captured)
    for progress in state.snapshots:
        if not progress.status.finished:
            out.setdefault(str(progress.table))
    return list(out)


def reset_state(
    state: EngineState, resume: Mapping[str, Any], position: Position, reason: str
) -> list[str]:
    """Make ``state`` stream from ``resume`` (at ``position``, which sorts before every event
    streamed from there): unfinished snapshots are stopped with ``reason``; the sink's
    resume point, the snapshot history and the processed signals stay (except signals
    recorded past the new position: a log reset restarts positions lower, and they would
    hide new signals of the same id). Returns the tables whose snapshots were stopped.

    Refuses a position below the saved one (a binlog reset, a database restored or failed
    over): the output holds events at higher positions, which would win over every new one
    wherever the output is materialized by position (Spark's current state, a consumer
    keeping the highest ``source.pos``)."""
    if state.stream.position and position.token < state.stream.position:
        raise StateError(
            f"the log's positions start over: its end ({position.token}) is before the "
            f"state's position ({state.stream.position}), as after RESET MASTER or a restore "
            "or failover of the database. The output already holds events at higher "
            "positions, which would win over every new one; start afresh instead: move the "
            "state directory and the sink's output (file, landing root and staging, or "
            "topics) away, then `snapshotter init`, `run`, and execute-snapshot the tables"
        )
    state.stream.resume = dict(resume)
    state.stream.position = position.token
    stopped = []
    for progress in state.snapshots:
        if not progress.status.finished:
            progress.stop()
            progress.error = reason
            progress.finished_ms = time.time_ns() // 1_000_000
            stopped.append(str(progress.table))
    state.processed_signals = {
        sid: token for sid, token in state.processed_signals.items() if token <= position.token
    }
    return stopped


# --- IO: facts from the source -------------------------------------------------------------


def captured_tables(config: Config, dialect: Dialect) -> list[str]:
    """``source.tables`` resolved to the tables there now (the patterns as written when the
    catalog cannot be read), without the signal table."""
    source = config.source
    try:
        tables = resolve_tables(dialect, source.tables, source.default_schema)
    except Exception as exc:
        if not isinstance(exc, (TableError, *connector_for(source).errors)):
            raise
        return list(source.tables)
    return [str(t) for t in tables if t != source.signal_table_id]


def check_saved_position(config: Config, dialect: Dialect, state: EngineState) -> None:
    """Raise :class:`StreamPositionLost` when state has a saved position the source can no
    longer stream from. Nothing to check without one (a first run starts at the slot, or at
    the binlog's end); a source that cannot be asked is left to the log reader's own error."""
    resume = state.stream.resume
    connector = connector_for(config.source)
    if not connector.has_saved_position(resume):
        return
    try:
        engine = connector.connect(timeout_s=CONNECT_TIMEOUT_S)
    except ConnectError as exc:
        log.warning("could not check the saved stream position: %s", exc)
        return
    try:
        problem = connector.position_problem(engine, resume)
    except connector.errors as exc:
        log.warning("could not check the saved stream position: %s", error_reason(exc))
        return
    finally:
        connector.dispose(engine)
    if problem is None:
        return
    lost = LostPosition(
        problem,
        saved_position_text(resume),
        tuple(tables_to_snapshot(captured_tables(config, dialect), state)),
    )
    raise StreamPositionLost(lost)


def check_before_streaming(config: Config, dialect: Dialect, state_file: Path) -> None:
    """:func:`check_saved_position` against the state saved in ``state_file`` (what the
    engine resumes from), closing ``dialect`` when it raises: nothing else is open yet."""
    from snapshotter.engine.state_store import StateStore

    try:
        check_saved_position(config, dialect, StateStore(state_file).load())
    except StreamPositionLost:
        dialect.close()
        raise


@dataclass(frozen=True, slots=True)
class Health:
    """What ``status`` says of the stream position, and the state it was judged against."""

    warnings: list[str]
    reachable: bool  # whether the source answered
    state: EngineState
    # Why the source could not be reached (ConnectError's first line: what failed, where,
    # the URL masked, and what to check); None when it answered.
    unreachable: str | None = None


def stream_health(
    config: Config, load_state: Callable[[], EngineState], config_path: str = CONF
) -> Health:
    """``status``'s warnings: a missing, lost or ahead slot, a purged binlog file, a log
    backlog past ``source.backlog_warn_mb``; or why the source could not be checked.

    A running engine moves both the state and the log position while they are read, so
    the state is read (``load_state``) when the connector says, before or after its own
    facts (``Connector.position_warnings``), and whatever it finds is said only if a second
    such read finds it too (the second read is reported): a warning that names
    ``reset-stream``, which throws changes away, must never come from a race."""
    from snapshotter.common.redact import mask_url

    source = config.source
    connector = connector_for(source)
    url = mask_url(source.url)  # also a ?password= in the query, which SQLAlchemy shows
    what = connector.log_name
    try:
        engine = connector.connect(timeout_s=CONNECT_TIMEOUT_S)
    except ConnectError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        warning = f"could not check the {what} at {url}: {first}"
        return Health([warning], False, load_state(), unreachable=first)
    read: list[EngineState] = []

    def saved() -> Mapping[str, Any]:
        read.append(load_state())
        return read[-1].stream.resume

    try:
        warnings = connector.position_warnings(engine, saved, source.backlog_warn_mb, config_path)
        if warnings:
            warnings = connector.position_warnings(
                engine, saved, source.backlog_warn_mb, config_path
            )
    except connector.errors as exc:
        warnings = [f"could not check the {what} at {url}: {error_reason(exc)}"]
    finally:
        connector.dispose(engine)
    return Health(warnings, True, read[-1] if read else load_state())


# --- IO: reset-stream ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResetPlan:
    """What ``reset-stream`` found, shown before it asks to go on."""

    saved: str  # the saved position, readable
    problem: str | None  # why it is gone; None when it can still be read
    backlog: int | None  # bytes of log it would skip, where known
    tables: list[str]  # to snapshot again
    unfinished: list[str]  # snapshots it stops


def plan_reset(config: Config, engine: Any, dialect: Dialect, state: EngineState) -> ResetPlan:
    connector = connector_for(config.source)
    resume = state.stream.resume
    problem: str | None = None
    backlog: int | None = None
    if connector.has_saved_position(resume):
        problem = connector.position_problem(engine, resume)
        if problem is None:
            backlog = connector.position_backlog(engine, dialect, resume)
    return ResetPlan(
        saved=saved_position_text(resume),
        problem=problem,
        backlog=backlog,
        tables=tables_to_snapshot(captured_tables(config, dialect), state),
        unfinished=[str(p.table) for p in state.snapshots if not p.status.finished],
    )

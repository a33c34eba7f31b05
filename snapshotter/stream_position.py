"""Whether the log position the saved state resumes from can still be read, and what to say
and do when it cannot: ``run``'s check before the log reader opens, ``status``'s warnings,
``reset-stream`` and ``teardown``.

A PostgreSQL slot can be dropped, invalidated (``wal_status = lost``, past
``max_slot_wal_keep_size``), or dropped and created again, or moved on by another consumer;
a binlog file can be purged. Either way the changes after the saved position cannot be read
any more, and starting anyway would skip them without a word (PostgreSQL starts a slot at
its own confirmed position, whatever position the client asks for). The engine refuses, and
the message names the way out: ``reset-stream`` (stream from the current end of the log),
then ``execute-snapshot`` of the tables whose changes may be missing.

The decisions and messages are pure functions of facts (:class:`SlotFacts`, the binlog file
list); the SQL that gathers the facts lives in ``dialects/pg_setup.py`` and
``dialects/my_setup.py``, and the functions at the end of this module (IO) tie the two.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from signals.names import TableId
from snapshotter.config import Config
from snapshotter.core.position import Position
from snapshotter.core.state import EngineState, StateError
from snapshotter.sources.base import Dialect, TableError
from snapshotter.sources.mysql import setup as my_setup
from snapshotter.sources.mysql.setup import BinlogRetention
from snapshotter.sources.postgres import setup as pg_setup
from snapshotter.sources.postgres.setup import SetupError, SlotFacts, lsn_text

log = logging.getLogger(__name__)

CONF = "CONF"  # the config file in messages built where its path is not known
MB = 1024 * 1024
CONNECT_TIMEOUT_S = 10  # status must answer even when the source does not


# --- messages (pure) -----------------------------------------------------------------------


def saved_position_text(resume: Mapping[str, Any]) -> str:
    """The saved restart point as people read it."""
    if resume.get("file"):
        return f"binlog file {resume['file']} at {resume.get('pos')}"
    lsn = resume.get("lsn")
    if isinstance(lsn, int) and lsn:
        return f"LSN {lsn_text(lsn)}"
    return "no saved position"


def has_saved_position(kind: str, resume: Mapping[str, Any]) -> bool:
    """Whether state holds a position to resume from (else a first run starts fresh)."""
    if kind == "mysql":
        return bool(resume.get("file"))
    lsn = resume.get("lsn")
    return isinstance(lsn, int) and lsn > 0


def size_text(count: int) -> str:
    if count >= MB:
        return f"{count / MB:,.1f} MB"
    return f"{count:,} bytes"


def execute_snapshot_command(config: str, tables: Sequence[str]) -> str:
    """The ``snapshotter signal ... execute-snapshot`` line for ``tables``, shell-quoted."""
    names = " ".join(shlex.quote(t) for t in tables) if tables else "TABLE..."
    return f"snapshotter signal -c {shlex.quote(config)} execute-snapshot {names}"


def tables_to_snapshot(captured: Sequence[str], state: EngineState) -> list[str]:
    """The tables whose changes may be missing after a lost position: every captured table,
    and any table with an unfinished snapshot, each once."""
    out = dict.fromkeys(captured)
    for progress in state.snapshots:
        if not progress.status.finished:
            out.setdefault(str(progress.table))
    return list(out)


@dataclass(frozen=True, slots=True)
class LostPosition:
    """A saved position the server can no longer stream from."""

    what: str  # what is gone, and why
    saved: str  # the saved position, readable
    tables: tuple[str, ...] = ()  # the tables to snapshot again


def lost_message(lost: LostPosition, config: str = CONF) -> str:
    tables = ", ".join(lost.tables) if lost.tables else "every captured table"
    quoted = shlex.quote(config)
    return (
        f"{lost.what}\n"
        f"  The state resumes from {lost.saved}; the changes made since then cannot be read "
        f"any more, so the output may be missing changes of: {tables}.\n"
        "  To go on, stream from the current end of the log and snapshot the tables again:\n"
        f"    snapshotter reset-stream -c {quoted}\n"
        f"    {execute_snapshot_command(config, lost.tables)}\n"
        "  (or start over with a fresh state directory and snapshot the tables again). A "
        "snapshot emits the rows that exist: rows deleted in between are not deleted in the "
        "output."
    )


class StreamPositionLost(StateError):
    """The saved stream position is gone; the message says what to do."""

    def __init__(self, lost: LostPosition, config: str = CONF) -> None:
        super().__init__(lost_message(lost, config))
        self.lost = lost

    def for_config(self, config: str, tables: Sequence[str] | None = None) -> StreamPositionLost:
        """The same error naming the config file (and, if given, the tables)."""
        lost = self.lost if tables is None else replace(self.lost, tables=tuple(tables))
        return StreamPositionLost(lost, config)


def slot_problem(slot: str, facts: SlotFacts | None, saved_lsn: int) -> str | None:
    """Why ``slot`` cannot stream from ``saved_lsn``; None when it can."""
    if facts is None:
        return (
            f"replication slot {slot!r} does not exist: it was dropped (or the database was "
            "restored, or failed over to a server without it)"
        )
    if facts.invalidated:
        if facts.invalidation_reason in (None, "wal_removed") and not facts.conflicting:
            reason = (
                "the WAL it needed was removed (it retained more than max_slot_wal_keep_size "
                f"= {facts.max_slot_wal_keep_size})"
            )
        elif facts.invalidation_reason is not None:
            reason = f"invalidation_reason = {facts.invalidation_reason}"
        else:
            reason = "a recovery conflict on this standby"
        return f"replication slot {slot!r} was invalidated (wal_status = lost): {reason}"
    confirmed = facts.confirmed_flush_lsn
    if confirmed is not None and confirmed > saved_lsn:
        return (
            f"replication slot {slot!r} starts at LSN {lsn_text(confirmed)}, after the "
            "state's position: it was dropped and created again (by `snapshotter init`?) or "
            "moved on by another consumer, and PostgreSQL would start streaming there, "
            "skipping what lies in between"
        )
    return None


def binlog_problem(file: str, pos: int, logs: Sequence[tuple[str, int]]) -> str | None:
    """Why the binlog cannot be read from ``file`` at ``pos``, given ``SHOW BINARY LOGS``;
    None when it can."""
    sizes = dict(logs)
    if file not in sizes:
        have = f"{logs[0][0]} to {logs[-1][0]}" if logs else "none"
        return (
            f"binlog file {file} is no longer on the server (it has {have}): it was purged "
            "(binlog_expire_logs_seconds / expire_logs_days, or PURGE BINARY LOGS), or binary "
            "logging was reset (RESET MASTER)"
        )
    # The current file grows; only a finished file's size is final.
    if file != logs[-1][0] and pos > sizes[file]:
        return (
            f"binlog file {file} has {sizes[file]} bytes, fewer than the saved offset {pos}: "
            "binary logging was reset (RESET MASTER), or this is another server"
        )
    return None


def binlog_backlog(file: str, pos: int, logs: Sequence[tuple[str, int]]) -> int | None:
    """Binlog bytes from ``file`` at ``pos`` to the end; None when the file is gone."""
    names = [name for name, _ in logs]
    if file not in names:
        return None
    index = names.index(file)
    return max(0, logs[index][1] - pos) + sum(size for _, size in logs[index + 1 :])


def _to_go_on(config: str) -> str:
    quoted = shlex.quote(config)
    return f"run `snapshotter reset-stream -c {quoted}`, then snapshot the tables again"


def pg_warnings(
    slot: str,
    facts: SlotFacts | None,
    resume: Mapping[str, Any],
    threshold_mb: int,
    config: str = CONF,
) -> list[str]:
    """What ``status`` warns about a PostgreSQL slot (facts: None when it does not exist)."""
    quoted = shlex.quote(config)
    saved = has_saved_position("postgres", resume)
    if facts is None:
        if saved:
            return [
                f"replication slot {slot!r} does not exist, so the state's position "
                f"({saved_position_text(resume)}) is gone and `snapshotter run` will refuse "
                f"to start: {_to_go_on(config)}"
            ]
        return [
            f"replication slot {slot!r} does not exist: run `snapshotter init -c {quoted}` "
            "to create it"
        ]
    warnings = []
    problem = slot_problem(slot, facts, int(resume["lsn"])) if saved else None
    if problem is None and facts.invalidated:  # no saved position: init's slot is lost
        problem = slot_problem(slot, facts, 0)
    if problem is not None:
        warnings.append(f"{problem}; `snapshotter run` will refuse to start: {_to_go_on(config)}")
    elif facts.wal_status == "unreserved":
        warnings.append(
            f"replication slot {slot!r} has wal_status = unreserved: it needs more WAL than "
            f"max_slot_wal_keep_size = {facts.max_slot_wal_keep_size} keeps, and the next "
            "checkpoint invalidates it unless the engine reads on; run `snapshotter run -c "
            f"{quoted}` now (once it is lost, the tables must be snapshotted again)"
        )
    retained = facts.retained_bytes
    if retained is not None and retained > threshold_mb * MB and not facts.invalidated:
        if facts.max_slot_wal_keep_size.strip() == "-1":
            limit = "max_slot_wal_keep_size = -1, so nothing bounds it and the disk can fill up"
        else:
            limit = (
                f"past max_slot_wal_keep_size = {facts.max_slot_wal_keep_size} PostgreSQL "
                "invalidates the slot and its position is lost"
            )
        unconfirmed = facts.unconfirmed_bytes
        if unconfirmed is not None and unconfirmed <= threshold_mb * MB:
            cause = (
                f"the engine has confirmed all but {size_text(unconfirmed)} of it, so a "
                "transaction open for long (pg_stat_activity.xact_start) holds the slot's "
                "restart point back"
            )
        else:
            state = "streaming from it but behind" if facts.active else "not running"
            cause = f"it is kept until the engine confirms past it, and the engine is {state}"
        warnings.append(
            f"replication slot {slot!r} holds {size_text(retained)} of WAL on the database "
            f"server's disk (more than source.backlog_warn_mb = {threshold_mb}): {cause}; "
            f"{limit}. Run `snapshotter run -c {quoted}` to catch up; if this capture is not "
            f"wanted any more, `snapshotter teardown -c {quoted}` drops the slot"
        )
    return warnings


def mysql_warnings(
    resume: Mapping[str, Any],
    logs: Sequence[tuple[str, int]],
    retention: BinlogRetention,
    threshold_mb: int,
    config: str = CONF,
) -> list[str]:
    """What ``status`` warns about the binlog behind the saved position."""
    if not has_saved_position("mysql", resume):
        return []
    file, pos = str(resume["file"]), int(resume.get("pos", 0))
    problem = binlog_problem(file, pos, logs)
    if problem is not None:
        return [f"{problem}; `snapshotter run` will refuse to start: {_to_go_on(config)}"]
    backlog = binlog_backlog(file, pos, logs)
    if backlog is None or backlog <= threshold_mb * MB:
        return []
    if retention.seconds:
        deadline = (
            f"{retention}: unless the engine reads past {file} before the server purges it, "
            "its position is lost and the tables must be snapshotted again"
        )
    else:
        deadline = f"{retention}, so the binlog keeps growing on its disk until purged by hand"
    return [
        f"{size_text(backlog)} of binlog after the saved position ({file} at {pos}) is not "
        f"read yet (more than source.backlog_warn_mb = {threshold_mb}): the engine is behind "
        f"or stopped. {deadline[0].upper()}{deadline[1:]}. Run `snapshotter run -c "
        f"{shlex.quote(config)}` to catch up"
    ]


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
        tables = pg_setup.resolve_tables(dialect, source.tables, source.default_schema)
    except (TableError, sa.exc.SQLAlchemyError):
        return list(source.tables)
    return [str(t) for t in tables if t != source.signal_table_id]


def _slot_facts(engine: sa.Engine, slot: str) -> SlotFacts | None:
    with engine.connect() as conn:
        return pg_setup.slot_facts(conn, slot)


def _binary_logs(engine: sa.Engine) -> list[tuple[str, int]]:
    with engine.connect() as conn:
        return my_setup.binary_logs(conn)


def _problem_now(config: Config, engine: sa.Engine, resume: Mapping[str, Any]) -> str | None:
    if config.source.kind == "mysql":
        file, pos = str(resume["file"]), int(resume.get("pos", 0))
        return binlog_problem(file, pos, _binary_logs(engine))
    return slot_problem(
        config.source.slot, _slot_facts(engine, config.source.slot), int(resume["lsn"])
    )


def error_reason(exc: sa.exc.SQLAlchemyError) -> str:
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def check_saved_position(config: Config, dialect: Dialect, state: EngineState) -> None:
    """Raise :class:`StreamPositionLost` when state has a saved position the source can no
    longer stream from. Nothing to check without one (a first run starts at the slot, or at
    the binlog's end); a source that cannot be asked is left to the log reader's own error."""
    resume = state.stream.resume
    if not has_saved_position(config.source.kind, resume):
        return
    engine = health_engine(config)
    try:
        problem = _problem_now(config, engine, resume)
    except sa.exc.SQLAlchemyError as exc:
        log.warning("could not check the saved stream position: %s", error_reason(exc))
        return
    finally:
        engine.dispose()
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
    from snapshotter.state_store import StateStore

    try:
        check_saved_position(config, dialect, StateStore(state_file).load())
    except StreamPositionLost:
        dialect.close()
        raise


def health_engine(config: Config) -> sa.Engine:
    """An engine for the checks here, with a connect timeout (status must answer)."""
    from snapshotter.connect import sqlalchemy_url

    args: dict[str, Any] = {"connect_timeout": CONNECT_TIMEOUT_S}
    if config.source.kind == "mysql":
        args["charset"] = "utf8mb4"
    return sa.create_engine(sqlalchemy_url(config.source), connect_args=args, poolclass=sa.NullPool)


@dataclass(frozen=True, slots=True)
class Health:
    """What ``status`` says of the stream position."""

    warnings: list[str]
    reachable: bool  # whether the source answered


def stream_health(config: Config, state: EngineState, config_path: str = CONF) -> Health:
    """``status``'s warnings: a missing, lost or ahead slot, a purged binlog file, a log
    backlog past ``source.backlog_warn_mb``; or why the source could not be checked."""
    source = config.source
    engine = health_engine(config)
    what = "replication slot" if source.kind == "postgres" else "binlog"
    connected = False
    try:
        with engine.connect() as conn:
            connected = True
            if source.kind == "postgres":
                facts = pg_setup.slot_facts(conn, source.slot)
                warnings = pg_warnings(
                    source.slot, facts, state.stream.resume, source.backlog_warn_mb, config_path
                )
            else:
                logs = my_setup.binary_logs(conn)
                warnings = mysql_warnings(
                    state.stream.resume,
                    logs,
                    my_setup.binlog_retention(conn),
                    source.backlog_warn_mb,
                    config_path,
                )
    except sa.exc.SQLAlchemyError as exc:
        from snapshotter.redact import mask_url

        url = mask_url(source.url)  # also a ?password= in the query, which SQLAlchemy shows
        return Health([f"could not check the {what} at {url}: {error_reason(exc)}"], connected)
    finally:
        engine.dispose()
    return Health(warnings, reachable=True)


# --- IO: reset-stream ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResetPlan:
    """What ``reset-stream`` found, shown before it asks to go on."""

    saved: str  # the saved position, readable
    problem: str | None  # why it is gone; None when it can still be read
    backlog: int | None  # bytes of log it would skip, where known
    tables: list[str]  # to snapshot again
    unfinished: list[str]  # snapshots it stops


def plan_reset(
    config: Config, engine: sa.Engine, dialect: Dialect, state: EngineState
) -> ResetPlan:
    resume = state.stream.resume
    problem: str | None = None
    backlog: int | None = None
    if has_saved_position(config.source.kind, resume):
        problem = _problem_now(config, engine, resume)
        if problem is None and config.source.kind == "mysql":
            pos = int(resume.get("pos", 0))
            backlog = binlog_backlog(str(resume["file"]), pos, _binary_logs(engine))
        elif problem is None:
            backlog = dialect.lag_bytes(resume)
    return ResetPlan(
        saved=saved_position_text(resume),
        problem=problem,
        backlog=backlog,
        tables=tables_to_snapshot(captured_tables(config, dialect), state),
        unfinished=[str(p.table) for p in state.snapshots if not p.status.finished],
    )


@dataclass(frozen=True, slots=True)
class NewStart:
    """Where the stream starts after ``reset-stream``, and what was done to get there."""

    resume: dict[str, Any]
    position: Position
    done: list[str]


def move_to_log_end(config: Config, engine: sa.Engine, dialect: Dialect) -> NewStart:
    """PostgreSQL: drop the slot if it exists (never an active one), create it again (after
    the publication, which must exist); MySQL: the binlog's current end."""
    source = config.source
    if source.kind == "mysql":
        from snapshotter.sources.mysql.dialect import MySqlDialect, binlog_file_number

        assert isinstance(dialect, MySqlDialect)
        start = dialect.binlog_start()
        file, pos = str(start["file"]), int(start["pos"])
        return NewStart(
            {"file": file, "pos": pos},
            Position(binlog_file_number(file), pos),
            [f"binlog position: the current end, {file} at {pos}"],
        )
    slot = source.slot
    with engine.connect() as conn:
        if not pg_setup.publication_exists(conn, source.publication):
            raise SetupError(
                f"publication {source.publication} does not exist: run `snapshotter init` "
                "first (it creates the publication, then the slot), then reset-stream"
            )
        facts = pg_setup.slot_facts(conn, slot)
    done = []
    if facts is not None:
        _refuse_active(slot, facts)
        if facts.invalidated:
            why = "it was invalidated"
        elif facts.confirmed_flush_lsn is not None:
            why = f"it was at LSN {lsn_text(facts.confirmed_flush_lsn)}"
        else:
            why = "it had no position"
        _drop_slot(engine, slot)
        done.append(f"replication slot {slot}: dropped ({why})")
    pg_setup.ensure_slot(engine, slot)
    with engine.connect() as conn:
        created = pg_setup.slot_facts(conn, slot)
    if created is None or created.confirmed_flush_lsn is None:
        raise SetupError(f"replication slot {slot} was created but has no position")
    lsn = created.confirmed_flush_lsn
    done.append(f"replication slot {slot}: created at LSN {lsn_text(lsn)}")
    # Every transaction the new slot sends commits at or after lsn: (lsn,) sorts first.
    return NewStart({"lsn": lsn}, Position(lsn), done)


def refuse_active_slot(config: Config, engine: sa.Engine) -> None:
    """Raise SetupError when an engine streams from the configured slot (PostgreSQL)."""
    if config.source.kind != "postgres":
        return
    facts = _slot_facts(engine, config.source.slot)
    if facts is not None:
        _refuse_active(config.source.slot, facts)


def _refuse_active(slot: str, facts: SlotFacts) -> None:
    """Refuse to drop a slot an engine streams from, or one that is not ours to drop (a
    physical slot of a standby, another plugin's: the same name by accident)."""
    if (facts.slot_type not in (None, "logical")) or (facts.plugin not in (None, "pgoutput")):
        raise SetupError(
            f"replication slot {slot} is a {facts.slot_type or '?'} slot of plugin "
            f"{facts.plugin or '-'}, not the logical pgoutput slot snapshotter creates: "
            "something else uses that name; set [source] slot to snapshotter's slot"
        )
    if facts.active:
        pid = f" (process {facts.active_pid})" if facts.active_pid else ""
        raise SetupError(
            f"replication slot {slot} is in use{pid}: an engine is streaming from it; stop "
            "that engine first"
        )


def _drop_slot(engine: sa.Engine, slot: str) -> bool:
    try:
        return pg_setup.drop_slot(engine, slot)
    except sa.exc.DBAPIError as exc:  # became active meanwhile
        raise SetupError(f"cannot drop replication slot {slot}: {error_reason(exc)}") from None


# --- IO: teardown ----------------------------------------------------------------------------


def teardown(config: Config, engine: sa.Engine) -> list[str]:
    """Drop what ``init`` created: PostgreSQL's slot (never an active one), publication and
    signal table; MySQL's signal table (nothing else exists there). Idempotent: returns one
    line per object, "dropped" or "already gone"."""
    source = config.source
    lines = []
    if source.kind == "postgres":
        with engine.connect() as conn:
            facts = pg_setup.slot_facts(conn, source.slot)
        if facts is not None:
            _refuse_active(source.slot, facts)
        dropped = facts is not None and _drop_slot(engine, source.slot)
        lines.append(f"replication slot {source.slot}: {_gone(dropped)}")
        dropped = pg_setup.drop_publication(engine, source.publication)
        lines.append(f"publication {source.publication}: {_gone(dropped)}")
    dropped = drop_signal_table(engine, source.signal_table_id)
    lines.append(f"signal table {source.signal_table_id}: {_gone(dropped)}")
    return lines


def _gone(dropped: bool) -> str:
    return "dropped" if dropped else "already gone"


def drop_signal_table(engine: sa.Engine, name: TableId) -> bool:
    """Drop the signal table if it exists; returns whether it existed."""
    from signals.table import signal_table

    table = signal_table(name)
    with engine.begin() as conn:
        if not sa.inspect(conn).has_table(table.name, schema=table.schema):
            return False
        table.drop(conn)
        return True

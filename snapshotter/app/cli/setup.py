"""Setting the source up and taking it down: ``init``, ``reset-stream`` and ``teardown``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from snapshotter.app.cli.common import CliError, Session, connect, err, out
from snapshotter.common.errors import explain
from snapshotter.common.redact import mask_url
from snapshotter.config import Config
from snapshotter.core.state import StateError
from snapshotter.engine.state_store import StateStore
from snapshotter.sources.base import TableError as TableErrorBase
from snapshotter.sources.connector import Connector, connector_for, saved_position_text

if TYPE_CHECKING:
    from snapshotter.app.stream_position import ResetPlan


def cmd_init(session: Session, args: argparse.Namespace) -> int:
    """Signal table, prerequisites, then what the source's log reader needs (the connector's
    ``create_capture``: PostgreSQL's publication, then slot); where the log keeps no position
    of ours (MySQL), the position the first run streams from, saved in the state (so signals
    sent between ``init`` and ``run`` are not missed). What it creates is recorded
    (``app.created``): teardown drops only that."""
    from snapshotter.app import created
    from snapshotter.app.own_tables import prepare_tables, privilege_problems
    from snapshotter.sources.base import TableError
    from snapshotter.sources.setup_common import SetupError

    config = session.load_config(args.config)
    source = config.source
    connector = connector_for(source)
    engine = connect(config)
    try:
        own = prepare_tables(engine, config, connector)
    except created.RecordError as exc:
        raise CliError(str(exc)) from None
    for line in own.lines:
        out.print(escape(line))
    try:
        setup = connector.check_setup(engine)
    except TableError as exc:
        raise CliError(f"source.tables: {exc}", code=2) from None
    if "table" in config.notifications.channels:
        # The engine's own output: never captured (no publication membership), even when
        # a source.tables pattern matches it.
        own_table = config.notification_table_id
        setup = replace(setup, tables=[t for t in setup.tables if t != own_table])
    if not source.tables:
        err.print("[yellow]warning:[/yellow] source.tables is empty: no table can be snapshotted")
    out.print(escape(f"captured tables: {', '.join(map(str, setup.tables)) or '(none yet)'}"))
    _print_problems(
        own.problems + setup.problems + privilege_problems(engine, config, setup.tables)
    )
    try:
        capture = connector.create_capture(engine, setup.tables)
        for kind, name in capture.created:
            created.remember(config, kind, name)
    except TableError as exc:
        raise CliError(f"source.tables: {exc}", code=2) from None
    except (SetupError, created.RecordError) as exc:
        raise CliError(str(exc)) from None
    for warning in capture.warnings:
        err.print(f"[yellow]warning:[/yellow] {escape(warning)}")
    for line in capture.done:
        out.print(escape(line))
    if capture.start is None or _save_start(config, connector, capture.start):
        _warn_if_position_lost(config, args.config)
    return 0


def _print_problems(problems: Sequence[Any]) -> None:
    for problem in problems:
        colour = "red" if problem.severity == "error" else "yellow"
        err.print(f"[{colour}]{problem.severity}:[/{colour}] {escape(problem.what)}")
        err.print(f"  fix: {escape(problem.fix)}")
    if any(p.severity == "error" for p in problems):
        raise CliError("prerequisites not met; fix the errors above and run init again")


def _save_start(config: Config, connector: Connector, start: dict[str, Any]) -> bool:
    """Save ``start`` as where the first run streams from, unless the state has a saved
    position already (kept: init never moves a stream on); whether it had one."""
    from snapshotter.engine.state_store import state_path

    config.state.dir.mkdir(parents=True, exist_ok=True)
    try:
        with StateStore(state_path(config)) as store:
            state = store.load()
            saved = state.stream.resume
            if connector.has_saved_position(saved):
                out.print(escape(f"stream position: {saved_position_text(saved)} (saved before)"))
                return True
            state.stream.resume = start
            store.save(state)
    except StateError as exc:
        raise CliError(str(exc)) from None
    out.print(escape(f"stream position: {saved_position_text(start)} (saved in the state)"))
    return False


def _warn_if_position_lost(config: Config, config_path: str) -> None:
    """After init: say so when the saved state resumes from a position that is gone (a slot
    init has just created again, a purged binlog), since `run` will refuse it."""
    from snapshotter.app.runner import open_dialect
    from snapshotter.app.stream_position import check_saved_position
    from snapshotter.engine.state_store import state_path
    from snapshotter.sources.positions import StreamPositionLost

    path = state_path(config)
    if not path.exists():
        return
    try:
        state = StateStore(path).load()
    except StateError:
        return
    dialect = open_dialect(config)
    try:
        check_saved_position(config, dialect, state)
    except StreamPositionLost as exc:
        message = str(exc.for_config(config_path))
        err.print(
            f"[yellow]warning:[/yellow] the state in {escape(str(config.state.dir))} cannot "
            f"resume, and `snapshotter run` will refuse it: {escape(message)}"
        )
    finally:
        dialect.close()


def confirm(args: argparse.Namespace, question: str) -> None:
    """Go on only after a yes on the terminal, or with --yes (never silently without one)."""
    if args.yes:
        return
    if not sys.stdin.isatty():
        raise CliError(
            f"{args.command} needs confirmation and stdin is not a terminal: pass --yes to go "
            "on; nothing was changed",
            code=2,
        )
    answer = err.input(f"{question} [y/N] ")
    if answer.strip().lower() not in ("y", "yes"):
        raise CliError(f"{args.command}: not confirmed; nothing was changed")


def cmd_reset_stream(session: Session, args: argparse.Namespace) -> int:
    """Stream from the current end of the log: a new slot (PostgreSQL) or the binlog's end
    (MySQL) in the state, unfinished snapshots stopped; then snapshot the tables again."""
    from snapshotter.app import stream_position as sp
    from snapshotter.engine.state_store import StateLockedError, state_path
    from snapshotter.sources.positions import execute_snapshot_command
    from snapshotter.sources.setup_common import SetupError

    config = session.load_config(args.config)
    connector = connector_for(config.source)
    engine = connect(config)
    path = state_path(config)
    try:
        with StateStore(path) as store:
            state = store.load()
            old = saved_position_text(state.stream.resume)
            dialect = connector.open_dialect()
            try:
                plan = sp.plan_reset(config, engine, dialect, state)
                _print_reset_plan(path, plan)
                confirm(args, "Reset the stream position?")
                start = connector.move_to_log_end(engine, dialect)
            finally:
                dialect.close()
            new = saved_position_text(start.resume)
            stopped = sp.reset_state(
                state,
                start.resume,
                start.position,
                f"stopped by reset-stream: the stream was reset from {old} to {new}, so "
                "changes in between are not in the output; snapshot the table again",
            )
            store.save(state)
    except StateLockedError as exc:
        raise CliError(str(exc)) from None  # "in use by another snapshotter process"
    except (StateError, SetupError, TableErrorBase) as exc:
        raise CliError(str(exc)) from None
    except connector.errors as exc:
        raise CliError(f"reset-stream: {explain(exc, config.source.url).text}") from None
    for line in start.done:
        out.print(escape(line))
    out.print(escape(f"state {path}: the stream now starts at {new} (it resumed from {old})"))
    if stopped:
        out.print(escape(f"stopped the unfinished snapshots of: {', '.join(stopped)}"))
    if state.paused:
        out.print("the engine is paused (pause-snapshot): new snapshots wait for resume-snapshot")
    out.print("snapshot the tables again (their changes before the new start may be missing):")
    out.print(escape(f"  {execute_snapshot_command(args.config, plan.tables)}"))
    return 0


def _print_reset_plan(path: Path, plan: ResetPlan) -> None:
    from snapshotter.sources.positions import size_text

    if plan.problem is not None:
        out.print(escape(f"state {path} resumes from {plan.saved}, which is gone: {plan.problem}"))
    elif plan.saved != "no saved position":
        behind = f" ({size_text(plan.backlog)} behind the log's end)" if plan.backlog else ""
        out.print(
            escape(
                f"state {path} resumes from {plan.saved}, which can still be read{behind}: "
                "resetting skips what lies between it and the end of the log"
            )
        )
    else:
        out.print(escape(f"state {path} has no saved stream position"))
    out.print(
        escape(
            "reset-stream makes the state stream from the current end of the log"
            + (
                f", stops the unfinished snapshots ({', '.join(plan.unfinished)})"
                if plan.unfinished
                else ""
            )
            + "; the tables to snapshot again afterwards: "
            + (", ".join(plan.tables) or "(none configured)")
        )
    )


def cmd_teardown(session: Session, args: argparse.Namespace) -> int:
    """Drop what init created (slot; publication, signal and notification tables when init
    recorded creating them, and no other publication carries the signal table); refuses an
    active slot and a state directory an engine holds."""
    import contextlib

    from snapshotter.app import created
    from snapshotter.app.teardown import plan_teardown, teardown
    from snapshotter.engine.state_store import StateLockedError, state_path
    from snapshotter.sources.setup_common import SetupError

    config = session.load_config(args.config)
    connector = connector_for(config.source)
    engine = connect(config)
    path = state_path(config)
    url = mask_url(config.source.url)
    # No state directory, no engine that could be using it: nothing to lock (or create).
    lock: Any = StateStore(path) if config.state.dir.exists() else contextlib.nullcontext()
    try:
        with lock:
            connector.refuse_drop(engine)
            plan = plan_teardown(config, engine)
            out.print(escape(f"teardown drops {', '.join(plan.drop) or 'nothing'} at {url}"))
            for line in plan.keep:
                out.print(escape(line))
            confirm(args, "Drop them?")
            lines = teardown(config, engine, plan)
    except StateLockedError as exc:
        raise CliError(str(exc)) from None  # "in use by another snapshotter process"
    except SetupError as exc:
        raise CliError(f"{exc}; nothing was dropped") from None
    except created.RecordError as exc:
        raise CliError(str(exc)) from None
    except connector.errors as exc:
        raise CliError(f"teardown: {explain(exc, config.source.url).text}") from None
    for line in lines:
        out.print(escape(line))
    if path.exists():
        out.print(
            escape(
                f"the state in {config.state.dir} still refers to the old stream position: "
                "delete that directory to start again (then `snapshotter init`), or run "
                "`snapshotter init` and then `snapshotter reset-stream` to keep its history"
            )
        )
    return 0

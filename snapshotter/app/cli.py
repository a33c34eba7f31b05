"""The ``snapshotter`` command. Commands parse arguments and print; the work is elsewhere."""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import traceback
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from signals import ExecuteSnapshot, Signal, SignalError, SignalType, Watermark, parse_signal
from signals.display import printable
from signals.names import TableId, parse_table_selector
from signals.table import new_signal_id
from snapshotter import __version__
from snapshotter.common.errors import explain
from snapshotter.common.redact import (
    RedactingFilter,
    Redactor,
    mask_url,
    setting_secrets,
    url_secrets,
)
from snapshotter.config import Config, ConfigError, load_config
from snapshotter.core.state import StateError
from snapshotter.engine.state_store import StateStore
from snapshotter.sources.base import TableError as TableErrorBase
from snapshotter.sources.connector import Connector, connector_for, saved_position_text

if TYPE_CHECKING:
    from snapshotter.app.stream_position import ResetPlan

# Off a terminal rich assumes 80 columns, which folds the status table into a column of
# fragments; pipes and logs get room for a whole row instead.
_PIPE_WIDTH = None if sys.stdout.isatty() else 200
out = Console(highlight=False, soft_wrap=True, width=_PIPE_WIDTH)
err = Console(stderr=True, highlight=False, soft_wrap=True, width=_PIPE_WIDTH)


# Everything printed as an error or logged passes through this: it knows the configured
# secrets once a command has loaded its config (and masks URL passwords anyway).
redact = Redactor()
_source_url: list[str] = []  # the loaded config's source.url, for error messages


class CliError(Exception):
    """An error to print as one line and exit with ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _config(args: argparse.Namespace) -> Config:
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        raise CliError(str(exc), code=2) from None
    redact.add(url_secrets(config.source.url))
    redact.add(setting_secrets(config.sink.kafka))
    redact.add(setting_secrets(config.spark.conf))
    _source_url[:] = [config.source.url]
    return config


def _connect(config: Config) -> Any:
    """A handle on the source (``Connector.connect``), checked to answer."""
    from snapshotter.sources.connector import ConnectError

    try:
        return connector_for(config.source).connect()
    except ConnectError as exc:
        raise CliError(str(exc)) from None


def cmd_init(args: argparse.Namespace) -> int:
    """Signal table, prerequisites, then what the source's log reader needs (the connector's
    ``create_capture``: PostgreSQL's publication, then slot); where the log keeps no position
    of ours (MySQL), the position the first run streams from, saved in the state (so signals
    sent between ``init`` and ``run`` are not missed). What it creates is recorded
    (``app.created``): teardown drops only that."""
    from snapshotter.app import created
    from snapshotter.app.own_tables import prepare_tables, privilege_problems
    from snapshotter.sources.base import TableError
    from snapshotter.sources.setup_common import SetupError

    config = _config(args)
    source = config.source
    connector = connector_for(source)
    engine = _connect(config)
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


def _confirm(args: argparse.Namespace, question: str) -> None:
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


def cmd_reset_stream(args: argparse.Namespace) -> int:
    """Stream from the current end of the log: a new slot (PostgreSQL) or the binlog's end
    (MySQL) in the state, unfinished snapshots stopped; then snapshot the tables again."""
    from snapshotter.app import stream_position as sp
    from snapshotter.engine.state_store import StateLockedError, state_path
    from snapshotter.sources.positions import execute_snapshot_command
    from snapshotter.sources.setup_common import SetupError

    config = _config(args)
    connector = connector_for(config.source)
    engine = _connect(config)
    path = state_path(config)
    try:
        with StateStore(path) as store:
            state = store.load()
            old = saved_position_text(state.stream.resume)
            dialect = connector.open_dialect()
            try:
                plan = sp.plan_reset(config, engine, dialect, state)
                _print_reset_plan(path, plan)
                _confirm(args, "Reset the stream position?")
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


def cmd_teardown(args: argparse.Namespace) -> int:
    """Drop what init created (slot; publication, signal and notification tables when init
    recorded creating them, and no other publication carries the signal table); refuses an
    active slot and a state directory an engine holds."""
    import contextlib

    from snapshotter.app import created
    from snapshotter.app.teardown import plan_teardown, teardown
    from snapshotter.engine.state_store import StateLockedError, state_path
    from snapshotter.sources.setup_common import SetupError

    config = _config(args)
    connector = connector_for(config.source)
    engine = _connect(config)
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
            _confirm(args, "Drop them?")
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


def _signal_data(args: argparse.Namespace) -> dict[str, Any]:
    kind = SignalType(args.kind)
    if kind is SignalType.EXECUTE_SNAPSHOT:
        data: dict[str, Any] = {"data-collections": args.tables, "type": "incremental"}
        conditions = []
        for item in args.filter or []:
            table, sep, sql = item.partition("=")
            if not sep or not table.strip() or not sql.strip():
                raise CliError(f"--filter {item!r}: write it as TABLE=SQL", code=2)
            conditions.append({"data-collection": table.strip(), "filter": sql.strip()})
        if conditions:
            data["additional-conditions"] = conditions
        if args.surrogate_key:
            data["surrogate-key"] = args.surrogate_key
        return data
    if kind is SignalType.STOP_SNAPSHOT:
        return (
            {"data-collections": args.tables, "type": "incremental"}
            if args.tables
            else {"type": "incremental"}
        )
    if kind is SignalType.LOG:
        return {"message": args.message}
    return {"type": "incremental"}


def cmd_signal(args: argparse.Namespace) -> int:
    if not args.config:
        raise CliError(
            "signal needs -c/--config (before or after the signal kind): "
            f"snapshotter signal {args.kind} ... -c CONFIG",
            code=2,
        )
    config = _config(args)
    # The CLI builds the row and runs it through the same strict parser the engine uses, so
    # a signal the engine would refuse is refused here, before it reaches the table.
    parsed = parse_signal(
        new_signal_id(),
        args.kind,
        json.dumps(_signal_data(args)),
        dollar_quotes=connector_for(config.source).dollar_quotes,
    )
    if isinstance(parsed, SignalError):
        raise CliError(f"not sent: {printable(parsed.problem)}", code=2)
    assert not isinstance(parsed, Watermark)
    engine = _connect(config)
    if isinstance(parsed, ExecuteSnapshot) and not args.no_check:
        _check_snapshot(config, parsed)
    connector = connector_for(config.source)
    signal_id = _insert_signal(config, connector, engine, parsed)
    out.print(
        escape(
            f"{parsed.type.value} signal {signal_id} inserted into {config.source.signal_table_id}"
        )
    )
    from snapshotter.app.log_coverage import signal_warnings

    for warning in signal_warnings(config, engine):
        err.print(
            f"[yellow]warning:[/yellow] {escape(warning)} (the engine will not see this signal "
            "unless the log carries it)"
        )
    return 0


def _insert_signal(config: Config, connector: Connector, engine: Any, signal: Signal) -> str:
    """Insert the signal row; a privilege the user lacks is one line naming the GRANT."""
    import sqlalchemy as sa

    from snapshotter.common.errors import is_privilege_error

    try:
        return connector.insert_signal(engine, signal)
    except connector.errors as exc:
        if not isinstance(engine, sa.Engine) or not is_privilege_error(exc):
            raise
        from snapshotter.sources.privileges import grant_for

        table = config.source.signal_table_id
        grant = grant_for(engine, table, ("INSERT",))
        raise CliError(
            f"cannot insert into the signal table {table}: the source refused a privilege; "
            f"run as an administrator: {grant}"
        ) from None


def _check_snapshot(config: Config, signal: ExecuteSnapshot) -> None:
    """Refuse at once what the engine would refuse (signals.plan, the engine's own rules):
    a table that does not exist or is a view, the signal or notification table, a pattern
    that matches no table, a signal too big; and what this pipeline would skip (a table
    outside source.tables: the config given is the pipeline the user means). Whether a
    table is busy is left to the engine (the state file may be behind it)."""
    from signals.names import TableSet
    from signals.plan import Selectors, not_captured, plan_snapshot
    from snapshotter.app.runner import open_dialect

    source = config.source
    dialect = open_dialect(config)
    try:
        known = TableSet(dialect.list_tables())
        plan = plan_snapshot(
            signal,
            known=known,
            captured=Selectors(
                (parse_table_selector(t) for t in source.tables), source.default_schema
            ),
            signal_table=source.signal_table_id,
            default_schema=source.default_schema,
            unfinished={},
            describe_missing=dialect.relation_kinds,
            own_tables=config.own_tables,
        )
    finally:
        dialect.close()
    outside = [
        not_captured(item, repr(source.tables))
        if isinstance(item, TableId)
        else f"pattern {item} matches no captured table (only tables outside source.tables)"
        for item in plan.skipped
    ]
    reasons = [plan.error] if plan.error else [r for _, r in plan.refused] + outside + plan.problems
    if not reasons:
        return
    more = f" (and {len(reasons) - 1} more problems)" if len(reasons) > 1 else ""
    fix = "; fix the names (they are case-sensitive) or source.tables, or pass --no-check"
    if plan.error:
        fix = ""
    raise CliError(f"not sent: {printable(reasons[0])}{more}{fix}", code=2)


def _describe(signal: Signal | Watermark | SignalError) -> tuple[str, str, str]:
    # Signal text is anyone's: control characters escaped (printable), markup escaped.
    if isinstance(signal, SignalError):
        return (
            escape(printable(signal.signal_id)),
            escape(printable(signal.signal_type)),
            f"[red]error:[/red] {escape(printable(signal.problem))}",
        )
    if isinstance(signal, Watermark):
        return (
            escape(printable(signal.id)),
            signal.type.value,
            f"window {escape(printable(signal.window_id))}",
        )
    return (
        escape(printable(signal.id)),
        signal.type.value,
        escape(printable(json.dumps(signal.data(), ensure_ascii=False))),
    )


def cmd_signals(args: argparse.Namespace) -> int:
    config = _config(args)
    connector = connector_for(config.source)
    engine = _connect(config)
    signals = [parse_signal(i, t, d) for i, t, d in connector.signal_rows(engine)]
    if args.json:
        rows: list[dict[str, Any]] = []
        for s in signals:
            if isinstance(s, SignalError):
                rows.append({"id": s.signal_id, "type": s.signal_type, "error": s.problem})
            else:
                rows.append({"id": s.id, "type": s.type.value, "data": s.data()})
        # Exact values, as JSON escapes: nothing but ASCII reaches the terminal.
        out.print_json(json.dumps(rows), ensure_ascii=True)
        return 0
    table = Table(title=f"signals in {config.source.signal_table_id}")
    table.add_column("id", overflow="fold")
    table.add_column("type", no_wrap=True)
    table.add_column("data", overflow="fold")
    for s in signals:
        table.add_row(*_describe(s))
    out.print(table)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    config = _config(args)
    if args.command == "resume":
        _announce_resume(config)
    from snapshotter.app.metrics import serve_metrics, with_port
    from snapshotter.app.progress import live_progress
    from snapshotter.app.runner import StopFlag, run_engine
    from snapshotter.engine.state_store import StateLockedError
    from snapshotter.engine.watchdog import LogCoverageError
    from snapshotter.sinks.jsonl import JsonlSinkError
    from snapshotter.sources.log import LogReaderError
    from snapshotter.sources.positions import StreamPositionLost
    from snapshotter.sources.setup_common import SetupError

    stop = StopFlag()
    stop.install(config.state.shutdown_timeout_s)  # a stop ends the process within this
    try:
        config = with_port(config, args.metrics_port)
        with (
            live_progress(verbose=args.verbose, log_filter=RedactingFilter(redact)) as on_progress,
            serve_metrics(config) as metrics,
        ):
            code = run_engine(
                config,
                until_caught_up=args.until_caught_up,
                stop=stop,
                on_progress=on_progress,
                on_start=metrics.attach if metrics is not None else None,
            )
    except StateLockedError as exc:
        raise CliError(f"{exc}; is another `snapshotter run` using {config.state.dir}?") from None
    except StreamPositionLost as exc:  # checked before the log reader opened
        raise CliError(str(exc.for_config(args.config))) from None
    except LogCoverageError as exc:  # the log lacks a table: before streaming, or while
        raise CliError(exc.for_config(args.config)) from None
    except SetupError as exc:  # what the log lacks, checked before the reader opened
        raise CliError(f"not started: {exc}") from None
    except LogReaderError as exc:
        if isinstance(exc.__cause__, StreamPositionLost):  # lost while the engine ran
            tables = _tables_to_snapshot(config)
            raise CliError(str(exc.__cause__.for_config(args.config, tables))) from None
        raise CliError(explain(exc, config.source.url).text) from None
    except (StateError, ValueError, OSError, JsonlSinkError) as exc:
        raise CliError(explain(exc, config.source.url).text) from None
    finally:
        stop.uninstall()
    _print_summary(config)
    return code


def _tables_to_snapshot(config: Config) -> list[str] | None:
    """The tables whose changes a lost stream position may have cost (None if unknown)."""
    from snapshotter.app.runner import open_dialect
    from snapshotter.app.stream_position import captured_tables, tables_to_snapshot
    from snapshotter.engine.state_store import state_path

    try:
        state = StateStore(state_path(config)).load()
    except StateError:
        return None
    dialect = open_dialect(config)
    try:
        return tables_to_snapshot(captured_tables(config, dialect), state)
    finally:
        dialect.close()


def _announce_resume(config: Config) -> None:
    from snapshotter.engine.state_store import state_path

    path = state_path(config)
    if not path.exists() and Path(f"{path}.lock").exists():
        # A run was here and died before its first save (it saves one before writing any
        # output): nothing was acknowledged, so starting from the beginning loses nothing.
        out.print(
            escape(
                f"no state was saved in {config.state.dir} before the last run stopped: "
                "starting from the beginning, as `snapshotter run` does"
            )
        )
        return
    if not path.exists():
        raise CliError(
            f"nothing to resume: no saved state in {config.state.dir}; use `snapshotter run`",
            code=2,
        )
    state = StateStore(path).load()
    out.print(
        escape(
            f"resuming from {path}: stream position "
            f"{state.stream.position or '(no event handled yet)'}, restarting from "
            f"{saved_position_text(state.stream.resume)}"
        )
    )
    for p in state.snapshots:
        if not p.status.finished:
            out.print(
                escape(
                    f"  {p.table}: {p.status.value}, {p.rows_emitted} rows in {p.chunk_id} "
                    f"chunks, next chunk after key {p.last_read_key}, up to {p.max_key}"
                )
            )


def _print_summary(config: Config) -> None:
    from snapshotter.engine.state_store import state_path

    path = state_path(config)
    if not path.exists():
        return
    for p in StateStore(path).load().snapshots:
        line = f"{p.table}: {p.status.value}, {p.rows_emitted} rows, {p.chunk_id} chunks"
        err.print(escape(printable(line + (f" ({p.error})" if p.error else ""))))


def _landing_status(config: Config, sink: dict[str, Any]) -> dict[str, Any]:
    """The spark sink's side of status: what state recorded as staged, and what waits in the
    staging directory for the lander (read without Spark)."""
    from snapshotter.sinks.spark.staging import StagingArea, StagingError

    area = StagingArea(config.staging_dir)
    try:
        waiting = area.batches() if config.staging_dir.exists() else []
    except StagingError as exc:
        raise CliError(str(exc)) from None
    return {
        "path": config.sink.path,
        "format": config.sink.format,
        "staged": sink.get("staged", 0),
        "staging": str(config.staging_dir),
        "waiting_batches": len(waiting),
        "waiting_bytes": sum(b.bytes for b in waiting),
    }


def cmd_status(args: argparse.Namespace) -> int:
    from snapshotter.app.status import render_status
    from snapshotter.engine.state_store import state_path

    config = _config(args)
    path = state_path(config)
    if args.watch is not None:
        return _watch_status(config, args, args.watch)
    report = _status_report(config, args)
    if args.json:
        out.print_json(json.dumps(report))
        return 0
    for part in render_status(report, f"snapshots ({path})"):
        out.print(part)
    return 0


def _status_report(config: Config, args: argparse.Namespace) -> dict[str, Any]:
    """What ``status`` shows, read now: state (read-only), the stream position's health and
    lag, the sink's side."""
    from snapshotter.app.status import status_report
    from snapshotter.app.stream_position import stream_health
    from snapshotter.engine.state_store import state_path

    try:
        health = stream_health(config, StateStore(state_path(config)).load, args.config)
    except StateError as exc:
        raise CliError(str(exc)) from None
    state = health.state  # as read for the position's health (stream_health says when)
    lag = _lag_bytes(config, state.stream.resume) if health.reachable else None
    warnings = list(health.warnings)
    if health.reachable:
        from snapshotter.app.log_coverage import coverage_warnings
        from snapshotter.sources.positions import name_config

        warnings += [name_config(w, args.config) for w in coverage_warnings(config, state)]
    report = status_report(state, lag, warnings)
    if config.sink.kind == "spark":
        report["landing"] = _landing_status(config, state.sink)
    if config.sink.kind == "kafka":
        report["kafka"] = {
            "bootstrap_servers": config.sink.bootstrap_servers,
            "acknowledged_messages": int(state.sink.get("messages", 0)),
        }
    return report


def _watch_status(config: Config, args: argparse.Namespace, seconds: float) -> int:
    """``status --watch``: the report again every ``seconds`` until Ctrl-C; in place on a
    terminal (rich Live), else (and with --json) appended, one report per refresh (JSON:
    one document a line)."""
    import datetime as dt
    import time

    from rich.console import Group
    from rich.live import Live

    from snapshotter.app.status import render_status
    from snapshotter.engine.state_store import state_path

    title = f"snapshots ({state_path(config)})"

    def view() -> Group:
        now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        parts = render_status(_status_report(config, args), f"{title} at {now}")
        return Group(*parts)

    try:
        if args.json:
            while True:
                text = json.dumps(_status_report(config, args))
                out.print(text, soft_wrap=True, markup=False, highlight=False)
                time.sleep(seconds)
        elif out.is_terminal:
            # A console of its own: ``out`` soft-wraps, which Live would crop to the width.
            screen = Console(highlight=False)
            with Live(view(), console=screen, auto_refresh=False) as live:
                while True:
                    time.sleep(seconds)
                    live.update(view(), refresh=True)
        else:
            while True:
                out.print(view())
                out.print()
                time.sleep(seconds)
    except KeyboardInterrupt:
        return 0  # Ctrl-C is how a watch ends


WATCH_MAX_S = 86_400.0  # status --watch: at most a day between reports (time.sleep overflows)


def _watch_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0.1 <= seconds <= WATCH_MAX_S:  # nan and inf fail too
        raise argparse.ArgumentTypeError(
            f"not a number of seconds from 0.1 to {WATCH_MAX_S:.0f}: {text!r}"
        )
    return seconds


def _port(text: str) -> int:
    """``--metrics-port``: refused by argparse (exit 2, as the same value in the config)."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65_535:
        raise argparse.ArgumentTypeError(f"not a port from 0 to 65535: {text!r}")
    return port


def _lag_bytes(config: Config, resume: dict[str, Any]) -> int | None:
    """How far the log end is ahead of the saved restart point, in bytes; None if the
    source is unreachable or the distance is not known."""
    from snapshotter.app.runner import open_dialect

    dialect = open_dialect(config)
    try:
        return dialect.lag_bytes(resume)
    except Exception as exc:
        if not isinstance(exc, (*connector_for(config.source).errors, TableErrorBase)):
            raise
        return None
    finally:
        dialect.close()


def cmd_verify(args: argparse.Namespace) -> int:
    config = _config(args)
    if config.sink.kind == "spark":
        return _verify_landed(config, args.tables, as_json=args.json)
    return _verify_jsonl(config, args.tables, as_json=args.json)


def _verify_jsonl(config: Config, names: Sequence[str], *, as_json: bool) -> int:
    """Each table (see ``convergence.tables_to_verify``) against the sink's output; a table
    that cannot be compared is reported and the others still are. Exit 1 if any diverges
    or fails."""
    from signals.names import TableNameError
    from snapshotter.app.runner import open_dialect
    from snapshotter.sources.base import TableError
    from snapshotter.verify.convergence import check_table, tables_to_verify
    from snapshotter.verify.rows import VerifyError, verdict_json

    dialect = open_dialect(config)
    try:
        tables = tables_to_verify(config, dialect, names)
    except (TableNameError, TableError, VerifyError) as exc:
        raise CliError(str(exc), code=2) from None
    finally:
        dialect.close()
    failed = False
    results: list[dict[str, Any]] = []
    for table in tables:
        try:
            verdict = check_table(config, table)
        except (TableError, VerifyError) as exc:
            failed = True
            if as_json:
                results.append({"table": str(table), "ok": False, "error": str(exc)})
            else:
                out.print(f"[red]{escape(f'{table}: error: {exc}')}[/red]")
            continue
        failed = failed or not verdict.ok
        if as_json:
            results.append({"table": str(table), **verdict_json(verdict)})
            continue
        colour = "green" if verdict.ok else "red"
        out.print(f"[{colour}]{escape(f'{table}: {verdict.render()}')}[/{colour}]")
    if as_json:
        out.print_json(json.dumps(results))
    return 1 if failed else 0


def _verify_landed(config: Config, names: Sequence[str], *, as_json: bool) -> int:
    """Each table against its landed current state; a table that cannot be compared is
    reported and the others still are. Exit 1 if any diverges or fails."""
    from signals.names import TableNameError
    from snapshotter.sinks.spark.lander import LandingError
    from snapshotter.sources.base import TableError
    from snapshotter.verify.rows import VerifyError
    from snapshotter.verify.spark import verify_landed

    failed = False
    results: list[dict[str, Any]] = []
    err.print(escape(f"verifying against the landed state under {config.sink.path}"))
    try:
        for outcome in verify_landed(config, names, say=lambda text: err.print(escape(text))):
            failed = failed or not outcome.ok
            if as_json:
                results.append(outcome.to_json())
                continue
            colour = "green" if outcome.ok else "red"
            text = f"{outcome.table}: {outcome.render()}"
            out.print(f"[{colour}]{escape(text)}[/{colour}]")
    except (TableNameError, TableError, LandingError, VerifyError, OSError) as exc:
        raise CliError(str(exc)) from None
    if as_json:
        out.print_json(json.dumps(results))
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="snapshotter",
        description="Incremental, lock-free, resumable table snapshots (DBLog watermarks).",
    )
    parser.add_argument("--version", action="version", version=f"snapshotter {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_config(p: argparse.ArgumentParser, required: bool = True) -> argparse.ArgumentParser:
        p.add_argument("-c", "--config", required=required, help="the TOML configuration file")
        p.add_argument(
            "-v", "--verbose", action="store_true", help="debug logging; tracebacks of errors"
        )
        return p

    init = with_config(
        sub.add_parser("init", help="create signal table, publication and slot; check setup")
    )
    init.set_defaults(func=cmd_init)

    # -c and -v may come before the signal kind or after it, as with the other commands:
    # each kind takes them too, without a default of its own (SUPPRESS), so a value given
    # before the kind stays; cmd_signal says when neither place had -c.
    signal = with_config(
        sub.add_parser("signal", help="insert a signal into the signal table"), required=False
    )
    kinds = signal.add_subparsers(dest="kind", required=True, metavar="SIGNAL")

    def kind_parser(name: str, text: str) -> argparse.ArgumentParser:
        p = kinds.add_parser(name, help=text)
        p.add_argument("-c", "--config", default=argparse.SUPPRESS, help="the TOML config file")
        p.add_argument(
            "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="debug logging"
        )
        return p

    execute = kind_parser(
        SignalType.EXECUTE_SNAPSHOT.value, "snapshot tables (names or regex patterns)"
    )
    execute.add_argument("tables", nargs="+", metavar="TABLE")
    execute.add_argument(
        "--filter",
        action="append",
        metavar="TABLE=SQL",
        help="additional condition for one table (SQL, appended with AND)",
    )
    execute.add_argument(
        "--surrogate-key",
        metavar="COLUMN",
        help="a NOT NULL unique column to page by, for a table without a key",
    )
    execute.add_argument(
        "--no-check",
        action="store_true",
        help="send it without checking the tables against the source first (the engine "
        "still refuses what it cannot snapshot, in status)",
    )
    stop = kind_parser(SignalType.STOP_SNAPSHOT.value, "stop snapshots (all if no TABLE)")
    stop.add_argument("tables", nargs="*", metavar="TABLE")
    kind_parser(SignalType.PAUSE_SNAPSHOT.value, "pause the running snapshot")
    kind_parser(SignalType.RESUME_SNAPSHOT.value, "resume a paused snapshot")
    log = kind_parser(SignalType.LOG.value, "write a message to the engine's log")
    log.add_argument("message")
    signal.set_defaults(func=cmd_signal)

    for name, text in (
        ("run", "stream the log and run snapshots (resumes from saved state)"),
        ("resume", "like run, but only from saved state, saying what it resumes"),
    ):
        run = with_config(sub.add_parser(name, help=text))
        run.add_argument(
            "--until-caught-up",
            action="store_true",
            help="exit once no snapshot is pending or running and the log is read to its end",
        )
        run.add_argument(
            "--metrics-port",
            type=_port,
            metavar="N",
            help="serve Prometheus metrics at http://HOST:N/metrics (HOST: [metrics] host, "
            "127.0.0.1 by default); overrides [metrics] port; 0 picks a free port",
        )
        run.set_defaults(func=cmd_run)

    status = with_config(
        sub.add_parser("status", help="snapshot progress, stream lag and position warnings")
    )
    status.add_argument("--json", action="store_true", help="print JSON")
    status.add_argument(
        "--watch",
        nargs="?",
        type=_watch_seconds,
        const=2.0,
        metavar="SECONDS",
        help="print it again every SECONDS (default 2) until Ctrl-C",
    )
    status.set_defaults(func=cmd_status)

    verify = with_config(
        sub.add_parser(
            "verify",
            help="compare the sink's output with the tables, row by row (after catching up)",
        )
    )
    verify.add_argument(
        "tables",
        nargs="*",
        metavar="TABLE",
        help="tables to verify (default: every table source.tables selects, at the source "
        "or snapshotted)",
    )
    verify.add_argument("--json", action="store_true", help="print JSON")
    verify.set_defaults(func=cmd_verify)

    reset = with_config(
        sub.add_parser(
            "reset-stream",
            help="stream from the current end of the log (after the saved position was lost)",
        )
    )
    reset.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    reset.set_defaults(func=cmd_reset_stream)

    teardown = with_config(
        sub.add_parser("teardown", help="drop the replication slot, publication and signal table")
    )
    teardown.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    teardown.set_defaults(func=cmd_teardown)

    signals = with_config(sub.add_parser("signals", help="list the signal table, parsed"))
    signals.add_argument("--json", action="store_true", help="print JSON")
    signals.set_defaults(func=cmd_signals)
    return parser


def _print_error(text: str) -> None:
    err.print(f"[red]error:[/red] {escape(redact(text))}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. Every error is printed as one or two lines (what, where, the fix),
    secrets masked; the traceback only with -v."""
    args = build_parser().parse_args(argv)
    verbose = bool(getattr(args, "verbose", False))
    # Log lines of any logger that has no handler of its own come through here: mask them.
    guard = RedactingFilter(redact)
    if logging.lastResort is not None:
        logging.lastResort.addFilter(guard)
    debug = _debug_logging(guard) if verbose and args.func is not cmd_run else None
    try:
        code: int = args.func(args)
    except CliError as exc:
        if verbose and exc.__cause__ is not None:
            sys.stderr.write(redact("".join(traceback.format_exception(exc.__cause__))))
        _print_error(str(exc))
        return exc.code
    except KeyboardInterrupt:
        _print_error("interrupted")
        return 130
    except Exception as exc:
        if verbose:
            sys.stderr.write(redact(traceback.format_exc()))
        explained = explain(exc, _source_url[0] if _source_url else None)
        hint = "" if explained.expected or verbose else " (unexpected: -v shows the traceback)"
        _print_error(explained.text + hint)
        return 1
    finally:
        if logging.lastResort is not None:
            logging.lastResort.removeFilter(guard)
        if debug is not None:
            handler, level = debug
            logging.getLogger("snapshotter").removeHandler(handler)
            logging.getLogger("snapshotter").setLevel(level)
    return code


def _debug_logging(guard: logging.Filter) -> tuple[logging.Handler, int]:
    """-v for commands other than run: the snapshotter loggers' debug lines on stderr; the
    handler and the level to restore."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(guard)
    root = logging.getLogger("snapshotter")
    level = root.level
    root.setLevel(logging.DEBUG)
    root.addHandler(handler)
    return handler, level


if __name__ == "__main__":
    sys.exit(main())

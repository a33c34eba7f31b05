"""What the commands that only read report: ``status`` (once, or ``--watch``) and
``verify``."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from snapshotter.app.cli.common import CliError, Session, err, out
from snapshotter.common.redact import Redactor
from snapshotter.config import Config
from snapshotter.core.state import StateError
from snapshotter.engine.state_store import StateStore
from snapshotter.sources.base import TableError as TableErrorBase
from snapshotter.sources.connector import connector_for


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


def cmd_status(session: Session, args: argparse.Namespace) -> int:
    from snapshotter.app.status import render_status
    from snapshotter.engine.state_store import state_path

    config = session.load_config(args.config)
    if args.watch is not None:
        return _watch_status(config, args, args.watch, session.redact)
    # Text: a source that does not answer is the error line below, not also a warning.
    report, unreachable = _read_status(config, args, unreachable_warning=args.json)
    report = _masked(report, session.redact)
    if args.json:
        out.print_json(json.dumps(report))
    else:
        verbose = bool(getattr(args, "verbose", False))
        for part in render_status(report, shown_path(state_path(config)), verbose=verbose):
            out.print(part)
    if unreachable is None:
        return 0
    # The state is the engine's own file and still worth showing, but the source's side
    # (the log position's health, the lag) is unknown: a monitor must not read exit 0 as
    # "all checked". One line, what failed and what to fix, the URL's password masked.
    err.print(
        f"[red]error:[/red] {escape(session.redact(unreachable))} (status shows the saved "
        "state only: the stream's lag and log position were not checked)"
    )
    return 1


def shown_path(path: Path) -> str:
    """A path as ``status`` prints it: absolute, without ``..`` or symlinks in it."""
    return str(path.resolve())


def _status_report(config: Config, args: argparse.Namespace) -> dict[str, Any]:
    """What ``status --watch`` shows at each refresh: a source that does not answer is one
    of its warnings (watching goes on through an outage)."""
    return _read_status(config, args)[0]


def _masked(report: dict[str, Any], redact: Redactor) -> dict[str, Any]:
    """``report`` with the configured secrets masked in its warnings (they quote the
    source's answers)."""
    return {**report, "warnings": [redact(w) for w in report["warnings"]]}


def _read_status(
    config: Config, args: argparse.Namespace, *, unreachable_warning: bool = True
) -> tuple[dict[str, Any], str | None]:
    """What ``status`` shows, read now: state (read-only), the stream position's health and
    lag, the sink's side; and why the source could not be reached (None: it answered), said
    among the warnings too unless ``unreachable_warning`` is false."""
    from snapshotter.app.status import status_report
    from snapshotter.app.stream_position import stream_health
    from snapshotter.engine.state_store import state_path

    try:
        health = stream_health(config, StateStore(state_path(config)).load, args.config)
    except StateError as exc:
        raise CliError(str(exc)) from None
    state = health.state  # as read for the position's health (stream_health says when)
    lag = _lag_bytes(config, state.stream.resume) if health.reachable else None
    warnings = list(health.warnings) if health.reachable or unreachable_warning else []
    if health.reachable:
        from snapshotter.app.log_coverage import coverage_warnings
        from snapshotter.sources.positions import name_config

        warnings += [name_config(w, args.config) for w in coverage_warnings(config, state)]
    report = status_report(state, lag, warnings)
    report["source_reachable"] = health.reachable
    if config.sink.kind == "spark":
        report["landing"] = _landing_status(config, state.sink)
    if config.sink.kind == "kafka":
        report["kafka"] = {
            "bootstrap_servers": config.sink.bootstrap_servers,
            "acknowledged_messages": int(state.sink.get("messages", 0)),
        }
    return report, health.unreachable


def _watch_status(
    config: Config, args: argparse.Namespace, seconds: float, redact: Redactor
) -> int:
    """``status --watch``: the report again every ``seconds`` until Ctrl-C; in place on a
    terminal (rich Live), else (and with --json) appended, one report per refresh (JSON:
    one document a line)."""
    import datetime as dt
    import time

    from rich.console import Group
    from rich.live import Live

    from snapshotter.app.status import render_status
    from snapshotter.engine.state_store import state_path

    path = shown_path(state_path(config))
    verbose = bool(getattr(args, "verbose", False))

    def view() -> Group:
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        # Watching goes on through an outage: the warning says the source did not answer.
        report = _masked(_status_report(config, args), redact)
        parts = render_status(report, path, at=now, verbose=verbose)
        return Group(*parts)

    try:
        if args.json:
            while True:
                text = json.dumps(_masked(_status_report(config, args), redact))
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


def watch_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0.1 <= seconds <= WATCH_MAX_S:  # nan and inf fail too
        raise argparse.ArgumentTypeError(
            f"not a number of seconds from 0.1 to {WATCH_MAX_S:.0f}: {text!r}"
        )
    return seconds


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


def cmd_verify(session: Session, args: argparse.Namespace) -> int:
    config = session.load_config(args.config)
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

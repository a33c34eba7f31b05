"""Running the engine: ``run`` and ``resume``."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.markup import escape

from snapshotter.app.cli.common import CliError, Session, err, out
from snapshotter.common.errors import explain
from snapshotter.common.redact import RedactingFilter
from snapshotter.config import Config
from snapshotter.core.state import StateError
from snapshotter.engine.state_store import StateStore
from snapshotter.sources.connector import saved_position_text


def cmd_run(session: Session, args: argparse.Namespace) -> int:
    config = session.load_config(args.config)
    if args.command == "resume":
        _announce_resume(config)
    from snapshotter.app.metrics import serve_metrics, with_port
    from snapshotter.app.progress import epoch_ms, live_progress
    from snapshotter.app.runner import StopFlag, run_engine
    from snapshotter.engine.state_store import StateLockedError
    from snapshotter.engine.watchdog import LogCoverageError
    from snapshotter.sinks.jsonl import JsonlSinkError
    from snapshotter.sources.log import LogReaderError
    from snapshotter.sources.positions import StreamPositionLost
    from snapshotter.sources.setup_common import SetupError

    since_ms = epoch_ms()  # this run's snapshots: unfinished, or finished since
    stop = StopFlag()
    stop.install(config.state.shutdown_timeout_s)  # a stop ends the process within this
    try:
        config = with_port(config, args.metrics_port)
        with (
            live_progress(
                verbose=args.verbose,
                log_filter=RedactingFilter(session.redact),
                since_ms=since_ms,
            ) as on_progress,
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
    _print_summary(config, since_ms)
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


def _print_summary(config: Config, since_ms: int) -> None:
    """This run's snapshots (``progress.summary_lines``): the earlier ones are ``status``'s."""
    from snapshotter.app.progress import summary_lines
    from snapshotter.engine.state_store import state_path

    path = state_path(config)
    if not path.exists():
        return
    for line in summary_lines(StateStore(path).load().snapshots, since_ms):
        err.print(escape(line))


def port(text: str) -> int:
    """``--metrics-port``: refused by argparse (exit 2, as the same value in the config)."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65_535:
        raise argparse.ArgumentTypeError(f"not a port from 0 to 65535: {text!r}")
    return port

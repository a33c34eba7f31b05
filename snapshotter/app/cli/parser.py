"""The ``snapshotter`` command's arguments, and ``main``: parse, run the command with a
``Session`` of its own, print its error as one line."""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Sequence

from rich.markup import escape

from signals import SignalType
from snapshotter import __version__
from snapshotter.app.cli.common import CliError, Session, err
from snapshotter.app.cli.reports import cmd_status, cmd_verify, watch_seconds
from snapshotter.app.cli.run import cmd_run, port
from snapshotter.app.cli.setup import cmd_init, cmd_reset_stream, cmd_teardown
from snapshotter.app.cli.signals import cmd_signal, cmd_signals
from snapshotter.common.errors import explain
from snapshotter.common.redact import RedactingFilter


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
            type=port,
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
        type=watch_seconds,
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


def _print_error(session: Session, text: str) -> None:
    err.print(f"[red]error:[/red] {escape(session.redact(text))}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. Every error is printed as one or two lines (what, where, the fix),
    secrets masked; the traceback only with -v."""
    args = build_parser().parse_args(argv)
    session = Session()
    redact = session.redact
    verbose = bool(getattr(args, "verbose", False))
    # Log lines of any logger that has no handler of its own come through here: mask them.
    guard = RedactingFilter(redact)
    if logging.lastResort is not None:
        logging.lastResort.addFilter(guard)
    debug = _debug_logging(guard) if verbose and args.func is not cmd_run else None
    try:
        code: int = args.func(session, args)
    except CliError as exc:
        if verbose and exc.__cause__ is not None:
            sys.stderr.write(redact("".join(traceback.format_exception(exc.__cause__))))
        _print_error(session, str(exc))
        return exc.code
    except KeyboardInterrupt:
        _print_error(session, "interrupted")
        return 130
    except Exception as exc:
        if verbose:
            sys.stderr.write(redact(traceback.format_exc()))
        explained = explain(exc, session.source_url)
        hint = "" if explained.expected or verbose else " (unexpected: -v shows the traceback)"
        _print_error(session, explained.text + hint)
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

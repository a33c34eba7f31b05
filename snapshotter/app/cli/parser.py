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
from snapshotter.app.cli.common import CONFIG_HELP, CliError, Session, config_path, err
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

    def command(name: str, text: str, description: str) -> argparse.ArgumentParser:
        """A command's parser: ``text`` in the list of commands, ``description`` (what it
        does, in sentences) atop its own --help; -c and -v."""
        p = sub.add_parser(name, help=text, description=description)
        # -c is not required: main() falls back to ./snapshotter.toml (common.config_path).
        p.add_argument("-c", "--config", help=CONFIG_HELP)
        p.add_argument(
            "-v", "--verbose", action="store_true", help="debug logging; tracebacks of errors"
        )
        return p

    init = command(
        "init",
        "create signal table, publication and slot; check setup",
        "Set the source up for capture, idempotently: create the signal table, then the "
        "publication and the replication slot (PostgreSQL), save the binlog position "
        "(MySQL/MariaDB) or check the change stream (Spanner); check the prerequisites and the "
        "privileges and print the fix for each problem.",
    )
    init.set_defaults(func=cmd_init)

    # -c and -v may come before the signal kind or after it, as with the other commands:
    # each kind takes them too, without a default of its own (SUPPRESS), so a value given
    # before the kind stays.
    signal = command(
        "signal",
        "insert a signal into the signal table",
        "Insert a signal (Debezium's signal table protocol) into the signal table, for the "
        "engine to act on; it is checked first as the engine will check it. -c and -v may "
        "come before or after the signal kind.",
    )
    kinds = signal.add_subparsers(dest="kind", required=True, metavar="SIGNAL")

    def kind_parser(name: str, text: str, description: str) -> argparse.ArgumentParser:
        p = kinds.add_parser(name, help=text, description=description)
        p.add_argument("-c", "--config", default=argparse.SUPPRESS, help=CONFIG_HELP)
        p.add_argument(
            "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="debug logging"
        )
        return p

    execute = kind_parser(
        SignalType.EXECUTE_SNAPSHOT.value,
        "snapshot tables (names or regex patterns)",
        "Snapshot the tables named (names or regex patterns) incrementally: in chunks, "
        "without locks, while the log keeps streaming. The tables are checked against the "
        "source first (--no-check skips that).",
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
    stop = kind_parser(
        SignalType.STOP_SNAPSHOT.value,
        "stop snapshots (all if no TABLE)",
        "Stop the snapshots of the tables named, or every snapshot when no table is named.",
    )
    stop.add_argument("tables", nargs="*", metavar="TABLE")
    kind_parser(
        SignalType.PAUSE_SNAPSHOT.value,
        "pause the running snapshot",
        "Pause the running snapshot; the log keeps streaming.",
    )
    kind_parser(
        SignalType.RESUME_SNAPSHOT.value,
        "resume a paused snapshot",
        "Resume a paused snapshot where it stopped.",
    )
    log = kind_parser(
        SignalType.LOG.value,
        "write a message to the engine's log",
        "Write a message to the engine's log (a way to see that the engine reads the signal "
        "table).",
    )
    log.add_argument("message")
    signal.set_defaults(func=cmd_signal)

    for name, text, description in (
        (
            "run",
            "stream the log and run snapshots (resumes from saved state)",
            "Stream the log into the sink and act on signals (snapshots) until SIGINT or "
            "SIGTERM, or with --until-caught-up until caught up; it continues from the saved "
            "state when there is one.",
        ),
        (
            "resume",
            "like run, but only from saved state, saying what it resumes",
            "Like run, but only from saved state: it first prints what it resumes (tables, "
            "keys, stream position) and refuses to start when nothing was saved.",
        ),
    ):
        run = command(name, text, description)
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

    status = command(
        "status",
        "snapshot progress, stream lag and position warnings",
        "Print each snapshot's progress (rows, rate, time remaining), the stream position, "
        "its lag and warnings about it. It reads the state without its lock, so it works "
        "while an engine runs. When the source cannot be reached it still prints the state, "
        "then says why on stderr and exits 1.",
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

    verify = command(
        "verify",
        "compare the sink's output with the tables, row by row (after catching up)",
        "Compare the sink's output with the tables, row by row; run it once the engine has "
        "caught up, with writes paused. Exit 1 when a table differs or cannot be compared.",
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

    reset = command(
        "reset-stream",
        "stream from the current end of the log (after the saved position was lost)",
        "Make the saved state stream from the current end of the log, after the saved "
        "position was lost (a dropped slot, a purged binlog): unfinished snapshots are "
        "stopped, and it names the tables to snapshot again.",
    )
    reset.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    reset.set_defaults(func=cmd_reset_stream)

    teardown = command(
        "teardown",
        "drop the replication slot, publication and signal table",
        "Drop what init created: the replication slot, the publication and the signal and "
        "notification tables (never while an engine streams from the slot).",
    )
    teardown.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    teardown.set_defaults(func=cmd_teardown)

    signals = command(
        "signals",
        "list the signal table, parsed",
        "List the rows of the signal table, each parsed as the engine parses it (a row it "
        "would refuse shows why).",
    )
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
        args.config = config_path(args.config)
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

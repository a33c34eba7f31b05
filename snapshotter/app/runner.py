"""Wiring: build the engine for a config (the source's dialect and log reader, sink, state)
and run it until a signal asks it to stop. The CLI's ``run`` and ``resume`` use this; tests
use it to run an engine in a thread with phase hooks."""

from __future__ import annotations

from collections.abc import Callable

from snapshotter.app.coverage import CoverageProbe
from snapshotter.app.log_coverage import check_before_streaming as check_log_coverage
from snapshotter.app.shutdown import StopFlag, ThreadFailures
from snapshotter.app.stream_position import check_before_streaming
from snapshotter.config import Config
from snapshotter.core.state import EngineState
from snapshotter.engine import Engine, EngineContext, KeyCatalog
from snapshotter.engine.executor_reads import executor_reads
from snapshotter.engine.state_store import StateStore, state_path
from snapshotter.engine.workers import PhaseHooks
from snapshotter.sinks.base import Sink
from snapshotter.sinks.factory import sink_for
from snapshotter.sources.base import Dialect
from snapshotter.sources.connector import connector_for

# sink_for: looked up when build_engine runs, so the end-to-end bench can wrap the sink.
__all__ = [
    "StopFlag",
    "ThreadFailedError",
    "build_engine",
    "open_dialect",
    "run_engine",
    "sink_for",
]


def build_engine(
    config: Config,
    *,
    hooks: PhaseHooks | None = None,
    sink: Sink | None = None,
    on_progress: Callable[[EngineState], None] | None = None,
    store: StateStore | None = None,
) -> tuple[Engine, StateStore]:
    """The engine for ``config``; it loads state from ``store`` at once, so pass a store
    whose lock is held (``run_engine`` does) unless only inspecting."""
    connector = connector_for(config.source)
    dialect = connector.open_dialect()
    store = store or StateStore(state_path(config))
    # Built first: the sinks ask it for key names, and the engine keeps it current.
    keys = KeyCatalog(dialect.describe, config.source.signal_table_id)
    # Before anything opens: a saved position the source no longer has (a slot dropped,
    # invalidated, or created again; a binlog file purged) is an error that says what to
    # do, never a silent start elsewhere (PostgreSQL would start a slot at its own position).
    check_before_streaming(config, dialect, state_path(config))
    # And the log must carry the signal table and what the output holds changes of (a
    # signal table dropped and created again leaves a publication): repaired where it may
    # be, else refused with the fix, never a run whose signals or changes vanish
    # (app.log_coverage); the engine asks the same again while it runs (engine.watchdog).
    check_log_coverage(config, dialect, state_path(config))
    coverage = CoverageProbe(config, state_path(config))
    try:
        engine = Engine(
            EngineContext(
                config=config,
                dialect=dialect,
                open_reader=connector.reader_opener(dialect),
                sink=sink or sink_for(config, dialect.describe, keys.key_names),
                store=store,
                keys=keys,
                hooks=hooks,
                on_progress=on_progress,
                # One more dialect (connection, statement guard) per extra chunk worker.
                open_dialect=connector.open_dialect,
                remote_reads=executor_reads(config),
                log_coverage=coverage,
            )
        )
    except BaseException:
        coverage.close()
        raise
    return engine, store


def open_dialect(config: Config) -> Dialect:
    """The dialect of the configured source (close it when done)."""
    return connector_for(config.source).open_dialect()


class ThreadFailedError(RuntimeError):
    """A background thread of the engine died; the message names it and the error."""


def run_engine(
    config: Config,
    *,
    until_caught_up: bool = False,
    stop: StopFlag | None = None,
    hooks: PhaseHooks | None = None,
    sink: Sink | None = None,
    on_progress: Callable[[EngineState], None] | None = None,
    on_start: Callable[[Engine], None] | None = None,
) -> int:
    """Lock the state directory, then stream; returns the engine's exit code.
    ``on_start``: called with the engine before it streams (observers that read its
    counters, e.g. the metrics endpoint). A background thread that dies stops the engine
    (state saved), and ThreadFailedError says which and why."""
    from snapshotter.app.notifications import notifier_for, observe

    if stop is None:
        stop = StopFlag()
    config.state.dir.mkdir(parents=True, exist_ok=True)
    # Debezium's notifications ([notifications]): an observer of the states saved.
    notifier = notifier_for(config)
    on_start = observe(notifier, on_start)
    try:
        # Lock first, then load state: state read before another engine's last save would
        # restart the sink and the slot from different points.
        with StateStore(state_path(config)) as store, ThreadFailures(stop.set) as failures:
            engine, _ = build_engine(
                config, hooks=hooks, sink=sink, on_progress=on_progress, store=store
            )
            if on_start is not None:
                on_start(engine)
            code = engine.run(
                until_caught_up=until_caught_up,
                should_stop=stop,
                on_error=lambda: stop.set("the engine failed"),
            )
            if failures.failure is not None:
                raise ThreadFailedError(
                    f"{failures.failure}; the engine stopped with its state saved (an "
                    "unexpected error: please report it, with the log of `-v`); `snapshotter "
                    "resume` goes on"
                )
            return code
    finally:
        if notifier is not None:
            notifier.close()

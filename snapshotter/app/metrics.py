"""The Prometheus endpoint of ``run`` / ``resume`` (``[metrics] port``): prometheus_client's
HTTP server, on a registry of its own, serving one collector that reads the engine when
scraped. Nothing runs on the engine's thread for it beyond the counters the engine keeps
anyway (``EngineStats``, the checkpointer's, the state's progress): a scrape reads them from
the server's thread, each an atomic read, at worst one step old.

The one figure the engine does not hold, the log's end (for ``snapshotter_stream_lag_bytes``),
is asked on a connection of this module's own (the engine's is not thread-safe), at most
every ``LAG_REFRESH_S`` and in a thread of its own, so a scrape never waits on the source: a
measurement that failed, or is older than ``LAG_STALE_S``, leaves the metric out.

What each metric means, and example queries: docs/operations.md, "Metrics".
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.exposition import start_http_server
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from pydantic import ValidationError

from signals.names import TableId
from snapshotter import __version__
from snapshotter.config import Config, MetricsConfig
from snapshotter.core.eta import eta
from snapshotter.core.state import EngineState, SnapshotStatus, TableProgress
from snapshotter.engine.stats import EngineStats
from snapshotter.sinks.base import SinkMetrics
from snapshotter.sources.base import Dialect

log = logging.getLogger("snapshotter.metrics")

PREFIX = "snapshotter"
LAG_REFRESH_S = 5.0  # the log's end is asked at most this often
LAG_STALE_S = 30.0  # a lag measured longer ago than this is not shown
ERROR_KINDS = ("signal", "snapshot", "source_retry")
_SINK_KEY = re.compile(r"^[a-z_][a-z0-9_]*$")
# What the sinks' own gauges mean (SinkMetrics); a key not listed gets a generic help text.
SINK_HELP = {
    "staged_bytes": "Spark sink: bytes staged and not yet landed",
    "staged_limit_bytes": "Spark sink: the bound on staged bytes ([sink] max_staged_mb); "
    "past it the engine waits for the lander",
    "unstaged_checkpoints": "Spark sink: checkpoints handed to the stager and not yet staged",
    "unacked_messages": "Kafka sink: messages of checkpoints Kafka has not acknowledged whole",
    "unflushed_bytes": "Kafka sink: bytes sent since the producer was last flushed",
    "unflushed_limit_bytes": "Kafka sink: the bound on unflushed bytes ([sink] "
    "max_unacked_mb); past it the engine waits for Kafka",
}


class MetricsError(ValueError):
    """The endpoint cannot be served (a port in use, a bad --metrics-port)."""


# --- what the collector reads ---------------------------------------------------------------


class ObservedCheckpoints(Protocol):
    @property
    def saved_at(self) -> float: ...

    @property
    def unacked(self) -> int: ...


class ObservedEngine(Protocol):
    """What the collector reads of ``snapshotter.engine.Engine`` (a fake in unit tests)."""

    @property
    def stats(self) -> EngineStats: ...

    @property
    def state(self) -> EngineState: ...

    @property
    def checkpoints(self) -> ObservedCheckpoints: ...

    @property
    def sink(self) -> object: ...

    @property
    def retried_tasks(self) -> int: ...

    @property
    def windows_in_flight(self) -> list[TableId]: ...


# --- the collector ---------------------------------------------------------------------------


def _name(suffix: str) -> str:
    return f"{PREFIX}_{suffix}"


def shown_snapshots(snapshots: Sequence[TableProgress]) -> list[TableProgress]:
    """The snapshots with series: every unfinished one and each table's newest record (older
    finished ones are history, and would add up with the newest in sums by table). One per
    (table, signal id), the newest winning: a signal id may be used again."""
    newest = {p.table: p for p in snapshots}
    picked: dict[tuple[str, str], TableProgress] = {}
    for progress in snapshots:
        if not progress.status.finished or newest[progress.table] is progress:
            picked[(str(progress.table), progress.signal_id)] = progress
    return list(picked.values())


class EngineCollector(Collector):
    """Reads the engine at scrape time. ``engine`` is None until the engine is built (only
    ``snapshotter_info`` then); ``lag_bytes`` is the latest measurement of the log after
    the engine's handed-over position (None: unknown)."""

    def __init__(
        self,
        config: Config,
        *,
        lag_bytes: Callable[[], int | None] = lambda: None,
        now: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._lag_bytes = lag_bytes
        self._now = now
        self.engine: ObservedEngine | None = None

    def collect(self) -> Iterator[Metric]:
        info = InfoMetricFamily(PREFIX, "The engine's version, source and sink kinds")
        info.add_metric(
            [],
            {
                "version": __version__,
                "source_kind": self._config.source.kind,
                "sink_kind": self._config.sink.kind,
            },
        )
        yield info
        engine = self.engine
        if engine is None:
            return
        now = self._now()
        yield from self._engine_metrics(engine, now)
        yield from self._stream_metrics(engine.stats, now)
        yield from self._snapshot_metrics(engine, now)
        yield from self._sink_metrics(engine, now)

    def _engine_metrics(self, engine: ObservedEngine, now: float) -> Iterator[Metric]:
        stats = engine.stats
        yield GaugeMetricFamily(
            _name("start_time_seconds"),
            "When the engine started (Unix time)",
            value=stats.started_at,
        )
        errors = Counter(dict(stats.errors))  # a copy in one step; the engine bumps it
        errors["source_retry"] = engine.retried_tasks
        family = CounterMetricFamily(
            _name("errors"),
            "Errors by kind: signal (a signal the engine could not act on), snapshot (a "
            "table's snapshot failed), source_retry (a chunk task retried after a transient "
            "source failure)",
            labels=["kind"],
        )
        for kind in sorted(set(ERROR_KINDS) | set(errors)):
            family.add_metric([kind], errors[kind])
        yield family

    def _stream_metrics(self, stats: EngineStats, now: float) -> Iterator[Metric]:
        yield CounterMetricFamily(
            _name("stream_events"),
            "Change events of captured tables handed to the sink (rate() gives events/s)",
            value=stats.log_changes,
        )
        yield CounterMetricFamily(
            _name("stream_transactions"),
            "Transactions (commits) handed to the sink",
            value=stats.log_transactions,
        )
        yield CounterMetricFamily(
            _name("chunks_closed"),
            "Chunk windows closed (their READ rows handed to the sink), all tables",
            value=stats.chunks_closed,
        )
        lag = self._lag_bytes()
        if lag is not None:
            yield GaugeMetricFamily(
                _name("stream_lag_bytes"),
                "Bytes of log after the position the engine has handed to the sink",
                value=lag,
            )
        if stats.last_commit_ts_ms:
            commit_s = stats.last_commit_ts_ms / 1000
            yield GaugeMetricFamily(
                _name("stream_last_commit_timestamp_seconds"),
                "Commit time at the source of the newest transaction handed over (Unix time)",
                value=commit_s,
            )
            # How far behind the source the engine was when the newest commit reached it
            # (Debezium's MilliSecondsBehindSource): ~0 while it keeps up; an idle log keeps
            # the last value (not a growing age), unless nothing is left to read.
            behind = 0.0 if lag == 0 else max(0.0, stats.last_commit_seen_at - commit_s)
            yield GaugeMetricFamily(
                _name("stream_lag_seconds"),
                "Seconds between the newest handed-over commit at the source and its "
                "arrival at the engine (0: the log is read to its end)",
                value=behind,
            )

    def _snapshot_metrics(self, engine: ObservedEngine, now: float) -> Iterator[Metric]:
        state = engine.state
        labels = ["table", "signal_id"]
        rows_read = CounterMetricFamily(
            _name("snapshot_rows_read"), "Rows the chunk SELECTs returned", labels=labels
        )
        rows_emitted = CounterMetricFamily(
            _name("snapshot_rows_emitted"), "READ rows handed to the sink", labels=labels
        )
        rows_dropped = CounterMetricFamily(
            _name("snapshot_rows_dropped"),
            "Rows read but dropped by the log in their window (their newer values went out "
            "as log events)",
            labels=labels,
        )
        chunks = CounterMetricFamily(_name("snapshot_chunks"), "Chunks completed", labels=labels)
        status = GaugeMetricFamily(
            _name("snapshot_state"),
            "1 for the snapshot's current state, 0 for the others",
            labels=[*labels, "state"],
        )
        estimated = GaugeMetricFamily(
            _name("snapshot_estimated_rows"),
            "The table's row count from the database's statistics when the snapshot started",
            labels=labels,
        )
        ratio = GaugeMetricFamily(
            _name("snapshot_progress_ratio"),
            "Rows read over the estimate, 0..1 (below 1 until done)",
            labels=labels,
        )
        remaining = GaugeMetricFamily(
            _name("snapshot_remaining_seconds"),
            "Estimated seconds until the snapshot is done, at its average rate so far",
            labels=labels,
        )
        started = GaugeMetricFamily(
            _name("snapshot_start_time_seconds"),
            "When the snapshot started (Unix time)",
            labels=labels,
        )
        now_ms = int(now * 1000)
        tables: set[str] = set()
        for progress in shown_snapshots(list(state.snapshots)):  # a copy in one step
            table = str(progress.table)
            tables.add(table)
            values = [table, progress.signal_id]
            read, emitted = progress.rows_read, progress.rows_emitted
            rows_read.add_metric(values, read)
            rows_emitted.add_metric(values, emitted)
            rows_dropped.add_metric(values, max(read - emitted, 0))
            chunks.add_metric(values, progress.chunk_id)
            current = progress.status
            for each in SnapshotStatus:
                status.add_metric([*values, each.value], 1.0 if each is current else 0.0)
            guess = eta(progress, now_ms)
            if progress.estimated_rows is not None:
                estimated.add_metric(values, progress.estimated_rows)
            if guess.fraction is not None:
                ratio.add_metric(values, guess.fraction)
            if guess.seconds_remaining is not None:  # only while running
                remaining.add_metric(values, guess.seconds_remaining)
            if progress.started_ms is not None:
                started.add_metric(values, progress.started_ms / 1000)
        yield from (rows_read, rows_emitted, rows_dropped, chunks, status)
        yield from (estimated, ratio, remaining, started)
        yield GaugeMetricFamily(
            _name("snapshot_paused"),
            "1 while snapshots are paused (pause-snapshot), else 0",
            value=1.0 if state.paused else 0.0,
        )
        flights = GaugeMetricFamily(
            _name("snapshot_windows_in_flight"),
            "Chunk windows held now (being read, or waiting for their close watermark)",
            labels=["table"],
        )
        per_table = Counter(str(t) for t in engine.windows_in_flight)
        for table in sorted(tables | set(per_table)):
            flights.add_metric([table], per_table[table])
        yield flights

    def _sink_metrics(self, engine: ObservedEngine, now: float) -> Iterator[Metric]:
        checkpoints = engine.checkpoints
        yield GaugeMetricFamily(
            _name("checkpoints_unacknowledged"),
            "Checkpoints the sink has not acknowledged yet",
            value=checkpoints.unacked,
        )
        saved_at = checkpoints.saved_at
        if saved_at:
            yield GaugeMetricFamily(
                _name("checkpoint_last_timestamp_seconds"),
                "When state was last saved for an acknowledged checkpoint (Unix time)",
                value=saved_at,
            )
            yield GaugeMetricFamily(
                _name("checkpoint_age_seconds"),
                "Seconds since state was last saved for an acknowledged checkpoint",
                value=max(0.0, now - saved_at),
            )
        sink = engine.sink
        if not isinstance(sink, SinkMetrics):
            return
        try:
            values = dict(sink.metrics())
        except Exception:  # a scrape must not fail for one sink's figures
            log.debug("the sink's metrics could not be read", exc_info=True)
            return
        for key, value in sorted(values.items()):
            if not _SINK_KEY.match(key):
                continue
            help_text = SINK_HELP.get(key, f"The sink's {key.replace('_', ' ')}")
            yield GaugeMetricFamily(_name(f"sink_{key}"), help_text, value=float(value))


# --- the log's end, off the scrape's path --------------------------------------------------


class StreamLag:
    """The latest measurement of ``measure`` (bytes of log after the handed-over position),
    refreshed in a background thread at most every ``refresh_s``; None when unknown (not
    measured yet, failed, or older than ``stale_s``)."""

    def __init__(
        self,
        measure: Callable[[], int | None],
        *,
        refresh_s: float = LAG_REFRESH_S,
        stale_s: float = LAG_STALE_S,
        clock: Callable[[], float] = time.monotonic,
        spawn: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        self._measure = measure
        self._refresh_s = refresh_s
        self._stale_s = stale_s
        self._clock = clock
        self._spawn = spawn or _daemon_thread
        self._lock = threading.Lock()
        self._value: int | None = None
        self._measured_at: float | None = None  # clock() of the last measurement's end
        self._asked_at: float | None = None  # clock() of the last start
        self._running = False
        self._failing = False  # the last measurement failed (said once)

    def __call__(self) -> int | None:
        now = self._clock()
        with self._lock:
            if not self._running and (
                self._asked_at is None or now - self._asked_at >= self._refresh_s
            ):
                self._running = True
                self._asked_at = now
                start = True
            else:
                start = False
            value, measured_at = self._value, self._measured_at
        if start:
            self._spawn(self._refresh)
        if measured_at is None or now - measured_at > self._stale_s:
            return None
        return value

    def refresh_soon(self) -> None:
        """Start a measurement now (at engine start, so the first scrape has one)."""
        self()

    def _refresh(self) -> None:
        """One measurement, on a thread of its own. A side channel: a failure is logged once
        (then at debug level until one succeeds again) and the metric is absent meanwhile;
        the engine goes on."""
        try:
            value = self._measure()
        except Exception as exc:
            level = logging.DEBUG if self._failing else logging.WARNING
            self._failing = True
            log.log(
                level,
                "metrics: the log's end could not be read (%s); the lag metric is "
                "absent until it can",
                " ".join(str(exc).split()) or type(exc).__name__,
            )
            value = None
        else:
            if self._failing:
                log.info("metrics: the log's end is read again")
            self._failing = False
        with self._lock:
            self._value = value
            self._measured_at = self._clock()
            self._running = False


def _daemon_thread(target: Callable[[], None]) -> None:
    threading.Thread(target=target, name="metrics-stream-lag", daemon=True).start()


class _HandedOverLag:
    """Bytes of log after the engine's handed-over position (``state.stream.resume``), on a
    dialect of its own, opened when first needed."""

    def __init__(self, open_dialect: Callable[[], Dialect], resume: Callable[[], Any]) -> None:
        self._open = open_dialect
        self._resume = resume
        self._dialect: Dialect | None = None
        self._lock = threading.Lock()

    def __call__(self) -> int | None:
        with self._lock:
            if self._dialect is None:
                self._dialect = self._open()
            resume = dict(self._resume())
            return self._dialect.lag_bytes(resume) if resume else None

    def close(self) -> None:
        with self._lock:
            if self._dialect is not None:
                self._dialect.close()
                self._dialect = None


# --- the endpoint ----------------------------------------------------------------------------


class MetricsEndpoint:
    """prometheus_client's HTTP server on ``[metrics] host:port``, serving the collector
    (and the process's CPU and memory) from a registry of its own."""

    def __init__(
        self, config: Config, *, open_dialect: Callable[[], Dialect] | None = None
    ) -> None:
        if config.metrics.port is None:
            raise MetricsError("[metrics] port is not set")
        self._config = config
        self._open_dialect = open_dialect or _dialect_opener(config)
        self._lag_source: _HandedOverLag | None = None
        self._lag = StreamLag(self._measure_lag)
        self.collector = EngineCollector(config, lag_bytes=self._lag)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.port: int = config.metrics.port

    @property
    def url(self) -> str:
        host = self._config.metrics.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}/metrics"

    def start(self) -> None:
        settings = self._config.metrics
        assert settings.port is not None
        try:
            self._server, self._thread = start_http_server(
                settings.port, addr=settings.host, registry=self.registry
            )
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise MetricsError(
                f"[metrics] cannot listen on {settings.host}:{settings.port}: {reason}; set "
                "another metrics.port (or --metrics-port), or 0 for any free port"
            ) from None
        self.port = int(self._server.server_port)
        log.info("metrics: serving %s", self.url)

    def attach(self, engine: ObservedEngine) -> None:
        """``run_engine``'s ``on_start``: from now on scrapes read this engine."""
        self._lag_source = _HandedOverLag(self._open_dialect, lambda: engine.state.stream.resume)
        self.collector.engine = engine
        self._lag.refresh_soon()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        if self._lag_source is not None:
            self._lag_source.close()

    def _measure_lag(self) -> int | None:
        source = self._lag_source
        return source() if source is not None else None


def _dialect_opener(config: Config) -> Callable[[], Dialect]:
    def open_dialect() -> Dialect:
        from snapshotter.app.runner import open_dialect as open_configured

        return open_configured(config)

    return open_dialect


@contextmanager
def serve_metrics(config: Config) -> Iterator[MetricsEndpoint | None]:
    """The endpoint while the block runs, if ``[metrics] port`` is set (else None): pass its
    ``attach`` as ``run_engine``'s ``on_start``."""
    if config.metrics.port is None:
        yield None
        return
    endpoint = MetricsEndpoint(config)
    endpoint.start()
    try:
        yield endpoint
    finally:
        endpoint.stop()


def with_port(config: Config, port: int | None) -> Config:
    """``config`` with ``--metrics-port`` (None: unchanged)."""
    if port is None:
        return config
    try:
        metrics = MetricsConfig(port=port, host=config.metrics.host)
    except ValidationError:
        raise MetricsError(f"--metrics-port {port}: a port is 0 to 65535") from None
    return config.model_copy(update={"metrics": metrics})

"""The metrics endpoint (snapshotter.app.metrics) without a database: the collector against a
fake engine and against the real engine driven step by step, the log-lag measurement's
refresh rules, the HTTP endpoint on a free port, the config and ``--metrics-port``, and the
sample Grafana dashboard (every metric it queries exists)."""

from __future__ import annotations

import json
import logging
import re
import time
import urllib.request
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from signals import ExecuteSnapshot
from signals.names import TableId
from snapshotter.app.metrics import (
    EngineCollector,
    MetricsEndpoint,
    MetricsError,
    StreamLag,
    shown_snapshots,
    with_port,
)
from snapshotter.config import Config, ConfigError, parse_config
from snapshotter.core.state import EngineState, SnapshotStatus, TableProgress
from snapshotter.engine.stats import EngineStats

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"
ORDERS = TableId("public", "orders")
ITEMS = TableId("public", "items")
NOW = float(int(time.time()))  # the endpoint's collector reads the real clock


def metric_names(families: Iterable[Metric]) -> set[str]:
    """Every sample name of ``families`` (``_total`` included)."""
    return {sample.name for family in families for sample in family.samples}


def config(extra: str = "", sink: str = "") -> Config:
    return parse_config(
        f"""
[source]
kind = "postgres"
url = "postgresql://u:p@h:5432/db"
{sink}
{extra}
""",
        environ={},
    )


@dataclass
class FakeCheckpoints:
    saved_at: float = 0.0
    unacked: int = 0


class StagingSink:
    def __init__(self, values: Mapping[str, float]) -> None:
        self.values = values

    def metrics(self) -> Mapping[str, float]:
        return self.values


class BrokenSink:
    def metrics(self) -> Mapping[str, float]:
        raise RuntimeError("not now")


@dataclass
class FakeEngine:
    stats: EngineStats = field(default_factory=lambda: EngineStats(started_at=NOW - 60))
    state: EngineState = field(default_factory=EngineState)
    checkpoints: FakeCheckpoints = field(default_factory=FakeCheckpoints)
    sink: object = field(default_factory=object)
    retried_tasks: int = 0
    windows_in_flight: list[TableId] = field(default_factory=list)


def running_orders(**changes: Any) -> TableProgress:
    progress = TableProgress(
        table=ORDERS,
        signal_id="s1",
        status=SnapshotStatus.RUNNING,
        key_columns=["id"],
        chunk_id=4,
        rows_read=400,
        rows_emitted=390,
        estimated_rows=1000,
        started_ms=int((NOW - 40) * 1000),
    )
    for name, value in changes.items():
        setattr(progress, name, value)
    return progress


def scrape(collector: EngineCollector) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """The collector's samples as name -> sorted labels -> value, through the text format
    and prometheus_client's parser (what a scraper sees)."""
    from prometheus_client import generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    text = generate_latest(registry).decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def one(samples: dict[str, dict[Any, float]], name: str, **labels: str) -> float:
    return samples[name][tuple(sorted(labels.items()))]


def test_without_an_engine_only_the_info_is_shown() -> None:
    samples = scrape(
        EngineCollector(
            config(sink='[sink]\nkind = "kafka"\nbootstrap_servers = "k:9092"'), now=lambda: NOW
        )
    )
    assert list(samples) == ["snapshotter_info"]
    ((labels, value),) = samples["snapshotter_info"].items()
    assert dict(labels)["source_kind"] == "postgres" and dict(labels)["sink_kind"] == "kafka"
    assert value == 1


def test_a_running_snapshot_its_progress_and_eta() -> None:
    engine = FakeEngine()
    engine.state.snapshots.append(running_orders())
    engine.windows_in_flight = [ORDERS, ORDERS, ITEMS]
    collector = EngineCollector(config(), now=lambda: NOW)
    collector.engine = engine
    samples = scrape(collector)
    ids = {"table": "public.orders", "signal_id": "s1"}
    assert one(samples, "snapshotter_snapshot_rows_read_total", **ids) == 400
    assert one(samples, "snapshotter_snapshot_rows_emitted_total", **ids) == 390
    assert one(samples, "snapshotter_snapshot_rows_dropped_total", **ids) == 10
    assert one(samples, "snapshotter_snapshot_chunks_total", **ids) == 4
    assert one(samples, "snapshotter_snapshot_estimated_rows", **ids) == 1000
    assert one(samples, "snapshotter_snapshot_progress_ratio", **ids) == pytest.approx(0.4)
    # 400 rows in 40 s: 10 rows/s, 600 to go
    assert one(samples, "snapshotter_snapshot_remaining_seconds", **ids) == pytest.approx(60)
    assert one(samples, "snapshotter_snapshot_start_time_seconds", **ids) == NOW - 40
    states = {
        dict(labels)["state"]: value
        for labels, value in samples["snapshotter_snapshot_state"].items()
    }
    assert states == {s.value: float(s is SnapshotStatus.RUNNING) for s in SnapshotStatus}
    assert one(samples, "snapshotter_snapshot_windows_in_flight", table="public.orders") == 2
    assert one(samples, "snapshotter_snapshot_windows_in_flight", table="public.items") == 1
    assert one(samples, "snapshotter_snapshot_paused") == 0
    assert one(samples, "snapshotter_start_time_seconds") == NOW - 60


def test_unknowns_are_left_out_not_zero() -> None:
    engine = FakeEngine()
    engine.state.snapshots.append(running_orders(estimated_rows=None, started_ms=None))
    collector = EngineCollector(config(), now=lambda: NOW)
    collector.engine = engine
    samples = scrape(collector)
    for name in (
        "snapshotter_snapshot_estimated_rows",
        "snapshotter_snapshot_progress_ratio",
        "snapshotter_snapshot_remaining_seconds",
        "snapshotter_snapshot_start_time_seconds",
        "snapshotter_stream_lag_bytes",  # not measured
        "snapshotter_stream_lag_seconds",  # no commit yet
        "snapshotter_checkpoint_age_seconds",  # no save yet
    ):
        assert name not in samples, name


def test_history_is_left_out_and_a_reused_signal_id_shows_once() -> None:
    old = running_orders(signal_id="s0", status=SnapshotStatus.DONE)
    failed = running_orders(signal_id="s1", status=SnapshotStatus.FAILED)
    again = running_orders(signal_id="s1", rows_read=7)  # the same id sent again
    queued = TableProgress(table=ITEMS, signal_id="s2")
    newest_items = TableProgress(table=ITEMS, signal_id="s3", status=SnapshotStatus.DONE)
    shown = shown_snapshots([old, failed, queued, again, newest_items])
    assert shown == [queued, again, newest_items]


def test_stream_checkpoint_sink_and_error_figures() -> None:
    engine = FakeEngine(
        sink=StagingSink({"staged_bytes": 2048, "staged_limit_bytes": 4096, "Bad-Key": 1}),
        checkpoints=FakeCheckpoints(saved_at=NOW - 3, unacked=2),
        retried_tasks=5,
    )
    engine.stats.log_changes = 120
    engine.stats.log_transactions = 30
    engine.stats.chunks_closed = 9
    engine.stats.errors["snapshot"] += 1
    engine.stats.commit_seen(int((NOW - 10) * 1000))
    engine.stats.last_commit_seen_at = NOW - 8  # reached the engine 2 s after its commit
    lag = {"bytes": 5000}
    collector = EngineCollector(config(), lag_bytes=lambda: lag["bytes"], now=lambda: NOW)
    collector.engine = engine
    samples = scrape(collector)
    assert one(samples, "snapshotter_stream_events_total") == 120
    assert one(samples, "snapshotter_stream_transactions_total") == 31
    assert one(samples, "snapshotter_chunks_closed_total") == 9
    assert one(samples, "snapshotter_stream_lag_bytes") == 5000
    assert one(samples, "snapshotter_stream_lag_seconds") == pytest.approx(2)
    assert one(samples, "snapshotter_stream_last_commit_timestamp_seconds") == NOW - 10
    assert one(samples, "snapshotter_checkpoints_unacknowledged") == 2
    assert one(samples, "snapshotter_checkpoint_age_seconds") == pytest.approx(3)
    assert one(samples, "snapshotter_checkpoint_last_timestamp_seconds") == NOW - 3
    assert one(samples, "snapshotter_sink_staged_bytes") == 2048
    assert one(samples, "snapshotter_sink_staged_limit_bytes") == 4096
    assert not [n for n in samples if "bad" in n.lower()]  # not a metric name: skipped
    errors = {dict(k)["kind"]: v for k, v in samples["snapshotter_errors_total"].items()}
    assert errors == {"signal": 0, "snapshot": 1, "source_retry": 5}
    lag["bytes"] = 0  # read to the end: no lag in seconds either
    assert one(scrape(collector), "snapshotter_stream_lag_seconds") == 0


def test_a_sink_that_fails_to_report_costs_only_its_own_figures() -> None:
    collector = EngineCollector(config(), now=lambda: NOW)
    collector.engine = FakeEngine(sink=BrokenSink())
    samples = scrape(collector)
    assert "snapshotter_stream_events_total" in samples
    assert not [n for n in samples if n.startswith("snapshotter_sink_")]


def test_the_real_engine_driven_step_by_step(tmp_path: Path) -> None:
    from tests.unit.test_engine_steps import ITEMS as STEP_ITEMS
    from tests.unit.test_engine_steps import Database, MemorySink, Setup
    from tests.unit.test_engine_steps import config as steps_config

    db, sink = Database(range(1, 11)), MemorySink()
    db.signal(ExecuteSnapshot("go", (STEP_ITEMS,)))
    run = Setup(tmp_path, db, sink)
    collector = EngineCollector(steps_config(tmp_path), now=lambda: NOW)
    collector.engine = run.engine  # type-checked against ObservedEngine by mypy in app code
    assert run.until_caught_up() == 0
    samples = scrape(collector)
    ids = {"table": "public.items", "signal_id": "go"}
    assert one(samples, "snapshotter_snapshot_rows_read_total", **ids) == 10
    assert one(samples, "snapshotter_snapshot_chunks_total", **ids) == 4
    assert one(samples, "snapshotter_snapshot_state", state="done", **ids) == 1
    assert one(samples, "snapshotter_snapshot_windows_in_flight", table="public.items") == 0
    assert one(samples, "snapshotter_chunks_closed_total") == 4
    assert one(samples, "snapshotter_stream_transactions_total") > 0


# --- the log lag's measurement ----------------------------------------------------------


class Spawn:
    """Runs measurements when told, not in a thread."""

    def __init__(self) -> None:
        self.waiting: list[Any] = []

    def __call__(self, target: Any) -> None:
        self.waiting.append(target)

    def run(self) -> None:
        while self.waiting:
            self.waiting.pop(0)()


def test_the_lag_is_measured_in_the_background_at_most_every_refresh() -> None:
    clock, spawn, answers = [0.0], Spawn(), iter([100, 200, 300])
    calls = Counter[str]()

    def measure() -> int:
        calls["measure"] += 1
        return next(answers)

    lag = StreamLag(measure, refresh_s=5, stale_s=30, clock=lambda: clock[0], spawn=spawn)
    assert lag() is None  # started, not measured yet: the scrape does not wait
    assert lag() is None and len(spawn.waiting) == 1  # one measurement at a time
    spawn.run()
    assert lag() == 100
    clock[0] = 4.9
    assert lag() == 100 and not spawn.waiting  # fresh enough
    clock[0] = 5.0
    assert lag() == 100 and len(spawn.waiting) == 1  # the old value while it refreshes
    spawn.run()
    assert lag() == 200 and calls["measure"] == 2


def test_a_failed_or_stale_lag_measurement_is_left_out() -> None:
    clock, spawn = [0.0], Spawn()
    outcome: dict[str, Any] = {"value": 7}

    def measure() -> int:
        if isinstance(outcome["value"], Exception):
            raise outcome["value"]
        return int(outcome["value"])

    lag = StreamLag(measure, refresh_s=5, stale_s=30, clock=lambda: clock[0], spawn=spawn)
    lag()
    spawn.run()
    assert lag() == 7
    clock[0] = 10
    outcome["value"] = OSError("source down")
    lag()
    spawn.run()
    assert lag() is None  # failed: unknown, not the old value
    outcome["value"] = 8
    clock[0] = 20
    lag()
    clock[0] = 51  # the measurement started at 20 never came back: stale
    assert lag() is None


def test_a_failing_lag_measurement_is_said_once_and_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The lag thread is a side channel (issue 26: no thread fails silently): its failure is
    a warning once, not one per scrape, and the metric comes back when the source does."""
    clock, spawn = [0.0], Spawn()
    outcome: dict[str, Any] = {"value": OSError("source down")}

    def measure() -> int:
        if isinstance(outcome["value"], Exception):
            raise outcome["value"]
        return int(outcome["value"])

    lag = StreamLag(measure, refresh_s=5, stale_s=30, clock=lambda: clock[0], spawn=spawn)
    with caplog.at_level(logging.DEBUG, logger="snapshotter.metrics"):
        for step in range(3):
            clock[0] = step * 5
            lag()
            spawn.run()
            assert lag() is None
        outcome["value"] = 9
        clock[0] = 15
        lag()
        spawn.run()
        assert lag() == 9
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    warnings = [m for level, m in said if level == logging.WARNING]
    assert warnings == [
        "metrics: the log's end could not be read (source down); the lag metric is absent "
        "until it can"
    ]
    assert [m for level, m in said if level == logging.DEBUG].count(
        "metrics: the log's end could not be read (source down); the lag metric is absent "
        "until it can"
    ) == 2
    assert (logging.INFO, "metrics: the log's end is read again") in said


# --- the endpoint ------------------------------------------------------------------------


class LagDialect:
    def __init__(self) -> None:
        self.closed = False
        self.asked: list[dict[str, Any]] = []

    def lag_bytes(self, resume: Mapping[str, Any]) -> int:
        self.asked.append(dict(resume))
        return 42

    def close(self) -> None:
        self.closed = True


def endpoint_with_fake_engine() -> tuple[MetricsEndpoint, LagDialect]:
    dialect = LagDialect()
    endpoint = MetricsEndpoint(
        config("[metrics]\nport = 0"),
        open_dialect=lambda: dialect,  # type: ignore[arg-type,return-value]
    )
    engine = FakeEngine(sink=StagingSink({"staged_bytes": 1, "staged_limit_bytes": 2}))
    engine.state.stream.resume = {"lsn": 10}
    engine.state.snapshots.append(running_orders())
    endpoint.attach(engine)  # type: ignore[arg-type]
    return endpoint, dialect


def test_the_endpoint_serves_over_http_and_stops(tmp_path: Path) -> None:
    endpoint, dialect = endpoint_with_fake_engine()
    endpoint.start()
    try:
        assert endpoint.port > 0 and endpoint.url.endswith(f":{endpoint.port}/metrics")
        for _ in range(50):  # the lag is measured in a thread of its own
            with urllib.request.urlopen(endpoint.url, timeout=5) as response:
                text = response.read().decode()
            if "snapshotter_stream_lag_bytes" in text:
                break
        names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
        assert "snapshotter_snapshot_rows_read_total" in names
        assert "snapshotter_stream_lag_bytes" in names
        assert "process_cpu_seconds_total" in names  # the process collector, own registry
        assert dialect.asked[0] == {"lsn": 10}
    finally:
        endpoint.stop()
    assert dialect.closed
    with pytest.raises(OSError):
        urllib.request.urlopen(endpoint.url, timeout=2)


def test_a_port_in_use_is_a_clear_error() -> None:
    first = MetricsEndpoint(config("[metrics]\nport = 0"))
    first.start()
    try:
        second = MetricsEndpoint(config(f"[metrics]\nport = {first.port}"))
        with pytest.raises(MetricsError, match=rf"cannot listen on 127.0.0.1:{first.port}: "):
            second.start()
    finally:
        first.stop()


# --- configuration -----------------------------------------------------------------------


def test_metrics_config_and_the_command_line_override() -> None:
    assert config().metrics.port is None and config().metrics.host == "127.0.0.1"
    set_up = config('[metrics]\nport = 9108\nhost = "0.0.0.0"')
    assert (set_up.metrics.port, set_up.metrics.host) == (9108, "0.0.0.0")
    with pytest.raises(ConfigError, match=r"metrics\.prot: unknown key"):
        config("[metrics]\nprot = 1")
    with pytest.raises(ConfigError, match=r"metrics\.port"):
        config("[metrics]\nport = 70000")
    overridden = with_port(set_up, 0)
    assert (overridden.metrics.port, overridden.metrics.host) == (0, "0.0.0.0")
    assert with_port(set_up, None) is set_up
    with pytest.raises(MetricsError, match="--metrics-port -1"):
        with_port(set_up, -1)


def test_metrics_port_from_the_environment() -> None:
    text = '[source]\nkind = "postgres"\nurl = "postgresql://u:p@h/db"\n'
    loaded = parse_config(text, environ={"SNAPSHOTTER_METRICS_PORT": "9200"})
    assert loaded.metrics.port == 9200


def test_the_cli_takes_metrics_port_on_run_and_resume() -> None:
    from snapshotter.app.cli import build_parser

    parser = build_parser()
    for command in ("run", "resume"):
        args = parser.parse_args([command, "-c", "x.toml", "--metrics-port", "9108"])
        assert args.metrics_port == 9108
    assert parser.parse_args(["run", "-c", "x.toml"]).metrics_port is None


@pytest.mark.parametrize("bad", ["99999", "65536", "-1", "port"])
def test_a_bad_metrics_port_exits_2_as_the_same_value_in_the_config(
    bad: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--metrics-port 99999`` exited 1 where ``[metrics] port = 99999`` exits 2 (a usage
    error): both are refused before anything starts, with exit code 2."""
    from snapshotter.app.cli import main

    with pytest.raises(SystemExit) as info:
        main(["run", "-c", str(tmp_path / "x.toml"), "--metrics-port", bad])
    assert info.value.code == 2
    said = capsys.readouterr().err
    assert f"argument --metrics-port: not a port from 0 to 65535: {bad!r}" in said
    conf = tmp_path / "snapshotter.toml"
    conf.write_text(
        '[source]\nkind = "postgres"\nurl = "postgresql://u:p@h/db"\n[metrics]\nport = 99999\n',
        encoding="utf-8",
    )
    assert main(["run", "-c", str(conf)]) == 2


# --- the sample dashboard ----------------------------------------------------------------


def _exprs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [e for value in node.values() for e in _exprs(value)]
    if isinstance(node, list):
        return [e for value in node for e in _exprs(value)]
    return []


def test_the_grafana_dashboard_queries_only_metrics_that_exist() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    exprs = _exprs(dashboard)
    assert len(exprs) >= 10
    referenced = {
        name for expr in exprs for name in re.findall(r"\b((?:snapshotter|process)_\w+)", expr)
    }
    endpoint, _ = endpoint_with_fake_engine()
    engine = endpoint.collector.engine
    assert isinstance(engine, FakeEngine)
    engine.stats.commit_seen(int(NOW * 1000))
    engine.checkpoints.saved_at = NOW
    known = metric_names(endpoint.registry.collect())
    for kafka in ("unacked_messages", "unflushed_bytes", "unflushed_limit_bytes"):
        known.add(f"snapshotter_sink_{kafka}")  # the Kafka sink's (this fake is Spark-like)
    missing = referenced - known
    # the lag appears once measured (in the background); everything else is there now
    assert missing <= {"snapshotter_stream_lag_bytes"}, missing
    endpoint.stop()


# --- the sinks' own figures ----------------------------------------------------------------


def test_the_kafka_sink_reports_unacknowledged_messages_and_unflushed_bytes() -> None:
    from snapshotter.sinks.base import SinkMetrics
    from tests.unit.test_kafka_messages import fake_sink, run_oracle

    sink, producer = fake_sink(2)
    assert isinstance(sink, SinkMetrics)
    assert sink.metrics()["unacked_messages"] == 0
    events, _ = run_oracle([("put", 1, False, False), ("put", 2, False, False), ("del", 1)])
    sink.write(events)
    sink.checkpoint()
    figures = sink.metrics()
    assert figures["unacked_messages"] == len(producer.sent) > 0
    assert figures["unflushed_bytes"] > 0
    assert figures["unflushed_limit_bytes"] == sink._max_unflushed
    sink.acknowledged()
    assert sink.metrics()["unacked_messages"] == 0


def test_the_spark_sink_reports_staged_bytes_until_they_land(tmp_path: Path) -> None:
    from snapshotter.sinks.base import SinkMetrics
    from snapshotter.sinks.spark.staging import StagingArea
    from tests.unit.helpers import spark_landed, spark_staged
    from tests.unit.test_spark_sink_order import GatedLander, event, sink_over, stage

    staging = StagingArea(tmp_path / "staging")
    staging.open()
    stage(staging, 1)  # left by the last run, recorded: lands first, behind the gate
    lander = GatedLander()
    sink = sink_over(staging, lander, str(tmp_path / "lake"))
    assert isinstance(sink, SinkMetrics)
    sink.open({"staged": 1, "path": str(tmp_path / "lake"), "format": "parquet"})
    assert lander.started.wait(10)
    figures = sink.metrics()
    assert figures["staged_bytes"] > 0
    assert figures["staged_limit_bytes"] == 64 * 1024 * 1024
    sink.write([event(5, 50)])
    sink.checkpoint()
    assert spark_staged(sink, 10)
    assert sink.metrics()["unstaged_checkpoints"] == 0
    lander.gate.set()
    assert spark_landed(sink, 30)  # the staged bytes went back to 0...
    assert [seq for call in lander.calls for seq in call] == [1, 2]  # ...as both batches landed
    sink.close()

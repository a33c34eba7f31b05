"""The Prometheus endpoint against a real engine, on PostgreSQL and MySQL/MariaDB: scraped over
HTTP while a snapshot runs beside a writer, and after; and ``snapshotter run --metrics-port``
serving from the command line."""

from __future__ import annotations

import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from snapshotter.app.metrics import serve_metrics, with_port
from snapshotter.app.runner import StopFlag, run_engine
from snapshotter.engine.workers import PhaseHooks
from tests.integration.engine_harness import Capture, EngineThread, mysql_connect

ROWS = 3000
CHUNK = 100
Samples = dict[str, dict[frozenset[tuple[str, str]], float]]


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get(name, {}).get(frozenset(labels.items()))


@pytest.fixture(params=["postgres", "mysql"])
def cap(request: pytest.FixtureRequest) -> Capture:
    factory = request.getfixturevalue("capture" if request.param == "postgres" else "mysql_capture")
    made: Capture = factory(chunk_size=CHUNK)
    return made


def create_items(cap: Capture) -> str:
    name = f"{cap.schema}.items"
    quoted = f'"{cap.schema}".items' if cap.kind == "postgres" else f"`{cap.schema}`.items"
    cap.sql(f"CREATE TABLE {quoted} (id int PRIMARY KEY, name varchar(40) NOT NULL)")
    if cap.kind == "postgres":
        cap.sql(f"ALTER TABLE {quoted} REPLICA IDENTITY FULL")
    values = ", ".join(f"({i}, 'item {i}')" for i in range(1, ROWS + 1))
    cap.sql(f"INSERT INTO {quoted} (id, name) VALUES {values}")
    cap.sql(f"ANALYZE {quoted}" if cap.kind == "postgres" else f"ANALYZE TABLE {quoted}")
    return name


@contextmanager
def updating(cap: Capture, per_second: float = 100) -> Iterator[Callable[[], int]]:
    """Updates of random rows, one per transaction, in a thread, while the block runs;
    yields how many committed so far."""
    done = threading.Event()
    count = [0]
    errors: list[BaseException] = []

    def write() -> None:
        rng = random.Random(19)
        try:
            if cap.kind == "postgres":
                pg = psycopg.connect(cap.url, autocommit=True)
                statement = f'UPDATE "{cap.schema}".items SET name = %s WHERE id = %s'
                run: Callable[[str, int], Any] = lambda n, i: pg.execute(statement, (n, i))  # noqa: E731
                close = pg.close
            else:
                my = mysql_connect(cap.url)
                cursor = my.cursor()
                statement = f"UPDATE `{cap.schema}`.items SET name = %s WHERE id = %s"
                run = lambda n, i: cursor.execute(statement, (n, i))  # noqa: E731
                close = my.close
            try:
                while not done.wait(1 / per_second):
                    run(f"changed {rng.randrange(10**6)}", rng.randint(1, ROWS))
                    count[0] += 1
            finally:
                close()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=write, name="metrics-test-writer", daemon=True)
    thread.start()
    try:
        yield lambda: count[0]
    finally:
        done.set()
        thread.join(10)
    if errors:
        raise errors[0]


@contextmanager
def engine_with_metrics(cap: Capture, hooks: PhaseHooks) -> Iterator[str]:
    """The engine in a thread (as ``run`` runs it) with the endpoint on a free port; yields
    the endpoint's URL and stops the engine at the end (exit 0 expected)."""
    config = with_port(cap.config, 0)
    with serve_metrics(config) as endpoint:
        assert endpoint is not None
        flag = StopFlag()
        holder = EngineThread(threading.Thread(), flag)

        def target() -> None:
            try:
                holder.result["code"] = run_engine(
                    config, stop=flag, hooks=hooks, on_start=endpoint.attach
                )
            except BaseException as exc:
                holder.result["error"] = exc

        holder.thread = threading.Thread(target=target, name="engine-under-test", daemon=True)
        holder.thread.start()
        try:
            yield endpoint.url
        finally:
            assert holder.stop(60) == 0


def wait_for(check: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_metrics_follow_a_snapshot_beside_a_writer(cap: Capture) -> None:
    table = create_items(cap)
    cap.init()
    # Chunks slower than the log, so scrapes see the snapshot running, for long enough to
    # have a rate (core.eta wants a second of history) and so a time remaining.
    hooks = PhaseHooks(after_read=lambda task: time.sleep(0.15))
    ids = {"table": table, "signal_id": ""}
    with engine_with_metrics(cap, hooks) as url:
        wait_for(lambda: "snapshotter_stream_events_total" in scrape(url), "the engine to start")
        first = scrape(url)
        info = next(iter(first["snapshotter_info"]))
        assert ("source_kind", cap.kind) in info and ("sink_kind", "jsonl") in info
        assert "snapshotter_snapshot_rows_read_total" not in first  # no snapshot yet
        events_before = value(first, "snapshotter_stream_events_total") or 0
        with updating(cap) as written:
            wait_for(lambda: written() >= 20, "the writer to get going")
            cap.execute(table)
            seen: list[Samples] = []

            def finished() -> bool:
                samples = scrape(url)
                seen.append(samples)
                states = samples.get("snapshotter_snapshot_state", {})
                return any(("state", "done") in k and v == 1 for k, v in states.items())

            wait_for(finished, "the snapshot to finish", timeout=60)
            time.sleep(0.5)  # a few more updates after the snapshot
        wait_for(lambda: written() > 0 and "snapshotter_stream_lag_bytes" in scrape(url), "lag")
        last = scrape(url)

    # The signal id is the CLI's own: take it from the series.
    (labels,) = last["snapshotter_snapshot_rows_read_total"]
    ids = dict(labels)
    assert ids["table"] == table
    reads = [value(s, "snapshotter_snapshot_rows_read_total", **ids) for s in seen]
    reads = [r for r in reads if r is not None]
    assert reads == sorted(reads), "rows read never goes back"
    assert reads[-1] == ROWS == value(last, "snapshotter_snapshot_rows_read_total", **ids)
    assert any(0 < r < ROWS for r in reads), f"no scrape saw the snapshot running: {reads}"
    states = [
        {dict(k)["state"] for k, v in s.get("snapshotter_snapshot_state", {}).items() if v == 1}
        for s in seen
    ]
    assert {"running"} in states and states[-1] == {"done"}
    assert states.index({"running"}) < states.index({"done"})
    emitted = value(last, "snapshotter_snapshot_rows_emitted_total", **ids)
    dropped = value(last, "snapshotter_snapshot_rows_dropped_total", **ids)
    assert emitted is not None and dropped is not None and emitted + dropped == ROWS
    chunks = value(last, "snapshotter_snapshot_chunks_total", **ids)
    assert chunks is not None and chunks >= ROWS // CHUNK
    assert value(last, "snapshotter_chunks_closed_total") == chunks
    estimated = value(last, "snapshotter_snapshot_estimated_rows", **ids)
    assert estimated is not None and estimated > 0
    assert value(last, "snapshotter_snapshot_progress_ratio", **ids) == 1.0
    assert value(last, "snapshotter_snapshot_remaining_seconds", **ids) == 0.0
    assert any(
        value(s, "snapshotter_snapshot_remaining_seconds", **ids) is not None for s in seen[:-1]
    )
    assert value(last, "snapshotter_snapshot_windows_in_flight", table=table) == 0
    # The stream: the writer's updates (and watermark-free counting: signal rows excluded).
    events = value(last, "snapshotter_stream_events_total") or 0
    assert events - events_before >= 20
    transactions = value(last, "snapshotter_stream_transactions_total") or 0
    assert transactions >= events - events_before
    lag = value(last, "snapshotter_stream_lag_bytes")
    assert lag is not None and lag >= 0
    lag_s = value(last, "snapshotter_stream_lag_seconds")
    assert lag_s is not None and 0 <= lag_s < 60
    assert value(last, "snapshotter_stream_last_commit_timestamp_seconds") is not None
    age = value(last, "snapshotter_checkpoint_age_seconds")
    assert age is not None and 0 <= age < 30
    errors = {dict(k)["kind"]: v for k, v in last["snapshotter_errors_total"].items()}
    assert errors == {"signal": 0, "snapshot": 0, "source_retry": 0}
    assert "process_resident_memory_bytes" in last


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_run_serves_metrics_on_the_port_the_command_line_gives(capture: Any) -> None:
    cap: Capture = capture()
    create_items(cap)
    cap.init()
    port = free_port()
    argv = [sys.executable, "-m", "snapshotter.app.cli", "run", "-c", str(cap.config_path)]
    engine = subprocess.Popen(
        [*argv, "--metrics-port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    try:

        def serving() -> bool:
            assert engine.poll() is None, engine.communicate()
            try:
                return "snapshotter_stream_events_total" in scrape(url)
            except (urllib.error.URLError, ConnectionError):
                return False

        wait_for(serving, "snapshotter run to serve metrics", timeout=60)
        info = next(iter(scrape(url)["snapshotter_info"]))
        assert ("source_kind", "postgres") in info
    finally:
        engine.send_signal(signal.SIGTERM)
        _, stderr = engine.communicate(timeout=60)
    assert engine.returncode == 0, stderr
    assert f"metrics: serving {url}" in stderr
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        scrape(url)  # stopped with the engine

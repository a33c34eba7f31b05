"""A Spanner change stream changed under a running engine, against the emulator: altered to
stop watching a captured table, or the signal table, or dropped and created again under the
same name. The engine must stop (or refuse to start) with the reason and the fix, and
``status`` must warn, never go on missing changes or waiting forever (issue 26).

The emulator's ``ALTER CHANGE STREAM ... SET FOR`` watches only the last table it lists
(docs/spanner.md, On the emulator), so the tests narrow a stream to one table.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest

from snapshotter.engine import watchdog
from snapshotter.engine.watchdog import LogCoverageError
from snapshotter.sources.log import LogReaderError
from snapshotter.sources.positions import StreamPositionLost
from tests.integration import test_spanner_source as source_tests
from tests.integration.engine_harness import Capture, EngineThread
from tests.integration.test_spanner_source import (
    STREAM,
    SpannerCase,
    SpannerWriter,
    _windows_hooks,
    seed_rows,
    stream_ddl,
)

pytestmark = pytest.mark.integration

spanner_case = source_tests.spanner_case  # the fixture: a database, a config

ROWS = 1500


def _cli_says(capture: Capture, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = capture.cli(*args)
    said = capsys.readouterr()
    return code, said.out + said.err


def _status_warnings(capture: Capture, capsys: pytest.CaptureFixture[str]) -> list[str]:
    code, said = _cli_says(capture, capsys, "status", "--json")
    assert code == 0, said
    warnings: list[str] = json.loads(said)["warnings"]
    return warnings


def _stopped_with(engine: EngineThread, timeout: float) -> str:
    """The engine's error, once it stopped by itself within ``timeout`` seconds."""
    with pytest.raises(LogCoverageError) as stopped:
        engine.join(timeout)
    return str(stopped.value)


def _streaming(capture: Capture) -> None:
    """Wait until the engine has saved a checkpoint with the stream's partitions."""
    path = capture.directory / "state/state.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if path.exists() and json.loads(path.read_text())["stream"]["resume"].get("partitions"):
            return
        time.sleep(0.2)
    raise AssertionError("the engine saved no stream position")


@pytest.mark.parametrize("dialect", ["googlesql"])
def test_a_captured_table_the_stream_stops_watching_stops_the_engine_with_the_fix(
    spanner_case: Callable[..., SpannerCase],
    dialect: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(watchdog, "CHECK_EVERY_S", 5.0)  # the check as it runs, sooner
    case = spanner_case(dialect)
    capture = case.capture
    keys = seed_rows(case.database, dialect, 100)
    capture.init()
    engine = capture.start()
    writer = SpannerWriter(case.database, dialect, seed=13, keys=keys, next_id=100).start()
    try:
        _streaming(capture)
        case.database.update_ddl([f"ALTER CHANGE STREAM {STREAM} SET FOR debezium_signal"]).result(
            120
        )
        altered = time.monotonic()
        # The engine's periodic check (every CHECK_EVERY_S) finds it, and stops.
        reason = _stopped_with(engine, watchdog.CHECK_EVERY_S + 120)
        waited = time.monotonic() - altered
    finally:
        writer.stop_event.set()
        engine.stop_flag.set()
    writer.stop()
    assert waited < watchdog.CHECK_EVERY_S + 120
    assert "no longer carries what the engine needs (found by the check every" in reason
    assert f"change stream {STREAM} does not watch public.items" in reason
    assert f"Fix: ALTER CHANGE STREAM {STREAM} SET FOR `debezium_signal`, `items`;" in reason
    assert "snapshot it again: snapshotter signal -c CONF execute-snapshot public.items" in reason
    # run and resume refuse to go on missing its changes; status says why.
    again = f"snapshotter signal -c {capture.config_path} execute-snapshot public.items"
    for command in ("run", "resume"):
        code, said = _cli_says(capture, capsys, command, "--until-caught-up")
        assert code == 1, said
        assert "does not carry what the engine needs; not starting" in said
        assert "does not watch public.items" in said and again in said
    warnings = _status_warnings(capture, capsys)
    assert any("does not watch public.items" in w and again in w for w in warnings), warnings


@pytest.mark.parametrize("dialect", ["postgresql"])
def test_a_snapshot_whose_signal_table_the_stream_stops_watching_stops_in_bounded_time(
    spanner_case: Callable[..., SpannerCase],
    dialect: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the periodic check: a close watermark overdue makes the engine ask, and stop."""
    monkeypatch.setattr(watchdog, "CHECK_EVERY_S", 10_000.0)
    monkeypatch.setattr(watchdog, "OVERDUE_MIN_S", 10.0)  # the bound as it runs, sooner
    case = spanner_case(dialect, chunk_size=50)
    capture = case.capture
    text = capture.config_path.read_text()
    # The bound is max(OVERDUE_MIN_S, chunk_timeout_s) after the close watermark was written.
    capture.config_path.write_text(text.replace("[source]\n", "[source]\nchunk_timeout_s = 10\n"))
    seed_rows(case.database, dialect, ROWS)
    capture.init()
    engine = capture.start(hooks=_windows_hooks([], hold_s=0.3))
    try:
        capture.execute("public.items")
        path = capture.directory / "state/state.json"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # a few chunks in
            done = json.loads(path.read_text())["snapshots"] if path.exists() else []
            if done and done[0]["chunk_id"] >= 3:
                break
            time.sleep(0.2)
        else:
            raise AssertionError("the snapshot did not start")
        case.database.update_ddl([f"ALTER CHANGE STREAM {STREAM} SET FOR items"]).result(120)
        altered = time.monotonic()
        reason = _stopped_with(engine, watchdog.OVERDUE_MIN_S + 120)
        waited = time.monotonic() - altered
    finally:
        engine.stop_flag.set()
    assert waited < watchdog.OVERDUE_MIN_S + 120
    assert "no longer carries what the engine needs (chunk window" in reason
    assert "of public.items waited" in reason and "s for its close watermark" in reason
    assert "does not watch the signal table public.debezium_signal" in reason
    fix = f'Fix: ALTER CHANGE STREAM {STREAM} SET FOR "public"."debezium_signal", "public"."items"'
    assert fix in reason
    code, said = _cli_says(capture, capsys, "run", "--until-caught-up")
    assert code == 1, said
    assert "does not carry what the engine needs; not starting" in said
    assert "does not watch the signal table public.debezium_signal" in said and fix in said
    warnings = _status_warnings(capture, capsys)
    assert any("the signal table" in w for w in warnings), warnings


@pytest.mark.parametrize("dialect", ["googlesql"])
def test_a_stream_dropped_and_created_again_is_a_lost_position_with_the_way_out(
    spanner_case: Callable[..., SpannerCase], dialect: str, capsys: pytest.CaptureFixture[str]
) -> None:
    case = spanner_case(dialect)
    capture = case.capture
    seed_rows(case.database, dialect, 100)
    capture.init()
    assert capture.run(timeout=180) == 0
    case.database.update_ddl([f"DROP CHANGE STREAM {STREAM}", stream_ddl(dialect)]).result(120)
    config = str(capture.config_path)
    for command in ("run", "resume"):
        code, said = _cli_says(capture, capsys, command, "--until-caught-up")
        assert code == 1, said
        assert f"change stream {STREAM} cannot be read from the saved position" in said
        assert f"snapshotter reset-stream -c {config}" in said
        assert "execute-snapshot public.items" in said
    warnings = _status_warnings(capture, capsys)
    assert any("cannot be read from the saved position" in w for w in warnings), warnings
    assert any("reset-stream" in w for w in warnings), warnings
    # The way out works: stream from now, then the engine runs.
    code, said = _cli_says(capture, capsys, "reset-stream", "--yes")
    assert code == 0, said
    assert capture.run(timeout=180) == 0
    assert _status_warnings(capture, capsys) == []


@pytest.mark.parametrize("dialect", ["postgresql"])
def test_a_stream_dropped_and_created_again_under_a_running_engine_stops_it_the_same_way(
    spanner_case: Callable[..., SpannerCase], dialect: str, capsys: pytest.CaptureFixture[str]
) -> None:
    case = spanner_case(dialect)
    capture = case.capture
    keys = seed_rows(case.database, dialect, 100)
    capture.init()
    engine = capture.start()
    writer = SpannerWriter(case.database, dialect, seed=17, keys=keys, next_id=100).start()
    try:
        _streaming(capture)
        case.database.update_ddl([f"DROP CHANGE STREAM {STREAM}", stream_ddl(dialect)]).result(120)
        # The partition queries fail at once (their partitions are not the new stream's).
        with pytest.raises(LogReaderError) as stopped:
            engine.join(120)
    finally:
        writer.stop_event.set()
        engine.stop_flag.set()
    writer.stop()
    assert isinstance(stopped.value.__cause__, StreamPositionLost), stopped.value
    assert f"change stream {STREAM} can no longer be read from where the engine was" in str(
        stopped.value
    )
    assert "reset-stream" in str(stopped.value)
    code, said = _cli_says(capture, capsys, "resume", "--until-caught-up")
    assert code == 1, said
    assert f"change stream {STREAM} cannot be read from the saved position" in said
    assert f"snapshotter reset-stream -c {capture.config_path}" in said


@pytest.mark.parametrize("dialect", ["googlesql", "postgresql"])
def test_a_stream_for_all_then_for_none_is_seen_though_information_schema_says_all(
    spanner_case: Callable[..., SpannerCase], dialect: str
) -> None:
    """The emulator's information_schema keeps ``all`` after DROP FOR ALL, while the stream
    sends nothing: the stream's own DDL statement decides."""
    from snapshotter.sources.connector import connector_for

    case = spanner_case(dialect)
    capture = case.capture
    connector = connector_for(capture.config.source)
    handle = connector.connect()
    items = capture.table_id("items")
    try:
        alter = f"ALTER CHANGE STREAM {STREAM}"
        case.database.update_ddl([f"{alter} SET FOR ALL"]).result(120)
        assert connector.log_coverage_problems(handle, [items]) == []
        case.database.update_ddl([f"{alter} DROP FOR ALL"]).result(120)
        problems = connector.log_coverage_problems(handle, [items])
    finally:
        connector.dispose(handle)
    assert [p.split(":")[0] for p in problems] == [
        f"change stream {STREAM} does not watch the signal table public.debezium_signal",
        f"change stream {STREAM} does not watch public.items",
    ]

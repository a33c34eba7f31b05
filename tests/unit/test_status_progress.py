"""What ``status`` and ``run`` show of a snapshot's progress: rows read of the database's
estimate, rate and time remaining (status.py, progress.py, the CLI's ``status --watch``)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from rich.progress import Progress
from rich.text import Text

from signals.names import TableId
from snapshotter.app import cli
from snapshotter.app.cli import reports
from snapshotter.app.cli.common import Session
from snapshotter.app.progress import MarkColumn, RunBoard, StateBarColumn, bar_fields, summary_lines
from snapshotter.app.status import (
    LEGEND,
    count_text,
    progress_text,
    render_status,
    short_id,
    size_text,
    status_report,
    took_text,
)
from snapshotter.config import Config, parse_config
from snapshotter.core.state import EngineState, SnapshotStatus, TableProgress

START = 1_700_000_000_000  # 2023-11-14T22:13:20Z


def progress(
    name: str, read: int, estimate: int | None, condition: str | None = None
) -> TableProgress:
    p = TableProgress(
        table=TableId("public", name), signal_id="s", key_columns=["id"], filter=condition
    )
    p.start((10_000,))
    p.rows_read, p.rows_emitted, p.chunk_id = read, read - 1, 3
    p.estimated_rows, p.started_ms = estimate, START
    return p


def state(*snapshots: TableProgress) -> EngineState:
    s = EngineState()
    s.snapshots = list(snapshots)
    return s


def test_the_report_carries_rows_read_estimate_rate_and_eta() -> None:
    report = status_report(state(progress("orders", 42_000, 100_000)), None, now_ms=START + 60_000)
    (row,) = report["snapshots"]
    assert row["rows"] == 41_999 and row["rows_read"] == 42_000
    assert row["estimated_rows"] == 100_000 and row["estimate_upper_bound"] is False
    assert row["percent"] == 42.0 and row["rows_per_s"] == 700.0
    assert row["eta_s"] == round(58_000 / 700)
    assert row["started_at"] == "2023-11-14T22:13:20+00:00"
    assert json.loads(json.dumps(report)) == report


def test_unknowns_are_null_and_a_filter_marks_an_upper_bound() -> None:
    pending = TableProgress(table=TableId("public", "later"), signal_id="s")
    filtered = progress("eu", 1_000, 10_000, condition="region = 'eu'")
    report = status_report(state(pending, filtered), None, now_ms=START + 10_000)
    first, second = report["snapshots"]
    assert (first["estimated_rows"], first["percent"], first["rows_per_s"]) == (None, None, None)
    assert (first["eta_s"], first["started_at"]) == (None, None)
    assert second["estimate_upper_bound"] is True and second["eta_s"] == 90


def rendered(report: dict[str, Any], width: int = 80, verbose: bool = False) -> str:
    console = Console(record=True, width=width, file=open("/dev/null", "w"))  # noqa: SIM115
    for part in render_status(report, "/var/lib/snapshotter/state.json", verbose=verbose):
        console.print(part)
    return console.export_text()


def test_the_status_table_shows_progress_rate_and_eta() -> None:
    snapshots = state(
        progress("orders", 42_000, 100_000),
        progress("eu", 1_000, 10_000, condition="x"),
        progress("fresh", 10, None),
    )
    report = status_report(snapshots, None, now_ms=START + 60_000)
    text = rendered(report)
    assert "42.0k / 100k  42%" in text and "700/s" in text and "1m23s" in text
    assert "1000 / ≤10.0k  ≥10%" in text and "≤9m00s" in text
    assert "10 / ?" in text
    assert "read / estimated" in text and LEGEND in text


def test_progress_text_of_a_done_snapshot_without_an_estimate() -> None:
    row = {"rows_read": 7, "estimated_rows": None, "state": "done"}
    assert progress_text(row) == "7  100%"


def test_counts_sizes_and_ids_are_short() -> None:
    assert [count_text(n) for n in (0, 9_999, 10_000, 42_000, 99_949, 99_950, 999_499)] == [
        "0",
        "9999",
        "10.0k",
        "42.0k",
        "99.9k",
        "100k",
        "999k",
    ]
    assert [count_text(n) for n in (999_500, 1_234_567, 10**20)] == ["1.0M", "1.2M", "100000P"]
    assert [size_text(n) for n in (0, 1023, 1024, 38_144, 10_200, 5 * 2**30)] == [
        "0 B",
        "1023 B",
        "1.0 KiB",
        "37 KiB",
        "10 KiB",
        "5.0 GiB",
    ]
    assert short_id("ad-hoc-1") == "ad-hoc-1" and short_id("0123456789") == "0123456789"
    assert short_id("3f2a1b7c-5d6e-4f80-9a1b-2c3d4e5f9c1d") == "3f2a1…9c1d"


def test_the_report_has_duration_end_and_filter() -> None:
    running = progress("orders", 42_000, 100_000, condition="region = 'eu'")
    done = progress("orders", 10, 10)
    done.chunk_done(last_key=(10_000,), selected=0, emitted=0, chunk_size=5)
    done.finished_ms = START + 90_000
    old = progress("orders", 10, 10)  # finished in a state from before end times
    old.chunk_done(last_key=(10_000,), selected=0, emitted=0, chunk_size=5)
    report = status_report(state(running, done, old), None, now_ms=START + 60_000)
    first, second, third = report["snapshots"]
    assert (first["duration_s"], first["finished_at"]) == (60, None)
    assert first["filter"] == "region = 'eu'"
    assert (second["duration_s"], second["finished_at"]) == (90, "2023-11-14T22:14:50+00:00")
    assert third["duration_s"] is None
    assert took_text(first) == "1m00s" and took_text(third) == "?"


# --- status at 80 columns ---------------------------------------------------------------------

LONG_ERROR = (
    "the table's columns changed while its snapshot ran (added: discount_code, loyalty_tier; "
    "removed: legacy_flag); chunk rows would no longer match the log's. Send execute-snapshot "
    "again to snapshot it with its new columns"
)
TABLES = (
    "public.orders",
    "inventory.customer_order_line_items_archive_2023",
    "public.big",
    "public.eu_customers",
)


def busy_state(*, paused: bool) -> EngineState:
    """Several tables: two finished snapshots of one, a failed one with a long error, a
    running (or paused) one, a filtered one."""

    def snapshot(
        table: str,
        signal: str,
        read: int,
        estimate: int,
        started: int,
        condition: str | None = None,
    ) -> TableProgress:
        schema, name = table.split(".")
        p = TableProgress(
            table=TableId(schema, name), signal_id=signal, key_columns=["id"], filter=condition
        )
        p.start((10_000_000,))
        p.rows_read, p.rows_emitted, p.chunk_id = read, read, 7
        p.estimated_rows, p.started_ms = estimate, started
        return p

    day = 86_400_000
    first = snapshot(TABLES[0], "ad-hoc-1", 1_200_000, 1_180_000, START - day)
    second = snapshot(TABLES[0], "ad-hoc-2", 1_210_000, 1_200_000, START - 3_600_000)
    for done, took in ((first, 754_000), (second, 812_000)):
        done.chunk_done(last_key=(10_000_000,), selected=0, emitted=0, chunk_size=5)
        done.finished_ms = done.started_ms + took  # type: ignore[operator]
    failed = snapshot(TABLES[1], "3f2a1b7c-5d6e-4f80-9a1b-2c3d4e5f9c1d", 0, 52_000, START - 600_000)
    failed.fail(LONG_ERROR * 2)
    failed.finished_ms = START - 597_000
    big = snapshot(TABLES[2], "8c41e2d0-aaaa-bbbb-cccc-0123456789ab", 42_000, 100_000, START)
    eu = snapshot(TABLES[3], "ad-hoc-3", 1_000, 10_000, START, condition="region = 'eu'")
    s = state(first, second, failed, big, eu)
    if paused:
        s.pause()
    s.stream.resume = {"lsn": 0x16B3748}
    return s


@pytest.mark.parametrize("paused", [False, True])
@pytest.mark.parametrize("verbose", [False, True])
def test_status_fits_80_columns_and_no_cell_wraps(paused: bool, verbose: bool) -> None:
    report = status_report(busy_state(paused=paused), 38_144, now_ms=START + 60_000)
    text = rendered(report, 80, verbose)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, text
    for table in TABLES:  # each name whole on a line of its own
        assert table in lines, text
    header = next(line for line in lines if line.startswith("  state "))
    assert " ".join(header.split()) == "state signal started UTC took read / estimated rate eta"
    after = lines[lines.index(header) :]
    rows = [line.split() for line in after if line.startswith("  ") and line[2] != " "]
    states = [row[0] for row in rows[1:]]  # every cell on its row: nothing wrapped
    assert states == ["done", "done", "failed", *(["paused"] * 2 if paused else ["running"] * 2)]
    # Two snapshots of one table: told apart by signal, start and duration.
    assert rows[1][1:5] == ["ad-hoc-1", "11-13", "22:13", "12m34s"]
    assert rows[2][1:5] == ["ad-hoc-2", "11-14", "21:13", "13m32s"]
    assert rows[3][:6] == ["failed", "3f2a1…9c1d", "11-14", "22:03", "3s", "0"]
    # The error under its row, not in the table; cut short unless verbose.
    assert "    error: the table's columns changed" in text
    assert ("more characters: status -v" in text) is not verbose
    assert LEGEND in lines
    assert ("paused: the snapshots wait for a resume-snapshot signal" in text) is paused
    assert "stream: restarts from LSN 0/16B3748" in lines
    assert "lag: 37 KiB of log written after that point, not yet confirmed" in lines
    if verbose:
        assert "    signal 3f2a1b7c-5d6e-4f80-9a1b-2c3d4e5f9c1d" in lines
        assert "    filter: region = 'eu'" in lines


def test_the_rate_is_left_out_before_a_row_would_wrap() -> None:
    report = status_report(busy_state(paused=False), None, now_ms=START + 60_000)
    assert "rate" in rendered(report, 80)
    narrow = rendered(report, 72)
    assert "rate" not in narrow and "700/s" not in narrow and "1m23s" in narrow
    assert max(len(line) for line in narrow.splitlines()) <= 72


def test_the_run_bar_has_a_total_only_when_the_estimate_is_usable() -> None:
    assert bar_fields(progress("a", 5, 10))[:2] == (5, 10)
    assert bar_fields(progress("a", 5, None))[:2] == (5, None)  # unknown: a pulsing bar
    assert bar_fields(progress("a", 5, 10, condition="x"))[:2] == (5, None)  # an upper bound
    assert bar_fields(progress("a", 12, 10))[:2] == (12, None)  # passed: stale
    done = progress("a", 12, 10)
    done.chunk_done(last_key=(10_000,), selected=0, emitted=0, chunk_size=5)
    completed, total, fields = bar_fields(done)
    assert completed == total == 12 and fields["state"] == "done"
    assert bar_fields(progress("a", 5, 10, condition="x"))[2]["rows"] == "5 / <=10 rows read"


def finished(name: str, signal: str, status: SnapshotStatus, at_ms: int | None) -> TableProgress:
    p = progress(name, 10, 100)
    p.signal_id = signal
    if status is SnapshotStatus.DONE:
        p.chunk_done(last_key=(10_000,), selected=0, emitted=0, chunk_size=5)
    elif status is SnapshotStatus.FAILED:
        p.fail("the source went away")
    else:
        p.stop()
    p.finished_ms = at_ms
    return p


RUN_BEGAN = START + 3_600_000


def earlier_and_this_run() -> EngineState:
    return state(
        finished("old", "a", SnapshotStatus.DONE, START),  # an earlier run's
        finished("older", "b", SnapshotStatus.DONE, None),  # from before end times
        finished("old", "c", SnapshotStatus.FAILED, START + 5),
        progress("resumed", 5, 100),  # unfinished: this run goes on with it
        finished("now", "d", SnapshotStatus.DONE, RUN_BEGAN + 10),
        finished("broken", "e", SnapshotStatus.FAILED, RUN_BEGAN + 20),
    )


def test_the_run_shows_only_its_own_snapshots_and_no_bar_for_a_failed_one() -> None:
    console = Console(record=True, width=200, file=open("/dev/null", "w"))  # noqa: SIM115
    bar = StateBarColumn()
    board = RunBoard(Progress(MarkColumn(), bar, console=console), RUN_BEGAN)
    board.update(earlier_and_this_run())
    tasks = {t.description: t for t in board.progress.tasks}
    assert list(tasks) == ["public.resumed", "public.now", "public.broken"]
    broken = tasks["public.broken"]
    assert broken.stop_time is not None  # its time stopped
    assert bar.render(broken) == Text("failed", style="red")  # not a pulsing bar
    assert MarkColumn().render(broken) == Text("✗", style="red")
    assert not isinstance(bar.render(tasks["public.resumed"]), Text)  # a bar
    stopped_at = broken.stop_time
    board.update(earlier_and_this_run())
    assert broken.stop_time == stopped_at  # stopped once, not again at each update


def test_the_end_of_run_summary_is_this_runs() -> None:
    lines = summary_lines(earlier_and_this_run().snapshots, RUN_BEGAN)
    assert lines == [
        "public.resumed (signal s): running, 4 rows, 3 chunks",
        "public.now (signal d): done, 9 rows, 4 chunks, took 1h00m",
        "public.broken (signal e): failed, 9 rows, 3 chunks, took 1h00m",
        "  error: the source went away",
    ]


# --- status --watch ---------------------------------------------------------------------------


def config(tmp_path: Path) -> Config:
    text = f"""
[source]
kind = "postgres"
url = "postgresql://u:p@h:5432/db"
tables = ["public.*"]
[state]
dir = "{tmp_path / "state"}"
"""
    return parse_config(text, environ={})


@pytest.fixture
def watched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """status --watch against a fixed report, ended by a Ctrl-C at its third wait; the
    waits it asked for."""
    report = status_report(state(progress("orders", 42_000, 100_000)), None, now_ms=START + 1)

    def fixed(config: Config, args: argparse.Namespace) -> dict[str, Any]:
        return report

    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(Session, "load_config", lambda session, path: config(tmp_path))
    monkeypatch.setattr(reports, "_status_report", fixed)
    monkeypatch.setattr(time, "sleep", sleep)
    return waits


def test_watch_prints_again_until_ctrl_c(watched: list[float], capsys: Any) -> None:
    assert cli.main(["status", "-c", "x.toml", "--watch"]) == 0  # Ctrl-C ends it: exit 0
    out = capsys.readouterr().out
    assert watched == [2.0, 2.0, 2.0]  # the default interval
    assert out.count("42.0k / 100k  42%") == 3  # not a terminal: appended


def test_watch_json_is_one_document_a_line(watched: list[float], capsys: Any) -> None:
    assert cli.main(["status", "-c", "x.toml", "--json", "--watch", "0.5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert watched == [0.5, 0.5, 0.5] and len(lines) == 3
    assert json.loads(lines[0])["snapshots"][0]["estimated_rows"] == 100_000


def test_watch_on_a_terminal_updates_in_place(
    watched: list[float], capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reports, "out", Console(force_terminal=True, file=open("/dev/null", "w")))  # noqa: SIM115
    monkeypatch.setenv("COLUMNS", "250")  # pytest's stdout is no terminal: 80 columns
    assert cli.main(["status", "-c", "x.toml", "--watch", "1"]) == 0
    # Updated in place: the last view once, where a console that is no terminal gets three.
    assert capsys.readouterr().out.count("42.0k / 100k  42%") == 1


def test_status_prints_the_state_path_resolved_and_details_with_verbose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    report = status_report(busy_state(paused=False), None, now_ms=START + 60_000)
    roundabout = parse_config(
        f"""
[source]
kind = "postgres"
url = "postgresql://u:p@h:5432/db"
tables = ["public.*"]
[state]
dir = "{tmp_path / "scripts" / ".." / ".demo" / "state"}"
""",
        environ={},
    )
    monkeypatch.setattr(Session, "load_config", lambda session, path: roundabout)
    monkeypatch.setattr(reports, "_read_status", lambda config, args, **_: (report, None))
    assert cli.main(["status", "-c", "x.toml"]) == 0
    out = capsys.readouterr().out
    assert f"state file: {tmp_path.resolve() / '.demo' / 'state' / 'state.json'}" in out
    assert ".." not in out and "3f2a1…9c1d" in out and "3f2a1b7c-5d6e" not in out
    assert cli.main(["status", "-c", "x.toml", "-v"]) == 0
    assert "signal 3f2a1b7c-5d6e-4f80-9a1b-2c3d4e5f9c1d" in capsys.readouterr().out


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf", "1e308", "86401", "soon"])
def test_watch_wants_a_sensible_interval(bad: str, capsys: Any) -> None:
    """Refused by argparse (exit 2, one line naming the option), never an OverflowError
    from time.sleep (1e308 is finite)."""
    with pytest.raises(SystemExit) as info:
        cli.build_parser().parse_args(["status", "-c", "x.toml", "--watch", bad])
    assert info.value.code == 2
    assert "argument --watch: not a number of seconds from 0.1 to 86400" in capsys.readouterr().err
    assert cli.build_parser().parse_args(["status", "-c", "x", "--watch", "86400"]).watch == 86400

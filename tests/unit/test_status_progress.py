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

from signals.names import TableId
from snapshotter.app import cli
from snapshotter.app.cli import reports
from snapshotter.app.cli.common import Session
from snapshotter.app.progress import bar_fields
from snapshotter.app.status import progress_text, render_status, status_report
from snapshotter.config import Config, parse_config
from snapshotter.core.state import EngineState, TableProgress

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


def test_the_status_table_shows_progress_rate_and_eta() -> None:
    snapshots = state(
        progress("orders", 42_000, 100_000),
        progress("eu", 1_000, 10_000, condition="x"),
        progress("fresh", 10, None),
    )
    report = status_report(snapshots, None, now_ms=START + 60_000)
    console = Console(record=True, width=250, file=open("/dev/null", "w"))  # noqa: SIM115
    for part in render_status(report, "snapshots"):
        console.print(part)
    text = console.export_text()
    assert "42000 / 100000 (42.0%)" in text and "700/s" in text and "1m23s" in text
    assert "1000 / <= 10000 (>= 10.0%)" in text and "<= 9m00s" in text
    assert "10 / ?" in text
    assert "read / estimated" in text


def test_progress_text_of_a_done_snapshot_without_an_estimate() -> None:
    row = {"rows_read": 7, "estimated_rows": None, "state": "done"}
    assert progress_text(row) == "7 (100.0%)"


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
    assert out.count("42000 / 100000 (42.0%)") == 3  # not a terminal: appended


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
    assert capsys.readouterr().out.count("42000 / 100000 (42.0%)") == 1


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf", "1e308", "86401", "soon"])
def test_watch_wants_a_sensible_interval(bad: str, capsys: Any) -> None:
    """Refused by argparse (exit 2, one line naming the option), never an OverflowError
    from time.sleep (1e308 is finite)."""
    with pytest.raises(SystemExit) as info:
        cli.build_parser().parse_args(["status", "-c", "x.toml", "--watch", bad])
    assert info.value.code == 2
    assert "argument --watch: not a number of seconds from 0.1 to 86400" in capsys.readouterr().err
    assert cli.build_parser().parse_args(["status", "-c", "x", "--watch", "86400"]).watch == 86400

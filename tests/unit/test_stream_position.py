"""Stream-position health, the pure part: when a saved slot or binlog position is gone, what
the error and the status warnings say, and what reset-stream does to the state."""

from __future__ import annotations

import argparse
import shlex
from typing import Any

import pytest

from signals.names import TableId
from snapshotter.app.cli import build_parser
from snapshotter.app.cli.common import CliError, Session
from snapshotter.app.cli.setup import confirm
from snapshotter.app.status import status_report
from snapshotter.app.stream_position import reset_state, tables_to_snapshot
from snapshotter.config import parse_config
from snapshotter.core.position import Position
from snapshotter.core.state import (
    EngineState,
    SnapshotStatus,
    StateError,
    StreamState,
    TableProgress,
)
from snapshotter.sources.connector import saved_position_text
from snapshotter.sources.mysql import positions as binlog_positions
from snapshotter.sources.mysql.positions import binlog_backlog, binlog_problem, binlog_warnings
from snapshotter.sources.mysql.setup import BinlogRetention
from snapshotter.sources.positions import (
    LostPosition,
    StreamPositionLost,
    execute_snapshot_command,
    lost_message,
    size_text,
)
from snapshotter.sources.postgres import positions as slot_positions
from snapshotter.sources.postgres.positions import slot_problem, slot_warnings
from snapshotter.sources.postgres.setup import SlotFacts, lsn_text, lsn_value

MB = 1024 * 1024
SAVED = lsn_value("1/2000")


def slot(**kwargs: Any) -> SlotFacts:
    kwargs.setdefault("confirmed_flush_lsn", SAVED)
    kwargs.setdefault("restart_lsn", SAVED - 100)
    kwargs.setdefault("wal_status", "reserved")
    return SlotFacts(name="s", **kwargs)


# --- LSNs and catalog rows -------------------------------------------------------------------


def test_lsns_read_and_write_as_postgresql_does() -> None:
    assert lsn_value("16/B374D848") == (0x16 << 32) | 0xB374D848
    assert lsn_text(lsn_value("16/B374D848")) == "16/B374D848"
    assert lsn_text(0) == "0/0"


def test_slot_facts_from_a_catalog_row_of_any_version() -> None:
    row = {
        "slot_name": "s",
        "slot_type": "logical",
        "plugin": "pgoutput",
        "active": True,
        "active_pid": 4242,
        "wal_status": "extended",
        "restart_lsn": "0/6B915CB8",
        "confirmed_flush_lsn": "0/6B917740",
        "safe_wal_size": None,
    }
    facts = SlotFacts.from_catalog(row, retained=123, keep="10GB")
    assert facts.active and facts.active_pid == 4242
    assert facts.confirmed_flush_lsn == lsn_value("0/6B917740")
    assert facts.retained_bytes == 123 and facts.max_slot_wal_keep_size == "10GB"
    assert not facts.invalidated
    # PostgreSQL 17 names the reason; 16 flags recovery conflicts; 12 has no wal_status.
    assert SlotFacts.from_catalog({**row, "invalidation_reason": "rows_removed"}).invalidated
    assert SlotFacts.from_catalog({**row, "conflicting": True}).invalidated
    assert not SlotFacts.from_catalog({**row, "wal_status": None}).invalidated
    lost = SlotFacts.from_catalog({**row, "wal_status": "lost", "restart_lsn": None})
    assert lost.invalidated and lost.restart_lsn is None


# --- is the saved position still there? ------------------------------------------------------


def test_a_missing_slot_is_lost() -> None:
    problem = slot_problem("s", None, SAVED)
    assert problem is not None and "'s' does not exist" in problem and "dropped" in problem


def test_an_invalidated_slot_is_lost_with_its_reason() -> None:
    problem = slot_problem("s", slot(wal_status="lost", max_slot_wal_keep_size="1GB"), SAVED)
    assert problem is not None
    assert "invalidated (wal_status = lost)" in problem
    assert "max_slot_wal_keep_size = 1GB" in problem
    other = slot_problem("s", slot(wal_status="lost", invalidation_reason="rows_removed"), SAVED)
    assert other is not None and "invalidation_reason = rows_removed" in other


def test_a_slot_that_starts_after_the_saved_position_is_lost() -> None:
    ahead = slot(confirmed_flush_lsn=SAVED + 1)
    problem = slot_problem("s", ahead, SAVED)
    assert problem is not None
    assert lsn_text(SAVED + 1) in problem
    assert "created again" in problem and "skipping" in problem


@pytest.mark.parametrize("confirmed", [SAVED, SAVED - 4096, None])
def test_a_slot_at_or_before_the_saved_position_is_fine(confirmed: int | None) -> None:
    # The engine confirms only what state saved; a confirmation lost in a crash leaves the
    # slot behind, and the engine skips what it replays.
    assert slot_problem("s", slot(confirmed_flush_lsn=confirmed), SAVED) is None
    assert slot_problem("s", slot(wal_status="unreserved"), SAVED) is None


LOGS = [("binlog.000005", 1000), ("binlog.000006", 2000), ("binlog.000007", 300)]


def test_a_purged_binlog_file_is_lost() -> None:
    problem = binlog_problem("binlog.000004", 4, LOGS)
    assert problem is not None
    assert "binlog.000004 is no longer on the server" in problem
    assert "binlog.000005 to binlog.000007" in problem
    assert "purged" in problem and "binlog_expire_logs_seconds" in problem
    assert "RESET MASTER" in problem
    assert binlog_problem("binlog.000004", 4, []) is not None


def test_an_offset_past_the_end_of_a_finished_file_means_a_reset_log() -> None:
    problem = binlog_problem("binlog.000005", 1001, LOGS)
    assert problem is not None and "RESET MASTER" in problem
    assert binlog_problem("binlog.000005", 1000, LOGS) is None
    # The current file grows: its reported size is never trusted to refuse a position.
    assert binlog_problem("binlog.000007", 5000, LOGS) is None


def test_binlog_backlog_sums_the_files_after_the_position() -> None:
    assert binlog_backlog("binlog.000005", 400, LOGS) == 600 + 2000 + 300
    assert binlog_backlog("binlog.000007", 300, LOGS) == 0
    assert binlog_backlog("binlog.000007", 900, LOGS) == 0
    assert binlog_backlog("binlog.000001", 4, LOGS) is None


def test_saved_positions_read_as_people_read_them() -> None:
    assert saved_position_text({"lsn": SAVED}) == "LSN 1/2000"
    assert (
        saved_position_text({"file": "binlog.000003", "pos": 77})
        == "binlog file binlog.000003 at 77"
    )
    assert saved_position_text({}) == "no saved position"
    assert slot_positions.has_saved_position({"lsn": SAVED})
    assert not slot_positions.has_saved_position({})
    assert not slot_positions.has_saved_position({"lsn": 0})
    assert binlog_positions.has_saved_position({"file": "b.000001", "pos": 4})
    assert not binlog_positions.has_saved_position({})


# --- the error ---------------------------------------------------------------------------------


def test_the_lost_position_error_says_what_is_gone_and_the_way_out() -> None:
    lost = LostPosition(
        "replication slot 's' does not exist", "LSN 1/2000", ("public.a", "sales.*")
    )
    message = lost_message(lost, "my conf.toml")
    first, *rest = message.splitlines()
    assert first == "replication slot 's' does not exist"
    assert "resumes from LSN 1/2000" in message
    assert "cannot be read any more" in message
    assert "missing changes of: public.a, sales.*" in message
    assert "snapshotter reset-stream -c 'my conf.toml'" in message
    assert "snapshotter signal -c 'my conf.toml' execute-snapshot public.a 'sales.*'" in message
    # The command lines run as printed.
    command = next(line for line in rest if "execute-snapshot" in line).strip()
    assert shlex.split(command)[-2:] == ["public.a", "sales.*"]


def test_the_error_names_the_config_once_it_is_known() -> None:
    error = StreamPositionLost(LostPosition("gone", "LSN 0/10"))
    assert "-c CONF" in str(error) and "every captured table" in str(error)
    assert "execute-snapshot TABLE..." in str(error)
    named = error.for_config("/etc/s.toml", ["public.t"])
    assert "-c /etc/s.toml" in str(named) and "execute-snapshot public.t" in str(named)
    assert named.lost.what == "gone"
    assert isinstance(named, ValueError)  # a StateError: the CLI prints it as an error


def test_tables_to_snapshot_again_are_the_captured_and_the_unfinished_ones() -> None:
    state = EngineState()
    done = TableProgress(table=TableId("public", "a"), signal_id="1", status=SnapshotStatus.DONE)
    other = TableProgress(table=TableId("other", "b"), signal_id="2")
    state.snapshots = [done, other]
    assert tables_to_snapshot(["public.a", "public.c"], state) == [
        "public.a",
        "public.c",
        "other.b",
    ]
    assert execute_snapshot_command("c.toml", []) == (
        "snapshotter signal -c c.toml execute-snapshot TABLE..."
    )


# --- status warnings -------------------------------------------------------------------------


def test_status_warns_of_a_missing_slot() -> None:
    (saved,) = slot_warnings("s", None, {"lsn": SAVED}, 1024, "c.toml")
    assert "does not exist" in saved and "LSN 1/2000" in saved
    assert "snapshotter reset-stream -c c.toml" in saved
    (fresh,) = slot_warnings("s", None, {}, 1024, "c.toml")
    assert "snapshotter init -c c.toml" in fresh


def test_status_warns_of_a_lost_or_ahead_slot() -> None:
    (lost,) = slot_warnings("s", slot(wal_status="lost"), {"lsn": SAVED}, 1024)
    assert "invalidated" in lost and "reset-stream" in lost and "refuse" in lost
    (ahead,) = slot_warnings("s", slot(confirmed_flush_lsn=SAVED + 8), {"lsn": SAVED}, 1024)
    assert "after the state's position" in ahead
    # Lost before the engine ever saved a position: still worth saying.
    (unsaved,) = slot_warnings("s", slot(wal_status="lost"), {}, 1024)
    assert "invalidated" in unsaved


def test_status_warns_of_an_unreserved_slot() -> None:
    (warning,) = slot_warnings(
        "s", slot(wal_status="unreserved", max_slot_wal_keep_size="1GB"), {"lsn": SAVED}, 1024
    )
    assert "wal_status = unreserved" in warning and "max_slot_wal_keep_size = 1GB" in warning
    assert "snapshotter run" in warning


def test_status_warns_of_retained_wal_past_the_threshold() -> None:
    big = slot(retained_bytes=3 * MB)
    assert slot_warnings("s", big, {"lsn": SAVED}, 3) == []
    (warning,) = slot_warnings("s", big, {"lsn": SAVED}, 2, "c.toml")
    assert "holds 3.0 MB of WAL" in warning and "source.backlog_warn_mb = 2" in warning
    assert "max_slot_wal_keep_size = -1" in warning and "disk can fill up" in warning
    assert "engine is not running" in warning
    assert "snapshotter run -c c.toml" in warning and "snapshotter teardown -c c.toml" in warning
    held = slot(retained_bytes=3 * MB, unconfirmed_bytes=100)
    (warning,) = slot_warnings("s", held, {"lsn": SAVED}, 2)
    assert "confirmed all but 100 bytes" in warning and "xact_start" in warning
    bounded = slot(retained_bytes=3 * MB, max_slot_wal_keep_size="10GB", active=True)
    (warning,) = slot_warnings("s", bounded, {"lsn": SAVED}, 0)
    assert "past max_slot_wal_keep_size = 10GB" in warning and "position is lost" in warning
    assert "streaming from it but behind" in warning


RETAIN_2D = BinlogRetention(172_800, "binlog_expire_logs_seconds = 172800")


def test_status_warns_of_binlog_backlog_with_the_retention_deadline() -> None:
    resume = {"file": "binlog.000005", "pos": 4}
    logs = [("binlog.000005", 2 * MB), ("binlog.000006", MB)]
    assert binlog_warnings(resume, logs, RETAIN_2D, 3) == []
    (warning,) = binlog_warnings(resume, logs, RETAIN_2D, 2, "c.toml")
    assert "3.0 MB of binlog after the saved position (binlog.000005 at 4)" in warning
    assert "source.backlog_warn_mb = 2" in warning
    assert "purges binlogs after 2 days (binlog_expire_logs_seconds = 172800)" in warning
    assert "position is lost" in warning and "snapshotter run -c c.toml" in warning
    never = BinlogRetention(0, "binlog_expire_logs_seconds = 0")
    (warning,) = binlog_warnings(resume, logs, never, 0)
    assert "never purges binlogs by itself" in warning


def test_status_warns_of_a_purged_binlog_file() -> None:
    (warning,) = binlog_warnings({"file": "binlog.000001", "pos": 4}, LOGS, RETAIN_2D, 1024)
    assert "no longer on the server" in warning and "reset-stream" in warning
    assert binlog_warnings({}, LOGS, RETAIN_2D, 0) == []


def test_retention_reads_as_a_duration() -> None:
    assert str(RETAIN_2D) == (
        "the server purges binlogs after 2 days (binlog_expire_logs_seconds = 172800)"
    )
    assert "reports no binlog retention" in str(BinlogRetention(None, "none"))


def test_the_status_report_carries_the_warnings() -> None:
    report = status_report(EngineState(), None, ["slot gone"])
    assert report["warnings"] == ["slot gone"]
    assert status_report(EngineState(), None)["warnings"] == []


def test_sizes_read_well() -> None:
    assert size_text(512) == "512 bytes"
    assert size_text(1536 * 1024) == "1.5 MB"


# --- reset-stream's state change -------------------------------------------------------------


def test_reset_state_stops_unfinished_snapshots_and_keeps_the_rest() -> None:
    old = Position(0x100, 3)
    state = EngineState(stream=StreamState(position=old.token, resume={"lsn": 0x100}))
    done = TableProgress(table=TableId("public", "a"), signal_id="1", status=SnapshotStatus.DONE)
    running = TableProgress(table=TableId("public", "b"), signal_id="2", key_columns=["id"])
    running.start((10,))
    pending = TableProgress(table=TableId("public", "c"), signal_id="3")
    state.snapshots = [done, running, pending]
    state.sink = {"offset": 1234}
    state.processed_signals = {"old": old.token, "future": Position(0x900, 0).token}
    new = Position(0x500)
    stopped = reset_state(state, {"lsn": 0x500}, new, "stopped by reset-stream")
    assert stopped == ["public.b", "public.c"]
    assert [p.status for p in state.snapshots] == [SnapshotStatus.DONE] + [
        SnapshotStatus.STOPPED
    ] * 2
    assert state.snapshots[1].error == "stopped by reset-stream" and done.error is None
    assert done.finished_ms is None and state.snapshots[1].finished_ms is not None  # stopped now
    assert state.stream.resume == {"lsn": 0x500} and state.stream.position == new.token
    assert state.sink == {"offset": 1234}
    # A signal recorded past the new start (a log reset numbers positions anew) would hide
    # a new signal of the same id: dropped; older ones stay.
    assert state.processed_signals == {"old": old.token}
    assert EngineState.from_json(state.to_json()) == state


def test_reset_state_refuses_a_log_whose_positions_start_over_below_the_saved_one() -> None:
    # RESET MASTER numbers binlog files from 1 again; a restored database's WAL can be behind:
    # the output's higher positions would win over every new event.
    saved = Position(12, 4000, 0)
    state = EngineState(stream=StreamState(position=saved.token, resume={"file": "b.000012"}))
    before = state.to_json()
    with pytest.raises(StateError, match="positions start over"):
        reset_state(state, {"file": "b.000001", "pos": 4}, Position(1, 4), "reset")
    assert state.to_json() == before


def test_reset_state_of_a_paused_engine_stays_consistent() -> None:
    state = EngineState()
    state.add(TableProgress(table=TableId("public", "b"), signal_id="2"))
    state.pause()
    reset_state(state, {"file": "binlog.000009", "pos": 4}, Position(9, 4), "reset")
    assert state.snapshots[0].status is SnapshotStatus.STOPPED
    assert EngineState.from_json(state.to_json()).paused


def test_the_new_start_sorts_before_every_event_streamed_from_it() -> None:
    # PostgreSQL: events are (commit LSN >= the slot's start, seq); MySQL: (file, end
    # offset > the start offset, row).
    assert Position(0x500) < Position(0x500, 0)
    assert Position(9, 4) < Position(9, 5, 0)


# --- the CLI's confirmation and commands -------------------------------------------------------


def test_without_a_terminal_only_yes_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    with pytest.raises(CliError) as refused:
        confirm(argparse.Namespace(yes=False, command="teardown"), "Drop them?")
    assert refused.value.code == 2
    assert "pass --yes" in str(refused.value) and "nothing was changed" in str(refused.value)
    confirm(argparse.Namespace(yes=True, command="teardown"), "Drop them?")


@pytest.mark.parametrize(("answer", "goes_on"), [("y", True), ("YES", True), ("", False)])
def test_on_a_terminal_the_answer_decides(
    monkeypatch: pytest.MonkeyPatch, answer: str, goes_on: bool
) -> None:
    from snapshotter.app.cli import common

    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr(common.err, "input", lambda prompt: answer)
    args = argparse.Namespace(yes=False, command="reset-stream")
    if goes_on:
        confirm(args, "Reset?")
    else:
        with pytest.raises(CliError, match="not confirmed"):
            confirm(args, "Reset?")


def test_the_commands_parse() -> None:
    parser = build_parser()
    args = parser.parse_args(["reset-stream", "-c", "c.toml", "--yes"])
    assert args.command == "reset-stream" and args.yes
    args = parser.parse_args(["teardown", "-c", "c.toml"])
    assert args.command == "teardown" and not args.yes


def test_backlog_threshold_is_configurable() -> None:
    text = '[source]\nkind = "postgres"\nurl = "postgresql://u@h/db"\n'
    assert parse_config(text, environ={}).source.backlog_warn_mb == 1024
    config = parse_config(text, environ={"SNAPSHOTTER_SOURCE_BACKLOG_WARN_MB": "0"})
    assert config.source.backlog_warn_mb == 0
    with pytest.raises(ValueError, match="backlog_warn_mb"):
        parse_config(text + "backlog_warn_mb = -1\n", environ={})


def test_run_names_the_config_and_tables_when_the_binlog_is_purged_mid_run(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The binlog reader's error for a purged file (server error 1236) carries the lost
    position as its cause; `run` prints it with the config file and the tables."""
    from snapshotter.app import runner
    from snapshotter.app.cli import run
    from snapshotter.sources.mysql.reader import BinlogReaderError

    config = tmp_path / "my.toml"
    config.write_text(
        '[source]\nkind = "mysql"\nurl = "mysql://u:p@127.0.0.1:1/shop"\n'
        'tables = ["shop.*"]\n[state]\ndir = "state"\n'
    )
    lost = StreamPositionLost(LostPosition("binlog.000003 was purged", "binlog.000003 at 4"))
    error = BinlogReaderError(str(lost))
    error.__cause__ = lost

    def failing_run(*args: Any, **kwargs: Any) -> int:
        raise error

    monkeypatch.setattr(runner, "run_engine", failing_run)
    monkeypatch.setattr(runner.StopFlag, "install", lambda self, *_: None)  # keep pytest's SIGINT
    monkeypatch.setattr(run, "_tables_to_snapshot", lambda config: ["shop.orders"])
    with pytest.raises(CliError) as raised:
        run.cmd_run(Session(), build_parser().parse_args(["run", "-c", str(config)]))
    message = str(raised.value)
    assert message.startswith("binlog.000003 was purged")
    assert f"snapshotter reset-stream -c {config}" in message
    assert f"snapshotter signal -c {config} execute-snapshot shop.orders" in message


# --- status reads the state and the position consistently ----------------------------------


class _RacingConnector:
    """A connector whose facts show a problem on its first read only (a slot moved past a
    state read before it), with the order of reads recorded."""

    log_name = "replication slot"
    errors = (OSError,)

    def __init__(self, reads: list[str], problems: list[bool]) -> None:
        self.reads = reads
        self.problems = problems

    def connect(self, timeout_s: float | None = None) -> object:
        return object()

    def dispose(self, handle: object) -> None:
        self.reads.append("disposed")

    def position_warnings(self, handle: object, saved: Any, threshold: int, conf: str) -> list[str]:
        self.reads.append("facts")
        resume = saved()
        problem = self.problems.pop(0)
        return [f"lost at {resume['lsn']}; run `snapshotter reset-stream`"] if problem else []


@pytest.mark.parametrize(
    ("problems", "warned", "states_read"),
    [
        ([True, False], [], 2),  # a race: said only if a second read finds it too
        ([True, True], ["lost at 2; run `snapshotter reset-stream`"], 2),
        ([False], [], 1),
    ],
)
def test_status_says_a_problem_only_when_a_second_read_finds_it_too(
    monkeypatch: pytest.MonkeyPatch, problems: list[bool], warned: list[str], states_read: int
) -> None:
    from snapshotter.app import stream_position

    reads: list[str] = []
    states = [EngineState(stream=StreamState(resume={"lsn": n})) for n in (1, 2)]

    def load() -> EngineState:
        reads.append("state")
        return states[reads.count("state") - 1]

    fake = _RacingConnector(reads, problems)
    monkeypatch.setattr(stream_position, "connector_for", lambda source: fake)
    config = parse_config('[source]\nkind = "postgres"\nurl = "postgresql://u:p@h/db"\n')
    health = stream_position.stream_health(config, load, "c.toml")
    assert health.warnings == warned and health.reachable
    # The report shows the state the warnings were judged against: the last one read.
    assert health.state is states[states_read - 1]
    assert reads == ["facts", "state"] * states_read + ["disposed"]


def test_status_reads_the_state_even_when_the_source_does_not_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from snapshotter.app import stream_position
    from snapshotter.sources.connector import ConnectError

    class Down(_RacingConnector):
        def connect(self, timeout_s: float | None = None) -> object:
            raise ConnectError("connection refused\nmore")

    monkeypatch.setattr(stream_position, "connector_for", lambda source: Down([], []))
    config = parse_config('[source]\nkind = "postgres"\nurl = "postgresql://u:p@h/db"\n')
    state = EngineState()
    health = stream_position.stream_health(config, lambda: state, "c.toml")
    assert not health.reachable and health.state is state
    assert health.warnings == [
        "could not check the replication slot at postgresql://u:***@h/db: connection refused"
    ]

"""The state file: atomic replace, readable JSON, clear errors, one process at a time."""

from __future__ import annotations

import json
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from signals.names import TableId
from snapshotter.core.position import Position
from snapshotter.core.state import EngineState, StateError, StreamState, TableProgress
from snapshotter.engine.state_store import StateLockedError, StateStore


def sample() -> EngineState:
    state = EngineState(
        stream=StreamState(position=Position(0x16B3748, 3).token, resume={"lsn": "0/16B3748"})
    )
    progress = TableProgress(
        table=TableId("public", "orders"), signal_id="s-1", key_columns=["region", "id"]
    )
    progress.start(("us", Decimal("10.50")))
    state.add(progress)
    state.mark_processed("s-1", Position(0x16B3700, 1))
    state.pause()
    return state


def test_missing_file_gives_a_fresh_state(tmp_path: Path) -> None:
    assert StateStore(tmp_path / "none" / "state.json").load() == EngineState()


def test_save_then_load_round_trips_and_leaves_no_temp_files(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "deep" / "state.json")
    store.save(sample())
    store.save(sample())
    assert store.load() == sample()
    assert sorted(p.name for p in store.path.parent.iterdir()) == ["state.json"]
    raw = json.loads(store.path.read_text())
    assert raw["version"] == 1
    assert raw["snapshots"][0]["max_key"][1] == {"type": "decimal", "value": "10.50"}
    assert raw["snapshots"][0]["status"] == "paused" and raw["paused"] is True
    assert raw["processed_signals"] == {"s-1": "00000000016b3700-0000000000000001"}
    assert raw["stream"] == {
        "position": "00000000016b3748-0000000000000003",
        "resume": {"lsn": "0/16B3748"},
    }


def test_a_crash_mid_write_leaves_the_old_state(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.json")
    store.save(sample())
    # What a crash between writing the temp file and the rename leaves behind.
    (tmp_path / ".state.json.abc.tmp").write_text('{"version": 1, "snap')
    assert store.load() == sample()


def test_a_corrupt_file_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("{not json")
    with pytest.raises(StateError, match=str(path)):
        StateStore(path).load()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("processed_signals", {"s-1": "not-a-token"}),
        ("processed_signals", {"s-1": "0000000000000001-0000000000000002-00000003"}),
        ("stream", {"position": "0/16B3748", "resume": {}}),
    ],
    ids=["signal-token", "signal-old-token", "stream-position"],
)
def test_a_bad_position_token_names_the_path(tmp_path: Path, field: str, value: object) -> None:
    store = StateStore(tmp_path / "state.json")
    store.save(sample())
    raw = json.loads(store.path.read_text())
    raw[field] = value
    store.path.write_text(json.dumps(raw))
    with pytest.raises(StateError, match="validate") as info:
        store.load()
    assert str(store.path) in str(info.value)


def test_a_second_process_cannot_take_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    probe = (
        "import sys; from snapshotter.engine.state_store import StateStore, StateLockedError\n"
        "try:\n    StateStore(sys.argv[1]).__enter__()\nexcept StateLockedError as e:\n"
        "    print(e); sys.exit(3)\n"
    )
    with StateStore(path):
        held = subprocess.run(
            [sys.executable, "-c", probe, str(path)], capture_output=True, text=True, check=False
        )
        assert held.returncode == 3 and "in use by another snapshotter" in held.stdout
        with pytest.raises(StateLockedError):  # nor a second store in this process
            StateStore(path).__enter__()
    free = subprocess.run([sys.executable, "-c", probe, str(path)], check=False)
    assert free.returncode == 0

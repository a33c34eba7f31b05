"""Where the engine's state lives on disk: one JSON file, replaced atomically, under a lock.

A save writes a temporary file next to the state file, fsyncs it, renames it over the old one
and fsyncs the directory, so after a crash the file holds either the old state or the new,
never half of each. An exclusive lock on ``<state>.lock`` keeps a second engine (say, a
``resume`` started while the first still runs) from sharing the state and the replication
slot.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

from snapshotter.common.atomic import write_atomically
from snapshotter.common.errors import disk_error
from snapshotter.common.faults import failpoint
from snapshotter.config import Config
from snapshotter.core.state import EngineState, StateError

STATE_FILE = "state.json"


def state_path(config: Config) -> Path:
    """The state file of ``config`` (under ``[state] dir``)."""
    return config.state.dir / STATE_FILE


class StateLockedError(StateError):
    """Another snapshotter process holds the state."""


class StateWriteError(StateError):
    """The state could not be saved (a full disk, no permission); the message names the path
    and what to do."""


class StateStore:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock_fd: int | None = None

    def load(self) -> EngineState:
        """The saved state, or a fresh one when nothing was saved yet."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return EngineState()
        except OSError as exc:
            raise StateError(f"cannot read state {self.path}: {exc.strerror}") from None
        try:
            return EngineState.from_json(text)
        except StateError as exc:
            raise StateError(f"{self.path}: {exc}") from None

    def save(self, state: EngineState) -> None:
        """Replace the state file atomically; a write that fails (a full disk) leaves the
        previous state as it was and raises ``StateWriteError`` naming the path."""
        try:
            self._save(state)
        except OSError as exc:
            raise StateWriteError(
                disk_error(exc, self.path, "the state file", "[state] dir")
            ) from exc

    def _save(self, state: EngineState) -> None:
        write_atomically(self.path, state.to_json(), lambda: failpoint("state.write"))

    def __enter__(self) -> StateStore:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StateLockedError(
                f"{self.path} is in use by another snapshotter process; stop it first"
            ) from None
        self._lock_fd = fd
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

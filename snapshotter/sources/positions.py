"""What every source's position checks share: a saved log position the server can no longer
stream from (:class:`StreamPositionLost`, whose message names the way out), where a reset
stream starts (:class:`NewStart`), and the wording of sizes and fixes.

Each source decides from its own facts whether a position is lost (``postgres.positions``:
the replication slot; ``mysql.positions``: the binlog files); ``snapshotter.app.stream_position``
ties those checks to the saved state for ``run``, ``status``, ``reset-stream`` and
``teardown``.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from snapshotter.core.position import Position
from snapshotter.core.state import StateError

CONF = "CONF"  # the config file in messages built where its path is not known
MB = 1024 * 1024


def size_text(count: int) -> str:
    if count >= MB:
        return f"{count / MB:,.1f} MB"
    return f"{count:,} bytes"


def execute_snapshot_command(config: str, tables: Sequence[str]) -> str:
    """The ``snapshotter signal ... execute-snapshot`` line for ``tables``, shell-quoted."""
    names = " ".join(shlex.quote(t) for t in tables) if tables else "TABLE..."
    return f"snapshotter signal -c {shlex.quote(config)} execute-snapshot {names}"


def to_go_on(config: str) -> str:
    """What to do once the saved position is gone (the end of a ``status`` warning)."""
    quoted = shlex.quote(config)
    return f"run `snapshotter reset-stream -c {quoted}`, then snapshot the tables again"


def name_config(text: str, config: str) -> str:
    """``text`` with the placeholder ``-c CONF`` (a message built where the config file was
    not known) naming ``config``."""
    return text.replace(f"-c {CONF}", f"-c {shlex.quote(config)}")


def gone(dropped: bool) -> str:
    """How ``teardown`` reports one object."""
    return "dropped" if dropped else "already gone"


def error_reason(exc: BaseException) -> str:
    """The first line of what the database said (the driver's error, not SQLAlchemy's)."""
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@dataclass(frozen=True, slots=True)
class LostPosition:
    """A saved position the server can no longer stream from."""

    what: str  # what is gone, and why
    saved: str  # the saved position, readable
    tables: tuple[str, ...] = ()  # the tables to snapshot again


def lost_message(lost: LostPosition, config: str = CONF) -> str:
    tables = ", ".join(lost.tables) if lost.tables else "every captured table"
    quoted = shlex.quote(config)
    return (
        f"{lost.what}\n"
        f"  The state resumes from {lost.saved}; the changes made since then cannot be read "
        f"any more, so the output may be missing changes of: {tables}.\n"
        "  To go on, stream from the current end of the log and snapshot the tables again:\n"
        f"    snapshotter reset-stream -c {quoted}\n"
        f"    {execute_snapshot_command(config, lost.tables)}\n"
        "  (or start over with a fresh state directory and snapshot the tables again). A "
        "snapshot emits the rows that exist: rows deleted in between are not deleted in the "
        "output."
    )


class StreamPositionLost(StateError):
    """The saved stream position is gone; the message says what to do."""

    def __init__(self, lost: LostPosition, config: str = CONF) -> None:
        super().__init__(lost_message(lost, config))
        self.lost = lost

    def for_config(self, config: str, tables: Sequence[str] | None = None) -> StreamPositionLost:
        """The same error naming the config file (and, if given, the tables)."""
        lost = self.lost if tables is None else replace(self.lost, tables=tuple(tables))
        return StreamPositionLost(lost, config)


@dataclass(frozen=True, slots=True)
class NewStart:
    """Where the stream starts after ``reset-stream``, and what was done to get there."""

    resume: dict[str, Any]
    position: Position
    done: list[str]

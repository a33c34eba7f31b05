"""The binlog file and offset as the stream position: whether the saved one can still be read
(a file may be purged, binary logging reset), how much binlog lies behind it for ``status``,
and where ``reset-stream`` starts (the binlog's current end). The decisions and messages are
pure functions of ``SHOW BINARY LOGS``; the functions that take an engine read it first."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from snapshotter.core.position import Position
from snapshotter.sources.base import TableError
from snapshotter.sources.mysql import setup as my_setup
from snapshotter.sources.mysql.setup import BinlogRetention
from snapshotter.sources.positions import CONF, MB, NewStart, size_text, to_go_on


def binlog_offset(file_name: str, position: int) -> int:
    """A binlog coordinate as one integer that grows with the log: the file's sequence
    number (``binlog.000042`` -> 42) in the high bits, the byte offset in the low 32."""
    return (binlog_file_number(file_name) << 32) | position


def binlog_file_number(file_name: str) -> int:
    _, _, suffix = file_name.rpartition(".")
    if not suffix.isdigit():
        raise ValueError(f"binlog file name {file_name!r} does not end in a sequence number")
    return int(suffix)


def binlog_status(conn: sa.Connection) -> tuple[str, int] | None:
    """The binlog file and position the server writes next; None when binary logging is
    off. MySQL 8.4 removed ``SHOW MASTER STATUS`` for ``SHOW BINARY LOG STATUS`` (which
    MariaDB before 10.5.2 lacks): try the new name first."""
    for statement in ("SHOW BINARY LOG STATUS", "SHOW MASTER STATUS"):
        try:
            row = conn.exec_driver_sql(statement).first()
        except sa.exc.ProgrammingError:
            continue
        if row is None:
            return None
        return str(row[0]), int(row[1])
    return None


def position_text(resume: Mapping[str, Any]) -> str | None:
    """The saved binlog position as people read it; None when ``resume`` holds none."""
    if resume.get("file"):
        return f"binlog file {resume['file']} at {resume.get('pos')}"
    return None


def has_saved_position(resume: Mapping[str, Any]) -> bool:
    """Whether state holds a binlog position to resume from (else a first run starts at the
    binlog's end)."""
    return bool(resume.get("file"))


def binlog_problem(file: str, pos: int, logs: Sequence[tuple[str, int]]) -> str | None:
    """Why the binlog cannot be read from ``file`` at ``pos``, given ``SHOW BINARY LOGS``;
    None when it can."""
    sizes = dict(logs)
    if file not in sizes:
        have = f"{logs[0][0]} to {logs[-1][0]}" if logs else "none"
        return (
            f"binlog file {file} is no longer on the server (it has {have}): it was purged "
            "(binlog_expire_logs_seconds / expire_logs_days, or PURGE BINARY LOGS), or binary "
            "logging was reset (RESET MASTER)"
        )
    # The current file grows; only a finished file's size is final.
    if file != logs[-1][0] and pos > sizes[file]:
        return (
            f"binlog file {file} has {sizes[file]} bytes, fewer than the saved offset {pos}: "
            "binary logging was reset (RESET MASTER), or this is another server"
        )
    return None


def binlog_backlog(file: str, pos: int, logs: Sequence[tuple[str, int]]) -> int | None:
    """Binlog bytes from ``file`` at ``pos`` to the end; None when the file is gone."""
    names = [name for name, _ in logs]
    if file not in names:
        return None
    index = names.index(file)
    return max(0, logs[index][1] - pos) + sum(size for _, size in logs[index + 1 :])


def binlog_warnings(
    resume: Mapping[str, Any],
    logs: Sequence[tuple[str, int]],
    retention: BinlogRetention,
    threshold_mb: int,
    config: str = CONF,
) -> list[str]:
    """What ``status`` warns about the binlog behind the saved position."""
    if not has_saved_position(resume):
        return []
    file, pos = str(resume["file"]), int(resume.get("pos", 0))
    problem = binlog_problem(file, pos, logs)
    if problem is not None:
        return [f"{problem}; `snapshotter run` will refuse to start: {to_go_on(config)}"]
    backlog = binlog_backlog(file, pos, logs)
    if backlog is None or backlog <= threshold_mb * MB:
        return []
    if retention.seconds:
        deadline = (
            f"{retention}: unless the engine reads past {file} before the server purges it, "
            "its position is lost and the tables must be snapshotted again"
        )
    else:
        deadline = f"{retention}, so the binlog keeps growing on its disk until purged by hand"
    return [
        f"{size_text(backlog)} of binlog after the saved position ({file} at {pos}) is not "
        f"read yet (more than source.backlog_warn_mb = {threshold_mb}): the engine is behind "
        f"or stopped. {deadline[0].upper()}{deadline[1:]}. Run `snapshotter run -c "
        f"{shlex.quote(config)}` to catch up"
    ]


# --- IO: the binlog files -------------------------------------------------------------------


def binary_logs(engine: sa.Engine) -> list[tuple[str, int]]:
    with engine.connect() as conn:
        return my_setup.binary_logs(conn)


def problem_now(engine: sa.Engine, resume: Mapping[str, Any]) -> str | None:
    """Why the binlog cannot be read from the saved position now; None when it can."""
    file, pos = str(resume["file"]), int(resume.get("pos", 0))
    return binlog_problem(file, pos, binary_logs(engine))


def backlog_now(engine: sa.Engine, resume: Mapping[str, Any]) -> int | None:
    """Binlog bytes after the saved position, across files; None when its file is gone."""
    pos = int(resume.get("pos", 0))
    return binlog_backlog(str(resume["file"]), pos, binary_logs(engine))


def binlog_end(engine: sa.Engine) -> dict[str, Any]:
    """The binlog's current end, as a reader's restart point (``{"file", "pos"}``);
    TableError when binary logging is off."""
    with engine.connect() as conn:
        status = binlog_status(conn)
    if status is None:
        raise TableError("binary logging is off on the source (log_bin=OFF)")
    return {"file": status[0], "pos": status[1]}


def move_to_log_end(engine: sa.Engine) -> NewStart:
    """The binlog's current end (nothing on the server changes)."""
    start = binlog_end(engine)
    file, pos = str(start["file"]), int(start["pos"])
    return NewStart(
        {"file": file, "pos": pos},
        Position(binlog_file_number(file), pos),
        [f"binlog position: the current end, {file} at {pos}"],
    )

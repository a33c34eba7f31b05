"""Replacing a small file atomically: after a crash it holds either the old text or the new,
never half of each."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_atomically(
    path: Path, text: str, before_rename: Callable[[], None] | None = None
) -> None:
    """Write ``text`` to a temporary file beside ``path``, fsync it, rename it over ``path``
    and fsync the directory. ``before_rename``: called between the fsync and the rename (a
    crash test's failpoint). OSError as the system raised it; ``path`` is then unchanged."""
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if before_rename is not None:
            before_rename()
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)

"""What the user sees while the engine runs: rich progress bars on a terminal, plain log
lines otherwise (CI logs, files, pipes)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.logging import RichHandler
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

from snapshotter.core.state import EngineState

OnProgress = Callable[[EngineState], None]


@contextmanager
def live_progress(
    *, verbose: bool = False, log_filter: logging.Filter | None = None
) -> Iterator[OnProgress | None]:
    """Progress and log lines for ``run``; ``log_filter`` (the CLI's secret masking) is put
    on the log handlers."""
    level = logging.DEBUG if verbose else logging.INFO
    root = logging.getLogger("snapshotter")
    root.setLevel(level)
    if not sys.stderr.isatty():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        if log_filter is not None:
            handler.addFilter(log_filter)
        root.addHandler(handler)
        try:
            yield None
        finally:
            root.removeHandler(handler)
        return
    console = Console(stderr=True)
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TextColumn("{task.fields[rows]} rows, {task.fields[chunks]} chunks, {task.fields[state]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
    rich_handler = RichHandler(console=console, show_path=False)
    if log_filter is not None:
        rich_handler.addFilter(log_filter)
    root.addHandler(rich_handler)
    tasks: dict[tuple[str, str], TaskID] = {}

    def update(state: EngineState) -> None:
        for p in state.snapshots:
            key = (p.signal_id, str(p.table))
            fields: dict[str, Any] = {
                "rows": p.rows_emitted,
                "chunks": p.chunk_id,
                "state": p.status.value,
            }
            if key not in tasks:
                tasks[key] = progress.add_task(str(p.table), total=None, **fields)
            progress.update(tasks[key], **fields)

    try:
        with progress:
            yield update
    finally:
        root.removeHandler(rich_handler)

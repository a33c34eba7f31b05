"""What the user sees while the engine runs: rich progress bars on a terminal, plain log
lines otherwise (CI logs, files, pipes)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.logging import RichHandler
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from snapshotter.core.eta import duration_text
from snapshotter.core.state import SnapshotStatus, TableProgress

if TYPE_CHECKING:
    from snapshotter.core.state import EngineState

OnProgress = Callable[["EngineState"], None]


class RateColumn(ProgressColumn):
    """Rows read per second, as rich measures it over the last 30 s of this run (a resumed
    snapshot's earlier rows do not count)."""

    def render(self, task: Task) -> Text:
        speed = task.speed
        return Text("" if speed is None else f"{speed:,.0f} rows/s")


class EtaColumn(ProgressColumn):
    """Time remaining at that rate: only with an estimate the rows have not passed."""

    def render(self, task: Task) -> Text:
        speed, total = task.speed, task.total
        if task.finished or not speed or total is None or task.completed >= total:
            return Text("")
        return Text(f"eta {duration_text((total - task.completed) / speed)}")


def bar_fields(p: TableProgress) -> tuple[int, int | None, dict[str, Any]]:
    """A snapshot's bar: rows read, the total (the estimate; None, a pulsing bar, when it is
    unknown, only an upper bound (a filter), or passed while it runs: no bar is better than
    a wrong one; a done snapshot's bar is full), and the text fields."""
    estimate = p.estimated_rows
    completed, total = p.rows_read, None
    if p.status is SnapshotStatus.DONE:
        completed = total = max(p.rows_read, 1)
    elif estimate and p.filter is None and p.rows_read < estimate:
        total = estimate
    bound = "<=" if p.filter is not None else "~"
    of = "?" if estimate is None else f"{bound}{estimate:,}"
    fields: dict[str, Any] = {
        "rows": f"{p.rows_read:,} / {of} rows read",
        "chunks": p.chunk_id,
        "state": p.status.value,
    }
    return completed, total, fields


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
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[rows]}, {task.fields[chunks]} chunks, {task.fields[state]}"),
        RateColumn(),
        EtaColumn(),
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
            completed, total, fields = bar_fields(p)
            if key not in tasks:
                # Rows read before this run (a resume) are where the bar starts, not speed.
                tasks[key] = progress.add_task(
                    str(p.table), total=total, completed=completed, **fields
                )
            progress.update(tasks[key], total=total, completed=completed, **fields)

    try:
        with progress:
            yield update
    finally:
        root.removeHandler(rich_handler)

"""What the user sees while the engine runs: rich progress bars on a terminal, plain log
lines otherwise (CI logs, files, pipes).

Only this run's work is shown: the snapshots that are unfinished, or finished since the run
began (``this_run``); the finished ones an earlier run left in state are ``status``'s. A
snapshot that failed or was stopped shows its state instead of a bar, and its time stops."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rich.console import Console, RenderableType
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

from signals.display import printable
from snapshotter.core.eta import duration_text
from snapshotter.core.state import SnapshotStatus, TableProgress

if TYPE_CHECKING:
    from snapshotter.core.state import EngineState

OnProgress = Callable[["EngineState"], None]


def epoch_ms() -> int:
    return time.time_ns() // 1_000_000


def this_run(p: TableProgress, since_ms: int) -> bool:
    """Whether a snapshot is a run's work: unfinished, or finished since the run began at
    ``since_ms`` (epoch ms; a snapshot finished in a state written before its end time was
    recorded is an earlier run's)."""
    if not p.status.finished:
        return True
    return p.finished_ms is not None and p.finished_ms >= since_ms


_HALTED = {"failed": ("✗", "red"), "stopped": ("■", "magenta"), "paused": ("‖", "yellow")}


class MarkColumn(SpinnerColumn):
    """A spinner while a snapshot runs; a mark once it is done, failed, stopped or paused."""

    def render(self, task: Task) -> RenderableType:
        halted = _HALTED.get(str(task.fields.get("state")))
        return super().render(task) if halted is None else Text(*halted)


class StateBarColumn(BarColumn):
    """The bar; the state, in words, of a snapshot that failed or was stopped, or that is
    paused with no total (where rich would animate a pulsing bar)."""

    def render(self, task: Task) -> RenderableType:  # type: ignore[override]
        state = str(task.fields.get("state"))
        halted = _HALTED.get(state)
        if halted is not None and (state != "paused" or task.total is None):
            return Text(state, style=halted[1])
        return super().render(task)


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


class RunBoard:
    """The run's bars: one per snapshot of this run (``this_run``), updated from state."""

    def __init__(self, progress: Progress, since_ms: int) -> None:
        self.progress = progress
        self.since_ms = since_ms
        self._tasks: dict[tuple[str, str], TaskID] = {}
        self._stopped: set[tuple[str, str]] = set()

    def update(self, state: EngineState) -> None:
        progress, tasks = self.progress, self._tasks
        for p in state.snapshots:
            key = (p.signal_id, str(p.table))
            if key not in tasks and not this_run(p, self.since_ms):
                continue  # an earlier run's
            completed, total, fields = bar_fields(p)
            if key not in tasks:
                # Rows read before this run (a resume) are where the bar starts, not speed.
                tasks[key] = progress.add_task(
                    str(p.table), total=total, completed=completed, **fields
                )
            progress.update(tasks[key], total=total, completed=completed, **fields)
            halted = p.status in (SnapshotStatus.FAILED, SnapshotStatus.STOPPED)
            if halted and key not in self._stopped:
                self._stopped.add(key)
                progress.stop_task(tasks[key])  # its elapsed time stops


def summary_lines(snapshots: Sequence[TableProgress], since_ms: int) -> list[str]:
    """What ``run`` prints when it ends: this run's snapshots (``this_run``), one line each
    (its error on a line of its own). Untrusted text is escaped (``printable``)."""
    lines = []
    for p in snapshots:
        if not this_run(p, since_ms):
            continue
        line = (
            f"{p.table} (signal {p.signal_id}): {p.status.value}, {p.rows_emitted:,} rows, "
            f"{p.chunk_id:,} chunks"
        )
        end = p.finished_ms if p.status.finished else None
        if p.started_ms is not None and end is not None:
            line += f", took {duration_text((end - p.started_ms) / 1000)}"
        lines.append(printable(line))
        if p.error:
            lines.append(f"  error: {printable(p.error)}")
    return lines


@contextmanager
def live_progress(
    *,
    verbose: bool = False,
    log_filter: logging.Filter | None = None,
    since_ms: int | None = None,
) -> Iterator[OnProgress | None]:
    """Progress and log lines for ``run``; ``log_filter`` (the CLI's secret masking) is put
    on the log handlers; ``since_ms``: when the run began (epoch ms, default now), for
    ``this_run``."""
    since = epoch_ms() if since_ms is None else since_ms
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
        MarkColumn(finished_text=Text("✓", style="green")),
        TextColumn("{task.description}"),
        StateBarColumn(),
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
    board = RunBoard(progress, since)

    try:
        with progress:
            yield board.update
    finally:
        root.removeHandler(rich_handler)

"""Progress, rate and time remaining of a table's snapshot, from what state holds: rows done,
the database's estimate of the table's rows when the snapshot started, and the start time.
Pure: the callers pass the time. An estimate from statistics can be stale, so the fraction
is capped below 1 until the snapshot is done, and the time remaining is never negative."""

from __future__ import annotations

from dataclasses import dataclass

from snapshotter.core.state import SnapshotStatus, TableProgress


@dataclass(frozen=True)
class Eta:
    rows_done: int
    rows_total: int | None  # the estimate (None: unknown)
    fraction: float | None  # 0..1 (None: no estimate)
    rows_per_s: float | None  # since the snapshot started (None: not started or too early)
    seconds_remaining: float | None  # None: unknown (no estimate or no rate yet)


def eta(progress: TableProgress, now_ms: int) -> Eta:
    done = progress.rows_read
    total = progress.estimated_rows
    finished = progress.status is SnapshotStatus.DONE
    if finished:
        return Eta(done, total if total is not None else done, 1.0, None, 0.0)
    fraction = None
    if total is not None and total > 0:
        fraction = min(done / total, 0.99)
    elif total == 0:
        fraction = 0.0
    rate = None
    if progress.started_ms is not None and now_ms > progress.started_ms and done > 0:
        rate = done / ((now_ms - progress.started_ms) / 1000)
    remaining = None
    if total is not None and rate:
        remaining = max(total - done, 0) / rate
    return Eta(done, total, fraction, rate, remaining)

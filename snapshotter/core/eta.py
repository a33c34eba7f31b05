"""Progress, rate and time remaining of a table's snapshot, from what state holds: rows done,
the database's estimate of the table's rows when the snapshot started, and the start time.
Pure: the callers pass the time.

* Rows done are the rows the chunk SELECTs returned (``rows_read``): what the estimate
  counts; rows the log dropped from a window were still read.
* An estimate from statistics can be stale or rough, so the fraction is capped below 1 until
  the snapshot is done, and once the rows read pass the estimate the time remaining is
  unknown (None), never 0 or negative. An estimate of 0 for a snapshot that runs (an empty
  table is done at its start) is stale: unknown too.
* With a filter (``additional-conditions``) the estimate is the whole table's: an upper
  bound of what the snapshot reads (``upper_bound``), so the fraction is a lower bound and
  the time remaining an upper bound.
* The rate is the average since the snapshot started, time stopped or paused included
  (state keeps no more); it needs a second of history. Only a running snapshot has a time
  remaining; a stopped or failed one has no rate either.
"""

from __future__ import annotations

from dataclasses import dataclass

from snapshotter.core.state import SnapshotStatus, TableProgress

MIN_ELAPSED_MS = 1_000  # a rate from less is noise


@dataclass(frozen=True)
class Eta:
    rows_done: int
    rows_total: int | None  # the estimate (None: unknown)
    fraction: float | None  # 0..1 (None: no usable estimate)
    rows_per_s: float | None  # since the snapshot started (None: not started or too early)
    seconds_remaining: float | None  # None: unknown (no estimate or rate, or not running)
    upper_bound: bool = False  # rows_total is the whole table's, the snapshot has a filter


def eta(progress: TableProgress, now_ms: int) -> Eta:
    done = progress.rows_read
    total = progress.estimated_rows
    upper = total is not None and progress.filter is not None
    status = progress.status
    if status is SnapshotStatus.DONE:
        return Eta(done, total if total is not None else done, 1.0, None, 0.0, upper)
    fraction = min(done / total, 0.99) if total else None
    rate = None
    started = progress.started_ms
    if (
        status in (SnapshotStatus.RUNNING, SnapshotStatus.PAUSED)
        and started is not None
        and now_ms - started >= MIN_ELAPSED_MS
        and done > 0
    ):
        rate = done / ((now_ms - started) / 1000)
    remaining = None
    if status is SnapshotStatus.RUNNING and total and rate and total > done:
        remaining = (total - done) / rate
    return Eta(done, total, fraction, rate, remaining, upper)


def duration_text(seconds: float | None) -> str:
    """A time remaining as people read it: 45s, 3m20s, 2h05m, 3d04h; "?" when unknown."""
    if seconds is None:
        return "?"
    whole = max(0, round(seconds))
    minutes, second = divmod(whole, 60)
    hours, minute = divmod(minutes, 60)
    days, hour = divmod(hours, 24)
    if days:
        return f"{days}d{hour:02d}h"
    if hours:
        return f"{hours}h{minute:02d}m"
    if minutes:
        return f"{minutes}m{second:02d}s"
    return f"{second}s"


def eta_note(progress: TableProgress, now_ms: int) -> str:
    """What a progress log line adds: ", read 45% of ~10000, 1234 rows/s, 3m20s left"
    (only the parts known; "" when none is)."""
    e = eta(progress, now_ms)
    parts = []
    if e.fraction is not None and e.rows_total is not None:
        bound = ">= " if e.upper_bound else ""
        parts.append(f"read {bound}{e.fraction:.0%} of ~{e.rows_total}")
    if e.rows_per_s is not None:
        parts.append(f"{e.rows_per_s:.0f} rows/s")
    if e.seconds_remaining is not None:
        bound = "<= " if e.upper_bound else ""
        parts.append(f"{bound}{duration_text(e.seconds_remaining)} left")
    return "".join(f", {part}" for part in parts)

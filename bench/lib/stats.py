"""Statistics and /proc readings for the benches: percentiles and medians (over interleaved
rounds), ratios, a process tree's CPU seconds and peak RSS."""

from __future__ import annotations

import math
import os
import re
import statistics
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# Cross-process marks use CLOCK_MONOTONIC (``time.monotonic``): on Linux one clock for every
# process of the machine, and unlike the wall clock it never steps.
CLK_TCK = os.sysconf("SC_CLK_TCK")


def percentile(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100); NaN for no values."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[max(1, math.ceil(q / 100.0 * len(ordered))) - 1]


def median(values: Iterable[float]) -> float:
    """The median, NaN for no values (NaN values are left out)."""
    kept = [v for v in values if not math.isnan(v)]
    return statistics.median(kept) if kept else math.nan


# --------------------------------------------------------------------------- /proc


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    name: str
    cpu_s: float  # utime + stime


def proc_stat(pid: int) -> ProcStat | None:
    """``/proc/<pid>/stat``'s parent, command name and CPU seconds; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The name is in parentheses and may hold spaces or parentheses itself.
    name = text[text.index("(") + 1 : text.rindex(")")]
    rest = text[text.rindex(")") + 2 :].split()
    return ProcStat(pid, int(rest[1]), name, (int(rest[11]) + int(rest[12])) / CLK_TCK)


def descendants(pid: int) -> list[ProcStat]:
    """Every living process below ``pid`` (children, their children...)."""
    by_parent: dict[int, list[ProcStat]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = proc_stat(int(entry))
            if stat is not None:
                by_parent.setdefault(stat.ppid, []).append(stat)
    out: list[ProcStat] = []
    todo = [pid]
    while todo:
        for child in by_parent.get(todo.pop(), []):
            out.append(child)
            todo.append(child.pid)
    return out


def vm_hwm_mb(pid: int) -> float:
    """The process's peak resident set size so far (``VmHWM``), in MB (NaN if gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return math.nan
    found = re.search(r"^VmHWM:\s+(\d+) kB", text, re.MULTILINE)
    return int(found.group(1)) / 1024 if found else math.nan


@dataclass(frozen=True)
class TreeReading:
    """CPU seconds and peak RSS of the engine process and, apart, of what runs below it
    (Spark's JVM)."""

    engine_cpu_s: float
    below_cpu_s: float
    engine_hwm_mb: float
    below_hwm_mb: float  # the largest peak below it (the JVM)


def read_tree(pid: int) -> TreeReading:
    own = proc_stat(pid)
    below = descendants(pid)
    return TreeReading(
        engine_cpu_s=own.cpu_s if own else math.nan,
        below_cpu_s=sum(p.cpu_s for p in below),
        engine_hwm_mb=vm_hwm_mb(pid),
        below_hwm_mb=max((vm_hwm_mb(p.pid) for p in below), default=0.0),
    )


# --------------------------------------------------------------------------- results


@dataclass
class Result:
    what: str
    rows: int | None  # None: not measured (note says why)
    seconds: float | None
    note: str = ""

    @property
    def rate(self) -> float | None:
        if self.rows is None or not self.seconds:
            return None
        return self.rows / self.seconds


def render_table(results: list[Result], baseline: Result, base_name: str = "plain read") -> str:
    lines = [
        f"| what | rows | seconds | rows/s | ratio to {base_name} |",
        "|---|---:|---:|---:|---:|",
    ]
    base = baseline.rate
    for r in results:
        rate = r.rate
        if rate is None:
            lines.append(f"| {r.what} | – | – | – | skipped |")
            continue
        ratio = f"{rate / base:.2f}" if base else "–"
        lines.append(f"| {r.what} | {r.rows:,} | {r.seconds:.2f} | {rate:,.0f} | {ratio} |")
    return "\n".join(lines)


def best_of(repeat: int, measure: Callable[[], Result]) -> Result:
    """The fastest of ``repeat`` runs (a skipped one is returned at once)."""
    best: Result | None = None
    for _ in range(repeat):
        result = measure()
        if result.rate is None:
            return result
        if best is None or (best.rate or 0) < result.rate:
            best = result
    assert best is not None
    return best


def log_round(number: int, lines: Mapping[str, Sequence[float]]) -> None:
    """A progress line on stderr after round ``number`` (from 0): each line's last seconds."""
    last = ", ".join(f"{k} {v[-1]:.1f} s" for k, v in lines.items())
    print(f"round {number + 1}: {last}", file=sys.stderr)

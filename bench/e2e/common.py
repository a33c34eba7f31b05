"""Small pure helpers of the end-to-end bench: statistics, /proc readings, config text."""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


# --------------------------------------------------------------------------- config text


def toml_string(text: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's, except that TOML takes no surrogate
    pairs (so no ASCII-only escaping) and wants DEL escaped."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_value(value: Any) -> str:
    """A TOML literal for a str, bool, int, float, list or (inline) table."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, Mapping):
        pairs = ", ".join(f"{toml_string(k)} = {toml_value(v)}" for k, v in value.items())
        return "{ " + pairs + " }"
    if isinstance(value, Sequence):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML literal for {value!r}")


def toml_text(sections: Mapping[str, Mapping[str, Any]]) -> str:
    lines: list[str] = []
    for name, keys in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {toml_value(value)}" for key, value in keys.items()]
        lines.append("")
    text = "\n".join(lines)
    tomllib.loads(text)  # what we write must read back
    return text


@dataclass(frozen=True)
class Setting:
    """One ``--set [SINK:]SECTION.KEY=VALUE``: a config key for every engine run, or only for
    the runs of one sink."""

    sink: str | None
    section: str
    key: str
    value: Any


def parse_setting(text: str, sinks: Sequence[str]) -> Setting:
    """``source.read_parallelism=2``, ``kafka:sink.client="confluent"``,
    ``spark:spark.conf={"spark.driver.memory" = "2g"}``. VALUE is a TOML literal; a bare
    word that is not one is taken as a string."""
    target, sep, raw = text.partition("=")
    if not sep or not raw.strip():
        raise ValueError(f"{text!r}: write [SINK:]SECTION.KEY=VALUE")
    sink: str | None = None
    if ":" in target:
        sink, target = target.split(":", 1)
        if sink not in sinks:
            raise ValueError(f"{text!r}: {sink!r} is not a sink ({', '.join(sinks)})")
    section, dot, key = target.strip().partition(".")
    if not dot or not section or not key:
        raise ValueError(f"{text!r}: write [SINK:]SECTION.KEY=VALUE")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return Setting(sink, section, key.strip(), value)


def apply_settings(
    sections: dict[str, dict[str, Any]], settings: Sequence[Setting], sink: str
) -> None:
    """Put every setting for all sinks or for ``sink`` into ``sections`` (in place)."""
    for s in settings:
        if s.sink is None or s.sink == sink:
            sections.setdefault(s.section, {})[s.key] = s.value

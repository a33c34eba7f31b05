"""The end-to-end bench's results: medians over the rounds, ratios to A, the markdown tables
and the JSON document."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.lib.runs import EngineRun
from bench.lib.stats import median, percentile
from bench.lib.tables import PlainRead

SINK_NAMES = {
    "counting": "snapshot → counting sink",
    "jsonl": "snapshot → JSONL",
    "spark": "snapshot → Spark, landed (session up)",
    "kafka": "snapshot → Kafka",
    "kafka-confluent": "snapshot → Kafka, client = confluent",
}
SPARK_WITH_SESSION = "snapshot → Spark, landed, incl. session start"
SOURCE_LABELS = {"postgres": "PostgreSQL", "mysql": "MariaDB"}


@dataclass
class SourceResults:
    """Everything measured for one source."""

    kind: str
    rows: int
    load_s: float
    plain: list[PlainRead] = field(default_factory=list)  # A, one per round
    runs: list[EngineRun] = field(default_factory=list)  # the rounds' snapshots
    latency: EngineRun | None = None
    scale_rows: int = 0
    scale_load_s: float = 0.0
    scale: list[EngineRun] = field(default_factory=list)
    machine: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return SOURCE_LABELS.get(self.kind, self.kind)


@dataclass
class Line:
    """One line of the main table: medians over the rounds."""

    source: str
    what: str
    rounds: int
    rate: float  # rows/s, median
    ratio: float  # median of (this round's rate / this round's A rate)
    seconds: float  # median
    cpu_s: float  # the engine's (A: this process's) CPU seconds, median
    below_cpu_s: float  # Spark's JVM CPU seconds, median (NaN: none)
    rss_mb: float  # the engine's peak RSS, median (NaN for A)
    below_rss_mb: float  # the JVM's peak RSS, median


def with_session(run: EngineRun) -> float:
    return run.seconds + (run.session_s or 0.0)


def summary(res: SourceResults, sinks: Sequence[str]) -> list[Line]:
    a_rates = [p.rows / p.seconds for p in res.plain]
    lines = [
        Line(
            res.label,
            "A: plain read → pyarrow Parquet",
            len(res.plain),
            median(a_rates),
            1.0,
            median(p.seconds for p in res.plain),
            median(p.cpu_s for p in res.plain),
            math.nan,
            math.nan,
            math.nan,
        )
    ]

    def line(what: str, runs: list[EngineRun], seconds: list[float]) -> Line:
        rates = [r.rows / s for r, s in zip(runs, seconds, strict=True)]
        ratios = [
            rate / a_rates[r.round] if r.round is not None and r.round < len(a_rates) else math.nan
            for r, rate in zip(runs, rates, strict=True)
        ]
        spark = any(r.sink == "spark" for r in runs)
        return Line(
            res.label,
            what,
            len(runs),
            median(rates),
            median(ratios),
            median(seconds),
            median(r.engine_cpu_s for r in runs),
            median(r.below_cpu_s for r in runs) if spark else math.nan,
            median(r.engine_rss_mb for r in runs),
            median(r.below_rss_mb for r in runs) if spark else math.nan,
        )

    for sink in sinks:
        runs = [r for r in res.runs if r.sink == sink]
        if not runs:
            continue
        lines.append(line(SINK_NAMES[sink], runs, [r.seconds for r in runs]))
        if sink == "spark":
            lines.append(line(SPARK_WITH_SESSION, runs, [with_session(r) for r in runs]))
    return lines


def fmt(value: float, spec: str, empty: str = "–") -> str:
    return empty if value is None or math.isnan(value) else format(value, spec)


def main_table(lines: Sequence[Line]) -> str:
    out = [
        "| source | what | rows/s | ÷ A | seconds | engine CPU s | Spark JVM CPU s "
        "| engine peak RSS MB | JVM peak RSS MB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for x in lines:
        out.append(
            f"| {x.source} | {x.what} | {fmt(x.rate, ',.0f')} | {fmt(x.ratio, '.2f')} "
            f"| {fmt(x.seconds, '.2f')} | {fmt(x.cpu_s, '.1f')} | {fmt(x.below_cpu_s, '.1f')} "
            f"| {fmt(x.rss_mb, ',.0f')} | {fmt(x.below_rss_mb, ',.0f')} |"
        )
    return "\n".join(out)


@dataclass
class Latency:
    phase: str
    ticks: int
    p50: float
    p99: float
    max: float


def latency(run: EngineRun) -> list[Latency]:
    """Ticks by the phase they were sent in: the ``idle_s`` before the signal (idle; earlier
    ones are the ticker's warm-up), and from the signal to the last READ row handed to the
    sink (during the snapshot). Latency: arrival at the sink − the moment the ticker sent its
    (autocommit) UPDATE, in ms: an upper bound, as the commit happens a little later, before
    the UPDATE returns."""
    end = run.marks.get("last_read_handed", run.seconds)
    phases: dict[str, list[float]] = {"idle (before the signal)": [], "during the snapshot": []}
    for sent, _, arrived in run.ticks:
        ms = (arrived - sent) * 1000.0
        if -run.idle_s <= sent < 0:
            phases["idle (before the signal)"].append(ms)
        elif 0 <= sent <= end:
            phases["during the snapshot"].append(ms)
    return [
        Latency(phase, len(v), percentile(v, 50), percentile(v, 99), max(v, default=math.nan))
        for phase, v in phases.items()
    ]


def latency_table(results: Sequence[SourceResults], tick_ms: float) -> str:
    out = [
        f"| source | ticker every {tick_ms:g} ms: sent → at the sink | sink | ticks | p50 ms "
        "| p99 ms | max ms |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for res in results:
        if res.latency is None:
            continue
        for x in latency(res.latency):
            out.append(
                f"| {res.label} | {x.phase} | {res.latency.sink} | {x.ticks:,} "
                f"| {fmt(x.p50, '.1f')} | {fmt(x.p99, '.1f')} | {fmt(x.max, '.1f')} |"
            )
    return "\n".join(out)


def quarter_rates(run: EngineRun) -> tuple[float, float]:
    """READ rows/s over the first and the last quarter of the rows, from the sink's writes
    (the first write's rows are not counted: they came before any interval)."""
    points = run.progress
    if len(points) < 4:
        return math.nan, math.nan

    def at(share: float) -> tuple[float, int]:
        return next(p for p in points if p[1] >= share * run.rows)

    t0, n0 = points[0]
    t1, n1 = at(0.25)
    t3, n3 = at(0.75)
    t4, n4 = points[-1]
    first = (n1 - n0) / (t1 - t0) if t1 > t0 else math.nan
    last = (n4 - n3) / (t4 - t3) if t4 > t3 else math.nan
    return first, last


def scale_table(results: Sequence[SourceResults]) -> str:
    """Each scale run beside the rounds' medians of the same sink at the base size: time
    per row (linear: 1.00), the rate over the last quarter of the rows against the first
    (within one run), the engine's peak RSS."""
    out = [
        "| source | sink | rows | rows/s | time per row, ÷ base | last ÷ first quarter rows/s "
        "| engine peak RSS MB | RSS ÷ base |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for res in results:
        for big in res.scale:
            base = [r for r in res.runs if r.sink == big.sink]
            base_rate = median(r.rate for r in base)
            base_rss = median(r.engine_rss_mb for r in base)
            base_quarters = [quarter_rates(r) for r in base]
            base_q = median(last / first for first, last in base_quarters)
            first, last = quarter_rates(big)
            out.append(
                f"| {res.label} | {big.sink} | {res.rows:,} (base, median) "
                f"| {fmt(base_rate, ',.0f')} | 1.00 | {fmt(base_q, '.2f')} "
                f"| {fmt(base_rss, ',.0f')} | 1.00 |"
            )
            out.append(
                f"| {res.label} | {big.sink} | {big.rows:,} | {big.rate:,.0f} "
                f"| {fmt(base_rate / big.rate, '.2f')} | {fmt(last / first, '.2f')} "
                f"| {big.engine_rss_mb:,.0f} | {fmt(big.engine_rss_mb / base_rss, '.2f')} |"
            )
    return "\n".join(out)


def to_json(value: Any) -> Any:
    """Dataclasses as dicts, NaN as null (JSON has no NaN)."""
    if hasattr(value, "__dataclass_fields__"):
        return to_json(asdict(value))
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    return value

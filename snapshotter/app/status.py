"""``snapshotter status``: what state says, as JSON or a readable table. Read-only: it never
takes the state lock, so it works while an engine runs.

Text that came from signal rows (signal ids and types, table names, errors that quote a
filter or a pattern) is shown through ``signals.display.printable``: control, format and
bidi characters escaped, so no signal can forge or reorder lines of the report, in the table
or in ``--json``. The history is bounded (``EngineState.prune_history``, applied to what is
shown too, for a state file written before it was), so the report stays small and fast.

Each snapshot's progress is rows read against the database's row estimate taken at its start,
with the rate and time remaining (``core.eta``); ``render_status`` is the table ``status``
and ``status --watch`` print."""

from __future__ import annotations

import datetime as dt
import json
import math
import time
from collections.abc import Sequence
from typing import Any

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from signals.display import printable
from snapshotter.core.eta import duration_text, eta
from snapshotter.core.keys import Key
from snapshotter.core.state import EngineState, TableProgress
from snapshotter.sources.connector import saved_position_text


def _interval(value: dt.timedelta) -> str:
    """A timedelta key (MySQL TIME) as MySQL writes it: [-]H:MM:SS[.ffffff]."""
    micros = value // dt.timedelta(microseconds=1)
    sign, micros = ("-", -micros) if micros < 0 else ("", micros)
    seconds, fraction = divmod(micros, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hours, minute = divmod(minutes, 60)
    text = f"{sign}{hours}:{minute:02d}:{second:02d}"
    return text + (f".{fraction:06d}" if fraction else "")


def _key(key: Key | None) -> list[Any] | None:
    if key is None:
        return None
    out: list[Any] = []
    for value in key:
        if isinstance(value, float) and not math.isfinite(value):
            out.append(str(value))  # "nan", "inf": strict JSON has no NaN or Infinity
        elif isinstance(value, bool | int | float | str) or value is None:
            out.append(value)
        elif isinstance(value, dt.timedelta):
            out.append(_interval(value))
        elif isinstance(value, bytes):
            out.append(value.hex())
        elif isinstance(value, dt.date | dt.time):
            out.append(value.isoformat())
        else:
            out.append(str(value))
    return [printable(v) if isinstance(v, str) else v for v in out]


def _text(value: str | None) -> str | None:
    return None if value is None else printable(value)


def _started_at(ms: int | None) -> str | None:
    if ms is None:
        return None
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="seconds")


def _progress(p: TableProgress, now_ms: int) -> dict[str, Any]:
    """Rows read against the estimate, rate and time remaining (core.eta)."""
    e = eta(p, now_ms)
    return {
        "rows_read": e.rows_done,
        "estimated_rows": p.estimated_rows,
        # With a filter the estimate is the whole table's: percent is then a lower bound,
        # eta_s an upper bound.
        "estimate_upper_bound": e.upper_bound,
        "percent": None if e.fraction is None else round(e.fraction * 100, 1),
        "rows_per_s": None if e.rows_per_s is None else round(e.rows_per_s, 1),
        "eta_s": None if e.seconds_remaining is None else round(e.seconds_remaining),
        "started_at": _started_at(p.started_ms),
    }


def status_report(
    state: EngineState,
    lag_bytes: int | None,
    warnings: Sequence[str] = (),
    now_ms: int | None = None,
) -> dict[str, Any]:
    """The report ``status`` prints; ``warnings`` are the stream position's health
    (snapshotter.app.stream_position.stream_health); ``now_ms`` (epoch ms, default now)
    is the time rates and ETAs are computed at."""
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    state = state.model_copy(update={"snapshots": list(state.snapshots)})
    state.prune_history()
    return {
        "snapshots": [
            {
                "table": printable(p.table),
                "signal_id": printable(p.signal_id),
                "state": p.status.value,
                "rows": p.rows_emitted,
                **_progress(p, now),
                "chunks": p.chunk_id,
                "last_key": _key(p.last_read_key),
                "max_key": _key(p.max_key),
                "error": _text(p.error),
            }
            for p in state.snapshots
        ],
        "stream": {
            "position": state.stream.position,
            "restart": saved_position_text(state.stream.resume),
            "lag_bytes": lag_bytes,
        },
        "paused": state.paused,
        "signal_problems": [
            {
                "signal_id": printable(s.signal_id),
                "type": printable(s.signal_type),
                "error": printable(s.message),
            }
            for s in state.signal_problems
        ],
        "warnings": [printable(w) for w in warnings],
    }


TABLE_ROWS = 500  # snapshot rows the human-readable table shows (--json shows every one)


def table_rows(snapshots: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """The report's snapshot rows the status table shows, in order, and how many it leaves
    out: the running one always, then the newest others up to TABLE_ROWS."""
    if len(snapshots) <= TABLE_ROWS:
        return list(snapshots), 0
    chosen = {i for i, s in enumerate(snapshots) if s["state"] == "running"}
    for i in range(len(snapshots) - 1, -1, -1):
        if len(chosen) >= TABLE_ROWS:
            break
        chosen.add(i)
    return [snapshots[i] for i in sorted(chosen)], len(snapshots) - len(chosen)


def progress_text(snapshot: dict[str, Any]) -> str:
    """Rows read of the estimate, and the percent: "5000 / 10000 (50.0%)"; with a filter
    the estimate is an upper bound ("<= 10000", ">= 50.0%"); "5000 / ?" without one."""
    read, total = snapshot["rows_read"], snapshot["estimated_rows"]
    if total is None and snapshot["state"] == "done":
        return f"{read} (100.0%)"
    if total is None:
        return f"{read} / ?"
    upper = snapshot["estimate_upper_bound"]
    text = f"{read} / {'<= ' if upper else ''}{total}"
    percent = snapshot["percent"]
    if percent is not None:
        text += f" ({'>= ' if upper else ''}{percent:.1f}%)"
    return text


def rate_text(snapshot: dict[str, Any]) -> str:
    rate = snapshot["rows_per_s"]
    return "" if rate is None else f"{rate:,.0f}/s"


def eta_text(snapshot: dict[str, Any]) -> str:
    """The time remaining of a running snapshot ("<= " with a filter); empty otherwise."""
    if snapshot["state"] != "running":
        return ""
    upper = snapshot["estimate_upper_bound"] and snapshot["eta_s"] is not None
    return ("<= " if upper else "") + duration_text(snapshot["eta_s"])


def render_status(report: dict[str, Any], title: str) -> list[RenderableType]:
    """The human-readable status: the snapshots table, then one line per fact. Every text
    goes in as rich Text (no markup is read from it)."""
    table = Table(title=title)
    for column in (
        "table",
        "state",
        "rows",
        "read / estimated",
        "rate",
        "eta",
        "chunks",
        "last key",
        "max key",
        "error",
    ):
        table.add_column(column, overflow="fold")
    shown, hidden = table_rows(report["snapshots"])
    for s in shown:
        table.add_row(
            *(
                Text(cell)
                for cell in (
                    s["table"],
                    s["state"],
                    str(s["rows"]),
                    progress_text(s),
                    rate_text(s),
                    eta_text(s),
                    str(s["chunks"]),
                    json.dumps(s["last_key"]),
                    json.dumps(s["max_key"]),
                    s["error"] or "",
                )
            )
        )
    parts: list[RenderableType] = [table]
    if hidden:
        parts.append(Text(f"{hidden} older snapshots not shown (status --json lists them all)"))
    stream = report["stream"]
    parts.append(
        Text(
            f"stream position {stream['position'] or '(no event handled yet)'}, restarts from "
            f"{stream['restart']}"
            + ("" if stream["lag_bytes"] is None else f", lag {stream['lag_bytes']} bytes")
        )
    )
    landing = report.get("landing")
    if landing is not None:
        parts.append(
            Text(
                f"landing: batch {landing['staged']} staged (recorded); "
                f"{landing['waiting_batches']} batch(es), {landing['waiting_bytes']} bytes "
                f"staged and not yet landed ({landing['staging']})"
            )
        )
    kafka = report.get("kafka")
    if kafka is not None:
        parts.append(
            Text(
                f"kafka: {kafka['acknowledged_messages']} messages acknowledged by "
                f"{kafka['bootstrap_servers']} (recorded)"
            )
        )
    for problem in report["signal_problems"]:
        parts.append(Text(f"signal {problem['signal_id']} ({problem['type']}): {problem['error']}"))
    for warning in report["warnings"]:
        parts.append(Text.assemble(("warning:", "yellow"), " ", warning))
    return parts

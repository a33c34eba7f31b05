"""``snapshotter status``: what state says, as JSON or a readable table. Read-only: it never
takes the state lock, so it works while an engine runs.

Text that came from signal rows (signal ids and types, table names, errors that quote a
filter or a pattern) is shown through ``signals.display.printable``: control, format and
bidi characters escaped, so no signal can forge or reorder lines of the report, in the table
or in ``--json``. The history is bounded (``EngineState.prune_history``, applied to what is
shown too, for a state file written before it was), so the report stays small and fast.

Each snapshot's progress is rows read against the database's row estimate taken at its start,
with the rate and time remaining (``core.eta``), its start and how long it ran.
``render_status`` is what ``status`` and ``status --watch`` print: made for a terminal 80
columns wide, with cells that never wrap (the snapshots grouped under their table's name,
counts and times in short forms, signal ids shortened) and long texts (errors, paths,
positions) on lines of their own; ``-v`` adds each snapshot's details."""

from __future__ import annotations

import datetime as dt
import json
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
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


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="seconds")


def _duration_s(p: TableProgress, now_ms: int) -> int | None:
    """How long the snapshot ran: until it finished, or so far (pauses included); None when
    it has not started, or finished in a state written before its end time was recorded."""
    if p.started_ms is None:
        return None
    if p.status.finished:
        end = p.finished_ms
        return None if end is None else max(0, round((end - p.started_ms) / 1000))
    return max(0, round((now_ms - p.started_ms) / 1000))


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
        "started_at": _iso(p.started_ms),
        "finished_at": _iso(p.finished_ms),
        "duration_s": _duration_s(p, now_ms),
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
                "filter": _text(p.filter),
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
SHORT_TEXT = 240  # characters of an error the table shows without --verbose
LEGEND = "read / estimated: rows read so far / the table's estimated rows when it started"


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


def count_text(n: int) -> str:
    """A row count in at most 5 characters: 9999, 42.0k, 100k, 1.2M, 3.4G."""
    if n < 10_000:
        return str(n)
    value = float(n)
    for unit in "kMGTP":
        value /= 1000
        text = f"{value:.1f}" if value < 99.95 else f"{value:.0f}"
        if float(text) < 1000 or unit == "P":
            return text + unit
    raise AssertionError("unreachable")


def size_text(n: int) -> str:
    """A byte count as people read it: 512 B, 37 KiB, 1.5 MiB, 12 GiB."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1023.5 or unit == "TiB":
            return f"{value:.1f} {unit}" if value < 9.95 else f"{value:.0f} {unit}"
    raise AssertionError("unreachable")


def short_id(signal_id: str) -> str:
    """A signal id in at most 10 characters: whole if it fits, else its start and its end
    (a UUID's first characters, a counter at the end of ``ad-hoc-orders-12``)."""
    return signal_id if len(signal_id) <= 10 else f"{signal_id[:5]}…{signal_id[-4:]}"


def progress_text(snapshot: dict[str, Any]) -> str:
    """Rows read of the estimate, and the percent: "42.0k / 100k  42%"; with a filter the
    estimate is an upper bound ("≤100k  ≥42%"); "5000 / ?" without one."""
    read, total = count_text(snapshot["rows_read"]), snapshot["estimated_rows"]
    if snapshot["state"] == "done":
        return f"{read}  100%" if total is None else f"{read} / {count_text(total)}  100%"
    if total is None:
        return f"{read} / ?"
    upper = snapshot["estimate_upper_bound"]
    text = f"{read} / {'≤' if upper else ''}{count_text(total)}"
    percent = snapshot["percent"]
    if percent is not None:
        text += f"  {'≥' if upper else ''}{math.floor(percent)}%"
    return text


def rate_text(snapshot: dict[str, Any]) -> str:
    rate = snapshot["rows_per_s"]
    return "" if rate is None else f"{count_text(round(rate))}/s"


def eta_text(snapshot: dict[str, Any]) -> str:
    """The time remaining of a running snapshot ("≤" with a filter); empty otherwise."""
    if snapshot["state"] != "running":
        return ""
    upper = snapshot["estimate_upper_bound"] and snapshot["eta_s"] is not None
    return ("≤" if upper else "") + duration_text(snapshot["eta_s"])


def started_text(snapshot: dict[str, Any]) -> str:
    """The start time as ``MM-DD HH:MM`` (UTC)."""
    started = snapshot["started_at"]
    if started is None:
        return ""
    return dt.datetime.fromisoformat(started).strftime("%m-%d %H:%M")


def took_text(snapshot: dict[str, Any]) -> str:
    """How long it ran (so far); "?" when a finished one's end was not recorded."""
    if snapshot["started_at"] is None:
        return ""
    return duration_text(snapshot["duration_s"])


_STATE_STYLE = {
    "running": "cyan",
    "paused": "yellow",
    "done": "green",
    "failed": "bold red",
    "stopped": "magenta",
}

# The table's columns: header, cell, whether it is left out when the table is too wide.
_COLUMNS: tuple[tuple[str, Callable[[dict[str, Any]], str], bool], ...] = (
    ("state", lambda s: str(s["state"]), False),
    ("signal", lambda s: short_id(s["signal_id"]), False),
    ("started UTC", started_text, False),
    ("took", took_text, False),
    ("read / estimated", progress_text, False),
    ("rate", rate_text, True),
    ("eta", eta_text, False),
)
_INDENT = 2  # of a snapshot's row under its table's name
_GAP = 2  # between columns
_NOTE_INDENT = 4  # of an error, or the --verbose details, under a snapshot's row


def _cut(text: str, verbose: bool) -> str:
    if verbose or len(text) <= SHORT_TEXT:
        return text
    return f"{text[:SHORT_TEXT]}… ({len(text) - SHORT_TEXT} more characters: status -v)"


def _when(iso: str) -> str:
    return dt.datetime.fromisoformat(iso).strftime("%Y-%m-%d %H:%M:%S UTC")


def _details(s: dict[str, Any]) -> list[str]:
    """A snapshot's ``--verbose`` lines: the full signal id and times, rows written and
    dropped, chunks, rate, keys, filter."""
    lines = [f"signal {s['signal_id']}"]
    times = []
    if s["started_at"] is not None:
        times.append(f"started {_when(s['started_at'])}")
    if s["finished_at"] is not None:
        times.append(f"finished {_when(s['finished_at'])}")
    if times:
        lines.append(", ".join(times))
    dropped = s["rows_read"] - s["rows"]
    rows = f"rows: {s['rows_read']:,} read, {s['rows']:,} written"
    if dropped:
        rows += f" ({dropped:,} superseded in their window by log events)"
    rows += f", {s['chunks']:,} chunks"
    if s["estimated_rows"] is not None:
        rows += f", {s['estimated_rows']:,} estimated"
    if s["rows_per_s"] is not None:
        rows += f", {s['rows_per_s']:,.0f} rows/s"
    lines.append(rows)
    lines.append(f"keys: last read {json.dumps(s['last_key'])}, max {json.dumps(s['max_key'])}")
    if s.get("filter"):
        lines.append(f"filter: {s['filter']}")
    return lines


class Indented:
    """Text wrapped to the width less ``indent`` columns, every line indented (a hanging
    block under a row or a heading), with no padding after it."""

    def __init__(self, text: Text, indent: int) -> None:
        self.text, self.indent = text, indent

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = max(options.max_width - self.indent, 20)
        for wrapped in self.text.wrap(console, width, overflow="fold"):
            wrapped.rstrip()
            yield Text(" " * self.indent) + wrapped


class SnapshotTable:
    """The snapshots, grouped by table: the table's name on a line of its own (whole,
    however long), then one row per snapshot of it under the column headers, then an
    error (and with ``verbose`` the details) on lines of their own under its row. Cells
    never wrap: every column is as wide as its longest cell, and each is short (counts
    and times in compact form, signal ids shortened); the rate column is left out when
    the rows would not fit the width."""

    def __init__(self, snapshots: Sequence[dict[str, Any]], verbose: bool = False) -> None:
        self.snapshots = snapshots
        self.verbose = verbose

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        cells = [[cell(s) for _, cell, _ in _COLUMNS] for s in self.snapshots]
        headers = [header for header, _, _ in _COLUMNS]
        widths = [
            max([cell_len(h), *(cell_len(row[i]) for row in cells)]) for i, h in enumerate(headers)
        ]
        shown = list(range(len(_COLUMNS)))
        optional = [i for i, (_, _, drop) in enumerate(_COLUMNS) if drop]

        def total() -> int:
            return _INDENT + sum(widths[i] for i in shown) + _GAP * (len(shown) - 1)

        while total() > options.max_width and optional:
            shown.remove(optional.pop())

        def line(row: Sequence[str], style: str = "") -> Text:
            text = Text(" " * _INDENT, no_wrap=True, overflow="ellipsis")
            for n, i in enumerate(shown):
                cell = row[i]
                if n:
                    text.append(" " * _GAP)
                cell_style = style or (_STATE_STYLE.get(cell, "") if i == 0 else "")
                text.append(cell, cell_style)
                if n < len(shown) - 1:
                    text.append(" " * (widths[i] - cell_len(cell)))
            text.rstrip()
            return text

        yield line(headers, "bold")
        groups: dict[str, list[int]] = {}
        for n, s in enumerate(self.snapshots):
            groups.setdefault(s["table"], []).append(n)
        for table, members in groups.items():
            yield Text(table, style="bold", overflow="fold")
            for n in members:
                s = self.snapshots[n]
                yield line(cells[n])
                notes: list[Text] = []
                if s["error"]:
                    label = "error" if s["state"] == "failed" else "why"
                    notes.append(
                        Text.assemble((f"{label}: ", "red"), _cut(s["error"], self.verbose))
                    )
                if self.verbose:
                    notes += [Text(detail, style="dim") for detail in _details(s)]
                for note in notes:
                    yield Indented(note, _NOTE_INDENT)


def _stream_lines(stream: dict[str, Any], verbose: bool) -> list[Text]:
    lines = [Text(f"stream: restarts from {stream['restart']}")]
    lag = stream["lag_bytes"]
    if lag is None:
        lines.append(Text("lag: unknown (the source is unreachable, or the distance is not known)"))
    else:
        lines.append(
            Text(f"lag: {size_text(lag)} of log written after that point, not yet confirmed")
        )
    if verbose:
        position = stream["position"] or "(no event handled yet)"
        lines.append(Text(f"last position handled: {position}", style="dim"))
    return lines


def render_status(
    report: dict[str, Any], state_path: str, *, at: str | None = None, verbose: bool = False
) -> list[RenderableType]:
    """The human-readable status, for a terminal 80 columns wide: where the state is, a
    pause, the snapshots (``SnapshotTable``) and a legend, then one line per fact (long
    texts on lines of their own). Every text goes in as rich Text (no markup is read from
    it)."""
    parts: list[RenderableType] = [
        Text(f"state file: {state_path}" + ("" if at is None else f" (at {at})"), overflow="fold")
    ]
    if report["paused"]:
        parts.append(
            Text.assemble(
                ("paused:", "bold yellow"), " the snapshots wait for a resume-snapshot signal"
            )
        )
        parts.append(Text("  (snapshotter signal -c CONFIG resume-snapshot)"))
    shown, hidden = table_rows(report["snapshots"])
    parts.append(Text())
    if shown:
        parts.append(SnapshotTable(shown, verbose))
        parts.append(Text(LEGEND, style="dim"))
    else:
        parts.append(
            Text("no snapshots (send one: snapshotter signal -c CONFIG execute-snapshot TABLE)")
        )
    if hidden:
        parts.append(Text(f"{hidden} older snapshots not shown (status --json lists them all)"))
    parts.append(Text())
    parts += _stream_lines(report["stream"], verbose)
    landing = report.get("landing")
    if landing is not None:
        parts.append(
            Text(
                f"landing: batch {landing['staged']} staged (recorded); "
                f"{landing['waiting_batches']} batch(es), {size_text(landing['waiting_bytes'])} "
                "not yet landed in"
            )
        )
        parts.append(Indented(Text(landing["staging"]), _INDENT))
    kafka = report.get("kafka")
    if kafka is not None:
        parts.append(
            Text(
                f"kafka: {kafka['acknowledged_messages']} messages acknowledged by "
                f"{kafka['bootstrap_servers']} (recorded)"
            )
        )
    for problem in report["signal_problems"]:
        parts.append(Text(f"signal {problem['signal_id']} ({problem['type']}):", style="red"))
        parts.append(Indented(Text(_cut(problem["error"], verbose)), _NOTE_INDENT))
    for warning in report["warnings"]:
        parts.append(Text.assemble(("warning:", "yellow"), " ", warning))
    if not verbose:
        parts.append(
            Text("status -v: full ids, keys, rows written; --json: every field", style="dim")
        )
    # Wrapped here, at word boundaries, also on a console that soft-wraps (the CLI's).
    return [Indented(p, 0) if isinstance(p, Text) else p for p in parts]

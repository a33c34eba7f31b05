"""``snapshotter status``: what state says, as JSON or a readable table. Read-only: it never
takes the state lock, so it works while an engine runs.

Text that came from signal rows (signal ids and types, table names, errors that quote a
filter or a pattern) is shown through ``signals.display.printable``: control, format and
bidi characters escaped, so no signal can forge or reorder lines of the report, in the table
or in ``--json``. The history is bounded (``EngineState.prune_history``, applied to what is
shown too, for a state file written before it was), so the report stays small and fast."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from typing import Any

from signals.display import printable
from snapshotter.core.keys import Key
from snapshotter.core.state import EngineState
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


def status_report(
    state: EngineState, lag_bytes: int | None, warnings: Sequence[str] = ()
) -> dict[str, Any]:
    """The report ``status`` prints; ``warnings`` are the stream position's health
    (snapshotter.app.stream_position.stream_health)."""
    state = state.model_copy(update={"snapshots": list(state.snapshots)})
    state.prune_history()
    return {
        "snapshots": [
            {
                "table": printable(p.table),
                "signal_id": printable(p.signal_id),
                "state": p.status.value,
                "rows": p.rows_emitted,
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

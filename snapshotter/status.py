"""``snapshotter status``: what state says, as JSON or a readable table. Read-only: it never
takes the state lock, so it works while an engine runs."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from snapshotter.core.keys import Key
from snapshotter.core.state import EngineState
from snapshotter.stream_position import saved_position_text


def _key(key: Key | None) -> list[Any] | None:
    if key is None:
        return None
    out: list[Any] = []
    for value in key:
        if isinstance(value, bool | int | float | str) or value is None:
            out.append(value)
        elif isinstance(value, bytes):
            out.append(value.hex())
        elif isinstance(value, dt.date | dt.time):
            out.append(value.isoformat())
        else:
            out.append(str(value))
    return out


def status_report(
    state: EngineState, lag_bytes: int | None, warnings: Sequence[str] = ()
) -> dict[str, Any]:
    """The report ``status`` prints; ``warnings`` are the stream position's health
    (snapshotter.stream_position.stream_health)."""
    return {
        "snapshots": [
            {
                "table": str(p.table),
                "signal_id": p.signal_id,
                "state": p.status.value,
                "rows": p.rows_emitted,
                "chunks": p.chunk_id,
                "last_key": _key(p.last_read_key),
                "max_key": _key(p.max_key),
                "error": p.error,
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
            {"signal_id": s.signal_id, "type": s.signal_type, "error": s.message}
            for s in state.signal_problems
        ],
        "warnings": list(warnings),
    }

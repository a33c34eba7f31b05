"""The change stream's saved position as people read it, and how long the stream keeps it
(no client library needed: ``status`` of a state file reads these)."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from typing import Any

DEFAULT_RETENTION_S = 24 * 3600  # a change stream's default retention_period (1 day)
_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def position_text(resume: Mapping[str, Any]) -> str | None:
    """The saved change-stream position as people read it; None when ``resume`` holds none."""
    stream = resume.get("change_stream")
    if not stream:
        return None
    partitions = resume.get("partitions")
    at = partitions["restart_us"] if partitions else resume.get("start_us")
    when = iso(int(at)) if at is not None else "its start"
    live = f", {len(partitions['live'])} partitions" if partitions else ""
    return f"change stream {stream} from {when}{live}"


def iso(us: int) -> str:
    at = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=us)
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def restart_us(resume: Mapping[str, Any]) -> int | None:
    partitions = resume.get("partitions")
    if partitions:
        return int(partitions["restart_us"])
    start = resume.get("start_us")
    return None if start is None else int(start)


def retention_s(options: Mapping[str, str]) -> int:
    """A change stream's retention_period option ("36h", "7d") in seconds."""
    found = _DURATION.match(options.get("retention_period", "").strip().lower())
    if found is None:
        return DEFAULT_RETENTION_S
    return int(found.group(1)) * _UNIT_S[found.group(2)]

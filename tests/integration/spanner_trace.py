"""What the change stream itself holds for some keys, read without the engine: when a
convergence test finds a key missing, its message says whether the emulator returned the
key's change (and when, in which partition) or never did.

Every partition is queried once, from its start to a fixed end (so each query returns),
following child partitions breadth first; no merge, no checkpoint, nothing shared with the
engine's reader but the query text and the record parsing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from snapshotter.sources.spanner.client import SpannerDialectKind
from snapshotter.sources.spanner.reader import _stream_sql, stream_records
from snapshotter.sources.spanner.records import ChildPartitions, DataChange


def trace_keys(
    database: Any,
    dialect: str,
    change_stream: str,
    start_us: int,
    end_us: int,
    keys: Iterable[Mapping[str, Any]],
) -> list[str]:
    """One line per data change record of ``keys`` between ``start_us`` and ``end_us``."""
    kind = (
        SpannerDialectKind.POSTGRESQL if dialect == "postgresql" else SpannerDialectKind.GOOGLESQL
    )
    wanted = {_canonical(k) for k in keys}
    text = _stream_sql(kind, change_stream)
    lines: list[str] = []
    queue: list[tuple[str | None, int]] = [(None, start_us)]
    seen: set[str] = set()
    while queue:
        token, start = queue.pop(0)
        for batch in stream_records(database, kind, text, token, start, end_us, 1000):
            for record in batch:
                if isinstance(record, ChildPartitions):
                    for child in record.children:
                        if child.token not in seen and child.start_us < end_us:
                            seen.add(child.token)
                            queue.append((child.token, child.start_us))
                elif isinstance(record, DataChange):
                    for mod in record.mods:
                        if _canonical(mod.keys) in wanted:
                            lines.append(
                                f"  stream: {record.mod_type} {dict(mod.keys)} at "
                                f"{record.commit_us} (txn {record.transaction[:12]}..., seq "
                                f"{record.sequence}) in partition {(token or 'root')[:12]}... "
                                f"queried from {start}"
                            )
    return lines or ["  stream: no record of these keys"]


def _canonical(key: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((str(k), str(v)) for k, v in key.items()))

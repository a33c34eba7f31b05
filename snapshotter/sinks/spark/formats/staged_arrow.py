"""Staged files read into Arrow in the driver, for appends written without a Spark job
(``delta_arrow``, ``iceberg_files``): where the table is on this machine's file system, and
the staged files agree on one schema; or the files themselves, where they hold the table's
schema as it is."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def local_path(location: str) -> str | None:
    """The file-system path of a table location on this machine, or None (a remote store)."""
    if location.startswith("file://"):
        return location[len("file://") :]
    if location.startswith("file:"):
        return location[len("file:") :]
    return None if "://" in location else location


def read_arrow(files: Sequence[Path | str], drop: Sequence[str] = ()) -> pa.Table | None:
    """The staged files' rows as one Arrow table without the ``drop`` columns, or None when
    the files' schemas differ (Spark reads and evolves those). A directory (a part read on
    executors) stands for the Parquet files in it."""
    files = [
        found
        for f in map(Path, files)
        for found in (sorted(f.glob("*.parquet")) if f.is_dir() else [f])
    ]
    schemas = [_without(pq.read_schema(f), drop) for f in files]
    if not schemas or any(not s.equals(schemas[0]) for s in schemas[1:]):
        return None
    tables = [pq.read_table(f, columns=schemas[0].names) for f in files]
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)


def _without(schema: pa.Schema, drop: Sequence[str]) -> pa.Schema:
    for name in drop:
        if schema.get_field_index(name) >= 0:
            schema = schema.remove(schema.get_field_index(name))
    return schema


def as_they_are(files: Sequence[Path | str], schema: pa.Schema) -> bool:
    """Whether each of the staged ``files`` holds exactly ``schema``'s columns, in its order
    and of its types (nullability aside): then the files themselves can go into the table,
    linked, not read and written again."""
    want = [(f.name, f.type) for f in schema]
    for path in map(Path, files):
        if path.is_dir():
            return False
        have = pq.read_schema(path)
        if [(f.name, f.type) for f in have] != want:
            return False
    return bool(files)


def as_schema(rows: pa.Table, schema: pa.Schema) -> pa.Table | None:
    """``rows`` in ``schema``'s column order and types, or None when the column names differ
    or a value does not cast exactly (the caller then writes with Spark, which evolves)."""
    if sorted(schema.names) != sorted(rows.column_names):
        return None
    try:
        return rows.select(schema.names).cast(schema, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
        return None

"""Notification records of the spark sink: small Parquet files appended under
``<landing root>/_notifications/`` (Spark and Hive skip "_" directories when they list a
table's files, and ``landed_tables`` lists only directories with table metadata), one per
call, readable with ``spark.read.parquet("<root>/_notifications")``."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

DIRECTORY = "_notifications"

SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("aggregate_type", pa.string(), nullable=False),
        pa.field("type", pa.string(), nullable=False),
        pa.field("additional_data", pa.map_(pa.string(), pa.string())),
        pa.field("timestamp", pa.int64()),
    ]
)


def notifications_dir(root: str) -> str:
    return f"{root.rstrip('/')}/{DIRECTORY}"


def write_notifications(root: str, records: Sequence[Mapping[str, Any]]) -> str:
    """Write ``records`` as one new Parquet file under the root's notification directory
    (any filesystem pyarrow opens by URI); returns its path. Written under a temporary
    name and moved into place, so a reader never sees half a file."""
    fs, base = pafs.FileSystem.from_uri(notifications_dir(root))
    fs.create_dir(base, recursive=True)
    table = pa.Table.from_pylist(
        [
            {
                "id": r["id"],
                "aggregate_type": r["aggregate_type"],
                "type": r["type"],
                "additional_data": list(r["additional_data"].items()),
                "timestamp": r["timestamp"],
            }
            for r in records
        ],
        schema=SCHEMA,
    )
    name = f"part-{time.time_ns() // 1_000_000:013d}-{uuid.uuid4().hex[:12]}.parquet"
    temporary = f"{base}/.{name}.tmp"
    final = f"{base}/{name}"
    with fs.open_output_stream(temporary) as out:
        pq.write_table(table, out)
    fs.move(temporary, final)
    return final

"""Staged files committed into a Delta table as they are: hard-linked into the table's
directory and added by a delta-rs transaction (``DeltaTable.create_write_transaction``), no
row read or encoded again. A snapshot's chunk goes into the changelog as its staged file and
into the current state as the stager's copy without before-images.

Only where the files hold the table's schema exactly (names, order, types) on this
machine's file system; otherwise False, and the caller writes the rows (``delta_arrow``,
then Spark). Each commit carries Delta's transaction identifier (app id, version), so a
landing retried after its commit adds nothing twice, as Spark's ``txnAppId`` does.

Each added file gets statistics from its Parquet footer (row count; minimum, maximum and
NULL count of its integer, date and short string columns), so a MERGE narrowed to a batch's
keys (``merge.key_bounds``) skips it by them, as it skips files Spark wrote."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from snapshotter.sinks.spark.files import place_file
from snapshotter.sinks.spark.formats.staged_arrow import as_they_are, local_path
from snapshotter.sinks.spark.types import BATCH

MAX_STAT_TEXT = 32  # longer strings get no statistics (Spark truncates them; we leave out)


def _value(kind: pa.DataType, value: Any) -> Any:
    """A footer statistic as Delta's statistics JSON has it (None: left out)."""
    if pa.types.is_integer(kind):
        return int(value)
    if pa.types.is_date32(kind) and isinstance(value, date):
        return value.isoformat()
    if pa.types.is_string(kind):
        text = value.decode() if isinstance(value, bytes) else str(value)
        return text if len(text) <= MAX_STAT_TEXT else None
    return None


def stats(path: Path) -> str:
    """Delta's ``stats`` of the Parquet file ``path``, from its footer."""
    footer = pq.ParquetFile(path).metadata
    schema = footer.schema.to_arrow_schema()
    low: dict[str, Any] = {}
    high: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for index, field in enumerate(schema):
        if not (
            pa.types.is_integer(field.type)
            or pa.types.is_date32(field.type)
            or pa.types.is_string(field.type)
        ):
            continue
        lows, highs, count = [], [], 0
        for group in range(footer.num_row_groups):
            column = footer.row_group(group).column(index)
            found = column.statistics
            if found is None or found.null_count is None:
                break
            count += found.null_count
            if found.has_min_max:
                lows.append(_value(field.type, found.min))
                highs.append(_value(field.type, found.max))
        else:
            nulls[field.name] = count
            if lows and None not in lows and None not in highs:
                low[field.name], high[field.name] = min(lows), max(highs)
    return json.dumps(
        {"numRecords": footer.num_rows, "minValues": low, "maxValues": high, "nullCount": nulls}
    )


def _add(table: str, files: Sequence[Path]) -> list[Any]:
    """The files linked into the table's directory, as AddActions."""
    from deltalake.transaction import AddAction

    local = pafs.LocalFileSystem()
    actions = []
    for source in files:
        name = f"snapshotter-{uuid.uuid4().hex}.parquet"
        place_file(local, source, table, name)
        actions.append(
            AddAction(
                path=name,
                size=source.stat().st_size,
                partition_values={},
                modification_time=int(time.time() * 1000),
                data_change=True,
                stats=stats(source),
            )
        )
    return actions


def append_files(location: str, files: Sequence[Path], app_id: str, version: int) -> bool:
    """The ``files`` added to the Delta table at ``location`` as transaction ``version`` of
    ``app_id`` (nothing when the table holds that version already). False: not done (not a
    local table, or files of another schema)."""
    from deltalake import CommitProperties, DeltaTable, Transaction

    path = local_path(location)
    if path is None or not files or not (Path(path) / "_delta_log").is_dir():
        return False
    table = DeltaTable(path)
    if not as_they_are(files, pa.schema(table.schema().to_arrow())):
        return False
    done = table.transaction_version(app_id)
    if done is not None and done >= version:
        return True
    table.create_write_transaction(
        _add(path, files),
        mode="append",
        schema=table.schema(),
        commit_properties=CommitProperties(app_transactions=[Transaction(app_id, version)]),
    )
    return True


def last_batch(location: str) -> int | None:
    """The highest ``__batch`` of the changelog at ``location``, from its files' statistics
    (0: no file); None when some file has none for it (then nobody knows without a scan)."""
    from deltalake import DeltaTable

    path = local_path(location)
    if path is None or not (Path(path) / "_delta_log").is_dir():
        return None
    actions = pa.table(DeltaTable(path).get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return 0
    column = f"max.{BATCH}"
    if column not in actions.column_names or actions.column(column).null_count:
        return None
    return int(max(actions.column(column).to_pylist()))

"""Schema changes while streaming (``[sink] schema_changes``): a batch whose columns differ
from the landed table's (a column added, dropped or widened at the source after the table
was first landed) is compared with it before it lands, and the change is

* refused (``"fail"``): the landing stops with ``SchemaChangeRefused`` before it writes
  anything, so the batch stays staged and lands once the setting is ``"evolve"``;
* or followed (``"evolve"``, the default): each format evolves its tables (Iceberg and
  Delta by their own schema evolution; Parquet by ``ParquetSchemas``, below), and the change
  is recorded in the table's ``_snapshotter.json`` (``schema_changes``: the batch it landed
  with, what changed, when) so a reader of the changelog can find it.

A dropped column stays in the landed tables (rows landed after the drop hold NULL there): a
reader of rows landed before still has their values, and a table format cannot drop a
column without rewriting or hiding history.

Parquet, which has no table metadata, keeps one schema for every file of ``changelog/`` and
``current/``: a schema change rewrites the table's files in the new schema, once (their
cost, for a rare event), so any plain reader reads the directory with its default options
(Spark refuses int and bigint files in one read, pyarrow reads the first file's schema).
A crash during that rewrite is finished by the next landing (``rewrite_pending``).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql.pandas.types import from_arrow_type
from pyspark.sql.types import DataType, StructType

from snapshotter.sinks.spark.files import parquet_files
from snapshotter.sinks.spark.formats.staged import SchemaChangeError, read_staged, widens
from snapshotter.sinks.spark.types import RESERVED_COLUMNS

if TYPE_CHECKING:
    from signals.names import TableId
    from snapshotter.sinks.spark.lander import Lander, TableMeta
    from snapshotter.sinks.spark.staging import StagedTable

log = logging.getLogger(__name__)

Mode = Literal["evolve", "fail"]
Kind = Literal["add", "drop", "widen"]


class SchemaChangeRefused(RuntimeError):
    """A schema change reached a table landed with ``schema_changes = "fail"``."""


@dataclass(frozen=True)
class Change:
    kind: Kind
    column: str
    before: str | None  # the landed type (None: added)
    after: str | None  # the staged type (None: dropped)

    def describe(self) -> str:
        if self.kind == "add":
            return f"column {self.column} {self.after} added"
        if self.kind == "drop":
            return f"column {self.column} dropped"
        return f"column {self.column} changed from {self.before} to {self.after}"


def columns_of(schema: StructType) -> dict[str, DataType]:
    """The data columns of a Spark schema (meta columns, and the before-image that follows
    the data columns, left out)."""
    return {f.name: f.dataType for f in schema.fields if f.name not in RESERVED_COLUMNS}


def arrow_columns(schema: pa.Schema) -> dict[str, DataType]:
    """``columns_of`` for an Arrow schema (a staged file's, a Parquet changelog file's)."""
    return {f.name: spark_type(f.type) for f in schema if f.name not in RESERVED_COLUMNS}


def spark_type(arrow: pa.DataType) -> DataType:
    """The Spark type Spark reads a staged Parquet column of type ``arrow`` as: a timestamp
    without a time zone is TIMESTAMP_NTZ (``from_arrow_type``'s default says TIMESTAMP, which
    made every tz-naive column look changed against the landed table)."""
    return from_arrow_type(arrow, prefer_timestamp_ntz=True)


def dropped(meta: TableMeta) -> set[str]:
    """The columns recorded as dropped and not added again since."""
    last: dict[str, str] = {}
    for entry in meta.schema_changes:
        last[entry["column"]] = entry["change"]
    return {c for c, kind in last.items() if kind == "drop"}


def diff(
    landed: Mapping[str, DataType], staged: Mapping[str, DataType], gone: set[str]
) -> list[Change]:
    """What changed from the landed columns to the staged ones; ``gone``: columns already
    recorded as dropped (kept in the landed table, so not dropped again)."""
    changes: list[Change] = []
    for name, kind in staged.items():
        was = landed.get(name)
        if was is None or name in gone:
            changes.append(Change("add", name, None, kind.simpleString()))
        elif was.simpleString() != kind.simpleString() and not widens(kind, was):
            changes.append(Change("widen", name, was.simpleString(), kind.simpleString()))
    for name, was in landed.items():
        if name not in staged and name not in gone:
            changes.append(Change("drop", name, was.simpleString(), None))
    return changes


def check(
    table: TableId,
    meta: TableMeta,
    landed: Mapping[str, DataType] | None,
    staged: Sequence[Mapping[str, DataType]],
    mode: Mode,
    batch: int,
) -> list[Change]:
    """The changes the staged files of a landing (oldest first, starting at ``batch``) bring
    to the landed table (None: nothing landed yet: to the landing's first file), refused
    under ``"fail"``, recorded in ``meta`` under ``"evolve"``. A type change that is not a
    widening is refused either way (no format can follow it)."""
    if landed is None:
        if not staged:
            return []
        landed, staged = staged[0], staged[1:]
    found: list[Change] = []
    unfollowed = False  # a type change no format can follow
    have = dict(landed)
    gone = dropped(meta)
    for columns in staged:
        for change in diff(have, columns, gone):
            found.append(change)
            if change.kind == "drop":
                gone.add(change.column)
                continue
            if change.kind == "widen" and not widens(have[change.column], columns[change.column]):
                unfollowed = True
            gone.discard(change.column)
            have[change.column] = columns[change.column]
    if not found:
        return []
    what = "; ".join(c.describe() for c in found)
    if unfollowed:
        raise SchemaChangeError(
            f"{table}: {what} at the source: only int to bigint, float to double and a "
            "decimal's precision can change while landing; land the table into another path"
        )
    if mode == "fail":
        raise SchemaChangeRefused(
            f'{table}: {what} at the source, and [sink] schema_changes = "fail": set it to '
            '"evolve" and resume to land the change, or snapshot the table into another path'
        )
    at = datetime.now(UTC).isoformat(timespec="seconds")
    for change in found:
        meta.schema_changes.append(
            {
                "batch": batch,
                "change": change.kind,
                "column": change.column,
                "from": change.before,
                "to": change.after,
                "at": at,
            }
        )
    log.warning("%s: %s at the source; the landed tables follow from batch %d", table, what, batch)
    return found


# ---------------------------------------------------------------------- Parquet


def unified(landed: pa.Schema, staged: pa.Schema) -> pa.Schema:
    """The landed schema evolved to hold ``staged`` too: its new columns (and struct fields)
    added at the end, widened types taken, columns it lacks kept."""
    fields = {f.name: f for f in landed}
    for field in staged:
        have = fields.get(field.name)
        if have is None:
            fields[field.name] = field.with_nullable(True)
        elif have.type != field.type:
            fields[field.name] = have.with_type(_unified_type(have.type, field.type))
    return pa.schema(list(fields.values()), metadata=landed.metadata)


def _unified_type(have: pa.DataType, staged: pa.DataType) -> pa.DataType:
    if pa.types.is_struct(have) and pa.types.is_struct(staged):
        return pa.struct(list(unified(pa.schema(list(have)), pa.schema(list(staged)))))
    if widens(spark_type(have), spark_type(staged)):
        return staged
    return have  # narrower at the source than landed: kept wide (cast on the way in)


def conform(rows: pa.Table, target: pa.Schema) -> pa.Table:
    """``rows`` in the ``target`` schema: columns it lacks NULL, types widened."""
    if rows.schema.equals(target, check_metadata=False):
        return rows
    columns = [_conform_array(rows, f) for f in target]
    return pa.Table.from_arrays(columns, schema=target)


def _conform_array(rows: pa.Table | pa.StructArray, field: pa.Field) -> pa.Array:
    names = rows.column_names if isinstance(rows, pa.Table) else [f.name for f in rows.type]
    if field.name not in names:
        return pa.nulls(len(rows), field.type)
    column = rows[field.name] if isinstance(rows, pa.Table) else rows.field(field.name)
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if array.type == field.type:
        return array
    if pa.types.is_struct(field.type):
        children = [_conform_array(array, child) for child in field.type]
        return pa.StructArray.from_arrays(children, fields=list(field.type), mask=array.is_null())
    return array.cast(field.type)


def rewrite(fs: pafs.FileSystem, directory: str, target: pa.Schema) -> int:
    """Every data file under ``directory`` not of ``target`` rewritten in it (renamed over
    itself: a reader sees the old file or the new); how many were."""
    done = 0
    for path in parquet_files(fs, directory):
        with fs.open_input_file(path) as f:
            schema = pq.read_schema(f)
        if schema.equals(target, check_metadata=False):
            continue
        with fs.open_input_file(path) as f:
            rows = pq.read_table(f)
        head, name = path.rsplit("/", 1)
        hidden = f"{head}/.{name}.{uuid.uuid4().hex[:8]}.schema"
        pq.write_table(conform(rows, target), hidden, filesystem=fs)
        fs.move(hidden, path)
        done += 1
    return done


class ParquetSchemas:
    """Per Parquet table the landed schema (of every file of ``changelog/``; ``current/``
    holds it without the before-image), read from the newest changelog file once."""

    def __init__(self, fs: pafs.FileSystem) -> None:
        self._fs = fs
        self._schemas: dict[TableId, pa.Schema | None] = {}

    def landed(self, table: TableId, changelog: str) -> pa.Schema | None:
        if table not in self._schemas:
            files = sorted(p for p in parquet_files(self._fs, changelog) if "/batch-" in p)
            schema = None
            if files:
                with self._fs.open_input_file(files[-1]) as f:
                    schema = pq.read_schema(f)
            self._schemas[table] = schema
        return self._schemas[table]

    def evolve(
        self,
        table: TableId,
        meta: TableMeta,
        changelog: str,
        current: str,
        staged: Sequence[pa.Schema],
        save: Callable[[], None],
    ) -> pa.Schema | None:
        """The schema a landing of ``staged`` files writes in (None: each file's own, the
        table's first landing); the table's files rewritten in it when it changed (or a
        rewrite was cut short by a crash)."""
        landed = self.landed(table, changelog)
        found = [landed] if landed is not None else []
        found += staged
        if not found:
            return None
        target = found[0]
        for schema in found[1:]:
            target = unified(target, schema)
        self._schemas[table] = target
        if landed is None or (
            target.equals(landed, check_metadata=False) and not meta.rewrite_pending
        ):
            return target
        meta.rewrite_pending = True
        save()  # a crash during the rewrite: the next landing finishes it
        rewritten = rewrite(self._fs, changelog, target)
        before = "__before"
        state = target.remove(target.get_field_index(before)) if before in target.names else target
        rewritten += rewrite(self._fs, current, state)
        meta.rewrite_pending = False
        save()
        log.info("%s: %d landed file(s) rewritten in the new schema", table, rewritten)
        return target


# ---------------------------------------------------------------------- the lander's hook

HISTORY = "schema_changes.jsonl"  # beside _snapshotter.json: Spark reads no ``_`` file


def publish(fs: pafs.FileSystem, path: str, meta: TableMeta) -> None:
    """The table's recorded changes as JSON lines at ``path`` (replaced whole, atomically),
    so ``spark.read.json`` lists them: ``_snapshotter.json`` is hidden from Spark's readers
    by its name."""
    text = "".join(json.dumps(entry) + "\n" for entry in meta.schema_changes)
    head, name = path.rsplit("/", 1)
    hidden = f"{head}/.{name}.tmp"
    with fs.open_output_stream(hidden) as f:
        f.write(text.encode("utf-8"))
    fs.move(hidden, path)


def _staged_schema(path: Path) -> pa.Schema | None:
    """A staged file's schema (of a staged directory's first file: the executor-read path)."""
    first = path if not path.is_dir() else next(iter(sorted(path.rglob("*.parquet"))), None)
    return None if first is None else pq.read_schema(first)


def before_landing(
    lander: Lander, table: TableId, meta: TableMeta, parts: Sequence[tuple[int, StagedTable]]
) -> pa.Schema | None:
    """Before a landing of ``parts``: its schema changes checked and recorded (``check``),
    and for Parquet the table's files brought to the schema the landing writes in, which is
    returned (None: not Parquet, or the table's first landing)."""
    staged = [s for s in (_staged_schema(p.file) for _, p in parts) if s is not None]
    batch = parts[0][0]
    if lander.format == "parquet":
        changelog = lander._fs_path(table, "changelog")
        landed = lander.parquet_schemas.landed(table, changelog)
        columns = None if landed is None else arrow_columns(landed)
    elif lander.format == "delta":
        assert lander._delta is not None
        landed_schema = lander._delta.schema(f"{lander.table_path(table)}/changelog")
        columns = None if landed_schema is None else columns_of(landed_schema)
    else:
        name = lander.iceberg.changelog_name(table)
        exists = lander.spark.catalog.tableExists(name)
        columns = columns_of(lander.spark.table(name).schema) if exists else None
    mode = lander.schema_changes
    found = check(table, meta, columns, [arrow_columns(s) for s in staged], mode, batch)
    if lander._delta is not None and any(c.kind == "widen" for c in found):
        files = [str(p.file) for _, p in parts]
        lander._delta.widen(lander.table_path(table), read_staged(lander.spark, files).schema)
    if found:
        lander._save_meta(table, meta)  # recorded even if the landing fails midway
        publish(lander._fs, lander._fs_path(table, HISTORY), meta)
    if lander.format != "parquet":
        return None
    return lander.parquet_schemas.evolve(
        table,
        meta,
        lander._fs_path(table, "changelog"),
        lander._fs_path(table, "current"),
        staged,
        lambda: lander._save_meta(table, meta),
    )

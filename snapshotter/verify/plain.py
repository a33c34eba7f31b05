"""What plain readers of a landed table's ``current/`` read, compared with the source table
(``snapshotter verify``, Spark sink).

``Lander.current_state`` merges the base with the changelog tail and reads only the base the
metadata names; a reader that knows nothing of snapshotter reads the directory as it is.
Why: after a crash inside a compaction, before this check, ``spark.read.parquet(current)``
read a 20,000-row table as 40,000 rows (two bases) while verify, reading the merged view,
said converged; and pyarrow and pandas read 0 rows of every table (they skip directories
whose names start with ``_``). So verify also reads ``current/`` the way they do, with their
default options:

* ``spark.read.parquet(<table>/current)`` (Delta: Spark's Delta reader is what
  ``current_state`` reads already; ``deltalake``, when installed, is read like pyarrow);
* ``pyarrow.parquet.read_table(<table>/current)``: its dataset (hive partitioning, names
  starting with ``.`` or ``_`` skipped), streamed in record batches;
* ``pyarrow.dataset.dataset(<table>/current)`` with its defaults (no partitioning);
* ``pandas.read_parquet(<table>/current)`` (when pandas is installed): pandas reads through
  pyarrow's discovery, so its rows are pyarrow's; it reads the key columns only, to count
  rows and keys seen twice (a whole table in pandas would cost memory verify does not need).

Spark's and pyarrow's rows are summarised per key-hash bucket as the source is
(``verify.spark``), and the differing buckets are narrowed down to keys: keys read twice,
keys the table does not have (a deleted row back), keys missing, rows that differ. A column
the table does not have (a partition directory's name taken for a column) or lacks is a
difference too. Where the cause is known it is said: a base no metadata names (a compaction
a crash cut short), a base of an older layout, or a changelog tail not compacted yet (the
plain view lags the landed state: expected while an engine runs, folded in when it is idle
or stops).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from signals.names import TableId
from snapshotter.sinks.spark import bases
from snapshotter.sinks.spark.types import META_COLUMNS
from snapshotter.verify.row_hash import bucket_of, hash_rows
from snapshotter.verify.rows import as_json_row, canonical
from snapshotter.verify.sides import KEY_HASH, ROW_HASH, LandedSide, Summary, narrowable

if TYPE_CHECKING:
    from snapshotter.sinks.spark.lander import Lander, TableMeta

SPARK = "spark.read.parquet"
PYARROW = "pyarrow.parquet.read_table"
PYARROW_DATASET = "pyarrow.dataset"
PANDAS = "pandas.read_parquet"
DELTALAKE = "deltalake"
SPARK_SQL = "spark.table"
PYICEBERG = "pyiceberg"


class _Scannable(Protocol):
    """What ``_ArrowSide`` reads: a pyarrow dataset, or an Iceberg table through pyiceberg."""

    @property
    def schema(self) -> pa.Schema: ...

    def to_batches(self, columns: list[str]) -> Iterator[pa.RecordBatch]: ...


class _DeltaScan:
    """A Delta table read by deltalake (delta-rs: Rust, no Spark) through its SQL engine:
    ``DeltaTable.to_pyarrow_dataset`` refuses tables with deletion vectors, its
    ``QueryBuilder`` reads them."""

    def __init__(self, uri: str) -> None:
        from deltalake import DeltaTable

        self.table = DeltaTable(uri)
        self.schema: pa.Schema = pa.schema(self.table.schema().to_arrow())

    def to_batches(self, columns: list[str]) -> Iterator[pa.RecordBatch]:
        from deltalake import QueryBuilder

        names = ", ".join('"' + c.replace('"', '""') + '"' for c in columns)
        found = QueryBuilder().register("t", self.table).execute(f"SELECT {names} FROM t")
        for batch in pa.RecordBatchReader.from_stream(found):
            # Its SQL engine gives string and binary views: the types hashed here are the
            # plain ones (the same values).
            yield batch.cast(pa.schema([_without_views(f) for f in batch.schema]))


def _without_views(field: pa.Field) -> pa.Field:
    if pa.types.is_string_view(field.type):
        return field.with_type(pa.string())
    if pa.types.is_binary_view(field.type):
        return field.with_type(pa.binary())
    return field


class _IcebergScan:
    """An Iceberg table read by pyiceberg from its metadata file (no Spark, no catalog)."""

    def __init__(self, metadata: str) -> None:
        from pyiceberg.table import StaticTable

        self.table = StaticTable.from_metadata(metadata)
        self.schema: pa.Schema = self.table.schema().as_arrow()

    def to_batches(self, columns: list[str]) -> Iterator[pa.RecordBatch]:
        reader = self.table.scan(selected_fields=tuple(columns)).to_arrow_batch_reader()
        yield from reader


@dataclass(frozen=True, slots=True)
class PlainRead:
    """What one plain reader read of ``current/``; ``problem`` (one line) when it is not the
    source table."""

    reader: str
    rows: int | None  # None: the read failed
    problem: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"reader": self.reader, "rows": self.rows, "problem": self.problem}


@dataclass(frozen=True, slots=True)
class PlainCheck:
    """Every plain reader's read of one table's ``current/``."""

    reads: tuple[PlainRead, ...]
    cause: str | None = None  # why the plain view differs, when known
    notes: tuple[str, ...] = ()  # readers not checked, and why

    @property
    def ok(self) -> bool:
        return all(r.problem is None for r in self.reads)

    def lines(self) -> list[str]:
        out = [f"  plain read: {r.reader}: {r.problem}" for r in self.reads if r.problem]
        if out and self.cause:
            out.append(f"  plain read: why: {self.cause}")
        out.extend(f"  note: {n}" for n in self.notes)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "readers": [r.to_json() for r in self.reads],
            "cause": self.cause,
            "notes": list(self.notes),
        }


class _ArrowSide:
    """A pyarrow dataset of ``current/`` hashed in this process, batch by batch, its columns
    in the source's order (a column it lacks reads as NULL)."""

    def __init__(self, dataset: _Scannable, names: Sequence[str], keys: Sequence[str]) -> None:
        self.dataset = dataset
        self.names = list(names)
        self.keys = list(keys)
        self.present = [n for n in names if n in dataset.schema.names]

    def _batches(self) -> Iterator[pa.Table]:
        for batch in self.dataset.to_batches(columns=self.present):
            if batch.num_rows:
                yield pa.Table.from_arrays(
                    [
                        batch.column(n) if n in self.present else pa.nulls(batch.num_rows)
                        for n in self.names
                    ],
                    names=self.names,
                )

    def summary(self) -> Summary:
        summary = Summary()
        for data in self._batches():
            summary.add_rows(*hash_rows(data, self.keys))
        return summary

    def rows_in(self, buckets: Sequence[int]) -> pa.Table:
        wanted = pa.array(sorted(buckets), pa.int64())
        parts = []
        for data in self._batches():
            key_hash, row_hash = hash_rows(data, self.keys)
            hashed = data.append_column(KEY_HASH, key_hash).append_column(ROW_HASH, row_hash)
            parts.append(hashed.filter(pc.is_in(bucket_of(key_hash), value_set=wanted)))
        if not parts:
            return pa.table(
                {KEY_HASH: pa.array([], pa.int64()), ROW_HASH: pa.array([], pa.int64())}
            )
        return pa.concat_tables(parts, promote_options="permissive")


class PlainReads:
    """Reads one table's ``current/`` as plain readers do and compares each with the source
    (its bucket summary, and its rows of given buckets)."""

    def __init__(
        self,
        lander: Lander,
        table: TableId,
        meta: TableMeta,
        names: Sequence[str],
        keys: Sequence[str],
        *,
        max_keys: int,
    ) -> None:
        from snapshotter.sinks.spark.lander import table_dir_name

        self.lander = lander
        self.table = table
        self.meta = meta
        self.names = list(names)
        self.keys = list(keys)
        self.max_keys = max_keys
        self.uri = f"{lander.table_path(table)}/current"
        self.fs, root = pafs.FileSystem.from_uri(lander.root)
        self.path = "/".join([root.rstrip("/"), table_dir_name(table), "current"])
        self._arrow_columns: list[str] = []  # what pyarrow's dataset of current/ has

    def check(
        self, source: Summary, source_rows_in: Callable[[Sequence[int]], pa.Table]
    ) -> PlainCheck:
        """``source``: the source's bucket summary; ``source_rows_in(buckets)``: its rows
        (data columns and hashes) of those buckets, fetched once for every reader."""
        sides, reads, notes = self._sides()
        summaries = _all_beside([side.summary for _, side, _ in sides])
        chosen: dict[str, list[int]] = {}
        for (reader, _, _), summary in zip(sides, summaries, strict=True):
            differing = source.differing(summary)
            if differing:
                chosen[reader] = narrowable(differing, source, summary, self.max_keys)
        wanted = sorted({b for picked in chosen.values() for b in picked})
        ours = source_rows_in(wanted) if wanted else None
        for (reader, side, columns), summary in zip(sides, summaries, strict=True):
            problems = list(columns)
            if reader in chosen and ours is not None:
                picked = chosen[reader]
                differing = source.differing(summary)
                mine = ours.filter(
                    pc.is_in(bucket_of(ours[KEY_HASH]), pa.array(picked, pa.int64()))
                )
                problems.append(
                    _describe(mine, side.rows_in(picked), self.keys, len(picked), len(differing))
                )
            rows = summary.rows
            problem = None
            if problems:
                problem = f"reads {rows} rows for the table's {source.rows}: " + "; ".join(problems)
            reads.append(PlainRead(reader, rows, problem))
        if self.lander.format == "parquet":
            reads.append(self._pandas(source.rows, notes))
        check = PlainCheck(tuple(reads), None, tuple(notes))
        return check if check.ok else PlainCheck(check.reads, self._cause(), check.notes)

    # --- the readers ----------------------------------------------------------------------

    def _sides(
        self,
    ) -> tuple[list[tuple[str, LandedSide | _ArrowSide, list[str]]], list[PlainRead], list[str]]:
        """The readers to summarise (name, side, column problems), reads that failed, notes."""
        sides: list[tuple[str, LandedSide | _ArrowSide, list[str]]] = []
        failed: list[PlainRead] = []
        notes: list[str] = []
        if self.lander.format == "parquet":
            try:
                df = self.lander.spark.read.parquet(self.uri)
            except Exception as exc:  # a plain reader fails here too: that is the finding
                failed.append(PlainRead(SPARK, None, f"fails: {_first_line(exc)}"))
            else:
                columns = self._columns(df.columns)
                sides.append((SPARK, LandedSide(df, self.names, self.keys), columns))
            dataset = self._dataset()
            if isinstance(dataset, PlainRead):
                failed.append(dataset)
            else:
                self._arrow_columns = list(dataset.schema.names)
                sides.append(self._arrow_side(PYARROW, dataset))
            # pyarrow.dataset.dataset(current) with its own defaults: no partitioning.
            plain = self._dataset(PYARROW_DATASET, None)
            if isinstance(plain, PlainRead):
                failed.append(plain)
            else:
                sides.append(self._arrow_side(PYARROW_DATASET, plain))
        elif self.lander.format == "iceberg":
            self._iceberg_sides(sides, failed, notes)
        else:
            # Spark's Delta reader is what the landed state is read with; deltalake (Rust,
            # no Spark) when installed.
            try:
                import deltalake  # noqa: F401
            except ImportError:
                notes.append("deltalake is not installed: only Spark's Delta reader was checked")
            else:
                try:
                    scan = _DeltaScan(self.uri)
                except Exception as exc:
                    failed.append(PlainRead(DELTALAKE, None, f"fails: {_first_line(exc)}"))
                else:
                    columns = self._columns(scan.schema.names)
                    sides.append((DELTALAKE, _ArrowSide(scan, self.names, self.keys), columns))
        return sides, failed, notes

    def _iceberg_sides(
        self,
        sides: list[tuple[str, LandedSide | _ArrowSide, list[str]]],
        failed: list[PlainRead],
        notes: list[str],
    ) -> None:
        """Iceberg: the table through the catalog with Spark SQL, and through pyiceberg from
        its newest metadata file (no Spark, no catalog)."""
        tables = self.lander.iceberg
        name = tables.current_name(self.table)
        try:
            df = self.lander.spark.table(name)
        except Exception as exc:
            failed.append(PlainRead(f"{SPARK_SQL}({name})", None, f"fails: {_first_line(exc)}"))
        else:
            sides.append((f"{SPARK_SQL}({name})", LandedSide(df, self.names, self.keys), []))
        try:
            metadata = tables.metadata_location(self.table)
            scan = None if metadata is None else _IcebergScan(metadata)
        except ImportError:
            notes.append("pyiceberg is not installed: only Spark's Iceberg reader was checked")
        except Exception as exc:
            failed.append(PlainRead(PYICEBERG, None, f"fails: {_first_line(exc)}"))
        else:
            if scan is None:
                failed.append(PlainRead(PYICEBERG, None, f"fails: no table {name}"))
            else:
                columns = self._columns(scan.schema.names)
                sides.append((PYICEBERG, _ArrowSide(scan, self.names, self.keys), columns))

    def _arrow_side(
        self, reader: str, dataset: ds.Dataset
    ) -> tuple[str, LandedSide | _ArrowSide, list[str]]:
        files = getattr(dataset, "files", None)
        columns = ["no data file found"] if files == [] else self._columns(dataset.schema.names)
        return (reader, _ArrowSide(dataset, self.names, self.keys), columns)

    def _dataset(
        self, reader: str = PYARROW, partitioning: str | None = "hive"
    ) -> ds.Dataset | PlainRead:
        """``current/`` as ``pyarrow.parquet.read_table`` discovers it (its defaults: hive
        partitioning), or ``pyarrow.dataset.dataset`` (none)."""
        try:
            return ds.dataset(
                self.path, filesystem=self.fs, format="parquet", partitioning=partitioning
            )
        except Exception as exc:
            return PlainRead(reader, None, f"fails: {_first_line(exc)}")

    def _pandas(self, source_rows: int, notes: list[str]) -> PlainRead:
        """pandas reads through pyarrow's discovery: its rows are pyarrow's, compared in full
        above; here, its count and its keys (only the key columns are read)."""
        try:
            import pandas as pd
        except ImportError:
            notes.append("pandas is not installed: pandas.read_parquet was not checked")
            return PlainRead(PANDAS, None)
        # Only the key columns, when pyarrow sees them (else what it sees: maybe nothing).
        keys = self.keys if set(self.keys) <= set(self._arrow_columns) else None
        try:
            frame = pd.read_parquet(self.path, filesystem=self.fs, columns=keys)
        except Exception as exc:
            return PlainRead(PANDAS, None, f"fails: {_first_line(exc)}")
        rows = len(frame)
        twice = int(frame.duplicated().sum()) if keys else 0
        problems = [f"{_count(twice, 'key')} read more than once"] if twice else []
        if rows != source_rows:
            problems.insert(0, f"reads {rows} rows for the table's {source_rows}")
        return PlainRead(PANDAS, rows, "; ".join(problems) or None)

    def _columns(self, read: Sequence[str]) -> list[str]:
        """What is wrong with a reader's columns (meta columns aside)."""
        data = [c for c in read if c not in META_COLUMNS]
        problems = []
        lacking = [n for n in self.names if n not in data]
        if lacking:
            problems.append(f"no column(s) {', '.join(lacking)}")
        # A column dropped at the source stays in the landed table (recorded as dropped).
        from snapshotter.sinks.spark.formats.schema_changes import dropped

        gone = dropped(self.meta)
        extra = [c for c in data if c not in self.names and c not in gone]
        if extra:
            problems.append(
                f"column(s) {', '.join(extra)} the table does not have (a directory name "
                "read as a partition?)"
            )
        return problems

    def _cause(self) -> str | None:
        """Why a plain reader's view differs, as far as the layout tells."""
        from snapshotter.sinks.spark.lander import base_name

        if self.lander.format != "parquet":
            return None
        named = base_name(self.meta)
        strays = bases.strays(self.fs, self.path, named)
        if strays:
            return (
                f"current/ holds {', '.join(strays)}, which the table's metadata does not name "
                "(left by a compaction a crash cut short, or one under way; the engine's next "
                "run removes it)"
            )
        if named is not None and bases.is_legacy(named):
            return (
                f"its base current/{named} is of an older layout, which pyarrow and pandas "
                "skip (a name starting with _); the engine's next run rewrites it"
            )
        if self.lander.compaction_due(self.meta, idle=True):
            return (
                f"current/ lags the landed state: up to {self.meta.tail_rows} changelog rows "
                f"after batch {self.meta.covered or 0} are not compacted into its base yet "
                "(a running engine folds them in once nothing has landed for "
                "[sink] compact_idle_s, and when it stops)"
            )
        return None


def _describe(
    source: pa.Table, plain: pa.Table, keys: Sequence[str], narrowed: int, differing: int
) -> str:
    """A plain reader's rows of some buckets against the source's, by key hash: keys read
    twice, keys the table does not have, keys missing, rows that differ."""
    ours = dict(zip(source[KEY_HASH].to_pylist(), source[ROW_HASH].to_pylist(), strict=True))
    seen: dict[int, list[int]] = {}
    for key_hash, row_hash in zip(
        plain[KEY_HASH].to_pylist(), plain[ROW_HASH].to_pylist(), strict=True
    ):
        seen.setdefault(key_hash, []).append(row_hash)
    twice = [k for k, rows in seen.items() if len(rows) > 1]
    extra = [k for k in seen if k not in ours]
    missing = [k for k in ours if k not in seen]
    stale = [k for k, rows in seen.items() if len(rows) == 1 and k in ours and ours[k] != rows[0]]
    parts = []
    for found, noun, label, rows in (
        (twice, "key", "read more than once", plain),
        (extra, "key", "the table does not have (a deleted row back?)", plain),
        (missing, "key", "missing", source),
        (stale, "row", "differing from the table's", plain),
    ):
        if found:
            example = _key_text(rows, found[0], keys)
            parts.append(f"{_count(len(found), noun)} {label}, e.g. {example}")
    if narrowed < differing:
        parts.append(f"counted in {narrowed} of the {differing} differing key-hash buckets")
    return ", ".join(parts) or "rows differ"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _key_text(rows: pa.Table, key_hash: int, keys: Sequence[str]) -> str:
    match = rows.filter(pc.equal(rows[KEY_HASH], pa.scalar(key_hash, pa.int64()))).slice(0, 1)
    record = match.select(list(keys)).to_pylist()[0]
    return canonical(as_json_row(record))


def _all_beside(jobs: Sequence[Callable[[], Summary]]) -> list[Summary]:
    """The summaries side by side (Spark's in the JVM and its workers, pyarrow's here)."""
    if len(jobs) <= 1:
        return [job() for job in jobs]
    with ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="verify-plain") as pool:
        futures = [pool.submit(job) for job in jobs]
        return [f.result() for f in futures]


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]


__all__ = ["PlainCheck", "PlainRead", "PlainReads"]

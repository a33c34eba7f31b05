"""The convergence check for the Spark sink: does a landed current state equal its source table?
(``snapshotter verify`` with ``[sink] kind = "spark"``.)

Neither side is ever held whole. The source is read in key-range chunks, as the engine reads
them (``Dialect.read_chunk``: one short READ ONLY transaction each, no table lock, at most
``chunk_rows`` rows in memory), and every chunk goes through the landing's own conversion
(``row_converter`` then ``rows_to_landed``), so a source row becomes exactly the Arrow values
its READ event would have landed as. The landed side is ``Lander.current_state``, read by
Spark; and ``current/`` as plain readers read it (``verify.plain``: Spark, pyarrow, pandas),
each of which must see the source table too.

Level 1: every row gets a 64-bit *key hash* (of its key columns) and a 64-bit *row hash* (of
all its columns). Rows fall into ``BUCKETS`` buckets by key hash, and each side is summarised
per bucket as (row count, sum of row hashes mod 2**64). Equal summaries everywhere: converged.
Level 2: for the buckets that differ (as many as hold at most ``max_keys`` rows per side),
both sides fetch those rows only, and rows are matched by key: missing (in the source, not
landed), extra (landed, not in the source), or differing (per column).

Why buckets of the key-hash space and not ranges of keys: ranges only line up if both sides
order keys the same way, and they do not. MySQL's ``_ci`` (case- and accent-insensitive) and
PAD SPACE collations, and PostgreSQL's linguistic collations, order text keys as the database
compares them ('a' < 'B' < 'c'), while Spark and Python order by code point ('B' < 'a'), and
key ranges computed on one side would cut the other side's rows somewhere else. A hash of the
exact stored key value puts a row in the same bucket on both sides, whatever either orders by.

Why not Spark's own ``hash``/``xxhash64`` on one side and something else on the other: the
hash must be bit-identical on both sides, and string casts and Spark hash functions do not
exist on the Python side (nor mean the same for every type). So there is one hash function,
:func:`hash_rows`, in pure pyarrow (vectorised: no per-value Python), run by the verifier over
source chunks and by Spark's Python workers over the landed state, through an Arrow UDF
(``pyspark.sql.functions.arrow_udf``; ``DataFrame.mapInArrow`` would do as well but makes
PySpark 4.x require pandas, which this project does not install). Values are canonicalised
first, so equivalent Arrow representations hash alike (see :func:`hash_rows`).

Meaningful once the engine has caught up with the log and the table is not being written:
otherwise the table is ahead of the landed state by the writes in flight.
"""

from __future__ import annotations

import logging
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from signals.names import TableId
from snapshotter.config import Config, SparkConfig, is_uri
from snapshotter.sinks.spark.types import META_COLUMNS, landed_columns, rows_to_landed
from snapshotter.sources.base import ChunkSpec, Dialect, TableError, TableSchema
from snapshotter.verify import row_hash as hash_module
from snapshotter.verify.row_hash import BUCKETS, bucket_of, hash_rows, value_hashes
from snapshotter.verify.rows import (
    ColumnDiff,
    RowDiff,
    Verdict,
    VerifyError,
    as_json_row,
    canonical,
    verdict_json,
)

if TYPE_CHECKING:  # pyspark is imported where Spark is used: hashing and JSON need none
    from pyspark.sql import Column, DataFrame

    from snapshotter.sinks.spark.lander import Lander, TableMeta
    from snapshotter.verify.plain import PlainCheck

log = logging.getLogger(__name__)
_Ours = TypeVar("_Ours")
_Theirs = TypeVar("_Theirs")

CHUNK_ROWS = 10_000  # source rows per chunk SELECT
MAX_KEYS = 10_000  # rows fetched per side to narrow differing buckets down to keys
EXAMPLES = 5

KEY_HASH = "__verify_key_hash"
ROW_HASH = "__verify_row_hash"
_HASHES = "__verify_hashes"
_BUCKET = "__verify_bucket"


class LandedVerifyError(VerifyError):
    """A table the check cannot compare as asked; the message says why and what to do."""


# --- per-bucket summaries ---------------------------------------------------------------------

_MOD = 1 << 64


@dataclass
class Summary:
    """Per bucket: how many rows, and the sum of their row hashes modulo 2**64."""

    counts: dict[int, int] = field(default_factory=dict)
    sums: dict[int, int] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return sum(self.counts.values())

    def add(self, buckets: Sequence[int], counts: Sequence[int], sums: Sequence[int]) -> None:
        for bucket, count, total in zip(buckets, counts, sums, strict=True):
            self.counts[bucket] = self.counts.get(bucket, 0) + count
            self.sums[bucket] = (self.sums.get(bucket, 0) + total) % _MOD

    def add_rows(self, key_hash: pa.Array, row_hash: pa.Array) -> None:
        """Rows of one chunk (grouped in Arrow; uint64 sums wrap modulo 2**64)."""
        grouped = (
            pa.table({"b": bucket_of(key_hash), "r": row_hash.view(pa.uint64())})
            .group_by("b")
            .aggregate([("r", "count"), ("r", "sum")])
        )
        self.add(
            grouped["b"].to_pylist(), grouped["r_count"].to_pylist(), grouped["r_sum"].to_pylist()
        )

    def differing(self, other: Summary) -> list[int]:
        buckets = set(self.counts) | set(other.counts)
        return sorted(
            b
            for b in buckets
            if self.counts.get(b, 0) != other.counts.get(b, 0)
            or self.sums.get(b, 0) != other.sums.get(b, 0)
        )


def narrowable(
    differing: Sequence[int], source: Summary, landed: Summary, max_keys: int
) -> list[int]:
    """The differing buckets, in order, that together hold at most ``max_keys`` rows per side
    (at least one bucket)."""
    chosen: list[int] = []
    source_rows = landed_rows = 0
    for bucket in differing:
        source_rows += source.counts.get(bucket, 0)
        landed_rows += landed.counts.get(bucket, 0)
        if chosen and max(source_rows, landed_rows) > max_keys:
            break
        chosen.append(bucket)
    return chosen


# --- the source side --------------------------------------------------------------------------


def landed_data_schema(schema: TableSchema) -> pa.Schema:
    """The data columns of the table as they land (no meta columns)."""
    return pa.schema([pa.field(c.name, c.landed_type) for c in landed_columns(schema)])


def source_chunks(
    dialect: Dialect, schema: TableSchema, key_columns: Sequence[str], chunk_rows: int
) -> Iterator[pa.Table]:
    """The table's rows as they would land, in key-range chunks of at most ``chunk_rows``:
    each chunk is its own short read (as the engine's), so no lock is held across the table,
    and only one chunk is in memory at a time."""
    upto = dialect.max_key(schema, key_columns, None)
    if upto is None:
        return
    convert = dialect.row_converter(schema)
    data_schema = landed_data_schema(schema)
    after = None
    while True:
        spec = ChunkSpec(schema, tuple(key_columns), after, upto, None, chunk_rows)
        chunk = dialect.read_chunk(spec)
        if chunk.last_key is None:
            return
        rows = chunk.rows.to_pylist()
        if convert is not None:
            rows = [convert(row) for row in rows]
        yield pa.Table.from_arrays(rows_to_landed(schema, rows), schema=data_schema)
        if chunk.rows.num_rows < chunk_rows:
            return
        after = chunk.last_key


def summarise_source(
    dialect: Dialect, schema: TableSchema, key_columns: Sequence[str], chunk_rows: int
) -> Summary:
    summary = Summary()
    for data in source_chunks(dialect, schema, key_columns, chunk_rows):
        key_hash, row_hash = hash_rows(data, key_columns)
        summary.add_rows(key_hash, row_hash)
    return summary


def source_rows_in(
    dialect: Dialect,
    schema: TableSchema,
    key_columns: Sequence[str],
    buckets: Sequence[int],
    chunk_rows: int,
) -> pa.Table:
    """The source rows (landed data columns and both hashes) whose key falls in ``buckets``."""
    wanted = pa.array(sorted(buckets), pa.int64())
    parts = []
    for data in source_chunks(dialect, schema, key_columns, chunk_rows):
        key_hash, row_hash = hash_rows(data, key_columns)
        keep = pc.is_in(bucket_of(key_hash), value_set=wanted)
        hashed = data.append_column(KEY_HASH, key_hash).append_column(ROW_HASH, row_hash)
        parts.append(hashed.filter(keep))
    if not parts:
        data_schema = landed_data_schema(schema)
        hashes = [pa.field(KEY_HASH, pa.int64()), pa.field(ROW_HASH, pa.int64())]
        return pa.schema([*data_schema, *hashes]).empty_table()
    return pa.concat_tables(parts)


# --- the landed side (Spark) ------------------------------------------------------------------


def _hash_udf(names: Sequence[str], key_columns: Sequence[str]) -> Callable[[Column], Column]:
    """An Arrow UDF: a struct of the data columns -> struct<k, r> of their two hashes."""
    from pyspark import cloudpickle
    from pyspark.sql.pandas.functions import ArrowUDFType, arrow_udf

    # Ship the hash (and this closure's module) by value: executors of a cluster (or a
    # Spark Connect server) need pyarrow, not snapshotter.
    cloudpickle.register_pickle_by_value(hash_module)  # type: ignore[no-untyped-call]
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]
    columns, keys = list(names), list(key_columns)

    def hashes(rows: pa.Array) -> pa.Array:
        data = pa.Table.from_arrays(rows.flatten(), names=columns)
        key, row = hash_rows(data, keys)
        return pa.StructArray.from_arrays([key, row], names=["k", "r"])

    with warnings.catch_warnings():
        # The kind is given (arrow_udf's typed overloads need it); PySpark would rather read
        # it from type hints, and warns.
        warnings.simplefilter("ignore", UserWarning)
        udf = arrow_udf(hashes, "struct<k: bigint, r: bigint>", ArrowUDFType.SCALAR)
    return udf


class LandedSide:
    """The landed current state's data columns, in the source's column order, with hashes."""

    def __init__(self, state: DataFrame, names: Sequence[str], key_columns: Sequence[str]):
        from pyspark.sql import functions as F

        from snapshotter.sinks.spark.lander import quote

        self.names = list(names)
        present = set(state.columns)
        # A source column the landed state lacks compares as NULL (and is noted).
        data = state.select(
            *[F.col(quote(n)) if n in present else F.lit(None).alias(n) for n in names]
        )
        hashes = _hash_udf(names, key_columns)(F.struct(*[F.col(quote(n)) for n in names]))
        # The hashes are computed once per row; the bucket is their low bits, as bucket_of.
        self._hashed = data.withColumn(_HASHES, hashes).withColumn(
            _BUCKET, F.col(f"{_HASHES}.k").bitwiseAND(F.lit(BUCKETS - 1))
        )

    def summary(self) -> Summary:
        """Counts and row-hash sums per bucket, aggregated by Spark. Spark sums longs with
        overflow checks, so the 64-bit hashes are summed as two 32-bit halves."""
        from pyspark.sql import functions as F

        row = F.col(f"{_HASHES}.r")
        grouped = self._hashed.groupBy(_BUCKET).agg(
            F.count(F.lit(1)).alias("n"),
            F.sum(F.shiftrightunsigned(row, 32)).alias("hi"),
            F.sum(row.bitwiseAND(F.lit(0xFFFFFFFF))).alias("lo"),
        )
        summary = Summary()
        rows = grouped.collect()
        summary.add(
            [r[_BUCKET] for r in rows],
            [r["n"] for r in rows],
            [(r["hi"] << 32) + r["lo"] for r in rows],
        )
        return summary

    def rows_in(self, buckets: Sequence[int]) -> pa.Table:
        """The landed rows (data columns and both hashes) whose key falls in ``buckets``."""
        from pyspark.sql import functions as F

        from snapshotter.sinks.spark.lander import quote

        picked = self._hashed.where(F.col(_BUCKET).isin(list(buckets))).select(
            *[F.col(quote(n)) for n in self.names],
            F.col(f"{_HASHES}.k").alias(KEY_HASH),
            F.col(f"{_HASHES}.r").alias(ROW_HASH),
        )
        table: pa.Table = picked.toArrow()
        return table


# --- narrowing down to keys -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Row:
    key: dict[str, Any]
    row_hash: int
    values: dict[str, Any]


def _by_key(rows: pa.Table, names: Sequence[str], key_columns: Sequence[str]) -> dict[str, _Row]:
    """Rows by canonical key text; a key seen twice (landed only) is kept apart."""
    out: dict[str, _Row] = {}
    hashes = rows.column(ROW_HASH).to_pylist()
    for i, record in enumerate(rows.select(list(names)).to_pylist()):
        values = as_json_row(record)
        key = {k: values[k] for k in key_columns}
        text = canonical(key)
        while text in out:  # a duplicate key: counts as extra
            text += "#"
        out[text] = _Row(key, hashes[i], values)
    return out


@dataclass(frozen=True, slots=True)
class KeyDiffs:
    missing: list[dict[str, Any]]
    extra: list[dict[str, Any]]
    differing: list[RowDiff]


def compare_rows(
    source: pa.Table, landed: pa.Table, names: Sequence[str], key_columns: Sequence[str]
) -> KeyDiffs:
    """Rows of both sides (of the same buckets) matched by key, in key-text order."""
    ours = _by_key(source, names, key_columns)
    theirs = _by_key(landed, names, key_columns)
    missing = [ours[k].key for k in sorted(ours.keys() - theirs.keys())]
    extra = [theirs[k].key for k in sorted(theirs.keys() - ours.keys())]
    differing = []
    for text in sorted(ours.keys() & theirs.keys()):
        mine, landed_row = ours[text], theirs[text]
        if mine.row_hash != landed_row.row_hash:
            differing.append(RowDiff(mine.key, _column_diffs(mine.values, landed_row.values)))
    return KeyDiffs(missing, extra, differing)


def _column_diffs(source: Mapping[str, Any], landed: Mapping[str, Any]) -> tuple[ColumnDiff, ...]:
    diffs = tuple(
        ColumnDiff(c, source[c], landed[c])
        for c in source
        if canonical(source[c]) != canonical(landed[c])
    )
    # Hashes differ but the JSON renderings agree (e.g. a type without a JSON distinction):
    # still name every column, so the row is never reported without its values.
    return diffs or tuple(ColumnDiff(c, source[c], landed[c]) for c in source)


# --- the verdict ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LandedVerdict:
    """One table's comparison. ``verdict`` counts the keys of the narrowed buckets; when
    differing buckets were left (``unexamined_buckets``), those counts are a lower bound."""

    table: TableId
    key_columns: tuple[str, ...]
    verdict: Verdict
    differing_buckets: int
    unexamined_buckets: int
    unexamined_rows: int  # an upper bound: the larger side's rows in those buckets
    max_keys: int  # the most rows fetched per side to narrow buckets down to keys
    notes: tuple[str, ...]
    seconds: float
    plain: PlainCheck | None = None  # current/ as plain readers read it (None: not read)

    @property
    def ok(self) -> bool:
        plain_ok = self.plain is None or self.plain.ok
        return self.verdict.ok and not self.differing_buckets and plain_ok

    def render(self) -> str:
        lines = self.verdict.render().splitlines()
        if self.verdict.ok and not self.ok:  # the landed state is right, current/ is not
            lines[0] = (
                f"NOT converged: the landed state matches the table's {self.verdict.table_rows} "
                "rows, but plain readers of current/ do not"
            )
        lines[0] += f" ({self.seconds:.1f} s)"
        if self.differing_buckets:
            narrowed = self.differing_buckets - self.unexamined_buckets
            lines.append(
                f"  {self.differing_buckets} of {BUCKETS} key-hash buckets differ; "
                f"{narrowed} narrowed down to keys"
            )
        if self.unexamined_buckets:
            lines.append(
                f"  {self.unexamined_buckets} more differing buckets (up to "
                f"{self.unexamined_rows} rows) were not narrowed down: at most "
                f"{self.max_keys} rows per side are fetched, so the counts above are a lower "
                "bound; fix these and verify again"
            )
        if self.plain is not None:
            lines.extend(self.plain.lines())
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "table": str(self.table),
            "key_columns": list(self.key_columns),
            **verdict_json(self.verdict),
            "ok": self.ok,
            "buckets": BUCKETS,
            "differing_buckets": self.differing_buckets,
            "unexamined_buckets": self.unexamined_buckets,
            "unexamined_rows": self.unexamined_rows,
            "max_keys": self.max_keys,
            "notes": list(self.notes),
            "plain_reads": None if self.plain is None else self.plain.to_json(),
            "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True, slots=True)
class TableFailure:
    """A table that could not be compared; ``error`` says why and what to do."""

    table: TableId
    error: str

    ok = False

    def render(self) -> str:
        return f"error: {self.error}"

    def to_json(self) -> dict[str, Any]:
        return {"table": str(self.table), "ok": False, "error": self.error}


Outcome = LandedVerdict | TableFailure


# --- one table --------------------------------------------------------------------------------


def _beside(source: Callable[[], _Ours], landed: Callable[[], _Theirs]) -> tuple[_Ours, _Theirs]:
    """``source()`` here and ``landed()`` on a thread beside it. Spark's part of a job runs in
    the JVM and in worker processes, so the two overlap instead of adding up."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify-spark") as pool:
        theirs = pool.submit(landed)
        return source(), theirs.result()


def _no_rows(names: Sequence[str]) -> Callable[[], pa.Table]:
    """Nothing landed: no rows, in the shape ``LandedSide.rows_in`` returns."""
    fields = [pa.field(n, pa.null()) for n in names]
    hashes = [pa.field(KEY_HASH, pa.int64()), pa.field(ROW_HASH, pa.int64())]

    def rows() -> pa.Table:
        return pa.schema([*fields, *hashes]).empty_table()

    return rows


class LandedVerifier:
    """Compares source tables (through ``dialect``) with what ``lander`` landed for them."""

    def __init__(
        self,
        dialect: Dialect,
        lander: Lander,
        *,
        chunk_rows: int = CHUNK_ROWS,
        max_keys: int = MAX_KEYS,
        examples: int = EXAMPLES,
    ) -> None:
        self.dialect = dialect
        self.lander = lander
        self.chunk_rows = chunk_rows
        self.max_keys = max_keys
        self.examples = examples

    def verify(self, table: TableId) -> LandedVerdict:
        started = time.monotonic()
        schema = self.dialect.describe(table)
        meta = self.lander.meta(table)
        keys = self._key_columns(schema, meta)
        names = [c.name for c in landed_columns(schema)]
        state = self.lander.current_state(table)
        landed = LandedSide(state, names, keys) if state is not None else None
        # Level 1: per-bucket summaries of both sides.
        source, landed_summary = _beside(
            lambda: summarise_source(self.dialect, schema, keys, self.chunk_rows),
            landed.summary if landed is not None else Summary,
        )
        differing = source.differing(landed_summary)
        chosen = narrowable(differing, source, landed_summary, self.max_keys)
        diffs = KeyDiffs([], [], [])
        if chosen:  # level 2: the rows of the differing buckets, matched by key
            ours, theirs = _beside(
                lambda: source_rows_in(self.dialect, schema, keys, chosen, self.chunk_rows),
                (lambda: landed.rows_in(chosen)) if landed is not None else _no_rows(names),
            )
            diffs = compare_rows(ours, theirs, names, keys)
        plain = None
        if meta is not None:  # current/ as plain readers read it (verify.plain)
            from snapshotter.verify.plain import PlainReads

            reads = PlainReads(self.lander, table, meta, names, keys, max_keys=self.max_keys)
            plain = reads.check(
                source, lambda b: source_rows_in(self.dialect, schema, keys, b, self.chunk_rows)
            )
        left = differing[len(chosen) :]
        return LandedVerdict(
            table=table,
            key_columns=keys,
            verdict=self._verdict(table, source.rows, landed_summary.rows, diffs),
            differing_buckets=len(differing),
            unexamined_buckets=len(left),
            unexamined_rows=sum(
                max(source.counts.get(b, 0), landed_summary.counts.get(b, 0)) for b in left
            ),
            max_keys=self.max_keys,
            notes=tuple(self._notes(table, names, state)),
            seconds=time.monotonic() - started,
            plain=plain,
        )

    def _verdict(
        self, table: TableId, source_rows: int, landed_rows: int, diffs: KeyDiffs
    ) -> Verdict:
        n = self.examples
        return Verdict(
            topic=str(table),
            table_rows=source_rows,
            output_rows=landed_rows,
            missing=len(diffs.missing),
            extra=len(diffs.extra),
            differing=len(diffs.differing),
            missing_examples=tuple(diffs.missing[:n]),
            extra_examples=tuple(diffs.extra[:n]),
            differing_examples=tuple(diffs.differing[:n]),
            pos_violations=(),
        )

    def _key_columns(self, schema: TableSchema, meta: TableMeta | None) -> tuple[str, ...]:
        """The key the table was landed by (its primary key, or the snapshot's surrogate
        key); the primary key when nothing was landed."""
        table = schema.table
        if meta is not None and tuple(meta.key_columns) != schema.primary_key:
            keys = tuple(meta.key_columns)
            if len(keys) != 1:
                raise LandedVerifyError(
                    f"{table} was landed keyed by ({', '.join(keys)}), but its primary key is "
                    f"({', '.join(schema.primary_key) or 'none'}): verify pages the table by "
                    "the landed key, which must be the primary key or one surrogate key column"
                )
            # A surrogate key must still be NOT NULL and unique for chunks to page by it.
            return self.dialect.snapshot_key(schema, keys[0])
        if schema.primary_key:
            return schema.primary_key
        raise LandedVerifyError(
            f"{table} has no primary key and nothing landed for it names a key: verify reads "
            "the table in key-range chunks and matches rows by key; snapshot it with a "
            '"surrogate-key" (a NOT NULL column with a unique index) first'
        )

    def _notes(self, table: TableId, names: Sequence[str], state: DataFrame | None) -> list[str]:
        if state is None:
            return [
                f"nothing is landed for {table} under {self.lander.root}: every source row "
                "counts as missing (has a snapshot of it run with this [sink] path?)"
            ]
        landed = [c for c in state.columns if c not in META_COLUMNS]
        notes = []
        absent = [n for n in names if n not in landed]
        if absent:
            notes.append(
                f"column(s) {', '.join(absent)} of the source are not in the landed state "
                "(compared as NULL): added at the source after the last landing?"
            )
        extra = [c for c in landed if c not in names]
        if extra:
            notes.append(
                f"landed column(s) {', '.join(extra)} are not in the source table (not "
                "compared): dropped at the source?"
            )
        return notes


# --- the command ------------------------------------------------------------------------------


def verify_spark(config: Config) -> tuple[SparkConfig, str | None]:
    """The Spark ``verify`` reads with, and a note when it is not ``[spark]``'s own.

    A standalone cluster on this machine landing into a local path: verify reads with a local
    session (local[*]). The engine running beside it holds the cluster's cores (an
    application keeps the executors it was given), so a job of verify's on the cluster would
    wait for them for as long as the engine runs; the path is readable from here anyway.
    Elsewhere verify uses ``[spark]``, and a cluster that runs none of its tasks fails within
    ``[spark] start_timeout_s`` (``sinks.spark.start``)."""
    spark, path = config.spark, config.sink.path
    local_path = not is_uri(path) or path.startswith("file:")
    cluster_here = spark.master.startswith("spark://") and not spark.runs_elsewhere
    if spark.remote is None and cluster_here and local_path:
        return spark.model_copy(update={"master": "local[*]"}), (
            f"verify reads {path} with a local Spark session (local[*]), not on the cluster "
            f"at {spark.master}: the path is on this machine, and a running engine may hold "
            "the cluster's cores"
        )
    return spark, None


def verify_landed(
    config: Config, names: Sequence[str], say: Callable[[str], object] = log.info
) -> Iterator[Outcome]:
    """Verify each table (:func:`snapshotter.verify.convergence.tables_to_verify`: the rule is the
    same for every sink) against the landed state under ``[sink] path``; one outcome per
    table, as each is done. ``say``: where the choice of Spark session is told."""
    from pyspark.errors import PySparkException

    from snapshotter.sinks.spark.lander import Lander, LandingError
    from snapshotter.sinks.spark.session import spark_session
    from snapshotter.sources.connector import connector_for
    from snapshotter.verify.convergence import tables_to_verify

    sink = config.sink
    dialect = connector_for(config.source).open_dialect()
    try:
        tables = tables_to_verify(config, dialect, names)  # before Spark's start: it is slow
        spark_config, note = verify_spark(config)
        if note is not None:
            say(note)
        spark = spark_session(
            spark_config, delta=sink.format == "delta", iceberg=sink.format == "iceberg"
        )
        lander = Lander(spark, sink.path, sink.format)
        verifier = LandedVerifier(dialect, lander)
        for table in tables:
            try:
                yield verifier.verify(table)
            except (TableError, LandingError, VerifyError, PySparkException, OSError) as exc:
                log.debug("verify of %s failed", table, exc_info=True)
                yield TableFailure(table, _failure_text(table, exc, lander))
    finally:
        dialect.close()


def _failure_text(table: TableId, exc: BaseException, lander: Lander) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, TableError) and lander.meta(table) is not None:
        return (
            f"{text} (data for it is landed under {lander.table_path(table)}; if the table was "
            "dropped at the source, that landed data is stale)"
        )
    return text


__all__ = [
    "BUCKETS",
    "LandedVerdict",
    "LandedVerifier",
    "LandedVerifyError",
    "Summary",
    "TableFailure",
    "hash_rows",
    "value_hashes",
    "verify_landed",
    "verify_spark",
]

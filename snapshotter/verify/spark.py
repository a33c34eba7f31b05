"""The convergence check for the Spark sink: does a landed current state equal its source table?
(``snapshotter verify`` with ``[sink] kind = "spark"``.)

Neither side is ever held whole. The source is read in key-range chunks, as the engine reads
them (``Dialect.read_chunk``: one short READ ONLY transaction each, no table lock, at most
``chunk_rows`` rows in memory), and every chunk goes through the landing's own conversion
(``row_converter`` then ``rows_to_landed``), so a source row becomes exactly the Arrow values
its READ event would have landed as. The landed side is ``Lander.current_state``, read by
Spark (both sides: ``verify.sides``); and ``current/`` as plain readers read it
(``verify.plain``: Spark, pyarrow, pandas), each of which must see the source table too.

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
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa

from signals.names import TableId
from snapshotter.config import Config, SparkConfig, is_uri
from snapshotter.sinks.spark.types import META_COLUMNS, landed_columns
from snapshotter.sources.base import Dialect, TableError, TableSchema
from snapshotter.verify.row_hash import BUCKETS, hash_rows, value_hashes
from snapshotter.verify.rows import (
    ColumnDiff,
    RowDiff,
    Verdict,
    VerifyError,
    as_json_row,
    canonical,
    verdict_json,
)
from snapshotter.verify.sides import (
    KEY_HASH,
    ROW_HASH,
    LandedSide,
    Summary,
    narrowable,
    source_rows_in,
    summarise_source,
)

if TYPE_CHECKING:  # pyspark is imported where Spark is used: hashing and JSON need none
    from pyspark.sql import DataFrame

    from snapshotter.sinks.spark.lander import Lander, TableMeta
    from snapshotter.verify.plain import PlainCheck

log = logging.getLogger(__name__)
_Ours = TypeVar("_Ours")
_Theirs = TypeVar("_Theirs")

CHUNK_ROWS = 10_000  # source rows per chunk SELECT
MAX_KEYS = 10_000  # rows fetched per side to narrow differing buckets down to keys
EXAMPLES = 5


class LandedVerifyError(VerifyError):
    """A table the check cannot compare as asked; the message says why and what to do."""


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

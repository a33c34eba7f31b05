"""The Spark sink: events staged as Parquet on local disk, landed by Spark beside the stream.

Flow, per checkpoint (the engine asks for one about every second, at transaction boundaries)::

    log events, READ batches ──(engine thread: collected per table, in log order)──►
    checkpoint ──(stager thread: to Arrow, Parquet written, fsynced, renamed)──►
           staged batch N ──► ack {"staged": N}: the state may now record everything up to N
    staged batches ──(lander thread: one landing per table for all waiting batches)──►
           changelog + current state ──► staged batch directories removed

Rows never pass through Python into Spark one by one: log events are built into Arrow per
table, a READ batch is cast column-wise from the chunk's Arrow (``read_batch_to_landed``: no
Python object per row), pyarrow writes the staged files, and the landing reads them in bulk
(Parquet: pyarrow, Spark only to merge; Delta: Spark).

* A table counts as being snapshotted while READ rows of it were staged within the last
  SNAPSHOT_QUIET_S: the lander holds its compaction until then (``Lander.hold_compaction``)
  and compacts it once the snapshot is over, when the lander is idle.

* The stream does not wait for Spark, nor for staging: a checkpoint hands what it collected
  to the stager thread and returns; the acknowledgement follows once the batch is fsynced.
  (Staged on the engine thread, a second's worth of READ rows of a snapshot - 200k rows, a
  Parquet write and an fsync - held the log up to 500 ms.) Checkpoints stage in order, one at
  a time. Backpressure: when more than ``max_staged_bytes`` are staged and not yet landed, or
  STAGE_AHEAD checkpoints wait to be staged, ``checkpoint`` waits (the engine then reads no
  further log).
* Durability: the state records a batch (``{"staged": N}``) only after its files are fsynced
  and renamed into place, so it never records what was not staged. On restart, batches staged
  after the recorded one are dropped (the log replays their events); batches up to it head
  the lander's queue and are landed first, in order, again if need be (landing is
  idempotent), while the stream goes on: batches staged by this run queue behind them, so
  landing order stays log order. A crash before they land leaves them staged and recorded,
  to be landed on the next start.
* A landing that fails is retried; one that keeps failing stops the engine with the error
  (everything staged stays staged and is landed on the next start).
"""

from __future__ import annotations

import logging
import queue
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa

from signals.names import TableId
from snapshotter.common.errors import disk_error, is_disk_full
from snapshotter.common.faults import failpoint
from snapshotter.config import Config
from snapshotter.core.events import ChangeEvent
from snapshotter.core.window import ReadBatch, StagedReadBatch
from snapshotter.sinks.base import Ack, SinkItem
from snapshotter.sinks.spark.formats.delta import DeltaCatalogError
from snapshotter.sinks.spark.formats.iceberg import IcebergError, IcebergPolicy
from snapshotter.sinks.spark.formats.schema_changes import SchemaChangeRefused
from snapshotter.sinks.spark.formats.staged import SchemaChangeError
from snapshotter.sinks.spark.lander import Landed, Lander, LandingError, landed_tables
from snapshotter.sinks.spark.remote_reads import stage_remote_reads, write_remote_reads
from snapshotter.sinks.spark.staging import StagedBatch, StagingArea
from snapshotter.sinks.spark.start import SparkStartError, shown
from snapshotter.sinks.spark.types import (
    ValuesDoNotFit,
    landed_schema,
    missing_columns,
    pieces_to_landed,
    read_batch_unknown_columns,
    strict_values,
    unknown_columns,
)
from snapshotter.sources.base import TableSchema

log = logging.getLogger(__name__)

LAND_ATTEMPTS = 3
RETRY_DELAY_S = 2.0
MAX_GROUP_BYTES = 256 * 1024 * 1024  # one landing takes at most this much staged data
# A table is being snapshotted while READ rows of it were staged this recently: its
# compaction waits until then (a snapshot's rows are compacted once, after it, instead of at
# every step of the table's growth), and landings wait to take several batches at once.
SNAPSHOT_QUIET_S = 5.0
# Idle compaction (a plain reader's current/ made exact while the engine runs): at most this
# share of the lander's time goes to it, so a trickle of changes to a large table does not
# rewrite its base over and over (the wait after one grows with its cost).
IDLE_COMPACT_SHARE = 0.1
# Checkpoints handed to the stager and not yet staged, at most: bounds the memory of collected
# rows when staging is slower than the stream.
STAGE_AHEAD = 2
# READ rows after which the sink asks for a checkpoint before the interval is up (four
# chunks of the default size).
CHECKPOINT_READ_ROWS = 4 * 32768
# Delta and Iceberg: how long a landing waits for a checkpoint being staged to join it.
STAGING_WAIT_S = 1.0

# A table's part of the next staged batch, in log order: runs of log events (built into
# Arrow row by row) and READ batches (Arrow already, cast column-wise).
Piece = list[ChangeEvent] | ReadBatch | StagedReadBatch
# A table's part of one checkpoint: its pieces and its key columns (asked on the engine thread,
# which owns the key bookkeeping).
Staging = tuple[list[Piece], Sequence[str] | None]


class SparkSinkError(RuntimeError):
    """The sink cannot go on; the message says why and what to do."""


class SparkSink:
    def __init__(
        self,
        *,
        staging: StagingArea,
        open_lander: Callable[[], Lander],
        describe: Callable[[TableId], TableSchema],
        key_columns: Callable[[TableId], Sequence[str] | None],
        max_staged_bytes: int,
        root: str,
        fmt: str,
        spark: Callable[[], Any] | None = None,
        compact_idle_s: float | None = None,
        spark_at: str = "Spark",
    ) -> None:
        """``spark``: the Spark session, for READ rows read on executors
        (``StagedReadBatch``) whose files this process cannot read (then Spark stages
        them; else pyarrow). ``compact_idle_s``: fold every
        table's changelog tail into its current state once nothing has landed for this long
        (None: only when the sink closes). ``spark_at``: where Spark runs, for messages."""
        self._spark = spark
        self._spark_at = spark_at
        self._staging = staging
        self._open_lander = open_lander
        self._describe = describe
        self._key_columns = key_columns
        self._max_staged = max_staged_bytes
        self._root = root
        self._format = fmt
        self._lander: Lander | None = None
        self._schemas: dict[TableId, TableSchema] = {}
        # Per table the columns its log rows lacked though described again (partial row
        # images): not taken for a dropped column again.
        self._partial: dict[TableId, set[str]] = {}
        self._pending: dict[TableId, list[Piece]] = {}
        self._pending_reads = 0  # READ rows in _pending
        self._read_tables_landing: set[TableId] = set()  # READ rows checkpointed (this process)
        self._seq = 0
        self._checkpoint_id = 0
        self._acks: list[Ack] = []  # under _cond: appended by the stager, taken by the engine
        # Checkpoints for the stager, in order: (id, per table its pieces and key columns);
        # None stops it. _unstaged counts those not yet staged (under _cond).
        self._stage_queue: queue.Queue[tuple[int, dict[TableId, Staging]] | None] = queue.Queue()
        self._unstaged = 0
        self._stager: threading.Thread | None = None
        # Shared with the lander thread, under _cond.
        self._cond = threading.Condition()
        self._queue: list[StagedBatch] = []
        self._staged_bytes = 0
        self._landing = False
        self._closing = False
        self._read_at: dict[TableId, float] = {}  # when READ rows of a table were last staged
        self._compact_pending = False  # a landing left compactions that waited for a snapshot
        # Idle compaction: seconds of quiet before it (None: never), and when it may run next
        # (monotonic; None: no tail waits for it).
        self._compact_idle_s = compact_idle_s
        self._idle_compact_at: float | None = None
        self._idle_compact_cost = 0.0  # seconds the last idle compaction took
        self._failure: str | None = None
        self._thread: threading.Thread | None = None
        self.landed: list[Landed] = []  # what each landing did (bench, tests)

    @classmethod
    def from_config(
        cls,
        config: Config,
        describe: Callable[[TableId], TableSchema],
        key_columns: Callable[[TableId], Sequence[str] | None],
    ) -> SparkSink:
        sink = config.sink

        def session() -> Any:
            from snapshotter.sinks.spark.session import spark_session

            return spark_session(
                config.spark, delta=sink.format == "delta", iceberg=sink.format == "iceberg"
            )

        def open_lander() -> Lander:
            spark = session()
            lander = Lander(
                spark,
                sink.path,
                sink.format,
                compact_ratio=sink.compact_ratio,
                compact_min_rows=sink.compact_min_rows,
                buckets=sink.buckets,
                catalog=sink.catalog,
                schema_changes=sink.schema_changes,
                iceberg=IcebergPolicy(
                    catalog=sink.catalog,
                    maintenance_interval_s=sink.maintenance_interval_s,
                    snapshot_retention_s=sink.snapshot_retention_s,
                    snapshots_kept=sink.snapshots_kept,
                    rewrite_delete_ratio=sink.rewrite_delete_ratio,
                ),
            )
            # Every landed table, landed again or not: what a crash left cleared, and its
            # tail folded in at close (compact_idle), so current/ is exact after any run.
            lander.take_over()
            return lander

        return cls(
            staging=StagingArea(config.staging_dir),
            open_lander=open_lander,
            describe=describe,
            key_columns=key_columns,
            max_staged_bytes=sink.max_staged_mb * 1024 * 1024,
            root=sink.path,
            fmt=sink.format,
            spark=session,
            compact_idle_s=sink.compact_idle_s or None,
            spark_at=f"Spark at {shown(config.spark)}",
        )

    # ------------------------------------------------------------------ Sink protocol

    def open(self, resume: Mapping[str, Any] | None) -> None:
        if self._thread is not None:
            raise SparkSinkError("the Spark sink is already open")
        self._staging.open()
        recorded = 0
        if resume is None:
            landed = landed_tables(self._root)
            if landed:
                raise SparkSinkError(
                    f"{self._root} holds landed tables ({', '.join(map(str, landed[:3]))}"
                    f"{'...' if len(landed) > 3 else ''}) but there is no saved state for "
                    "them; delete it, or set [sink] path to another location"
                )
        else:
            recorded = self._recorded(resume)
        dropped = self._staging.discard_after(recorded)
        if dropped:
            log.info(
                "dropped %d staged batch(es) the state never recorded (the log replays them)",
                len(dropped),
            )
        waiting = self._staging.batches()
        if waiting:
            # Recorded by the state, so durable: they head the lander's queue and land first,
            # in order, while the stream goes on (newer batches queue behind them). Their
            # bytes count toward max_staged_bytes like any staged batch.
            log.info(
                "%d staged batch(es) left by the last run land first, beside the stream",
                len(waiting),
            )
            self._queue.extend(waiting)
            self._staged_bytes += sum(b.bytes for b in waiting)
        self._seq = recorded
        self._thread = threading.Thread(target=self._run_lander, name="lander", daemon=True)
        self._thread.start()
        self._stager = threading.Thread(target=self._run_stager, name="stager", daemon=True)
        self._stager.start()

    def write(self, items: Sequence[SinkItem]) -> None:
        self._check()
        pending = self._pending
        for item in items:
            if isinstance(item, ReadBatch | StagedReadBatch):
                if len(item):  # a chunk the log emptied lands nothing
                    pending.setdefault(item.table, []).append(item)
                    self._pending_reads += len(item)
                continue
            pieces = pending.get(item.table)
            if pieces is None:
                pending[item.table] = [[item]]
            else:
                last = pieces[-1]
                if isinstance(last, list):
                    last.append(item)
                else:
                    pieces.append([item])

    def checkpoint(self) -> int:
        self._check()
        if self._pending:
            self._wait_for_room()
        pending, self._pending = self._pending, {}
        if self._pending_reads:
            self._read_tables_landing |= self._first_reads(pending)
        self._pending_reads = 0
        work = {table: (pieces, self._key_columns(table)) for table, pieces in pending.items()}
        self._checkpoint_id += 1
        with self._cond:
            self._unstaged += 1
        self._stage_queue.put((self._checkpoint_id, work))
        return self._checkpoint_id

    def checkpoint_wanted(self) -> bool:
        """Parquet: a snapshot's READ rows are staged and landed while the next chunks are
        read (``CHECKPOINT_READ_ROWS`` at a time), not all at the checkpoint interval's
        end: a 1M-row table is read in under a second, and its staging and landing came
        after the reading instead of beside it (0.49x a plain copy, now 0.58x).

        Delta and Iceberg: a landing there is a commit of a second or so, and more landings
        of fewer rows left more files (an Iceberg table maintained for 9.6 s after it); so
        only a table's first chunk in this process is landed at once, beside the reading of
        the next ones: what a first landing costs once (creating the tables, Spark's first
        ``add_files`` or Delta commit in the process) no longer waits for the last chunk."""
        if self._format == "parquet":
            return self._pending_reads >= CHECKPOINT_READ_ROWS
        return self._pending_reads > 0 and bool(self._first_reads(self._pending))

    def _first_reads(self, pending: dict[TableId, list[Piece]]) -> set[TableId]:
        """The tables with READ rows in ``pending`` none of whose READ rows were checkpointed
        before in this process."""
        return {
            table
            for table, pieces in pending.items()
            if table not in self._read_tables_landing
            and any(not isinstance(p, list) for p in pieces)
        }

    def acknowledged(self) -> list[Ack]:
        self._check()
        with self._cond:
            acks, self._acks = self._acks, []
        return acks

    def metrics(self) -> Mapping[str, float]:
        """For the metrics endpoint (its thread): plain int reads, no lock (a value one step
        old is all a scrape needs)."""
        return {
            "staged_bytes": float(self._staged_bytes),  # staged, not yet landed
            "staged_limit_bytes": float(self._max_staged),  # backpressure bound
            "unstaged_checkpoints": float(self._unstaged),
        }

    def notify(self, records: Sequence[Mapping[str, Any]], topic: str) -> None:
        """Notification records as a small Parquet file under ``<root>/_notifications``
        (``sinks.spark.notifications``; the topic name is not needed)."""
        from snapshotter.sinks.spark.notifications import write_notifications

        write_notifications(self._root, records)

    def close(self) -> None:
        if self._thread is None:
            return
        try:
            if self._failure is None:
                self.checkpoint()
        finally:
            if self._stager is not None:
                self._stage_queue.put(None)
                self._stager.join()
                self._stager = None
            with self._cond:
                self._closing = True
                self._cond.notify_all()
            if self._lander is None and self._thread.is_alive():
                log.info("waiting for Spark to start to land %d staged batch(es)", len(self._queue))
            self._thread.join()
            self._thread = None
        self._check()
        if self._lander is not None:
            # Idle now: fold what a table's tail holds into its base, so current/ is a plain,
            # exact table after a run (bounded: only tails at compact_ratio of their base).
            try:
                self._lander.compact_idle()
            except Exception as exc:  # the data is landed; compaction can wait for next time
                log.warning("compacting the current state at close failed: %s", _first_line(exc))

    # ------------------------------------------------------------------ staging

    def _recorded(self, resume: Mapping[str, Any]) -> int:
        staged = resume.get("staged")
        if not isinstance(staged, int) or isinstance(staged, bool) or staged < 0:
            raise SparkSinkError(f"saved sink state has no valid staged batch: {dict(resume)!r}")
        path, fmt = resume.get("path"), resume.get("format")
        if (path is not None and path != self._root) or (fmt is not None and fmt != self._format):
            raise SparkSinkError(
                f"the saved state belongs to {fmt} landing at {path}, but the sink now lands "
                f"{self._format} at {self._root}; set [sink] back, or start over without the "
                "state"
            )
        return staged

    def _resume(self) -> dict[str, Any]:
        return {"staged": self._seq, "path": self._root, "format": self._format}

    def _schema(self, table: TableId, pieces: Sequence[Piece]) -> TableSchema:
        schema = self._schemas.get(table)
        if (
            schema is None
            or _unknown_columns(schema, pieces)
            or missing_columns(schema, pieces) - self._partial.get(table, set())
        ):
            # A column added (or dropped) at the source since: describe the table again.
            schema = self._schemas[table] = self._describe(table)
            self._partial[table] = missing_columns(schema, pieces)
            extra = _unknown_columns(schema, pieces)
            if extra:
                log.warning(
                    "%s: column(s) %s are in the log but not in the table now; they do not land",
                    table,
                    ", ".join(sorted(extra)),
                )
        return schema

    def _run_stager(self) -> None:
        """Stages each checkpoint's rows, in order, then acknowledges it. After a failure it
        stages nothing more (the engine stops at its next call, with the error)."""
        try:
            self._stage_all()
        except Exception as exc:  # a bug: the engine stops with it, never waits on it
            log.debug("the stager stopped", exc_info=True)
            self._fail(f"the Spark sink's stager stopped: {_first_line(exc)}")

    def _stage_all(self) -> None:
        while True:
            job = self._stage_queue.get()
            if job is None:
                return
            checkpoint_id, work = job
            try:
                if work and self._failure is None:
                    self._stage(work)
            except Exception as exc:
                with self._cond:
                    self._failure = self._failure or str(exc)
                    self._unstaged -= 1
                    self._cond.notify_all()
                log.error("%s", exc)
                continue
            with self._cond:
                self._unstaged -= 1
                if self._failure is None:
                    self._acks.append(Ack(checkpoint_id, self._resume()))
                self._cond.notify_all()

    def _stage(self, work: Mapping[TableId, Staging]) -> None:
        """On the stager thread: one staged batch of a checkpoint's rows."""
        seq = self._seq + 1
        tables: list[tuple[TableId, Sequence[str], pa.Table]] = []
        written: dict[TableId, Callable[[str], None]] = {}
        for table, (pieces, keys) in work.items():
            if not keys:
                raise SparkSinkError(f"no key columns known for {table}: cannot land it")
            schema = self._schema(table, pieces)
            try:
                with strict_values():
                    parts = pieces_to_landed(schema, keys, pieces, seq)
            except ValuesDoNotFit:
                # A value past its column's type: the column may have been widened at the
                # source since the table was described (a schema change while streaming);
                # if not, such values land as NULL, as always (said in the log).
                schema = self._schemas[table] = self._describe(table)
                parts = pieces_to_landed(schema, keys, pieces, seq)
            remote = [piece for piece in pieces if isinstance(piece, StagedReadBatch)]
            if remote:
                # Rows read on executors: Spark applies the windows' drops where they are and
                # writes the landed rows into the staged batch; they never come here.
                written[table] = partial(self._write_remote, schema, remote, seq)
            # In log order: the lander keeps per key the row of the highest position anyway,
            # but the changelog keeps the order it was given.
            data = (
                (pa.concat_tables(parts) if len(parts) != 1 else parts[0])
                if parts
                else landed_schema(schema).empty_table()
            )
            tables.append((table, keys, data))
        try:
            batch = self._staging.stage(seq, tables, written)
        except OSError as exc:  # nothing was recorded: the log replays these events
            where = self._staging.directory
            raise SparkSinkError(
                disk_error(exc, where, "the staging directory", "[sink] staging_path")
            ) from exc
        self._seq = seq
        now = time.monotonic()
        with self._cond:
            for table, (pieces, _) in work.items():
                if any(isinstance(piece, ReadBatch | StagedReadBatch) for piece in pieces):
                    self._read_at[table] = now
            self._queue.append(batch)
            self._staged_bytes += batch.bytes
            self._cond.notify_all()

    def _write_remote(
        self, schema: TableSchema, batches: Sequence[StagedReadBatch], seq: int, target: str
    ) -> None:
        started = time.monotonic()
        if not stage_remote_reads(schema, batches, seq, target):
            if self._spark is None:
                raise SparkSinkError("READ rows read on executors need the sink's Spark session")
            write_remote_reads(self._spark(), schema, batches, seq, target)
        took = time.monotonic() - started
        log.debug("staged %d window(s) read on executors in %.2f s", len(batches), took)
        for batch in batches:  # staged now: the executors' files are no longer needed
            for name in batch.staged.files:
                Path(name).unlink(missing_ok=True)
            if batch.staged.files:
                shutil.rmtree(Path(batch.staged.files[0]).parent, ignore_errors=True)

    def _wait_for_room(self) -> None:
        with self._cond:
            waited = time.monotonic()
            warned = False
            while (
                self._staged_bytes > self._max_staged or self._unstaged >= STAGE_AHEAD
            ) and self._failure is None:
                if not warned and time.monotonic() - waited > 5:
                    log.info(
                        "%.0f MB staged and not yet landed (bound %.0f MB), %d checkpoint(s) "
                        "not yet staged: waiting",
                        self._staged_bytes / 1e6,
                        self._max_staged / 1e6,
                        self._unstaged,
                    )
                    warned = True
                self._cond.wait(1.0)
        self._check()

    def _check(self) -> None:
        if self._failure is not None:
            raise SparkSinkError(self._failure)

    # ------------------------------------------------------------------ landing

    def _land_now(self, batches: list[StagedBatch]) -> None:
        assert self._lander is not None
        for attempt in range(1, LAND_ATTEMPTS + 1):
            try:
                landed = self._lander.land(batches)
                break
            except (LandingError, SchemaChangeRefused, SchemaChangeError) as exc:
                raise SparkSinkError(f"landing failed: {exc}") from exc
            except Exception as exc:
                if is_disk_full(exc) or "No space left on device" in _first_line(exc):
                    raise SparkSinkError(
                        f"Spark ran out of disk space landing batches {batches[0].seq}.."
                        f"{batches[-1].seq} into {self._root}: free space there and in Spark's "
                        "local dir (spark.local.dir, default /tmp), then run `snapshotter "
                        "resume`; the batches stay staged and are landed then"
                    ) from exc
                if attempt == LAND_ATTEMPTS:
                    raise SparkSinkError(
                        f"landing batches {batches[0].seq}..{batches[-1].seq} with "
                        f"{self._spark_at} failed {LAND_ATTEMPTS} times; last error: "
                        f"{_first_line(exc)}. Check that Spark is up there ([spark]); the "
                        "batches stay staged and are landed on the next start"
                    ) from exc
                log.warning(
                    "landing batches %d..%d failed (attempt %d of %d), retrying: %s",
                    batches[0].seq,
                    batches[-1].seq,
                    attempt,
                    LAND_ATTEMPTS,
                    _first_line(exc),
                )
                time.sleep(RETRY_DELAY_S)
        for batch in batches:
            self._staging.remove(batch)
        self.landed.append(landed)
        log.debug(
            "landed batches %d..%d: %d rows in %.2f s",
            batches[0].seq,
            batches[-1].seq,
            landed.rows,
            landed.seconds,
        )

    def _snapshotting(self, table: TableId) -> bool:
        """Whether READ rows of ``table`` were staged within the last SNAPSHOT_QUIET_S (read
        by the lander thread; a float read from a dict needs no lock)."""
        at = self._read_at.get(table)
        return at is not None and time.monotonic() - at < SNAPSHOT_QUIET_S

    def _held_for(self) -> float | None:
        """Seconds until a compaction that waits for a snapshot may run: 0 now, None when
        none waits. Called with _cond held, on the lander thread."""
        assert self._lander is not None
        waiting = self._lander.waiting_compactions()
        if not waiting:
            return None
        now = time.monotonic()
        left = [
            SNAPSHOT_QUIET_S - (now - self._read_at.get(table, -SNAPSHOT_QUIET_S))
            for table in waiting
        ]
        return max(0.0, min(left))

    def _run_lander(self) -> None:
        """The lander thread. Whatever ends it early (Spark does not start, a landing keeps
        failing, a bug) is kept as the sink's failure, so the engine stops at its next call
        with the reason: it must never go on staging what nothing lands."""
        try:
            if self._lander is None:
                try:
                    self._lander = self._open_lander()
                except Exception as exc:  # SparkStartError: said with the address and fix
                    start = isinstance(exc, SparkStartError | IcebergError | DeltaCatalogError)
                    self._fail(str(exc) if start else f"starting Spark failed: {_first_line(exc)}")
                    return
            self._lander.hold_compaction = self._snapshotting
            self._land_all()
        except SparkSinkError as exc:  # said for users already
            self._fail(str(exc))
        except Exception as exc:  # a bug: said with what it was, never swallowed
            log.debug("the lander stopped", exc_info=True)
            self._fail(f"the Spark sink's lander stopped: {_first_line(exc)}")

    def _fail(self, reason: str) -> None:
        with self._cond:
            self._failure = self._failure or reason
            self._landing = False
            self._cond.notify_all()
        log.error("%s", reason)

    def _land_all(self) -> None:
        while True:
            failpoint("spark.lander")
            with self._cond:
                group = self._next_job()
                if group is None:
                    return
                self._landing = True
            if group:
                self._land_now(group)
            else:
                self._compact_released()
            with self._cond:
                if group:
                    del self._queue[: len(group)]
                    self._staged_bytes -= sum(b.bytes for b in group)
                    self._compact_pending = True
                self._plan_idle_compaction()
                self._landing = False
                self._cond.notify_all()

    def _next_job(self) -> list[StagedBatch] | None:
        """What the lander does next (waits, with _cond held, until there is something):
        the batches to land, oldest first; [] for the compactions that waited for a
        snapshot to end; None to stop (closing, nothing left to land)."""
        staging_waited_until: float | None = None
        while True:
            if self._queue and self._format != "parquet" and self._unstaged:
                # Delta, Iceberg: a landing is a commit per table of a few tenths of a second
                # whatever its size; the checkpoint being staged now lands in the same
                # commit rather than in one of its own right after (a snapshot's last chunks
                # staged at the end: one landing after the reading, not two).
                now = time.monotonic()
                if staging_waited_until is None:
                    staging_waited_until = now + STAGING_WAIT_S
                if now < staging_waited_until and self._failure is None:
                    self._cond.wait(staging_waited_until - now)
                    continue
            if self._queue:
                group: list[StagedBatch] = []
                size = 0
                for batch in self._queue:
                    if group and size + batch.bytes > MAX_GROUP_BYTES:
                        break
                    group.append(batch)
                    size += batch.bytes
                return group
            if self._closing:
                return None  # close compacts what is left (compact_idle)
            wait: float | None = None
            if self._compact_pending:
                wait = self._held_for()
                if wait is None:
                    self._compact_pending = False
                elif wait == 0:
                    self._compact_pending = False
                    return []
            if self._idle_compact_at is not None:
                idle_wait = max(0.0, self._idle_compact_at - time.monotonic())
                if idle_wait == 0:
                    return []
                wait = idle_wait if wait is None else min(wait, idle_wait)
            self._cond.wait(wait)

    def _plan_idle_compaction(self) -> None:
        """After a landing or compaction (with _cond held, on the lander thread): when a
        table's tail would leave a plain reader of current/ behind, compact it once nothing
        has landed for compact_idle_s (and the last idle compaction's cost allows)."""
        assert self._lander is not None
        if self._compact_idle_s is None or not self._lander.has_tails():
            self._idle_compact_at = None
            return
        pause = max(self._compact_idle_s, self._idle_compact_cost / IDLE_COMPACT_SHARE)
        self._idle_compact_at = time.monotonic() + pause

    def _compact_released(self) -> None:
        """The compactions that waited for a snapshot to end, now that it has (the lander is
        idle). A failure is not the data's: it is landed; the next landing or close retries."""
        assert self._lander is not None
        try:
            self._lander.compact_released()
            if self._idle_compact_at is not None and time.monotonic() >= self._idle_compact_at:
                started = time.monotonic()
                if self._lander.compact_idle(respect_holds=True):
                    self._idle_compact_cost = time.monotonic() - started
        except Exception as exc:
            log.warning("compacting the current state failed: %s", _first_line(exc))

    def wait_staged(self, timeout: float | None = None) -> bool:
        """Wait until every checkpoint so far is staged and acknowledged (tests, bench)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._unstaged and self._failure is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        self._check()
        return True

    def wait_landed(self, timeout: float | None = None) -> bool:
        """Wait until everything staged so far is landed (tests, bench)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while (self._unstaged or self._queue or self._landing) and self._failure is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        self._check()
        return True


def _unknown_columns(schema: TableSchema, pieces: Sequence[Piece]) -> set[str]:
    """Columns the pieces' rows have and the catalog does not: log events row by row, a READ
    batch by its Arrow schema, once."""
    unknown: set[str] = set()
    for piece in pieces:
        if isinstance(piece, ReadBatch):
            unknown |= read_batch_unknown_columns(schema, piece)
        elif isinstance(piece, StagedReadBatch):
            continue  # read with the schema the engine described
        else:
            unknown |= unknown_columns(schema, piece)
    return unknown


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"

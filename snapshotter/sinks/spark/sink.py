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
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from signals.names import TableId
from snapshotter.config import Config
from snapshotter.core.window import ReadBatch, StagedReadBatch
from snapshotter.sinks.base import Ack, SinkItem
from snapshotter.sinks.spark.formats.iceberg import IcebergPolicy
from snapshotter.sinks.spark.handoff import Handoff, SparkSinkError
from snapshotter.sinks.spark.lander import Landed, Lander, landed_tables
from snapshotter.sinks.spark.lander_thread import LanderThread
from snapshotter.sinks.spark.stager import Piece, Stager
from snapshotter.sinks.spark.staging import StagingArea
from snapshotter.sinks.spark.start import shown
from snapshotter.sources.base import TableSchema

log = logging.getLogger(__name__)

# Checkpoints handed to the stager and not yet staged, at most: bounds the memory of collected
# rows when staging is slower than the stream.
STAGE_AHEAD = 2
# READ rows after which the sink asks for a checkpoint before the interval is up (four
# chunks of the default size).
CHECKPOINT_READ_ROWS = 4 * 32768


class SparkSink:
    """On the engine thread: collects what is written per table, hands each checkpoint to the
    stager (``sinks.spark.stager``), holds the engine back when too much waits, and hands
    over the acknowledgements; the lander thread (``sinks.spark.lander_thread``) lands."""

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
        self._staging = staging
        self._key_columns = key_columns
        self._max_staged = max_staged_bytes
        self._root = root
        self._format = fmt
        self._pending: dict[TableId, list[Piece]] = {}
        self._pending_reads = 0  # READ rows in _pending
        self._read_tables_landing: set[TableId] = set()  # READ rows checkpointed (this process)
        self._checkpoint_id = 0
        self._handoff = Handoff()
        self._stager = Stager(self._handoff, staging, describe, spark, root, fmt)
        self._landings = LanderThread(
            self._handoff,
            staging,
            open_lander,
            root=root,
            fmt=fmt,
            compact_idle_s=compact_idle_s,
            spark_at=spark_at,
        )
        self.landed: list[Landed] = self._landings.landed  # what each landing did (bench, tests)

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
        if self._landings.running:
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
            self._handoff.queue.extend(waiting)
            self._handoff.staged_bytes += sum(b.bytes for b in waiting)
        self._landings.start()
        self._stager.start(recorded)

    def write(self, items: Sequence[SinkItem]) -> None:
        self._handoff.check()
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
        self._handoff.check()
        if self._pending:
            self._wait_for_room()
        pending, self._pending = self._pending, {}
        if self._pending_reads:
            self._read_tables_landing |= self._first_reads(pending)
        self._pending_reads = 0
        work = {table: (pieces, self._key_columns(table)) for table, pieces in pending.items()}
        self._checkpoint_id += 1
        self._stager.submit(self._checkpoint_id, work)
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
        handoff = self._handoff
        handoff.check()
        with handoff.cond:
            acks, handoff.acks = handoff.acks, []
        return acks

    def metrics(self) -> Mapping[str, float]:
        """For the metrics endpoint (its thread): plain int reads, no lock (a value one step
        old is all a scrape needs)."""
        return {
            "staged_bytes": float(self._handoff.staged_bytes),  # staged, not yet landed
            "staged_limit_bytes": float(self._max_staged),  # backpressure bound
            "unstaged_checkpoints": float(self._handoff.unstaged),
        }

    def notify(self, records: Sequence[Mapping[str, Any]], topic: str) -> None:
        """Notification records as a small Parquet file under ``<root>/_notifications``
        (``sinks.spark.notifications``; the topic name is not needed)."""
        from snapshotter.sinks.spark.notifications import write_notifications

        write_notifications(self._root, records)

    def close(self) -> None:
        if not self._landings.running:
            return
        try:
            if self._handoff.failure is None:
                self.checkpoint()
        finally:
            self._stager.stop()
            self._landings.stop()
        self._handoff.check()
        self._landings.compact_at_close()

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

    def _wait_for_room(self) -> None:
        handoff = self._handoff
        with handoff.cond:
            waited = time.monotonic()
            warned = False
            while (
                handoff.staged_bytes > self._max_staged or handoff.unstaged >= STAGE_AHEAD
            ) and handoff.failure is None:
                if not warned and time.monotonic() - waited > 5:
                    log.info(
                        "%.0f MB staged and not yet landed (bound %.0f MB), %d checkpoint(s) "
                        "not yet staged: waiting",
                        handoff.staged_bytes / 1e6,
                        self._max_staged / 1e6,
                        handoff.unstaged,
                    )
                    warned = True
                handoff.cond.wait(1.0)
        handoff.check()


__all__ = ["CHECKPOINT_READ_ROWS", "SparkSink", "SparkSinkError"]

"""The Spark sink's stager thread: each checkpoint's rows, in order, built into Arrow per table
(log events row by row, a READ batch cast column-wise), staged as one durable batch
(``sinks.spark.staging``), queued for the lander and then acknowledged ({"staged": N})."""

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
from snapshotter.common.errors import disk_error
from snapshotter.core.events import ChangeEvent
from snapshotter.core.window import ReadBatch, StagedReadBatch
from snapshotter.sinks.base import Ack
from snapshotter.sinks.spark.handoff import Handoff, SparkSinkError, first_line
from snapshotter.sinks.spark.remote_reads import stage_remote_reads, write_remote_reads
from snapshotter.sinks.spark.staging import StagingArea
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

# A table's part of the next staged batch, in log order: runs of log events (built into
# Arrow row by row) and READ batches (Arrow already, cast column-wise).
Piece = list[ChangeEvent] | ReadBatch | StagedReadBatch
# A table's part of one checkpoint: its pieces and its key columns (asked on the engine thread,
# which owns the key bookkeeping).
Staging = tuple[list[Piece], Sequence[str] | None]


class Stager:
    def __init__(
        self,
        handoff: Handoff,
        staging: StagingArea,
        describe: Callable[[TableId], TableSchema],
        spark: Callable[[], Any] | None,
        root: str,
        fmt: str,
    ) -> None:
        self._handoff = handoff
        self._staging = staging
        self._describe = describe
        self._spark = spark
        self._root = root
        self._format = fmt
        self._schemas: dict[TableId, TableSchema] = {}
        # Per table the columns its log rows lacked though described again (partial row
        # images): not taken for a dropped column again.
        self._partial: dict[TableId, set[str]] = {}
        self._seq = 0  # the last batch staged
        # Checkpoints to stage, in order: (id, per table its pieces and key columns); None
        # stops the thread. Handoff.unstaged counts those not yet staged.
        self._jobs: queue.Queue[tuple[int, dict[TableId, Staging]] | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def start(self, recorded: int) -> None:
        """Stage after batch ``recorded``, the last one the state recorded."""
        self._seq = recorded
        self._thread = threading.Thread(target=self._run, name="stager", daemon=True)
        self._thread.start()

    def submit(self, checkpoint_id: int, work: dict[TableId, Staging]) -> None:
        with self._handoff.cond:
            self._handoff.unstaged += 1
        self._jobs.put((checkpoint_id, work))

    def stop(self) -> None:
        """Once every checkpoint submitted is staged (or failed)."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None

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

    def _run(self) -> None:
        """Stages each checkpoint's rows, in order, then acknowledges it. After a failure it
        stages nothing more (the engine stops at its next call, with the error)."""
        try:
            self._stage_all()
        except Exception as exc:  # a bug: the engine stops with it, never waits on it
            log.debug("the stager stopped", exc_info=True)
            self._handoff.fail(f"the Spark sink's stager stopped: {first_line(exc)}")

    def _stage_all(self) -> None:
        handoff = self._handoff
        while True:
            job = self._jobs.get()
            if job is None:
                return
            checkpoint_id, work = job
            try:
                if work and handoff.failure is None:
                    self._stage(work)
            except Exception as exc:
                with handoff.cond:
                    handoff.failure = handoff.failure or str(exc)
                    handoff.unstaged -= 1
                    handoff.cond.notify_all()
                log.error("%s", exc)
                continue
            with handoff.cond:
                handoff.unstaged -= 1
                if handoff.failure is None:
                    handoff.acks.append(Ack(checkpoint_id, self._resume()))
                handoff.cond.notify_all()

    def _stage(self, work: Mapping[TableId, Staging]) -> None:
        """One staged batch of a checkpoint's rows."""
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
        handoff = self._handoff
        with handoff.cond:
            for table, (pieces, _) in work.items():
                if any(isinstance(piece, ReadBatch | StagedReadBatch) for piece in pieces):
                    handoff.read_at[table] = now
            handoff.queue.append(batch)
            handoff.staged_bytes += batch.bytes
            handoff.cond.notify_all()

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

"""The Spark sink's lander thread: what to land next and when (groups of staged batches,
oldest first; Delta and Iceberg waiting briefly for the batch being staged), landings retried,
and the compactions that wait for a snapshot to end or for the sink to go idle. The landing
itself is ``sinks.spark.lander.Lander``'s."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from signals.names import TableId
from snapshotter.common.errors import is_disk_full
from snapshotter.common.faults import failpoint
from snapshotter.sinks.spark.formats.delta import DeltaCatalogError
from snapshotter.sinks.spark.formats.iceberg import IcebergError
from snapshotter.sinks.spark.formats.schema_changes import SchemaChangeRefused
from snapshotter.sinks.spark.formats.staged import SchemaChangeError
from snapshotter.sinks.spark.handoff import Handoff, SparkSinkError, first_line
from snapshotter.sinks.spark.lander import Landed, Lander, LandingError
from snapshotter.sinks.spark.staging import StagedBatch, StagingArea
from snapshotter.sinks.spark.start import SparkStartError

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
# Delta and Iceberg: how long a landing waits for a checkpoint being staged to join it.
STAGING_WAIT_S = 1.0


class LanderThread:
    def __init__(
        self,
        handoff: Handoff,
        staging: StagingArea,
        open_lander: Callable[[], Lander],
        *,
        root: str,
        fmt: str,
        compact_idle_s: float | None,
        spark_at: str,
    ) -> None:
        self._handoff = handoff
        self._staging = staging
        self._open_lander = open_lander
        self._root = root
        self._format = fmt
        self._spark_at = spark_at
        self.lander: Lander | None = None  # once Spark started
        self._compact_pending = False  # a landing left compactions that waited for a snapshot
        # Idle compaction: seconds of quiet before it (None: never), and when it may run next
        # (monotonic; None: no tail waits for it).
        self._compact_idle_s = compact_idle_s
        self._idle_compact_at: float | None = None
        self._idle_compact_cost = 0.0  # seconds the last idle compaction took
        self._thread: threading.Thread | None = None
        self.landed: list[Landed] = []  # what each landing did (bench, tests)

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="lander", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Once everything staged is landed (or the lander failed)."""
        assert self._thread is not None
        handoff = self._handoff
        with handoff.cond:
            handoff.closing = True
            handoff.cond.notify_all()
            waiting = len(handoff.queue)  # read under the lock the lander takes them under
        if self.lander is None and self._thread.is_alive():
            log.info("waiting for Spark to start to land %d staged batch(es)", waiting)
        elif waiting and self._thread.is_alive():
            log.info("stopping: landing %d staged batch(es) first", waiting)
        self._thread.join()
        self._thread = None

    def compact_at_close(self) -> None:
        if self.lander is not None:
            # Idle now: fold what a table's tail holds into its base, so current/ is a plain,
            # exact table after a run (bounded: only tails at compact_ratio of their base).
            try:
                self.lander.compact_idle()
            except Exception as exc:  # the data is landed; compaction can wait for next time
                log.warning("compacting the current state at close failed: %s", first_line(exc))

    def _land_now(self, batches: list[StagedBatch]) -> None:
        assert self.lander is not None
        for attempt in range(1, LAND_ATTEMPTS + 1):
            try:
                landed = self.lander.land(batches)
                break
            except (LandingError, SchemaChangeRefused, SchemaChangeError) as exc:
                raise SparkSinkError(f"landing failed: {exc}") from exc
            except Exception as exc:
                if is_disk_full(exc) or "No space left on device" in first_line(exc):
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
                        f"{first_line(exc)}. Check that Spark is up there ([spark]); the "
                        "batches stay staged and are landed on the next start"
                    ) from exc
                log.warning(
                    "landing batches %d..%d failed (attempt %d of %d), retrying: %s",
                    batches[0].seq,
                    batches[-1].seq,
                    attempt,
                    LAND_ATTEMPTS,
                    first_line(exc),
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
        at = self._handoff.read_at.get(table)
        return at is not None and time.monotonic() - at < SNAPSHOT_QUIET_S

    def _held_for(self) -> float | None:
        """Seconds until a compaction that waits for a snapshot may run: 0 now, None when
        none waits. Called with the handoff's cond held."""
        assert self.lander is not None
        waiting = self.lander.waiting_compactions()
        if not waiting:
            return None
        now = time.monotonic()
        read_at = self._handoff.read_at
        left = [
            SNAPSHOT_QUIET_S - (now - read_at.get(table, -SNAPSHOT_QUIET_S)) for table in waiting
        ]
        return max(0.0, min(left))

    def _run(self) -> None:
        """Whatever ends it early (Spark does not start, a landing keeps failing, a bug) is
        kept as the sink's failure, so the engine stops at its next call with the reason: it
        must never go on staging what nothing lands."""
        handoff = self._handoff
        try:
            if self.lander is None:
                try:
                    self.lander = self._open_lander()
                except Exception as exc:  # SparkStartError: said with the address and fix
                    start = isinstance(exc, SparkStartError | IcebergError | DeltaCatalogError)
                    handoff.fail(str(exc) if start else f"starting Spark failed: {first_line(exc)}")
                    return
            self.lander.hold_compaction = self._snapshotting
            self._land_all()
        except SparkSinkError as exc:  # said for users already
            handoff.fail(str(exc))
        except Exception as exc:  # a bug: said with what it was, never swallowed
            log.debug("the lander stopped", exc_info=True)
            handoff.fail(f"the Spark sink's lander stopped: {first_line(exc)}")

    def _land_all(self) -> None:
        handoff = self._handoff
        while True:
            failpoint("spark.lander")
            with handoff.cond:
                group = self._next_job()
                if group is None:
                    return
            if group:
                self._land_now(group)
            else:
                self._compact_released()
            with handoff.cond:
                if group:
                    del handoff.queue[: len(group)]
                    handoff.staged_bytes -= sum(b.bytes for b in group)
                    self._compact_pending = True
                self._plan_idle_compaction()
                handoff.cond.notify_all()

    def _next_job(self) -> list[StagedBatch] | None:
        """What the lander does next (waits, with the handoff's cond held, until there is
        something): the batches to land, oldest first; [] for the compactions that waited
        for a snapshot to end; None to stop (closing, nothing left to land)."""
        handoff = self._handoff
        staging_waited_until: float | None = None
        while True:
            if handoff.queue and self._format != "parquet" and handoff.unstaged:
                # Delta, Iceberg: a landing is a commit per table of a few tenths of a second
                # whatever its size; the checkpoint being staged now lands in the same
                # commit rather than in one of its own right after (a snapshot's last chunks
                # staged at the end: one landing after the reading, not two).
                now = time.monotonic()
                if staging_waited_until is None:
                    staging_waited_until = now + STAGING_WAIT_S
                if now < staging_waited_until and handoff.failure is None:
                    handoff.cond.wait(staging_waited_until - now)
                    continue
            if handoff.queue:
                group: list[StagedBatch] = []
                size = 0
                for batch in handoff.queue:
                    if group and size + batch.bytes > MAX_GROUP_BYTES:
                        break
                    group.append(batch)
                    size += batch.bytes
                return group
            if handoff.closing:
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
            handoff.cond.wait(wait)

    def _plan_idle_compaction(self) -> None:
        """After a landing or compaction (with the handoff's cond held): when a table's tail
        would leave a plain reader of current/ behind, compact it once nothing has landed for
        compact_idle_s (and the last idle compaction's cost allows)."""
        assert self.lander is not None
        if self._compact_idle_s is None or not self.lander.has_tails():
            self._idle_compact_at = None
            return
        pause = max(self._compact_idle_s, self._idle_compact_cost / IDLE_COMPACT_SHARE)
        self._idle_compact_at = time.monotonic() + pause

    def _compact_released(self) -> None:
        """The compactions that waited for a snapshot to end, now that it has (the lander is
        idle). A failure is not the data's: it is landed; the next landing or close retries."""
        assert self.lander is not None
        try:
            self.lander.compact_released()
            if self._idle_compact_at is not None and time.monotonic() >= self._idle_compact_at:
                started = time.monotonic()
                if self.lander.compact_idle(respect_holds=True):
                    self._idle_compact_cost = time.monotonic() - started
        except Exception as exc:
            log.warning("compacting the current state failed: %s", first_line(exc))

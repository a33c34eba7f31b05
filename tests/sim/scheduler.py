"""The seeded scheduler: one world (database, log, sink, state, engine) and everything that
happens in it, in an order drawn from ``random.Random(seed)``.

A run has two phases. In the chaos phase the scheduler interleaves, at random: writer
transactions (begin, commit, abort; inserts, updates, deletes, key changes over both
tables), commits becoming visible (PostgreSQL's lag), log delivery, engine steps
(``Engine.step``), chunk-worker tasks (the real task code, paused at its phase points for
more of the same), acknowledgements of checkpoints, watermark cleanup, signals
(execute-snapshot, stop, pause, resume as rows of the signal table), transient connection
losses of the snapshot side, graceful restarts and crashes (the engine dropped at any point:
between actions, inside a chunk task, halfway through a sink write, around a state save),
each followed by a resume from the saved state. In the final phase chaos stops, a resume and
an execute-snapshot of every table are sent while writers go on for a while, then writers
stop and the engine runs until it is caught up, and the world checks its properties
(``tests.sim.checks``).

Nothing here reads a clock, starts a thread or iterates a set: a seed replays exactly.
"""

from __future__ import annotations

import random
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from signals import ExecuteSnapshot, ResumeSnapshot, to_row
from signals.model import Signal
from snapshotter.config import Config
from snapshotter.core.state import EngineState, SnapshotStatus
from snapshotter.engine import Engine, EngineContext, SourceUnavailableError
from snapshotter.engine.signal_cleanup import WatermarkCleanup
from snapshotter.engine.workers import PhaseHooks, Task, WorkerPool
from snapshotter.sources.base import Dialect
from snapshotter.sources.log import LogReader
from tests.sim.db import DATA_TABLES, ITEMS, PAIRS, SIGNAL_TABLE, Database, LoggedChange, Row
from tests.sim.errors import Crash, Property, SimFailure, Stopped, check
from tests.sim.pool import SimPool
from tests.sim.sink import MemoryStateStore, Output, SimSink
from tests.sim.source import SimDialect, SimLogReader, SimOutage
from tests.sim.watch import Watch
from tests.sim.workload import Workload

MAX_DEPTH = 2  # chunk tasks running inside another's phase hook, at most
FINAL_ACTIONS = 20_000  # the final phase must be caught up by then
TRACE = 60  # actions remembered for a failure message


@dataclass(frozen=True)
class Settings:
    """What one seed's world looks like."""

    lagging: bool  # PostgreSQL (commits visible after they are logged) or MySQL
    parallelism: int  # [source] read_parallelism
    chunk_size: int
    checkpoint_ms: int
    cleanup: bool  # [source] signal_cleanup
    cleanup_batch: int
    items: int  # rows loaded before the capture starts
    pairs: int
    chaos_actions: int
    crash_weight: float  # of the "crash" action (0: no crashes at all)
    outage: float  # the chance that a call of the snapshot side loses its connection

    @classmethod
    def draw(cls, rng: random.Random) -> Settings:
        return cls(
            lagging=rng.random() < 0.6,
            parallelism=rng.choice((1, 1, 2, 3)),
            chunk_size=rng.randint(1, 6),
            checkpoint_ms=rng.choice((10, 50, 200, 1000)),
            cleanup=rng.random() < 0.5,
            cleanup_batch=rng.randint(2, 6),
            items=rng.randint(0, 30),
            pairs=rng.randint(0, 20),
            chaos_actions=rng.randint(100, 400),
            crash_weight=rng.choice((0.0, 0.3, 1.0, 2.0)),
            outage=rng.choice((0.0, 0.0, 0.02, 0.06)),
        )


class World:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self._ids = random.Random(f"window ids {seed}")
        self.settings = s = Settings.draw(self.rng)
        self.now = 1000.0
        self.db = Database(lagging=s.lagging)
        self.workload = Workload(self.rng, self.db)
        self.db.load(ITEMS.table, self.workload.initial_rows(ITEMS, s.items))
        self.db.load(PAIRS.table, self.workload.initial_rows(PAIRS, s.pairs))
        self.db.slot_confirmed = self.db.end  # `snapshotter init`: the slot starts here
        self.output = Output()
        self.store = MemoryStateStore(self)
        self.config = Config.model_validate(
            {
                "source": {
                    "kind": "postgres",
                    "url": "postgresql://sim@sim/sim",
                    "tables": [str(t.table) for t in DATA_TABLES],
                    "signal_table": str(SIGNAL_TABLE),
                    "chunk_size": s.chunk_size,
                    "read_parallelism": s.parallelism,
                    "signal_cleanup": s.cleanup,
                    "signal_cleanup_batch": s.cleanup_batch,
                },
                "state": {"checkpoint_interval_ms": s.checkpoint_ms},
            }
        )
        self.chaos = True
        self.writing = True
        self.final = False
        self.caught_up = False
        self.crashed = False
        self.depth = 0  # chunk tasks on the stack
        self.incarnation = 0
        self.engine: Engine | None = None
        self.reader: SimLogReader | None = None
        self.pool: SimPool | None = None
        self.sink: SimSink | None = None
        self.until_caught_up = False
        self._restarting = False
        self._final_end = 0
        self.writers: list[int] = []  # open transactions
        self._dialects = 0
        self.trace: deque[str] = deque(maxlen=TRACE)
        self.signal_lsn: dict[str, int] = {}  # where each signal row is in the log
        self.stats: dict[str, int] = dict.fromkeys(
            (
                "actions",
                "crashes",
                "restarts",
                "outages",
                "signals",
                "commits",
                "chunk_reads",
                "reread_after_restart",
                "reread_given_up",
                "read_rows_checked",
                "read_rows_dropped",
                "bounded_spans",
                "tasks_failed_transient",
                "tasks_cancelled",
                "replays",
            ),
            0,
        )
        self.watch = Watch(self.db, self.output, self.stats, self.trace)

    # --- what the engine is built with ----------------------------------------------------

    def clock(self) -> float:
        return self.now

    def wait(self, seconds: float) -> None:
        self.now += seconds

    def _window_id(self) -> str:
        return str(uuid.UUID(int=self._ids.getrandbits(128), version=4))

    def _open_dialect(self) -> Dialect:
        self._dialects += 1
        return SimDialect(self, self._dialects)

    def _open_reader(self, resume: Any, key_columns: Any) -> LogReader:
        confirmed = self.db.slot_confirmed
        saved = int(resume.get("lsn", 0))
        check(
            not resume or saved >= confirmed,
            Property.RESUMED_BEFORE_SLOT,
            f"state resumes the log at {saved}, before the slot's confirmed {confirmed}",
        )
        # The slot resends from its confirmed point, which may lie before the saved state.
        start = confirmed if not resume or self.chance(0.5) else saved
        if start < saved:
            self.stats["replays"] += 1
        # Commits logged before `start` (never sent again) may stay invisible for as long as
        # the scheduler says, as a commit stuck waiting for a synchronous standby through a
        # restart does: the engine's start snapshot must cover them (core.visibility).
        self.reader = SimLogReader(self, start, key_columns)
        return self.reader

    def _start_workers(
        self, dialects: list[Dialect], hooks: PhaseHooks | None, cleanup: WatermarkCleanup | None
    ) -> WorkerPool:
        interleave = PhaseHooks(self._hook, self._hook, self._hook, self._hook)
        self.pool = SimPool(self, dialects, interleave, cleanup)
        return self.pool

    def _hook(self, task: Task) -> None:
        for _ in range(self.rng.randrange(4)):
            self.act()

    # --- chance, crashes, outages ----------------------------------------------------------

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def crash_point(self, p: float) -> bool:
        return self.chaos and self.settings.crash_weight > 0 and self.chance(p)

    def crash(self, where: str) -> None:
        self.trace.append(f"CRASH ({where})")
        self.crashed = True
        raise Crash(where)

    def maybe_outage(self, what: str) -> None:
        if self.chaos and self.settings.outage and self.chance(self.settings.outage):
            self.stats["outages"] += 1
            self.trace.append(f"outage: {what}")
            raise SimOutage(f"{what}: connection lost (simulated)")

    # --- the engine's life ----------------------------------------------------------------

    def boot(self) -> None:
        """Start an engine from the saved state (``snapshotter run`` / ``resume``), again
        after any crash on the way."""
        while True:
            try:
                self._boot()
                return
            except Crash:
                self._after_crash()

    def _boot(self) -> None:
        self.crashed = False
        self.incarnation += 1
        self.sink = SimSink(self, self.output)
        self.until_caught_up = self.final or self.chance(0.3)
        engine = Engine(
            EngineContext(
                config=self.config,
                dialect=SimDialect(self, 0),
                open_reader=self._open_reader,
                sink=self.sink,
                store=self.store,
                open_dialect=self._open_dialect,
                clock=self.clock,
                sleep=self.wait,
                start_workers=self._start_workers,
                new_window_id=self._window_id,
                wall_ms=lambda: round(self.clock() * 1000),  # no wall clock: seeds replay exactly
            )
        )
        self.engine = engine
        kept = int(engine.state.sink.get("offset", 0))
        self.watch.begin_run(self.incarnation, engine.state.snapshots, kept)
        self.trace.append(f"boot #{self.incarnation}")
        engine.start()

    def _after_crash(self) -> None:
        self.stats["crashes"] += 1
        out = self.output
        out.crash(self.rng.randint(out.durable, len(out.events)))
        self.engine = self.reader = self.pool = self.sink = None
        self.depth = 0

    def _restart(self, why: str) -> None:
        """Stop the engine as SIGTERM would (to the end of the transaction being handed
        over, then ``close``) and start it again."""
        assert self.engine is not None and self.reader is not None
        self.trace.append(f"restart ({why})")
        self.stats["restarts"] += 1
        self._restarting = True
        try:
            if self.reader.finish_transaction():
                self._step()
            self.engine.close()
        finally:
            self._restarting = False
        self.boot()

    def top(self) -> None:
        """One action at the top of the stack; a crash or a stop is recovered from here."""
        try:
            self.act()
        except Crash:
            self._after_crash()
            self.boot()
        except Stopped:
            self.depth = 0
            self._restart("the source stayed unavailable")

    # --- actions --------------------------------------------------------------------------

    def act(self) -> None:
        assert self.engine is not None and self.pool is not None and self.sink is not None
        self.stats["actions"] += 1
        self.now += 0.001
        names, weights = self._choices()
        name = self.rng.choices(names, weights)[0]
        self._actions[name](self)

    def _choices(self) -> tuple[list[str], list[float]]:
        assert self.pool is not None and self.sink is not None
        options: list[tuple[str, float]] = [("step", 30), ("deliver", 20), ("clock", 2)]
        if self.writing:
            options.append(("begin", 5 if len(self.writers) < 3 else 0))
            if self.writers:
                options += [("commit", 10), ("abort", 0.5)]
        if self.db.invisible:
            options.append(("visible", 8))
        if self.depth < MAX_DEPTH and self.pool.runnable():
            options.append(("worker", 20))
        if self.sink.pending:
            options.append(("ack", 6))
        options.append(("cleanup", 1))
        if self.chaos:
            options.append(("signal", 1.5))
            if self.settings.crash_weight:
                options.append(("crash", self.settings.crash_weight))
            if self.depth == 0:
                options.append(("stop", 0.3))
        return [n for n, _ in options], [w for _, w in options]

    def _step(self) -> None:
        assert self.engine is not None and self.reader is not None
        try:
            caught_up = self.engine.step(self.reader, until_caught_up=self.until_caught_up)
        except SourceUnavailableError:
            raise Stopped() from None
        except Exception as exc:  # an engine bug: not to be mistaken for a task's failure
            raise SimFailure(Property.ENGINE_RAISED, f"the engine raised {exc!r}") from exc
        if not caught_up:
            return
        if self.final:
            self.caught_up = self._final_snapshots_done()
        if not self.caught_up and self.depth == 0 and not self._restarting:
            self._restart("caught up: `run --until-caught-up` returned")

    def _deliver(self) -> None:
        assert self.reader is not None
        self.reader.deliver(self.rng.randint(1, 8))

    def _clock(self) -> None:
        self.now += self.rng.uniform(0, 1.0)

    def _begin(self) -> None:
        self.writers.append(self.db.begin())

    def _commit(self) -> None:
        xid = self.rng.choice(self.writers)
        changes = self.workload.changes()
        if self.db.blocked(changes):
            return  # waits for a row lock; tries again (other rows, maybe) later
        self.writers.remove(xid)
        if changes:
            txn = self.db.commit(xid, changes)
            self.stats["commits"] += 1
            self.trace.append(f"commit xid {xid} at {txn.lsn}: {len(changes)} changes")
        else:
            self.db.abort(xid)

    def _abort(self) -> None:
        xid = self.rng.choice(self.writers)
        self.writers.remove(xid)
        self.db.abort(xid)

    def _visible(self) -> None:
        self.db.make_visible(self.rng.choice(self.db.visible_candidates()))

    def _worker(self) -> None:
        assert self.pool is not None
        worker = self.rng.choice(self.pool.runnable())
        self.depth += 1
        try:
            self.pool.run(worker)
        finally:
            self.depth -= 1

    def _ack(self) -> None:
        assert self.sink is not None
        self.sink.release(self.rng.randint(1, self.sink.pending))

    def _cleanup(self) -> None:
        assert self.pool is not None
        self.pool.idle_cleanup()

    def _signal(self) -> None:
        self.send(self.workload.signal())

    def send(self, signal: Signal) -> int:
        """Insert a signal row (a transaction of its own); returns its log end."""
        row_id, row_type, data = to_row(signal)
        xid = self.db.begin()
        row: Row = {"id": row_id, "type": row_type, "data": data}
        txn = self.db.commit(xid, [LoggedChange(SIGNAL_TABLE, "c", None, row)])
        self.signal_lsn[row_id] = txn.lsn
        self.stats["signals"] += 1
        self.trace.append(f"signal {row_id} {row_type} {data} at {txn.lsn}")
        return txn.end

    def _crash(self) -> None:
        self.crash("scheduled")

    def _stop(self) -> None:
        self._restart("SIGTERM")

    _actions: ClassVar[dict[str, Callable[[World], None]]] = {
        "step": _step,
        "deliver": _deliver,
        "clock": _clock,
        "begin": _begin,
        "commit": _commit,
        "abort": _abort,
        "visible": _visible,
        "worker": _worker,
        "ack": _ack,
        "cleanup": _cleanup,
        "signal": _signal,
        "crash": _crash,
        "stop": _stop,
    }

    # --- the run --------------------------------------------------------------------------

    def run(self) -> None:
        self.boot()
        for _ in range(self.settings.chaos_actions):
            self.top()
        self._final_phase()

    def _final_phase(self) -> None:
        """Chaos stops; every table is snapshotted (again) while writers go on for a while,
        then the engine runs until caught up and stops."""
        self.chaos = False
        self.trace.append("final phase")
        self.send(ResumeSnapshot("final-resume"))
        self.send(ExecuteSnapshot("final", tuple(t.table for t in DATA_TABLES)))
        for _ in range(self.rng.randint(20, 150)):
            self.top()
        self.writing = False
        for xid in list(self.writers):
            self.writers.remove(xid)
            changes = self.workload.changes()
            if changes and not self.db.blocked(changes):
                self.db.commit(xid, changes)
            else:
                self.db.abort(xid)
        self._final_end = self.db.end  # caught up means: read up to here, at least
        self.final = True
        self.until_caught_up = True
        for _ in range(FINAL_ACTIONS):
            self.top()
            if self.caught_up:
                break
        else:
            raise SimFailure(
                Property.NOT_CAUGHT_UP,
                f"not caught up after {FINAL_ACTIONS} actions of the final phase",
            )
        assert self.engine is not None
        self.engine.close()

    def _final_snapshots_done(self) -> bool:
        """Whether the engine has read past the last write and has no snapshot left to
        run (a `run --until-caught-up` before that was a restart, not the end)."""
        assert self.engine is not None
        state: EngineState = self.engine.state
        resumed = int(state.stream.resume.get("lsn", 0))
        unfinished = [p for p in state.snapshots if not p.status.finished]
        return resumed >= self._final_end and not unfinished

    def newest_snapshots(self) -> dict[str, SnapshotStatus]:
        assert self.engine is not None
        out: dict[str, SnapshotStatus] = {}
        for progress in self.engine.state.snapshots:
            out[str(progress.table)] = progress.status
        return out

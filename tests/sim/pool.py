"""The chunk-worker pool without threads: tasks run when the scheduler says.

``SimPool`` is a ``snapshotter.engine.workers.WorkerPool``: the engine submits, polls, cancels
and stops as it does with ``ChunkWorkers``. Each task runs the real chunk-worker code
(``engine.workers.run_task``: describe and max key, chunk bound, open watermark, SELECT, close
watermark, and the failure classification) on that worker's ``SimDialect``; its phase hooks
hand control back to the scheduler, which runs other actions there (writer transactions, log
delivery, engine steps, other workers, acknowledgements, crashes) before the task goes on.
Answers reach ``poll`` at once, in the order they were sent, as through a queue.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from snapshotter.engine.signal_cleanup import WatermarkCleanup
from snapshotter.engine.workers import (
    ChunkBounded,
    PhaseHooks,
    Result,
    Task,
    TaskFailed,
    run_task,
)
from snapshotter.sources.base import Dialect

if TYPE_CHECKING:
    from tests.sim.scheduler import World


@dataclass
class SimWorker:
    index: int
    dialect: Dialect
    busy: int = 0  # submitted, answer not yet polled
    queued: list[Task] = field(default_factory=list)
    current: Task | None = None


class SimPool:
    def __init__(
        self,
        world: World,
        dialects: list[Dialect],
        hooks: PhaseHooks,
        cleanup: WatermarkCleanup | None,
    ) -> None:
        self._world = world
        self.workers = [SimWorker(i, d) for i, d in enumerate(dialects)]
        self._hooks = hooks
        self._cleanup = cleanup
        self._answers: list[tuple[SimWorker, Result]] = []
        self.stopped = False

    # --- WorkerPool -----------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.workers)

    @property
    def busy(self) -> bool:
        return any(w.busy for w in self.workers)

    @property
    def idle(self) -> int:
        return sum(not w.busy for w in self.workers)

    def submit(self, task: Task) -> None:
        for worker in self.workers:
            if not worker.busy:
                self._world.watch.submitted(task)
                worker.busy += 1
                worker.queued.append(task)
                return
        raise RuntimeError("no idle chunk worker")

    def poll(self) -> list[Result]:
        answers, self._answers = self._answers, []
        for worker, result in answers:
            if not isinstance(result, ChunkBounded):
                worker.busy -= 1
        return [result for _, result in answers]

    def cancel(self, matches: Callable[[Task], bool]) -> None:
        for worker in self.workers:
            if worker.current is not None and matches(worker.current):
                worker.dialect.cancel_reads()

    def stop(self, timeout: float = 30.0) -> None:
        self.stopped = True
        for worker in self.workers:
            worker.dialect.cancel_reads()
            worker.queued.clear()  # refused: nobody polls any more
        if self._cleanup is not None:
            self._cleanup.flush()
        for worker in self.workers[1:]:
            worker.dialect.close()

    # --- the scheduler's side -------------------------------------------------------------

    def runnable(self) -> list[SimWorker]:
        """Workers with a task waiting to run (not one running now, further up the stack)."""
        return [w for w in self.workers if w.queued and w.current is None]

    def run(self, worker: SimWorker) -> None:
        """Run the worker's task to its end (the hooks interleave other actions)."""
        task = worker.queued.pop(0)
        if self.stopped:
            self._send(
                worker, TaskFailed(task, "cancelled: the engine is stopping", cancelled=True)
            )
            return
        worker.current = task
        worker.dialect.allow_reads()  # a cancel of the task before is done with
        try:
            run_task(task, worker.dialect, self._hooks, lambda r: self._send(worker, r))
        finally:
            worker.current = None
        if worker.index == 0 and self._cleanup is not None:
            self._cleanup.step(idle=False)  # one batch at most between two tasks

    def idle_cleanup(self) -> None:
        """The first worker, idle, deletes watermark rows of finished windows."""
        if self._cleanup is not None and not self.workers[0].busy:
            self._cleanup.step(idle=True)

    def _send(self, worker: SimWorker, result: Result) -> None:
        self._world.watch.answer(result)
        self._answers.append((worker, result))

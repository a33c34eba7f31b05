"""Running seeds: one world per seed, its properties checked, a failure told with its replay.

``SNAPSHOTTER_SIM_SEEDS`` (how many seeds), ``SNAPSHOTTER_SIM_FIRST_SEED`` (where they start),
``SNAPSHOTTER_SIM_SEED`` (exactly one seed, to replay a failure) and ``SNAPSHOTTER_SIM_JOBS``
(processes; default: up to 2 cores) choose what runs; with none of them set, CI (``CI=true``)
runs ``CI_SEEDS``: half fixed, half from a start that moves each day. Seeds are independent,
so running them in several processes changes nothing but the time.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from tests.sim.checks import check_world
from tests.sim.errors import Property, SimFailure
from tests.sim.scheduler import World

# A local run's seeds: about 85 s on two cores (CI takes CI_SEEDS, below).
DEFAULT_SEEDS = 6000
# CI (CI=true) runs half as many, to make room for the server version matrix: the first
# half of the default seeds, and as many more starting at a seed that moves by a day's worth
# each day, so over time CI covers more seeds than a fixed range would (a failing seed says
# how to replay it).
CI_SEEDS = DEFAULT_SEEDS // 2
REPLAY = "SNAPSHOTTER_SIM_SEED={seed} python3 -m pytest tests/sim/test_simulation.py -q"


class SeedFailed(AssertionError):
    """A seed that failed: ``broken`` names the property (None: the simulation itself, or
    the engine's setup outside a step, raised)."""

    def __init__(self, seed: int, problem: str, details: str, broken: Property | None) -> None:
        self.seed = seed
        self.problem = problem
        self.details = details
        self.broken = broken
        super().__init__(
            f"simulation seed {seed} failed: {problem}\n"
            f"  replay: {REPLAY.format(seed=seed)}\n{details}"
        )

    def __reduce__(self) -> tuple[type[SeedFailed], tuple[int, str, str, Property | None]]:
        return (SeedFailed, (self.seed, self.problem, self.details, self.broken))


def _details(world: World | None) -> str:
    if world is None:
        return "  (the world could not be built)"
    trace = "\n    ".join(world.trace)
    return f"  settings: {world.settings}\n  last actions:\n    {trace}"


@contextlib.contextmanager
def quiet_engine() -> Iterator[None]:
    """The engine's log lines (warnings about ignored watermark rows, signal problems...)
    are expected by the thousand here: silenced while seeds run."""
    logger = logging.getLogger("snapshotter")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def simulate(seed: int) -> World:
    """Run one seed; raise SeedFailed (with the replay command) if a property fails."""
    world: World | None = None
    with quiet_engine():
        try:
            world = World(seed)
            world.run()
            check_world(world)
        except SimFailure as failure:
            raise SeedFailed(seed, str(failure), _details(world), failure.broken) from None
        except Exception as exc:  # a bug of the simulation itself, or of the engine's setup
            problem = f"{type(exc).__name__}: {exc}"
            raise SeedFailed(seed, problem, _details(world), None) from exc
    return world


def chosen_seeds() -> list[int]:
    one = os.environ.get("SNAPSHOTTER_SIM_SEED")
    if one:
        return [int(one)]
    count = os.environ.get("SNAPSHOTTER_SIM_SEEDS")
    first = os.environ.get("SNAPSHOTTER_SIM_FIRST_SEED")
    in_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    if in_ci and count is None and first is None:
        half = CI_SEEDS // 2
        moving = DEFAULT_SEEDS + (int(time.time()) // 86_400 * half) % 10_000_000
        return [*range(half), *range(moving, moving + half)]
    start = int(first or 0)
    return list(range(start, start + int(count or DEFAULT_SEEDS)))


def chosen_jobs() -> int:
    jobs = os.environ.get("SNAPSHOTTER_SIM_JOBS")
    return int(jobs) if jobs else min(2, os.cpu_count() or 1)


@dataclass
class Summary:
    seeds: int = 0
    seconds: float = 0.0
    totals: dict[str, int] = field(default_factory=dict)
    failed: SeedFailed | None = None  # the lowest failing seed (its slice stopped there)

    def add(self, other: Summary) -> None:
        self.seeds += other.seeds
        for name, value in other.totals.items():
            self.totals[name] = self.totals.get(name, 0) + value
        if other.failed is not None and (
            self.failed is None or other.failed.seed < self.failed.seed
        ):
            self.failed = other.failed


def run_slice(seeds: Sequence[int]) -> Summary:
    """Run seeds in order, up to the first that fails."""
    summary = Summary()
    for seed in seeds:
        try:
            world = simulate(seed)
        except SeedFailed as failure:
            summary.failed = failure
            break
        summary.add(Summary(1, 0.0, dict(world.stats)))
    return summary


def run_seeds(seeds: Sequence[int], jobs: int = 1) -> Summary:
    """Run the seeds (in ``jobs`` processes, each a share of them); the summary names the
    lowest failing seed, if any."""
    start = time.perf_counter()
    if jobs <= 1 or len(seeds) < 2 * jobs:
        summary = run_slice(seeds)
    else:
        summary = Summary()
        shares = [list(seeds[i::jobs]) for i in range(jobs)]
        context = multiprocessing.get_context("spawn")  # no fork of a process with threads
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            for part in pool.map(run_slice, shares):
                summary.add(part)
    summary.seconds = time.perf_counter() - start
    return summary

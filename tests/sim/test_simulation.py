"""The whole engine under a seeded scheduler, no servers: thousands of seeds, each replayable.

Run more seeds:  SNAPSHOTTER_SIM_SEEDS=50000 python3 -m pytest tests/sim/test_simulation.py -q
Other seeds:     SNAPSHOTTER_SIM_FIRST_SEED=100000 SNAPSHOTTER_SIM_SEEDS=20000 ...
Replay one:      SNAPSHOTTER_SIM_SEED=1234 python3 -m pytest tests/sim/test_simulation.py -q
(tests/sim/README.md says what is simulated and checked.)
"""

from __future__ import annotations

from tests.sim.harness import chosen_jobs, chosen_seeds, run_seeds, simulate


def test_seeds_keep_every_property() -> None:
    summary = run_seeds(chosen_seeds(), chosen_jobs())
    print(f"\n{summary.seeds} seeds in {summary.seconds:.1f} s: {summary.totals}")
    if summary.failed is not None:
        raise summary.failed


def test_a_seed_replays_exactly() -> None:
    first, second = simulate(7), simulate(7)
    assert list(first.trace) == list(second.trace)
    assert first.stats == second.stats
    assert first.output.events == second.output.events
    assert first.store.text == second.store.text

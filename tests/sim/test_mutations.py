"""The simulation catches a broken rule: each mutation of ``tests.sim.mutations`` (one rule
of the algorithm switched off by a monkeypatch) must make a seed fail within the first
``WITHIN`` seeds. (Measured: every one fails by seed 12; see tests/sim/README.md.)"""

from __future__ import annotations

import pytest

from tests.sim.mutations import MUTATIONS, failing_seeds

WITHIN = 100


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_the_simulation_catches_a_broken_rule(name: str) -> None:
    failures = failing_seeds(MUTATIONS[name], range(WITHIN), first_only=True)
    assert failures, f"no seed of the first {WITHIN} noticed the mutation {name!r}"
    print(f"\n{name}: caught by seed {failures[0].seed}: {failures[0].problem[:160]}")

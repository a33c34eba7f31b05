"""The simulation catches a broken rule: each mutation of ``tests.sim.mutations`` (one rule
of the algorithm switched off by a monkeypatch, with the signature of what it replaces) must
make a seed fail within the first ``WITHIN`` seeds, and on a property that rule guards - an
exception of the engine (a TypeError of a mutant that does not fit, say) is no catch.
(Measured over 200 seeds: see ``python3 -m tests.sim.mutations all 200``; the rarest,
``visibility-at-start``, ``start-idle-only`` and ``start-release-per-xid``, first fail at
seed 50.)"""

from __future__ import annotations

import inspect

import pytest

from tests.sim.errors import Property
from tests.sim.mutations import MUTATIONS, failing_seeds

WITHIN = 200


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_a_mutant_has_the_signature_of_what_it_replaces(name: str) -> None:
    mutation = MUTATIONS[name]
    original = getattr(mutation.target, mutation.attribute)
    assert inspect.signature(mutation.replacement) == inspect.signature(original), name
    assert mutation.breaks and Property.ENGINE_RAISED not in mutation.breaks


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_the_simulation_catches_a_broken_rule(name: str) -> None:
    mutation = MUTATIONS[name]
    failures = failing_seeds(mutation, range(WITHIN), first_only=True)
    assert failures, f"no seed of the first {WITHIN} noticed the mutation {name!r}"
    failure = failures[0]
    expected = sorted(str(p) for p in mutation.breaks)
    assert failure.broken in mutation.breaks, (
        f"{name}: seed {failure.seed} failed on {failure.broken or 'an exception'}, not on "
        f"{expected}: {failure.problem[:300]}"
    )
    print(f"\n{name}: caught by seed {failure.seed}: {failure.problem[:160]}")

"""`learned` is part of the phases' Protocols (policies/base.py): every registered allocation
and placement policy says whether a model decides, in agreement with the registry, and a
learned one has what serving needs (a card and a per-round copy that is learned too). The
operator runs only heuristic rounds settled and explores and records only learned phases, so
a policy that says the wrong thing would be served the wrong way."""

from __future__ import annotations

import pytest

from mlsched.formats.serving import serve
from mlsched.policies import registry
from mlsched.policies.exploration import Serving
from mlsched.workloads.speed_models import get_speed_model

POLICIES = [(phase, name) for phase in ("allocation", "placement")
            for name in registry.REGISTRY[phase]]


@pytest.mark.parametrize("phase,name", POLICIES, ids=[f"{p}/{n}" for p, n in POLICIES])
def test_a_policy_says_whether_it_is_learned_as_the_registry_does(phase, name):
    # (optimus-oracle exists only in the simulator, which gives it the true speeds)
    policy = registry.make(phase, name, registry.PolicyContext(speed_model=get_speed_model("measured")))
    assert policy.learned is registry.is_learned(phase, name)
    if policy.learned:
        assert policy.card is not None and policy.card.algorithm
        copy = policy.for_round(Serving())
        assert copy.learned and copy.name == policy.name
    else:  # nothing to explore or record: served as it is
        served = serve({phase: policy}, namespace="ns", policy="p", interval=1, kind="round",
                       time="t", epsilon=0.5, record=True)
        assert served.phases[phase] is policy and served.recorders == []


def test_sticky_and_the_placement_guard_say_what_they_wrap():
    from mlsched.policies.placement.guarded import GuardedPlacement
    from mlsched.policies.placement.heuristics import BinPack
    from mlsched.policies.placement.sticky import Sticky

    assert not Sticky(BinPack()).learned
    assert not GuardedPlacement(Sticky(BinPack()), Sticky(BinPack())).learned
    harmony = registry.make_placement("harmony", registry.PolicyContext(placement_guard=False))
    assert isinstance(harmony, Sticky) and harmony.learned
    assert GuardedPlacement(harmony, Sticky(BinPack())).learned

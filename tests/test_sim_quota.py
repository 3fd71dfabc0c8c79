"""A namespace quota in the simulator (sim/quota.py): every allocation policy, heuristic or
learned, is run under the quota as the operator serves it (Snapshot.budget), and the
simulator checks each decision against it as it checks node capacity."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mlsched.cluster.types import Decision, JobDecision
from mlsched.policies import registry
from mlsched.sim import quota
from mlsched.sim.simulator import SimConfig, Simulator
from mlsched.workloads import generators
from mlsched.workloads.speed_models import get_speed_model

ALLOCATIONS = [name for name in registry.REGISTRY["allocation"]
               if name not in ("fixed", "chic-pair")]  # (fixed: all or nothing, one gang each)


def test_a_quota_is_read_with_a_clear_error_for_what_is_not_one():
    assert quota.parse("cpu=32, gpu=8") == (32.0, 8.0, math.inf)
    assert quota.parse("mem=256") == (math.inf, math.inf, 256.0)
    for bad, says in (("gpus=8", "RESOURCE one of cpu, gpu, mem"), ("gpu=eight", "not a number"),
                      ("gpu=-1", ">= 0"), ("", "bounds nothing"), ("gpu", "RESOURCE=AMOUNT")):
        with pytest.raises(ValueError, match=says):
            quota.parse(bad)


@pytest.mark.parametrize("allocation", ALLOCATIONS)
def test_every_allocation_keeps_within_the_quota_and_is_held_back_by_it(allocation):
    trace = generators.generate(jobs=12, rate=6.0, seed=5)
    gpus = 6.0  # of the 13 nodes' 26
    results = {}
    for bound in (None, (math.inf, gpus, math.inf)):
        sim = Simulator(trace, SimConfig(nodes=13, seed=1, quota=bound))
        ctx = registry.PolicyContext(speed_model=get_speed_model("measured"))
        peak = 0.0
        original = sim.advance

        def advance(decision, admit=None):
            nonlocal peak
            peak = max(peak, _gpus_requested(sim, decision))
            return original(decision, admit)

        sim.advance = advance
        result = sim.run(registry.make_allocation(allocation, ctx), registry.make_placement("load-balance"))
        assert result.completed == len(trace)
        results[bound] = (result.summary()["avg_jct_s"], peak)
    (free_jct, free_peak), (held_jct, held_peak) = results.values()
    assert held_peak <= gpus < free_peak  # the quota bound what the policy would have used
    assert held_jct > free_jct


def _gpus_requested(sim: Simulator, decision: Decision) -> float:
    models = {s.spec.name: s.spec.model for s in sim.active}
    return float(sum(sim.config.demand(models[name], role)[1] * len(placed)
                     for name, d in decision.jobs.items()
                     for role, placed in (("ps", d.ps_nodes), ("worker", d.worker_nodes))))


def test_a_decision_past_the_quota_fails_the_run_as_one_past_capacity_does():
    trace = generators.generate(jobs=3, rate=6.0, seed=2)
    sim = Simulator(trace, SimConfig(nodes=4, quota=(math.inf, 1.0, math.inf)))
    sim.time_s = max(j.arrival_s for j in trace)
    sim._admit()
    gpu_job = next(s.spec for s in sim.active if sim.config.demand(s.spec.model, "worker")[1] > 0)
    over = Decision({gpu_job.name: JobDecision(ps_nodes=(0,), worker_nodes=(1, 2))})
    with pytest.raises(quota.QuotaExceeded, match="gpu in all, over the quota's 1"):
        sim.advance(over)
    assert quota.budget(None) is None
    np.testing.assert_array_equal(quota.budget((1.0, 2.0, math.inf)), [1.0, 2.0, math.inf])

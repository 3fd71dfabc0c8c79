"""Jobs restricted to GPU types in the simulator (a trace's gpu_types column,
sim/gpu_restrictions.py): every allocation policy, with a type-blind and the type-aware
placement, keeps a restricted job's workers on its types, as the ledger keeps them in the
cluster; a trace that cannot be honoured is refused with a clear error."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mlsched.cluster.types import Decision, JobDecision
from mlsched.policies import registry
from mlsched.sim.gpu_restrictions import ConstraintViolated
from mlsched.sim.simulator import SimConfig, Simulator
from mlsched.workloads import generators, gpu_types, traces
from mlsched.workloads.speed_models import get_speed_model

ALLOCATIONS = [name for name in registry.REGISTRY["allocation"] if name not in ("fixed", "chic-pair")]
TYPES = gpu_types.parse_cluster("v100:2,p100:2,k80:3")


def _restricted_trace():
    trace = generators.generate(jobs=10, rate=6.0, seed=9)
    # every other job to the K80s, one to the V100s and P100s, the rest anywhere
    return [replace(j, gpu_types=("k80",) if i % 2 else (("v100", "p100") if i == 4 else ()))
            for i, j in enumerate(trace)]


@pytest.mark.parametrize("placement", ["load-balance", "gpu-type-aware"])
@pytest.mark.parametrize("allocation", ALLOCATIONS)
def test_every_policy_keeps_restricted_workers_on_their_types(allocation, placement):
    trace = _restricted_trace()
    sim = Simulator(trace, SimConfig(nodes=len(TYPES), seed=1, gpu_types=TYPES))
    seen: dict[str, set[str]] = {}
    original = sim.advance

    def advance(decision, admit=None):
        for name, d in decision.jobs.items():
            seen.setdefault(name, set()).update(TYPES[n] for n in d.worker_nodes)
        return original(decision, admit)

    sim.advance = advance
    ctx = registry.PolicyContext(speed_model=get_speed_model("measured"))
    result = sim.run(registry.make_allocation(allocation, ctx), registry.make_placement(placement, ctx))
    assert result.completed == len(trace)
    for job in trace:
        if job.gpu_types:
            assert seen[job.name] <= set(job.gpu_types), (job.name, seen[job.name])
    assert any(seen[j.name] - {"k80"} for j in trace if not j.gpu_types)  # others go elsewhere too


def test_a_worker_off_its_types_fails_the_run():
    trace = _restricted_trace()
    sim = Simulator(trace, SimConfig(nodes=len(TYPES), gpu_types=TYPES))
    sim.time_s = trace[-1].arrival_s
    sim._admit()
    k80_job = next(s.spec for s in sim.active if s.spec.gpu_types == ("k80",))
    off = Decision({k80_job.name: JobDecision(ps_nodes=(4,) if k80_job.arch == "ps" else (),
                                              worker_nodes=(0,))})  # node 0: a V100
    with pytest.raises(ConstraintViolated, match=f"job {k80_job.name} has a worker on node-0, of "
                                                 "GPU type v100, outside its types k80"):
        sim.advance(off)


def test_a_restriction_the_cluster_cannot_honour_is_refused_clearly():
    trace = _restricted_trace()
    with pytest.raises(ValueError, match="restricts its GPU types .* give them types"):
        Simulator(trace, SimConfig(nodes=7))
    with pytest.raises(ValueError, match="may use GPU types k80, which no node of the cluster has"):
        Simulator(trace, SimConfig(nodes=4, gpu_types=gpu_types.parse_cluster("v100:2,p100:2")))


def test_the_trace_column_reads_and_writes_and_names_a_bad_type():
    text = "name,arrival_s,model,epochs,gpu_types\na,0,resnet-50,3,V100|p100\nb,5,vgg-16,2,\n"
    a, b = traces.parse(text, "t.csv")
    assert a.gpu_types == ("v100", "p100") and b.gpu_types == ()
    assert traces.parse(traces.dumps([a, b])) == [a, b]
    assert "gpu_types" not in traces.dumps([b])  # a trace without restrictions is as before
    with pytest.raises(traces.TraceError, match="t.csv:2: gpu_types: unknown GPU type 'a100'"):
        traces.parse("name,arrival_s,model,epochs,gpu_types\na,0,resnet-50,3,a100\n", "t.csv")

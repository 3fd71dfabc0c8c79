"""The regret guard in the operator (controller/scheduling/guard.py, issue 51 part 3): status.guard, the
GuardTripped condition, its Events and metric, the fallback serving while tripped, a spec edit
re-enabling the model, and a failed estimate reported without stopping the learned policy."""

from __future__ import annotations

import pytest

from mlsched.api import get_condition
from mlsched.controller.scheduling import guard, loop
from mlsched.policies import registry
from mlsched.policies.regret_guard import LEARNED, Estimate, GuardSpec, GuardState
from mlsched.sim.regret_guard import interval_record
from mlsched.sim.simulator import SimConfig, Simulator
from mlsched.policies.round import run_round
from mlsched.workloads import generators
from builders import (
    NOW, NS, create_jobs, cluster, make_runtime, policy, ps_job, recorded, run,
)

GUARD = {"fallbackWhenWorseBy": "10%", "window": 2}


def round_(rt, kube, k: int):
    return recorded(rt, loop.run_policy_round(rt, kube.obj("SchedulingPolicy", NS, "default"),
                                              kube.indexes(), now=NOW + 1200 * k))


def status(kube) -> dict:
    return kube.obj("SchedulingPolicy", NS, "default")["status"]


def condition(kube, kind: str = "GuardTripped"):
    return get_condition(status(kube)["conditions"], kind)


def events(kube, reason: str) -> list[dict]:
    return [e for e in kube.events("default") if e["reason"] == reason]


def metric(rt, name: str = "mlsched_guard_tripped", **labels) -> float | None:
    return rt.process.metrics.registry.get_sample_value(name, {"namespace": NS, "policy": "default", **labels})


def progress(rt, kube, k: int) -> None:
    """Every job reports 1 epoch more per round (what the emulator would)."""
    for job in kube.indexes().jobs_of_policy(NS, "default"):
        rt.jobs.progress[job.key] = (float(k), NOW + 1200 * k, 1.0 / 1200, None)


def chic_cluster(jobs: int = 6):
    rt, kube = make_runtime(cluster(30))
    kube.put(policy("default", allocation="chic", guard=GUARD))
    run(create_jobs(rt, kube, *(ps_job(f"job-{i}", max_workers=2) for i in range(jobs))))
    return rt, kube


def test_a_window_is_collected_then_judged_with_both_estimates_and_the_error():
    rt, kube = chic_cluster()
    assert round_(rt, kube, 0).allocation == "chic"
    cond = condition(kube)
    assert (cond.status, cond.reason) == ("False", "CollectingWindow")
    assert status(kube)["guard"]["window"] == 2 and status(kube)["guard"]["tripped"] is False
    for k in (1, 2):
        progress(rt, kube, k)
        round_(rt, kube, k)
    g = status(kube)["guard"]
    assert g["learnedEstimate"] > 0 and g["fallbackEstimate"] > 0 and g["recorded"] > 0
    assert g["served"] == "learned"
    assert g["estimateError"] == pytest.approx((g["learnedEstimate"] - g["recorded"]) / g["recorded"],
                                               abs=1e-5)
    cond = condition(kube)
    assert cond.reason in ("ModelServing", "FallbackAhead")
    assert "learned" in cond.message and "fallback" in cond.message
    assert metric(rt, "mlsched_guard_estimate", estimate="learned") == pytest.approx(g["learnedEstimate"])


def test_while_tripped_the_fallback_serves_and_a_spec_edit_brings_the_model_back():
    rt, kube = chic_cluster()
    round_(rt, kube, 0)
    book = rt.scheduling.per_policy.guards[(NS, "default")]
    bad = Estimate(1.0, 2.0, 1.0, LEARNED, 2, 6)
    book.state = GuardState(True, NOW, book.state.generation, bad)
    report = round_(rt, kube, 1)
    assert report.allocation == "drf"  # the fallback decided this round
    cond = condition(kube)
    assert (cond.status, cond.reason) == ("True", "FallbackAhead")
    assert "1 x learned" not in cond.message and "2.00 x learned" in cond.message
    ready = condition(kube, "Ready")
    assert (ready.status, ready.reason) == ("True", "FallbackActive")
    assert "regret guard" in ready.message
    assert metric(rt) == 1.0 and status(kube)["guard"]["tripped"] is True

    pol = kube.obj("SchedulingPolicy", NS, "default")
    pol["metadata"]["generation"] = (pol["metadata"].get("generation") or 1) + 1
    assert round_(rt, kube, 2).allocation == "chic"
    assert condition(kube).status == "False" and metric(rt) == 0.0
    [cleared] = events(kube, "GuardCleared")
    assert cleared["type"] == "Normal" and "edited" in cleared["message"]

    # Tripped again, then the guard itself edited (a longer window): cleared the same way.
    book = rt.scheduling.per_policy.guards[(NS, "default")]
    book.state = GuardState(True, NOW, book.state.generation, bad)
    assert round_(rt, kube, 3).allocation == "drf"
    pol = kube.obj("SchedulingPolicy", NS, "default")
    pol["spec"]["guard"] = {"fallbackWhenWorseBy": "20%", "window": 4}
    pol["metadata"]["generation"] += 1
    assert round_(rt, kube, 4).allocation == "chic"
    assert len(events(kube, "GuardCleared")) == 2 and status(kube)["guard"]["window"] == 4


def test_a_failed_estimate_is_unknown_and_the_model_keeps_serving(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("replay exploded")

    monkeypatch.setattr(guard, "estimate", broken)
    rt, kube = chic_cluster()
    for k in range(3):
        progress(rt, kube, k)
        assert round_(rt, kube, k).allocation == "chic"
    cond = condition(kube)
    assert (cond.status, cond.reason) == ("Unknown", "EstimateFailed")
    assert "replay exploded" in cond.message and "keeps serving" in cond.message
    assert metric(rt) == 0.0


def test_without_a_guard_or_a_learned_model_there_is_no_condition():
    rt, kube = make_runtime(cluster(4))
    kube.put(policy("default", allocation="drf", guard=GUARD))
    run(create_jobs(rt, kube, ps_job("job-0")))
    round_(rt, kube, 0)
    assert condition(kube) is None and "guard" not in status(kube) and metric(rt) is None


def test_the_guard_trips_on_records_of_chic_on_30_nodes_and_says_so():
    """The pure part on the simulator's records of the issue's case: a Warning Event with
    both estimates once the window shows the fallback ahead."""
    trace = generators.generate(jobs=80, seed=31)
    sim = Simulator(trace, SimConfig(nodes=30, seed=31))
    chic, lb = registry.make_allocation("chic"), registry.make_placement("load-balance")
    book = guard.GuardBook(GuardSpec(0.10, 6), cluster=(sim.config, sim.node_names))
    change = None
    while not sim.done and change is None:
        before, start = {s.spec.name: s.epochs_done for s in sim.active}, sim.time_s
        decision = run_round(sim.snapshot(), chic, lb)
        reward = sim.advance(decision)
        change = guard.add_and_judge(book, [interval_record(sim, start, before, decision, reward, sim.slot)],
                                     (chic, lb), (registry.make_allocation("drf"), lb), sim.time_s)
    assert change == "tripped" and book.state.tripped
    kind, reason, message = guard.event(change, False, book)
    assert (kind, reason) == ("Warning", "GuardTripped")
    assert "learned" in message and "fallback" in message and "off the records" in message
    assert guard.status_of(book)["tripped"] is True


def test_a_guard_beyond_1000_percent_is_an_invalid_spec_said_so():
    rt, kube = make_runtime(cluster(4))
    kube.put(policy("default", allocation="chic", guard={"fallbackWhenWorseBy": "1500%", "window": 3}))
    run(loop.run_policy_round(rt, kube.obj("SchedulingPolicy", NS, "default"), kube.indexes(), now=NOW))
    ready = condition(kube, "Ready")
    assert ready.status == "False" and "fallbackWhenWorseBy" in ready.message
    assert "1000 %" in ready.message

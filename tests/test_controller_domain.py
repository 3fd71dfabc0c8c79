"""ModelInDomain in the operator (controller/scheduling/domain.py, issue 51 part 1), as a user sees it
on the SchedulingPolicy: the shipped `chic` (trained on one pool of 10 GPUs and 120 CPUs)
served on 30 ordinary nodes says ModelInDomain=False naming what is outside, with a Warning
Event and the metric at 0; on the setting it was trained for, True; heuristics, no condition;
a model whose card records no domain, Unknown."""

from __future__ import annotations

import json
from pathlib import Path

from mlsched.api import get_condition
from mlsched.controller.scheduling import loop
from builders import (
    NOW, NS, MemoryKube, cluster, create_jobs, make_runtime, node, policy, ps_job, recorded, run,
)

ARTIFACTS = Path(__file__).resolve().parents[1] / "policy_models" / "artifacts"


def round_(rt, kube, k: int = 0):
    return recorded(rt, loop.run_policy_round(rt, kube.obj("SchedulingPolicy", NS, "default"),
                                              kube.indexes(), now=NOW + 1200 * k))


def in_domain(kube):
    return get_condition(kube.obj("SchedulingPolicy", NS, "default")["status"]["conditions"],
                         "ModelInDomain")


def events(kube, reason: str) -> list[dict]:
    return [e for e in kube.events("default") if e["reason"] == reason]


def gauge(rt) -> float | None:
    return rt.process.metrics.registry.get_sample_value(
        "mlsched_model_in_domain", {"namespace": NS, "policy": "default"})


def test_chic_on_30_nodes_is_outside_its_domain_and_says_what_is_outside():
    rt, kube = make_runtime(cluster(30))
    kube.put(policy("default", allocation="chic"))
    run(create_jobs(rt, kube, *(ps_job(f"job-{i}", max_workers=2) for i in range(4))))

    assert round_(rt, kube, 0).allocation == "chic"
    cond = in_domain(kube)
    assert (cond.status, cond.reason) == ("False", "OutsideTrainedDomain")
    assert cond.message == ("allocation chic: nodes 30 outside trained 1–1; node GPUs 2 outside "
                            "trained 10–10; node CPUs 8 outside trained 120–120")
    [warning] = events(kube, "ModelOutsideDomain")
    assert warning["type"] == "Warning" and "nodes 30 outside trained 1–1" in warning["message"]
    assert gauge(rt) == 0.0

    round_(rt, kube, 1)  # still outside: no second Event
    assert len(events(kube, "ModelOutsideDomain")) == 1

    pol = kube.obj("SchedulingPolicy", NS, "default")
    pol["spec"]["allocation"] = "drf"  # a heuristic: no condition, no series
    pol["metadata"]["generation"] = 2
    round_(rt, kube, 2)
    assert in_domain(kube) is None and gauge(rt) is None
    assert get_condition(kube.obj("SchedulingPolicy", NS, "default")["status"]["conditions"],
                         "Ready").status == "True"


def test_chic_on_the_pool_it_was_trained_for_is_inside_and_coming_back_is_a_normal_event():
    kube = MemoryKube()
    kube.put(node("pool-0", cpu="120", gpu="10", memory="600Gi"))
    rt, kube = make_runtime(kube)
    kube.put(policy("default", allocation="chic"))
    run(create_jobs(rt, kube, *(ps_job(f"job-{i}", max_workers=2) for i in range(4))))

    round_(rt, kube, 0)
    cond = in_domain(kube)
    assert (cond.status, cond.reason) == ("True", "InsideTrainedDomain")
    assert cond.message == "allocation chic: 1 node and 4 jobs inside the trained domain"
    assert gauge(rt) == 1.0
    assert events(kube, "ModelOutsideDomain") == [] and events(kube, "ModelInDomain") == []

    for i in range(2):  # the cluster grows far past the pool: outside, then back
        kube.put(node(f"extra-{i}", cpu="120", gpu="10", memory="600Gi"))
    for i in range(2, 40):
        kube.put(node(f"small-{i}"))
    round_(rt, kube, 1)
    assert in_domain(kube).status == "False" and "nodes 41 outside trained 1–1" in in_domain(kube).message
    for name in ["extra-0", "extra-1", *(f"small-{i}" for i in range(2, 40))]:
        del kube.objects[("Node", "", name)]
    round_(rt, kube, 2)
    assert in_domain(kube).status == "True"
    [back] = events(kube, "ModelInDomain")
    assert back["type"] == "Normal"


def test_a_model_whose_card_records_no_domain_is_unknown(tmp_path):
    raw = json.loads((ARTIFACTS / "chic" / "chic.card.json").read_text())
    del raw["domain"]  # as a user's own model's card
    (tmp_path / "chic.onnx").write_bytes((ARTIFACTS / "chic" / "chic.onnx").read_bytes())
    (tmp_path / "chic.card.json").write_text(json.dumps(raw))
    rt, kube = make_runtime(cluster(30), model_dirs=[str(tmp_path)])
    kube.put(policy("default", allocation="chic",
                    models={"allocation": {"chic": {"path": str(tmp_path / "chic.onnx")}}}))
    run(create_jobs(rt, kube, ps_job("job-0", max_workers=2)))

    assert round_(rt, kube).allocation == "chic"
    cond = in_domain(kube)
    assert (cond.status, cond.reason) == ("Unknown", "NoDomainInCard")
    assert "allocation chic records no training domain" in cond.message
    assert gauge(rt) is None and events(kube, "ModelOutsideDomain") == []


def test_outside_wins_over_unknown_and_events_follow_changes_only():
    from mlsched.controller.scheduling import domain
    from mlsched.features.card import ModelCard
    from mlsched.policies.model_domain import RoundShape

    chic = ModelCard.read(ARTIFACTS / "chic" / "chic.card.json")
    bare = ModelCard.from_json({k: v for k, v in chic.to_json().items() if k != "domain"})
    thirty = RoundShape(30, (2.0,) * 30, (8.0,) * 30, 4, frozenset({"resnet-50"}), frozenset({"ps"}))
    both = domain.verdict([("allocation chic", chic), ("placement mine", bare)], thirty)
    assert (both.status, both.reason, both.gauge) == ("False", "OutsideTrainedDomain", 0.0)
    unknown = domain.verdict([("placement mine", bare)], thirty)
    assert (unknown.status, unknown.gauge) == ("Unknown", None)
    assert domain.verdict([], thirty) is None
    assert domain.event(None, both)[:2] == ("Warning", "ModelOutsideDomain")
    assert domain.event("False", both) is None
    inside = domain.DomainVerdict("True", domain.INSIDE, "in")
    assert domain.event("False", inside)[:2] == ("Normal", "ModelInDomain")
    assert domain.event(None, inside) is None and domain.event("Unknown", inside) is None
    assert domain.event("True", None) is None


def test_the_untyped_dl2_on_typed_nodes_is_outside_its_domain_and_the_typed_model_is_not():
    """Issue 54: nodes labelled with GPU products (V100, K80): the shipped `dl2`, trained on
    untyped clusters, says ModelInDomain=False naming the GPU types; the typed model
    (dl2-hetero, trained on them) is inside, on the same cluster and jobs."""
    kube = MemoryKube()
    for i in range(13):
        product = "Tesla-V100-SXM2-16GB" if i < 7 else "Tesla-K80"
        kube.put(node(f"node-{i}", labels={"nvidia.com/gpu.product": product}))
    rt, kube = make_runtime(kube)
    kube.put(policy("default", allocation="dl2", placement="gpu-type-aware"))
    run(create_jobs(rt, kube, *(ps_job(f"job-{i}", max_workers=2) for i in range(4))))

    round_(rt, kube, 0)
    cond = in_domain(kube)
    assert (cond.status, cond.reason) == ("False", "OutsideTrainedDomain")
    assert cond.message == ("allocation dl2: GPU types k80, v100 outside trained none "
                            "(untyped clusters)")

    pol = kube.obj("SchedulingPolicy", NS, "default")
    typed = ARTIFACTS / "dl2-hetero" / "dl2-hetero.onnx"
    pol["spec"]["models"] = {"allocation": {"dl2": {"path": str(typed)}}}
    pol["metadata"]["generation"] = 2
    round_(rt, kube, 1)
    cond = in_domain(kube)
    assert (cond.status, cond.reason) == ("True", "InsideTrainedDomain"), cond.message

"""Grouping in the cluster (controller/scheduling/pools.py): the snapshot a grouping decides on, pool
labels and their bookkeeping, affinity and CPU shares in pod templates, status.groups, and
rounds against the in-memory API seen from the user's side (labels, templates, status,
Events, metrics)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from mlsched.api import SchedulingPolicySpec
from mlsched.cluster.types import WAITING_POOL, PoolForecast, PoolPlan, Snapshot
from mlsched.controller.app import jobs
from mlsched.controller.scheduling import loop, pools
from mlsched.controller.objects.apply import refresh_plan
from mlsched.controller.kube.constants import POOL_LABEL, POOL_OWNER_ANNOTATION, STS_POOL_ANNOTATION
from mlsched.controller.objects.desired import (
    PodSettings, plan_statefulset, pod_template, statefulset_manifest, template_hash,
)
from mlsched.controller.serving.models import ResolvedPolicy, Verdict
from mlsched.controller.objects.records import PodPool, node_record, sts_record
from mlsched.controller.objects.job_records import job_record
from mlsched.policies import registry
from mlsched.policies.grouping.existing_pools import project
from builders import (
    NOW, NS, cluster, create_jobs, make_runtime, node, policy, ps_job, recorded, run,
)

SETTINGS = PodSettings(progress_url="http://op/v1/progress")
OWNER = f"{NS}/default"


def spec(**pools_) -> SchedulingPolicySpec:
    return SchedulingPolicySpec.model_validate({"grouping": "harmony", "pools": pools_})


def record(name, labels=None, owner=None):
    body = node(name, labels=labels)
    if owner:
        body["metadata"]["annotations"] = {POOL_OWNER_ANNOTATION: owner}
    return node_record(body)


# ---- names and the nodes a grouping may use ------------------------------------------------


def test_label_nodes_pools_are_named_after_namespace_and_policy_and_never_collide():
    a = pools.setup_for("team-a", "default", spec())
    b = pools.setup_for("team-b", "default", spec())
    assert (a.label_key, a.value("g0"), b.value("g0")) == (POOL_LABEL, "team-a.default.g0",
                                                          "team-b.default.g0")
    assert a.group_of("team-a.default.g0") == "g0" and a.group_of("team-b.default.g0") is None
    long = pools.setup_for("n" * 40, "p" * 40, spec())
    assert len(long.value("g12")) <= 63 and long.group_of(long.value("g12")) == "g12"
    existing = pools.setup_for("team-a", "default", spec(mode="ExistingPools",
                                                          labelKey="cloud.google.com/gke-nodepool"))
    assert (existing.label_key, existing.value("pool-1")) == ("cloud.google.com/gke-nodepool", "pool-1")


def test_label_nodes_accepts_only_the_operators_label_key():
    with pytest.raises(ValueError, match="labelKey is for ExistingPools"):
        spec(mode="LabelNodes", labelKey="node-role.kubernetes.io/worker")


def test_a_grouping_places_only_on_nodes_it_may_use():
    label_nodes = pools.setup_for(NS, "default", spec())
    assert pools.usable(record("free"), label_nodes)
    assert pools.usable(record("mine", {POOL_LABEL: "x"}, OWNER), label_nodes)
    assert not pools.usable(record("admins", {POOL_LABEL: "x"}), label_nodes)
    assert not pools.usable(record("others", {POOL_LABEL: "x"}, "team-b/default"), label_nodes)
    existing = pools.setup_for(NS, "default", spec(mode="ExistingPools", labelKey="pool"))
    assert pools.usable(record("a", {"pool": "a"}), existing)
    assert not pools.usable(record("unlabelled"), existing)


def test_configure_maps_spec_pools_onto_harmony_and_falls_back_without_the_flag():
    s = spec(threshold=0.2, minStaySeconds=600)

    def resolved():
        return ResolvedPolicy(registry.make_allocation("drf"), registry.make_placement("load-balance"),
                              registry.make_grouping("harmony"), "drf")

    r = resolved()
    setup = pools.configure(r, s, NS, "default", label_nodes=True, interval_scale=0.5)
    assert setup is not None and setup.mode == "LabelNodes"
    assert (r.grouping.config.threshold, r.grouping.config.min_pool_s) == (0.2, 300.0)
    r = resolved()
    assert pools.configure(r, s, NS, "default", label_nodes=False, interval_scale=1.0) is None
    assert r.grouping.name == "none" and r.ready.reason == "FallbackActive"
    assert "--label-nodes" in r.ready.message and "ExistingPools" in r.ready.message
    # ExistingPools writes no node: no flag needed.
    r = resolved()
    assert pools.configure(r, spec(mode="ExistingPools"), NS, "default", False, 1.0) is not None
    assert r.ready == Verdict(True, "Scheduling")


# ---- the snapshot: status is the memory ------------------------------------------------------


def _snapshot(names, jobs=()):
    return Snapshot(NOW, 1200.0, list(names), np.tile([8.0, 2.0, 48.0], (len(names), 1)), list(jobs))


def test_fill_reads_pools_in_force_join_times_and_shares_from_labels_and_status():
    from conftest import job as view

    setup = pools.setup_for(NS, "default", spec())
    nodes = {n.name: n for n in (record("n0", {POOL_LABEL: f"{NS}.default.g0"}, OWNER),
                                 record("n1", {POOL_LABEL: f"{NS}.default.g0"}, OWNER), record("n2"))}
    members = {"a": pools.Membership(f"{NS}.default.g0", NOW - 100), "b": pools.Membership(None, None)}
    status = {"groups": [{"name": f"{NS}.default.g0", "members": ["a"], "share": 2},
                         {"name": "someone-else", "share": 3}]}
    snap, labels = pools.fill(_snapshot(["n0", "n1", "n2"], [view("a"), view("b")]), setup, nodes,
                              members, status)
    assert snap.node_pools == ["g0", "g0", None]
    assert [(j.pool, j.pool_since_s) for j in snap.jobs] == [("g0", NOW - 100), (None, None)]
    assert snap.pool_shares == {"g0": 2}
    assert snap.divisible == (0,)  # GPUs are never divided in the cluster
    assert [j.phase_s for j in snap.jobs] == [None, None]  # not observable: the prior stands
    assert labels[:2] == [f"{NS}.default.g0"] * 2


def test_the_newer_in_memory_pool_wins_over_a_status_not_yet_written():
    rec = job_record({**ps_job("a"), "status": {"group": "old", "groupSince": "2026-01-01T00:00:00Z"}})
    assert pools.membership(rec, {}) == pools.Membership("old", rec.group_since_s)
    assert pools.membership(rec, {rec.key: pools.Membership("new", 5.0)}).group == "new"


# ---- labels: only the operator's own ---------------------------------------------------------


def test_label_changes_set_keep_and_remove_only_the_owners_labels():
    nodes = [record("fresh"), record("same", {POOL_LABEL: "v1"}, OWNER),
             record("moved", {POOL_LABEL: "v1"}, OWNER), record("dropped", {POOL_LABEL: "v2"}, OWNER),
             record("admin", {POOL_LABEL: "theirs"}), record("other", {POOL_LABEL: "v9"}, "x/y")]
    desired = {"fresh": "v1", "same": "v1", "moved": "v2", "admin": "v1", "other": "v1"}
    changes = {c.node: c.value for c in pools.label_changes(nodes, OWNER, desired)}
    assert changes == {"fresh": "v1", "moved": "v2", "dropped": None}
    remove = pools.LabelNode("dropped", None, OWNER).patch()
    assert remove == {"metadata": {"labels": {POOL_LABEL: None},
                                   "annotations": {POOL_OWNER_ANNOTATION: None}}}


def test_labels_of_deleted_policies_are_found_in_served_namespaces_only():
    nodes = [record("a", {POOL_LABEL: "x"}, f"{NS}/gone"), record("b", {POOL_LABEL: "y"}, OWNER),
             record("c", {POOL_LABEL: "z"}, "elsewhere/gone"), record("d", {POOL_LABEL: "w"})]
    found = pools.orphaned_labels(nodes, [(NS, "default")], ["team-*"])
    assert [(c.node, c.value) for c in found] == [("a", None)]


# ---- pod templates -----------------------------------------------------------------------------


def _job(**template_spec):
    body = ps_job("bert")
    body["metadata"]["uid"] = "u1"
    body["spec"]["replicaSpecs"]["worker"]["template"]["spec"].update(template_spec)
    return job_record(body)


def test_a_grouped_pod_requires_its_pool_and_requests_its_share_of_cpu_only():
    job = _job(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                              {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}]}}})
    plain = pod_template(job, "worker", {"ps": 1, "worker": 2}, SETTINGS)
    tpl = pod_template(job, "worker", {"ps": 1, "worker": 2}, SETTINGS, PodPool(POOL_LABEL, "p", 2))
    terms = tpl["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    need = {"key": POOL_LABEL, "operator": "In", "values": ["p"]}
    assert [t["matchExpressions"][-1] for t in terms] == [need, need]  # ANDed into every term
    assert [t["matchExpressions"][0]["values"] for t in terms] == [["a"], ["b"]]
    before = plain["spec"]["containers"][0]["resources"]["requests"]
    after = tpl["spec"]["containers"][0]["resources"]["requests"]
    from mlsched.controller.objects.quantities import parse_quantity

    assert parse_quantity(after["cpu"]) == pytest.approx(parse_quantity(before["cpu"]) / 2, abs=1e-3)
    assert after.get("nvidia.com/gpu") == before.get("nvidia.com/gpu")
    assert after["memory"] == before["memory"]
    assert POOL_LABEL not in str(plain["spec"]["affinity"])


def test_pod_level_cpu_is_shared_too_and_a_template_without_it_is_left_as_it_was():
    from mlsched.controller.objects.desired import share_cpu

    spec = {"containers": [{"name": "t", "resources": {"requests": {"cpu": "4"}}}],
            "resources": {"limits": {"cpu": "6", "memory": "8Gi"}}}
    share_cpu(spec, 2)
    assert spec["resources"]["requests"]["cpu"] == "3000m"  # what the scheduler reserves
    assert spec["containers"][0]["resources"]["requests"]["cpu"] == "2000m"
    plain = {"containers": [{"name": "t", "resources": {"requests": {"cpu": "4"}}}]}
    share_cpu(plain, 2)
    assert "resources" not in plain  # no pod-level block added: the template hash is unchanged


def test_changing_pool_is_a_template_change_and_refresh_keeps_the_pool():
    job = _job()
    counts = {"ps": 1, "worker": 2}
    a, b = PodPool(POOL_LABEL, "a", 2), PodPool(POOL_LABEL, "b", 2)
    assert len({template_hash(job, "worker", counts, SETTINGS, p) for p in (None, a, b)}) == 3
    sts = sts_record(statefulset_manifest(job, "worker", 2, counts, SETTINGS, a))
    assert sts.pool == a
    assert plan_statefulset(job, "worker", sts, counts, SETTINGS, a) is None
    moved = plan_statefulset(job, "worker", sts, counts, SETTINGS, b)
    assert moved is not None and moved.template is not None
    ops = {op["path"]: op["value"] for op in moved.patch()}
    assert PodPool.parse(ops["/metadata/annotations/" + STS_POOL_ANNOTATION.replace("/", "~1")]) == b
    ungrouped = plan_statefulset(job, "worker", sts, counts, SETTINGS, None)
    assert {op["path"]: op["value"] for op in ungrouped.patch()}[
        "/metadata/annotations/" + STS_POOL_ANNOTATION.replace("/", "~1")] == ""
    # A spec edit re-renders with the pool the StatefulSet has now.
    worker = {**job.templates["worker"], "metadata": {"labels": {"edited": "yes"}}}
    edited = dataclasses.replace(job, generation=job.generation + 1,
                                 templates={**job.templates, "worker": worker})
    (plan,) = refresh_plan(edited, [sts], SETTINGS)
    assert plan.pool == a and plan.template["metadata"]["labels"]["edited"] == "yes"
    assert _pool_values(plan.template) == {"a"}


def _pool_values(template):
    terms = template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return {e["values"][0] for t in terms for e in t["matchExpressions"] if e["key"] == POOL_LABEL}


# ---- status.groups and ExistingPools ---------------------------------------------------------


def test_groups_status_lists_members_nodes_share_and_forecast():
    setup = pools.setup_for(NS, "default", spec())
    snap = _snapshot(["n0", "n1", "n2"])
    plan = PoolPlan({"a": "g0", "b": "g0", "c": WAITING_POOL}, ("g0", "g0", None), {"g0": 2},
                    True, {"g0": PoolForecast(1.5, 0.8, 0.6, 2, 2)}, 0.07)
    (g,) = pools.groups_status(snap, plan, setup)
    assert g == {"name": f"{NS}.default.g0", "members": ["a", "b"], "nodes": ["n0", "n1"],
                 "nodeCount": 2, "share": 2, "predictedIterationSeconds": 1.5,
                 "predictedComputeUtilisation": 0.8, "predictedNetworkUtilisation": 0.6}
    assert pools.groups_status(snap, PoolPlan(), setup) == []
    many = [{**g, "name": f"p{i:04d}", "nodes": [f"n{k}" for k in range(2000)]} for i in range(600)]
    shown = pools.bounded(many)
    assert len(shown) == 512 and all(len(x["nodes"]) == 1024 and x["nodeCount"] == 2 for x in shown)
    assert pools.desired_labels(snap, plan, setup) == {"n0": f"{NS}.default.g0",
                                                       "n1": f"{NS}.default.g0"}


def test_existing_pools_take_the_groups_whole_and_keep_a_pool_in_force():
    from conftest import job as view

    labels = ["big", "big", "big", "small", None]
    snap = _snapshot(["n0", "n1", "n2", "n3", "n4"],
                     [dataclasses.replace(view("a"), pool="small", workers=1), view("b"), view("c")])
    plan = PoolPlan({"a": "small", "b": "g0", "c": "g1"}, ("g0", "g0", "small", "g1", "g1"),
                    {"small": 1, "g0": 1, "g1": 1}, True,
                    {"g0": PoolForecast(1.0, 0.5, 0.5, 1, 2)})
    out = project(plan, labels, snap)
    assert out.job_pools == {"a": "small", "b": "big", "c": WAITING_POOL}  # no pool left for c
    assert out.node_pools == ("big", "big", "big", "small", None)
    assert out.forecasts["big"].nodes == 3 and out.moved == ()


# ---- rounds against the in-memory API ----------------------------------------------------------


def _round(rt, kube, name="default", now=NOW):
    return recorded(rt, loop.run_policy_round(rt, kube.obj("SchedulingPolicy", NS, name),
                                              kube.indexes(), now=now))


def _labelled(kube):
    return {n["metadata"]["name"]: ((n["metadata"].get("labels") or {}).get(POOL_LABEL),
                                    (n["metadata"].get("annotations") or {}).get(POOL_OWNER_ANNOTATION))
            for n in kube.of_kind("Node") if POOL_LABEL in (n["metadata"].get("labels") or {})}


def _affinity(kube, sts):
    spec = kube.obj("StatefulSet", NS, sts)["spec"]["template"]["spec"]
    terms = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    return {e["values"][0] for t in terms for e in t.get("matchExpressions") or () if e["key"] == POOL_LABEL}


def _modelled(name, model, **kw):
    body = ps_job(name, **kw)
    body["spec"]["modelType"] = model
    return body


def _grouped(**kw):
    """bert (dssm: computes most of an iteration) and vgg (wlm: communicates most) share a
    pool on one node; resnet has the other two alone, ungrouped: a group of one job gets no
    pool (HarmonyConfig.min_members)."""
    rt, kube = make_runtime(cluster(3), label_nodes=True, **kw)
    kube.put(node("admins", labels={POOL_LABEL: "reserved"}))
    kube.put(policy(grouping="harmony", pools={"minStaySeconds": 0}))
    run(create_jobs(rt, kube, _modelled("bert", "dssm", max_workers=2),
                    _modelled("vgg", "wlm", max_workers=2),
                    _modelled("resnet", "resnet-50", max_workers=2)))
    return rt, kube


def test_a_grouping_round_labels_its_nodes_pins_pods_to_them_and_says_so():
    rt, kube = _grouped()
    report = _round(rt, kube)
    groups = kube.obj("SchedulingPolicy", NS, "default")["status"]["groups"]
    assert groups and {m for g in groups for m in g["members"]} == {"bert", "vgg"}
    labelled = _labelled(kube)
    assert labelled.pop("admins") == ("reserved", None)  # an admin's label: never touched
    assert labelled == {n: (g["name"], OWNER) for g in groups for n in g["nodes"]}
    for g in groups:
        for job in g["members"]:
            status = kube.obj("MLJob", NS, job)["status"]
            assert status["group"] == g["name"] and status["groupSince"]
            assert _affinity(kube, f"{job}-worker") == {g["name"]}
            assert set(report.targets[job].nodes["worker"]) <= set(g["nodes"])
            assert "admins" not in report.targets[job].nodes["worker"]
    pol = kube.obj("SchedulingPolicy", NS, "default")["status"]
    assert pol["grouping"]["labelKey"] == POOL_LABEL and pol["grouping"]["lastRegroupingTime"]
    assert [e["reason"] for e in kube.events("default")].count("Regrouped") == 1
    assert {e["reason"] for e in kube.events("bert")} >= {"Grouped"}
    metrics = rt.process.metrics.render().decode()
    assert f'mlsched_pool_utilisation{{kind="predicted",namespace="{NS}",policy="default",pool="{groups[0]["name"]}"' in metrics
    # A second round with nothing new changes nothing and says nothing.
    kube.calls.clear()
    _round(rt, kube, now=NOW + 60)
    assert [c for c in kube.writes() if c[1] in ("Node", "StatefulSet")] == []
    assert [e["reason"] for e in kube.events("default")].count("Regrouped") == 1


def test_a_restarted_operator_keeps_the_groups_status_remembers():
    rt, kube = _grouped()
    _round(rt, kube)
    before = kube.obj("SchedulingPolicy", NS, "default")["status"]["groups"]
    fresh, _ = make_runtime(kube, label_nodes=True)  # a new process: nothing in memory
    kube.calls.clear()
    _round(fresh, kube, now=NOW + 60)
    assert kube.obj("SchedulingPolicy", NS, "default")["status"]["groups"] == before
    assert [c for c in kube.writes() if c[1] in ("Node", "StatefulSet")] == []


def test_grouping_off_removes_the_affinity_the_labels_and_the_status():
    rt, kube = _grouped()
    _round(rt, kube)
    run(kube.patch("SchedulingPolicy", NS, "default", {"spec": {"grouping": "none"}}))
    _round(rt, kube, now=NOW + 60)
    assert _labelled(kube) == {"admins": ("reserved", None)}
    for job in ("bert", "vgg"):
        assert _affinity(kube, f"{job}-worker") == set()
        assert kube.obj("MLJob", NS, job)["status"].get("group") is None
    pol = kube.obj("SchedulingPolicy", NS, "default")["status"]
    assert pol["groups"] == [] and pol.get("grouping") is None
    assert "mlsched_pool_utilisation{" not in rt.process.metrics.render().decode()
    assert any(e["message"].startswith("no pools: grouping is off") for e in kube.events("default")
               if e["reason"] == "Regrouped")
    assert any(e["message"].startswith("left pool ") for e in kube.events("bert")
               if e["reason"] == "Grouped")


def test_label_nodes_without_the_flag_groups_with_none_and_says_why():
    rt, kube = make_runtime(cluster(2))
    kube.put(policy(grouping="harmony"))
    run(create_jobs(rt, kube, ps_job("bert", max_workers=2)))
    _round(rt, kube)
    pol = kube.obj("SchedulingPolicy", NS, "default")["status"]
    ready = next(c for c in pol["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "FallbackActive" and "--label-nodes" in ready["message"]
    assert _labelled(kube) == {} and not pol.get("groups")
    assert _affinity(kube, "bert-worker") == set()


def test_a_deleted_job_leaves_no_pool_behind():
    rt, kube = _grouped()
    _round(rt, kube)
    run(kube.delete("MLJob", NS, "vgg"))
    _round(rt, kube, now=NOW + 60)
    # bert is left alone in its pool: a pool of one job is no pool, its label goes.
    assert kube.obj("SchedulingPolicy", NS, "default")["status"]["groups"] == []
    assert _labelled(kube) == {"admins": ("reserved", None)}
    assert kube.obj("MLJob", NS, "bert")["status"].get("group") is None
    assert _affinity(kube, "bert-worker") == set()


def test_a_deleted_policy_releases_its_nodes_and_its_jobs_templates():
    rt, kube = _grouped()
    _round(rt, kube)
    run(kube.delete("SchedulingPolicy", NS, "default"))
    clock = iter([100.0, 110.0, 131.0]).__next__
    # Not at once: right after a start the index may not show a policy yet.
    run(jobs.release_orphaned_pools(rt, kube.indexes(), clock=clock))
    run(jobs.release_orphaned_pools(rt, kube.indexes(), clock=clock))
    assert len(_labelled(kube)) > 1 and _affinity(kube, "bert-worker")
    run(jobs.release_orphaned_pools(rt, kube.indexes(), clock=clock))
    assert _labelled(kube) == {"admins": ("reserved", None)}
    for job in ("bert", "vgg"):
        assert _affinity(kube, f"{job}-worker") == set()


def test_existing_pools_use_the_admins_pools_and_write_no_node():
    rt, kube = make_runtime(cluster(0))
    for i, pool in enumerate(["a", "a", "b", "b"]):
        kube.put(node(f"n{i}", labels={"example.com/pool": pool}))
    kube.put(node("unlabelled"))
    kube.put(policy(grouping="isolated", pools={"mode": "ExistingPools",
                                                "labelKey": "example.com/pool"}))
    run(create_jobs(rt, kube, ps_job("bert", max_workers=2), ps_job("vgg", max_workers=2)))
    report = _round(rt, kube)
    assert [c for c in kube.writes() if c[1] == "Node"] == []
    groups = kube.obj("SchedulingPolicy", NS, "default")["status"]["groups"]
    assert sorted(g["name"] for g in groups) == ["a", "b"]
    for g in groups:
        (job,) = g["members"]
        assert _affinity_key(kube, f"{job}-worker") == ("example.com/pool", g["name"])
        assert set(report.targets[job].nodes["worker"]) <= set(g["nodes"])


def _affinity_key(kube, sts):
    spec = kube.obj("StatefulSet", NS, sts)["spec"]["template"]["spec"]
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    (expr,) = term["matchExpressions"]
    return expr["key"], expr["values"][0]


# ---- the flag, the metric, the threshold across an arrival --------------------------------------


def test_label_nodes_is_off_unless_asked_for(monkeypatch):
    from mlsched.controller.__main__ import export, parse_args
    from mlsched.controller.process.config import OperatorConfig

    assert OperatorConfig().label_nodes is False
    assert OperatorConfig.from_env({}).label_nodes is False
    assert OperatorConfig.from_env({"MLSCHED_LABEL_NODES": "true"}).label_nodes is True
    monkeypatch.delenv("MLSCHED_LABEL_NODES", raising=False)
    export(parse_args([]))
    assert OperatorConfig.from_env().label_nodes is False
    export(parse_args(["--label-nodes"]))
    assert OperatorConfig.from_env().label_nodes is True
    monkeypatch.delenv("MLSCHED_LABEL_NODES")


def test_observed_utilisation_scales_the_forecast_by_reported_over_predicted_speed():
    from conftest import job as view

    snap = _snapshot(["n0"], [view("a", model="dssm"), view("b", model="wlm")])
    plan = PoolPlan({"a": "g0", "b": "g0"}, ("g0",), {"g0": 2}, True,
                    {"g0": PoolForecast(1.0, 0.6, 0.8, 2, 1)})
    counts = {"a": (1, 1), "b": (1, 1)}
    assert pools.utilisation(snap, plan, counts, {}) == {
        "g0": {"predicted_compute": 0.6, "predicted_network": 0.8}}  # nobody reports yet
    row = pools.utilisation(snap, plan, counts, {"a": 1e-3, "b": 1e-3})["g0"]
    slower = pools.utilisation(snap, plan, counts, {"a": 5e-4, "b": 5e-4})["g0"]
    assert row["observed_compute"] / row["observed_network"] == pytest.approx(0.6 / 0.8)
    assert slower["observed_compute"] == pytest.approx(row["observed_compute"] / 2)


def _jobs(kube, *names_models):
    from mlsched_objects import mljob

    out = []
    for name, model in names_models:
        body = mljob(name, model=model)
        body["metadata"]["namespace"] = NS
        out.append(body)
    return out


@pytest.mark.parametrize("threshold, regroups", [(0.0, True), (10.0, False)])
def test_an_arrival_regroups_running_jobs_only_above_the_threshold(threshold, regroups):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))
    # a (dssm) and b (wlm) share a pool, r (resnet-50) runs ungrouped; c (seq2seq) arrives:
    # a fresh grouping pairs a with c (b leaves the pool), 8 % better by the prediction.
    rt, kube = make_runtime(cluster(3), label_nodes=True)
    run(create_jobs(rt, kube, *_jobs(kube, ("a", "dssm"), ("b", "wlm"), ("r", "resnet-50"))))
    kube.put(policy(grouping="harmony", pools={"minStaySeconds": 0, "threshold": threshold}))
    _round(rt, kube)
    kube.settle()
    before = {j: kube.obj("MLJob", NS, j)["status"].get("group") for j in "abr"}
    assert before["a"] and before["a"] == before["b"] and before["r"] is None
    run(create_jobs(rt, kube, *_jobs(kube, ("c", "seq2seq"))))
    admitted = recorded(rt, loop.run_policy_admission(
        rt, kube.obj("SchedulingPolicy", NS, "default"), kube.indexes(), now=NOW + 30))
    if regroups:
        # Admission holds running jobs where they are: a grouping that moves b waits for
        # the round, and the arrival with it.
        assert admitted is None
    else:
        # The groups are kept and c joins none: it runs at once, ungrouped, beside r.
        assert admitted is not None and admitted.targets["c"].count("worker")
        assert admitted.targets["c"].pool is None
    _round(rt, kube, now=NOW + 60)
    after = {j: kube.obj("MLJob", NS, j)["status"].get("group") for j in "abr"}
    assert (after != before) == regroups
    if regroups:
        pol = kube.obj("SchedulingPolicy", NS, "default")["status"]
        assert pol["grouping"]["predictedGain"] > 0.05
        messages = [e["message"] for e in kube.events("default") if e["reason"] == "Regrouped"]
        assert any(m.startswith("regrouped") and "moved" in m for m in messages), messages
        assert kube.obj("MLJob", NS, "c")["status"].get("group") == after["a"]
    else:
        assert kube.obj("MLJob", NS, "c")["status"].get("group") is None


def test_a_young_job_is_not_moved_before_its_minimum_stay():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))
    rt, kube = make_runtime(cluster(3), label_nodes=True)
    run(create_jobs(rt, kube, *_jobs(kube, ("a", "dssm"), ("b", "wlm"), ("r", "resnet-50"))))
    kube.put(policy(grouping="harmony", pools={"minStaySeconds": 1200, "threshold": 0}))
    _round(rt, kube)
    kube.settle()
    before = {j: kube.obj("MLJob", NS, j)["status"].get("group") for j in "abr"}
    assert before["a"] and before["a"] == before["b"]
    run(create_jobs(rt, kube, *_jobs(kube, ("c", "seq2seq"))))
    _round(rt, kube, now=NOW + 60)  # 60 s in: both are younger than 1200 s in their pool
    assert {j: kube.obj("MLJob", NS, j)["status"].get("group") for j in "abr"} == before


def test_an_admission_right_after_a_round_sees_that_rounds_pools_before_the_watch_does():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))
    rt, kube = make_runtime(cluster(3), label_nodes=True)
    run(create_jobs(rt, kube, *_jobs(kube, ("a", "dssm"), ("b", "wlm"), ("r", "resnet-50"))))
    kube.put(policy(grouping="harmony", pools={"minStaySeconds": 0}))
    _round(rt, kube)
    kube.settle()
    groups_before = kube.obj("SchedulingPolicy", NS, "default")["status"]["groups"]
    # The watch has not shown the labels the round wrote yet.
    for n in kube.of_kind("Node"):
        n["metadata"].get("labels", {}).pop(POOL_LABEL, None)
        n["metadata"].get("annotations", {}).pop(POOL_OWNER_ANNOTATION, None)
    run(create_jobs(rt, kube, *_jobs(kube, ("c", "resnet-50"))))
    recorded(rt, loop.run_policy_admission(rt, kube.obj("SchedulingPolicy", NS, "default"),
                                           kube.indexes(), now=NOW + 30))
    names = {g["name"] for g in groups_before}
    labelled = {v for v, owner in _labelled(kube).values() if owner}
    assert labelled <= names | {g["name"] for g in
                                kube.obj("SchedulingPolicy", NS, "default")["status"]["groups"]}
    for job in ("a", "b"):  # running jobs: untouched, still in their pools
        assert kube.obj("MLJob", NS, job)["status"]["group"] in names
    c = kube.obj("StatefulSet", NS, "c-worker")
    group = kube.obj("MLJob", NS, "c")["status"].get("group")
    if c["spec"]["replicas"]:  # admitted: in its pool, or ungrouped (a group of one)
        assert _affinity(kube, "c-worker") == ({group} if group else set())

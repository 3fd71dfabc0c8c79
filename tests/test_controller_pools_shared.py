"""Pools that live beside other tenants (issue 55, point 2; docs/grouping.md, "In the cluster"):
which nodes a LabelNodes policy may pool, Harmony without pools of one job, moves only into
pools with room, ungrouped jobs kept off pools' nodes, and a policy that does not group never
held back by another policy's labels. The pure functions first, then rounds and admission
steps against the in-memory API, read as a user would (labels, status, targets)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np

from mlsched.cluster.types import WAITING_POOL, PoolPlan, Snapshot
from mlsched.controller.app import pod_events
from mlsched.controller.scheduling import loop, pools
from mlsched.controller.kube.constants import POOL_LABEL, POOL_OWNER_ANNOTATION
from mlsched.controller.objects.records import PodRecord
from mlsched.policies.grouping import fit
from mlsched.policies.grouping.harmony import Harmony, HarmonyConfig
from mlsched.policies.grouping.on_nodes import OnNodes, restricted
from mlsched.policies.round import with_pools
from builders import (
    NOW, NS, cluster, create_jobs, make_runtime, policy, ps_job, recorded, run,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))  # mlsched_objects

CLUSTER = HarmonyConfig(min_members=2, moves_must_fit=True, min_pool_s=0.0)


def view(name, model="resnet-50", **kw):
    from conftest import job

    return job(name, model=model, **kw)


def snap(jobs, nodes=3, gpu=2.0, divisible=(0,)):
    cap = np.tile([8.0, gpu, 48.0], (nodes, 1))
    return Snapshot(NOW, 1200.0, [f"n{i}" for i in range(nodes)], cap, list(jobs),
                    divisible=divisible)


def pod_record(node, phase="Running"):
    return PodRecord(name="p", uid="u", role="worker", ordinal=0, node=node, bound=True,
                     pinned=None, gates=(), phase=phase, restarts=0, deleting=False,
                     requests=(2.0, 1.0, 8.0))


# ---- which nodes a policy may pool -----------------------------------------------------------


def test_others_nodes_are_where_other_jobs_reservations_strays_and_gpu_pods_are():
    own, other = ("a", "mine"), ("b", "theirs")
    pods = {own: [pod_record("n0")], other: [pod_record("n1"), pod_record("n5", "Succeeded")]}
    reserved = {own: {"n2": (2.0, 1.0, 8.0)}, ("b", "decided"): {"n3": (2.0, 1.0, 8.0),
                                                                "n6": (0.0, 0.0, 0.0)}}
    taken = pools.others_nodes(pods, {own}, reserved, strays=[pod_record("n4")],
                               foreign_gpus={"n7": [(1.0, 2.0, 4.0)], "n8": [(0.5, 0.0, 1.0)]},
                               foreign_extended={"n9": [(("rdma/nic", 1.0),)], "n10": []})
    # Its own pods and reservations, finished pods, empty reservations and CPU-only pods of
    # other workloads (node agents) do not make a node someone else's.
    assert taken == {"n1", "n3", "n4", "n7", "n9"}


def test_poolable_nodes_are_free_of_others_and_usable_by_some_job():
    jobs = [view("a"), view("b")]
    assert pools.poolable(snap(jobs, 3), {"n1"}) == [True, False, True]
    # Templates that allow only n0 (one role) and n2 (another job): n1 is no pool's node.
    only = lambda *i: np.array([k in i for k in range(3)])  # noqa: E731
    jobs = [view("a", node_filters={"ps": only(0), "worker": only(0)}),
            view("b", node_filters={"ps": only(2), "worker": only(2)})]
    assert pools.poolable(snap(jobs, 3), set()) == [True, False, True]
    assert pools.poolable(snap([], 2), set()) == [False, False]  # no job: nothing to pool


def test_a_grouping_on_some_nodes_pools_only_those_and_maps_back():
    jobs = [view("a", model="dssm", workers=1, worker_nodes=(3,), ps=1, ps_nodes=(3,)),
            view("b", model="wlm")]
    s = snap(jobs, 4, divisible=(0, 1))
    cut = restricted(s, np.array([False, True, False, True]))
    assert cut.node_names == ["n1", "n3"] and cut.capacity.shape == (2, 3)
    assert cut.jobs[0].worker_nodes == (1,) and cut.jobs[0].workers == 1
    plan = OnNodes(Harmony(), [False, True, False, True]).group(s)
    assert plan.node_pools is not None and len(plan.node_pools) == 4
    assert plan.node_pools[0] is None and plan.node_pools[2] is None
    assert any(p is not None for p in plan.node_pools)
    assert OnNodes(Harmony(), [False] * 4).group(s) == PoolPlan()


# ---- Harmony in the cluster: no pool of one job, moves only where they fit -------------------


def test_a_group_of_one_job_gets_no_pool_and_its_job_runs_ungrouped():
    # dssm and wlm share a node; resnet-50 is a group of its own: in the simulator a pool of
    # its own, in the cluster no pool (no entry: it runs on the nodes in none).
    jobs = [view("a", model="dssm"), view("b", model="wlm"), view("r")]
    sim = Harmony(HarmonyConfig(min_pool_s=0.0)).group(snap(jobs))
    assert sim.job_pools["r"] not in (None, WAITING_POOL)
    plan = Harmony(CLUSTER).group(snap(jobs))
    assert plan.job_pools["a"] == plan.job_pools["b"] and "r" not in plan.job_pools
    assert sum(p is not None for p in plan.node_pools) == 1  # the pair's node; two in none
    assert set(plan.shares) == {plan.job_pools["a"]}
    # Nothing but groups of one: no pool at all, one shared cluster.
    assert Harmony(CLUSTER).group(snap([view("r")])).is_shared


def test_a_running_ungrouped_job_is_no_arrival_and_keeps_its_nodes_when_groups_are_kept():
    jobs = [view("a", model="dssm"), view("b", model="wlm"), view("r")]
    first = Harmony(CLUSTER).group(snap(jobs))
    pool = first.job_pools["a"]
    running = [dataclasses.replace(j, pool=first.job_pools.get(j.name), pool_since_s=NOW,
                                   workers=1, ps=1) for j in jobs]
    s = dataclasses.replace(snap(running), node_pools=list(first.node_pools))
    again = Harmony(CLUSTER).group(s)
    assert not again.regrouped and again.job_pools == first.job_pools
    assert again.node_pools == first.node_pools
    # An arrival (keeping the groups, threshold beyond reach): the pool does not grow over
    # the nodes r runs on, and r stays ungrouped.
    kept = Harmony(dataclasses.replace(CLUSTER, threshold=100.0)).group(
        dataclasses.replace(s, jobs=[*running, view("c", model="seq2seq")]))
    assert kept.node_pools == first.node_pools and "r" not in kept.job_pools
    assert kept.job_pools["a"] == pool


def test_a_pool_takes_no_more_members_than_its_nodes_have_gpus_for():
    # Four one-GPU jobs that co-locate well on nodes of 1 GPU: the simulator divides GPUs and
    # may put two on a node; the cluster does not (a pod asks for a whole GPU).
    jobs = [view(f"j{i}", model=m) for i, m in enumerate(["dssm", "wlm", "dssm", "wlm"])]
    cluster_plan = Harmony(dataclasses.replace(CLUSTER, min_members=1)).group(
        snap(jobs, 2, gpu=1.0))
    members = {}
    for job, p in cluster_plan.job_pools.items():
        if p != WAITING_POOL:
            members.setdefault(p, []).append(job)
    assert members and all(len(m) == 1 for m in members.values()), members


def test_unfit_moves_are_running_jobs_whose_gang_does_not_fit_their_new_pool():
    a = view("a", workers=1, ps=1, min_workers=2)  # needs two one-GPU workers
    b = view("b", workers=1, ps=1)
    s = snap([a, b], 2, gpu=1.0)
    one_node = PoolPlan({"a": "g0", "b": "g0"}, ("g0", None), {"g0": 2})
    assert fit.moved_into(s, one_node) == ["a", "b"]
    assert fit.unfit_moves(s, one_node) == ["a"]  # two one-GPU workers on one 1-GPU node
    roomy = PoolPlan({"a": "g0", "b": "g1"}, ("g0", "g1"), {"g0": 1, "g1": 1})
    assert fit.unfit_moves(snap([a, b], 2, gpu=2.0), roomy) == []
    stays = dataclasses.replace(s, jobs=[dataclasses.replace(a, pool="g0"),
                                         dataclasses.replace(b, pool="g0")])
    assert fit.moved_into(stays, one_node) == []  # already there: no move


def test_harmony_does_not_move_a_running_job_into_a_pool_it_does_not_fit():
    # Two running jobs, ungrouped, on nodes whose GPUs the first one's minimum fills: a
    # grouping that pairs them would leave one without its minimum, so nobody moves.
    a = view("a", model="dssm", workers=2, ps=1, min_workers=2)
    b = view("b", model="wlm", workers=1, ps=1)
    s = snap([a, b], 2, gpu=1.0, divisible=(0, 1))
    loose = Harmony(HarmonyConfig(min_members=2, min_pool_s=0.0)).group(s)
    strict = Harmony(dataclasses.replace(CLUSTER)).group(s)
    if fit.unfit_moves(s, loose):  # what the unchecked grouping would do
        assert strict.is_shared and strict.job_pools == {}
    assert not fit.unfit_moves(s, strict)


# ---- jobs in no pool keep off pools' nodes ---------------------------------------------------


def test_a_job_in_no_pool_may_use_only_the_nodes_in_none():
    jobs = [view("a"), view("b"), view("r")]
    plan = PoolPlan({"a": "g0", "b": "g0"}, ("g0", None, None), {"g0": 2})
    out = {j.name: j for j in with_pools(snap(jobs), plan).jobs}
    assert out["r"].pool is None
    assert out["r"].node_filter("worker").tolist() == [False, True, True]
    assert out["r"].node_filter("ps") is out["r"].node_filter("worker")  # shared arrays
    assert out["a"].pool == "g0" and not out["a"].node_filters
    # A shared plan (no grouping) leaves every job every node.
    assert all(not j.node_filters for j in with_pools(snap(jobs), PoolPlan()).jobs)


# ---- in the cluster: two tenants ------------------------------------------------------------

OTHER = "team-b"


def _labelled(kube):
    return {n["metadata"]["name"]: ((n["metadata"].get("labels") or {}).get(POOL_LABEL),
                                    (n["metadata"].get("annotations") or {}).get(POOL_OWNER_ANNOTATION))
            for n in kube.of_kind("Node") if POOL_LABEL in (n["metadata"].get("labels") or {})}


def _job(name, model, namespace=NS, **kw):
    body = ps_job(name, namespace=namespace, max_workers=1, **kw)
    body["spec"]["modelType"] = model
    return body


def _round(rt, kube, name="default", namespace=NS, now=NOW):
    return recorded(rt, loop.run_policy_round(rt, kube.obj("SchedulingPolicy", namespace, name),
                                              kube.indexes(), now=now))


def _admit(rt, kube, name="default", namespace=NS, now=NOW):
    return recorded(rt, loop.run_policy_admission(
        rt, kube.obj("SchedulingPolicy", namespace, name), kube.indexes(), now=now))


def _settle(rt, kube):
    """The StatefulSets' pods made, pinned by the pod handler as decided, bound and running."""
    kube.settle()
    for pod in kube.of_kind("Pod"):
        if pod["spec"].get("schedulingGates"):
            run(pod_events.on_pod_event(rt, "ADDED", pod, kube.indexes()))
    kube.settle()


def _tenants(nodes=6):
    """Team B (grouping none) runs two jobs; then team A (harmony, LabelNodes) groups its own."""
    rt, kube = make_runtime(cluster(nodes), label_nodes=True)
    kube.put(policy(namespace=OTHER, grouping="none"))
    run(create_jobs(rt, kube, _job("b0", "resnet-50", OTHER), _job("b1", "vgg-16", OTHER)))
    _admit(rt, kube, namespace=OTHER)
    _settle(rt, kube)
    kube.put(policy(grouping="harmony", pools={"minStaySeconds": 0}))
    run(create_jobs(rt, kube, *[_job(f"a{i}", m) for i, m in
                                enumerate(["dssm", "wlm", "dssm", "wlm", "resnet-50"])]))
    _round(rt, kube)
    _settle(rt, kube)
    return rt, kube


def _nodes_of(kube, namespace):
    return {p["spec"].get("nodeName") for p in kube.of_kind("Pod")
            if p["metadata"]["namespace"] == namespace and p["spec"].get("nodeName")}


def test_a_harmony_policy_pools_no_node_of_another_tenant_and_no_job_alone():
    rt, kube = _tenants()
    theirs = _nodes_of(kube, OTHER)
    assert theirs, "team B's jobs run"
    labelled = {n: v for n, (v, owner) in _labelled(kube).items() if owner == f"{NS}/default"}
    assert labelled, "team A has pools"
    assert not set(labelled) & theirs, (labelled, theirs)
    groups = kube.obj("SchedulingPolicy", NS, "default")["status"]["groups"]
    assert groups and all(len(g["members"]) >= 2 for g in groups), groups
    assert {v for v in labelled.values()} == {g["name"] for g in groups}
    # Its jobs in no pool run too, on nodes in none.
    pooled = {m for g in groups for m in g["members"]}
    for j in ({f"a{i}" for i in range(5)} - pooled):
        assert kube.obj("MLJob", NS, j)["status"].get("group") is None
    # Another round changes nothing.
    kube.calls.clear()
    _round(rt, kube, now=NOW + 60)
    assert [c for c in kube.writes() if c[1] == "Node"] == []


def test_a_node_another_tenant_takes_leaves_the_pool_at_the_next_round():
    rt, kube = _tenants()
    owned = {n for n, (_, owner) in _labelled(kube).items() if owner == f"{NS}/default"}
    node = sorted(owned)[0]
    # Another workload's GPU pod lands on a node of team A's pool (labels attract, never repel).
    hog = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "hog", "namespace": "team-c"},
           "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {
               "requests": {"cpu": "1", "nvidia.com/gpu": "1"}}}]},
           "status": {"phase": "Running"}}
    kube.put(hog)
    _round(rt, kube, now=NOW + 60)
    assert node not in _labelled(kube)


def test_a_policy_that_does_not_group_admits_its_new_job_beside_another_policys_pools():
    rt, kube = _tenants()
    run(create_jobs(rt, kube, _job("late", "resnet-50", OTHER)))
    report = _admit(rt, kube, namespace=OTHER, now=NOW + 10)
    assert report is not None and report.targets["late"].count("worker") == 1
    assert report.targets["late"].pool is None
    waiting = rt.jobs.waiting.get((OTHER, "late"))
    assert waiting is None, waiting

"""A job its policy did not admit says why in its Admitted condition (controller/scheduling/waiting.py):
short of capacity (with what it needs and what is free), or passed over by the policy."""

from __future__ import annotations

import numpy as np

from mlsched.api import get_condition
from mlsched.cluster.types import Decision, JobDecision, PoolPlan, Snapshot
from mlsched.controller.scheduling.waiting import why_waiting
from conftest import job
from builders import NS, create_jobs, policy, ps_job, run
from controller_steps import sync
from controller_steps import admit, round_, settle, setup, two_policies_under_one_quota


def test_a_job_that_does_not_fit_what_is_free_says_what_it_needs_and_what_is_free():
    # Two nodes, 4 GPUs: the first job takes all of them (`fixed`: its 4 workers).
    rt, kube = setup(nodes=2, policies=(policy(allocation="fixed"),),
                     job_bodies=[ps_job("big", min_workers=4, max_workers=4)])
    round_(rt, kube)
    settle(rt, kube)
    run(create_jobs(rt, kube, ps_job("late", min_workers=2, max_workers=2)))
    settle(rt, kube)
    assert admit(rt, kube) is None  # nothing admitted: no room
    sync(rt, kube, "late")
    admitted = get_condition(kube.obj("MLJob", NS, "late")["status"]["conditions"], "Admitted")
    assert admitted.status == "False" and admitted.reason == "WaitingForAllocation"
    assert admitted.message.startswith("SchedulingPolicy 'default': its minimum (1 ps and 2 "
                                       "worker: 2 GPU, "), admitted.message
    assert "does not fit what is free now: 0 GPU, " in admitted.message
    assert "on 2 nodes" in admitted.message
    # The policy counts them (the Admitted / Waiting columns of `kubectl get schedpol`).
    pol = kube.obj("SchedulingPolicy", NS, "default")["status"]
    assert (pol["admittedJobs"], pol["waitingJobs"]) == (1, 1), pol
    writes = len(kube.writes())
    assert admit(rt, kube) is None and len(kube.writes()) == writes  # unchanged: not rewritten


def _snapshot(jobs, gpus=(2, 2)):
    cap = np.array([[8.0, g, 48.0] for g in gpus]).reshape(-1, 3)
    return Snapshot(0.0, 1200.0, [f"n{i}" for i in range(len(gpus))], cap, jobs)


def _job(name, **kw):
    return job(name, worker_demand=np.array([1.0, 1.0, 4.0]), ps_demand=np.array([1.0, 0.0, 4.0]),
               **kw)


def test_a_job_that_would_fit_was_passed_over_by_the_policy():
    # The decision gave `a` one node's GPUs; `b` would fit the other node: a policy choice.
    decision = Decision({"a": JobDecision([0], [0, 0])})
    reasons = why_waiting(_snapshot([_job("a"), _job("b")]), decision, "dl2")
    assert reasons == {"b": "its minimum would fit what is free now, but dl2 gave the capacity "
                            "to other jobs this time"}


def test_the_gang_must_fit_per_node_not_only_in_total():
    # 2 GPUs free in all, one on each node; a worker asking for 2 GPUs fits neither.
    wide = job("w", arch="allreduce", worker_demand=np.array([1.0, 2.0, 4.0]), min_workers=1)
    decision = Decision({"a": JobDecision([0], [0]), "c": JobDecision([1], [1])})
    reasons = why_waiting(_snapshot([_job("a"), _job("c"), wide]), decision, "drf")
    assert reasons["w"].startswith("its minimum (1 worker: 2 GPU, 1 CPU, 4 GiB) does not fit "
                                   "what is free now: 2 GPU, "), reasons
    assert reasons["w"].endswith("at most 1 GPU, 6 CPU, 40 GiB on any one")


def test_no_node_and_no_pool_are_said_so():
    assert why_waiting(_snapshot([_job("a")], gpus=()), Decision({}), "drf") == {
        "a": "no node is schedulable now (cordoned, not Ready, or outside the operator's node "
             "selector)"}
    waiting = PoolPlan({"a": "mlsched-waiting"}, ("p", "p"))
    reasons = why_waiting(_snapshot([_job("a")]), Decision({}, pools=waiting), "drf")
    assert reasons == {"a": "its grouping has not given it a node pool yet"}


def test_a_job_the_quota_budget_leaves_out_says_so_not_that_the_nodes_are_full():
    """Policy b decides right after policy a was given the namespace's 4-GPU quota, before a's
    pods exist: the quota's own count still shows nothing used (so no WaitingForQuota), and
    b's job was told its minimum "does not fit what is free now: 20 GPU, ..." on empty nodes."""
    rt, kube = two_policies_under_one_quota(nodes=12, a_min_workers=4)
    assert round_(rt, kube, "a").targets["a1"].count("worker") == 4
    assert round_(rt, kube, "b").targets["b1"].count("worker") == 0
    sync(rt, kube, "b1")
    admitted = get_condition(kube.obj("MLJob", NS, "b1")["status"]["conditions"], "Admitted")
    assert admitted.reason == "WaitingForAllocation", admitted
    assert admitted.message == (
        "SchedulingPolicy 'b': its minimum would fit what is free now, but not in what the "
        "namespace's ResourceQuotas leave once the tasks decided before it are counted (this "
        "step's, and other policies' whose pods do not exist yet)"), admitted.message

"""Index records and Snapshot building from Kubernetes dicts (pure)."""

from __future__ import annotations

import numpy as np
import pytest

from mlsched.cluster.types import SpeedObservation

from mlsched.controller.objects.records import node_record, pod_record, sts_record
from mlsched.controller.objects.job_records import job_record
from mlsched.controller.objects.quantities import parse_quantity
from mlsched.controller.scheduling.snapshot import build_snapshot, observations
from mlsched.controller.scheduling.cluster_state import ClusterState, held_elsewhere
from builders import NS, allreduce_job, node, pod, ps_job


@pytest.mark.parametrize("text, value", [("8", 8.0), ("7500m", 7.5), ("48Gi", 48 * 2**30),
                                         ("16374768Ki", 16374768 * 1024), ("1e3", 1000.0),
                                         ("2k", 2000.0), ("garbage", 0.0), (4, 4.0)])
def test_quantities(text, value):
    assert parse_quantity(text) == pytest.approx(value)


def test_node_capacity_comes_from_allocatable_including_gpus():
    rec = node_record(node("gpu-1", cpu="7500m", gpu="4", memory="32Gi"))
    assert rec.allocatable == (7.5, 4.0, 32.0)
    assert rec.ready and not rec.unschedulable


def stored(body: dict, uid: str = "u1", created: str = "2024-01-01T00:00:00Z", **status) -> dict:
    body = {**body, "metadata": {**body["metadata"], "uid": uid, "generation": 1,
                                 "creationTimestamp": created}}
    if status:
        body["status"] = status
    return body


def test_job_record_reads_progress_bounds_and_history():
    body = stored(ps_job("bert", min_workers=2, max_workers=6), progress={"epochsDone": 12.5},
                  history=[{"interval": 0, "ps": 1, "workers": 2, "epochs": 3.0}])
    rec = job_record(body)
    assert rec.error is None and rec.model == "resnet-50" and rec.arch == "ps"
    assert (rec.min_workers, rec.max_workers, rec.min_ps, rec.max_ps) == (2, 6, 1, 4)
    assert rec.epochs_done == 12.5 and rec.schedulable
    assert len(rec.history) == 1 and rec.templates["worker"]["spec"]["containers"]


def test_invalid_job_record_carries_the_error():
    body = stored(ps_job("bad"))
    body["spec"]["replicaSpecs"]["worker"]["min"] = 9  # > max
    rec = job_record(body)
    assert rec.error and "max" in rec.error and not rec.schedulable


def test_pod_record_ordinal_node_and_gate():
    gated = pod_record(pod("bert", "worker", 3, gated=True))
    assert (gated.role, gated.ordinal, gated.gated, gated.node) == ("worker", 3, True, None)
    bound = pod_record(pod("bert", "ps", 0, node_name="n2", restarts=2))
    assert bound.node == "n2" and bound.bound and bound.restarts == 2
    assert bound.requests == (2.0, 0.0, 8.0)
    foreign_name = pod("bert", "worker", 0)
    foreign_name["metadata"]["name"] = "something-else"
    assert pod_record(foreign_name) is None


def make_cluster():
    nodes = [node_record(node(f"n{i}")) for i in range(3)] + [
        node_record(node("down", ready=False)),
        node_record(node("tainted", taints=[{"key": "dedicated", "effect": "NoSchedule"}]))]
    job = job_record(stored(ps_job("bert"), progress={"epochsDone": 40.0},
                            history=[{"ps": 1, "workers": 2, "epochs": 12.0}]))
    pods = {(NS, "bert"): [pod_record(pod("bert", "ps", 0, node_name="n1")),
                           pod_record(pod("bert", "worker", 0, node_name="n2")),
                           pod_record(pod("bert", "worker", 1, pinned="n0", gated=False, phase="Pending"))]}
    sts = {(NS, "bert"): [sts_record({"metadata": {"name": "bert-ps", "labels": {"mlsched.io/role": "ps"}},
                                      "spec": {"replicas": 1}}),
                          sts_record({"metadata": {"name": "bert-worker", "labels": {"mlsched.io/role": "worker"}},
                                      "spec": {"replicas": 2}})]}
    return ClusterState(nodes=nodes, pods=pods, statefulsets=sts), job


def test_snapshot_from_records():
    state, job = make_cluster()
    snap = build_snapshot([job], state, now_s=100.0, interval_s=60.0)
    assert snap.node_names == ["n0", "n1", "n2"]  # not-ready and tainted nodes are left out
    np.testing.assert_allclose(snap.capacity, [[8, 2, 48]] * 3)
    view = snap.jobs[0]
    assert view.epochs_done == 40.0 and view.total_epochs == 100
    assert (view.ps, view.workers) == (1, 2)
    assert view.ps_nodes == (1,) and view.worker_nodes == (2, 0)  # pinned pending pod counts
    assert view.observations[0].epochs_per_s == pytest.approx(12.0 / 60.0)
    assert view.slots_run == 1


def test_tolerated_taints_and_node_selector():
    state, job = make_cluster()
    snap = build_snapshot([job], state, now_s=0, interval_s=60, tolerated_taints=frozenset({"dedicated"}),
                          node_selector={"kubernetes.io/hostname": "tainted"})
    assert snap.node_names == ["tainted"]


def test_capacity_excludes_other_schedulers_and_other_policies_jobs():
    state, job = make_cluster()
    state.foreign = {"n0": [(3.0, 1.0, 4.0)]}
    other = {(NS, "other-job"): {"n1": (2.0, 1.0, 8.0)}}
    held = held_elsewhere(state, own_jobs={job.key}, reserved=other)
    snap = build_snapshot([job], state, now_s=0, interval_s=60, held=held)
    np.testing.assert_allclose(snap.capacity, [[5, 1, 44], [6, 1, 40], [8, 2, 48]])
    # The same pods, when their job is not this policy's, are held too.
    held = held_elsewhere(state, own_jobs=set(), reserved={})
    assert held["n2"] == (2.0, 1.0, 8.0) and held["n1"] == (2.0, 0.0, 8.0)


def test_gap_in_ordinals_stops_the_sticky_prefix():
    state, job = make_cluster()
    state.pods[(NS, "bert")] = [pod_record(pod("bert", "worker", 1, node_name="n2"))]
    view = build_snapshot([job], state, now_s=0, interval_s=60).jobs[0]
    assert view.worker_nodes == ()


def test_allreduce_job_view_has_no_ps():
    rec = job_record(stored(allreduce_job("ring")))
    state = ClusterState(nodes=[node_record(node("n0"))])
    view = build_snapshot([rec], state, now_s=0, interval_s=60).jobs[0]
    assert view.arch == "allreduce" and view.bounds("ps") == (0, 0) and view.min_workers == 2


def test_observations_skip_idle_intervals_and_keep_the_latest():
    history = [{"ps": 1, "workers": 0, "epochs": 0}, {"ps": 2, "workers": 4, "epochs": 6}]
    rec = job_record(stored(ps_job("bert"), history=history))
    assert rec.trained == ((2, 4, 6.0),) and rec.slots_run == 1
    assert observations(rec.trained, 1200)[0].epochs_per_s == pytest.approx(6 / 1200)
    long = job_record(stored(ps_job("bert"), history=[{"ps": 1, "workers": 1, "epochs": float(i + 1)}
                                                      for i in range(40)]))
    assert len(long.trained) == 24 and long.trained[-1][2] == 40.0


def test_observations_read_as_a_tuple_of_speed_observations():
    """Made when asked for (a round reads the latest few of each job), they read as the tuple
    of SpeedObservations would: by index, slice, iteration, length, and compare equal to it."""
    trained = ((1, 2, 6.0), (2, 4, 12.0), (2, 8, 18.0))
    seen = observations(trained, 60)
    expected = tuple(SpeedObservation(ps, w, e / 60) for ps, w, e in trained)
    assert len(seen) == 3 and bool(seen) and seen == expected and tuple(seen) == expected
    assert seen[-1] == expected[-1] and seen[-2:] == expected[-2:] and seen[0].workers == 2
    assert list(reversed(seen)) == list(reversed(expected))
    assert observations((), 60) == () and not observations(trained, 0)

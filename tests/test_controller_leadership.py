"""A standby replica writes nothing until it leads; then it schedules at once."""

from __future__ import annotations

import asyncio

from mlsched.controller import jobs
from mlsched.controller.leadership import Leadership
from mlsched.controller.supervision import PolicyLoops
from test_controller_fixtures import NS, cluster, make_runtime, policy, ps_job, run


def test_callbacks_run_once_when_leadership_is_won():
    calls = []
    standby = Leadership(leading=False)
    standby.on_leading(lambda: calls.append("a"))
    assert calls == []
    standby.become_leader()
    standby.become_leader()
    assert calls == ["a"]
    standby.on_leading(lambda: calls.append("b"))  # already leading: at once
    assert calls == ["a", "b"]
    assert Leadership().leading  # no election: it leads from the start


def test_a_standby_keeps_policies_and_starts_their_loops_when_it_leads():
    async def scenario():
        started = []

        async def loop(body, stopped):
            started.append(body["metadata"]["name"])
            await stopped.wait()

        loops = PolicyLoops(loop, active=False)
        loops.observe({"metadata": {"name": "p", "namespace": NS, "uid": "u", "generation": 1}})
        await asyncio.sleep(0.01)
        assert started == [] and loops.running() == []
        loops.activate()
        await asyncio.sleep(0.01)
        assert started == ["p"]
        await loops.stop_all()

    run(scenario())


def test_a_standby_creates_no_children_and_pins_nothing():
    rt, kube = make_runtime(cluster(2))
    rt.leadership = Leadership(leading=False)
    kube.put(policy())
    body = kube.put(ps_job("bert"))
    run(jobs.on_job_event(rt, "ADDED", body, kube.indexes()))
    assert kube.writes() == [] and (NS, "bert") in rt.job_bodies
    # Once it leads, the sweep reconciles what arrived while it stood by.
    rt.leadership.become_leader()
    run(jobs.sweep(rt, kube.indexes()))
    assert sorted(s["metadata"]["name"] for s in kube.of_kind("StatefulSet")) == \
        ["bert-ps", "bert-worker"]


def test_the_leader_labels_its_own_pod_and_a_starting_replica_unlabels_it(monkeypatch):
    """The Service selects the leader's pod by mlsched.io/leader=true, so both replicas can be
    Ready (a PodDisruptionBudget counts Ready pods) while reports reach the leader only."""
    from mlsched.controller.leadership import label_own_pod

    rt, kube = make_runtime(cluster(2))
    kube.put({"apiVersion": "v1", "kind": "Pod",
              "metadata": {"name": "mlsched-operator-abc", "namespace": "mlsched-system",
                           "labels": {"app.kubernetes.io/name": "mlsched-operator"}},
              "spec": {"containers": [{"name": "operator"}]}})

    def labels() -> dict:
        (pod,) = kube.of_kind("Pod")
        return pod["metadata"]["labels"]

    monkeypatch.delenv("POD_NAME", raising=False)
    assert run(label_own_pod(rt.api, True)) is False  # not in a pod: nothing to label
    monkeypatch.setenv("POD_NAME", "mlsched-operator-abc")
    monkeypatch.setenv("POD_NAMESPACE", "mlsched-system")
    assert run(label_own_pod(rt.api, True)) is True
    assert labels() == {"app.kubernetes.io/name": "mlsched-operator", "mlsched.io/leader": "true"}
    assert run(label_own_pod(rt.api, False)) is True  # restarted in the same pod: a standby again
    assert labels() == {"app.kubernetes.io/name": "mlsched-operator"}
    monkeypatch.setenv("POD_NAME", "gone")
    assert run(label_own_pod(rt.api, True, attempts=1, backoff_s=0)) is False

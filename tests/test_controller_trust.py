"""What a user sees when things cannot go as asked: unschedulable pods, jobs that can never
fit, workers that finish by exiting 0, children of an earlier job of the same name."""

from __future__ import annotations

from mlsched.api import get_condition
from mlsched.controller.app import job_lifecycle, jobs
from mlsched.controller.objects.desired import PodSettings, pod_template
from mlsched.controller.objects.records import pod_record
from mlsched.controller.objects.job_records import job_record
from mlsched.controller.scheduling.books import FailureBook
from mlsched.controller.scheduling.cluster_fit import ClusterFit
from mlsched.controller.objects.records import node_record
from builders import NS, cluster, create_jobs, make_runtime, node, pod, policy, ps_job, run


def _sync(rt, kube, name):
    patch: dict = {}
    outcome = run(job_lifecycle.sync_lifecycle(rt, kube.obj("MLJob", NS, name), kube.indexes(), patch))
    if patch:
        run(kube.patch("MLJob", NS, name, patch, status=True))
    return outcome


def _running(kube, name):
    return get_condition(kube.obj("MLJob", NS, name)["status"]["conditions"], "Running")


def test_pods_get_the_tolerations_of_the_taints_the_operator_places_on():
    job = job_record(ps_job("bert"))
    settings = PodSettings("http://op/v1/progress", tolerated_taints=("kwok.x-k8s.io/node",
                                                                      "nvidia.com/gpu"))
    spec = pod_template(job, "worker", {"ps": 1, "worker": 1}, settings)["spec"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists"} in spec["tolerations"]
    assert {"key": "kwok.x-k8s.io/node", "operator": "Exists"} in spec["tolerations"]
    # A template that already tolerates a key keeps its own toleration, not a second one.
    body = ps_job("bert")
    body["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["tolerations"] = [
        {"key": "nvidia.com/gpu", "operator": "Exists"}]
    spec = pod_template(job_record(body), "worker", {"worker": 1}, settings)["spec"]
    assert [t["key"] for t in spec["tolerations"]].count("nvidia.com/gpu") == 1


def test_the_schedulers_reason_reaches_the_job_once():
    rt, kube = make_runtime(cluster(2))
    kube.put(policy())
    run(create_jobs(rt, kube, ps_job("bert")))
    for sts in kube.of_kind("StatefulSet"):
        sts["spec"]["replicas"] = 1
    stuck = pod("bert", "worker", 0, phase="Pending", pinned="node-0")
    stuck["status"]["conditions"] = [{"type": "PodScheduled", "status": "False",
                                      "reason": "Unschedulable",
                                      "message": "0/2 nodes are available: 2 node(s) had "
                                                 "untolerated taint {x: y}."}]
    kube.put(stuck)
    _sync(rt, kube, "bert")
    running = _running(kube, "bert")
    assert running.reason == "Unschedulable"
    assert "bert-worker-0" in running.message and "untolerated taint" in running.message
    _sync(rt, kube, "bert")
    assert [e["reason"] for e in kube.events("bert")].count("Unschedulable") == 1


def test_a_job_whose_minimum_exceeds_the_cluster_is_told_so():
    nodes = [node_record(node(f"n{i}")) for i in range(3)]
    fit = ClusterFit.of(nodes)
    gang = ps_job("gang")
    gang["spec"]["replicaSpecs"]["worker"].update(min=500, max=500)
    why = fit.why_not(job_record(gang))
    assert why and "1 ps and 500 worker" in why and "500 GPU" in why
    assert fit.why_not(job_record(ps_job("small"))) is None
    # Nodes the operator does not place on (a taint it does not tolerate) do not count.
    tainted = node("t0")
    tainted["spec"]["taints"] = [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]
    why = ClusterFit.of([node_record(tainted)]).why_not(job_record(ps_job("small")))
    assert why and "none of the cluster's 0 schedulable nodes" in why


def test_a_restart_after_exit_0_is_no_failure():
    book = FailureBook()
    key = (NS, "j")
    book.observe(key, "p", restarts=1, last_exit_zero=False)  # crashed once
    book.observe(key, "p", restarts=2, last_exit_zero=True)  # then finished
    book.observe(key, "p", restarts=3, last_exit_zero=True)  # and finished again
    assert book.total(key) == 1


def test_the_latest_non_zero_exit_is_kept_with_its_pod():
    book = FailureBook()
    key = (NS, "j")
    book.observe(key, "p", restarts=1, pod="j-worker-0", failure="container w exited with code 2")
    book.observe(key, "q", restarts=1, last_exit_zero=True, pod="j-worker-1",
                 failure="container w exited with code 9")  # after exit 0: not a failure
    assert book.last(key) == "pod j-worker-0: container w exited with code 2"
    book.forget(key)
    assert book.last(key) is None


def test_a_pods_last_failure_is_its_latest_non_zero_exit():
    body = pod("j", "worker", 0)
    body["status"]["containerStatuses"] = [{
        "name": "worker", "restartCount": 1, "state": {"running": {}},
        "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]
    assert pod_record(body).last_failure == "container worker exited with code 137 (OOMKilled)"
    # A container terminated now is newer than what it last restarted after.
    body["status"]["containerStatuses"][0]["state"] = {"terminated": {"exitCode": 1}}
    assert pod_record(body).last_failure == "container worker exited with code 1"
    body["status"]["containerStatuses"][0]["state"] = {"running": {}}
    body["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] = 0
    assert pod_record(body).last_failure is None


def test_a_pod_whose_containers_exited_0_has_completed():
    body = pod("j", "worker", 0)
    body["status"]["containerStatuses"] = [{
        "name": "worker", "restartCount": 1, "state": {"running": {}},
        "lastState": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]
    record = pod_record(body)
    assert record.completed and record.last_exit_zero
    body["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] = 137
    record = pod_record(body)
    assert not record.completed and not record.last_exit_zero


def test_children_of_an_earlier_job_of_the_same_name_are_not_the_new_jobs():
    rt, kube = make_runtime(cluster(2))
    kube.put(policy())
    run(create_jobs(rt, kube, ps_job("bert")))
    old = kube.obj("MLJob", NS, "bert")
    old_uid = old["metadata"]["uid"]
    # The job is deleted and recreated; its StatefulSets still wait for the garbage collector.
    del kube.objects[("MLJob", NS, "bert")]
    new = ps_job("bert")
    new["metadata"]["uid"] = "uid-bert-2"
    kube.put(new)
    idx = kube.indexes()
    assert {s.owner_uid for s in idx.statefulsets.raw[(NS, "bert")]} == {old_uid}
    assert idx.statefulsets.get((NS, "bert")) == []
    try:
        run(jobs.reconcile_if_needed(rt, kube.obj("MLJob", NS, "bert"), idx))
    except jobs.WaitingForOldChildren:
        pass
    reasons = [e["reason"] for e in kube.events("bert")]
    assert "WaitingForOldChildren" in reasons
    # Nothing was adopted: the StatefulSets are still the old job's.
    assert {s["metadata"]["ownerReferences"][0]["uid"] for s in kube.of_kind("StatefulSet")} \
        == {old_uid}


def test_pods_of_other_namespaces_hold_their_nodes_in_namespaced_mode():
    from mlsched.controller.objects.cluster_pods import OtherNamespacePods

    other = OtherNamespacePods(["team-a", "ml-*"])
    busy = pod("x", "worker", 0, node_name="node-1", namespace="team-b")
    other.replace([busy, pod("y", "worker", 0, node_name="node-2", namespace="ml-prod")])
    # Served namespaces are kopf's to index; only the others are kept here.
    assert set(other.requests_by_node()) == {"node-1"}
    done = pod("x", "worker", 0, node_name="node-1", namespace="team-b", phase="Succeeded")
    other.apply("MODIFIED", done)
    assert other.requests_by_node() == {}
    other.apply("ADDED", busy)

    rt, kube = make_runtime(cluster(2))
    idx = kube.indexes()
    idx.other_namespaces = other
    held = idx.cluster().foreign
    assert list(held["node-1"]) == [(2.0, 1.0, 8.0)]


def test_pod_requests_count_limits_init_containers_and_overhead_as_the_scheduler_does():
    from mlsched.controller.objects.quantities import pod_requests

    spec = {"containers": [
        # A GPU limit next to a CPU request: the GPU is requested too (defaulted from the limit).
        {"name": "a", "resources": {"requests": {"cpu": "1"},
                                    "limits": {"cpu": "2", "nvidia.com/gpu": "1"}}},
        {"name": "b", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}],
        "initContainers": [{"name": "fetch", "resources": {"requests": {"memory": "8Gi"}}}],
        "overhead": {"cpu": "250m"}}
    assert pod_requests(spec) == (1.75, 1.0, 8.0)


def test_pod_requests_count_sidecars_and_pod_level_resources_as_the_scheduler_does():
    """Sidecars (init containers with restartPolicy Always) run beside the app containers:
    they add to the pod's request, and to every init container declared after them. They used
    to count only as init containers (the larger of, not the sum), so a template with a 2-CPU
    sidecar was planned 2 CPUs short and its pods stayed Pending on full nodes."""
    from mlsched.controller.objects.quantities import pod_requests

    def box(cpu, mem="0"):
        return {"resources": {"requests": {"cpu": cpu, "memory": mem}}}

    spec = {"containers": [{"name": "trainer", **box("4", "16Gi")}],
            "initContainers": [
                {"name": "fetch", **box("3", "1Gi")},  # alone: 3 CPU
                {"name": "proxy", "restartPolicy": "Always", **box("2", "1Gi")},  # a sidecar
                {"name": "warm", **box("5", "1Gi")}]}  # after the sidecar: 5 + 2 CPU
    # Running: trainer + proxy = 6 CPU, 17 GiB; init phase at most 7 CPU (warm beside proxy).
    assert pod_requests(spec) == (7.0, 0.0, 17.0)
    spec["initContainers"].pop()  # without `warm`: the running containers' 6 CPU
    assert pod_requests(spec) == (6.0, 0.0, 17.0)
    # Pod-level resources (CPU and memory) replace the containers' sum; the GPU stays theirs.
    spec["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "1"}
    spec["resources"] = {"requests": {"cpu": "10"}, "limits": {"memory": "32Gi"}}
    assert pod_requests(spec) == (10.0, 1.0, 32.0)


def test_the_other_namespace_watch_lists_then_follows_events():
    import threading

    from mlsched.controller.objects.cluster_pods import OtherNamespacePods

    busy = pod("x", "worker", 0, node_name="node-1", namespace="team-b")
    later = pod("y", "worker", 0, node_name="node-2", namespace="team-b")
    done = threading.Event()

    class Listed:
        data = b'{"metadata": {"resourceVersion": "7"}, "items": []}'

    def list_pods(**kwargs):
        return Listed()

    class FakeWatch:
        def stream(self, func, **kwargs):
            assert kwargs["resource_version"] == "7" and kwargs["deserialize"] is False
            # What the client yields with deserialize=False: the dict under "object" only.
            yield {"type": "ADDED", "object": busy}
            yield {"type": "ADDED", "object": later}
            yield {"type": "DELETED", "object": busy}
            done.set()
            other.stop()
            yield {"type": "ADDED", "object": busy}

        def stop(self):
            pass

    freed = []
    other = OtherNamespacePods(["mine"], on_freed=lambda: freed.append(1))
    other.start(list_pods, FakeWatch)
    assert done.wait(5)
    other._thread.join(5)
    assert set(other.requests_by_node()) == {"node-2"}
    assert freed == [1]  # the deleted pod's node has room again: waiting jobs are woken


def test_new_capacity_wakes_every_policys_admission_and_a_heartbeat_does_not():
    """A node added, uncordoned, untainted or grown, or another workload's pod gone, wakes the
    admission of every running policy loop (waiting jobs start now, not at the next round)."""
    from mlsched.controller.app import handlers

    rt, kube = make_runtime(cluster(2))

    class Loops:
        def running(self):
            return [(NS, "default"), ("team-b", "fast")]

    rt.scheduling.policy_loops = Loops()
    memo = {"runtime": rt}

    def woken() -> set:
        out = {key for key in Loops().running() if "admission" in rt.scheduling.wakeups.peek(key)}
        for key in out:
            rt.scheduling.wakeups.drop(key, "admission")
        return out

    def node_event(body, type_="MODIFIED"):
        run(handlers.node_event(event={"type": type_}, body=body, memo=memo))

    fresh = node("n9")
    node_event(fresh, "ADDED")
    assert woken() == {(NS, "default"), ("team-b", "fast")}
    beat = node("n9")
    beat["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-01-01T00:00:00Z"
    node_event(beat)
    assert woken() == set()  # nothing planning reads changed
    cordoned = node("n9")
    cordoned["spec"]["unschedulable"] = True
    node_event(cordoned)
    woken()
    node_event(node("n9"))  # uncordoned
    assert woken() == {(NS, "default"), ("team-b", "fast")}
    node_event(node("n9", gpu="4"))  # grown
    assert len(woken()) == 2
    node_event(node("n9", gpu="4"), "DELETED")  # its tasks are displaced: placed again
    assert woken() == {(NS, "default"), ("team-b", "fast")} and "n9" not in rt.cluster.node_states

    def foreign(type_, **kwargs):
        body = pod("other", "worker", 0, namespace="team-c", **kwargs)
        del body["metadata"]["labels"]["mlsched.io/job-name"]
        run(handlers.foreign_pod_event(event={"type": type_}, body=body, memo=memo))

    foreign("MODIFIED", node_name="n1")  # running: holds its node
    assert woken() == set()
    foreign("MODIFIED", node_name="n1", phase="Succeeded")
    assert len(woken()) == 2
    foreign("DELETED", node_name="n1")
    assert len(woken()) == 2
    foreign("DELETED")  # never bound: it held nothing
    assert woken() == set()


def test_a_pod_of_another_namespace_that_ends_is_reported_freed():
    from mlsched.controller.objects.cluster_pods import OtherNamespacePods

    other = OtherNamespacePods(["mine"])
    busy = pod("x", "worker", 0, node_name="node-1", namespace="team-b")
    assert other.apply("ADDED", busy) is False
    assert other.apply("MODIFIED", busy) is False
    assert other.apply("DELETED", busy) is True  # was counted, is not any more
    assert other.apply("DELETED", busy) is False  # already gone


def test_a_deleted_job_s_pods_going_wake_its_policy_and_a_moved_job_wakes_the_one_it_left():
    """A job deleted: its pods go after it, and their going frees its capacity. The pod
    handler looked the job up to find its policy, found nothing, and the policy's waiting jobs
    waited for its next round (20 minutes by default). A job moved to another policy: the one
    it left went on counting it in `kubectl get schedulingpolicy`."""
    from mlsched.controller.app import handlers

    rt, kube = make_runtime(cluster(2))
    memo = {"runtime": rt}
    rt.cluster.indexes = kube.indexes()

    def woken() -> set:
        out = {key for key in [(NS, "default"), (NS, "other")]
               if "admission" in rt.scheduling.wakeups.peek(key)}
        for key in out:
            rt.scheduling.wakeups.drop(key, "admission")
        return out

    body = ps_job("bert")
    kube.put(body)
    rt.cluster.indexes = kube.indexes()
    run(handlers.mljob_event(event={"type": "ADDED"}, body=kube.obj("MLJob", NS, "bert"), memo=memo))
    assert woken() == {(NS, "default")}
    moved = kube.obj("MLJob", NS, "bert")
    moved["spec"]["schedulingPolicy"] = "other"
    moved["metadata"]["generation"] = 2
    rt.cluster.indexes = kube.indexes()
    run(handlers.mljob_event(event={"type": "MODIFIED"}, body=moved, memo=memo))
    assert (NS, "default") in woken()  # the policy it left recounts
    run(handlers.mljob_event(event={"type": "DELETED"}, body=moved, memo=memo))
    assert woken() == {(NS, "other")}
    run(kube.delete("MLJob", NS, "bert"))
    rt.cluster.indexes = kube.indexes()
    gone = pod("bert", "worker", 0, node_name="node-1")
    run(handlers.pod_event(event={"type": "DELETED"}, body=gone, memo=memo))
    assert woken() == {(NS, "other")}

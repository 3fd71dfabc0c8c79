"""A namespace's LimitRanges as the requests its pods will have (controller/admission/limitranges.py).

The rules below were checked against a real kube-apiserver 1.34 (the e2e harness's): a
LimitRange is stored with `defaultRequest` defaulted from `default`, then `min`, and `default`
from `max`; LimitRanger fills every container's unset requests, init containers and sidecars
included; a container with a limit and no request requests its limit.
"""

from __future__ import annotations

from collections import Counter

from mlsched.controller.admission.limitranges import (
    ContainerDefaults, Defaulted, as_planned, container_defaults, defaulted, limit_range_record,
    refusal,
)
from mlsched.controller.objects.job_records import job_record
from mlsched.controller.objects.quantities import pod_requests
from builders import NS, policy, ps_job
from controller_steps import round_, setup

GIB = 2.0**30


def _range(name="defaults", namespace=NS, *items):
    return {"apiVersion": "v1", "kind": "LimitRange",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"limits": list(items)}}


def test_a_limit_range_is_read_with_the_api_server_s_own_defaulting():
    record = limit_range_record(_range("d", NS, {"type": "Container", "default": {"cpu": "3"},
                                                 "max": {"memory": "6Gi"},
                                                 "min": {"ephemeral-storage": "1Mi"}}))
    # What the API server stores for this object (verified on 1.34): each becomes a request.
    assert dict(record.requests) == {"cpu": 3.0, "memory": 6 * GIB, "ephemeral-storage": 2.0**20}
    assert dict(record.limits) == {"cpu": 3.0, "memory": 6 * GIB}
    explicit = limit_range_record(_range("e", NS, {"type": "Container", "default": {"cpu": "3"},
                                                   "defaultRequest": {"cpu": "500m"}}))
    assert dict(explicit.requests) == {"cpu": 0.5} and dict(explicit.limits) == {"cpu": 3.0}
    # A later Container item overrides an earlier one; Pod and PVC items default nothing.
    two = limit_range_record(_range("t", NS, {"type": "Container", "defaultRequest": {"cpu": "1"}},
                                    {"type": "Container", "defaultRequest": {"cpu": "2"}},
                                    {"type": "Pod", "max": {"cpu": "64"}}))
    assert dict(two.requests) == {"cpu": 2.0}
    assert limit_range_record(_range("p", NS, {"type": "PersistentVolumeClaim",
                                               "min": {"storage": "1Gi"}})) is None
    pod_only = limit_range_record(_range("p", NS, {"type": "Pod", "max": {"cpu": "64"}}))
    assert pod_only.requests == () and pod_only.checks == (("Pod", "max", "cpu", 64.0),)
    # Several LimitRanges: the first by name sets what it defaults.
    a = limit_range_record(_range("a", NS, {"type": "Container", "defaultRequest": {"cpu": "1"}}))
    b = limit_range_record(_range("b", NS, {"type": "Container",
                                            "defaultRequest": {"cpu": "4", "memory": "1Gi"}}))
    assert container_defaults([b, a]).requests == {"cpu": 1.0, "memory": GIB}


def test_defaults_fill_only_what_each_container_leaves_unset():
    defaults = {"cpu": 3.0, "memory": 6 * GIB}
    spec = {"initContainers": [{"name": "init"},  # alone during init: 3 CPU
                               {"name": "side", "restartPolicy": "Always"}],  # a sidecar: 3 CPU
            "containers": [{"name": "a"},
                           {"name": "b", "resources": {"limits": {"cpu": "1"}}},
                           {"name": "c", "resources": {"requests": {"cpu": "500m"}}}]}
    # Running: a 3 + b 1 (its limit) + c 0.5 + the sidecar 3 CPU; memory 6 GiB each of four.
    assert pod_requests(spec, defaults) == (7.5, 0.0, 24.0)
    assert pod_requests(spec) == (1.5, 0.0, 0.0)  # without the LimitRange


def test_a_template_that_requests_nothing_is_planned_with_the_defaults_not_the_catalog():
    body = ps_job("resnet")  # a catalog model
    for role in body["spec"]["replicaSpecs"].values():
        for c in role["template"]["spec"]["containers"]:
            c.pop("resources", None)
    job = job_record(body)
    catalog_worker = job.demands["worker"]
    assert catalog_worker != (0.0, 0.0, 0.0)  # the catalog's prior, with no LimitRange
    planned = defaulted(job, ContainerDefaults({"cpu": 3.0, "memory": 4 * GIB,
                                                "example.com/fpga": 1.0}, {}))
    assert planned.demands["worker"] == planned.demands["ps"] == (3.0, 0.0, 4.0)
    # An extended resource a LimitRange defaults sends the role to nodes that have it.
    assert planned.node_constraints["worker"].resources == (("example.com/fpga", 1.0),)
    assert defaulted(job, ContainerDefaults({}, {})) is job


def test_the_job_index_is_seen_with_each_namespace_s_defaults():
    body = ps_job("resnet")
    for c in body["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"]:
        c["resources"] = {}
    job = job_record(body)
    ranges: dict = {}
    view = Defaulted({job.key: [job]}, ranges)
    assert view[job.key][0] is job and list(view.values()) == [[job]]  # no LimitRange: as is
    ranges["elsewhere"] = [limit_range_record(_range("d", "elsewhere", {
        "type": "Container", "defaultRequest": {"cpu": "3"}}))]
    assert view[job.key][0] is job  # another namespace's LimitRange changes nothing here
    ranges[NS] = [limit_range_record(_range("d", NS, {"type": "Container",
                                                      "defaultRequest": {"cpu": "3"}}))]
    seen = view[job.key][0]
    assert seen.demands["worker"][0] == 3.0 and view[job.key][0] is seen  # computed once
    ranges[NS] = [limit_range_record(_range("d", NS, {"type": "Container",
                                                      "defaultRequest": {"cpu": "2"}}))]
    assert view[job.key][0].demands["worker"][0] == 2.0  # the LimitRange edited: recomputed


def test_a_round_packs_pods_by_the_requests_their_namespace_gives_them():
    """A template requesting nothing in a namespace whose LimitRange defaults 3 CPU: each pod
    asks kube-scheduler for 3 CPU, so an 8-CPU node takes two. Bin-packing planned them as
    requesting nothing and put all four workers on one node (kube-scheduler refused two)."""
    body = ps_job("net", max_workers=4, min_workers=4)
    body["spec"]["modelType"] = "my-net"
    body["spec"]["architecture"] = "AllReduce"
    del body["spec"]["replicaSpecs"]["ps"]
    for c in body["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"]:
        c.pop("resources", None)
    rt, kube = setup(nodes=4, policies=(policy(allocation="fixed", placement="bin-pack"),),
                     job_bodies=[])
    kube.put(_range("defaults", NS, {"type": "Container", "defaultRequest": {"cpu": "3"}}))
    from builders import create_jobs, run
    run(create_jobs(rt, kube, body))
    report = round_(rt, kube)
    per_node = Counter(report.targets["net"].nodes["worker"])
    assert sum(per_node.values()) == 4 and max(per_node.values()) == 2, per_node


def test_a_job_whose_pods_a_limit_range_refuses_is_blocked_with_limit_ranger_s_words():
    """The objections below are the ones kube-apiserver 1.34 gave for the same pods (a
    Container max applies to init containers too; a Pod max to the pod's sum, sidecars
    included). Such a job used to be admitted and hold its GPUs while every pod got
    FailedCreate; now it is given nothing and told why."""
    caps = limit_range_record(_range("caps", NS,
                                     {"type": "Container", "max": {"cpu": "2"},
                                      "maxLimitRequestRatio": {"memory": "2"}},
                                     {"type": "Pod", "max": {"cpu": "6"}}))
    defaults = container_defaults([caps])

    def objection(spec):
        return refusal(spec, caps, defaults)

    mem = {"requests": {"memory": "1Gi"}, "limits": {"memory": "2Gi"}}
    assert objection({"initContainers": [{"name": "i", "resources": {
        "limits": {"cpu": "4", "memory": "1Gi"}}}], "containers": [{"name": "a", "resources": mem}]}) \
        == "maximum cpu usage per Container is 2, but limit is 4"
    assert objection({"containers": [{"name": n, "resources": mem} for n in "abcd"]}) == \
        "maximum cpu usage per Pod is 6, but limit is 8"  # 4 x the default limit of 2
    assert objection({"containers": [{"name": "a", "resources": {
        "requests": {"memory": "1Gi"}, "limits": {"memory": "4Gi"}}}]}) == \
        "memory max limit to request ratio per Container is 2, but provided ratio is 4"
    assert objection({"containers": [{"name": "a"}]}) == \
        "memory max limit to request ratio per Container is 2, but no request is specified or request is 0"
    assert objection({"containers": [{"name": "a", "resources": mem},
                                     {"name": "b", "resources": mem}]}) is None

    body = ps_job("greedy")
    for role in body["spec"]["replicaSpecs"].values():
        role["template"]["spec"]["containers"][0]["resources"] = mem
    assert as_planned(job_record(body), [caps]).blocked is None
    body["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": {"memory": "8Gi"}, "limits": {"memory": "32Gi", "nvidia.com/gpu": "1"}}
    job = as_planned(job_record(body), [caps])
    assert job.blocked == ("the namespace's LimitRange 'caps' refuses its worker pods: memory "
                           "max limit to request ratio per Container is 2, but provided ratio is 4")
    assert not job.schedulable


def test_a_blocked_job_gets_no_tasks_and_says_cannot_fit():
    from controller_steps import cond, sync
    body = ps_job("greedy", max_workers=4)
    body["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"},
        "limits": {"cpu": "2", "memory": "32Gi", "nvidia.com/gpu": "1"}}
    rt, kube = setup(nodes=4, job_bodies=[])
    kube.put(_range("caps", NS, {"type": "Container", "max": {"memory": "16Gi"}}))
    from builders import create_jobs, run
    run(create_jobs(rt, kube, body))
    report = round_(rt, kube)
    assert "greedy" not in report.targets or not report.targets["greedy"].count("worker")
    sync(rt, kube, "greedy")
    running = cond(kube, "greedy", "Running")
    assert running.reason == "CannotFit" and running.message == (
        "the namespace's LimitRange 'caps' refuses its worker pods: maximum memory usage per "
        "Container is 16Gi, but limit is 32Gi")

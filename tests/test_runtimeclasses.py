"""RuntimeClasses as the API server applies them to a job's pods (controller/constraints/runtimeclasses.py):
the overhead, nodeSelector and tolerations it adds, and its refusals, each checked on
kube-apiserver 1.34 with the same objects."""

from __future__ import annotations

from collections import Counter

from mlsched.controller.admission.limitranges import as_planned
from mlsched.controller.objects.job_records import job_record
from mlsched.controller.constraints.runtimeclasses import effective, runtime_class_record
from builders import NS, create_jobs, node, policy, ps_job, run
from controller_steps import cond, sync
from controller_steps import round_, setup

KEY = "sandbox.example.com/runtime"
SANDBOXED = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
             "metadata": {"name": "sandboxed"}, "handler": "runsc",
             "overhead": {"podFixed": {"cpu": "500m", "memory": "512Mi"}},
             "scheduling": {"nodeSelector": {KEY: "gvisor"},
                            "tolerations": [{"key": KEY, "operator": "Exists",
                                             "effect": "NoSchedule"}]}}


def test_a_pod_naming_a_runtime_class_gets_its_overhead_node_selector_and_tolerations():
    classes = {"sandboxed": runtime_class_record(SANDBOXED),
               "nvidia": runtime_class_record({"metadata": {"name": "nvidia"}, "handler": "nvidia"})}
    spec = {"runtimeClassName": "sandboxed", "nodeSelector": {"a": "b"},
            "containers": [{"name": "a"}]}
    made, refused = effective(spec, classes)
    assert refused is None
    assert made["overhead"] == {"cpu": "500m", "memory": "512Mi"}
    assert made["nodeSelector"] == {"a": "b", KEY: "gvisor"}
    assert made["tolerations"] == [{"key": KEY, "operator": "Exists", "effect": "NoSchedule"}]
    assert spec == {"runtimeClassName": "sandboxed", "nodeSelector": {"a": "b"},
                    "containers": [{"name": "a"}]}  # the template itself is left alone
    plain = {"runtimeClassName": "nvidia", "containers": [{"name": "a"}]}
    assert effective(plain, classes) == (plain, None)  # a class that changes nothing
    assert effective({**plain, "runtimeClassName": "nope"}, classes)[1] == \
        "name RuntimeClass 'nope', which does not exist: the API server refuses them"
    assert effective({**spec, "nodeSelector": {KEY: "runc"}}, classes)[1] == (
        f"select {KEY}=runc, which contradicts RuntimeClass 'sandboxed''s {KEY}=gvisor: "
        "the API server refuses them")


def _sandboxed_job(name="safe", cls="sandboxed", workers=4):
    body = ps_job(name, min_workers=workers, max_workers=workers)
    body["spec"]["architecture"] = "AllReduce"
    del body["spec"]["replicaSpecs"]["ps"]
    spec = body["spec"]["replicaSpecs"]["worker"]["template"]["spec"]
    spec["runtimeClassName"] = cls
    spec["containers"][0]["resources"] = {"requests": {"cpu": "3", "memory": "8Gi"},
                                          "limits": {"nvidia.com/gpu": "1"}}
    return body


def test_a_job_is_planned_where_its_runtime_class_runs_with_its_overhead():
    """Workers of 3 CPU plus the class's 0.5 CPU overhead, on the two nodes labelled (and
    tainted) for the runtime: two per 8-CPU node (3 would need 10.5). Planned from the
    template, they went to the untainted nodes without the runtime (kube-scheduler refused
    them), and packing ignored the overhead."""
    sandbox = {"key": KEY, "value": "gvisor", "effect": "NoSchedule"}
    rt, kube = setup(nodes=0, policies=(policy(allocation="fixed", placement="bin-pack"),),
                     job_bodies=[])
    for i in range(4):
        kube.put(node(f"n{i}", cpu="8", gpu="4"))
    for i in range(2):
        kube.put(node(f"g{i}", cpu="8", gpu="4", labels={KEY: "gvisor"}, taints=[sandbox]))
    kube.put(SANDBOXED)
    run(create_jobs(rt, kube, _sandboxed_job()))
    report = round_(rt, kube)
    per_node = Counter(report.targets["safe"].nodes["worker"])
    assert per_node == {"g0": 2, "g1": 2}, per_node
    job = kube.indexes().job(NS, "safe")
    assert job.demands["worker"][0] == 3.5  # the overhead counts


def test_a_job_naming_a_runtime_class_that_does_not_exist_is_told_so_and_holds_nothing():
    rt, kube = setup(nodes=4, job_bodies=[])
    run(create_jobs(rt, kube, _sandboxed_job("lost", cls="kata-qemu", workers=1)))
    report = round_(rt, kube)
    assert "lost" not in report.targets or not report.targets["lost"].count("worker")
    sync(rt, kube, "lost")
    running = cond(kube, "lost", "Running")
    assert running.reason == "CannotFit" and running.message == (
        "its worker pods name RuntimeClass 'kata-qemu', which does not exist: the API server "
        "refuses them")
    # The admin creates it: the job is planned at the next step.
    kube.put({**SANDBOXED, "metadata": {"name": "kata-qemu"}, "scheduling": None})
    job = kube.indexes().job(NS, "lost")
    assert job.blocked is None and job.schedulable
    assert as_planned(job_record(_sandboxed_job("x", cls="kata-qemu")), []).blocked is not None

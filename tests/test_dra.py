"""Devices claimed through Dynamic Resource Allocation (controller/constraints/dra.py) are counted per
node like extended resources: no round pins more one-GPU workers to a node than its
ResourceSlices publish devices of the class left unclaimed, a job whose claim template or
device class does not exist is told so, and what other pods' claims hold is taken out."""

from __future__ import annotations

import pytest

from mlsched.api import get_condition
from mlsched.controller.constraints import dra
from mlsched.controller.objects.job_records import job_record
from mlsched.controller.scheduling.indexes import flatten
from mlsched.controller.scheduling.cluster_state import held_elsewhere
from builders import NS, allreduce_job, cluster, create_jobs, make_runtime, pod, policy, run
from controller_steps import sync
from controller_steps import round_, settle
from builders import claiming, small_workers

DRIVER = "gpu.example.com"
GPU = dra.key(DRIVER)
SELECTOR = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu'"


def device_class(name: str = DRIVER, expression: str = SELECTOR) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expression}}]}}


def resource_slice(node_name: str, devices: int = 2, kind: str = "gpu", generation: int = 1,
                   driver: str = DRIVER) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node_name}-{driver}-{generation}"},
            "spec": {"driver": driver, "nodeName": node_name,
                     "pool": {"name": node_name, "generation": generation, "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{i}", "attributes": {"type": {"string": kind}}}
                                 for i in range(devices)]}}


def claim_template(name: str = "one-gpu", count: int = 1, class_name: str = DRIVER,
                   namespace: str = NS, **exactly) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": class_name, "count": count, **exactly}}]}}}}


def allocated_claim(pod_name: str, node_name: str, devices: list[str], namespace: str = NS) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"{pod_name}-gpu", "namespace": namespace,
                         "uid": f"claim-{namespace}-{pod_name}",
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod_name,
                                              "uid": "u", "controller": True}]},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": DRIVER, "pool": node_name, "device": d} for d in devices]}},
                "reservedFor": [{"resource": "pods", "name": pod_name, "uid": "u"}]}}


# ---------------------------------------------------------------- what the records read


@pytest.mark.parametrize("expression, conditions", [
    ("device.driver == 'gpu.example.com'", (("driver", "gpu.example.com"),)),
    ('"gpu.example.com" == device.driver', (("driver", "gpu.example.com"),)),
    (SELECTOR, (("driver", DRIVER), (DRIVER, "type", "gpu"))),
    ("(device.driver == 'x') && (device.attributes[\"x\"][\"mig\"] == true && "
     "device.attributes['x'].memory == 40)",
     (("driver", "x"), ("x", "mig", True), ("x", "memory", 40))),
])
def test_class_selectors_that_are_conjunctions_of_equalities_are_read(expression, conditions):
    assert sorted(dra.parse_selector(expression), key=str) == sorted(conditions, key=str)


@pytest.mark.parametrize("expression", [
    "device.driver == 'a' || device.driver == 'b'",
    "!(device.driver == 'a')",
    "device.driver != 'a'",
    "device.capacity['x'].memory.compareTo(quantity('40Gi')) >= 0",
    "device.attributes['x'].model.startsWith('H100')",
    "device.driver",
])
def test_any_other_selector_is_not_read(expression):
    assert dra.parse_selector(expression) is None
    assert dra.device_class_record(device_class("c", expression)).conditions is None


def test_devices_are_counted_per_node_and_class_from_the_newest_generation_of_each_pool():
    classes = [dra.device_class_record(device_class()),
               dra.device_class_record(device_class("any", f"device.driver == '{DRIVER}'")),
               dra.device_class_record(device_class("odd", "device.attributes['x'].a > 1"))]
    slices = [dra.resource_slice_record(resource_slice("n0", 2)),
              dra.resource_slice_record(resource_slice("n1", 4, generation=1)),
              dra.resource_slice_record(resource_slice("n1", 1, generation=2)),  # republished
              dra.resource_slice_record(resource_slice("n2", 3, kind="fpga")),
              dra.resource_slice_record(resource_slice("n3", 5, driver="nic.example.com"))]
    catalogue = dra.Catalogue.of(slices, classes, gpu_classes=frozenset({DRIVER, "any"}))
    assert catalogue.by_node == {"n0": {GPU: 2.0, "dra:any": 2.0}, "n1": {GPU: 1.0, "dra:any": 1.0},
                                 "n2": {"dra:any": 3.0}, "n3": {}}
    # A device two GPU classes select is one GPU.
    assert catalogue.gpus == {"n0": 2.0, "n1": 1.0, "n2": 3.0}
    claim = dra.resource_claim_record(allocated_claim("p", "n0", ["gpu-0", "gpu-1"]))
    assert claim.pod == "p"
    assert dra.claimed([claim], catalogue) == [(NS, "p", "n0", (("dra:any", 2.0), (GPU, 2.0)), 2.0)]
    unallocated = allocated_claim("q", "n0", [])
    assert dra.resource_claim_record(unallocated) is None


def test_templates_count_exact_requests_of_classes_that_can_be_read():
    classes = {c.name: c for c in (dra.device_class_record(device_class()),
                                   dra.device_class_record(device_class("odd", "device.a > 1")))}
    templates = {t.name: t for t in (
        dra.claim_template_record(claim_template("two", 2)),
        dra.claim_template_record(claim_template("odd", 1, "odd")),
        dra.claim_template_record(claim_template("all", allocationMode="All")),
        dra.claim_template_record(claim_template("picky", selectors=[{"cel": {"expression": "x"}}])),
        dra.claim_template_record(claim_template("nowhere", 1, "missing")))}
    assert dra.template_takes(["two", "odd", "all", "picky"], templates, classes) == (((GPU, 2.0),), None)
    assert dra.template_takes(["gone"], templates, classes)[1] == \
        "name ResourceClaimTemplate 'gone', which does not exist"
    assert dra.template_takes(["nowhere"], templates, classes)[1] == \
        "claim devices of DeviceClass 'missing' (ResourceClaimTemplate 'nowhere'), which does not exist"
    body = claiming(allreduce_job("ring"))
    body["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["resourceClaims"].append(
        {"name": "shared", "resourceClaimName": "one-for-all"})  # shared: not counted
    assert job_record(body).claim_templates == {"worker": ("one-gpu",)}


def test_a_request_narrowing_its_class_by_its_own_selectors_is_counted_of_its_own():
    """`device.attributes[...].model == 'h100'` in a request's selectors: the class's devices
    that meet it, a counted resource `dra:<class>[...]` beside the class's (a device counts
    for both); its GPUs are GPUs; an allocated h100 is held under both keys."""
    classes = {DRIVER: dra.device_class_record(device_class())}
    h100 = f"device.attributes['{DRIVER}'].model == 'h100'"
    template = dra.claim_template_record(claim_template("h100", selectors=[{"cel": {"expression": h100}}]))
    narrowed = f"{GPU}[{DRIVER}/model='h100']"
    assert dra.refinements([template]) == {(DRIVER, ((DRIVER, "model", "h100"),))}
    assert dra.template_takes(["h100"], {"h100": template}, classes) == (((narrowed, 1.0),), None)
    assert dra.class_key(narrowed) == GPU and dra.class_key(GPU) == GPU
    assert dra.gpus_of(((narrowed, 2.0),), frozenset({DRIVER})) == 2.0
    body = resource_slice("n0", 2)
    for device, model in zip(body["spec"]["devices"], ("h100", "a100")):
        device["attributes"]["model"] = {"string": model}
    catalogue = dra.Catalogue.of([dra.resource_slice_record(body)], classes.values(),
                                 refinements=dra.refinements([template]))
    assert catalogue.by_node == {"n0": {GPU: 2.0, narrowed: 1.0}}
    held = dra.claimed([dra.resource_claim_record(allocated_claim("p", "n0", ["gpu-0"]))], catalogue)
    assert held[0][3] == ((GPU, 1.0), (narrowed, 1.0))
    held = dra.claimed([dra.resource_claim_record(allocated_claim("q", "n0", ["gpu-1"]))], catalogue)
    assert held[0][3] == ((GPU, 1.0),)


def test_workers_asking_one_model_by_a_request_selector_go_where_that_model_is():
    """Each node publishes one h100 and one a100; three workers asking an h100 each were
    bin-packed onto one node by CPU (the request counted nothing), two refused."""
    kube = cluster(3)
    kube.put(device_class())
    for i in range(3):
        body = resource_slice(f"node-{i}", 2)
        for device, model in zip(body["spec"]["devices"], ("h100", "a100")):
            device["attributes"]["model"] = {"string": model}
        kube.put(body)
    h100 = f"device.attributes['{DRIVER}'].model == 'h100'"
    kube.put(claim_template("one-h100", selectors=[{"cel": {"expression": h100}}]))
    rt, kube = make_runtime(kube)
    kube.put(policy(placement="bin-pack"))
    run(create_jobs(rt, kube, claiming(small_workers(allreduce_job("h100s", max_workers=3), cpu="1",
                                                     min_workers=3), template="one-h100")))
    nodes = round_(rt, kube).targets["h100s"].nodes["worker"]
    assert sorted(nodes) == ["node-0", "node-1", "node-2"], nodes


# ---------------------------------------------------------------- through the operator


def dra_cluster(nodes: int = 4, per_node: int = 2):
    kube = cluster(nodes)
    kube.put(device_class())
    for i in range(nodes):
        kube.put(resource_slice(f"node-{i}", per_node))
    kube.put(claim_template())
    return kube


def test_workers_claiming_a_device_each_are_planned_within_the_devices_each_node_has():
    # Before: the eight workers request only 1 CPU in their containers, so bin-packing put
    # all eight on node-0, whose ResourceSlice publishes two devices; kube-scheduler refused
    # six ("cannot allocate all claims").
    rt, kube = make_runtime(dra_cluster())
    kube.put(policy(placement="bin-pack"))
    run(create_jobs(rt, kube, claiming(small_workers(allreduce_job("gpus", max_workers=8), cpu="1",
                                                     min_workers=8))))
    report = round_(rt, kube)
    nodes = report.targets["gpus"].nodes["worker"]
    assert sorted(nodes.count(n) for n in set(nodes)) == [2, 2, 2, 2], nodes
    settle(rt, kube)
    # Its own pods' claims, once allocated, are not counted against it a second time.
    for p in kube.of_kind("Pod"):
        name, where = p["metadata"]["name"], p["spec"].get("nodeName")
        kube.put(allocated_claim(name, where, [f"gpu-{int(name[-1]) % 2}"]))
    again = round_(rt, kube)
    assert sorted(again.targets["gpus"].nodes["worker"]) == sorted(nodes)


def test_devices_other_pods_claim_are_taken_out_and_the_job_waits_saying_why():
    kube = dra_cluster()
    other = pod("notebook", "worker", 0, node_name="node-0", namespace="elsewhere")
    other["metadata"]["labels"] = {}
    kube.put(other)
    kube.put(allocated_claim(other["metadata"]["name"], "node-0", ["gpu-0", "gpu-1"], "elsewhere"))
    rt, kube = make_runtime(kube)
    kube.put(policy(placement="bin-pack"))
    run(create_jobs(rt, kube, claiming(small_workers(allreduce_job("gpus", max_workers=8), cpu="1",
                                                     min_workers=8))))
    report = round_(rt, kube)
    assert report.targets["gpus"].nodes["worker"] == ()  # 6 devices free for a gang of 8
    sync(rt, kube, "gpus")
    admitted = get_condition(kube.obj("MLJob", NS, "gpus")["status"]["conditions"], "Admitted")
    assert ("needs 8 worker pods taking 1 gpu.example.com device each; the 4 nodes it may use "
            "have room for 6 such pods now") in admitted.message, admitted.message
    del kube.objects[("ResourceClaim", "elsewhere", f"{other['metadata']['name']}-gpu")]
    nodes = round_(rt, kube).targets["gpus"].nodes["worker"]
    assert sorted(nodes.count(n) for n in set(nodes)) == [2, 2, 2, 2], nodes


@pytest.mark.parametrize("template, missing, expected", [
    ("nowhere", None, "its worker pods name ResourceClaimTemplate 'nowhere', which does not exist"),
    ("one-gpu", "class", "its worker pods claim devices of DeviceClass 'gpu.example.com' "
                         "(ResourceClaimTemplate 'one-gpu'), which does not exist"),
])
def test_a_job_naming_a_claim_template_or_class_that_does_not_exist_cannot_fit(template, missing, expected):
    kube = dra_cluster()
    if missing == "class":
        del kube.objects[("DeviceClass", "", DRIVER)]
    rt, kube = make_runtime(kube)
    kube.put(policy())
    run(create_jobs(rt, kube, claiming(small_workers(allreduce_job("gpus", max_workers=2)), template)))
    report = round_(rt, kube)
    assert "gpus" not in report.targets or report.targets["gpus"].nodes["worker"] == ()
    sync(rt, kube, "gpus")
    running = get_condition(kube.obj("MLJob", NS, "gpus")["status"]["conditions"], "Running")
    assert running.reason == "CannotFit" and expected in running.message, running


def test_a_minimum_needing_more_devices_than_the_cluster_publishes_cannot_fit():
    rt, kube = make_runtime(dra_cluster())
    idx = kube.indexes()
    body = claiming(small_workers(allreduce_job("wide", max_workers=10), cpu="1", min_workers=10))
    job = idx.as_planned(job_record({**body, "metadata": {**body["metadata"], "uid": "u"}}))
    assert rt.cluster_fit(idx).why_not(job) == (
        "its minimum of 10 worker needs 10 pods taking 1 gpu.example.com device each; the 4 "
        "schedulable nodes that can take one have room for 8 (the gpu.example.com devices their "
        "ResourceSlices publish)")
    assert [n.extended.get(GPU) for n in sorted(flatten(idx.nodes), key=lambda n: n.name)] == [2.0] * 4


# ---------------------------------------------------------------- GPUs through DRA


def test_a_gpu_device_class_is_planned_as_gpus_so_drf_shares_them(monkeypatch):
    # Workers of "dra" claim one GPU each through DRA and request 2 CPU; those of "cpu"
    # request 4 CPU. Three nodes of 8 CPU publish two GPUs each and have no device-plugin GPU.
    # Seen as a CPU job, "dra" had half the dominant share per worker and DRF gave it 6
    # workers to "cpu"'s 3; with its GPUs counted both shares are 1/6 per worker: 4 and 4.
    monkeypatch.setattr(dra, "GPU_CLASSES", frozenset({DRIVER}))
    kube = cluster(3, gpu="0")
    kube.put(device_class())
    for i in range(3):
        kube.put(resource_slice(f"node-{i}", 2))
    kube.put(claim_template())
    rt, kube = make_runtime(kube)
    kube.put(policy())
    run(create_jobs(rt, kube,
                    claiming(small_workers(allreduce_job("dra", max_workers=6), cpu="2", min_workers=1)),
                    small_workers(allreduce_job("cpu", max_workers=6), cpu="4", min_workers=1)))
    idx = kube.indexes()
    assert [n.allocatable[1] for n in flatten(idx.nodes)] == [2.0, 2.0, 2.0]
    assert idx.job(NS, "dra").demands["worker"][:2] == (2.0, 1.0)
    report = round_(rt, kube)
    counts = {name: report.targets[name].count("worker") for name in ("dra", "cpu")}
    assert counts == {"dra": 4, "cpu": 4}, counts
    settle(rt, kube)
    # Its pods' claims allocated: not counted a second time, in GPUs or devices.
    for p in kube.of_kind("Pod"):
        name, where = p["metadata"]["name"], p["spec"].get("nodeName")
        if name.startswith("dra-"):
            kube.put(allocated_claim(name, where, [f"gpu-{int(name[-1]) % 2}"]))
    again = round_(rt, kube)
    assert {name: again.targets[name].count("worker") for name in ("dra", "cpu")} == counts


def test_gpus_other_pods_claim_through_dra_are_held(monkeypatch):
    monkeypatch.setattr(dra, "GPU_CLASSES", frozenset({DRIVER}))
    kube = dra_cluster(nodes=2)
    for body in kube.of_kind("Node"):
        body["status"]["allocatable"]["nvidia.com/gpu"] = "0"
    other = pod("notebook", "worker", 0, node_name="node-0", namespace="elsewhere")
    other["metadata"]["labels"] = {}
    for c in other["spec"]["containers"]:
        c["resources"] = {"requests": {"cpu": "100m"}}
    kube.put(other)
    kube.put(allocated_claim(other["metadata"]["name"], "node-0", ["gpu-0"], "elsewhere"))
    rt, kube = make_runtime(kube)
    cluster_state = kube.indexes().cluster()
    held = held_elsewhere(cluster_state, set(), {})
    assert held["node-0"][1] == 1.0 and "node-1" not in held, held


def test_the_gpu_device_classes_flag_reaches_the_planner(monkeypatch):
    import subprocess
    import sys

    from mlsched.controller.__main__ import export, parse_args
    from mlsched.controller.process.config import OperatorConfig

    assert OperatorConfig.from_env({}).gpu_device_classes == ("gpu.nvidia.com",)
    config = OperatorConfig.from_env({"MLSCHED_GPU_DEVICE_CLASSES": "gpu.amd.com, gpu.example.com"})
    assert config.gpu_device_classes == ("gpu.amd.com", "gpu.example.com") and not config.problems()
    bad = OperatorConfig.from_env({"MLSCHED_GPU_DEVICE_CLASSES": "GPU Class"})
    assert any("is not a DeviceClass name" in p for p in bad.problems())
    # As the CLI runs it: the flag reaches the module the planner reads.
    monkeypatch.delenv("MLSCHED_GPU_DEVICE_CLASSES", raising=False)
    export(parse_args(["--gpu-device-class", "gpu.amd.com", "--gpu-device-class", DRIVER]))
    out = subprocess.run([sys.executable, "-c", "from mlsched.controller.constraints import dra; "
                          "print(sorted(dra.GPU_CLASSES))"], capture_output=True, text=True, check=True)
    monkeypatch.delenv("MLSCHED_GPU_DEVICE_CLASSES")
    assert out.stdout.strip() == str(sorted(["gpu.amd.com", DRIVER]))


def test_with_namespace_the_claims_of_other_namespaces_are_watched_and_held():
    # An operator serving team-a only (kopf watches team-a's claims): a notebook of team-b
    # holding both devices of node-0 through its claim kept nobody off node-0 before.
    from mlsched.controller.objects.cluster_pods import OtherNamespaceClaims
    from mlsched.controller.scheduling.cluster_state import held_counted

    theirs = allocated_claim("notebook", "node-0", ["gpu-0", "gpu-1"], namespace="team-b")
    ours = allocated_claim("stray", "node-1", ["gpu-0"], namespace=NS)
    other = OtherNamespaceClaims([NS])
    other.replace([theirs, ours, allocated_claim("pending", "node-2", [], namespace="team-b")])
    assert [c.pod for c in other.claims()] == ["notebook"]  # served and unallocated ones left out
    kube = dra_cluster()
    idx = kube.indexes()
    idx.other_claims = other
    assert held_counted(idx.cluster(), set()) == {"node-0": {GPU: 2.0}}
    assert other.apply("DELETED", theirs) is True  # freed: waiting jobs are woken
    assert held_counted(idx.cluster(), set()) == {}

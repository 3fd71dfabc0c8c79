"""Builders shared by the controller tests: objects as the API server returns them (nodes, pods,
MLJobs, SchedulingPolicies), a MemoryKube cluster and a Runtime on it, and the helpers that run
a coroutine and wait for what it recorded. A helper module, not a test module: tests import it
(`from builders import ...`); tests/test_builders.py checks the builders parse.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import yaml

from mlsched.controller.process.config import OperatorConfig
from mlsched.controller.objects.job_records import job_record
from mlsched.controller.objects.records import node_record
from mlsched.controller.scheduling.runtime import Runtime
from memory_kube import MemoryKube

SAMPLES = Path(__file__).resolve().parent.parent / "manifests" / "samples"
# yaml.safe_load's constructor and resolver over libyaml's parser: the same objects, about 8 x
# faster (sample() runs for most controller tests, 750 times in the fast tier).
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
NS = "team-a"
NOW = 1_700_000_100.0  # every object the MemoryKube creates is stamped just before this


def node(name: str, cpu: str = "8", gpu: str = "2", memory: str = "48Gi", *, ready: bool = True,
         taints: list[dict] | None = None, labels: dict | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": {"taints": taints} if taints else {},
            "status": {"allocatable": {"cpu": cpu, "nvidia.com/gpu": gpu, "memory": memory,
                                       "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def sample(filename: str, namespace: str = NS) -> dict[str, Any]:
    body = yaml.load((SAMPLES / filename).read_text(), Loader=SAFE_LOADER)
    body["metadata"]["namespace"] = namespace
    return body


def ps_job(name: str = "resnet", *, policy: str = "default", min_workers: int = 1,
           max_workers: int = 8, epochs: float = 100, run_policy: dict | None = None,
           namespace: str = NS) -> dict[str, Any]:
    body = sample("mljob-resnet50-ps.yaml", namespace)
    body["metadata"]["name"] = name
    spec = body["spec"]
    spec["schedulingPolicy"] = policy
    spec["epochs"] = epochs
    spec["replicaSpecs"]["worker"].update(min=min_workers, max=max_workers)
    spec["runPolicy"] = run_policy or {}
    return body


def allreduce_job(name: str = "ring", *, max_workers: int = 8, namespace: str = NS) -> dict[str, Any]:
    body = sample("mljob-allreduce.yaml", namespace)
    body["metadata"]["name"] = name
    body["spec"]["replicaSpecs"]["worker"]["max"] = max_workers
    return body


def policy(name: str = "default", namespace: str = NS, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "mlsched.io/v1alpha1", "kind": "SchedulingPolicy",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def pod(job: str, role: str, ordinal: int, *, node_name: str | None = None,
        pinned: str | None = None, gated: bool = False, phase: str = "Running",
        restarts: int = 0, namespace: str = NS, uid: str | None = None,
        ready: bool | None = None) -> dict[str, Any]:
    """A pod of a job; Ready when Running unless `ready` says otherwise."""
    spec: dict[str, Any] = {"containers": [{"name": role, "resources": {
        "requests": {"cpu": "2", "memory": "8Gi", **({"nvidia.com/gpu": "1"} if role == "worker" else {})}}}]}
    if node_name:
        spec["nodeName"] = node_name
    if pinned:
        spec["nodeSelector"] = {"kubernetes.io/hostname": pinned}
    if gated:
        spec["schedulingGates"] = [{"name": "mlsched.io/placement"}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{job}-{role}-{ordinal}", "namespace": namespace,
                         "uid": uid or f"uid-{job}-{role}-{ordinal}",
                         "labels": {"mlsched.io/job-name": job, "mlsched.io/role": role}},
            "spec": spec,
            "status": {"phase": phase, "containerStatuses": [{"name": role, "restartCount": restarts}],
                       "conditions": [{"type": "Ready", "status": "True" if (
                           phase == "Running" if ready is None else ready) else "False"}]}}


def make_runtime(kube: MemoryKube | None = None, **config: Any) -> tuple[Runtime, MemoryKube]:
    kube = kube or MemoryKube()
    rt = Runtime.create(OperatorConfig(**config), kube)
    return rt, kube


def cluster(nodes: int = 4, **kw: Any) -> MemoryKube:
    kube = MemoryKube()
    for i in range(nodes):
        kube.put(node(f"node-{i}", **kw))
    return kube


async def create_jobs(rt: Runtime, kube: MemoryKube, *bodies: dict) -> None:
    """Store MLJobs and run the create handler on each, applying its status patch."""
    from mlsched.controller.app import jobs

    for body in bodies:
        stored = kube.put(body)
        patch: dict = {}
        await jobs.reconcile_children(rt, stored, kube.indexes(), patch)
        await kube.patch("MLJob", stored["metadata"]["namespace"], stored["metadata"]["name"],
                         patch, status=True)
        meta = stored["metadata"]  # reconciled, as jobs.reconcile_if_needed records it
        rt.jobs.books.reconciled[(meta["namespace"], meta["name"])] = (meta["uid"], meta["generation"])


def run(coro):
    return asyncio.run(coro)


def recorded(rt: Runtime, coro, timeout: float = 10.0):
    """Run a round (or an admission step) and wait until the status records and Events it
    queued in the background are written, as they are by the time anyone reads them in a
    cluster."""
    async def then_flush():
        result = await coro
        await rt.writers.status.flush(timeout)
        await rt.writers.events.settled(timeout)
        return result

    return run(then_flush())


def recorded_but_refused(rt: Runtime, kube: MemoryKube, coro, limit: float = 10.0):
    """Run a round while the API server refuses the status writes `kube.failing` names, and
    wait until every record it queued for another object is written and each refused one was
    tried (and refused) at least once; the refused stay queued, backing off.

    What it waits for is that state, not a wall-clock budget: a loaded machine only makes it
    come later (`limit` is a safety net that fails the test, never a timing the test needs)."""
    refused = {name for verb, name in kube.failing if verb == "patch"}
    failures = rt.process.metrics.api_errors.labels("record")

    def settled(failed_before: float) -> bool:
        left = rt.writers.status.pending_keys()
        return (all(name in refused for _, _, name in left)
                and failures._value.get() - failed_before >= len(left))

    async def then_settle():
        failed_before = failures._value.get()
        result = await coro
        deadline = time.monotonic() + limit
        while not settled(failed_before):
            assert time.monotonic() < deadline, (
                f"records still pending after {limit} s: {sorted(rt.writers.status.pending_keys())}, "
                f"refused: {sorted(refused)}")
            await asyncio.sleep(0.001)
        await rt.writers.events.settled(limit)
        return result

    return run(then_settle())


def env_of(template: dict, name: str):
    """The value (or valueFrom) of a pod template's first container's variable `name`."""
    env = {e["name"]: e for e in template["spec"]["containers"][0]["env"]}
    return env[name].get("value", env[name].get("valueFrom"))


# ---- jobs and nodes with counted resources (pod slots, NICs) and device claims -------------------
#: An extended resource the counted-resources tests ask for.
NIC = "example.com/nic"


def small_workers(body: dict, cpu: str = "500m", nics: int = 0, min_workers: int | None = None) -> dict:
    """The job's workers ask for `cpu`, 1Gi and no GPU (and `nics` NICs each)."""
    worker = body["spec"]["replicaSpecs"]["worker"]
    want = {"cpu": cpu, "memory": "1Gi", **({NIC: str(nics)} if nics else {})}
    worker["template"]["spec"]["containers"][0]["resources"] = {"requests": want, "limits": dict(want)}
    if min_workers is not None:
        worker["min"] = min_workers
    return body


def counted_record(body: dict):
    """The job's record as the operator parses it (with a uid and a creation time)."""
    return job_record({**body, "metadata": {**body["metadata"], "uid": "u-" + body["metadata"]["name"],
                                            "creationTimestamp": "2024-01-01T00:00:00Z"}})


def counted_node(name: str, pods: int = 110, nics: int = 0):
    """A node's record with `pods` pod slots and `nics` NICs."""
    body = node(name)
    body["status"]["allocatable"]["pods"] = str(pods)
    if nics:
        body["status"]["allocatable"][NIC] = str(nics)
    return node_record(body)


def claiming(body: dict, template: str = "one-gpu") -> dict:
    """The job's worker pods claim a device each through `template`."""
    spec = body["spec"]["replicaSpecs"]["worker"]["template"]["spec"]
    spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
    spec["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    return body


# ---- the progress endpoint: tokens and reports ------------------------------------------------
#: The audience of the projected tokens training pods present.
AUD = "mlsched.io/progress"


def review(pod_name, uid, namespace=NS, audiences=(AUD,)):
    return {"authenticated": True, "audiences": list(audiences),
            "user": {"username": f"system:serviceaccount:{namespace}:trainer",
                     "extra": {"authentication.kubernetes.io/pod-name": [pod_name],
                               "authentication.kubernetes.io/pod-uid": [uid]}}}


def progress_world():
    """A one-node cluster with jobs bert and gpt, a worker pod each, and the TokenReview answers
    the progress endpoint gets for each test token (good, stale, other namespace, wrong audience,
    no pod bound)."""
    rt, kube = make_runtime(cluster(1))
    for name in ("bert", "gpt"):
        kube.put(ps_job(name))
        kube.put(pod(name, "worker", 0, node_name="node-0"))
    kube.tokens["bert-token"] = review("bert-worker-0", "uid-bert-worker-0")
    kube.tokens["gpt-token"] = review("gpt-worker-0", "uid-gpt-worker-0")
    kube.tokens["stale-token"] = review("bert-worker-0", "uid-of-a-deleted-pod")
    kube.tokens["other-ns-token"] = review("bert-worker-0", "uid-bert-worker-0", namespace="team-b")
    kube.tokens["apiserver-token"] = review("bert-worker-0", "uid-bert-worker-0", audiences=("https://kubernetes.default.svc",))
    kube.tokens["unbound-token"] = {"authenticated": True, "audiences": [AUD],
                                    "user": {"username": f"system:serviceaccount:{NS}:trainer"}}
    rt.cluster.indexes = kube.indexes()
    return rt, kube


def progress_report(job="bert", epochs=3.0, **extra) -> dict:
    """A progress report's payload as a training pod POSTs it."""
    return {"namespace": NS, "job": job, "epochsDone": epochs, **extra}


# ---- the retrain CLI's view of the API -----------------------------------------------------------
class FakeCore:
    """CoreV1Api.list_namespaced_config_map, paged, as the retrain CLI calls it."""

    class Response:
        def __init__(self, doc):
            self.data = json.dumps(doc).encode()

    def __init__(self, items):
        self.items, self.calls = items, []

    def list_namespaced_config_map(self, namespace, label_selector, limit, _continue,
                                   _preload_content):
        self.calls.append((namespace, label_selector, _continue))
        start = int(_continue or 0)
        page = self.items[start:start + 1]
        more = start + 1 < len(self.items)
        return self.Response({"items": page, "metadata": {"continue": str(start + 1) if more else None}})

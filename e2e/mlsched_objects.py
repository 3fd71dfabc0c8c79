"""mlsched's own objects in the e2e cluster: CRDs, samples, MLJobs, SchedulingPolicies.

Tests create objects the way a user does (`kubectl apply` of the repository's YAML),
through the `kubernetes` client as the cluster admin, and read back only what the
API server stores.
"""

from __future__ import annotations

import contextlib
import copy
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

REPO = Path(__file__).resolve().parents[1]
CRD_DIR = REPO / "crds"
SAMPLES = REPO / "manifests" / "samples"
TRAINING_NAMESPACE = REPO / "manifests" / "base" / "training-namespace"
TRAINING_RBAC = REPO / "manifests" / "base" / "training-rbac" / "training-rbac.yaml"
GROUP, VERSION = "mlsched.io", "v1alpha1"
JOB_LABEL = "mlsched.io/job-name"
ROLE_LABEL = "mlsched.io/role"
POOL_LABEL = "mlsched.io/pool"
OWNER = "mlsched.io/pool-owner"
KWOK_TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}
IMAGE = "registry.invalid/mlsched/trainer:e2e"  # never pulled: kwok runs no containers
# An image the kwok "kubelet" cannot pull (kwok_stages.yaml, pod-image-missing).
MISSING_IMAGE = "registry.invalid/e2e/missing:404"
# A ConfigMap never created, whose volume the kwok "kubelet" cannot mount (pod-volume-missing).
MISSING_CONFIGMAP = "e2e-missing-settings"


def load_yaml(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


# ------------------------------------------------------------------ CRDs


def install_crds(api: client.ApiClient, timeout: float = 60.0) -> list[str]:
    """Creates the generated CRDs (crds/) and waits until the API serves them."""
    ext = client.ApiextensionsV1Api(api)
    names = []
    for path in sorted(CRD_DIR.glob("*.yaml")):
        for doc in load_yaml(path):
            if doc.get("kind") != "CustomResourceDefinition":
                continue
            names.append(doc["metadata"]["name"])
            try:
                ext.create_custom_resource_definition(doc)
            except ApiException as err:
                if err.status != 409:
                    raise
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            conditions = ext.read_custom_resource_definition(name).status.conditions or []
            if any(c.type == "Established" and c.status == "True" for c in conditions):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not Established after {timeout:.0f}s")
            time.sleep(0.2)
    return names


def apply_training_rbac(api: client.ApiClient, namespace: str) -> None:
    """manifests/base/training-rbac in `namespace`: the ServiceAccount the docs tell
    users to run training pods as (no API permissions at all). Already there is fine:
    the operator fixtures set up every served namespace with it."""
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    create = {"ServiceAccount": core.create_namespaced_service_account,
              "Role": rbac.create_namespaced_role,
              "RoleBinding": rbac.create_namespaced_role_binding}
    for doc in load_yaml(TRAINING_RBAC):
        try:
            create[doc["kind"]](namespace, doc)
        except ApiException as err:
            if err.status != 409:
                raise


# ------------------------------------------------------------------ manifests


def sample(file_name: str) -> dict:
    """One object from manifests/samples, unchanged."""
    (doc,) = load_yaml(SAMPLES / file_name)
    return doc


def default_policy() -> dict:
    """The SchedulingPolicy `default` of manifests/base/training-namespace, unchanged: what a
    namespace where jobs run has before the samples come (they bring none of that name)."""
    (doc,) = load_yaml(TRAINING_NAMESPACE / "default-schedulingpolicy.yaml")
    return doc


def for_kwok(job: dict, *, epochs: float | None = None, ttl: int | None = None,
             service_account: str | None = None) -> dict:
    """A copy of an MLJob whose pods can land on kwok nodes (they tolerate the kwok
    taint) and that finishes within a test (fewer epochs, a short TTL)."""
    job = copy.deepcopy(job)
    spec = job["spec"]
    for role in spec["replicaSpecs"].values():
        pod = role["template"].setdefault("spec", {})
        pod["tolerations"] = [*(pod.get("tolerations") or []), KWOK_TOLERATION]
        # kwok runs no container, so nothing checkpoints: the samples' claim (which needs
        # ReadWriteMany storage this control plane has not) becomes a volume that needs nothing.
        for volume in pod.get("volumes") or ():
            if volume.get("name") == "checkpoint" and "persistentVolumeClaim" in volume:
                del volume["persistentVolumeClaim"]
                volume["emptyDir"] = {}
        if service_account:
            pod["serviceAccountName"] = service_account
    if epochs is not None:
        spec["epochs"] = epochs
    if ttl is not None:
        spec.setdefault("runPolicy", {})["ttlSecondsAfterFinished"] = ttl
    return job


def checkpoint_volumes(core: client.CoreV1Api, namespace: str) -> list[str]:
    """What an admin provides for the samples' checkpoint claims: a ReadWriteMany
    PersistentVolume for each, bound to it by claimRef (hostPath: kwok mounts nothing).
    Returns their names; they are cluster-scoped, so the caller deletes them."""
    names = []
    for path in sorted(SAMPLES.glob("pvc-*.yaml")):
        (claim,) = load_yaml(path)
        name = f"{namespace}-{claim['metadata']['name']}"
        core.create_persistent_volume({
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"capacity": claim["spec"]["resources"]["requests"],
                     "accessModes": claim["spec"]["accessModes"],
                     "persistentVolumeReclaimPolicy": "Delete",
                     "hostPath": {"path": f"/tmp/{name}"},
                     "claimRef": {"namespace": namespace, "name": claim["metadata"]["name"]}}})
        names.append(name)
    return names


def _role(model_demand: dict[str, str], bounds: tuple[int, int]) -> dict:
    return {"min": bounds[0], "max": bounds[1], "template": {"spec": {
        "tolerations": [KWOK_TOLERATION],
        "containers": [{"name": "trainer", "image": IMAGE,
                        "resources": {"requests": model_demand, "limits": model_demand}}]}}}


GPU_WORKER = {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"}
PS = {"cpu": "2", "memory": "8Gi"}


def mljob(name: str, *, model: str = "resnet-50", epochs: float = 1000.0,
          ps: tuple[int, int] | None = (1, 2), workers: tuple[int, int] = (1, 2),
          policy: str = "default", run_policy: dict | None = None) -> dict:
    """A small MLJob for kwok nodes: ParameterServer when `ps` is given, else AllReduce."""
    specs = {"worker": _role(GPU_WORKER, workers)}
    if ps is not None:
        specs["ps"] = _role(PS, ps)
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "MLJob", "metadata": {"name": name},
            "spec": {"modelType": model,
                     "architecture": "ParameterServer" if ps is not None else "AllReduce",
                     "epochs": epochs, "schedulingPolicy": policy, "replicaSpecs": specs,
                     "runPolicy": run_policy or {}}}


# A day (432 s at the e2e operator's interval scale): no round re-decides the jobs while a
# test looks (a round may rightly give the waiting job a share of the first one's nodes).
DAY = 86400


def scheduling_policy(name: str = "default", *, allocation: str = "drf", interval: int = 1200,
                      models: dict | None = None, **spec: Any) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "SchedulingPolicy",
            "metadata": {"name": name},
            "spec": {"interval": interval, "allocation": allocation, "models": models or {},
                     **spec}}


@contextlib.contextmanager
def fresh_namespace(api: client.ApiClient) -> Iterator[str]:
    """A namespace of its own, deleted afterwards."""
    core = client.CoreV1Api(api)
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    try:
        yield name
    finally:
        core.delete_namespace(name)


# ------------------------------------------------------------------ reading and writing


class MLSched:
    """MLJobs, SchedulingPolicies and their children in one namespace."""

    def __init__(self, api: client.ApiClient, namespace: str):
        self.namespace = namespace
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)

    # -- custom objects
    def create(self, body: dict) -> dict:
        plural = {"MLJob": "mljobs", "SchedulingPolicy": "schedulingpolicies"}[body["kind"]]
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace,
                                                           plural, body)

    def job(self, name: str) -> dict | None:
        return self._get("mljobs", name)

    def policy(self, name: str) -> dict | None:
        return self._get("schedulingpolicies", name)

    def _get(self, plural: str, name: str) -> dict | None:
        try:
            return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace,
                                                            plural, name)
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def jobs(self) -> list[dict]:
        return self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace,
                                                         "mljobs")["items"]

    def patch_job(self, name: str, spec: dict) -> dict:
        """A merge patch of the job's spec: unlike a replace, it carries no resourceVersion, so
        it cannot lose a race with the operator's status writes (409 Conflict)."""
        return self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "mljobs", name, {"spec": spec})

    def patch_policy(self, name: str, spec: dict) -> dict:
        return self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "schedulingpolicies", name, {"spec": spec})

    def delete_all(self) -> None:
        for plural in ("mljobs", "schedulingpolicies"):
            self.custom.delete_collection_namespaced_custom_object(GROUP, VERSION,
                                                                   self.namespace, plural)

    def delete_all_now(self) -> None:
        """Cleanup after a burst of jobs: the jobs and policies deleted, then their StatefulSets
        and pods (the pods at once: kwok's nodes run nothing to stop). Only for jobs on kwok
        nodes."""
        self.delete_all()
        self.delete_children(grace_period_seconds=0)

    def delete_children(self, grace_period_seconds: int | None = None) -> None:
        """The namespace's StatefulSets and job pods deleted in one call each, as the garbage
        collector would delete a deleted job's children without waiting for it: it goes
        through kube-controller-manager's 20 requests/s, one delete per StatefulSet and per
        pod, and after an API server restart it took 52-80 s of a test's teardown (30 Nov
        2026). With the pods' own grace period (the default) a LocalKubelet stops their
        processes as it would for the collector's deletes."""
        self.apps.delete_collection_namespaced_stateful_set(self.namespace,
                                                            propagation_policy="Background")
        self.core.delete_collection_namespaced_pod(self.namespace, label_selector=JOB_LABEL,
                                                   grace_period_seconds=grace_period_seconds)

    def remaining(self) -> list[str]:
        out = []
        for plural in ("mljobs", "schedulingpolicies"):
            items = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace,
                                                              plural)["items"]
            out += [f"{plural}/{i['metadata']['name']}" for i in items]
        return out

    # -- children
    def statefulsets(self, job: str) -> dict[str, client.V1StatefulSet]:
        items = self.apps.list_namespaced_stateful_set(
            self.namespace, label_selector=f"{JOB_LABEL}={job}").items
        return {s.metadata.labels[ROLE_LABEL]: s for s in items}

    def pods(self, job: str | None = None) -> list[client.V1Pod]:
        selector = f"{JOB_LABEL}={job}" if job else JOB_LABEL
        return self.core.list_namespaced_pod(self.namespace, label_selector=selector).items

    def service(self, name: str) -> client.V1Service | None:
        try:
            return self.core.read_namespaced_service(name, self.namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def events(self, name: str, kind: str) -> list[client.CoreV1Event]:
        items = self.core.list_namespaced_event(self.namespace).items
        return [e for e in items
                if e.involved_object.name == name and e.involved_object.kind == kind]


def condition(body: dict | None, type_: str) -> dict | None:
    for c in ((body or {}).get("status") or {}).get("conditions") or ():
        if c.get("type") == type_:
            return c
    return None


def phase(body: dict | None) -> str | None:
    return ((body or {}).get("status") or {}).get("phase")


def ordinal(pod: client.V1Pod) -> int:
    return int(pod.metadata.name.rsplit("-", 1)[1])

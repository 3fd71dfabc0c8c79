"""kwok fake nodes: their manifests, creation, and switching them NotReady.

kwok manages the nodes annotated kwok.x-k8s.io/node=fake (see the --manage-nodes-*
flag in controlplane.py) and drives them through the Stages in kwok_stages.yaml.
The taint keeps ordinary pods off them; workloads meant for fake nodes tolerate it.
"""

from __future__ import annotations

import datetime
import ipaddress
import time

from kubernetes import client

KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
KWOK_TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
# Read by the Stages in kwok_stages.yaml; keep both in step.
NOT_READY_ANNOTATION = "e2e.mlsched.io/not-ready"
GPU_RESOURCE = "nvidia.com/gpu"

# Every node gets its own address and pod CIDR, so that pod IPs kwok hands out
# are unique across the cluster. Both ranges stay clear of the service CIDR.
_NODE_IPS = ipaddress.ip_address("172.16.0.1")
_POD_CIDRS = ipaddress.ip_address("10.128.0.0")


def node_manifest(name: str, serial: int, *, cpu: int, gpu: int, memory_gib: int,
                  pods: int = 110) -> dict:
    resources = {
        "cpu": str(cpu),
        "memory": f"{memory_gib}Gi",
        "pods": str(pods),
        GPU_RESOURCE: str(gpu),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1]},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
            },
        },
        "spec": {
            "taints": [KWOK_TAINT],
            "podCIDR": f"{_POD_CIDRS + 256 * serial}/24",
        },
        # A kubelet registers its node with capacity already in status; the
        # apiserver keeps status on create, and kwok leaves these fields alone.
        "status": {
            "capacity": resources,
            "allocatable": dict(resources),
            "addresses": [
                {"type": "InternalIP", "address": str(_NODE_IPS + serial)},
                {"type": "Hostname", "address": name},
            ],
        },
    }


def ready_status(node: client.V1Node) -> str:
    for condition in node.status.conditions or []:
        if condition.type == "Ready":
            return condition.status
    return "Unknown"


def wait_ready_status(core: client.CoreV1Api, names: list[str], status: str,
                      timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pending = set(names)
    while True:
        for name in list(pending):
            if ready_status(core.read_node(name)) == status:
                pending.discard(name)
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"nodes {sorted(pending)} did not reach Ready={status} in {timeout:.0f}s "
                "(is kwok running? see its log)")
        time.sleep(0.5)


def set_not_ready_annotation(core: client.CoreV1Api, name: str, not_ready: bool) -> None:
    # A JSON merge patch, where null removes the annotation.
    value = "true" if not_ready else None
    core.patch_node(name, {"metadata": {"annotations": {NOT_READY_ANNOTATION: value}}},
                    _content_type="application/merge-patch+json")


def stale_leases(api: client.ApiClient, since: datetime.datetime) -> list[str]:
    """The kwok nodes whose Lease (kube-node-lease) has not been renewed since `since` (aware
    UTC): kwok renews each every quarter of its duration (40 s: every 10 s)."""
    core, coordination = client.CoreV1Api(api), client.CoordinationV1Api(api)
    key, value = KWOK_ANNOTATION
    names = [n.metadata.name for n in core.list_node().items
             if (n.metadata.annotations or {}).get(key) == value]
    renewed = {lease.metadata.name: lease.spec.renew_time
               for lease in coordination.list_namespaced_lease("kube-node-lease").items}
    return sorted(n for n in names if renewed.get(n) is None or renewed[n] < since)


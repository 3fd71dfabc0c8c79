"""Kubernetes quantities and what pods ask for: `parse_quantity`, the (cpu, gpu, memory)
`Resources` the planner counts (the GPU as one extended resource, `GPU_RESOURCE`), and the
pod-level rules for requests, limits, extended resources and quota usage (a pod's
effective request is the larger of its init containers' and the sum of its containers',
plus its overhead). Pure: dict in, numbers out."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from mlsched.controller.kube.constants import HOSTNAME_LABEL

Resources = tuple[float, float, float]  # cpu, gpu, mem_gib: the order cluster/ uses
NO_RESOURCES: Resources = (0.0, 0.0, 0.0)
# The accelerator the planner counts as "GPU" in requests, allocatable and quotas: one extended
# resource name per operator (`--gpu-resource`, e.g. amd.com/gpu; nodes of another vendor's
# devices would not hold these pods, so two names are never summed). Read once, at import,
# like every MLSCHED_* setting the CLI exports before importing the handlers.
GPU_RESOURCE = os.environ.get("MLSCHED_GPU_RESOURCE") or "nvidia.com/gpu"
TERMINAL_POD_PHASES = ("Succeeded", "Failed")

_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_SUFFIX = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
           "P": 1e15, "E": 1e18, "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40,
           "Pi": 2.0**50, "Ei": 2.0**60}


def parse_quantity(value: Any) -> float:
    """A Kubernetes resource quantity ('7500m', '48Gi', '2') as a float; bad input is 0."""
    if isinstance(value, int | float):
        return float(value)
    match = _QUANTITY.match(str(value).strip())
    if not match:
        return 0.0
    return float(match.group(1)) * _SUFFIX[match.group(2) or ""]


def resources_of(quantities: Mapping[str, Any] | None) -> Resources:
    q = quantities or {}
    return (parse_quantity(q.get("cpu", 0)), parse_quantity(q.get(GPU_RESOURCE, 0)),
            parse_quantity(q.get("memory", 0)) / 2.0**30)


def add(a: Resources, b: Resources) -> Resources:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


def parse_time(value: Any) -> float | None:
    """RFC 3339 timestamp → epoch seconds (None when absent or unreadable)."""
    if isinstance(value, datetime):
        return value.timestamp()
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


# ------------------------------------------------------------------------------------- pods


def container_requested(container: Mapping[str, Any],
                        defaults: Mapping[str, float] | None = None) -> dict[str, float]:
    """Every resource a container (or a pod's own `spec.resources`) requests, by name, a limit
    without a request counting as its request; `defaults` (the namespace's LimitRange default
    requests, limitranges.py) for what it neither requests nor limits, as the LimitRanger
    admission plugin fills them in when the pod is created."""
    res = container.get("resources") or {}
    given = {name: parse_quantity(q) for name, q in
             {**(res.get("limits") or {}), **(res.get("requests") or {})}.items()}
    return {**defaults, **given} if defaults else given


def _planned(by_name: Mapping[str, float]) -> Resources:
    return (by_name.get("cpu", 0.0), by_name.get(GPU_RESOURCE, 0.0),
            by_name.get("memory", 0.0) / 2.0**30)


def is_extended(name: str) -> bool:
    """A resource the operator plans with by which nodes have enough of it for one pod (not by
    amount: kube-scheduler's refusals move the rest, displacement.py): an extended resource (a
    device plugin's or an admin's: `example.com/fpga`, `rdma/hca`, `nvidia.com/mig-1g.10gb`,
    `amd.com/gpu`: a domain-prefixed name other than the GPU planned by amount), local
    `ephemeral-storage` and `hugepages-<size>`. A template asking more of one than any node has
    used to be admitted and every pod left Pending (`Insufficient ephemeral-storage`)."""
    if name == "ephemeral-storage" or name.startswith("hugepages-"):
        return True
    return "/" in name and name != GPU_RESOURCE and not name.startswith("kubernetes.io/")


def pod_totals(spec: Mapping[str, Any],
               defaults: Mapping[str, float] | None = None) -> dict[str, float]:
    """What kube-scheduler reserves for a pod, by resource name, by Kubernetes' own rule
    (`defaults`: the LimitRange default requests every container gets where it sets none):
    - app containers and sidecars (init containers with `restartPolicy: Always`, which keep
      running) are summed;
    - a regular init container runs alone, one after another, but beside the sidecars declared
      before it: its own request plus theirs; the largest of these is the init phase's need;
    - the pod needs the larger of the two, plus the pod overhead of its RuntimeClass;
    - pod-level `spec.resources` (CPU and memory), where set, replaces the containers' sum.
    Without the sidecars, a template with an istio or log-shipping sidecar was packed by its
    app container alone and its pods stayed Pending on nodes that had no room for them."""
    return _pod_rule(spec, lambda c: container_requested(c, defaults), container_requested(spec))


def pod_limits(spec: Mapping[str, Any],
               defaults: Mapping[str, float] | None = None) -> dict[str, float]:
    """A pod's limits by resource name, by the same rule as its requests (what a ResourceQuota's
    `limits.*` counts); `defaults`: the LimitRange default limits. A resource some container
    leaves unlimited is summed over those that limit it (see quota_usage for why that is moot)."""
    return _pod_rule(spec, lambda c: container_limited(c, defaults),
                     container_limited(spec))  # pod-level: never defaulted


def container_limited(container: Mapping[str, Any],
                      defaults: Mapping[str, float] | None = None) -> dict[str, float]:
    """Every limit a container (or a pod's `spec.resources`) sets, by name; `defaults` (the
    LimitRange default limits) for what it does not."""
    given = {k: parse_quantity(q)
             for k, q in ((container.get("resources") or {}).get("limits") or {}).items()}
    return {**defaults, **given} if defaults else given


def _pod_rule(spec: Mapping[str, Any], per_container, pod_level: Mapping[str, float]) -> dict[str, float]:
    running: dict[str, float] = {}
    for c in spec.get("containers") or ():
        running = _sum(running, per_container(c))
    sidecars: dict[str, float] = {}
    init_phase: dict[str, float] = {}
    for c in spec.get("initContainers") or ():  # LimitRanger defaults these too (1.34)
        need = per_container(c)
        if c.get("restartPolicy") == "Always":
            running = _sum(running, need)
            sidecars = _sum(sidecars, need)
            need = sidecars
        else:
            need = _sum(need, sidecars)
        init_phase = {k: max(init_phase.get(k, 0.0), need.get(k, 0.0))
                      for k in init_phase.keys() | need.keys()}
    total = {k: max(running.get(k, 0.0), init_phase.get(k, 0.0))
             for k in running.keys() | init_phase.keys()}
    total.update({k: v for k, v in pod_level.items() if k in ("cpu", "memory") and v})
    overhead = {name: parse_quantity(q) for name, q in (spec.get("overhead") or {}).items()}
    return _sum(total, overhead)


def limits_planned(spec: Mapping[str, Any]) -> tuple[float, float]:
    limits = pod_limits(spec)
    return (limits.get("cpu", 0.0), limits.get("memory", 0.0) / 2.0**30)


#: What a ResourceQuota can bound that the operator plans with, in this order: requests of
#: CPU, GPU and memory (GiB), limits of CPU and memory (GiB), and the number of pods.
QUOTA_DIMS = 6
QuotaUsage = tuple[float, float, float, float, float, float]
NO_CHARGE: QuotaUsage = (0.0, 0.0, 0.0, 0.0, 0.0, 1.0)


def quota_usage(spec: Mapping[str, Any], request_defaults: Mapping[str, float] | None = None,
                limit_defaults: Mapping[str, float] | None = None) -> QuotaUsage:
    """What one pod of `spec` counts against its namespace's ResourceQuotas (QUOTA_DIMS order),
    LimitRange defaults applied. NaN for CPU or memory where a container (init containers
    included) sets no such request, or no such limit: the API server refuses such a pod
    outright wherever a quota bounds that resource ("must specify limits.cpu for: trainer",
    checked on 1.34), so it can never be booked against one."""
    requests = pod_totals(spec, request_defaults)
    limits = pod_limits(spec, limit_defaults)
    containers = [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]
    pod_level = spec.get("resources") or {}

    def every(kind: str, name: str, defaults: Mapping[str, float] | None) -> bool:
        if name in (defaults or {}) or name in (pod_level.get(kind) or {}):
            return True
        kinds = ("requests", "limits") if kind == "requests" else ("limits",)  # request = limit
        return all(any(name in ((c.get("resources") or {}).get(k) or {}) for k in kinds)
                   for c in containers)

    def amount(value: float, kind: str, name: str, defaults, unit: float = 1.0) -> float:
        return value / unit if every(kind, name, defaults) else float("nan")

    return (amount(requests.get("cpu", 0.0), "requests", "cpu", request_defaults),
            requests.get(GPU_RESOURCE, 0.0),
            amount(requests.get("memory", 0.0), "requests", "memory", request_defaults, 2.0**30),
            amount(limits.get("cpu", 0.0), "limits", "cpu", limit_defaults),
            amount(limits.get("memory", 0.0), "limits", "memory", limit_defaults, 2.0**30),
            1.0)


def _sum(a: Mapping[str, float], b: Mapping[str, float]) -> dict[str, float]:
    return {k: a.get(k, 0.0) + b.get(k, 0.0) for k in a.keys() | b.keys()}


def pod_requests(spec: Mapping[str, Any], defaults: Mapping[str, float] | None = None) -> Resources:
    """(CPU, GPU, memory GiB) kube-scheduler reserves for the pod (pod_totals)."""
    return _planned(pod_totals(spec, defaults))


def extended_requests(spec: Mapping[str, Any],
                      defaults: Mapping[str, float] | None = None) -> tuple[tuple[str, float], ...]:
    """The pod's extended resources (is_extended) and how much of each it requests."""
    return tuple(sorted((k, v) for k, v in pod_totals(spec, defaults).items()
                        if is_extended(k) and v > 0))


def pod_node(spec: Mapping[str, Any]) -> str | None:
    """The node a pod is on or pinned to: spec.nodeName once bound, else our nodeSelector."""
    return spec.get("nodeName") or (spec.get("nodeSelector") or {}).get(HOSTNAME_LABEL)


def is_active_pod(body: Mapping[str, Any]) -> bool:
    return (body.get("status") or {}).get("phase") not in TERMINAL_POD_PHASES



"""Compact, immutable views of Kubernetes objects: what the kopf indexes keep in memory.

Index functions (handlers.py) call these on every watch event, so the operator holds a few
hundred bytes per object instead of whole bodies, and a scheduling round reads plain fields
instead of walking nested dicts. Everything here is pure: dict in, record out.
"""

from __future__ import annotations

import json
import os
import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from mlsched.api import InvalidObject, MLJob
from mlsched.api.base import plain
from mlsched.controller.constraints import dra, runtimeclasses
from mlsched.controller.kube.constants import (
    HOSTNAME_LABEL, JOB_LABEL, PLACEMENT_GATE, POOL_LABEL, POOL_OWNER_ANNOTATION, ROLE_LABEL,
    STS_POOL_ANNOTATION, TEMPLATE_HASH_ANNOTATION, operator_labels,
)
from mlsched.controller.constraints.host_ports import host_ports, role_host_ports
from mlsched.controller.constraints.label_selector import Selector
from mlsched.controller.constraints.pod_anti_affinity import role_anti_affinity
from mlsched.controller.constraints.topology_spread import SpreadConstraint, role_spread_constraints
from mlsched.controller.constraints.node_constraints import NodeConstraint, role_constraints
from mlsched.workloads import catalog

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


# ------------------------------------------------------------------------------------ nodes


@dataclass(frozen=True, slots=True)
class NodeRecord:
    name: str
    allocatable: Resources
    ready: bool
    unschedulable: bool
    taints: frozenset[str]  # keys of NoSchedule / NoExecute taints
    labels: Mapping[str, str]
    pool_owner: str | None = None  # POOL_OWNER_ANNOTATION: the operator labelled its pool
    # (key, value, effect) of the NoSchedule / NoExecute taints: what pods must tolerate.
    taint_specs: tuple[tuple[str, str, str], ...] = ()
    # Allocatable extended resources (is_extended), by name: which nodes a template asking
    # for one can use at all.
    extended: Mapping[str, float] = field(default_factory=dict)
    # Allocatable `pods`: how many pods the kubelet runs at once (110 by default; on EKS with
    # the VPC CNI as few as 17 or 29 for small instance types). inf when not reported.
    pods: float = float("inf")

    @property
    def pool(self) -> str | None:
        return self.labels.get(POOL_LABEL)


def node_record(body: Mapping[str, Any]) -> NodeRecord:
    meta, spec, status = body.get("metadata", {}), body.get("spec") or {}, body.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in status.get("conditions") or ())
    specs = tuple(sorted((str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect")))
                         for t in spec.get("taints") or ()
                         if t.get("effect") in ("NoSchedule", "NoExecute")))
    return NodeRecord(name=meta["name"], allocatable=resources_of(status.get("allocatable")),
                      ready=ready, unschedulable=bool(spec.get("unschedulable")),
                      taints=frozenset(key for key, _, _ in specs),
                      labels=dict(meta.get("labels") or {}),
                      pool_owner=(meta.get("annotations") or {}).get(POOL_OWNER_ANNOTATION),
                      taint_specs=specs,
                      extended={k: parse_quantity(v) for k, v in
                                (status.get("allocatable") or {}).items() if is_extended(k)},
                      pods=_pod_slots(status.get("allocatable")))


def _pod_slots(allocatable: Mapping[str, Any] | None) -> float:
    value = (allocatable or {}).get("pods")
    return float("inf") if value is None else parse_quantity(value)


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


def _limits_planned(spec: Mapping[str, Any]) -> tuple[float, float]:
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


DEFAULT_SCHEDULER = "default-scheduler"


@dataclass(frozen=True, slots=True)
class PodRecord:
    """A pod of one of our jobs."""

    name: str
    uid: str
    role: str
    ordinal: int  # StatefulSet ordinal = task ordinal in the policy's decision
    node: str | None  # bound node, or the node the operator pinned it to
    bound: bool
    pinned: str | None  # our nodeSelector value, if any
    gates: tuple[str, ...]  # names of the scheduling gates still on the pod
    phase: str
    restarts: int  # container restarts plus one if the pod itself failed
    deleting: bool
    requests: Resources
    owner_uid: str | None = None  # its StatefulSet's uid (None: no owner reference)
    limits: tuple[float, float] = (0.0, 0.0)  # (CPU, memory GiB): what quotas' limits.* count
    # kube-scheduler's reason when it cannot place the pod (PodScheduled=False, Unschedulable):
    # "0/13 nodes are available: 1 node(s) had untolerated taint ...".
    unschedulable: str | None = None
    # StatefulSet pods restart whatever the exit code (restartPolicy Always): a restart after
    # exit 0 is the program finishing, not a failure (backoffLimit), and a pod whose every
    # container has exited 0 has completed its work.
    last_exit_zero: bool = False  # the latest restart followed an exit 0
    completed: bool = False
    # Its latest non-zero exit, said as a user needs it when backoffLimit fails the job:
    # "container worker exited with code 3 (Error)".
    last_failure: str | None = None
    # Why the kubelet cannot start one of its containers, when it is one of STUCK_REASONS:
    # "ImagePullBackOff: Back-off pulling image ...".
    stuck: str | None = None
    # Bound and its containers still being created (waiting `ContainerCreating` or
    # `PodInitializing`): what a volume that cannot be mounted looks like in status; only the
    # pod's FailedMount Events say why (jobs.stuck_creating).
    creating: bool = False
    # Not bound, and a ResourceClaim its template makes from a ResourceClaimTemplate is not
    # made yet (no resourceClaimStatuses entry for it): kube-scheduler waits for it silently;
    # only the pod's FailedResourceClaimCreation Events say why (jobs.claims_unmade).
    claims_unmade: bool = False
    # Its Ready condition is True (the kubelet's word, on the pod itself: the job's phase
    # follows it without waiting for the StatefulSet controller to count it).
    ready: bool = False
    scheduler: str = DEFAULT_SCHEDULER  # spec.schedulerName: who binds it once pinned
    # spec.priorityClassName ("" for none): set once, when the pod is created, from its
    # template or the globalDefault PriorityClass of that moment; a quota scoped to
    # PriorityClasses counts the pod by it (quotas.py), whatever the default is now.
    priority_class: str = ""
    # Not bound and no scheduler has said anything about it: PodScheduled is absent or still
    # the "SchedulingGated" it had while gated (kube-scheduler binds a pinned pod within a
    # second or says why not; a scheduler that is not running says nothing).
    unseen: bool = False
    host_ports: frozenset[tuple[str, int]] = frozenset()  # host_ports.py: held on its node
    # Its extended resources (is_extended) and how much of each: counted on its node
    # (counted_resources.py).
    extended: tuple[tuple[str, float], ...] = ()
    # Its labels: what other jobs' anti-affinity selectors match (snapshot.held_selected).
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def gated(self) -> bool:
        """Still waiting for the operator to pin it (kube-scheduler ignores it until then)."""
        return PLACEMENT_GATE in self.gates


def pod_record(body: Mapping[str, Any]) -> PodRecord | None:
    """None for pods whose name does not follow `<job>-<role>-<ordinal>` (not ours to place)."""
    meta, spec, status = body.get("metadata", {}), body.get("spec") or {}, body.get("status") or {}
    labels = meta.get("labels") or {}
    job, role = labels.get(JOB_LABEL), labels.get(ROLE_LABEL)
    prefix = f"{job}-{role}-"
    name = meta.get("name", "")
    if not job or not role or not name.startswith(prefix) or not name[len(prefix):].isdigit():
        return None
    containers = status.get("containerStatuses") or ()
    restarts = sum(int(c.get("restartCount") or 0) for c in containers)
    phase = status.get("phase") or "Pending"
    last_exits = [_exit_code(c.get("lastState")) for c in containers]
    exits = [(_exit_code(c.get("state")), _exit_code(c.get("lastState"))) for c in containers]
    return PodRecord(
        name=name, uid=meta.get("uid", ""), role=role, ordinal=int(name[len(prefix):]),
        node=pod_node(spec), bound=bool(spec.get("nodeName")),
        pinned=(spec.get("nodeSelector") or {}).get(HOSTNAME_LABEL),
        gates=tuple(g.get("name", "") for g in spec.get("schedulingGates") or ()),
        phase=phase, restarts=restarts + (1 if phase == "Failed" else 0),
        deleting=bool(meta.get("deletionTimestamp")), requests=pod_requests(spec),
        limits=_limits_planned(spec), owner_uid=controller_uid(meta),
        unschedulable=unschedulable_reason(status),
        last_exit_zero=bool(restarts) and all(e in (0, None) for e in last_exits)
        and 0 in last_exits,
        completed=bool(exits) and all(0 in pair for pair in exits),
        last_failure=_last_failure(containers),
        stuck=_stuck(status),
        creating=bool(spec.get("nodeName")) and phase == "Pending" and _creating(status),
        scheduler=spec.get("schedulerName") or DEFAULT_SCHEDULER,
        priority_class=str(spec.get("priorityClassName") or ""),
        unseen=not spec.get("nodeName") and _scheduler_silent(status),
        claims_unmade=not spec.get("nodeName") and _claims_unmade(spec, status),
        host_ports=host_ports(spec),
        extended=extended_requests(spec),
        labels=dict(labels),
        ready=phase == "Running" and any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or ()),
    )


def pod_labels(job: str, role: str, template: Any) -> dict[str, str]:
    """The labels a job's pods of `role` carry: the template's, then the operator's over them
    (desired.pod_template renders them the same way)."""
    meta = template.get("metadata") if isinstance(template, Mapping) else None
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    own = {str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else {}
    return {**own, **operator_labels(job, role)}


def _last_failure(containers: Iterable[Mapping[str, Any]]) -> str | None:
    """The latest non-zero exit among the containers (the one terminated now before the one it
    last restarted after), with the container's name, code and the runtime's reason."""
    for key in ("state", "lastState"):
        for container in containers:
            terminated = (container.get(key) or {}).get("terminated") or {}
            code = terminated.get("exitCode")
            if code not in (0, None):
                reason = f" ({terminated['reason']})" if terminated.get("reason") else ""
                return f"container {container.get('name', '?')} exited with code {code}{reason}"
    return None


def _exit_code(state: Mapping[str, Any] | None) -> int | None:
    terminated = (state or {}).get("terminated")
    return None if terminated is None else int(terminated.get("exitCode") or 0)


#: Container waiting reasons that do not pass by themselves: the pod holds its node and
#: never starts until the template, or what it refers to, is fixed.
STUCK_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                           "CreateContainerConfigError", "CreateContainerError",
                           "RunContainerError"})


def _stuck(status: Mapping[str, Any]) -> str | None:
    for c in [*(status.get("initContainerStatuses") or ()),
              *(status.get("containerStatuses") or ())]:
        waiting = ((c or {}).get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK_REASONS:
            message = waiting.get("message")
            return f"{waiting['reason']}: {message}" if message else waiting["reason"]
    return None


def _creating(status: Mapping[str, Any]) -> bool:
    return any((((c or {}).get("state") or {}).get("waiting") or {}).get("reason")
               in ("ContainerCreating", "PodInitializing")
               for c in [*(status.get("initContainerStatuses") or ()),
                         *(status.get("containerStatuses") or ())])


def _claims_unmade(spec: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    wanted = {c.get("name") for c in spec.get("resourceClaims") or ()
              if isinstance(c, Mapping) and c.get("resourceClaimTemplateName")}
    if not wanted:
        return False
    made = {c.get("name") for c in status.get("resourceClaimStatuses") or ()
            if isinstance(c, Mapping) and c.get("resourceClaimName")}
    return bool(wanted - made)


def _scheduler_silent(status: Mapping[str, Any]) -> bool:
    for c in status.get("conditions") or ():
        if c.get("type") == "PodScheduled":
            return c.get("reason") == "SchedulingGated"
    return True


def unschedulable_reason(status: Mapping[str, Any]) -> str | None:
    for c in status.get("conditions") or ():
        if c.get("type") == "PodScheduled" and c.get("status") == "False" \
                and c.get("reason") == "Unschedulable":
            return c.get("message") or "Unschedulable"
    return None


# ------------------------------------------------------------------------------ statefulsets


@dataclass(frozen=True, slots=True)
class StsRecord:
    name: str
    role: str
    replicas: int  # spec: what the operator last asked for
    ready: int  # status.readyReplicas
    template_hash: str | None
    uid: str = ""
    # The MLJob that owns it. A job deleted and recreated under the same name leaves children
    # owned by the old uid until the garbage collector removes them: never the new job's.
    owner_uid: str | None = None
    pool: PodPool | None = None  # the pool its template requires (STS_POOL_ANNOTATION)
    created: int = 0  # status.replicas: pods the StatefulSet controller has created
    # The StatefulSet controller has acted on its latest spec (status.observedGeneration):
    # until then a StatefulSet short of pods is only waiting in the controller's queue.
    observed: bool = True
    updated: int = 0  # status.updatedReplicas: pods of the latest template


@dataclass(frozen=True, slots=True)
class PodPool:
    """A grouped job's pods: required node affinity `key=value`, CPU requests / `share`."""

    key: str
    value: str
    share: int = 1

    def annotation(self) -> str:
        return json.dumps({"key": self.key, "value": self.value, "share": self.share},
                          sort_keys=True)

    @classmethod
    def parse(cls, text: str | None) -> PodPool | None:
        try:
            data = json.loads(text) if text else None
            return cls(str(data["key"]), str(data["value"]), max(1, int(data.get("share", 1))))
        except (ValueError, TypeError, KeyError):
            return None


def controller_uid(meta: Mapping[str, Any]) -> str | None:
    """The uid of the object's controlling owner, None when it has none."""
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller"):
            return ref.get("uid")
    return None


def sts_record(body: Mapping[str, Any]) -> StsRecord:
    meta, spec, status = body.get("metadata", {}), body.get("spec") or {}, body.get("status") or {}
    return StsRecord(name=meta["name"], role=(meta.get("labels") or {}).get(ROLE_LABEL, ""),
                     replicas=int(spec.get("replicas") or 0),
                     ready=int(status.get("readyReplicas") or 0),
                     template_hash=(meta.get("annotations") or {}).get(TEMPLATE_HASH_ANNOTATION),
                     uid=meta.get("uid", ""), owner_uid=controller_uid(meta),
                     pool=PodPool.parse((meta.get("annotations") or {}).get(STS_POOL_ANNOTATION)),
                     created=int(status.get("replicas") or 0),
                     observed=int(status.get("observedGeneration") or 0)
                     >= int(meta.get("generation") or 0),
                     updated=int(status.get("updatedReplicas") or 0))


# ------------------------------------------------------------------------------------ mljobs


@dataclass(frozen=True, slots=True)
class JobRecord:
    """An MLJob as the scheduling loop and the progress endpoint need it.

    `error` is set when the spec does not parse; such a job is never scheduled, and the lifecycle
    timer reports it on the object.
    """

    namespace: str
    name: str
    uid: str
    generation: int
    created_s: float
    policy: str
    model: str
    arch: str  # 'ps' or 'allreduce' (the cluster/ vocabulary)
    epochs: float
    min_ps: int
    max_ps: int
    min_workers: int
    max_workers: int
    suspend: bool
    phase: str | None
    final: bool  # Succeeded or Failed for good (a Failed for an invalid spec is not final)
    refused: bool  # Failed/InvalidSpec: waits for a spec edit, gets no tasks meanwhile
    epochs_done: float
    speed: float
    last_report_s: float | None
    history: tuple[Mapping[str, Any], ...]
    # (ps, workers, epochs) of the latest intervals in which the job trained, newest last:
    # the speed observations policies learn from, extracted once per watch event, not per round.
    trained: tuple[tuple[int, int, float], ...]
    slots_run: int  # intervals in the history in which the job had workers
    placement: Mapping[str, Any] | None  # status.placement as last written
    desired: Mapping[str, int]  # status.replicaStatuses.<role>.desired as last written
    # The pod templates by role, as written in the spec (a reference into the watched body,
    # not a copy): rendering StatefulSets needs them when a round changes a job's counts.
    templates: Mapping[str, Mapping[str, Any]]
    error: str | None = None
    samples_per_second: float | None = None  # as the job last reported it
    started: bool = False  # status.startTime: it has run (a change of its counts is a rescale)
    rescales: Mapping[str, Any] | None = None  # status.rescales as last written
    # What one pod of each role requests (its template's containers), the truth for planning;
    # the catalog's per-model demand only where the template requests nothing.
    demands: Mapping[str, Resources] = field(default_factory=dict)
    declared_epochs_per_hour: float | None = None  # spec.speedPrior
    # status.openInterval: the interval a round opened for this job and no round closed yet
    # (rewards.restore closes it after an operator restart).
    open_interval: Mapping[str, Any] | None = None
    group: str | None = None  # status.group: the pool its policy's grouping put it in
    group_since_s: float | None = None  # status.groupSince
    # Per role, the nodes its template allows (nodeSelector, required node affinity): the
    # rounds place its tasks there only. Roles that constrain nothing are absent.
    node_constraints: Mapping[str, NodeConstraint] = field(default_factory=dict)
    # Per role, what one pod counts against the namespace's ResourceQuotas (quota_usage).
    charges: Mapping[str, QuotaUsage] = field(default_factory=dict)
    runtime_classes: tuple[str, ...] = ()  # the RuntimeClasses its templates name
    # Per role, the ResourceClaimTemplates its template's resourceClaims name (dra.py): the
    # devices each pod claims are added to its node constraint's resources when planned.
    claim_templates: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Why the namespace's LimitRanges refuse its pods, if they do (limitranges.as_planned): the
    # job gets no tasks and is told CannotFit until the template or the LimitRange changes.
    blocked: str | None = None
    # The Running condition's reason (what `kubectl get mljobs` shows as REASON): WaitingForQuota,
    # CannotFit, PodsCannotStart, AllRolesReady, ... (metrics: mlsched_jobs_by_reason).
    reason: str | None = None
    # Per role, the host ports one pod holds on its node (host_ports.py): at most one such
    # pod per node and port. Roles holding none are absent.
    host_ports: Mapping[str, frozenset[tuple[str, int]]] = field(default_factory=dict)
    # Per role, the selectors of its template's required pod anti-affinity that spread its
    # pods one per node (pod_anti_affinity.py).
    anti_affinity: Mapping[str, tuple[Selector, ...]] = field(default_factory=dict)
    # Per role, the topologySpreadConstraints the planner enforces (topology_spread.py).
    spread_constraints: Mapping[str, tuple[SpreadConstraint, ...]] = field(default_factory=dict)

    # (namespace, name): how every index finds the job, read 60,000 times by a 10,000-job
    # round's snapshot, so made once.
    key: tuple[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", (self.namespace, self.name))

    def pod_labels(self, role: str) -> dict[str, str]:
        """The labels its pods of `role` carry: the template's and the operator's (derived
        when a round has selectors to match, not kept for every job)."""
        return pod_labels(self.name, role, self.templates.get(role))

    @property
    def finished(self) -> bool:
        return self.final and self.error is None

    @property
    def schedulable(self) -> bool:
        """Whether the scheduling loop should give this job tasks."""
        return (self.error is None and not self.suspend and not self.finished
                and not self.refused and self.blocked is None and self.epochs_done < self.epochs)

    def bounds(self, role: str) -> tuple[int, int]:
        if role == "ps":
            return (self.min_ps, self.max_ps) if self.arch == "ps" else (0, 0)
        return (self.min_workers, self.max_workers)

    def minimum_requests(self) -> Resources:
        """What the job's minimum (every role's `min`, admitted together) requests in all."""
        total = NO_RESOURCES
        for role in ("ps", "worker"):  # an all-reduce job's PS minimum is 0
            count = self.bounds(role)[0]
            d = self.demands.get(role, NO_RESOURCES)
            total = add(total, (count * d[0], count * d[1], count * d[2]))
        return total


INVALID_SPEC = "InvalidSpec"  # the reason of a Failed condition the user can still fix


def is_refused(status: Mapping[str, Any]) -> bool:
    """Failed because the spec (or a child rendered from it) is invalid: fixable by an edit."""
    return status.get("phase") == "Failed" and any(
        c.get("type") == "Failed" and c.get("status") == "True" and c.get("reason") == INVALID_SPEC
        for c in status.get("conditions") or ())


def is_final(status: Mapping[str, Any]) -> bool:
    return status.get("phase") in ("Succeeded", "Failed") and not is_refused(status)


MAX_OBSERVATIONS = 24  # per job, as in the simulator: older speeds say little about now


def trained_intervals(history: Any) -> tuple[tuple[tuple[int, int, float], ...], int]:
    """(the latest MAX_OBSERVATIONS (ps, workers, epochs) with training, intervals with workers)."""
    trained, slots = [], 0
    for h in history:
        workers = h.get("workers") or 0
        if workers:
            slots += 1
            epochs = h.get("epochs") or 0.0
            if epochs > 0:
                trained.append((int(h.get("ps") or 0), int(workers), float(epochs)))
    return tuple(trained[-MAX_OBSERVATIONS:]), slots


def parse_job(body: Mapping[str, Any]) -> MLJob:
    """Validate spec and name only: status is written by the operator itself, and parsing a
    long history on every watch event would cost more than the whole scheduling round."""
    return MLJob.from_k8s({"apiVersion": body.get("apiVersion", "mlsched.io/v1alpha1"),
                           "kind": "MLJob", "metadata": {"name": body["metadata"]["name"],
                                                         "namespace": body["metadata"].get("namespace")},
                           "spec": body.get("spec") or {}})


def model_label(model_type: str | None) -> str:
    """The catalog's canonical name for a catalog model, the label as given otherwise."""
    if not model_type:
        return "unknown"
    return catalog.canonical_name(model_type) if catalog.is_known(model_type) else model_type


def role_demands(model: str, templates: Mapping[str, Mapping[str, Any]],
                 defaults: Mapping[str, float] | None = None) -> dict[str, Resources]:
    """Per role: what its pods will request (the template's requests, with the namespace's
    LimitRange `defaults` where it sets none); where that is nothing, the catalog's demand
    for a catalog model (a prior, as for speeds), else nothing."""
    out: dict[str, Resources] = {}
    for role in ("ps", "worker"):
        template = templates.get(role) or {}
        spec = template.get("spec") if isinstance(template, Mapping) else None
        requested = pod_requests(spec, defaults) if isinstance(spec, Mapping) else NO_RESOURCES
        if requested == NO_RESOURCES and catalog.is_known(model):
            requested = tuple(float(x) for x in catalog.get(model).demand(role))  # type: ignore[assignment]
        out[role] = requested
    return out


def role_charges(templates: Mapping[str, Mapping[str, Any]],
                 request_defaults: Mapping[str, float] | None = None,
                 limit_defaults: Mapping[str, float] | None = None) -> dict[str, QuotaUsage]:
    """Per role, what one of its pods counts against the namespace's ResourceQuotas."""
    out = {}
    for role in ("ps", "worker"):
        template = templates.get(role)
        spec = template.get("spec") if isinstance(template, Mapping) else None
        if isinstance(spec, Mapping):
            out[role] = quota_usage(spec, request_defaults, limit_defaults)
    return out


def job_record(body: Mapping[str, Any]) -> JobRecord:
    meta, spec = body.get("metadata", {}), body.get("spec") or {}
    status = body.get("status") or {}
    progress = status.get("progress") or {}
    trained, slots_run = trained_intervals(status.get("history") or ())
    common = dict(
        namespace=meta.get("namespace", ""), name=meta["name"], uid=meta.get("uid", ""),
        generation=int(meta.get("generation") or 0),
        created_s=parse_time(meta.get("creationTimestamp")) or 0.0,
        policy=str(spec.get("schedulingPolicy") or "default"), phase=status.get("phase"),
        reason=next((c.get("reason") for c in status.get("conditions") or ()
                     if isinstance(c, Mapping) and c.get("type") == "Running"), None),
        final=is_final(status), refused=is_refused(status),
        epochs_done=float(progress.get("epochsDone") or 0.0),
        speed=float(progress.get("speed") or 0.0),
        last_report_s=parse_time(progress.get("lastReportTime")),
        samples_per_second=(float(progress["samplesPerSecond"])
                            if progress.get("samplesPerSecond") is not None else None),
        started=bool(status.get("startTime")),
        rescales=status.get("rescales") if isinstance(status.get("rescales"), Mapping) else None,
        history=tuple(status.get("history") or ()),
        trained=trained, slots_run=slots_run,
        placement=status.get("placement"),
        open_interval=status.get("openInterval"),
        group=status.get("group"), group_since_s=parse_time(status.get("groupSince")),
        desired={role: int((rs or {}).get("desired") or 0)
                 for role, rs in (status.get("replicaStatuses") or {}).items()},
        templates={role: (rs or {}).get("template") or {}
                   for role, rs in (spec.get("replicaSpecs") or {}).items()
                   if isinstance(rs, Mapping)},
    )
    return JobRecord(**common, **_read_spec(body, common["templates"])[1])


def parsed_job(body: Mapping[str, Any]) -> MLJob:
    """parse_job, read once per spec (see _FROM_SPEC); raises InvalidObject as it does."""
    job = _read_spec(body)[0]
    if isinstance(job, InvalidObject):
        raise job
    return job


def _read_spec(body: Mapping[str, Any], templates: Mapping[str, Any] | None = None
               ) -> tuple[MLJob | InvalidObject, dict[str, Any]]:
    meta, spec = body.get("metadata", {}), body.get("spec") or {}
    key = (meta.get("namespace", ""), meta["name"])
    cached = _FROM_SPEC.get(key)
    if cached is not None and cached[0] == spec:
        _FROM_SPEC.move_to_end(key)
        return cached[1], cached[2]
    if templates is None:
        templates = {role: (rs or {}).get("template") or {}
                     for role, rs in (spec.get("replicaSpecs") or {}).items()
                     if isinstance(rs, Mapping)}
    try:
        job: MLJob | InvalidObject = parse_job(body)
    except InvalidObject as exc:
        job = exc
    fields = _from_spec(job, meta["name"], templates)
    _FROM_SPEC[key] = (plain(spec), job, fields)
    if len(_FROM_SPEC) > MAX_SPEC_CACHE:
        _FROM_SPEC.popitem(last=False)
    return job, fields


#: What job_record reads from the spec (and the parsed MLJob), by job, with the spec it was
#: read from: one parse serves every status write and watch event until the spec changes (a
#: comparison of two dicts costs microseconds). Parsing the spec (pydantic validation, the templates' requests,
#: constraints and charges) on each was 19 % of the operator's event loop in a 300-job burst
#: (py-spy, bench_e2e (a)), which then saw its pods' Ready events 18 s late. Oldest out first
#: beyond MAX_SPEC_CACHE (a few KiB each).
_FROM_SPEC: OrderedDict[tuple[str, str], tuple[dict[str, Any], MLJob | InvalidObject,
                                                dict[str, Any]]] = OrderedDict()
MAX_SPEC_CACHE = 20000


def _from_spec(job: MLJob | InvalidObject, name: str, templates: Mapping[str, Any]
               ) -> dict[str, Any]:
    if isinstance(job, InvalidObject):
        return dict(model="", arch="ps", epochs=0.0, min_ps=0, max_ps=0, min_workers=0,
                    max_workers=0, suspend=False, error=str(job))
    rs = job.spec.replica_specs
    model = model_label(job.spec.model_type)
    labels = {role: pod_labels(name, role, t) for role, t in templates.items()}
    return dict(
        model=model, demands=role_demands(model, templates),
        charges=role_charges(templates),
        runtime_classes=runtimeclasses.named(templates),
        claim_templates={role: names for role, t in templates.items()
                         if (names := dra.claim_template_names(t))},
        node_constraints=role_constraints(templates, extended_requests),
        host_ports=role_host_ports(templates),
        anti_affinity=role_anti_affinity(templates, labels),
        spread_constraints=role_spread_constraints(templates, labels),
        declared_epochs_per_hour=(job.spec.speed_prior.reference_epochs_per_hour
                                  if job.spec.speed_prior else None),
        arch="ps" if job.spec.architecture == "ParameterServer" else "allreduce",
        epochs=job.spec.epochs, min_ps=rs.ps.min if rs.ps else 0, max_ps=rs.ps.max if rs.ps else 0,
        min_workers=rs.worker.min, max_workers=rs.worker.max, suspend=job.spec.run_policy.suspend,
    )

"""Compact, immutable views of Kubernetes objects: what the kopf indexes keep in memory.

Index functions (handlers.py) call these on every watch event, so the operator holds a few
hundred bytes per object instead of whole bodies, and a scheduling round reads plain fields
instead of walking nested dicts. Everything here is pure: dict in, record out. Nodes, pods
and StatefulSets here; an MLJob's record in job_records.py, the quantities and per-pod
request rules they read in quantities.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mlsched.controller.kube.constants import (
    HOSTNAME_LABEL, JOB_LABEL, PLACEMENT_GATE, POOL_LABEL, POOL_OWNER_ANNOTATION, ROLE_LABEL,
    STS_POOL_ANNOTATION, TEMPLATE_HASH_ANNOTATION, operator_labels,
)
from mlsched.controller.constraints.host_ports import host_ports
from mlsched.controller.objects.quantities import (
    Resources, limits_planned, extended_requests, is_extended,
    parse_quantity, parse_time, pod_node, pod_requests, resources_of,
)



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
    # Its labels: what other jobs' anti-affinity selectors match (cluster_state.held_selected).
    labels: Mapping[str, str] = field(default_factory=dict)
    # metadata.creationTimestamp (whole seconds): a pod made before its job's counts last
    # changed measured its speed at the old counts (progress_server.py).
    created_s: float | None = None

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
        limits=limits_planned(spec), owner_uid=controller_uid(meta),
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
        created_s=parse_time(meta.get("creationTimestamp")),
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

"""The kinds the operator watches, in one table (`WATCHED`): each kind's resource, its kopf
indexes (each turning a watch event's body into compact records: objects/records.py,
job_records.py, ...) with the `Indexes` attribute the rest of the operator reads each as, and
what a change of it wakes. Everything else is derived from the table: the kopf index
registrations (below), `INDEXED` (relists.py re-reads every index after a watch was down),
`indexes_from` (kopf's index keywords → `Indexes`), the event handlers that note every event
and wake admission (handlers.py), and the in-memory API server's indexes (tests/memory_kube.py).

A new watched kind is one `Watched` entry: its index function here, its record builder where
its constraint lives; a typed field in `Indexes` is optional (an undeclared one is read as an
attribute all the same); a handler of its own in handlers.py only if a change of it wakes
something other than every policy's admission step (RBAC: manifests/base/rbac.yaml).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import kopf

from mlsched.api import GROUP, VERSION
from mlsched.controller.scheduling import fair_share
from mlsched.controller.constraints import dra
from mlsched.controller.process.config import OperatorConfig
from mlsched.controller.kube.constants import JOB_LABEL
from mlsched.controller.constraints.host_ports import host_ports
from mlsched.controller.admission.limitranges import limit_range_record
from mlsched.controller.constraints.pod_anti_affinity import node_selectors
from mlsched.controller.constraints.runtimeclasses import runtime_class_record
from mlsched.controller.admission.quotas import global_default_entry, quota_record
from mlsched.controller.objects.records import node_record, pod_record, sts_record
from mlsched.controller.objects.job_records import job_record
from mlsched.controller.objects.quantities import extended_requests, is_active_pod, pod_requests
from mlsched.controller.scheduling.indexes import Indexes

DRA = ("resource.k8s.io", "v1")  # Dynamic Resource Allocation's API (dra.py)

MLJOBS = (GROUP, VERSION, "mljobs")
POLICIES = (GROUP, VERSION, "schedulingpolicies")
CONFIG = OperatorConfig.from_env()  # read at import: the timer interval is a decorator argument


NOT_INDEXED: Mapping[str, Any] = MappingProxyType({})


def node_index(name: str, body: kopf.Body, **_: Any):
    return {name: node_record(body)}


def pod_index(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any):
    record = pod_record(body)
    return {(namespace, labels[JOB_LABEL]): record} if record else NOT_INDEXED


def foreign_pod_index(spec: kopf.Spec, body: kopf.Body, **_: Any):
    """Requests of other schedulers' pods per node: capacity our jobs cannot have."""
    node = _bound_to(spec, body)
    return {node: pod_requests(spec)} if node else NOT_INDEXED


def _bound_to(spec: kopf.Spec, body: kopf.Body) -> str | None:
    """The node a pod is bound to, while it holds it (not Succeeded or Failed)."""
    node = spec.get("nodeName")
    return node if node and is_active_pod(body) else None


def foreign_port_index(spec: kopf.Spec, body: kopf.Body, **_: Any):
    """Host ports of other schedulers' pods per node, for those holding any (host_ports.py):
    a node where one holds 29500 takes no task that needs it."""
    node = _bound_to(spec, body)
    ports = host_ports(spec) if node else None
    return {node: ports} if ports else NOT_INDEXED


def foreign_extended_index(spec: kopf.Spec, body: kopf.Body, **_: Any):
    """Extended resources of other schedulers' pods per node, for those requesting any
    (counted_resources.py): a node whose two RDMA NICs another pod holds takes no task
    that needs one."""
    node = _bound_to(spec, body)
    extended = extended_requests(spec) if node else None
    return {node: extended} if extended else NOT_INDEXED


def foreign_label_index(namespace: str, spec: kopf.Spec, labels: kopf.Labels, body: kopf.Body,
                        **_: Any):
    """Node and labels of other schedulers' pods per namespace, for those with labels: a
    job's required anti-affinity keeps its pods off nodes where a matching pod of its
    namespace runs (cluster_state.held_selected)."""
    node = _bound_to(spec, body) if labels else None
    return {namespace: (node, dict(labels))} if node else NOT_INDEXED


def foreign_repel_index(namespace: str, spec: kopf.Spec, body: kopf.Body, **_: Any):
    """Node and required anti-affinity selectors (per node) of other schedulers' pods per
    namespace, for those carrying any: a job pod matching one is kept off that node
    (pod_anti_affinity.py)."""
    node = _bound_to(spec, body)
    selectors = node_selectors(spec) if node else ()
    return {namespace: (node, selectors)} if selectors else NOT_INDEXED


def quota_index(namespace: str, body: kopf.Body, **_: Any):
    """Each namespace's ResourceQuotas: what its rounds may book (quotas.py)."""
    record = quota_record(body)
    return {namespace: record} if record else NOT_INDEXED


def limit_range_index(namespace: str, body: kopf.Body, **_: Any):
    """Each namespace's LimitRanges: the requests its pods will be given (limitranges.py)."""
    record = limit_range_record(body)
    return {namespace: record} if record else NOT_INDEXED


def priority_class_index(name: str, body: kopf.Body, **_: Any):
    """The globalDefault PriorityClass: the class of pods whose template names none, which
    PriorityClass-scoped ResourceQuotas count (quotas.py)."""
    return global_default_entry(name, body) or NOT_INDEXED


def runtime_class_index(name: str, body: kopf.Body, **_: Any):
    """RuntimeClasses by name: what the pods of a template naming one will be."""
    return {name: runtime_class_record(body)}


# Dynamic Resource Allocation (dra.py). On a cluster without resource.k8s.io/v1 (before
# Kubernetes 1.34) kopf logs that these are not served and the rest runs as before.
def device_class_index(name: str, body: kopf.Body, **_: Any):
    """DeviceClasses by name: which devices a claim of the class can be given."""
    return {name: dra.device_class_record(body)}


def resource_slice_index(name: str, body: kopf.Body, **_: Any):
    """Node-local ResourceSlices by name: the devices each node has."""
    record = dra.resource_slice_record(body)
    return {name: record} if record.node else NOT_INDEXED


def claim_template_index(namespace: str, body: kopf.Body, **_: Any):
    """Each namespace's ResourceClaimTemplates: the devices each pod naming one claims."""
    return {namespace: dra.claim_template_record(body)}


def resource_claim_index(namespace: str, body: kopf.Body, **_: Any):
    """Allocated ResourceClaims by namespace: the devices in use."""
    record = dra.resource_claim_record(body)
    return {namespace: record} if record else NOT_INDEXED


def statefulset_index(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any):
    return {(namespace, labels[JOB_LABEL]): sts_record(body)}


def mljob_index(namespace: str, name: str, body: kopf.Body, **_: Any):
    return {(namespace, name): job_record(body)}


def policy_index(namespace: str, name: str, spec: kopf.Spec, **_: Any):
    """The policies there are, with each one's fair-sharing weight (fair_share.py), which
    every other policy's steps read."""
    return {(namespace, name): fair_share.weight_of(spec)}


# ------------------------------------------------------------------------- the table
#: `Watched.wakes` for a kind any event of which may let waiting jobs fit or be planned:
#: handlers.py registers one handler for all of them that wakes every policy's admission step.
EVERY_ADMISSION = "every policy's admission step"


@dataclass(frozen=True)
class Index:
    """One kopf index of a watched kind: `build` (body → {key: record}, or NOT_INDEXED) is
    registered with kopf under its function's name, the keyword kopf passes the index by;
    readers see it as `Indexes.<field>`; `labels`: kopf's label filter, if any."""

    field: str
    build: Callable[..., Mapping[Any, Any]]
    labels: Mapping[str, Any] | None = None

    @property
    def id(self) -> str:
        return self.build.__name__

    def selects(self, labels: Mapping[str, str]) -> bool:
        """Whether an object with these labels is indexed (kopf's filter, for the fakes)."""
        for key, want in (self.labels or {}).items():
            if want is kopf.PRESENT:
                found = key in labels
            elif want is kopf.ABSENT:
                found = key not in labels
            else:
                found = labels.get(key) == want
            if not found:
                return False
        return True


@dataclass(frozen=True)
class Watched:
    """A watched kind: `group` "" is the core API (kopf is then given the plural alone)."""

    kind: str
    group: str
    version: str
    plural: str
    indexes: tuple[Index, ...]
    # What a change wakes: EVERY_ADMISSION, or the names of the handlers in handlers.py that
    # decide (tests/test_watched_kinds.py checks each is registered for the kind).
    wakes: str | tuple[str, ...]

    @property
    def resource(self) -> tuple[str, ...]:
        """kopf's positional resource arguments."""
        return (self.group, self.version, self.plural) if self.group else (self.plural,)


OURS, FOREIGN = {JOB_LABEL: kopf.PRESENT}, {JOB_LABEL: kopf.ABSENT}

WATCHED: tuple[Watched, ...] = (
    Watched("Node", "", "v1", "nodes", (Index("nodes", node_index),),
            wakes=("node_event",)),  # a changed record (not a heartbeat): every admission
    Watched("Pod", "", "v1", "pods", (
        Index("pods", pod_index, OURS),
        Index("foreign", foreign_pod_index, FOREIGN),
        Index("foreign_ports", foreign_port_index, FOREIGN),
        Index("foreign_extended", foreign_extended_index, FOREIGN),
        Index("foreign_labels", foreign_label_index, FOREIGN),
        Index("foreign_repels", foreign_repel_index, FOREIGN),
    ), wakes=("pod_event", "foreign_pod_event")),  # ours: its job's policy; others': every one
    Watched("ResourceQuota", "", "v1", "resourcequotas", (Index("quotas", quota_index),),
            wakes=("quota_event",)),  # and jobs over quota are retried
    Watched("LimitRange", "", "v1", "limitranges",
            (Index("limit_ranges", limit_range_index),), wakes=EVERY_ADMISSION),
    Watched("PriorityClass", "scheduling.k8s.io", "v1", "priorityclasses",
            (Index("priority_classes", priority_class_index),), wakes=EVERY_ADMISSION),
    Watched("RuntimeClass", "node.k8s.io", "v1", "runtimeclasses",
            (Index("runtime_classes", runtime_class_index),), wakes=EVERY_ADMISSION),
    Watched("DeviceClass", *DRA, "deviceclasses",
            (Index("device_classes", device_class_index),), wakes=EVERY_ADMISSION),
    Watched("ResourceSlice", *DRA, "resourceslices",
            (Index("resource_slices", resource_slice_index),), wakes=EVERY_ADMISSION),
    Watched("ResourceClaimTemplate", *DRA, "resourceclaimtemplates",
            (Index("claim_templates", claim_template_index),), wakes=EVERY_ADMISSION),
    Watched("ResourceClaim", *DRA, "resourceclaims",
            (Index("resource_claims", resource_claim_index),),
            wakes=("resource_claim_event",)),  # a claim gone or deallocated: every admission
    Watched("StatefulSet", "apps", "v1", "statefulsets",
            (Index("statefulsets", statefulset_index, OURS),),
            wakes=("statefulset_event",)),  # its job due, its policy's admission when added
    Watched("MLJob", *MLJOBS, (Index("mljobs", mljob_index),), wakes=("mljob_event",)),
    Watched("SchedulingPolicy", *POLICIES, (Index("policies", policy_index),),
            wakes=("policy_event",)),
)

for _kind in WATCHED:
    for _index in _kind.indexes:
        kopf.index(*_kind.resource, labels=_index.labels)(_index.build)

#: Each indexed resource: its API group and version, and the indexes it feeds (relists.py).
INDEXED: dict[str, tuple[str, str, tuple[str, ...]]] = {
    w.plural: (w.group, w.version, tuple(i.id for i in w.indexes)) for w in WATCHED}


def indexes_from(kwargs: Mapping[str, Any]) -> Indexes:
    """kopf's indexes (keyword arguments named after the index functions) as one Indexes."""
    return Indexes.of({i.field: kwargs[i.id] for w in WATCHED for i in w.indexes})

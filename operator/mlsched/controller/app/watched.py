"""The kinds the operator watches and the kopf indexes it keeps of them: each index turns a
watch event's body into its compact record (objects/records.py, job_records.py), `INDEXED`
names every index per resource (relists.py re-reads them after a watch was down), and
`indexes_from` hands them to the rest of the operator as one `Indexes`. A new watched kind:
its index here, its entry in INDEXED and in indexes_from, its handlers in handlers.py."""

from __future__ import annotations

from collections.abc import Mapping
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


def indexes_from(kwargs: dict[str, Any]) -> Indexes:
    return Indexes(nodes=kwargs["node_index"], pods=kwargs["pod_index"],
                   statefulsets=kwargs["statefulset_index"], foreign=kwargs["foreign_pod_index"],
                   mljobs=kwargs["mljob_index"], policies=kwargs["policy_index"],
                   quotas=kwargs["quota_index"], limit_ranges=kwargs["limit_range_index"],
                   runtime_classes=kwargs["runtime_class_index"],
                   priority_classes=kwargs["priority_class_index"],
                   foreign_ports=kwargs["foreign_port_index"],
                   foreign_extended=kwargs["foreign_extended_index"],
                   foreign_labels=kwargs["foreign_label_index"],
                   foreign_repels=kwargs["foreign_repel_index"],
                   device_classes=kwargs["device_class_index"],
                   resource_slices=kwargs["resource_slice_index"],
                   claim_templates=kwargs["claim_template_index"],
                   resource_claims=kwargs["resource_claim_index"])



# ------------------------------------------------------ objects deleted while a watch was down
#: Each indexed resource: its API group and version, and the indexes it feeds (relists.py).
INDEXED: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "nodes": ("", "v1", ("node_index",)),
    "pods": ("", "v1", ("pod_index", "foreign_pod_index", "foreign_port_index",
                        "foreign_extended_index", "foreign_label_index", "foreign_repel_index")),
    "resourcequotas": ("", "v1", ("quota_index",)),
    "limitranges": ("", "v1", ("limit_range_index",)),
    "priorityclasses": ("scheduling.k8s.io", "v1", ("priority_class_index",)),
    "runtimeclasses": ("node.k8s.io", "v1", ("runtime_class_index",)),
    "deviceclasses": (*DRA, ("device_class_index",)),
    "resourceslices": (*DRA, ("resource_slice_index",)),
    "resourceclaimtemplates": (*DRA, ("claim_template_index",)),
    "resourceclaims": (*DRA, ("resource_claim_index",)),
    "statefulsets": ("apps", "v1", ("statefulset_index",)),
    "mljobs": (*MLJOBS[:2], ("mljob_index",)),
    "schedulingpolicies": (*POLICIES[:2], ("policy_index",)),
}



NOT_INDEXED: Mapping[str, Any] = MappingProxyType({})


@kopf.index("nodes")
def node_index(name: str, body: kopf.Body, **_: Any):
    return {name: node_record(body)}


@kopf.index("pods", labels={JOB_LABEL: kopf.PRESENT})
def pod_index(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any):
    record = pod_record(body)
    return {(namespace, labels[JOB_LABEL]): record} if record else NOT_INDEXED


@kopf.index("pods", labels={JOB_LABEL: kopf.ABSENT})
def foreign_pod_index(spec: kopf.Spec, body: kopf.Body, **_: Any):
    """Requests of other schedulers' pods per node: capacity our jobs cannot have."""
    node = _bound_to(spec, body)
    return {node: pod_requests(spec)} if node else NOT_INDEXED


def _bound_to(spec: kopf.Spec, body: kopf.Body) -> str | None:
    """The node a pod is bound to, while it holds it (not Succeeded or Failed)."""
    node = spec.get("nodeName")
    return node if node and is_active_pod(body) else None


@kopf.index("pods", labels={JOB_LABEL: kopf.ABSENT})
def foreign_port_index(spec: kopf.Spec, body: kopf.Body, **_: Any):
    """Host ports of other schedulers' pods per node, for those holding any (host_ports.py):
    a node where one holds 29500 takes no task that needs it."""
    node = _bound_to(spec, body)
    ports = host_ports(spec) if node else None
    return {node: ports} if ports else NOT_INDEXED


@kopf.index("pods", labels={JOB_LABEL: kopf.ABSENT})
def foreign_extended_index(spec: kopf.Spec, body: kopf.Body, **_: Any):
    """Extended resources of other schedulers' pods per node, for those requesting any
    (counted_resources.py): a node whose two RDMA NICs another pod holds takes no task
    that needs one."""
    node = _bound_to(spec, body)
    extended = extended_requests(spec) if node else None
    return {node: extended} if extended else NOT_INDEXED


@kopf.index("pods", labels={JOB_LABEL: kopf.ABSENT})
def foreign_label_index(namespace: str, spec: kopf.Spec, labels: kopf.Labels, body: kopf.Body,
                        **_: Any):
    """Node and labels of other schedulers' pods per namespace, for those with labels: a
    job's required anti-affinity keeps its pods off nodes where a matching pod of its
    namespace runs (cluster_state.held_selected)."""
    node = _bound_to(spec, body) if labels else None
    return {namespace: (node, dict(labels))} if node else NOT_INDEXED


@kopf.index("pods", labels={JOB_LABEL: kopf.ABSENT})
def foreign_repel_index(namespace: str, spec: kopf.Spec, body: kopf.Body, **_: Any):
    """Node and required anti-affinity selectors (per node) of other schedulers' pods per
    namespace, for those carrying any: a job pod matching one is kept off that node
    (pod_anti_affinity.py)."""
    node = _bound_to(spec, body)
    selectors = node_selectors(spec) if node else ()
    return {namespace: (node, selectors)} if selectors else NOT_INDEXED


@kopf.index("resourcequotas")
def quota_index(namespace: str, body: kopf.Body, **_: Any):
    """Each namespace's ResourceQuotas: what its rounds may book (quotas.py)."""
    record = quota_record(body)
    return {namespace: record} if record else NOT_INDEXED


@kopf.index("limitranges")
def limit_range_index(namespace: str, body: kopf.Body, **_: Any):
    """Each namespace's LimitRanges: the requests its pods will be given (limitranges.py)."""
    record = limit_range_record(body)
    return {namespace: record} if record else NOT_INDEXED


@kopf.index("scheduling.k8s.io", "v1", "priorityclasses")
def priority_class_index(name: str, body: kopf.Body, **_: Any):
    """The globalDefault PriorityClass: the class of pods whose template names none, which
    PriorityClass-scoped ResourceQuotas count (quotas.py)."""
    return global_default_entry(name, body) or NOT_INDEXED


@kopf.index("node.k8s.io", "v1", "runtimeclasses")
def runtime_class_index(name: str, body: kopf.Body, **_: Any):
    """RuntimeClasses by name: what the pods of a template naming one will be."""
    return {name: runtime_class_record(body)}


# Dynamic Resource Allocation (dra.py). On a cluster without resource.k8s.io/v1 (before
# Kubernetes 1.34) kopf logs that these are not served and the rest runs as before.
@kopf.index(*DRA, "deviceclasses")
def device_class_index(name: str, body: kopf.Body, **_: Any):
    """DeviceClasses by name: which devices a claim of the class can be given."""
    return {name: dra.device_class_record(body)}


@kopf.index(*DRA, "resourceslices")
def resource_slice_index(name: str, body: kopf.Body, **_: Any):
    """Node-local ResourceSlices by name: the devices each node has."""
    record = dra.resource_slice_record(body)
    return {name: record} if record.node else NOT_INDEXED


@kopf.index(*DRA, "resourceclaimtemplates")
def claim_template_index(namespace: str, body: kopf.Body, **_: Any):
    """Each namespace's ResourceClaimTemplates: the devices each pod naming one claims."""
    return {namespace: dra.claim_template_record(body)}


@kopf.index(*DRA, "resourceclaims")
def resource_claim_index(namespace: str, body: kopf.Body, **_: Any):
    """Allocated ResourceClaims by namespace: the devices in use."""
    record = dra.resource_claim_record(body)
    return {namespace: record} if record else NOT_INDEXED


@kopf.index("apps", "v1", "statefulsets", labels={JOB_LABEL: kopf.PRESENT})
def statefulset_index(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any):
    return {(namespace, labels[JOB_LABEL]): sts_record(body)}


@kopf.index(*MLJOBS)
def mljob_index(namespace: str, name: str, body: kopf.Body, **_: Any):
    return {(namespace, name): job_record(body)}


@kopf.index(*POLICIES)
def policy_index(namespace: str, name: str, spec: kopf.Spec, **_: Any):
    """The policies there are, with each one's fair-sharing weight (fair_share.py), which
    every other policy's steps read."""
    return {(namespace, name): fair_share.weight_of(spec)}


# ---------------------------------------------------------------------- scheduling loop

"""The cluster as the indexes show it (`ClusterState`), and what is held in it outside the
jobs a step decides: other pods' and other policies' tasks, their host ports, labels
(for anti-affinity and spreads) and counted resources. Pure."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


from mlsched.controller.admission.counted_resources import POD_SLOTS, Counted, extended_of
from mlsched.controller.objects.desired import roles_of
from mlsched.controller.constraints.host_ports import HostPort
from mlsched.controller.constraints.label_selector import Selector
from mlsched.controller.constraints.pod_anti_affinity import token
from mlsched.controller.constraints.node_constraints import Taint
from mlsched.controller.objects.records import NodeRecord, PodRecord, StsRecord
from mlsched.controller.objects.job_records import JobRecord
from mlsched.controller.objects.quantities import NO_RESOURCES, Resources, add

JobKey = tuple[str, str]  # (namespace, name)


@dataclass
class ClusterState:
    """The indexes, as plain mappings (a kopf.Index is one; tests pass dicts of lists)."""

    nodes: Iterable[NodeRecord]
    pods: Mapping[JobKey, Iterable[PodRecord]] = field(default_factory=dict)
    statefulsets: Mapping[JobKey, Iterable[StsRecord]] = field(default_factory=dict)
    foreign: Mapping[str, Iterable[Resources]] = field(default_factory=dict)  # node → requests
    # node → the host ports of each such pod that holds any (host_ports.py)
    foreign_ports: Mapping[str, Iterable[frozenset[HostPort]]] = field(default_factory=dict)
    # node → the extended resources of each such pod that requests any (counted_resources.py)
    foreign_extended: Mapping[str, Iterable[Counted]] = field(default_factory=dict)
    # namespace → (node, labels) of each such pod with labels (pod_anti_affinity.py)
    foreign_labels: Mapping[str, Iterable[tuple[str, Mapping[str, str]]]] = field(default_factory=dict)
    # namespace → (node, required anti-affinity selectors) of each such pod carrying any: the
    # pods it keeps off its node (pod_anti_affinity.node_selectors)
    foreign_repels: Mapping[str, Iterable[tuple[str, tuple[Selector, ...]]]] = field(default_factory=dict)
    # Pods of an earlier job of the same name, still going: nobody's to re-decide, but they
    # occupy their nodes until they are gone.
    strays: Iterable[PodRecord] = ()
    # (namespace, pod, node, devices per class, GPUs) of each allocated ResourceClaim (dra.claimed)
    device_claims: Iterable[tuple[str, str | None, str, Counted, float]] = ()


def usable(node: NodeRecord, node_selector: Mapping[str, str]) -> bool:
    """Ready, not cordoned, and one of the nodes the operator places on (MLSCHED_NODE_SELECTOR)."""
    if not node.ready or node.unschedulable:
        return False
    return all(key in node.labels and (not value or node.labels[key] == value)
               for key, value in node_selector.items())


def untolerated(node: NodeRecord, tolerated_taints: frozenset[str]) -> tuple[Taint, ...]:
    """The node's taints that the operator does not tolerate for every pod: a pod's template
    must tolerate each of them itself (node_constraints.py)."""
    return tuple(t for t in node.taint_specs if t[0] not in tolerated_taints)


def held_elsewhere(cluster: ClusterState, own_jobs: set[JobKey],
                   reserved: Mapping[JobKey, Mapping[str, Resources]]) -> dict[str, Resources]:
    """Per node: resources this policy may not use (see the module docstring)."""
    held: dict[str, Resources] = {}
    for node, requests in cluster.foreign.items():
        for r in requests:
            held[node] = add(held.get(node, NO_RESOURCES), r)
    for key, usage in reserved.items():
        if key not in own_jobs:
            for node, r in usage.items():
                held[node] = add(held.get(node, NO_RESOURCES), r)
    others = [pod for key, pods in cluster.pods.items()
              if key not in own_jobs and key not in reserved for pod in pods]
    for pod in [*others, *cluster.strays]:
        if pod.node and pod.phase not in ("Succeeded", "Failed"):
            held[pod.node] = add(held.get(pod.node, NO_RESOURCES), pod.requests)
    # GPUs claimed through DRA (dra.GPU_CLASSES) are in no pod's requests: those of every pod
    # but the ones booked by their job's demand (the round's own, other policies' reserved).
    if cluster.device_claims:
        booked = pods_of(cluster, [*own_jobs, *reserved])
        for namespace, pod_name, node, _, gpus in cluster.device_claims:
            if gpus and (namespace, pod_name) not in booked:
                held[node] = add(held.get(node, NO_RESOURCES), (0.0, gpus, 0.0))
    return held


def pods_of(cluster: ClusterState, keys: Iterable[JobKey]) -> set[tuple[str, str]]:
    """(namespace, name) of the pods of the jobs `keys`."""
    return {(key[0], p.name) for key in keys for p in cluster.pods.get(key, ())}


#: Other policies' jobs and the nodes their latest step decided for each role's tasks (pods
#: that may not exist yet): JobKey -> (its record, role -> node of each ordinal).
Decided = Mapping[JobKey, tuple[JobRecord, Mapping[str, tuple[str, ...]]]]


def other_tasks(cluster: ClusterState, own_jobs: set[JobKey], decided: Decided | None = None
                ) -> Iterable[tuple[str, str, int, JobRecord | None, PodRecord | None]]:
    """(node, role, how many, job, pod) for the tasks this policy does not re-decide: pods of
    other jobs and strays, and, for the jobs in `decided`, the tasks their policy decided, so
    that what two policies decide one after the other never meets on a node before the first
    one's pods exist. Per node and role, the larger of the decided tasks and the pods there
    (a pod being moved holds its old node until it is gone)."""
    decided = decided or {}
    for key, pods in cluster.pods.items():
        if key in own_jobs or key in decided:  # decided jobs' pods: below
            continue
        for pod in pods:
            if pod.node and pod.phase not in ("Succeeded", "Failed"):
                yield pod.node, pod.role, 1, None, pod  # type: ignore[misc]
    for key, (job, nodes_of) in decided.items():
        if key in own_jobs:
            continue
        counts = Counter((node, role) for role, nodes in nodes_of.items() for node in nodes)
        pods = Counter((p.node, p.role) for p in cluster.pods.get(key, ())
                       if p.node and p.phase not in ("Succeeded", "Failed"))
        for (node, role), n in (counts | pods).items():  # the larger of the two
            yield node, role, n, job, None
    for pod in cluster.strays:
        if pod.node and pod.phase not in ("Succeeded", "Failed"):
            yield pod.node, pod.role, 1, None, pod


def held_ports(cluster: ClusterState, own_jobs: set[JobKey],
               decided: Decided | None = None) -> dict[str, set[HostPort]]:
    """Per node: the host ports held there by pods this policy does not re-decide (other
    workloads', other jobs', strays) and by the tasks other policies decided (`decided`:
    other_tasks)."""
    held: dict[str, set[HostPort]] = {}
    for node, port_sets in cluster.foreign_ports.items():
        for ports in port_sets:
            held.setdefault(node, set()).update(ports)
    for node, role, _, job, pod in other_tasks(cluster, own_jobs, decided):
        ports = pod.host_ports if pod is not None else job.host_ports.get(role)  # type: ignore[union-attr]
        if ports:
            held.setdefault(node, set()).update(ports)
    return held


def held_labelled(cluster: ClusterState, own_jobs: set[JobKey], namespace: str,
                  decided: Decided | None = None) -> list[tuple[str, Mapping[str, str], int]]:
    """(node, labels, how many) of the pods of `namespace` this policy does not re-decide
    (other workloads', other jobs' and their decided tasks): what kube-scheduler matches a
    pod's anti-affinity and topology spread selectors against (terms naming no namespace
    look in the pod's own). Strays, pods of an earlier job of a name, are left out: they are
    on their way out."""
    out: list[tuple[str, Mapping[str, str], int]] = [
        (node, labels, 1) for node, labels in cluster.foreign_labels.get(namespace, ())]
    decided_here = {k: v for k, v in (decided or {}).items() if k[0] == namespace}
    pods_here = {k: v for k, v in cluster.pods.items() if k[0] == namespace}
    for node, role, n, job, pod in other_tasks(ClusterState(nodes=(), pods=pods_here), own_jobs,
                                               decided_here):
        out.append((node, pod.labels if pod is not None else job.pod_labels(role), n))  # type: ignore[union-attr]
    return out


def held_selected(labelled: Iterable[tuple[str, Mapping[str, str], int]],
                  selectors: Iterable[Selector]) -> dict[str, set]:
    """Per node: the anti-affinity tokens (pod_anti_affinity.token) held there by the pods
    `labelled` (held_labelled) whose labels match one of `selectors`: kube-scheduler keeps a
    pod whose required anti-affinity names no namespace off nodes where such a pod runs."""
    selectors = tuple(selectors)
    held: dict[str, set] = {}
    for node, labels, _ in labelled if selectors else ():
        for s in selectors:
            if s.matches(labels):
                held.setdefault(node, set()).add(token(s))
    return held


def held_counted(cluster: ClusterState, own_jobs: set[JobKey],
                 decided: Decided | None = None) -> dict[str, dict[str, float]]:
    """Per node: the pods this policy does not re-decide (other workloads', other jobs',
    strays) and the tasks other policies decided (`decided`: other_tasks), and the extended
    resources they request: what counted_resources.py counts."""
    held: dict[str, dict[str, float]] = {}

    def count(node: str, taken: Counted, times: int = 1, slots: int = 0) -> None:
        """`taken` held `times` over on `node`, and `slots` of its pod slots."""
        on = held.setdefault(node, {})
        if slots:
            on[POD_SLOTS] = on.get(POD_SLOTS, 0.0) + slots
        for name, amount in taken:
            on[name] = on.get(name, 0.0) + amount * times

    for node, requests in cluster.foreign.items():
        count(node, (), slots=sum(1 for _ in requests))
    for node, found in cluster.foreign_extended.items():
        for extended in found:
            count(node, extended)  # their slots: cluster.foreign, above
    for node, role, n, job, pod in other_tasks(cluster, own_jobs, decided):
        count(node, pod.extended if pod is not None else extended_of(job, role), n, n)  # type: ignore[arg-type]
    # DRA devices are in no pod's requests but in its claims: those of every pod but the ones
    # the round books afresh (its own jobs') and the tasks of `decided`, counted above by
    # their templates (extended_of: dra.with_devices).
    if cluster.device_claims:
        booked = pods_of(cluster, [*own_jobs, *(decided or {})])
        for namespace, pod, node, devices, _ in cluster.device_claims:
            if (namespace, pod) not in booked:
                count(node, devices)
    return held


def exclusive_of(job: JobRecord, selectors: Iterable[Selector]) -> dict[str, frozenset]:
    """Per role, what one task holds on its node alone (JobView.exclusive): its host ports,
    and a token for each spreading selector its pods match (pod_anti_affinity.py), whichever
    job's template carries it. Roles holding nothing are left out."""
    selectors = tuple(selectors)
    if not job.host_ports and not selectors:
        return {}
    out = {}
    for role in roles_of(job):
        labels = job.pod_labels(role)
        held = set(job.host_ports.get(role, ()))
        held.update(token(s) for s in selectors if s.matches(labels))
        if held:
            out[role] = frozenset(held)
    return out


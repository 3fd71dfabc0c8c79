"""Index records → `cluster.Snapshot`: what one SchedulingPolicy's round sees. Pure.

Capacity is node allocatable minus what this policy must not hand out: pods of other schedulers,
pods of mlsched jobs that are not this policy's to re-decide, and what other policies reserved in
their latest round (their pods may not exist yet). The policy's own jobs are left out of that
sum because the round re-decides every one of their tasks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from mlsched.cluster.types import JobView, Snapshot, SpeedObservation, Spread
from mlsched.workloads.speed_curve import prior_curve
from mlsched.controller.admission.counted_resources import (
    POD_SLOTS, Counted, CountedResources, available, extended_of, pods_room,
)
from mlsched.controller.admission.counted_resources import describe as describe_counted
from mlsched.controller.admission.counted_resources import source as counted_source
from mlsched.controller.objects.desired import roles_of
from mlsched.controller.constraints.host_ports import HostPort
from mlsched.controller.constraints.label_selector import Selector
from mlsched.controller.constraints.pod_anti_affinity import describe_exclusive, token
from mlsched.controller.admission.quotas import Budget
from mlsched.controller.admission.quotas import charges as quota_charges, kept_charges
from mlsched.controller.constraints.topology_spread import SpreadConstraint
from mlsched.controller.constraints.node_constraints import EVERY_NODE, NodeConstraint, Taint
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


class Spreads:
    """The topology spread constraints of a round's jobs (topology_spread.py) as the ledger
    enforces them (cluster.types.Spread): each node's domain per topology key, one Spread per
    distinct constraint and node filter (jobs from one template share it), and which roles
    count toward which constraint (their pods match its selector, whoever carries it)."""

    def __init__(self, jobs: list[JobRecord], nodes: list[NodeRecord]):
        self.constraints = list(dict.fromkeys(
            c for j in jobs for found in j.spread_constraints.values() for c in found))
        self.topology: dict[str, np.ndarray] = {}
        self.domains: dict[str, dict[str, int]] = {}  # per key, each value's domain index
        for key in dict.fromkeys(c.topology_key for c in self.constraints):
            values = self.domains[key] = {}
            self.topology[key] = np.array([values.setdefault(n.labels[key], len(values))
                                           if key in n.labels else -1 for n in nodes], dtype=np.int64)
        self._made: dict[tuple, Spread] = {}

    def held(self, labelled: Iterable[tuple[str, Mapping[str, str], int]],
             node_labels: Mapping[str, Mapping[str, str]]) -> dict[tuple, np.ndarray]:
        """Per constraint's token (Spread.token), the pods `labelled` (held_labelled) that
        match its selector, counted in the domain of their node (`node_labels`: every node's,
        cordoned ones too: kube-scheduler counts the pods there); domains of no node the round
        places on are left out."""
        out: dict[tuple, np.ndarray] = {}
        labelled = list(labelled)
        for c in self.constraints:
            values = self.domains[c.topology_key]
            counts = np.zeros(len(values), dtype=np.int32)
            for node, labels, n in labelled:
                domain = values.get((node_labels.get(node) or {}).get(c.topology_key))
                if domain is not None and c.selector.matches(labels):
                    counts[domain] += n
            if counts.any():
                out[(c.selector, c.topology_key)] = counts
        return out

    def checks(self, job: JobRecord, node_filters: Mapping[str, np.ndarray] | None
               ) -> dict[str, tuple[Spread, ...]]:
        out = {}
        for role, found in job.spread_constraints.items():
            allowed = (node_filters or {}).get(role)
            out[role] = tuple(self._spread(c, allowed if c.honor_affinity else None) for c in found)
        return out

    def counted(self, job: JobRecord) -> dict[str, frozenset]:
        out = {}
        for role in roles_of(job):
            labels = job.pod_labels(role)
            tokens = frozenset(((c.selector, c.topology_key), c.topology_key)
                               for c in self.constraints if c.selector.matches(labels))
            if tokens:
                out[role] = tokens
        return out

    def _spread(self, c: SpreadConstraint, allowed: np.ndarray | None) -> Spread:
        key = (c, None if allowed is None else id(allowed))
        found = self._made.get(key)
        if found is None:
            domains = self.topology[c.topology_key]
            nodes = domains >= 0 if allowed is None else (domains >= 0) & allowed
            eligible = np.zeros(int(domains.max(initial=-1)) + 1, dtype=bool)
            eligible[domains[nodes]] = True
            found = self._made[key] = Spread((c.selector, c.topology_key), c.topology_key,
                                             c.max_skew, eligible, c.min_domains)
        return found


def _placed_prefix(pods: list[PodRecord], count: int, node_index: Mapping[str, int]) -> tuple[int, ...]:
    """Node indexes of ordinals 0, 1, ... up to the first ordinal without a usable node.

    The Packer sends ordinal k back to the k-th entry when it still fits, which is how a job
    whose allocation does not change keeps every pod where it is.
    """
    by_ordinal = {p.ordinal: p for p in pods if not p.deleting}
    out = []
    for k in range(count):
        pod = by_ordinal.get(k)
        if pod is None or pod.node not in node_index:
            break
        out.append(node_index[pod.node])
    return tuple(out)


class RecordedSpeeds(Sequence[SpeedObservation]):
    """A job's recorded (ps, workers, epochs) intervals seen as SpeedObservations, each made
    when asked for: a round of 10,000 jobs with full histories would build 240,000 of them,
    and a learned policy reads only the latest few of each (speed_fit.RECENT)."""

    __slots__ = ("_trained", "_interval_s")

    def __init__(self, trained: tuple[tuple[int, int, float], ...], interval_s: float):
        self._trained, self._interval_s = trained, interval_s

    def __len__(self) -> int:
        return len(self._trained)

    def __iter__(self):
        interval_s = self._interval_s
        return (SpeedObservation(ps, w, epochs / interval_s) for ps, w, epochs in self._trained)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(SpeedObservation(ps, w, epochs / self._interval_s)
                         for ps, w, epochs in self._trained[i])
        ps, w, epochs = self._trained[i]
        return SpeedObservation(ps, w, epochs / self._interval_s)

    def latest(self, n: int) -> list[tuple[int, int, float]]:
        """The latest `n` as plain (ps, workers, epochs_per_s) tuples: what the speed
        correction reads of every job each round (speed_fit.recent), without the NamedTuples."""
        interval_s = self._interval_s
        return [(ps, w, epochs / interval_s) for ps, w, epochs in self._trained[-n:]]

    def __eq__(self, other) -> bool:
        return tuple(self) == tuple(other) if isinstance(other, Sequence) else NotImplemented

    __hash__ = None  # as a list: equal to a tuple of the same observations


def observations(trained: tuple[tuple[int, int, float], ...],
                 interval_s: float) -> Sequence[SpeedObservation]:
    """Speeds the job really showed, one per recent interval in which it trained."""
    if interval_s <= 0 or not trained:
        return ()
    return RecordedSpeeds(trained, interval_s)


def job_view(job: JobRecord, pods: Iterable[PodRecord], statefulsets: Iterable[StsRecord],
             node_index: Mapping[str, int], interval_s: float,
             node_filters: dict[str, np.ndarray] | None = None,
             budget: Budget | None = None, selectors: Iterable[Selector] = (),
             spreads: Spreads | None = None,
             counted: Mapping[str, Counted] | None = None) -> JobView:
    """`budget`: what the ResourceQuotas bounding the step leave (not None), against which it
    then books each task's quota charge (quotas.charges); left out otherwise: 20,000 small
    arrays cost a 10,000-job round 20 ms.
    `selectors`: the spreading anti-affinity selectors of every job decided with it;
    `spreads`: the round's topology spread constraints (Spreads); `counted`: per role, what
    one task takes of the counted resources (counted_resources.py)."""
    replicas = {s.role: s.replicas for s in statefulsets}
    by_role: dict[str, list[PodRecord]] = {"ps": [], "worker": []}
    for p in pods:
        by_role.setdefault(p.role, []).append(p)
    ps = replicas.get("ps", 0) if job.arch == "ps" else 0
    workers = replicas.get("worker", 0)
    min_ps, max_ps = job.bounds("ps")
    return JobView(
        name=job.name, model=job.model, arch=job.arch, arrival_s=job.created_s,
        total_epochs=job.epochs, epochs_done=job.epochs_done,
        slots_run=job.slots_run,
        ps=ps, workers=workers,
        ps_nodes=_placed_prefix(by_role["ps"], ps, node_index),
        worker_nodes=_placed_prefix(by_role["worker"], workers, node_index),
        min_ps=min_ps, max_ps=max_ps, min_workers=job.min_workers, max_workers=job.max_workers,
        requested_ps=max_ps if job.arch == "ps" else None, requested_workers=job.max_workers,
        observations=observations(job.trained, interval_s),
        ps_demand=np.array(job.demands.get("ps", (0.0, 0.0, 0.0)), dtype=float),
        worker_demand=np.array(job.demands.get("worker", (0.0, 0.0, 0.0)), dtype=float),
        prior=prior_curve(job.model, job.arch, job.declared_epochs_per_hour),
        node_filters=node_filters or {},
        exclusive=exclusive_of(job, selectors),
        spreads=spreads.checks(job, node_filters) if spreads else {},
        spread_counts=spreads.counted(job) if spreads else {},
        counted=dict(counted) if counted else {},
        quota_charges=quota_charges(job, budget) if budget is not None else {},
        kept_charges=kept_charges(job, [p for found in by_role.values() for p in found], budget)
        if budget is not None else {},
    )


class NodeFilters:
    """Each distinct template constraint evaluated once over a snapshot's nodes: jobs with the
    same constraint share the array (the ledger and DL²'s state key their checks on it). A
    constraint that allows every node gives no filter, so jobs whose templates constrain
    nothing cost nothing; where the snapshot holds nodes with taints some job tolerates,
    every role that does not tolerate them gets a filter keeping it off them."""

    def __init__(self, nodes: list[NodeRecord], tolerated_taints: frozenset[str]):
        self.nodes = nodes
        self.taints = [untolerated(n, tolerated_taints) for n in nodes]
        self.any_tainted = any(self.taints)
        self._masks: dict[NodeConstraint, np.ndarray | None] = {}

    def mask(self, constraint: NodeConstraint) -> np.ndarray | None:
        if constraint not in self._masks:
            mask = np.fromiter((constraint.allows(n.name, n.labels, t, n.extended)
                                for n, t in zip(self.nodes, self.taints)),
                               dtype=bool, count=len(self.nodes))
            self._masks[constraint] = None if mask.all() else mask
        return self._masks[constraint]

    def of(self, job: JobRecord) -> dict[str, np.ndarray] | None:
        if not job.node_constraints and not self.any_tainted:
            return None
        out = {}
        for role in roles_of(job):
            constraint = job.node_constraints.get(role) or EVERY_NODE
            mask = self.mask(constraint) if constraint is not EVERY_NODE or self.any_tainted \
                else None
            if mask is not None:
                out[role] = mask
        return out or None


def with_repelled(filters: dict[str, np.ndarray] | None, job: JobRecord,
                  repelled: list[tuple[int, tuple[Selector, ...]]], n_nodes: int
                  ) -> dict[str, np.ndarray] | None:
    """The job's node filters, less for each role the nodes (by index) where a pod the round
    does not re-decide carries a required anti-affinity term its pods match: kube-scheduler
    refuses a pod beside one whose term repels it (pod_anti_affinity.py)."""
    out = dict(filters or {})
    for role in roles_of(job):
        labels = job.pod_labels(role)
        off = [i for i, selectors in repelled if any(s.matches(labels) for s in selectors)]
        if off:
            mask = out[role].copy() if role in out else np.ones(n_nodes, dtype=bool)
            mask[off] = False
            out[role] = mask
    return out or None


def build_snapshot(jobs: Iterable[JobRecord], cluster: ClusterState, *, now_s: float,
                   interval_s: float, held: Mapping[str, Resources] | None = None,
                   node_selector: Mapping[str, str] | None = None,
                   tolerated_taints: frozenset[str] = frozenset(),
                   budget: Budget | None = None,
                   ports: Mapping[str, Iterable[HostPort]] | None = None,
                   counted_used: Mapping[str, Mapping[str, float]] | None = None,
                   selected: Mapping[str, Iterable] | None = None,
                   repelled: Iterable[tuple[str, tuple[Selector, ...]]] | None = None,
                   labelled: Iterable[tuple[str, Mapping[str, str], int]] | None = None) -> Snapshot:
    """The snapshot one policy decides on. `jobs` are its schedulable jobs; job names are
    unique within a snapshot because a policy only schedules jobs of its own namespace.
    `ports`: per node, the host ports held there already (held_ports); `counted_used`: the
    pod slots and extended resources held there already (held_counted); `selected`: the
    anti-affinity tokens held there already by pods the round does not re-decide
    (held_selected; the jobs decided together hold theirs through JobView.exclusive);
    `repelled`: (node, selectors) of pods the round does not re-decide whose required
    anti-affinity keeps matching pods off their node (with_repelled); `labelled`: the pods of
    the namespace the round does not re-decide (held_labelled), which the jobs' topology
    spread constraints count (Spreads.held)."""
    jobs = sorted(jobs, key=lambda j: (j.created_s, j.name))
    # Nodes with a taint the operator does not tolerate are planned on only for the roles
    # whose templates tolerate it (NodeFilters), so only when some job's template might.
    tolerating = {c for j in jobs for c in j.node_constraints.values() if c.tolerations}
    nodes = sorted((n for n in cluster.nodes if usable(n, node_selector or {})
                    and (not (t := untolerated(n, tolerated_taints))
                         or any(c.allows(n.name, n.labels, t, n.extended) for c in tolerating))),
                   key=lambda n: n.name)
    node_index = {n.name: i for i, n in enumerate(nodes)}
    capacity = np.array([n.allocatable for n in nodes], dtype=np.float64).reshape(len(nodes), 3)
    for name, r in (held or {}).items():
        i = node_index.get(name)
        if i is not None:
            capacity[i] -= r
    np.maximum(capacity, 0.0, out=capacity)
    counted = CountedResources(jobs, nodes, capacity, counted_used)
    filters = NodeFilters(nodes, tolerated_taints)
    selectors = list(dict.fromkeys(s for j in jobs for found in j.anti_affinity.values() for s in found))
    spreads = Spreads(jobs, nodes) if any(j.spread_constraints for j in jobs) else None
    repelled = [(node_index[n], s) for n, s in repelled or () if n in node_index]
    views = [job_view(j, cluster.pods.get(j.key, ()), cluster.statefulsets.get(j.key, ()),
                      node_index, interval_s,
                      with_repelled(filters.of(j), j, repelled, len(nodes)) if repelled
                      else filters.of(j),
                      budget, selectors, spreads, counted.takes.get(j.key))
             for j in jobs]
    pools = [n.pool for n in nodes]
    in_use = [frozenset((*(ports or {}).get(n.name, ()), *(selected or {}).get(n.name, ())))
              for n in nodes] if ports or selected else None
    return Snapshot(time_s=now_s, interval_s=interval_s, node_names=[n.name for n in nodes],
                    capacity=capacity, jobs=views,
                    node_pools=pools if any(p is not None for p in pools) else None,
                    budget=budget.amounts if budget is not None else None, exclusive_in_use=in_use,
                    topology=spreads.topology if spreads else {}, counted_free=counted.free,
                    spread_held=spreads.held(labelled, {n.name: n.labels for n in cluster.nodes})
                    if spreads and labelled else {})


def _describe(r: Resources) -> str:
    cpu, gpu, mem = r
    return f"{cpu:g} CPU, {gpu:g} GPU, {mem:g} GiB"


@dataclass(frozen=True)
class ClusterFit:
    """The nodes the operator places on, once per change of the node index, to tell jobs that
    can never fit. `taints`: per node, what a template must tolerate itself."""

    nodes: tuple[NodeRecord, ...]
    taints: Mapping[str, tuple[Taint, ...]]

    @classmethod
    def of(cls, nodes: Iterable[NodeRecord], *, node_selector: Mapping[str, str] | None = None,
           tolerated_taints: frozenset[str] = frozenset()) -> ClusterFit:
        usable_nodes = tuple(n for n in nodes if usable(n, node_selector or {}))
        return cls(usable_nodes, {n.name: untolerated(n, tolerated_taints) for n in usable_nodes})

    @cached_property
    def _fewest_slots(self) -> float:
        return min((n.pods for n in self.nodes), default=0.0)

    @cached_property
    def _by_name(self) -> dict[str, NodeRecord]:
        return {n.name: n for n in self.nodes}

    # What the node scans below give depends only on a role's template (its constraint) and
    # demand, which the jobs of a burst and of a sweep share: each is made once per instance
    # (rebuilt when the nodes change), not once per job (500 nodes scanned twice per new job
    # were a tenth of the operator's event loop in a burst of 200, bench_e2e).
    @cached_property
    def _scans(self) -> dict[tuple, Any]:
        return {}

    def _allowed(self, constraint: NodeConstraint) -> list[NodeRecord]:
        key = ("allowed", constraint)
        found = self._scans.get(key)
        if found is None:
            found = self._scans[key] = [
                n for n in self.nodes
                if constraint.allows(n.name, n.labels, self.taints[n.name], n.extended)]
        return found

    def _fitting(self, constraint: NodeConstraint, demand: Resources) -> frozenset[str]:
        """The allowed nodes that can hold one pod of `demand`."""
        key = ("fitting", constraint, demand)
        found = self._scans.get(key)
        if found is None:
            found = self._scans[key] = frozenset(
                n.name for n in self._allowed(constraint)
                if all(d <= a for d, a in zip(demand, n.allocatable)))
        return found

    def _room(self, constraints: frozenset[NodeConstraint]) -> tuple[dict[str, NodeRecord], Resources]:
        """The nodes any of `constraints` allows, and their allocatable summed."""
        key = ("room", constraints)
        found = self._scans.get(key)
        if found is None:
            nodes = {n.name: n for c in constraints for n in self._allowed(c)}
            total = NO_RESOURCES
            for n in nodes.values():
                total = add(total, n.allocatable)
            found = self._scans[key] = (nodes, total)
        return found

    def why_not(self, job: JobRecord) -> str | None:
        """Why the job's minimum (`min` of every role, admitted together) cannot run even on
        an empty cluster; None when it can. A job that only waits for others to finish is
        never told this (Kueue's "inadmissible" as against "pending")."""
        roles = [("ps", job.bounds("ps")[0])] if job.arch == "ps" else []
        roles.append(("worker", job.min_workers))
        constraints: set[NodeConstraint] = set()
        fitting: dict[str, frozenset[str]] = {}  # per role, the nodes that can hold one of its pods
        for role, count in roles:
            demand = tuple(job.demands.get(role, NO_RESOURCES))
            constraint = job.node_constraints.get(role)
            nodes = self._allowed(constraint or EVERY_NODE)
            constraints.add(constraint or EVERY_NODE)
            where = (f"the cluster's {len(nodes)} schedulable nodes" if constraint is None
                     else f"the {len(nodes)} schedulable nodes its template allows ({constraint})")
            if constraint is not None and not nodes:
                return (f"no schedulable node matches the {role} template's {constraint} "
                        f"(of the cluster's {len(self.nodes)} schedulable nodes)")
            fitting[role] = self._fitting(constraint or EVERY_NODE, demand)
            if not fitting[role]:
                return (f"one {role} asks for {_describe(demand)} and none of {where} has that "
                        f"much allocatable")
            if constraint is not None and count:
                room = self._room(frozenset((constraint,)))[1]
                role_need = tuple(count * d for d in demand)
                if any(x > h for x, h in zip(role_need, room)):
                    return (f"its minimum of {count} {role} needs {_describe(role_need)}; "
                            f"{where} have {_describe(room)} allocatable in all")
        need = job.minimum_requests()
        allowed_any, total = self._room(frozenset(constraints))
        if any(n > h for n, h in zip(need, total)):
            wanted = " and ".join(f"{count} {role}" for role, count in roles)
            return (f"its minimum ({wanted}) needs {_describe(need)}; the cluster's "
                    f"{len(allowed_any)} schedulable nodes have {_describe(total)} "
                    f"allocatable in all")
        return (self._exclusive_why_not(job, roles, fitting)
                or self._counted_why_not(job, roles, fitting, allowed_any))

    def _counted_why_not(self, job: JobRecord, roles: list[tuple[str, int]],
                         fitting: Mapping[str, set[str]],
                         allowed_any: Mapping[str, NodeRecord]) -> str | None:
        """A minimum needing more pod slots, or more of an extended resource, than the nodes
        that could take its pods have allocatable (counted_resources.py). Pod slots are summed
        only when the fewest any node has could be too few (a sweep asks this of every job)."""
        for role, count in roles:
            counted = extended_of(job, role)
            if count > len(fitting[role]) * self._fewest_slots:
                counted += ((POD_SLOTS, 1.0),)
            nodes = [self._by_name[name] for name in fitting[role]] if counted else []
            for name, amount in counted:
                room = sum(pods_room(available(n, name), amount) for n in nodes)
                if count > room:
                    what = ("pods" if name == POD_SLOTS
                            else f"pods taking {describe_counted(name, amount)} each")
                    return (f"its minimum of {count} {role} needs {count} {what}; the "
                            f"{len(nodes)} schedulable nodes that can take one have room for "
                            f"{room:g} ({counted_source(name)})")
        total = sum(count for _, count in roles)
        if total > len(allowed_any) * self._fewest_slots and \
                total > (slots := sum(n.pods for n in allowed_any.values())):
            wanted = " and ".join(f"{count} {role}" for role, count in roles)
            return (f"its minimum ({wanted}) needs {total} pods; the cluster's "
                    f"{len(allowed_any)} schedulable nodes allow {slots:g} in all "
                    f"(allocatable pods)")
        return None

    @staticmethod
    def _exclusive_why_not(job: JobRecord, roles: list[tuple[str, int]],
                           fitting: Mapping[str, set[str]]) -> str | None:
        """A host port or spreading anti-affinity its minimum holds more often than there are
        nodes to hold it."""
        held = exclusive_of(job, [s for found in job.anti_affinity.values() for s in found])
        for thing in sorted(set().union(*held.values()), key=str):
            holders = [(role, count) for role, count in roles if count and thing in held.get(role, ())]
            nodes = set().union(*(fitting[role] for role, _ in holders))
            if sum(count for _, count in holders) > len(nodes):
                who = " and ".join(f"{count} {role}" for role, count in holders)
                return (f"its minimum ({who}) {describe_exclusive(thing)}: one such pod per node, "
                        f"and only {len(nodes)} schedulable nodes can take one")
        return None

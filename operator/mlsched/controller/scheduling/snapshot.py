"""Index records → `cluster.Snapshot`: what one SchedulingPolicy's round sees. Pure.

Capacity is node allocatable minus what this policy must not hand out: pods of other schedulers,
pods of mlsched jobs that are not this policy's to re-decide, and what other policies reserved in
their latest round (their pods may not exist yet). The policy's own jobs are left out of that
sum because the round re-decides every one of their tasks. What others hold is found by
cluster_state.py; why a job can never fit, by cluster_fit.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from mlsched.cluster.types import JobView, Snapshot, SpeedObservation, Spread
from mlsched.workloads.speed_curve import prior_curve
from mlsched.controller.admission.counted_resources import Counted, CountedResources
from mlsched.controller.objects.desired import roles_of
from mlsched.controller.constraints.host_ports import HostPort
from mlsched.controller.constraints.label_selector import Selector
from mlsched.controller.admission.quotas import Budget
from mlsched.controller.admission.quotas import charges as quota_charges, kept_charges
from mlsched.controller.constraints.topology_spread import SpreadConstraint
from mlsched.controller.constraints.node_constraints import EVERY_NODE, NodeConstraint
from mlsched.controller.constraints.gpu_labels import GPU_TYPE_LABEL, display_name, node_type
from mlsched.controller.objects.records import NodeRecord, PodRecord, StsRecord
from mlsched.controller.objects.job_records import JobRecord
from mlsched.controller.objects.quantities import Resources
from mlsched.controller.scheduling.cluster_state import (
    ClusterState, exclusive_of, untolerated, usable,
)




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
        observations=(found := observations(job.trained, interval_s)),
        observation_types=job.trained_types if found and job.trained_types else (),
        ps_demand=np.array(job.demands.get("ps", (0.0, 0.0, 0.0)), dtype=float),
        worker_demand=np.array(job.demands.get("worker", (0.0, 0.0, 0.0)), dtype=float),
        prior=prior_curve(job.model, job.arch, job.declared_epochs_per_hour),
        node_filters=node_filters or {},
        exclusive=exclusive_of(job, selectors),
        spreads=spreads.checks(job, node_filters) if spreads else {},
        spread_counts=spreads.counted(job) if spreads else {},
        counted=dict(counted) if counted else {},
        gpu_types=dict(job.gpu_types) if job.gpu_types else {},
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
                   labelled: Iterable[tuple[str, Mapping[str, str], int]] | None = None,
                   gpu_type_label: str = GPU_TYPE_LABEL) -> Snapshot:
    """The snapshot one policy decides on. `jobs` are its schedulable jobs; job names are
    unique within a snapshot because a policy only schedules jobs of its own namespace.
    `ports`: per node, the host ports held there already (held_ports); `counted_used`: the
    pod slots and extended resources held there already (held_counted); `selected`: the
    anti-affinity tokens held there already by pods the round does not re-decide
    (held_selected; the jobs decided together hold theirs through JobView.exclusive);
    `repelled`: (node, selectors) of pods the round does not re-decide whose required
    anti-affinity keeps matching pods off their node (with_repelled); `labelled`: the pods of
    the namespace the round does not re-decide (held_labelled), which the jobs' topology
    spread constraints count (Spreads.held). `gpu_type_label`: the node label each node's GPU
    type is read from (gpu_labels.py; the same the jobs' node constraints read)."""
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
    names = [display_name(n.labels, gpu_type_label) for n in nodes]
    types = [node_type(n.labels, gpu_type_label) for n in nodes]
    in_use = [frozenset((*(ports or {}).get(n.name, ()), *(selected or {}).get(n.name, ())))
              for n in nodes] if ports or selected else None
    return Snapshot(time_s=now_s, interval_s=interval_s, node_names=[n.name for n in nodes],
                    capacity=capacity, jobs=views,
                    node_pools=pools if any(p is not None for p in pools) else None,
                    budget=budget.amounts if budget is not None else None, exclusive_in_use=in_use,
                    topology=spreads.topology if spreads else {}, counted_free=counted.free,
                    spread_held=spreads.held(labelled, {n.name: n.labels for n in cluster.nodes})
                    if spreads and labelled else {},
                    # Untyped (None) unless some node is: an untyped cluster is scheduled
                    # exactly as before GPU types.
                    gpu_types=types if any(t is not None for t in types) else None,
                    gpu_names=names if any(n is not None for n in names) else None)

"""Operator-wide state shared by the handlers, the scheduling loops and the progress endpoint.

kopf passes it around as `memo.runtime`. Besides the seams (API, Events, metrics) it keeps a few
small in-memory books; each says below what is lost on an operator restart and why that is fine.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from mlsched.controller.constraints import dra
from mlsched.controller.process.config import OperatorConfig
from mlsched.controller.dataset.dataset import Dataset
from mlsched.controller.objects.desired import PodSettings
from mlsched.controller.scheduling.displacement import Refusals, Vacating
from mlsched.controller.kube.events import Recorder
from mlsched.controller.kube.kube import KubeApi
from mlsched.controller.process.leadership import Leadership
from mlsched.controller.admission.limitranges import Defaulted, LimitRangeRecord
from mlsched.controller.constraints.runtimeclasses import RuntimeClassRecord
from mlsched.controller.objects.services import ServiceBook
from mlsched.controller.process.metrics import Metrics
from mlsched.controller.serving.models import ModelResolver
from mlsched.controller.objects.preflight import Preflight
from mlsched.controller.kube.object_writer import ObjectWriter
from mlsched.controller.admission.quotas import GLOBAL_DEFAULT, QuotaRecord
from mlsched.controller.objects.records import NodeRecord, PodRecord, StsRecord
from mlsched.controller.objects.job_records import JobRecord
from mlsched.controller.objects.quantities import Resources
from mlsched.controller.dataset.rewards import OpenInterval
from mlsched.controller.scheduling.cluster_fit import ClusterFit
from mlsched.controller.scheduling.cluster_state import ClusterState
from mlsched.controller.kube.status_writer import Seen, StatusWriter
from mlsched.controller.kube.written_status import WrittenStatus
from mlsched.policies.cycle_guard import CycleGuard

JobKey = tuple[str, str]
PolicyKey = tuple[str, str]
MAX_DEPARTED = 10_000  # deleted jobs whose policy is remembered (runtime.departed)


def values(index: Mapping[Any, Iterable[Any]], key: Any) -> list[Any]:
    """The values stored under one key of a kopf index (or of a dict of lists in tests)."""
    return list(index.get(key, ()))


def flatten(index: Mapping[Any, Iterable[Any]]) -> list[Any]:
    return [v for store in index.values() for v in store]


def _same(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def _merged(index: Mapping[str, Iterable[Any]], more: Mapping[str, list[Any]]) -> dict[str, list[Any]]:
    """A per-node index with more entries per node (other namespaces' pods)."""
    merged = {node: list(found) for node, found in index.items()}
    for node, found in more.items():
        merged.setdefault(node, []).extend(found)
    return merged


class Owned(Mapping[JobKey, list]):
    """A children index (keyed by job name) seen through the MLJobs that have those names now:
    only the children of the job with that name today. A job deleted and recreated under the
    same name leaves children owned by the old uid until the garbage collector removes them;
    counting them as the new job's would show its pods as ready and scale them."""

    def __init__(self, raw: Mapping[JobKey, Iterable[Any]], keep: Any):
        self.raw = raw
        self._keep = keep  # (key, record) -> bool

    def __getitem__(self, key: JobKey) -> list:
        if key not in self.raw:
            raise KeyError(key)
        return [r for r in self.raw[key] if self._keep(key, r)]

    def get(self, key: JobKey, default: Any = None) -> Any:
        # (Mapping.get would raise and catch a KeyError for every job without children:
        # every job of a cold round, twice.)
        if key not in self.raw:
            return default
        return [r for r in self.raw[key] if self._keep(key, r)]

    def __iter__(self):
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)

    def strays(self) -> list:
        """The records the view hides (children of an earlier job of the same name)."""
        return [r for key, records in self.raw.items() for r in records
                if not self._keep(key, r)]


class WithDevices(Mapping[str, list]):
    """The node index with each node's DRA devices (dra.Catalogue: the devices its ResourceSlices
    publish, per DeviceClass) added to its extended resources, so that every reader (rounds,
    NodeFilters, CannotFit) counts them as it counts `example.com/nic`, and those of GPU classes
    (dra.GPU_CLASSES) to its allocatable GPUs. A cluster without ResourceSlices sees the index
    as it is."""

    def __init__(self, raw: Mapping[str, Iterable[NodeRecord]], catalogue: Callable[[], dra.Catalogue]):
        self.raw = raw
        self._catalogue = catalogue
        self._cache: dict[str, tuple[NodeRecord, Mapping[str, float], float, NodeRecord]] = {}

    def _with(self, node: NodeRecord, catalogue: dra.Catalogue) -> NodeRecord:
        devices = catalogue.by_node.get(node.name)
        if not devices:
            return node
        gpus = catalogue.gpus.get(node.name, 0.0)
        cached = self._cache.get(node.name)
        if cached is not None and cached[0] is node and cached[1] == devices and cached[2] == gpus:
            return cached[3]
        cpu, gpu, memory = node.allocatable
        result = dataclasses.replace(node, extended={**node.extended, **devices},
                                     allocatable=(cpu, gpu + gpus, memory))
        if len(self._cache) > 2 * len(self.raw) + 64:
            self._cache = {k: v for k, v in self._cache.items() if k in self.raw}
        self._cache[node.name] = (node, devices, gpus, result)
        return result

    def __getitem__(self, name: str) -> list:
        catalogue = self._catalogue()
        return [self._with(n, catalogue) for n in self.raw[name]]

    def __iter__(self):
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)

    def values(self):  # type: ignore[override]
        catalogue = self._catalogue()
        if not catalogue.by_node:
            return self.raw.values()
        return [[self._with(n, catalogue) for n in found] for found in self.raw.values()]


@dataclass
class Indexes:
    """kopf's in-memory indexes (live objects: they update as watch events arrive).

    `statefulsets` and `pods` only show the children of the MLJob that has the name now
    (Owned); everything that reads them per job gets that rule for free. `mljobs` shows each
    job with its namespace's LimitRange defaults applied (limitranges.Defaulted), so that
    everything plans with what the pods will request."""

    nodes: Mapping[str, Iterable[NodeRecord]]
    pods: Mapping[JobKey, Iterable[PodRecord]]
    statefulsets: Mapping[JobKey, Iterable[StsRecord]]
    foreign: Mapping[str, Iterable[Resources]]
    mljobs: Mapping[JobKey, Iterable[JobRecord]]
    policies: Mapping[PolicyKey, Iterable[Any]]
    # With --namespace: pods of the other namespaces (cluster_pods.OtherNamespacePods), and
    # their allocated ResourceClaims (cluster_pods.OtherNamespaceClaims).
    other_namespaces: Any = None
    other_claims: Any = None
    # ResourceQuotas by namespace (quotas.py): the budget of the namespace's rounds.
    quotas: Mapping[str, Iterable[QuotaRecord]] = field(default_factory=dict)
    # LimitRanges by namespace (limitranges.py): the requests its pods will be given.
    limit_ranges: Mapping[str, Iterable[LimitRangeRecord]] = field(default_factory=dict)
    # RuntimeClasses by name (runtimeclasses.py): what pods naming one will be.
    runtime_classes: Mapping[str, Iterable[RuntimeClassRecord]] = field(default_factory=dict)
    # The globalDefault PriorityClass's name under quotas.GLOBAL_DEFAULT: the class of pods
    # whose template names none, which PriorityClass-scoped quotas count (quotas.py).
    priority_classes: Mapping[str, Iterable[str]] = field(default_factory=dict)
    # Host ports of other schedulers' pods by node (host_ports.py), for those holding any.
    foreign_ports: Mapping[str, Iterable[frozenset]] = field(default_factory=dict)
    # Extended resources of other schedulers' pods by node (counted_resources.py).
    foreign_extended: Mapping[str, Iterable[tuple]] = field(default_factory=dict)
    # (node, labels) of other schedulers' pods by namespace (pod_anti_affinity.py).
    foreign_labels: Mapping[str, Iterable[tuple]] = field(default_factory=dict)
    # (node, anti-affinity selectors) of other schedulers' pods carrying any, by namespace.
    foreign_repels: Mapping[str, Iterable[tuple]] = field(default_factory=dict)
    # Dynamic Resource Allocation (dra.py): DeviceClasses and ResourceSlices by name,
    # ResourceClaimTemplates and allocated ResourceClaims by namespace.
    device_classes: Mapping[str, Iterable[dra.DeviceClassRecord]] = field(default_factory=dict)
    resource_slices: Mapping[str, Iterable[dra.SliceRecord]] = field(default_factory=dict)
    claim_templates: Mapping[str, Iterable[dra.ClaimTemplateRecord]] = field(default_factory=dict)
    resource_claims: Mapping[str, Iterable[dra.ClaimRecord]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.mljobs, Defaulted):
            self.mljobs = Defaulted(self.mljobs, self.limit_ranges, self.runtime_classes,
                                    self.claim_templates, self.device_classes)
        if not isinstance(self.nodes, WithDevices):
            self.nodes = WithDevices(self.nodes, self.catalogue)
        self._catalogue: tuple[tuple, tuple, tuple, frozenset, dra.Catalogue] | None = None
        if not isinstance(self.statefulsets, Owned):
            self.statefulsets = Owned(self.statefulsets, self._owns_statefulset)
        if not isinstance(self.pods, Owned):
            self.pods = Owned(self.pods, self._owns_pod)

    def _owns_statefulset(self, key: JobKey, sts: StsRecord) -> bool:
        if sts.owner_uid is None:
            return True
        # The raw index: defaults (Defaulted) never change a uid, and a round asks for each job.
        job = next(iter(self.mljobs.raw.get(key, ())), None)
        return job is None or sts.owner_uid == job.uid

    def _owns_pod(self, key: JobKey, pod: PodRecord) -> bool:
        if pod.owner_uid is None:
            return True
        return any(s.uid == pod.owner_uid for s in self.statefulsets.get(key, ()))

    def cluster(self) -> ClusterState:
        foreign: Mapping[str, Iterable[Resources]] = self.foreign
        ports: Mapping[str, Iterable[frozenset]] = self.foreign_ports
        extended: Mapping[str, Iterable[tuple]] = self.foreign_extended
        if self.other_namespaces is not None:
            foreign = _merged(self.foreign, self.other_namespaces.requests_by_node())
            ports = _merged(self.foreign_ports, self.other_namespaces.ports_by_node())
            extended = _merged(self.foreign_extended, self.other_namespaces.extended_by_node())
        return ClusterState(nodes=flatten(self.nodes), pods=self.pods,
                            statefulsets=self.statefulsets, foreign=foreign,
                            foreign_ports=ports, foreign_extended=extended,
                            foreign_labels=self.foreign_labels, foreign_repels=self.foreign_repels,
                            strays=self.pods.strays(),
                            device_claims=self._device_claims())

    def _device_claims(self) -> list:
        claims = flatten(self.resource_claims)
        if self.other_claims is not None:
            claims += self.other_claims.claims()
        return dra.claimed(claims, self.catalogue()) if claims else []

    def catalogue(self) -> dra.Catalogue:
        """The cluster's node-local DRA devices by class (and by the refinements claim
        templates' requests make of a class), rebuilt when a ResourceSlice or a DeviceClass
        changed (kopf replaces a changed object's record) or a template narrows a class anew."""
        slices, classes = tuple(flatten(self.resource_slices)), tuple(flatten(self.device_classes))
        templates = tuple(flatten(self.claim_templates))
        cached = self._catalogue
        same_devices = cached is not None and _same(cached[0], slices) and _same(cached[1], classes)
        if same_devices and _same(cached[2], templates):
            return cached[4]
        narrowed = dra.refinements(templates)
        if same_devices and cached[3] == narrowed:  # a template changed, not what it narrows
            catalogue = cached[4]
        else:
            catalogue = dra.Catalogue.of(slices, classes, refinements=narrowed)
        self._catalogue = (slices, classes, templates, narrowed, catalogue)
        return catalogue

    def default_priority_class(self) -> str:
        found = values(self.priority_classes, GLOBAL_DEFAULT)
        return min(found) if found else ""

    def job(self, namespace: str, name: str) -> JobRecord | None:
        found = values(self.mljobs, (namespace, name))
        return found[0] if found else None

    def as_planned(self, job: JobRecord) -> JobRecord:
        """A record read from a body (not the index) as the index shows it (Defaulted)."""
        assert isinstance(self.mljobs, Defaulted)
        return self.mljobs.plan(job)

    def jobs_of_policy(self, namespace: str, policy: str) -> list[JobRecord]:
        return [j for j in flatten(self.mljobs) if j.namespace == namespace and j.policy == policy]


class PlacementBook:
    """The node decided for each task ordinal, for pods that appear between rounds.

    Lost on restart: the first round of each policy runs right away and refills it; until
    then new pods simply stay gated.
    """

    def __init__(self) -> None:
        self._nodes: dict[JobKey, Mapping[str, tuple[str, ...]]] = {}
        # Jobs whose decision is recorded here but not yet applied (a round or an admission
        # step between deciding and its patches' answers), with how many steps apply it.
        self._applying: dict[JobKey, int] = {}
        self._applied: dict[JobKey, asyncio.Event] = {}  # set when the last of them is done

    def set(self, key: JobKey, nodes: Mapping[str, tuple[str, ...]]) -> None:
        self._nodes[key] = dict(nodes)

    @contextlib.contextmanager
    def applying(self, keys: Iterable[JobKey]) -> Iterator[None]:
        """While a step applies its decision for these jobs. A StatefulSet's watch event from
        before the step's own scaling must not be taken for a hand edit then: scaling it
        back with a replicas-only patch ahead of the step's patch made the StatefulSet
        controller start pods from the old template, which the step's template then
        replaced (seen in bench_e2e: pods deleted and pinned twice, "Restored" on jobs nobody
        touched)."""
        keys = list(keys)
        for key in keys:
            self._applying[key] = self._applying.get(key, 0) + 1
            self._applied.setdefault(key, asyncio.Event())
        try:
            yield
        finally:
            for key in keys:
                left = self._applying.get(key, 0) - 1
                if left > 0:
                    self._applying[key] = left
                else:
                    self._applying.pop(key, None)
                    self._applied.pop(key).set()

    def being_applied(self, key: JobKey) -> bool:
        return key in self._applying

    async def settled(self, key: JobKey) -> None:
        """Return once no step is applying a decision for this job (at once if none is)."""
        while (done := self._applied.get(key)) is not None:
            await done.wait()

    def node_for(self, key: JobKey, role: str, ordinal: int) -> str | None:
        nodes = self._nodes.get(key, {}).get(role, ())
        return nodes[ordinal] if ordinal < len(nodes) else None

    def forget(self, key: JobKey) -> None:
        self._nodes.pop(key, None)

    def of(self, key: JobKey) -> Mapping[str, tuple[str, ...]] | None:
        return self._nodes.get(key)


class ReservationBook:
    """What each policy's latest round allotted, per job and node (catalog demands).

    Other policies subtract it from capacity even before the pods exist. Lost on restart: the
    pods that exist by then are counted instead (cluster_state.held_elsewhere).
    """

    def __init__(self) -> None:
        self._by_policy: dict[PolicyKey, dict[JobKey, dict[str, Resources]]] = {}

    def set(self, policy: PolicyKey, usage: dict[JobKey, dict[str, Resources]]) -> None:
        self._by_policy[policy] = usage

    def add(self, policy: PolicyKey, usage: dict[JobKey, dict[str, Resources]]) -> None:
        """An admission step's grants, on top of the policy's latest round."""
        self._by_policy.setdefault(policy, {}).update(usage)

    def all(self) -> dict[JobKey, dict[str, Resources]]:
        return {job: usage for usage_by_job in self._by_policy.values()
                for job, usage in usage_by_job.items()}

    def usage_of(self, job: JobKey) -> dict[str, Resources] | None:
        """What the job's latest decision reserved, per node; None if none is known."""
        for usage in self._by_policy.values():
            if job in usage:
                return usage[job]
        return None

    def gpus(self, policy: PolicyKey) -> float:
        """The GPUs the policy's jobs hold as decided."""
        return sum(r[1] for usage in self._by_policy.get(policy, {}).values()
                   for r in usage.values())

    def release(self, job: JobKey) -> None:
        for usage in self._by_policy.values():
            usage.pop(job, None)

    def drop_policy(self, policy: PolicyKey) -> None:
        self._by_policy.pop(policy, None)


class DueJobs:
    """Jobs whose lifecycle (phase, conditions) is to be evaluated now, not at the next sweep:
    a pod of theirs changed (Ready, failed, deleted) or a StatefulSet rolled. The sweep alone
    left a burst of 300 jobs `Pending` two minutes after their pods were Ready (issue 55).
    Marks within COALESCE_S are taken together, so a job whose pods change at once is looked
    at once."""

    COALESCE_S = 0.1

    def __init__(self) -> None:
        self._due: dict[JobKey, None] = {}  # insertion-ordered: the first marked go first
        self._event: asyncio.Event | None = None

    def _signal(self) -> asyncio.Event:
        if self._event is None:
            self._event = asyncio.Event()
        return self._event

    def mark(self, key: JobKey) -> None:
        self._due[key] = None
        self._signal().set()

    async def take(self) -> list[JobKey]:
        """Wait for a mark, let the burst it is part of gather, and take every job marked."""
        event = self._signal()
        await event.wait()
        await asyncio.sleep(self.COALESCE_S)
        event.clear()
        due, self._due = list(self._due), {}
        return due


class PodStates:
    """What the lifecycle reads of each pod of ours, as last seen: a pod event that changes
    none of it (a pin, a binding, a kubelet heartbeat) marks no job due (DueJobs)."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple] = {}  # uid → state

    def changed(self, pod: PodRecord, gone: bool = False) -> bool:
        if gone:  # its going changes its job's counts
            self._seen.pop(pod.uid, None)
            return True
        state = (pod.ready, pod.phase, pod.deleting, pod.restarts, pod.completed,
                 pod.unschedulable, pod.stuck, pod.creating, pod.claims_unmade, pod.unseen)
        before = self._seen.get(pod.uid)
        self._seen[pod.uid] = state
        return before != state


class Wakeups:
    """Why a policy's loop should act before its next interval: `admission` (a job arrived,
    finished or got its StatefulSets) or `policy` (its spec was edited). Signals that arrive
    while the loop is busy are kept, so none is lost, and a burst is answered once."""

    def __init__(self) -> None:
        self._events: dict[PolicyKey, asyncio.Event] = {}
        self._reasons: dict[PolicyKey, set[str]] = {}
        self._count: dict[PolicyKey, int] = {}  # signals so far: has another come since?

    def _event(self, policy: PolicyKey) -> asyncio.Event:
        return self._events.setdefault(policy, asyncio.Event())

    def signal(self, policy: PolicyKey, reason: str) -> None:
        self._reasons.setdefault(policy, set()).add(reason)
        self._count[policy] = self._count.get(policy, 0) + 1
        self._event(policy).set()

    def signals(self, policy: PolicyKey) -> int:
        """How many signals the policy has had: unchanged over a pause means a burst ended."""
        return self._count.get(policy, 0)

    async def wait(self, policy: PolicyKey, timeout: float) -> set[str]:
        """The reasons signalled (cleared on return); empty when `timeout` passed first."""
        event = self._event(policy)
        if not event.is_set():
            try:
                await asyncio.wait_for(event.wait(), timeout)
            except TimeoutError:
                return set()
        event.clear()
        return self._reasons.pop(policy, set())

    def peek(self, policy: PolicyKey) -> set[str]:
        return set(self._reasons.get(policy, ()))

    def drop(self, policy: PolicyKey, reason: str) -> None:
        """`reason` is being answered now; a signal after this wakes the loop again."""
        reasons = self._reasons.get(policy, set())
        reasons.discard(reason)
        if not reasons:
            self._event(policy).clear()

    def forget(self, policy: PolicyKey) -> None:
        self._events.pop(policy, None)
        self._reasons.pop(policy, None)
        self._count.pop(policy, None)


class FailureBook:
    """Pod failures per job for backoffLimit, counted from each pod's restarts as they grow: a
    restart that followed an exit 0 is not one (StatefulSet pods restart whatever the exit
    code). Per pod uid, so pods that were replaced still count. Lost on restart (then only live
    pods count, each restart seen then as a failure unless the latest followed an exit 0)."""

    def __init__(self) -> None:
        self._seen: dict[JobKey, dict[str, tuple[int, int]]] = {}  # uid → (restarts, failures)
        self._last: dict[JobKey, str] = {}  # "pod p: container c exited with code 3 (Error)"

    def observe(self, job: JobKey, uid: str, restarts: int, last_exit_zero: bool = False,
                pod: str = "", failure: str | None = None) -> None:
        """`failure`: the pod's latest non-zero exit (PodRecord.last_failure), kept as the
        job's last when this observation counts a new failure."""
        pods = self._seen.setdefault(job, {})
        seen, failures = pods.get(uid, (0, 0))
        if restarts > seen:
            new = restarts - seen - (1 if last_exit_zero else 0)
            failures += new
            if new > 0 and failure:
                self._last[job] = f"pod {pod}: {failure}" if pod else failure
        pods[uid] = (max(seen, restarts), failures)

    def total(self, job: JobKey) -> int:
        return sum(failures for _, failures in self._seen.get(job, {}).values())

    def last(self, job: JobKey) -> str | None:
        return self._last.get(job)

    def forget(self, job: JobKey) -> None:
        self._seen.pop(job, None)
        self._last.pop(job, None)


@dataclass
class Runtime:
    config: OperatorConfig
    api: KubeApi
    models: ModelResolver
    metrics: Metrics = field(default_factory=Metrics)
    placements: PlacementBook = field(default_factory=PlacementBook)
    services: ServiceBook = field(default_factory=ServiceBook)  # whose headless Service exists
    reservations: ReservationBook = field(default_factory=ReservationBook)
    failures: FailureBook = field(default_factory=FailureBook)
    intervals: dict[PolicyKey, OpenInterval] = field(default_factory=dict)
    # Latest accepted progress report per job (epochs, epoch seconds, speed): newer than the
    # index until the status patch comes back through the watch.
    progress: dict[JobKey, tuple[float, float, float, float | None]] = field(default_factory=dict)
    # Pods pinned but not yet seen ungated (uid → node): a burst of watch events for one pod
    # then costs one patch, not one per event.
    pinned: dict[str, str] = field(default_factory=dict)
    indexes: Indexes | None = None
    round_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    wakeups: Wakeups = field(default_factory=Wakeups)
    # Jobs to evaluate now (a pod changed), and those being evaluated: one at a time per job.
    lifecycle_due: DueJobs = field(default_factory=DueJobs)
    pod_states: PodStates = field(default_factory=PodStates)
    # Jobs being evaluated, each with whether it was marked due meanwhile (jobs.sync_job).
    syncing: dict[JobKey, bool] = field(default_factory=dict)
    # Jobs whose change of pod counts alone waits to be written, until when (loop time;
    # jobs.counts_wait).
    counts_due: dict[JobKey, float] = field(default_factory=dict)
    # The latest body of each MLJob (from its watch events), for the lifecycle sweep.
    job_bodies: dict[JobKey, dict[str, Any]] = field(default_factory=dict)
    # The lifecycle's status patches not yet seen in the job's watch (written_status.py).
    written_status: WrittenStatus = field(default_factory=WrittenStatus)
    # (uid, generation) whose children were created and templates refreshed: a watch event
    # of another generation (an edit) reconciles again. Lost on restart: all are, once.
    reconciled: dict[JobKey, tuple[str, int]] = field(default_factory=dict)
    # (job, StatefulSet) -> (since when it has been seen with fewer pods than replicas and
    # none created, how many pods it had then) (jobs.pods_refused).
    short_since: dict[tuple[JobKey, str], tuple[float, int]] = field(default_factory=dict)
    # The policy of each job deleted lately, for the deletion of its pods (which outlive it)
    # to wake that policy's admission. The latest MAX_DEPARTED only.
    departed: dict[JobKey, str] = field(default_factory=dict)
    # job -> pod uid -> when the pod was first seen pinned, ungated and with no word from any
    # scheduler (jobs.unscheduled). Per job: a sweep touches one job's clocks, not everyone's.
    unseen_since: dict[JobKey, dict[str, float]] = field(default_factory=dict)
    # job -> pod uid -> when the pod was first seen bound with its containers still being
    # created; per job, the latest read of such a pod's Warning Events: (when, pod, why or
    # None) (jobs.stuck_creating).
    creating_since: dict[JobKey, dict[str, float]] = field(default_factory=dict)
    creating_checks: dict[JobKey, tuple[float, str, str | None]] = field(default_factory=dict)
    # The same for pods whose ResourceClaims have not been made (jobs.claims_unmade).
    claims_since: dict[JobKey, dict[str, float]] = field(default_factory=dict)
    claims_checks: dict[JobKey, tuple[float, str, str | None]] = field(default_factory=dict)
    # Each namespace's labels as last seen: a change asks again about its refused jobs' pods.
    namespace_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    # Each node's record as last seen by the node handler: a change wakes admission.
    node_states: dict[str, NodeRecord] = field(default_factory=dict)
    # Why each job its policy's latest round or admission step gave nothing still waits
    # (waiting.py): the message of its Admitted=False condition.
    waiting: dict[JobKey, str] = field(default_factory=dict)
    # Nodes kube-scheduler refused each job's pods on lately, avoided when they are placed
    # again (displacement.py).
    refusals: Refusals = field(default_factory=Refusals)
    # Nodes our pods are leaving, for the jobs' conditions (displacement.Vacating).
    vacating: Vacating = field(default_factory=Vacating)
    # Each job's dry-run verdict: would the API server create its pods (preflight.py)?
    preflight: Preflight = field(default_factory=Preflight)
    # The last transient error creating a job's children (reported once, retried each sweep).
    retrying: dict[JobKey, str] = field(default_factory=dict)
    # Jobs whose children the namespace's ResourceQuota had no room for: (uid, generation,
    # monotonic time of the refusal), so they are not retried every sweep (jobs.py).
    over_quota: dict[JobKey, tuple[str, int, float]] = field(default_factory=dict)
    policy_loops: Any = None  # supervision.PolicyLoops, made at startup
    # Per policy, the published model versions its latest round adopted (phase -> algorithm ->
    # ModelRef), so that admission steps serve what the round served. Lost on restart: the
    # first round lists them again.
    adopted: dict[PolicyKey, Any] = field(default_factory=dict)
    # Per policy, the published versions serving ("phase/algorithm" -> version), for the
    # decision log of admission steps.
    served_versions: dict[PolicyKey, dict[str, int | None]] = field(default_factory=dict)
    # Per policy, the cycle guard its unsettled (learned) rounds go through
    # (policies/cycle_guard.py): the counts each job held since anything else changed.
    cycle_guards: dict[PolicyKey, CycleGuard] = field(default_factory=dict)
    # Whether this replica may write (controller/process/leadership.py); it does unless it stands by.
    leadership: Leadership = field(default_factory=Leadership)
    # Grouping (pools.py): each job's pool as the latest decision left it, and each policy's
    # status.groups as last queued; newer than the index until the status writes come back.
    groups: dict[JobKey, Any] = field(default_factory=dict)
    policy_groups: dict[PolicyKey, list] = field(default_factory=dict)
    # Each policy's status.admittedJobs / waitingJobs as last queued (loop.job_counts).
    policy_counts: dict[PolicyKey, dict[str, int]] = field(default_factory=dict)
    # Each policy's status.workConservation as last queued (conservation.py): the count of
    # rounds in a row not work conserving goes on from it, not from a status not yet written.
    work_conservation: dict[PolicyKey, dict[str, Any]] = field(default_factory=dict)
    # Each policy's ModelInDomain status as last queued ("True" | "False" | "Unknown", None:
    # absent), so its Events follow changes of the condition, not of a status not yet written.
    model_domain: dict[PolicyKey, str | None] = field(default_factory=dict)
    # Each policy's regret guard between rounds (controller/scheduling/guard.py: its records of the
    # current window, its state); absent without spec.guard.
    guards: dict[PolicyKey, Any] = field(default_factory=dict)
    # Each policy's fair share of contended GPUs at its latest step (fair_share.py); absent
    # while nothing bounds it.
    fair_shares: dict[PolicyKey, Any] = field(default_factory=dict)
    policy_nodes: dict[PolicyKey, dict[str, str]] = field(default_factory=dict)  # node → label
    # Policies named by jobs or node labels but missing from the index: since when (jobs.py).
    orphans: dict[PolicyKey, float] = field(default_factory=dict)
    _fit: tuple[float, Any, ClusterFit] | None = None

    def __post_init__(self) -> None:
        if hasattr(self.api, "on_request"):  # the production KubeApi: count what it sends
            self.api.on_request = lambda verb, resource: \
                self.metrics.api_requests.labels(verb, resource).inc()
        self.recorder = Recorder(self.api)
        # Status records go out in the background (status_writer.py); what is written is
        # merged with what the MLJob index shows then.
        self.records = StatusWriter(
            self.api, concurrency=self.config.record_concurrency, rate=self.config.record_rate,
            burst=self.config.record_burst, lookup=self._seen,
            on_failure=self.metrics.api_errors.labels("record").inc)
        self.metrics.watch_pending_records(self.records.pending)
        # Read at scrape time: a standby's Leadership object is swapped in after creation.
        self.metrics.watch_leadership(lambda: self.leadership.leading)
        # The retraining dataset's ConfigMaps (dataset.py), also written in the background.
        self.objects = ObjectWriter(concurrency=max(1, self.config.record_concurrency // 2),
                                    on_failure=self.metrics.api_errors.labels("dataset").inc)
        self.dataset = Dataset(self.api, self.objects, self.config.interval_scale)
        self.pod_settings = PodSettings(progress_url=self.config.progress_url,
                                        tolerated_taints=tuple(sorted(self.config.tolerated_taints)),
                                        token_audience=self.config.token_audience,
                                        service_account=self.config.training_service_account)

    @classmethod
    def create(cls, config: OperatorConfig, api: KubeApi) -> Runtime:
        async def read_configmap(namespace: str, name: str):
            return await api.get("ConfigMap", namespace, name)

        return cls(config=config, api=api,
                   models=ModelResolver(config.model_cache_dir, read_configmap, config.model_dirs,
                                        config.max_model_bytes, config.execution_provider))

    def cluster_fit(self, idx: Indexes) -> ClusterFit:
        """The schedulable nodes summed, at most once a second (a sweep asks once per job)."""
        now = time.monotonic()
        if self._fit is None or self._fit[1] is not idx.nodes or now - self._fit[0] > 1.0:
            fit = ClusterFit.of(flatten(idx.nodes), node_selector=self.config.node_selector,
                                tolerated_taints=self.config.tolerated_taints)
            self._fit = (now, idx.nodes, fit)
        return self._fit[2]

    def _seen(self, kind: str, namespace: str, name: str) -> Seen | None:
        job = self.indexes.job(namespace, name) if self.indexes and kind == "MLJob" else None
        return Seen(job.uid, {"history": job.history}) if job else None

    def epochs_done(self, job: JobRecord) -> float:
        """The newest progress known: the index, or a report whose status write is in flight."""
        cached = self.progress.get(job.key)
        return max(job.epochs_done, cached[0] if cached else 0.0)

    def measured(self, job: JobRecord) -> tuple[float | None, float, float | None]:
        """(time, epochs/s, samples/s) of the job's latest progress report: the report this
        process accepted last, else what its status holds."""
        cached = self.progress.get(job.key)
        if cached is not None:
            return cached[1], cached[2], cached[3]
        return job.last_report_s, job.speed, job.samples_per_second

    def note_departed(self, key: JobKey, policy: str) -> None:
        self.departed.pop(key, None)
        self.departed[key] = policy
        while len(self.departed) > MAX_DEPARTED:
            del self.departed[next(iter(self.departed))]

    def forget_job(self, key: JobKey) -> None:
        self.job_bodies.pop(key, None)
        self.written_status.forget(key)
        self.counts_due.pop(key, None)
        self.reconciled.pop(key, None)
        for stuck in [k for k in self.short_since if k[0] == key]:
            del self.short_since[stuck]
        self.unseen_since.pop(key, None)
        self.creating_since.pop(key, None)
        self.creating_checks.pop(key, None)
        self.claims_since.pop(key, None)
        self.claims_checks.pop(key, None)
        self.retrying.pop(key, None)
        self.over_quota.pop(key, None)
        self.waiting.pop(key, None)
        self.preflight.forget(key)
        self.refusals.forget(key)
        self.placements.forget(key)
        self.services.forget(key)
        self.reservations.release(key)
        self.failures.forget(key)
        self.progress.pop(key, None)
        self.groups.pop(key, None)

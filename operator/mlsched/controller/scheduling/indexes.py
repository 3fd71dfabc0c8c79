"""The kopf indexes as the operator reads them (`Indexes`): the watched objects' records by
job, node, namespace and name, the pods and StatefulSets a job owns, the DRA catalogue, the
cluster state a snapshot starts from; and the helpers every reader uses (`values`,
`flatten`). kopf keeps the indexes; this is a read-only view of them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mlsched.controller.constraints import dra
from mlsched.controller.admission.limitranges import Defaulted, LimitRangeRecord
from mlsched.controller.constraints.runtimeclasses import RuntimeClassRecord
from mlsched.controller.admission.quotas import GLOBAL_DEFAULT, QuotaRecord
from mlsched.controller.objects.records import NodeRecord, PodRecord, StsRecord
from mlsched.controller.objects.job_records import JobRecord
from mlsched.controller.objects.quantities import Resources
from mlsched.controller.scheduling.cluster_state import ClusterState

JobKey = tuple[str, str]
PolicyKey = tuple[str, str]


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
    # The indexes of watched kinds (app/watched.py, WATCHED) with no field above, by the
    # attribute they are read as: a new watched kind needs its table entry only.
    extra: Mapping[str, Mapping[Any, Iterable[Any]]] = field(default_factory=dict)

    @classmethod
    def of(cls, found: Mapping[str, Mapping[Any, Iterable[Any]]]) -> Indexes:
        """The indexes by attribute name: those declared above as fields, the rest in `extra`."""
        declared = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in found.items() if k in declared},
                   extra={k: v for k, v in found.items() if k not in declared})

    def __getattr__(self, name: str) -> Any:
        extra = self.__dict__.get("extra") or {}
        if name in extra:
            return extra[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

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

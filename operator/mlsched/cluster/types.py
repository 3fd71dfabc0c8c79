"""What a policy sees (a Snapshot) and what it returns (a Decision).

A decision is a pure function of a snapshot. The simulator and the operator both build these
types, so a policy cannot tell which of them called it.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import numpy as np

from mlsched.workloads import catalog
from mlsched.workloads.speed_curve import SpeedCurve, prior_curve

Role = Literal["ps", "worker"]
Arch = Literal["ps", "allreduce"]
ROLES: tuple[Role, Role] = ("ps", "worker")


class SpeedObservation(NamedTuple):
    """A speed a job really showed: epochs per second at (ps, workers), interference included.

    A NamedTuple, not a frozen dataclass: a snapshot of 10,000 jobs builds up to 240,000 of
    these per round, and a frozen dataclass costs ~10x more to construct."""

    ps: int
    workers: int
    epochs_per_s: float


_NOTHING: frozenset = frozenset()


@dataclass(frozen=True, eq=False)
class Spread:
    """A cap on how unevenly a role's tasks may spread over topology domains (in the
    cluster, a template's topologySpreadConstraints: controller/constraints/topology_spread.py). A task may
    go on a node whose domain holds fewer than `min + max_skew` tasks counted under `token`,
    `min` being the fewest in any `eligible` domain (0 when fewer than `min_domains` are
    eligible); nodes outside every domain are not allowed."""

    token: Hashable  # what the counted tasks hold (JobView.spread_counts)
    key: str  # the topology: Snapshot.topology[key] gives each node's domain
    max_skew: int
    eligible: np.ndarray  # (domains,) bool: the domains the minimum is taken over
    min_domains: int = 1


@dataclass
class JobView:
    """One active (arrived, unfinished) job as a policy sees it.

    Policies describe a job by what it asks for and how it runs: its demand per role (in the
    cluster, the pod templates' requests), its speed curve (`prior`, refined online from
    `observations`), its remaining work, age and architecture. `model` is a free-form label:
    a catalog name gives the simulator its ground truth and the job a better prior, any
    other name is scheduled all the same.
    """

    name: str
    model: str  # free-form; canonical when it is a catalog model
    arch: Arch
    arrival_s: float
    total_epochs: float  # the user's estimate
    epochs_done: float = 0.0
    slots_run: int = 0  # intervals in which the job had tasks
    ps: int = 0  # counts and placement during the previous interval
    workers: int = 0
    ps_nodes: tuple[int, ...] = ()  # node index of PS ordinal k
    worker_nodes: tuple[int, ...] = ()
    min_ps: int = 1
    max_ps: int = 16
    min_workers: int = 1
    max_workers: int = 16
    requested_ps: int | None = None  # counts the user asked for (the `fixed` policy)
    requested_workers: int | None = None
    observations: Sequence[SpeedObservation] = ()  # oldest first
    pool: str | None = None  # node pool chosen by a grouping policy
    pool_since_s: float | None = None  # when the job entered `pool` (a grouping's minimum stay)
    # Measured seconds of one iteration's (compute, communication) at (ps, workers), a moving
    # average (Harmony's per-subtask profile); None until the job has run.
    phase_s: tuple[float, float] | None = None
    # (cpu, gpu, mem_gib) one task of each role requests; the catalog's when not given.
    ps_demand: np.ndarray | None = None
    worker_demand: np.ndarray | None = None
    prior: SpeedCurve | None = None  # speed curve before observation; the catalog's when not given
    # Per role, the snapshot's nodes its tasks may run on (a bool per node): in the cluster,
    # what the pod template's nodeSelector and required node affinity allow. A role absent
    # may use every node. Jobs with the same constraint share one array (a round keys its
    # fit checks on the array's identity).
    node_filters: dict[Role, np.ndarray] = field(default_factory=dict)
    # Per role, what one task counts against its namespace's ResourceQuotas, in the cluster
    # (controller/objects/quantities.QUOTA_DIMS: requests of CPU, GPU, memory, limits of CPU, memory, one
    # pod; NaN where its pods set no such request or limit). A role absent: its demand, no
    # limits, one pod.
    quota_charges: dict[Role, np.ndarray] = field(default_factory=dict)
    # Per role, by task ordinal, the charge of the task an existing pod keeps where it differs
    # from quota_charges (None where it does not): in the cluster, a pod's PriorityClass is the
    # one it was made with, and a quota scoped to classes counts it by that. Usually empty.
    kept_charges: dict[Role, tuple[np.ndarray | None, ...]] = field(default_factory=dict)
    # Per role, what one task holds on its node alone (tokens compared by equality): in the
    # cluster, the host ports of its pod template, ("TCP", 29500) (controller/constraints/host_ports.py),
    # and the required pod anti-affinity groups its pods belong to (pod_anti_affinity.py).
    # Two tasks holding the same token never share a node, whatever their jobs. A role
    # absent holds none.
    exclusive: dict[Role, frozenset] = field(default_factory=dict)
    # Per role, the spread caps its tasks must respect (Spread), and the (Spread.token,
    # Spread.key) pairs its tasks count toward (whichever job's template carries the cap).
    spreads: dict[Role, tuple[Spread, ...]] = field(default_factory=dict)
    spread_counts: dict[Role, frozenset[tuple[Hashable, str]]] = field(default_factory=dict)
    # Per role, how much one task takes of each per-node resource counted beside CPU, GPU and
    # memory (Snapshot.counted_free): in the cluster, the pod itself ("pods", 1) and its
    # extended resources (an RDMA NIC, a MIG slice, scratch disk). A role absent takes none.
    counted: dict[Role, tuple[tuple[str, float], ...]] = field(default_factory=dict)
    # The GPU type (Snapshot.gpu_types) of the slowest worker of each of `observations`, in
    # the same order: the pace it was measured at (None: no type, the homogeneous default).
    # Empty when no observation has a type.
    observation_types: tuple[str | None, ...] = ()
    # Per role, the GPU types (Snapshot.gpu_types) its tasks may use, where the job restricts
    # them (in the cluster, spec.replicaSpecs.<role>.gpuTypes): `node_filters` already keeps
    # the role off other nodes; this names the restriction (why a job waits). A role absent
    # may use any type.
    gpu_types: dict[Role, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.worker_demand is None or (self.ps_demand is None and self.uses_ps):
            if not catalog.is_known(self.model):
                raise ValueError(f"job {self.name}: model {self.model!r} is not in the catalog, "
                                 "so its per-role demands must be given")
            prof = catalog.get(self.model)
            if self.worker_demand is None:
                self.worker_demand = prof.worker_demand
            if self.ps_demand is None:
                self.ps_demand = prof.ps_demand
        if self.ps_demand is None:
            self.ps_demand = np.zeros(3)
        if self.prior is None:
            self.prior = prior_curve(self.model, self.arch)

    def demand(self, role: Role) -> np.ndarray:
        return self.ps_demand if role == "ps" else self.worker_demand  # type: ignore[return-value]

    def quota_charge(self, role: Role) -> np.ndarray:
        charge = self.quota_charges.get(role)
        if charge is None:
            d = self.demand(role)
            charge = self.quota_charges[role] = np.array([d[0], d[1], d[2], 0.0, 0.0, 1.0])
        return charge

    @property
    def remaining_epochs(self) -> float:
        return max(0.0, self.total_epochs - self.epochs_done)

    @property
    def uses_ps(self) -> bool:
        return self.arch == "ps"

    @property
    def starting_gang(self) -> tuple[int, int]:
        """(ps, workers) a job holding nothing starts with: its minimums, at least one of each
        role it uses (tasks are admitted together)."""
        return (max(self.min_ps, 1) if self.uses_ps else 0), max(self.min_workers, 1)

    def bounds(self, role: Role) -> tuple[int, int]:
        if role == "ps":
            return (0, 0) if not self.uses_ps else (self.min_ps, self.max_ps)
        return self.min_workers, self.max_workers

    def node_filter(self, role: Role) -> np.ndarray | None:
        return self.node_filters.get(role) if self.node_filters else None

    def takes(self, role: Role) -> tuple[tuple[str, float], ...]:
        """What one task of `role` takes of the counted resources (`counted`)."""
        return self.counted.get(role, ()) if self.counted else ()

    def holds(self, role: Role) -> frozenset:
        """The tokens one task of `role` holds on its node alone (`exclusive`)."""
        return self.exclusive.get(role, _NOTHING) if self.exclusive else _NOTHING


@dataclass
class Snapshot:
    """The cluster at a decision point: nodes, their capacities and the active jobs."""

    time_s: float
    interval_s: float
    node_names: list[str]
    capacity: np.ndarray  # (N, 3) cpu, gpu, mem_gib
    jobs: list[JobView]  # arrival order
    node_pools: list[str] | None = None  # pool label per node, for grouping
    # Pools whose nodes' compute (cpu, gpu) is time-shared by this many jobs (PoolPlan.shares)
    pool_shares: dict[str, int] | None = None
    # Which of (cpu, gpu, mem_gib) time-sharing divides. The simulator divides both compute
    # resources; the operator only CPU (a GPU request is whole: co-location on GPUs relies on
    # the device plugin's time-slicing advertising several nvidia.com/gpu per GPU).
    divisible: tuple[int, ...] = (0, 1)
    # What the round may book in all, per resource (cpu, gpu, mem_gib; inf where unlimited):
    # in the cluster, what the namespace's ResourceQuotas leave its decided jobs. None: no cap.
    budget: np.ndarray | None = None
    # Per node, the tokens (JobView.exclusive) held there by what the round does not
    # re-decide (other workloads' pods and their host ports). None: none anywhere.
    exclusive_in_use: list[frozenset] | None = None
    # Per topology key that some Spread uses, each node's domain index (-1: the node lacks it).
    topology: dict[str, np.ndarray] = field(default_factory=dict)
    # Per Spread.token, the tasks already counted in each domain that the round does not
    # decide (in the cluster, matching pods of other workloads and jobs): where the ledger's
    # counts start. A token absent starts from none.
    spread_held: dict[Hashable, np.ndarray] = field(default_factory=dict)
    # Per resource counted beside CPU, GPU and memory (JobView.counted), how much of it each
    # node has free for the round: in the cluster, its allocatable pods and extended resources
    # less what pods the round does not re-decide use (controller/admission/counted_resources.py).
    counted_free: dict[str, np.ndarray] = field(default_factory=dict)
    # Per node, the type of its GPUs (workloads/gpu_types.py: "v100", "p100", "k80"); a job's
    # workers run at the pace of the slowest type among their nodes. None (or a node's None):
    # untyped, the homogeneous default, where every GPU is the same. In the cluster, from a
    # node label (nvidia.com/gpu.product).
    gpu_types: Sequence[str | None] | None = None
    # Per node, its GPUs as people read them, for status only (policies read gpu_types): the
    # type, or where the table knows none the label's value (an A100's product name). None:
    # no node says.
    gpu_names: Sequence[str | None] | None = None

    def __post_init__(self) -> None:
        self.capacity = np.asarray(self.capacity, dtype=np.float64)
        if self.capacity.ndim != 2 or self.capacity.shape[0] != len(self.node_names):
            raise ValueError("capacity must be an (N, 3) array with one row per node")
        if self.gpu_types is not None and len(self.gpu_types) != len(self.node_names):
            raise ValueError("gpu_types must have one entry per node")

    @property
    def typed(self) -> bool:
        """Whether any node has a GPU type (else every GPU is the same)."""
        return self.gpu_types is not None and any(t is not None for t in self.gpu_types)

    def gpu_type(self, node: int) -> str | None:
        return self.gpu_types[node] if self.gpu_types is not None else None

    @property
    def total_capacity(self) -> np.ndarray:
        return self.capacity.sum(axis=0)


#: The pool of jobs a grouping holds back: no node belongs to it, so they get no tasks.
WAITING_POOL = "mlsched-waiting"


def shared_demand(demand: np.ndarray, share: int,
                  divisible: tuple[int, ...] = (0, 1)) -> np.ndarray:
    """A task's request in a pool whose compute `share` jobs time-share: compute / share,
    memory whole (co-located jobs' data and models stay in memory). `divisible`: which
    resources are divided (Snapshot.divisible)."""
    if share <= 1:
        return demand
    out = np.array(demand, dtype=float, copy=True)
    out[list(divisible)] /= share
    return out


@dataclass(frozen=True)
class PoolForecast:
    """What a grouping policy predicts for one pool (docs/grouping.md): for display."""

    iteration_s: float  # the group's iteration time (Harmony eq. 1)
    cpu_util: float  # Σ compute / iteration time
    net_util: float  # Σ communication / iteration time
    jobs: int
    nodes: int


@dataclass(frozen=True)
class PoolPlan:
    """The grouping phase's answer: which pool each job and each node belongs to.

    A job absent from `job_pools` (or with pool None) may use every node; a node whose entry
    in `node_pools` is None belongs to no pool. `PoolPlan()` is one shared cluster.

    Co-location (docs/grouping.md): a pool in `shares` has its nodes' compute (cpu, gpu)
    time-shared by up to that many jobs, so each member's tasks request 1/share of their
    compute (memory is never shared); `coordinated` says the members interleave their compute
    and communication phases (Harmony's subtasks) instead of contending freely. The rest
    describes the decision for display: per-pool forecasts, the predicted gain of the chosen
    grouping over keeping the previous one, whether this plan regrouped and whom it moved."""

    job_pools: dict[str, str] = field(default_factory=dict)
    node_pools: tuple[str | None, ...] | None = None  # one entry per snapshot node, or None
    shares: dict[str, int] = field(default_factory=dict)
    coordinated: bool = False
    forecasts: dict[str, PoolForecast] = field(default_factory=dict)
    predicted_gain: float = 0.0  # relative, e.g. 0.07 = 7 % better than keeping the groups
    regrouped: bool = False
    moved: tuple[str, ...] = ()  # running jobs this plan moves to another pool

    @property
    def is_shared(self) -> bool:
        return not self.job_pools

    @property
    def timeshared(self) -> bool:
        return bool(self.shares)

    def share_of(self, job_pool: str | None) -> int:
        return self.shares.get(job_pool, 1) if job_pool is not None else 1


@dataclass
class JobDecision:
    ps_nodes: list[int] = field(default_factory=list)
    worker_nodes: list[int] = field(default_factory=list)

    @property
    def ps(self) -> int:
        return len(self.ps_nodes)

    @property
    def workers(self) -> int:
        return len(self.worker_nodes)


@dataclass
class Decision:
    """Counts and node of every task, per job. Jobs absent from `jobs` get nothing this round."""

    jobs: dict[str, JobDecision]
    inferences: int = 0  # how many single-task decisions were made (for throughput figures)
    pools: PoolPlan = field(default_factory=PoolPlan)
    # Tasks the allocation phase granted that the placement phase could not place (per job):
    # a learned placement may pack differently from the fit checks allocation asked.
    unplaced: dict[str, int] = field(default_factory=dict)
    # Jobs the cycle guard kept at their counts (policies/cycle_guard.py): name -> ((ps,
    # workers) kept, (ps, workers) the policy decided, back to counts it held before).
    kept: dict[str, tuple[tuple[int, int], tuple[int, int]]] = field(default_factory=dict)

    def counts(self, name: str) -> tuple[int, int]:
        d = self.jobs.get(name)
        return (d.ps, d.workers) if d else (0, 0)

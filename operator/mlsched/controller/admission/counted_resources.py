"""What a node holds besides CPU, GPU and memory, counted per pod: its pod slots and its
extended resources. Pure.

kube-scheduler refuses a pod on a node whose allocatable `pods` are taken ("Too many pods")
or that has too little left of an extended resource the pod requests ("Insufficient
example.com/nic"): a device plugin's RDMA NICs (`rdma/hca`, `vpc.amazonaws.com/efa`), MIG
slices (`nvidia.com/mig-1g.10gb`), and the node-local `ephemeral-storage` and
`hugepages-<size>` (quantities.is_extended). Pod slots are few on some clouds: EKS with the VPC
CNI allows 17 pods on a t3.medium and 29 on an m5.large, DaemonSets included.

Planning used to check only that a node had enough of an extended resource for one pod, and
pod slots not at all: bin-packing put eight workers asking one `example.com/nic` each on a
node with two, kube-scheduler refused six, and displacement moved them three times before all
ran; a job of twelve half-CPU workers was admitted with nodes' pod slots for ten, ten pods ran
and held their nodes while two stayed Pending for good, so the gang never trained.

So a round counts them like CPU: `Snapshot.counted_free` per node (the node's allocatable less
what the pods the round does not re-decide use: other workloads' pods, other jobs' and
strays', and the tasks other policies decided, by their decided nodes, before their pods
exist: cluster_state.other_tasks), `JobView.counted` per role, and the ledger books every task's
share. Only the extended
resources some decided job requests are counted, and pod slots only where they could run out
before CPU, GPU or memory do (a node's free slots fewer than the tasks its free capacity could
hold), so a round on nodes with room for every pod costs nothing more.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np

from mlsched.controller.objects.desired import roles_of
from mlsched.controller.constraints.node_constraints import DEVICE_PREFIX, resource_text
from mlsched.controller.objects.records import NodeRecord
from mlsched.controller.objects.job_records import JobRecord

#: The counted resource every pod takes one of: the node's allocatable `pods`.
POD_SLOTS = "pods"

Counted = tuple[tuple[str, float], ...]  # (resource, amount one pod takes)
JobKey = tuple[str, str]


def extended_of(job: JobRecord, role: str) -> Counted:
    """The extended resources one pod of `role` requests (LimitRange defaults applied)."""
    constraint = job.node_constraints.get(role)
    return constraint.resources if constraint is not None else ()


def available(node: NodeRecord, name: str) -> float:
    """The node's allocatable amount of a counted resource."""
    return node.pods if name == POD_SLOTS else node.extended.get(name, 0.0)


class CountedResources:
    """The counted resources of one round: what each node has free, and what each decided
    job's tasks take, per role (see the module docstring)."""

    def __init__(self, jobs: Sequence[JobRecord], nodes: Sequence[NodeRecord],
                 capacity: np.ndarray, used: Mapping[str, Mapping[str, float]] | None):
        """`capacity`: (N, 3) CPU, GPU and memory free for the round on `nodes`; `used`: per
        node, what pods the round does not re-decide take (cluster_state.held_counted)."""
        used = used or {}
        demands: set[tuple[float, float, float]] = set()  # distinct: a round has a handful
        self.takes: dict[JobKey, dict[str, Counted]] = {}
        for job in jobs:
            for role in roles_of(job):
                demands.add(job.demands.get(role, (0.0, 0.0, 0.0)))
                extended = extended_of(job, role)
                if extended:
                    self.takes.setdefault(job.key, {})[role] = extended
        names = sorted({name for roles in self.takes.values() for taken in roles.values()
                        for name, _ in taken})
        self.free: dict[str, np.ndarray] = {name: self._free(nodes, used, name) for name in names}
        slots = self._free(nodes, used, POD_SLOTS)
        self.counts_pods = slots_could_run_out(slots, capacity, demands)
        if self.counts_pods:
            self.free[POD_SLOTS] = slots
            for job in jobs:
                roles = self.takes.setdefault(job.key, {})
                for role in roles_of(job):
                    roles[role] = roles.get(role, ()) + ((POD_SLOTS, 1.0),)

    @staticmethod
    def _free(nodes: Sequence[NodeRecord], used: Mapping[str, Mapping[str, float]],
              name: str) -> np.ndarray:
        free = np.array([available(n, name) - used.get(n.name, {}).get(name, 0.0) for n in nodes],
                        dtype=float)
        return np.maximum(free, 0.0)


def slots_could_run_out(slots: np.ndarray, capacity: np.ndarray,
                        demands: Collection[tuple[float, float, float]]) -> bool:
    """Whether some node's free pod slots are fewer than the tasks its free CPU, GPU and memory
    could hold, judged by the smallest request of each resource among the round's `demands`
    (one pod's CPU, GPU, memory; a resource some pod does not request bounds nothing)."""
    if not demands or not len(slots):
        return False
    smallest = np.array(list(demands), dtype=float).reshape(-1, 3).min(axis=0)
    most = np.full(len(slots), np.inf)
    for r, d in enumerate(smallest):
        if d > 0:
            most = np.minimum(most, np.floor(capacity[:, r] / d + 1e-9))
    return bool((slots < most).any())


def pods_room(free: float | np.ndarray, amount: float) -> float | np.ndarray:
    """How many pods taking `amount` each fit in `free` (inf stays inf: no limit reported)."""
    return np.floor(np.asarray(free, dtype=float) / amount + 1e-9)


def describe(name: str, amount: float) -> str:
    """One pod's take of a counted resource, for messages: "1 pod slot", "1 example.com/nic",
    "1 gpu.example.com device"."""
    if name == POD_SLOTS:
        return f"{amount:g} pod slot{'' if amount == 1 else 's'}"
    return resource_text(name, amount)


def source(name: str) -> str:
    """Where a node's amount of a counted resource comes from, for messages."""
    if name.startswith(DEVICE_PREFIX):
        return f"the {name[len(DEVICE_PREFIX):]} devices their ResourceSlices publish"
    return f"allocatable {name}"

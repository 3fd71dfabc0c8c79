"""Fair sharing of GPUs between the SchedulingPolicies that draw on the same nodes
(docs/operator.md, "Fair sharing between policies").

Each policy plans its own jobs, one after another (loop.py): without a bound the first to run
booked every free GPU and the others' jobs waited for as long as its jobs had use for more.
Now, while the policies' jobs together want more GPUs than the nodes have (contention), each
policy's steps book at most its *entitlement*, computed anew at every step by water-filling:

- every policy with demand gets `level × weight`, where the level is the highest at which
  everything handed out still fits the capacity;
- no policy gets more than its demand (its jobs, each at its `max`), so what one leaves idle
  goes to the others (borrowing);
- no policy gets less than its floor (the minimums of its jobs that already run), so a policy
  that borrowed gives back at its next round by shrinking its jobs through the usual rescale,
  never by stopping one below its minimum;
- policies of weight 0 get their floor, and borrow only what the weighted ones leave.

The entitlement is one more bound on what a step may book, beside the namespace's
ResourceQuotas (quotas.Budget, the GPU request dimension): so the planners need not know about
it. With one policy, or while the demand fits, there is no bound at all.

Capacity is counted over the nodes the operator places on (Ready, not cordoned, within its
node selector), less what pods outside the contending policies' jobs request. Demand counts
only jobs that can be scheduled now. Everything here but `entitlement` is pure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from mlsched.controller.admission import quotas
from mlsched.controller.objects.records import NodeRecord
from mlsched.controller.objects.job_records import JobRecord
from mlsched.controller.objects.quantities import QUOTA_DIMS
from mlsched.controller.scheduling.cluster_state import ClusterState, held_elsewhere, usable

K = TypeVar("K")
PolicyKey = tuple[str, str]
GPU = 1  # the GPU request's place in a Resources tuple and in a quota block (QUOTA_DIMS)
DEFAULT_WEIGHT = 1.0
_SEARCH_STEPS = 64  # bisection of the level: far below a GPU's fraction at any cluster size


@dataclass(frozen=True)
class Claim:
    """One policy's standing: its weight, what its jobs could use at most, and what its
    running jobs' minimums hold (never taken from it)."""
    weight: float
    demand: float
    floor: float = 0.0


@dataclass(frozen=True)
class Entitlement:
    """A policy's share of contended GPUs, as a step plans with it and its status shows it."""
    gpus: float  # the most its jobs may book in all
    capacity: float  # the GPUs the contending policies share
    demand: float  # what its jobs could use at most
    weight: float
    contenders: int  # policies with demand, itself included


def weight_of(spec: Mapping[str, Any] | None) -> float:
    """spec.fairSharing.weight, or the default where it is missing or not a number ≥ 0 (the
    API server refuses those; an object stored before the field existed has none)."""
    found = ((spec or {}).get("fairSharing") or {}).get("weight", DEFAULT_WEIGHT)
    if isinstance(found, bool) or not isinstance(found, (int, float)) or not found >= 0:
        return DEFAULT_WEIGHT
    return float(found)


def weights(index: Mapping[PolicyKey, Iterable[Any]]) -> dict[PolicyKey, float]:
    """Each policy's weight from the policy index (handlers.policy_index keeps the weight; a
    value that is not a number counts as the default)."""
    out = {}
    for key, found in index.items():
        value = next(iter(found), None)
        out[key] = (float(value) if isinstance(value, (int, float)) and not isinstance(value, bool)
                    and value >= 0 else DEFAULT_WEIGHT)
    return out


def water_fill(capacity: float, claims: Mapping[K, Claim]) -> dict[K, float]:
    """Each claim's share of `capacity` (see the module docstring). Floors first (all of them,
    even beyond capacity: a running minimum is never taken away here); then weighted shares;
    then what the weighted claims leave to those of weight 0, equally."""
    floors = {k: min(c.floor, c.demand) for k, c in claims.items()}
    left = capacity - sum(floors.values())
    if left <= 0:
        return floors
    weighted = {k: c for k, c in claims.items() if c.weight > 0}
    shares = _fill(left + sum(floors[k] for k in weighted), weighted, floors)
    rest = {k: Claim(1.0, c.demand, c.floor) for k, c in claims.items() if c.weight <= 0}
    left = capacity - sum(shares.values()) - sum(floors[k] for k in rest)
    shares.update(_fill(left + sum(floors[k] for k in rest), rest, floors))
    return shares


def _fill(capacity: float, claims: Mapping[K, Claim], floors: Mapping[K, float]) -> dict[K, float]:
    def share(k: K, c: Claim, level: float) -> float:
        return min(c.demand, max(floors[k], level * c.weight))

    if not claims:
        return {}
    top = max(c.demand / c.weight for c in claims.values())
    if sum(c.demand for c in claims.values()) <= capacity:
        return {k: c.demand for k, c in claims.items()}
    low, high = 0.0, top  # total(low) <= capacity < total(high)
    for _ in range(_SEARCH_STEPS):
        mid = (low + high) / 2
        if sum(share(k, c, mid) for k, c in claims.items()) <= capacity:
            low = mid
        else:
            high = mid
    return {k: share(k, c, low) for k, c in claims.items()}


def gpus_at_most(job: JobRecord) -> float:
    """The GPUs `job` requests with every role at its max."""
    return sum(job.bounds(role)[1] * job.demands.get(role, (0.0, 0.0, 0.0))[GPU]
               for role in ("ps", "worker"))


def gpus_at_least(job: JobRecord) -> float:
    return job.minimum_requests()[GPU]


def claims(jobs: Iterable[JobRecord], weights: Mapping[PolicyKey, float],
           running: set[tuple[str, str]]) -> dict[PolicyKey, Claim]:
    """Per policy of `weights` (the policies there are), the claim of its schedulable jobs;
    `running`: the jobs that hold tasks now, whose minimums are their policy's floor."""
    demand: dict[PolicyKey, float] = {}
    floor: dict[PolicyKey, float] = {}
    for job in jobs:
        key = (job.namespace, job.policy)
        if key not in weights or not job.schedulable:
            continue
        demand[key] = demand.get(key, 0.0) + gpus_at_most(job)
        if job.key in running:
            floor[key] = floor.get(key, 0.0) + gpus_at_least(job)
    return {key: Claim(weights[key], d, floor.get(key, 0.0))
            for key, d in demand.items() if d > 0}


def capacity(cluster: ClusterState, node_selector: Mapping[str, str],
             contending: set[tuple[str, str]]) -> float:
    """The GPUs of the nodes the operator places on, less what every pod but those of the
    `contending` jobs requests (other workloads, jobs of no policy here, a deleted job's
    pods still going)."""
    nodes: list[NodeRecord] = [n for n in cluster.nodes if usable(n, node_selector)]
    held = held_elsewhere(cluster, contending, {})
    return sum(max(n.allocatable[GPU] - held.get(n.name, (0.0, 0.0, 0.0))[GPU], 0.0)
               for n in nodes)


def entitlement(key: PolicyKey, jobs: list[JobRecord], weights: Mapping[PolicyKey, float],
                running: set[tuple[str, str]], cluster: ClusterState,
                node_selector: Mapping[str, str]) -> Entitlement | None:
    """Policy `key`'s entitlement now; None when nothing bounds it: it has no GPU demand, it
    is the only policy with any, or all of their demand fits."""
    if len(weights) < 2:
        return None  # one policy (the usual install): nothing to share, nothing to scan
    found = claims(jobs, weights, running)
    if key not in found or len(found) < 2:
        return None
    contending = {j.key for j in jobs if (j.namespace, j.policy) in found}
    total = capacity(cluster, node_selector, contending)
    if sum(c.demand for c in found.values()) <= total:
        return None
    shares = water_fill(total, found)
    mine = found[key]
    return Entitlement(shares[key], total, mine.demand, mine.weight, len(found))


def bounded(budget: quotas.Budget | None, share: Entitlement | None) -> quotas.Budget | None:
    """`budget` (the quotas', or None) with the entitlement as one more bound on the GPUs
    requested, in the block that counts every pod."""
    if share is None:
        return budget
    if budget is None:
        amounts = np.full(QUOTA_DIMS, np.inf)
        amounts[GPU] = share.gpus
        return quotas.Budget(amounts)
    amounts = budget.amounts.copy()
    amounts[GPU] = min(amounts[GPU], share.gpus)
    return quotas.Budget(amounts, budget.counted, budget.scopes, budget.default_priority)


def describe(share: Entitlement) -> str:
    """How a waiting job's message and the policy's status say it."""
    return (f"its policy's fair share is {_gpus(share.gpus)} of the {_gpus(share.capacity)} GPUs "
            f"{share.contenders} policies contend for (weight {share.weight:g})")


def _gpus(value: float) -> str:
    return f"{math.floor(value + 1e-9):d}" if abs(value - round(value)) < 1e-6 else f"{value:.1f}"

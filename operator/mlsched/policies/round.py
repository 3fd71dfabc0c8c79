"""One scheduling round: grouping -> allocation -> placement, a pure function of a snapshot.

The snapshot a caller passes is never changed: the grouping phase's pools are applied to
copies of the job views, the phases book tasks in ledgers of their own, and the Decision is
new. Whatever the placement policy returns is checked here against capacity, pools and gang
minimums, so a faulty (or learned) placement can lose tasks but never overcommit a node: a
task that does not fit is dropped, and a job left below its starting gang gets nothing.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import Decision, JobDecision, JobView, PoolPlan, Role, Snapshot
from mlsched.policies.base import (
    AllocationPolicy, GroupingPolicy, PlacementPolicy, PlacementRequest, book_held,
)


def run_round(snapshot: Snapshot, allocation: AllocationPolicy, placement: PlacementPolicy,
              grouping: GroupingPolicy | None = None) -> Decision:
    """The full round: every job's counts and nodes are decided afresh."""
    plan = grouping.group(snapshot) if grouping is not None else PoolPlan()
    return _decide(with_pools(snapshot, plan), plan, allocation, placement, held=[])


def run_admission(snapshot: Snapshot, allocation: AllocationPolicy, placement: PlacementPolicy,
                  grouping: GroupingPolicy | None = None) -> Decision:
    """Admission between rounds (policies/base.py): jobs holding no task are decided by the
    same policies, with every running job held at its current counts and nodes. The Decision
    lists every job that has tasks afterwards, the held ones unchanged."""
    plan = grouping.group(snapshot) if grouping is not None else PoolPlan()
    view = with_pools(snapshot, plan)
    running = [j for j in view.jobs if j.workers > 0 and len(j.worker_nodes) == j.workers
               and len(j.ps_nodes) == j.ps]
    held = [(j, JobDecision(list(j.ps_nodes), list(j.worker_nodes))) for j in running]
    names = {j.name for j in running}
    waiting = Snapshot(view.time_s, view.interval_s, view.node_names, view.capacity,
                       [j for j in view.jobs if j.name not in names], view.node_pools)
    decision = _decide(waiting, plan, allocation, placement, held=held)
    decision.jobs.update({j.name: d for j, d in held})
    return decision


def _decide(view: Snapshot, plan: PoolPlan, allocation: AllocationPolicy,
            placement: PlacementPolicy, held: list[tuple[JobView, JobDecision]]) -> Decision:
    ledger = Ledger(view, placement, plan)
    book_held(ledger, held)
    allocation.allocate(view, ledger)
    held_names = {j.name for j, _ in held}
    tentative = {name: d for name, d in ledger.jobs.items() if name not in held_names}
    counts = {name: (d.ps, d.workers) for name, d in tentative.items()}
    request = PlacementRequest(view, plan, counts, ledger.grants, held, tentative, placement)
    placed = placement.place(request)
    if placed is tentative:  # booked through the ledger, so capacity, pools and gangs hold
        return Decision(jobs=tentative, inferences=ledger.inferences, pools=plan)
    jobs, unplaced = checked(request, placed)
    return Decision(jobs=jobs, inferences=ledger.inferences, pools=plan, unplaced=unplaced)


def with_pools(snapshot: Snapshot, plan: PoolPlan) -> Snapshot:
    """The snapshot the allocation and placement phases see: job views carry their pool."""
    if plan.is_shared and all(j.pool is None for j in snapshot.jobs):
        jobs = list(snapshot.jobs)  # nothing to copy: the views are read, never written
    else:
        jobs = [dataclasses.replace(j, pool=plan.job_pools.get(j.name)) for j in snapshot.jobs]
    node_pools = list(plan.node_pools) if plan.node_pools is not None else snapshot.node_pools
    return Snapshot(snapshot.time_s, snapshot.interval_s, snapshot.node_names, snapshot.capacity,
                    jobs, node_pools)


class _NoPlacer:
    def choose_node(self, ledger, job, role, demand):  # pragma: no cover - never asked
        return None


def checked(request: PlacementRequest,
            placed: dict[str, JobDecision]) -> tuple[dict[str, JobDecision], dict[str, int]]:
    """Book the placement task by task; keep what fits, drop what does not (see module doc)."""
    view = request.snapshot
    ledger = Ledger(view, _NoPlacer(), request.pools)
    book_held(ledger, request.held)
    jobs = {j.name: j for j in view.jobs}
    n_nodes = len(view.node_names)
    out: dict[str, JobDecision] = {}
    unplaced: dict[str, int] = {}
    for name, (ps, workers) in request.counts.items():
        job = jobs[name]
        d = placed.get(name) or JobDecision()
        kept = JobDecision()
        for role, nodes, want in (("ps", d.ps_nodes, ps), ("worker", d.worker_nodes, workers)):
            for node in list(nodes)[:want]:
                demand = job.demand(role)  # type: ignore[arg-type]
                if 0 <= node < n_nodes and ledger.fits_on(demand, node, job):
                    ledger.book(job, role, node, demand)  # type: ignore[arg-type]
                    (kept.ps_nodes if role == "ps" else kept.worker_nodes).append(int(node))
        short = ps + workers - kept.ps - kept.workers
        if short:
            unplaced[name] = short
        if kept.ps + kept.workers == 0:
            continue
        if not _meets_gang(job, kept):
            _release(ledger, job, kept)
            unplaced[name] = ps + workers
            continue
        out[name] = kept
    return out, unplaced


def _meets_gang(job: JobView, d: JobDecision) -> bool:
    min_ps = max(job.min_ps, 1) if job.uses_ps else 0
    return d.workers >= max(job.min_workers, 1) and d.ps >= min_ps


def _release(ledger: Ledger, job: JobView, d: JobDecision) -> None:
    roles: list[tuple[Role, int]] = [("ps", n) for n in d.ps_nodes] + [("worker", n) for n in d.worker_nodes]
    ledger.release(job, roles)

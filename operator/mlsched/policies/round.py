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
from mlsched.cluster.types import (
    WAITING_POOL, Decision, JobDecision, JobView, PoolPlan, Role, Snapshot, shared_demand,
)
from mlsched.policies.base import (
    AllocationPolicy, GroupingPolicy, PlacementPolicy, PlacementRequest, book_held,
)


def run_round(snapshot: Snapshot, allocation: AllocationPolicy, placement: PlacementPolicy,
              grouping: GroupingPolicy | None = None) -> Decision:
    """The full round: every job's counts and nodes are decided afresh."""
    if not snapshot.node_names:
        # No node to use (every node cordoned, not Ready, or outside the operator's node
        # selector): nobody gets anything, and the phases, whose arithmetic (least-loaded
        # node, mean node, argmax over nodes) assumes a node, are not asked.
        return Decision(jobs={})
    plan = grouping.group(snapshot) if grouping is not None else PoolPlan()
    return _decide(with_pools(snapshot, plan), plan, allocation, placement, held=[])


#: How many times a settled round may decide again on what it decided (run_settled_round).
SETTLE_PASSES = 6


def run_served_round(snapshot: Snapshot, allocation: AllocationPolicy, placement: PlacementPolicy,
                     grouping: GroupingPolicy | None = None, guard=None) -> Decision:
    """A round as the operator runs it: settled (run_settled_round) where `settles` says,
    else run_round, through `guard` (a cycle_guard.CycleGuard kept across rounds) when given:
    a round that cannot be settled is kept from sending a job back to counts it just left."""
    if settles(allocation, placement, grouping):
        return run_settled_round(snapshot, allocation, placement)
    decision = run_round(snapshot, allocation, placement, grouping)
    return guard.apply(snapshot, decision) if guard is not None else decision


def settles(allocation: AllocationPolicy, placement: PlacementPolicy,
            grouping: GroupingPolicy | None) -> bool:
    """Whether the operator runs this policy's rounds settled: heuristic phases and no
    grouping. A learned phase would infer (explore, and record its decisions) once per pass
    (DL² mostly settles by itself, though on some bursts it flipped a few jobs every round:
    the rounds not settled go through a cycle guard, cycle_guard.py, docs/e2e.md);
    a grouping keeps its own state across rounds (a pool's minimum stay, the regrouping
    threshold)."""
    return ((grouping is None or grouping.name == "none")
            and not allocation.learned and not placement.learned)


def run_settled_round(snapshot: Snapshot, allocation: AllocationPolicy,
                      placement: PlacementPolicy, passes: int = SETTLE_PASSES) -> Decision:
    """run_round, then run_round again on the cluster as it decided, until a decision keeps
    every task where its input had it (at most `passes` more decisions): the decision the
    policy would reach over its next rounds, taken now, without the restarts between.

    A heuristic round with sticky placement is not always its own fixed point: sticky sends
    kept tasks home after the allocation's fill (sticky.py), into a layout the next round's
    fill, task by task, does not reproduce, so its fits and grants differ. After a burst of
    arrivals DRF shrank jobs in one round and grew them back in the next, and moved kept
    tasks, for four rounds (2,000 jobs on 1,000 nodes: 911 jobs changed over five rounds,
    852 when the first round is settled; bench_settling.py). A round whose decision keeps
    every task where it was (a steady one) costs no second decision: deciding again on the
    same input decides the same. The simulator decides so too (SimConfig.served_round, the
    default since 30 Nov 2026)."""
    view, decision = snapshot, run_round(snapshot, allocation, placement)
    for _ in range(passes):
        if _layout(decision) == _held(view):
            break
        view = as_decided(view, decision)
        decision = run_round(view, allocation, placement)
    return decision


def as_decided(snapshot: Snapshot, decision: Decision) -> Snapshot:
    """The snapshot with each job holding what `decision` gave it, where it gave it (what
    the next round's snapshot shows once the decision runs)."""
    jobs = [_holding(j, d.ps_nodes, d.worker_nodes) if (d := decision.jobs.get(j.name))
            else _emptied(j) for j in snapshot.jobs]
    return dataclasses.replace(snapshot, jobs=jobs)


def _holding(job: JobView, ps_nodes, worker_nodes) -> JobView:
    """The job's view holding these tasks (node index by ordinal, per role)."""
    return dataclasses.replace(job, ps=len(ps_nodes), workers=len(worker_nodes),
                               ps_nodes=tuple(ps_nodes), worker_nodes=tuple(worker_nodes))


def _layout(decision: Decision) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """Each job given tasks: its nodes per role, by ordinal."""
    return _layout_of(decision.jobs)


def _layout_of(jobs: dict[str, JobDecision]) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """_layout of these jobs' decisions."""
    return _by_job((name, d.ps_nodes, d.worker_nodes) for name, d in jobs.items())


def _held(snapshot: Snapshot) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """_layout of what the snapshot's jobs hold."""
    return _by_job((j.name, j.ps_nodes, j.worker_nodes) for j in snapshot.jobs)


def _by_job(jobs) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    return {name: (tuple(ps), tuple(workers)) for name, ps, workers in jobs if ps or workers}


#: Per displaced job, per role: the decided node index of each ordinal, None for a task to
#: place again (controller/scheduling/displacement.py).
Slots = dict[str, tuple[int | None, ...]]


def run_admission(snapshot: Snapshot, allocation: AllocationPolicy, placement: PlacementPolicy,
                  grouping: GroupingPolicy | None = None,
                  displaced: dict[str, Slots] | None = None,
                  avoid: dict[str, dict[str, frozenset[int]]] | None = None) -> Decision:
    """Admission between rounds (policies/base.py): jobs holding no task are decided by the
    same policies, with every running job held at its current counts and nodes. The Decision
    lists every job that has tasks afterwards, the held ones unchanged.

    `displaced` jobs lost some tasks' nodes: those tasks are placed again first (`_restore`),
    never on the nodes `avoid` lists for their role, and a job that cannot get back its
    starting gang waits with the others."""
    if not snapshot.node_names:
        return Decision(jobs={})  # no node to use: see run_round
    plan = grouping.group(snapshot) if grouping is not None else PoolPlan()
    if not plan.is_shared or snapshot.node_pools is not None:
        plan = admissible(snapshot, plan)
    view = with_pools(snapshot, plan)
    displaced = displaced or {}
    running = [j for j in view.jobs if _running(j) and j.name not in displaced]
    held = [(j, JobDecision(list(j.ps_nodes), list(j.worker_nodes))) for j in running]
    restored: list[tuple[JobView, JobDecision]] = []
    released: set[str] = set()
    if displaced:  # (a restore's ledger books every held task: none to restore, no ledger)
        restored, released = _restore(view, plan, placement, held,
                                      [j for j in view.jobs if j.name in displaced], displaced,
                                      avoid or {})
    held += restored
    names = {j.name for j, _ in held}
    waiting = dataclasses.replace(view, jobs=[_emptied(j) if j.name in released else j
                                              for j in view.jobs if j.name not in names])
    decision = _decide(waiting, plan, allocation, placement, held=held)
    decision.jobs.update({j.name: d for j, d in held})
    return decision


def _restore(view: Snapshot, plan: PoolPlan, placement: PlacementPolicy,
             held: list[tuple[JobView, JobDecision]], jobs: list[JobView],
             displaced: dict[str, Slots], avoid: dict[str, dict[str, frozenset[int]]],
             ) -> tuple[list[tuple[JobView, JobDecision]], set[str]]:
    """Displaced jobs, in arrival order, before any waiting job: their kept tasks are booked
    where they are, the others placed again one at a time by the placement policy's rule up to
    the decided count (fewer if capacity is short). A new node takes the ordinal of the task
    it replaces, so no kept task moves unless the job shrank. Returns the jobs held as
    restored and the names of those left below their starting gang (released: they wait)."""
    ledger = Ledger(view, placement, plan)
    book_held(ledger, held)
    restored: list[tuple[JobView, JobDecision]] = []
    released: set[str] = set()
    for job in sorted(jobs, key=lambda j: (j.arrival_s, j.name)):
        slots = displaced[job.name]
        kept = {role: [n for n in slots.get(role, ()) if n is not None] for role in ("ps", "worker")}
        job = _holding(job, kept["ps"], kept["worker"])
        book_held(ledger, [(job, JobDecision(list(kept["ps"]), list(kept["worker"])))])
        grower = _avoiding(job, avoid.get(job.name) or {}, len(view.node_names))
        for role in ("ps", "worker"):
            want = len(slots.get(role, ()))
            while ledger.count(job, role) < want and ledger.grow(grower, role):  # type: ignore[arg-type]
                pass
        got = ledger.jobs.get(job.name) or JobDecision()
        if not _meets_gang(job, got):
            _release(ledger, job, got)
            released.add(job.name)
            continue
        decision = JobDecision(
            _by_ordinal(slots.get("ps", ()), got.ps_nodes[len(kept["ps"]):], got.ps),
            _by_ordinal(slots.get("worker", ()), got.worker_nodes[len(kept["worker"]):],
                        got.workers))
        restored.append((_holding(job, decision.ps_nodes, decision.worker_nodes), decision))
    return restored, released


def _avoiding(job: JobView, avoid: dict[str, frozenset[int]], n_nodes: int) -> JobView:
    """The job with the `avoid` nodes taken out of its roles' node filters: what its new tasks
    may use (its kept tasks are booked where they are, whatever the filter)."""
    if not avoid:
        return job
    filters = dict(job.node_filters or {})
    for role, nodes in avoid.items():
        base = filters.get(role)  # type: ignore[call-overload]
        mask = np.ones(n_nodes, dtype=bool) if base is None else base.copy()
        mask[sorted(nodes)] = False
        filters[role] = mask  # type: ignore[index]
    return dataclasses.replace(job, node_filters=filters)


def _by_ordinal(slots: tuple[int | None, ...], new: list[int], count: int) -> list[int]:
    """The nodes of ordinals 0..count-1: each kept task's node at its ordinal, the new nodes
    in the holes; when fewer tasks than decided fit, the kept nodes of the ordinals beyond the
    new count fill the remaining holes (the StatefulSet removes the highest ordinals)."""
    spare = list(new) + [n for n in slots[count:] if n is not None]
    out = []
    for k in range(count):
        node = slots[k] if k < len(slots) else None
        out.append(node if node is not None else spare.pop(0))
    return out


def _emptied(j: JobView) -> JobView:
    return _holding(j, (), ())


def _running(j: JobView) -> bool:
    return j.workers > 0 and len(j.worker_nodes) == j.workers and len(j.ps_nodes) == j.ps


def admissible(snapshot: Snapshot, plan: PoolPlan) -> PoolPlan:
    """The plan an admission step may use. Admission holds running jobs where they are, so a
    plan that moves a running job, relabels a node holding one, or changes a pool's share
    under one waits for the next full round: until then the pools in force stay (the
    snapshot's), and jobs with no pool in them wait."""
    now = snapshot.node_pools
    shares_now = snapshot.pool_shares or {}
    ok = True
    for j in snapshot.jobs:
        if not _running(j):
            continue
        pool = plan.job_pools.get(j.name)
        share_now = shares_now.get(pool, 1) if pool is not None else 1
        if pool != j.pool or plan.share_of(pool) != share_now:
            ok = False
            break
        nodes = (*j.ps_nodes, *j.worker_nodes)
        if any(_label(plan.node_pools, n) != _label(now, n) for n in nodes):
            ok = False
            break
    if ok:
        return plan
    if now is None:
        return PoolPlan()
    return PoolPlan({j.name: j.pool or WAITING_POOL for j in snapshot.jobs}, tuple(now),
                    dict(shares_now), plan.coordinated)


def _label(pools, node: int) -> str | None:
    return pools[node] if pools is not None else None


def _decide(view: Snapshot, plan: PoolPlan, allocation: AllocationPolicy,
            placement: PlacementPolicy, held: list[tuple[JobView, JobDecision]]) -> Decision:
    ledger = Ledger(view, placement, plan)
    book_held(ledger, held)
    allocation.allocate(view, ledger)
    held_names = {j.name for j, _ in held}
    tentative = {name: d for name, d in ledger.jobs.items() if name not in held_names}
    counts = {name: (d.ps, d.workers) for name, d in tentative.items()}
    request = PlacementRequest(view, plan, counts, ledger.grants, held, tentative, placement)
    booked = _layout_of(tentative)
    kept = [(j, d, tuple(d.ps_nodes), tuple(d.worker_nodes)) for j, d in held]
    placed = placement.place(request)
    if _put_back(held, kept):
        request.last_checked = None  # (any check it made saw the held tasks elsewhere)
    if placed is tentative and _layout_of(placed) == booked:
        # booked through the ledger, so capacity, pools and gangs hold; a placement that
        # changed it in place (a plugin's place() editing what super().place() returned) is
        # checked as any other layout
        return Decision(jobs=tentative, inferences=ledger.inferences, pools=plan)
    jobs, unplaced = checked(request, placed)
    return Decision(jobs=jobs, inferences=ledger.inferences, pools=plan, unplaced=unplaced)


def _put_back(held: list[tuple[JobView, JobDecision]],
              kept: list[tuple[JobView, JobDecision, tuple[int, ...], tuple[int, ...]]]) -> bool:
    """The held tasks as they were before the placement phase (`kept`), whatever it did to
    them: they are co-tenants, not its to place, and the step's decision lists them as they
    run. True when something had to be put back."""
    changed = len(held) != len(kept) or any(h[1] is not k[1] for h, k in zip(held, kept))
    held[:] = [(j, d) for j, d, _, _ in kept]
    for _, d, ps, workers in kept:
        if tuple(d.ps_nodes) != ps or tuple(d.worker_nodes) != workers:
            d.ps_nodes[:], d.worker_nodes[:] = ps, workers
            changed = True
    return changed


def with_pools(snapshot: Snapshot, plan: PoolPlan) -> Snapshot:
    """The snapshot the allocation and placement phases see: job views carry their pool.

    A pool's nodes are its members': in a plan with pools, a job the plan leaves in none
    (Harmony's `min_members`: a group too small for a pool runs ungrouped) may use only the
    nodes in no pool, as a filter on each of its roles. Else it would take the capacity a
    time-shared pool's members were given (their tasks ask for a share of the compute)."""
    if plan.is_shared and all(j.pool is None for j in snapshot.jobs):
        jobs = list(snapshot.jobs)  # nothing to copy: the views are read, never written
    else:
        jobs = [_in_pool(j, plan, snapshot.divisible) for j in snapshot.jobs]
        if not plan.is_shared and plan.node_pools is not None \
                and any(j.pool is None for j in jobs):
            free = np.array([p is None for p in plan.node_pools], dtype=bool)
            jobs = _off_pools(jobs, free)
    node_pools = list(plan.node_pools) if plan.node_pools is not None else snapshot.node_pools
    shares = dict(plan.shares) if not plan.is_shared else snapshot.pool_shares
    return dataclasses.replace(snapshot, jobs=jobs, node_pools=node_pools,
                               pool_shares=shares or None)


def _off_pools(jobs: list[JobView], free: np.ndarray) -> list[JobView]:
    """The jobs in no pool with each role's node filter narrowed to the `free` nodes. Jobs
    with the same filter share the narrowed array (the ledger and DL²'s state key their
    checks on a filter's identity)."""
    narrowed: dict[int, np.ndarray] = {}

    def narrow(mask: np.ndarray | None) -> np.ndarray:
        if mask is None:
            return free
        found = narrowed.get(id(mask))
        if found is None:
            found = narrowed[id(mask)] = mask & free
        return found

    out = []
    for j in jobs:
        if j.pool is not None:
            out.append(j)
            continue
        roles = ("ps", "worker") if j.uses_ps else ("worker",)
        filters = dict(j.node_filters or {})
        for role in roles:
            filters[role] = narrow(filters.get(role))  # type: ignore[call-overload,index]
        out.append(dataclasses.replace(j, node_filters=filters))
    return out


def _in_pool(j: JobView, plan: PoolPlan, divisible: tuple[int, ...] = (0, 1)) -> JobView:
    """The job in its pool; in a time-shared pool its tasks request a share of the compute."""
    pool = plan.job_pools.get(j.name)
    share = plan.share_of(pool)
    if share <= 1:
        return dataclasses.replace(j, pool=pool)
    return dataclasses.replace(j, pool=pool, ps_demand=shared_demand(j.ps_demand, share, divisible),
                               worker_demand=shared_demand(j.worker_demand, share, divisible))


class _NoPlacer:
    def choose_node(self, ledger, job, role, demand):  # pragma: no cover - never asked
        return None


def checked(request: PlacementRequest,
            placed: dict[str, JobDecision]) -> tuple[dict[str, JobDecision], dict[str, int]]:
    """Book the placement task by task; keep what fits, drop what does not (see module doc).
    The answer for the layout checked last is kept on the request (PlacementRequest.last_checked)
    and given again for the same layout."""
    layout = _layout_of(placed)
    if request.last_checked is not None and request.last_checked[0] == layout:
        return request.last_checked[1]
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
                if 0 <= node < n_nodes and ledger.fits_on(demand, node, job, role):
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
    request.last_checked = layout, (out, unplaced)
    return out, unplaced


def _meets_gang(job: JobView, d: JobDecision) -> bool:
    min_ps, min_w = job.starting_gang
    return d.workers >= min_w and d.ps >= min_ps


def _release(ledger: Ledger, job: JobView, d: JobDecision) -> None:
    roles: list[tuple[Role, int]] = [("ps", n) for n in d.ps_nodes] + [("worker", n) for n in d.worker_nodes]
    ledger.release(job, roles)

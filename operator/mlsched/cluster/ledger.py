"""The capacity ledger of one scheduling round: free capacity per node, kept honest.

A round's phases hand a ledger from one to the next (policies/round.py). The allocation phase
grows jobs one task (or one gang, or one bundle) at a time through it: every grant asks a
`TaskPlacer` (the placement phase's per-task rule) for a node and books the task there, so no
allocation can overcommit a node. The placement phase books the final placement in a fresh
ledger the same way. Two rules live here, not in every policy:

- Gang start: a job with no tasks first receives its minimum gang (min PS and min workers,
  at least one of each its architecture needs) atomically, or nothing. A job never holds a
  partial set of tasks that cannot train.
- Caps: a job never exceeds its max PS / max workers.
- Exclusive tokens (JobView.exclusive: host ports, pod anti-affinity groups): a node holds
  at most one task holding a given token, counting what the snapshot says is held there
  already (Snapshot.exclusive_in_use).
- Spread caps (JobView.spreads, topology spread constraints): a task goes only where its
  domain holds fewer than the emptiest allowed domain's count plus the skew.
- Counted resources (JobView.counted: a node's pod slots, extended resources): a task goes
  only where enough of each is free (Snapshot.counted_free), booked like CPU.

Every grant is logged in order (`grants`): the placement phase may replay it.
A ledger never changes the snapshot it was built from. What it derives once per distinct
demand (cluster/demand_facts.py), its spread counts (cluster/spread_counts.py) and its quota
charges (cluster/quota_charges.py) are kept by helpers of their own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import numpy as np

from mlsched.cluster.demand_facts import EPS, RoundDemands
from mlsched.cluster.quota_charges import QuotaCharges
from mlsched.cluster.spread_counts import SpreadCounts
from mlsched.cluster.types import Decision, JobDecision, JobView, PoolPlan, Role, Snapshot


class TaskPlacer(Protocol):
    """Chooses a node for one task among those it fits on; None when none does. Placement
    policies are TaskPlacers (policies/base.py); the ledger needs nothing else of them."""

    def choose_node(self, ledger: "Ledger", job: JobView, role: Role, demand: np.ndarray) -> int | None: ...


class Ledger:
    def __init__(self, snapshot: Snapshot, placer: TaskPlacer, pools: PoolPlan | None = None):
        self.snapshot = snapshot
        self.placer = placer
        self.pools = pools or PoolPlan()
        # (job, roles) of every successful grant, in order: what the placement phase replays.
        self.grants: list[tuple[JobView, tuple[Role, ...]]] = []
        self.capacity = snapshot.capacity
        # Free capacity is stored resource-major (3, N) so that the per-resource comparisons in
        # fits_mask run over contiguous memory: it is the simulator's hottest loop.
        # A copy, always: with one node, capacity.T is already contiguous and
        # ascontiguousarray would hand back a view, so booking tasks would change the snapshot.
        self._free_t = np.array(snapshot.capacity.T, order="C", copy=True)
        # Its rows, to book one task float by float (DemandFacts.amounts).
        self._free_rows = tuple(self._free_t)
        # Free capacity summed over nodes, per resource, kept as tasks are booked (plain
        # floats, for the same reason; free_total): readers that want the cluster-wide free
        # share each step (DL²'s state) need not sum N nodes.
        self._free_total: list[float] = self._free_t.sum(axis=1).tolist()
        # Normalised load per node (sum over resources of used/capacity); load-balancing
        # placement reads it, so it is kept incrementally rather than recomputed per task.
        self.load = np.zeros(len(snapshot.node_names))
        self.tasks_on: list[list[tuple[str, str, Role]]] = [[] for _ in snapshot.node_names]
        # Bumped on every book and release of a task on the node: lets a reader that keeps
        # per-node aggregates (Harmony's node tokens) redo only the nodes that changed.
        self._node_version = np.zeros(len(snapshot.node_names), dtype=np.int64)
        self._touched: list[int] = []  # ... the nodes of the books and releases not yet counted
        # The job of every book and release, in order: a reader that keeps per-job aggregates
        # (Harmony's job tokens) reads on from where it stopped and redoes only those jobs.
        self.job_changes: list[str] = []
        self.jobs: dict[str, JobDecision] = {}
        self.inferences = 0
        self._pool_masks: dict[str, np.ndarray] = {}
        self._allowed: dict[tuple[str, int], np.ndarray] = {}  # (pool, id(node filter)) -> both
        # Left to book in all (Snapshot.budget: a namespace's ResourceQuotas, per the dimensions
        # of JobView.quota_charge), None: no cap. Each task books its job's quota charge.
        self.budget = None if snapshot.budget is None else np.array(snapshot.budget, dtype=float)
        # The same budget (plus the tolerance) as plain floats, as each charge is beside its
        # array (QuotaCharges: why). Kept in step by book and release.
        self._room: list[float] = [] if self.budget is None else (self.budget + EPS).tolist()
        self._charges = QuotaCharges()
        # The cluster's capacity summed over nodes (fixed for the round): summing 5,000 nodes
        # per reader (DL² builds a state per window of 40 jobs) cost a 10,000-job round 30 ms.
        self.total = total = snapshot.total_capacity
        self._inv_total = np.divide(1.0, total, out=np.zeros(3), where=total > 0)
        self._inv_total_floats = tuple(self._inv_total.tolist())
        self._demands = RoundDemands(self.capacity)
        # Per exclusive token, how many tasks (and pods the round does not re-decide) hold it on
        # each node: a count, not a flag, so that releasing one of two tasks kept where they were
        # (book_held books kept tasks whatever they conflict with) does not free the token.
        self._holders_of: dict[object, np.ndarray] = {}
        for node, tokens in enumerate(snapshot.exclusive_in_use or ()):
            for token in tokens:
                self._holders(token)[node] += 1
        self._spreads = SpreadCounts(snapshot)
        # Per counted resource, what each node has free (a copy: booking must not change the
        # snapshot).
        self.counted_free = {name: np.array(free, dtype=float, copy=True)
                             for name, free in snapshot.counted_free.items()}

    # ---- queries -------------------------------------------------------------------------
    @property
    def node_version(self) -> np.ndarray:
        """Per node, how many books and releases of a task it has seen (counted when read: a
        round books thousands of tasks and few rounds have a reader)."""
        if self._touched:
            np.add.at(self._node_version, self._touched, 1)
            self._touched = []
        return self._node_version

    @property
    def free_total(self) -> np.ndarray:
        """Free capacity summed over nodes, per resource, (3,) (a new array: kept as floats)."""
        return np.array(self._free_total)

    @property
    def free(self) -> np.ndarray:
        """Free capacity per node, (N, 3) (a read-only view)."""
        view = self._free_t.T
        view.flags.writeable = False
        return view

    @property
    def free_by_resource(self) -> np.ndarray:
        """Free capacity per resource, (3, N) (a read-only view, updated in place as tasks are
        placed): the layout scans over nodes are fastest on."""
        view = self._free_t[:]
        view.flags.writeable = False
        return view

    def count(self, job: JobView, role: Role) -> int:
        d = self.jobs.get(job.name)
        if d is None:
            return 0
        return d.ps if role == "ps" else d.workers

    def has_tasks(self, job: JobView) -> bool:
        d = self.jobs.get(job.name)
        return d is not None and (d.ps + d.workers) > 0

    def at_cap(self, job: JobView, role: Role) -> bool:
        return self.count(job, role) >= job.bounds(role)[1]

    def demand(self, job: JobView, role: Role) -> np.ndarray:
        return job.demand(role)

    def fits_mask(self, demand: np.ndarray, job: JobView | None = None,
                  role: Role | None = None) -> np.ndarray:
        """Nodes with room for one task of `demand` that `job` may use: in its pool, and, for
        a task of `role`, among the nodes its template allows (JobView.node_filters)."""
        column = self._demands.facts(demand).column
        mask = (self._free_t >= column).all(axis=0)  # (np.logical_and.reduce is 4x slower here)
        if self.budget is not None and not self.budget_allows(job, role, demand):
            mask[:] = False
            return mask
        if job is not None and (job.pool is not None or job.node_filters):
            allowed = self.allowed_nodes(job, role)
            if allowed is not None:
                mask &= allowed
        if job is not None and role is not None and job.exclusive:
            free = self.exclusive_free_nodes(job, role)
            if free is not None:
                mask &= free
        if job is not None and role is not None and job.spreads:
            for spread in job.spreads.get(role, ()):
                mask &= self._spreads.room(spread)
        if job is not None and role is not None and job.counted:
            for name, amount in job.takes(role):
                mask &= self.counted_free[name] >= amount - EPS
        return mask

    def fits_on(self, demand: np.ndarray, node: int, job: JobView | None = None,
                role: Role | None = None) -> bool:
        """fits_mask(demand, job, role)[node], without comparing every node."""
        c, g, m = self._demands.facts(demand).need
        cpu, gpu, mem = self._free_rows
        if not (cpu[node] >= c and gpu[node] >= g and mem[node] >= m):
            return False
        if self.budget is not None and not self.budget_allows(job, role, demand):
            return False
        if job is None:
            return True
        if job.exclusive and role is not None and not self.exclusive_free(job, role, node):
            return False
        if job.spreads and role is not None and not all(
                self._spreads.room(s)[node] for s in job.spreads.get(role, ())):
            return False
        if job.counted and role is not None and not all(
                self.counted_free[name][node] >= amount - EPS for name, amount in job.takes(role)):
            return False
        if job.pool is None and not job.node_filters:
            return True
        allowed = self.allowed_nodes(job, role)
        return allowed is None or bool(allowed[node])

    def exclusive_free(self, job: JobView, role: Role, node: int) -> bool:
        """Whether no task on `node` holds a token a task of `job`'s `role` holds."""
        for token in job.holds(role):
            holders = self._holders_of.get(token)
            if holders is not None and holders[node]:
                return False
        return True

    def exclusive_free_nodes(self, job: JobView, role: Role, token: object | None = None) -> np.ndarray | None:
        """The nodes where every token of `job`'s `role` (or just `token`) is free (None: it
        holds none)."""
        tokens = job.holds(role) if token is None else (token,)
        if not tokens:
            return None
        mask = np.ones(self._free_t.shape[1], dtype=bool)
        for t in tokens:
            holders = self._holders_of.get(t)
            if holders is not None:
                mask &= holders == 0
        return mask

    def _holders(self, token: object) -> np.ndarray:
        holders = self._holders_of.get(token)
        if holders is None:
            holders = self._holders_of[token] = np.zeros(self._free_t.shape[1], dtype=np.int32)
        return holders

    def budget_allows(self, job: JobView | None, role: Role | None, demand: np.ndarray) -> bool:
        """Whether the quotas have room for the next task of `job`'s `role` (its charge()); a
        NaN in the charge (a request or limit its pods do not set where a quota bounds it)
        never has."""
        if self.budget is None:
            return True
        floats = self._charge_entry(job, role, demand, None)[1]
        return all(c <= r for c, r in zip(floats, self._room))

    def budget_covers(self, bound: list[float]) -> bool:
        """Whether the quotas have room for one more task charging at most `bound` (from
        charge_bound): then every such task's own check passes, and a caller that rechecks
        many tasks after each grant can skip them all."""
        return self.budget is None or all(b <= r for b, r in zip(bound, self._room))

    def charge_bound(self, job: JobView, role: Role, demand: np.ndarray) -> list[float]:
        """The most, per dimension, any task of `job`'s `role` can charge the budget (the
        job's own charge and its kept pods'); a NaN (never fits) as infinity."""
        count = len(job.kept_charges.get(role, ())) if job.kept_charges else 0
        charges = [self.charge(job, role, demand, i) for i in range(count + 1)]
        return np.nan_to_num(np.max(charges, axis=0), nan=np.inf).tolist()

    def charge(self, job: JobView | None, role: Role | None, demand: np.ndarray,
               ordinal: int | None = None) -> np.ndarray:
        """What one task books against the budget: its job's quota charge for `role`, with the
        dimensions no quota bounds zeroed (so that a limit nobody checks is never NaN there).
        The task of `ordinal` (default: the next one, the job's count of the role so far)
        kept in an existing pod charges that pod's own (JobView.kept_charges)."""
        return self._charge_entry(job, role, demand, ordinal)[0]

    def _charge_entry(self, job: JobView | None, role: Role | None, demand: np.ndarray,
                      ordinal: int | None) -> tuple[np.ndarray, list[float]]:
        if ordinal is None and job is not None and job.kept_charges:
            ordinal = self.count(job, role)  # the next task's
        return self._charges.of(job, role, demand, ordinal, self.budget)

    def allowed_nodes(self, job: JobView | None, role: Role | None = None) -> np.ndarray | None:
        """The nodes a task of `job` (of `role`, when given) may use whatever their free
        capacity: its pool's and its template's (a bool per node); None for every node."""
        if job is None:
            return None
        pool = job.pool
        node_filter = job.node_filter(role) if role is not None else None
        if node_filter is None:
            return None if pool is None else self._pool_mask(pool)
        if pool is None:
            return node_filter
        key = (pool, id(node_filter))
        mask = self._allowed.get(key)
        if mask is None:
            mask = self._allowed[key] = self._pool_mask(pool) & node_filter
        return mask

    def gpu_type(self, node: int) -> str | None:
        """The GPU type of `node` (Snapshot.gpu_types); None when untyped."""
        return self.snapshot.gpu_type(node)

    def worker_types(self, job: JobView) -> set[str | None]:
        """The GPU types of the nodes this round gives `job`'s workers so far (the job runs
        at the slowest one's pace); empty when it has none."""
        d = self.jobs.get(job.name)
        if d is None or self.snapshot.gpu_types is None:
            return set() if d is None or not d.worker_nodes else {None}
        types = self.snapshot.gpu_types
        return {types[n] for n in d.worker_nodes}

    def used_share(self, job: JobView) -> np.ndarray:
        """Share of the cluster's total of each resource that this round gives the job."""
        d = self.jobs.get(job.name)
        if d is None:
            return np.zeros(3)
        return (d.ps * job.ps_demand + d.workers * job.worker_demand) * self._inv_total

    def dominant_share(self, job: JobView) -> float:
        """used_share(job).max(), in plain floats (the same operations on the same doubles):
        DRF asks it after every grant."""
        d = self.jobs.get(job.name)
        if d is None:
            return 0.0
        ps, workers = len(d.ps_nodes), len(d.worker_nodes)
        p = self._demands.facts(job.ps_demand).amounts
        w = self._demands.facts(job.worker_demand).amounts
        inv = self._inv_total_floats
        return max((ps * p[0] + workers * w[0]) * inv[0], (ps * p[1] + workers * w[1]) * inv[1],
                   (ps * p[2] + workers * w[2]) * inv[2])

    # ---- growing jobs -------------------------------------------------------------------
    def grow(self, job: JobView, role: Role) -> bool:
        """Add one task of `role` (or the job's starting gang if it has none). True on success."""
        if role == "ps" and not job.uses_ps:
            return False
        if not self.has_tasks(job):
            return self._start_gang(job)
        if self.at_cap(job, role):
            return False
        return self._add_many(job, [role])

    def grow_bundle(self, job: JobView) -> bool:
        """Add one worker and, for a PS job, one PS, atomically (DL²'s bundle action)."""
        if not self.has_tasks(job):
            return self._start_gang(job)
        if self.at_cap(job, "worker"):
            return False
        if not job.uses_ps:
            return self._add_many(job, ["worker"])
        if self.at_cap(job, "ps"):
            return False
        return self._add_many(job, ["worker", "ps"])

    def grant(self, job: JobView, ps: int, workers: int) -> bool:
        """Give a job exactly (ps, workers) more tasks atomically (gang), or nothing."""
        roles: list[Role] = ["ps"] * ps + ["worker"] * workers
        return self._add_many(job, roles)

    def grant_roles(self, job: JobView, roles: tuple[Role, ...] | list[Role]) -> bool:
        """Give a job these tasks atomically, or nothing (a grant of `grants`, replayed)."""
        return self._add_many(job, list(roles))

    def _start_gang(self, job: JobView) -> bool:
        min_ps, min_w = job.starting_gang
        return self._add_many(job, ["ps"] * min_ps + ["worker"] * min_w)

    def _add_many(self, job: JobView, roles: list[Role]) -> bool:
        added: list[tuple[Role, int]] = []
        for role in roles:
            held = self.count(job, role)
            if held >= job.bounds(role)[1]:
                self.release(job, added)
                return False
            demand = self.demand(job, role)
            node = self.placer.choose_node(self, job, role, demand)
            if node is None:
                self.release(job, added)
                return False
            self.book(job, role, node, demand)
            added.append((role, node))
        self.inferences += 1
        self.grants.append((job, tuple(roles)))
        return True

    def book(self, job: JobView, role: Role, node: int, demand: np.ndarray | None = None) -> None:
        """Record one task of `job` on `node` (the caller checked that it fits)."""
        if demand is None:
            demand = self.demand(job, role)
        facts = self._demands.facts(demand)
        c, g, m = facts.amounts
        cpu, gpu, mem = self._free_rows
        cpu[node], gpu[node], mem[node] = cpu[node] - c, gpu[node] - g, mem[node] - m
        total = self._free_total
        total[0], total[1], total[2] = total[0] - c, total[1] - g, total[2] - m
        if self.budget is not None:
            self.budget -= self.charge(job, role, demand)
            self._room = (self.budget + EPS).tolist()
        self.load[node] += self._demands.load_step(demand, node, facts)
        if job.exclusive:
            for token in job.holds(role):
                self._holders(token)[node] += 1
        if job.spread_counts:
            self._spreads.count(job, role, node, 1)
        if job.counted:
            for name, amount in job.takes(role):
                self.counted_free[name][node] -= amount
        d = self.jobs.get(job.name)
        if d is None:
            d = self.jobs[job.name] = JobDecision()
        (d.ps_nodes if role == "ps" else d.worker_nodes).append(node)
        self.tasks_on[node].append((job.name, job.model, role))
        self._touched.append(node)
        self.job_changes.append(job.name)

    def book_held(self, held: Iterable[tuple[JobView, JobDecision]]) -> None:
        """Book tasks already in place (what an admission step holds), in order, each job's
        PS before its workers: the state book() would leave task by task, to the last bit.

        An admission step holds every running task of the cluster (about 1,400 at 500 nodes)
        and the simulator takes hundreds of steps, so runs of plain jobs are booked in bulk:
        ufunc.at applies repeated indices one after another in the given order and
        subtract.accumulate subtracts row after row, so every float is the one the same
        sequence of book() calls makes (tests/test_ledger_held.py holds this). A job with exclusive
        tokens, spreads or counted resources, and every job while quotas bound the round, is
        booked task by task: those rules are per task and rare."""
        batch: list[tuple[JobView, JobDecision]] = []
        for job, d in held:
            if self.budget is None and not (job.exclusive or job.spread_counts or job.counted):
                batch.append((job, d))
                continue
            self._book_in_bulk(batch)  # the plain jobs before it first: booking order is kept
            batch = []
            for role, nodes in (("ps", d.ps_nodes), ("worker", d.worker_nodes)):
                for node in nodes:
                    self.book(job, role, node)  # type: ignore[arg-type]
        self._book_in_bulk(batch)

    def _book_in_bulk(self, held: list[tuple[JobView, JobDecision]]) -> None:
        """book() for every task of `held` (jobs with no per-task rule), arrays updated at once."""
        nodes: list[int] = []
        demands: list[np.ndarray] = []  # one per (job, role) with tasks ...
        counts: list[int] = []  # ... and how many tasks it books
        steps: list[np.ndarray] = []  # the load each task adds, in booking order
        for job, d in held:
            for role, placed in (("ps", d.ps_nodes), ("worker", d.worker_nodes)):
                if not placed:
                    continue
                demand = self.demand(job, role)  # type: ignore[arg-type]
                steps.append(self._demands.load_steps(demand, placed))
                nodes.extend(placed)
                demands.append(demand)
                counts.append(len(placed))
                entry = self.jobs.get(job.name)
                if entry is None:
                    entry = self.jobs[job.name] = JobDecision()
                (entry.ps_nodes if role == "ps" else entry.worker_nodes).extend(placed)
                task = (job.name, job.model, role)
                for node in placed:
                    self.tasks_on[node].append(task)
                self.job_changes.extend([job.name] * len(placed))
        if not nodes:
            return
        at = np.array(nodes, dtype=np.intp)
        per_task = np.repeat(np.array(demands, dtype=float), counts, axis=0)  # (tasks, 3)
        for r in range(per_task.shape[1]):
            np.subtract.at(self._free_t[r], at, per_task[:, r])
        self._free_total = np.subtract.accumulate(np.vstack([self._free_total, per_task]),
                                                  axis=0)[-1].tolist()
        np.add.at(self.load, at, np.concatenate(steps))
        self._touched.extend(nodes)

    def release(self, job: JobView, added: list[tuple[Role, int]]) -> None:
        """Take these (role, node) tasks of `job` back out of the ledger, newest first."""
        for role, node in reversed(added):
            demand = self.demand(job, role)
            facts = self._demands.facts(demand)
            c, g, m = facts.amounts
            cpu, gpu, mem = self._free_rows
            cpu[node], gpu[node], mem[node] = cpu[node] + c, gpu[node] + g, mem[node] + m
            total = self._free_total
            total[0], total[1], total[2] = total[0] + c, total[1] + g, total[2] + m
            if self.budget is not None:  # the task of the highest ordinal held
                self.budget += self.charge(job, role, demand, self.count(job, role) - 1)
                self._room = (self.budget + EPS).tolist()
            self.load[node] -= self._demands.load_step(demand, node, facts)
            if job.exclusive:
                for token in job.holds(role):
                    self._holders(token)[node] -= 1
            if job.spread_counts:
                self._spreads.count(job, role, node, -1)
            if job.counted:
                for name, amount in job.takes(role):
                    self.counted_free[name][node] += amount
            d = self.jobs[job.name]
            (d.ps_nodes if role == "ps" else d.worker_nodes).pop()
            self.tasks_on[node].remove((job.name, job.model, role))
            self._touched.append(node)
            self.job_changes.append(job.name)
            if d.ps + d.workers == 0:
                del self.jobs[job.name]

    def _pool_mask(self, pool: str) -> np.ndarray:
        mask = self._pool_masks.get(pool)
        if mask is None:
            pools = (self.pools.node_pools or self.snapshot.node_pools
                     or [None] * self._free_t.shape[1])
            mask = np.array([p == pool for p in pools], dtype=bool)
            self._pool_masks[pool] = mask
        return mask

    def decision(self) -> Decision:
        return Decision(jobs=self.jobs, inferences=self.inferences, pools=self.pools)

"""`harmony`: group jobs whose compute and communication complement each other onto shared
node pools (Lee et al., "Harmony", §IV-B; docs/grouping.md).

Each round: profiles (profiles.py) -> if an arrival or a completion happened, the grouping
of algorithm.py, compared with keeping the current groups -> a PoolPlan whose pools
time-share their nodes' compute among their members (coordinated, as Harmony's subtasks are).

Nothing is kept in this object between rounds: what the decision to regroup needs is in the
snapshot. A job's current pool is `JobView.pool` (the cluster: its status), the pools' nodes
`Snapshot.node_pools` (the nodes' pool labels), the time it joined `JobView.pool_since_s`.
An arrival is a job with no pool (or the waiting pool); a completion is a pool that has nodes
and no members. Otherwise the current plan stands. On a trigger, a fresh grouping replaces
the current one only if its predicted score beats keeping it (finished jobs gone, newcomers
added where they raise the score most, freed machines handed out) by `threshold`, and only
if it moves no running job that joined its pool less than `min_pool_s` ago.

In the cluster (controller/scheduling/pools.py sets these) two more rules hold, because there a pool is
a node label on nodes other tenants share, and a pod moved is a checkpoint-restart:

- `min_members` (2 there, 1 in the simulator): a group of fewer members gets no pool. A
  pool of one job co-locates nothing and only fences nodes off; its job runs ungrouped,
  on the nodes no pool has, as the allocation and placement decide. A running ungrouped job
  is therefore no arrival (it triggers nothing), and keeping the groups keeps it ungrouped.
- `moves_must_fit`: a plan that moves a running job into a pool where its starting gang does
  not fit (fit.py) is not taken; the groups in force stay until the pool has room.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mlsched.cluster.types import WAITING_POOL, PoolForecast, PoolPlan, Snapshot
from mlsched.policies.grouping import algorithm, fit, local_search
from mlsched.policies.grouping.model import group_time
from mlsched.policies.grouping.profiles import profile_table


@dataclass
class HarmonyConfig:
    threshold: float = 0.05  # regroup only if the predicted score improves by more (paper: 5 %)
    min_pool_s: float = 1200.0  # a running job stays this long in a pool before it may move
    # 'throughput' (Σ jobs' predicted speed, model.throughput) or 'utilisation' (the paper's
    # w·U_cpu + (1−w)·U_net with w = cpu_weight: CPU weighs more, the paper gives no number)
    objective: str = "throughput"
    cpu_weight: float = 0.7
    job_penalty: float = 0.01  # score cost per extra member per group (paper: fewer is better)
    max_jobs_per_group: int = 8  # also bounded by memory: one PS + one worker of each per node
    max_dop: int = 16  # profiles are read up to this DoP (the per-job caps)
    max_candidates: int = 32  # group counts tried in step 1
    partners: int = 4  # groups a swap looks at
    max_swaps: int | None = None  # default 20 per group
    # local search after the swaps (local_search.py; 'throughput' objective only): group
    # pairs examined in all, and how many neighbours by iteration time each group pairs with
    local_search_pairs: int = 1000
    local_search_window: int = 4
    # The cluster's rules (module docstring): fewest members a group needs to get a pool, and
    # whether a plan may move a running job into a pool its starting gang does not fit.
    min_members: int = 1
    moves_must_fit: bool = False


@dataclass
class _Group:
    name: str | None
    members: list[int]
    nodes: list[int]


class Harmony:
    name = "harmony"

    def __init__(self, config: HarmonyConfig | None = None):
        self.config = config or HarmonyConfig()

    def group(self, snapshot: Snapshot) -> PoolPlan:
        cfg = self.config
        jobs = snapshot.jobs
        if not jobs:
            return PoolPlan()
        C, N = profile_table(jobs, cfg.max_dop)
        current = _current(snapshot)
        triggered = current is None or _triggered(snapshot, current, cfg.min_members > 1)
        if not triggered:
            return self._plan(snapshot, current, C, N, regrouped=False, gain=0.0)
        fresh = self._fresh(snapshot, C, N, current or [])
        if current is None:
            plan = self._plan(snapshot, fresh, C, N, regrouped=True, gain=0.0)
            # Nothing is pooled yet: where a running job would not fit, everyone stays as is.
            return PoolPlan() if self._unfit(snapshot, plan) else plan
        keep = self._keep(snapshot, current, C, N)
        s_keep, s_fresh = self._score(keep, C, N), self._score(fresh, C, N)
        gain = (s_fresh - s_keep) / s_keep if s_keep > 0 else math.inf
        if gain > cfg.threshold and not self._moves_pinned(snapshot, fresh):
            plan = self._plan(snapshot, fresh, C, N, regrouped=True, gain=gain)
            if not self._unfit(snapshot, plan):
                return plan
        return self._plan(snapshot, keep, C, N, regrouped=False, gain=gain)

    def _unfit(self, snapshot: Snapshot, plan: PoolPlan) -> bool:
        return self.config.moves_must_fit and bool(fit.unfit_moves(snapshot, plan))

    # ---- the two candidates ---------------------------------------------------------------
    def _k_max(self, snapshot: Snapshot) -> int:
        """Members per group: one PS and one worker of each must fit a node's memory, and
        its share of every resource time-sharing does not divide (in the cluster, GPUs: a
        node of 2 GPUs holds the one-GPU workers of 2 members, not 3)."""
        mem = float(snapshot.capacity[:, 2].min()) if len(snapshot.capacity) else 0.0
        need = max(float(j.ps_demand[2] + j.worker_demand[2]) for j in snapshot.jobs)
        by_mem = int(mem // need) if need > 0 else self.config.max_jobs_per_group
        k = min(self.config.max_jobs_per_group, by_mem)
        for r in (0, 1):  # cpu, gpu: only where they are not divided
            if r in snapshot.divisible or not len(snapshot.capacity):
                continue
            need = max(float(j.ps_demand[r] + j.worker_demand[r]) for j in snapshot.jobs)
            have = snapshot.capacity[:, r][snapshot.capacity[:, r] > 0]
            if need > 0 and have.size:  # nodes without any of it host no such task anyway
                k = min(k, int(float(have.min()) // need))
        return max(1, k)

    def _fresh(self, snapshot: Snapshot, C, N, current: list[_Group]) -> list[_Group]:
        cfg = self.config
        M = len(snapshot.node_names)
        k_max = self._k_max(snapshot)
        runnable = np.arange(min(len(snapshot.jobs), M * k_max))  # FIFO: later ones wait
        n_groups, groups = algorithm.choose_group_count(
            runnable, C, N, M, k_max, cfg.max_dop, cfg.cpu_weight, cfg.job_penalty, cfg.max_candidates,
            cfg.objective)
        d = int(min(max(M // n_groups, 1), cfg.max_dop))
        algorithm.swap(groups, C[:, d], N[:, d], cfg.partners, cfg.max_swaps)
        machines = algorithm.allocate_machines(groups, C, N, M, cfg.max_dop)
        if cfg.local_search_pairs > 0 and cfg.objective == "throughput":
            groups, machines = local_search.improve(groups, machines, C, N, M, cfg.max_dop, k_max,
                                                    cfg.job_penalty, cfg.local_search_window,
                                                    cfg.local_search_pairs)
        return _name_and_place(groups, machines, current, snapshot)

    def _keep(self, snapshot: Snapshot, current: list[_Group], C, N) -> list[_Group]:
        """The current groups without finished jobs; newcomers join the group where they
        raise the score most (or wait); machines of emptied groups go where they help most.
        With `min_members` > 1 the jobs left out run ungrouped: each counts as a group of
        its own over the nodes no group has (so that the score compares with a fresh
        grouping's, which gives such jobs machines), and `_plan` gives them no pool."""
        cfg = self.config
        k_max = self._k_max(snapshot)
        groups = [g for g in current if g.members]
        freed = [n for g in current if not g.members for n in g.nodes]
        placed = {i for g in groups for i in g.members}
        for i in range(len(snapshot.jobs)):
            if i in placed or not groups:
                continue
            best, best_gain = None, 0.0
            for g in groups:
                if len(g.members) >= k_max:
                    continue
                d = min(max(len(g.nodes), 1), cfg.max_dop)
                delta = self._group_value(g.members + [i], C, N, d) - self._group_value(g.members, C, N, d)
                if delta > best_gain:
                    best, best_gain = g, delta
            if best is not None:
                best.members.append(i)
        if freed and groups:
            start = np.array([len(g.nodes) for g in groups])
            machines = algorithm.allocate_machines([g.members for g in groups], C, N,
                                                   int(start.sum()) + len(freed), cfg.max_dop, start)
            for g, m in zip(groups, machines.tolist()):
                while len(g.nodes) < m and freed:
                    g.nodes.append(freed.pop(0))
        if cfg.min_members > 1:
            # The jobs left out share the nodes in no pool (those the ungrouped run on now
            # stay theirs: a pool never grows over them when the groups are kept).
            pooled = {n for g in groups for n in g.nodes}
            unpooled = [n for n in range(len(snapshot.node_names)) if n not in pooled]
            placed = {i for g in groups for i in g.members}
            singles = [_Group(None, [i], []) for i in range(len(snapshot.jobs)) if i not in placed]
            if singles:
                machines = algorithm.allocate_machines([g.members for g in singles], C, N,
                                                       len(unpooled), cfg.max_dop)
                for g, m in zip(singles, machines.tolist()):
                    while len(g.nodes) < m and unpooled:
                        g.nodes.append(unpooled.pop(0))
            groups += singles
        return groups

    def _group_value(self, members: list[int], C, N, d: int) -> float:
        """What a group adds to the objective (a newcomer joins where this rises most)."""
        cfg = self.config
        return self._score([_Group(None, members, [0] * d)], C, N) * (len(members) if cfg.objective == "throughput" else d)

    def _score(self, groups: list[_Group], C, N) -> float:
        groups = [g for g in groups if g.members]
        if not groups:
            return 0.0
        cfg = self.config
        machines = np.array([len(g.nodes) for g in groups])
        return algorithm.score([g.members for g in groups], C, N, algorithm.dop_of(machines, cfg.max_dop),
                               machines, cfg.objective, cfg.cpu_weight, cfg.job_penalty)

    def _moves_pinned(self, snapshot: Snapshot, groups: list[_Group]) -> bool:
        new = {snapshot.jobs[i].name: g.name for g in groups for i in g.members}
        for j in snapshot.jobs:
            young = j.pool_since_s is not None and snapshot.time_s - j.pool_since_s < self.config.min_pool_s
            if young and j.workers > 0 and j.pool not in (None, WAITING_POOL) and new.get(j.name) != j.pool:
                return True
        return False

    # ---- the answer ---------------------------------------------------------------------
    def _plan(self, snapshot: Snapshot, groups: list[_Group], C, N, regrouped: bool, gain: float) -> PoolPlan:
        node_pools: list[str | None] = [None] * len(snapshot.node_names)
        # With min_members > 1 a job in no group runs ungrouped (no entry), else it waits.
        ungrouped = self.config.min_members > 1
        job_pools = {} if ungrouped else {j.name: WAITING_POOL for j in snapshot.jobs}
        shares, forecasts = {}, {}
        for g in groups:
            if ungrouped and len(g.members) < self.config.min_members:
                continue  # no pool: its jobs ungrouped, its nodes in none
            assert g.name is not None
            for n in g.nodes:
                node_pools[n] = g.name
            for i in g.members:
                job_pools[snapshot.jobs[i].name] = g.name
            shares[g.name] = max(1, len(g.members))
            if g.members:
                d = min(max(len(g.nodes), 1), self.config.max_dop)
                c, n = C[g.members, d], N[g.members, d]
                t = float(group_time(c.sum(), n.sum(), (c + n).max()))
                forecasts[g.name] = PoolForecast(t, float(c.sum() / t), float(n.sum() / t),
                                                 len(g.members), len(g.nodes))
        moved = tuple(j.name for j in snapshot.jobs
                      if j.workers > 0 and j.pool is not None and job_pools.get(j.name) != j.pool)
        if ungrouped and not job_pools:
            return PoolPlan(predicted_gain=float(gain) if math.isfinite(gain) else 0.0,
                            regrouped=regrouped, moved=moved)  # no pool at all: one shared cluster
        return PoolPlan(job_pools, tuple(node_pools), shares, coordinated=True, forecasts=forecasts,
                        predicted_gain=float(gain) if math.isfinite(gain) else 0.0,
                        regrouped=regrouped, moved=moved)


def _current(snapshot: Snapshot) -> list[_Group] | None:
    """The groups in force, read from the snapshot; None when no pool plan is."""
    if snapshot.node_pools is None:
        return None
    by_name: dict[str, _Group] = {}
    for n, pool in enumerate(snapshot.node_pools):
        if pool is not None:
            by_name.setdefault(pool, _Group(pool, [], [])).nodes.append(n)
    for i, j in enumerate(snapshot.jobs):
        if j.pool in by_name:
            by_name[j.pool].members.append(i)
    return list(by_name.values())


def _triggered(snapshot: Snapshot, current: list[_Group], ungrouped: bool = False) -> bool:
    """An arrival (a job in no current pool) or a completion (a pool left without members).
    `ungrouped` (min_members > 1): a running job in no pool is settled there, no arrival."""
    known = {g.name for g in current}
    return (any(j.pool not in known and not (ungrouped and j.pool is None and j.workers > 0)
                for j in snapshot.jobs)
            or any(not g.members for g in current))


def _name_and_place(groups: list[list[int]], machines: np.ndarray, current: list[_Group],
                    snapshot: Snapshot) -> list[_Group]:
    """Name fresh groups after the current pool most of their members are in (so fewer jobs
    move), keep those pools' nodes where they can, and hand out the rest in node order."""
    pool_of = {i: g.name for g in current for i in g.members}
    old_nodes = {g.name: g.nodes for g in current}
    taken: set[str] = set()
    out: list[_Group] = []
    for members in groups:
        votes: dict[str, int] = {}
        for i in members:
            p = pool_of.get(i)
            if p is not None and p not in taken:
                votes[p] = votes.get(p, 0) + 1
        name = max(votes, key=lambda p: (votes[p], p)) if votes else None
        if name is not None:
            taken.add(name)
        out.append(_Group(name, list(members), []))
    counter = 0
    for g in out:
        while g.name is None:
            cand = f"g{counter}"
            counter += 1
            if cand not in taken and cand not in old_nodes:
                g.name = cand
                taken.add(cand)
    used = [False] * len(snapshot.node_names)
    for g, m in zip(out, machines.tolist()):
        for n in old_nodes.get(g.name, [])[:m]:
            g.nodes.append(n)
            used[n] = True
    free = iter(n for n, u in enumerate(used) if not u)
    for g, m in zip(out, machines.tolist()):
        while len(g.nodes) < m:
            n = next(free, None)
            if n is None:
                break
            g.nodes.append(n)
    return out

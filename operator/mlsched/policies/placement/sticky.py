"""Stickiness, as a wrapper around any per-task placement rule.

Task ordinal k of a role goes back to the node it ran on last interval when that node still
has room (and is in the job's pool), so an unchanged job keeps its pods where they are
(StatefulSet ordinals map to task ordinals in the operator); otherwise the wrapped rule
chooses. Moving a running task costs a checkpoint-restart, which the heuristics do not weigh.

Task by task in the allocation's order, that alone is not enough: a job granted earlier (a
newcomer, a job that grew) can be given the room a later job's unchanged task holds, which
then moves, and its pods restart for nothing. At 2,000 jobs, the round after a mass arrival
moved 345-369 running tasks of jobs whose counts it did not change (bench_e2e (b), 28 Nov).
So when the allocation's layout moves a kept task (ordinal k of a role still granted, no
longer on its node), `place` repairs it: the task goes back if its node has room left, or
swaps with a task that took its room and is free to go (a new task, or one moved anyway)
when each fits where the other was. Laying the kept tasks out first instead fails on a full
cluster: the allocation's fits were found in its own order, and a newcomer's gang no longer
fits (2,000 jobs on 1,000 nodes: every round). Swaps keep every task and the fits, so
they only touch jobs without per-node rules (pools, node filters, exclusive ports or
anti-affinity, spread, counted resources), and the result must pass the round's own check
(round.checked), else the allocation's layout stands.
"""

from __future__ import annotations

import numpy as np

from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import JobDecision, JobView, Role
from mlsched.policies.base import PlacementPolicy, PlacementRequest, TaskByTaskPlacement
from mlsched.policies.round import checked


class Sticky(TaskByTaskPlacement):
    def __init__(self, inner: PlacementPolicy):
        self.inner = inner
        self.name = inner.name

    @property
    def card(self):
        """The wrapped policy's model card (a learned placement), else None."""
        return getattr(self.inner, "card", None)

    @property
    def learned(self) -> bool:
        return self.inner.learned

    def for_round(self, serving):
        """The wrapped learned placement's per-round copy (exploration, decision log), sticky
        too. Only a learned placement has one (base.LearnedPolicy)."""
        return Sticky(self.inner.for_round(serving))

    def choose_node(self, ledger: Ledger, job: JobView, role: Role, demand: np.ndarray) -> int | None:
        previous = job.ps_nodes if role == "ps" else job.worker_nodes
        if previous:  # (a new job, most of a cold round, has none)
            ordinal = ledger.count(job, role)  # tasks of this role the job holds so far this round
            if ordinal < len(previous):
                node = previous[ordinal]
                if node < len(ledger.snapshot.node_names) and ledger.fits_on(demand, node, job, role):
                    return node
        return self.inner.choose_node(ledger, job, role, demand)

    def place(self, request: PlacementRequest) -> dict[str, JobDecision]:
        replayed = super().place(request)
        jobs = {job.name: job for job, _ in request.grants}
        moved = [(jobs[name], role, k) for name, d in replayed.items() if name in jobs
                 for role, k in _moved_tasks(jobs[name], d)]
        if not moved:
            return replayed  # the usual case, at no extra cost
        repaired = _repaired(request, jobs, replayed, moved)
        if repaired is None:
            return replayed
        _, unplaced = checked(request, repaired)
        return replayed if unplaced else repaired


def _moved_tasks(job: JobView, decided: JobDecision) -> list[tuple[Role, int]]:
    """(role, ordinal) of the job's tasks that ran last interval, are still granted and have
    another node now (ordinal by ordinal, as StatefulSet pods keep theirs)."""
    return [(role, k) for role, previous, now in (("ps", job.ps_nodes, decided.ps_nodes),
                                                  ("worker", job.worker_nodes, decided.worker_nodes))
            for k, (a, b) in enumerate(zip(previous, now)) if a != b]  # type: ignore[misc]


def _plain(job: JobView) -> bool:
    """No per-node rule but capacity: any node with room takes its tasks."""
    return not (job.pool is not None or job.node_filters or job.exclusive or job.spreads
                or job.counted)


def _repaired(request: PlacementRequest, jobs: dict[str, JobView],
              replayed: dict[str, JobDecision],
              moved: list[tuple[JobView, Role, int]]) -> dict[str, JobDecision] | None:
    """The replayed layout with moved kept tasks sent back where they ran, directly or by a
    swap (see the module doc); None when none could be."""
    snapshot = request.snapshot
    n_nodes = len(snapshot.node_names)
    out = {name: JobDecision(list(d.ps_nodes), list(d.worker_nodes)) for name, d in replayed.items()}
    # What the held tasks leave (booked as the round books them; no placer: nothing is placed
    # on this ledger), less the replayed tasks.
    free = np.array(request.fresh_ledger(None).free, dtype=float, copy=True)
    on_node: list[list[tuple[str, Role, int]]] = [[] for _ in range(n_nodes)]
    tasks: list[int] = []  # every replayed task's node, and its demand: subtracted at once
    demands: list[np.ndarray] = []  # (ufunc.at subtracts them in this order, as one by one)
    for name, d in out.items():
        job = jobs[name]
        for role, nodes in (("ps", d.ps_nodes), ("worker", d.worker_nodes)):
            for k, node in enumerate(nodes):
                tasks.append(node)
                demands.append(job.demand(role))  # type: ignore[arg-type]
                on_node[node].append((name, role, k))  # type: ignore[arg-type]
    if tasks:
        np.subtract.at(free, np.array(tasks, dtype=np.intp), np.array(demands, dtype=float))

    def nodes_of(name: str, role: Role) -> list[int]:
        d = out[name]
        return d.ps_nodes if role == "ps" else d.worker_nodes

    def previous_of(name: str, role: Role, k: int) -> int | None:
        previous = jobs[name].ps_nodes if role == "ps" else jobs[name].worker_nodes
        return previous[k] if k < len(previous) else None

    def put(name: str, role: Role, k: int, node: int) -> None:
        nodes = nodes_of(name, role)
        demand = jobs[name].demand(role)
        free[nodes[k]] += demand
        on_node[nodes[k]].remove((name, role, k))
        free[node] -= demand
        on_node[node].append((name, role, k))
        nodes[k] = node

    repaired = 0
    for job, role, k in moved:
        home, now = previous_of(job.name, role, k), nodes_of(job.name, role)[k]
        if home is None or not 0 <= home < n_nodes or not _plain(job):
            continue
        demand = job.demand(role)
        if (free[home] >= demand - _EPS).all():
            put(job.name, role, k, home)
            repaired += 1
            continue
        for other, other_role, j in list(on_node[home]):
            if other == job.name or not _plain(jobs[other]) \
                    or previous_of(other, other_role, j) == home:
                continue  # a task kept where it ran, or one with rules: not moved for this
            need = jobs[other].demand(other_role)
            if (free[home] + need >= demand - _EPS).all() and \
                    (free[now] + demand >= need - _EPS).all():
                put(other, other_role, j, now)
                put(job.name, role, k, home)
                repaired += 1
                break
    return out if repaired else None


_EPS = 1e-9

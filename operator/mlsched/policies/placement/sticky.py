"""Stickiness, as a wrapper around any per-task placement rule.

Task ordinal k of a role goes back to the node it ran on last interval when that node still
has room (and is in the job's pool), so an unchanged job keeps its pods where they are
(StatefulSet ordinals map to task ordinals in the operator); otherwise the wrapped rule
chooses. Moving a running task costs a checkpoint-restart, which the heuristics do not weigh.

Task by task in the allocation's order, that alone is not enough: a job granted earlier (a
newcomer, a job that grew) can be given the room a later job's unchanged task holds, which
then moves, and its pods restart for nothing. At 2,000 jobs, the round after a mass arrival
moved ~190 running tasks of jobs whose counts it did not change (bench_e2e (b), 28 Nov).
So when the allocation's layout moves a kept task (ordinal k of a role still granted, no
longer on its node), `place` lays the round out again with every kept task booked first
and the other tasks after, by the same rule in the same order; it is used only if it moves
fewer tasks and the round's check keeps every granted task (round.checked: capacity, pools,
quotas, spread), else the allocation's own layout stands.
"""

from __future__ import annotations

import numpy as np

from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import JobView, Role
from mlsched.cluster.types import JobDecision
from mlsched.policies.base import PlacementPolicy, PlacementRequest, TaskByTaskPlacement


class Sticky(TaskByTaskPlacement):
    def __init__(self, inner: PlacementPolicy):
        self.inner = inner
        self.name = inner.name

    @property
    def card(self):
        """The wrapped policy's model card (a learned placement), else None."""
        return getattr(self.inner, "card", None)

    @property
    def for_round(self):
        """The wrapped learned placement's per-round copy (exploration, decision log), sticky
        too. A heuristic has none: reading it raises AttributeError, so hasattr is False."""
        inner_for_round = self.inner.for_round
        return lambda serving: Sticky(inner_for_round(serving))

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
        jobs = _granted_jobs(request)
        if not any(_moved(job, replayed.get(job.name)) for job in jobs):
            return replayed  # nothing kept moved: the usual case, at no extra cost
        kept_first = self._kept_first(request, jobs)
        if kept_first is None:
            return replayed
        if sum(_moved(j, kept_first.get(j.name)) for j in jobs) >= \
                sum(_moved(j, replayed.get(j.name)) for j in jobs):
            return replayed
        from mlsched.policies.round import checked  # round imports the placements' base
        _, unplaced = checked(request, kept_first)
        return replayed if unplaced else kept_first

    def _kept_first(self, request: PlacementRequest, jobs: list[JobView]) -> dict[str, JobDecision] | None:
        """The round laid out with every kept task on its node first (a prefix of each
        role's ordinals, up to the granted count), then the grants' other tasks in order;
        None if a grant no longer fits."""
        ledger = request.fresh_ledger(self)
        n_nodes = len(request.snapshot.node_names)
        booked: dict[tuple[str, Role], int] = {}
        for job in jobs:
            ps, workers = request.counts[job.name]
            for role, previous, count in (("ps", job.ps_nodes, ps), ("worker", job.worker_nodes, workers)):
                for node in previous[:count]:
                    demand = ledger.demand(job, role)  # type: ignore[arg-type]
                    if not (node < n_nodes and ledger.fits_on(demand, node, job, role)):  # type: ignore[arg-type]
                        break  # the ordinals after it are placed with the new tasks
                    ledger.book(job, role, node, demand)  # type: ignore[arg-type]
                    booked[(job.name, role)] = booked.get((job.name, role), 0) + 1  # type: ignore[index]
        for job, roles in request.grants:
            rest = []
            for role in roles:
                if booked.get((job.name, role), 0) > 0:
                    booked[(job.name, role)] -= 1  # this grant's task is a kept one, booked
                else:
                    rest.append(role)
            if rest and not ledger.grant_roles(job, rest):
                return None
        held = {job.name for job, _ in request.held}
        return {name: d for name, d in ledger.jobs.items() if name not in held}


def _granted_jobs(request: PlacementRequest) -> list[JobView]:
    """The granted jobs, each once, in the order of their first grant."""
    seen: dict[str, JobView] = {}
    for job, _ in request.grants:
        seen.setdefault(job.name, job)
    return list(seen.values())


def _moved(job: JobView, decided: JobDecision | None) -> int:
    """How many of the job's tasks that ran last interval and are still granted have another
    node now (ordinal by ordinal, as StatefulSet pods keep theirs)."""
    if decided is None:
        return 0
    return sum(1 for previous, now in ((job.ps_nodes, decided.ps_nodes),
                                       (job.worker_nodes, decided.worker_nodes))
               for a, b in zip(previous, now) if a != b)

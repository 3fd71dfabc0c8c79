"""The three phases of a scheduling round, as Protocols every policy (heuristic or learned)
implements, and what flows between them.

    grouping   (Snapshot)                      -> PoolPlan   job -> pool, node -> pool
    allocation (Snapshot, Ledger)              -> counts     grown through the ledger
    placement  (PlacementRequest)              -> nodes      every granted task -> a node

`policies/round.py` runs them in that order. The allocation phase grows jobs through the
capacity `Ledger`, which asks the placement policy's per-task rule (`choose_node`) whether
and where each task fits, so an allocation policy can grow one task at a time (DL²) and never
grants what cannot be placed. The placement phase then decides the final node of every
granted task; heuristics replay the grants through the same rule (`TaskByTaskPlacement`), a
learned placement decides them all at once. The round checks the result against capacity
and pools, whatever the placement policy returned.

Admission (`round.run_admission`), between rounds, when a job arrives or capacity frees up:
the same three policies decide, but only for the waiting jobs (those holding no task). Every
running job is held at its current counts and nodes: its tasks are booked in the ledger before
allocation starts and are passed to placement as `held` co-tenants, and the allocation policy
sees a snapshot whose jobs are the waiting ones. Any policy, heuristic or learned, therefore
admits jobs with no code of its own: it only ever grows the jobs it is shown, into the capacity
the ledger has left. Running jobs are re-decided only by the full round, at the interval, as in
the papers. One repair happens between rounds: a running job whose tasks lost their node
(drained, deleted: controller/scheduling/displacement.py) gets those tasks placed again by the placement
policy's per-task rule, before the waiting jobs are decided, its other tasks held.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import JobDecision, JobView, PoolPlan, Role, Snapshot

if TYPE_CHECKING:
    from mlsched.policies.exploration import Serving


class GroupingPolicy(Protocol):
    """Assigns jobs and nodes to pools (Harmony co-location); `PoolPlan()` is one shared pool."""

    name: str

    def group(self, snapshot: Snapshot) -> PoolPlan: ...


class AllocationPolicy(Protocol):
    """Decides how many PS and workers each job gets this interval by growing jobs in the
    ledger (`grow`, `grow_bundle`, `grant`; `fits_mask` to ask what would fit).

    `learned`: whether a model decides (then the policy is also a `LearnedPolicy`). The
    operator explores and records only with learned phases, and runs only heuristic rounds
    settled (round.settles)."""

    name: str
    learned: bool

    def allocate(self, snapshot: Snapshot, ledger: Ledger) -> None: ...


@dataclass
class PlacementRequest:
    """What the placement phase is given: the jobs (with their pools), the counts the
    allocation phase granted, the order it granted them in, and the tasks held in place."""

    snapshot: Snapshot  # job views carry the pool the grouping phase chose
    pools: PoolPlan
    counts: dict[str, tuple[int, int]]  # job -> (ps, workers) granted
    grants: list[tuple[JobView, tuple[Role, ...]]]  # in the order allocation made them
    # Tasks fixed before this phase (running jobs during admission): co-tenants, not decided.
    held: list[tuple[JobView, JobDecision]] = field(default_factory=list)
    # Where the allocation phase's fit checks put each task, and which rule chose: a
    # per-task rule replaying the grants would choose exactly these nodes again.
    tentative: dict[str, JobDecision] | None = None
    tentative_placer: object | None = None
    # round.checked's answer for the last layout it checked (each job's nodes per role) and that
    # layout: a placement that checks its own layout (Sticky's repairs) hands the round a layout
    # already checked, and booking 1,400 tasks again to learn the same answer cost a 500-node
    # simulation a tenth of its time.
    last_checked: tuple[dict, tuple[dict[str, JobDecision], dict[str, int]]] | None = \
        field(default=None, repr=False, compare=False)

    def fresh_ledger(self, placer) -> Ledger:
        """A ledger on the round's capacity with the held tasks already booked."""
        ledger = Ledger(self.snapshot, placer, self.pools)
        book_held(ledger, self.held)
        return ledger


def book_held(ledger: Ledger, held: list[tuple[JobView, JobDecision]]) -> None:
    """Book tasks already in place, each job's PS then its workers (Ledger.book_held)."""
    ledger.book_held(held)


class PlacementPolicy(Protocol):
    """Chooses the node of every task.

    `choose_node` is the per-task rule (None when no allowed node fits): the ledger asks it
    during allocation, so allocation grants only what fits. `place` decides the final nodes
    of every granted task."""

    name: str
    learned: bool  # as for AllocationPolicy

    def choose_node(self, ledger: Ledger, job: JobView, role: Role, demand: np.ndarray) -> int | None: ...

    def place(self, request: PlacementRequest) -> dict[str, JobDecision]: ...


class LearnedPolicy(Protocol):
    """What a learned allocation or placement policy (`learned = True`) has besides its phase's
    methods: the served model's card and a per-round copy that explores and records its
    decisions as `serving` says (formats/serving.py)."""

    learned: bool
    card: object  # onnx_runner.ModelCard, or None for a training actor

    def for_round(self, serving: "Serving") -> "LearnedPolicy": ...


class TaskByTaskPlacement:
    """Placement by a per-task rule: replays the allocation's grants, in order, through
    `choose_node` on a fresh ledger. Deterministic rules give exactly the nodes the
    allocation phase's fit checks found."""

    name = "task-by-task"
    learned = False

    def choose_node(self, ledger: Ledger, job: JobView, role: Role, demand: np.ndarray) -> int | None:
        raise NotImplementedError

    def place(self, request: PlacementRequest) -> dict[str, JobDecision]:
        if request.tentative is not None and request.tentative_placer is self:
            return request.tentative  # the replay's answer, already computed (tests check it)
        ledger = request.fresh_ledger(self)
        for job, roles in request.grants:
            ledger.grant_roles(job, roles)
        held = {job.name for job, _ in request.held}
        return {name: d for name, d in ledger.jobs.items() if name not in held}

"""Work conservation: did a round leave idle capacity that a waiting job could have started on?

A round is work conserving when no job it gave nothing could start its minimum task set
(its starting gang: min PS and min workers, each with its per-task request) in the capacity
the round left free. A learned allocation can fail this where a heuristic cannot: Chic's
model sees a window of three jobs and gives nothing to the rest, however much is free
(issue 51). The simulator and the operator both have the round's snapshot and decision, so
this one pure function serves both; it changes neither.

"Would fit" is decided by the same capacity ledger the round booked through, not by summing
free capacity over the cluster: a gang fits only where each of its tasks fits on one node,
in the job's pool and node filters, within the quota budget, host ports, spread caps and
counted resources the round respected. So free capacity scattered over nodes in pieces too
small for a task (fragmentation) is not reported, and a policy such as DRF, which grows jobs
until nothing fits, is never reported. The waiting jobs are tried one after another in
arrival order, each booked before the next is tried (as an admission step would start
them), so the amounts count each idle GPU once. Bin-packing places the trial tasks: it
leaves the most room for the next gang, so a fit is not missed for want of a better layout
of the trial itself (a fit found is always real; one missed can only under-report).
"""

from __future__ import annotations

from dataclasses import dataclass

from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import Decision, Snapshot
from mlsched.policies.placement.heuristics import BinPack
from mlsched.policies.round import with_pools


@dataclass(frozen=True)
class IdleCapacity:
    """What a round left idle that waiting jobs' minimums would have used.

    `gpus`, `cpus` and `tasks` are what the minimums of `jobs` take together, started one
    after another in arrival order; `free_gpus` and `free_cpus` are all the round left free
    (fitting or not), for context."""

    gpus: float = 0.0
    cpus: float = 0.0
    tasks: int = 0
    jobs: tuple[str, ...] = ()  # the waiting jobs whose minimum would have started, arrival order
    waiting: int = 0  # jobs the round gave nothing
    free_gpus: float = 0.0
    free_cpus: float = 0.0

    @property
    def conserving(self) -> bool:
        return not self.jobs

    def describe(self) -> str:
        """One line for a condition message or a log."""
        names = ", ".join(self.jobs[:5]) + (f" and {len(self.jobs) - 5} more" if len(self.jobs) > 5 else "")
        return (f"{self.gpus:g} GPUs, {self.cpus:g} CPUs ({self.tasks} tasks) idle that "
                f"{len(self.jobs)} of {self.waiting} waiting jobs' minimums would fit ({names})")


def idle_capacity(snapshot: Snapshot, decision: Decision) -> IdleCapacity:
    """The capacity `decision` left idle on `snapshot` that waiting jobs' minimums would fit.

    A waiting job is one of the snapshot's jobs the decision gives no task (whatever it held
    before the round). The jobs are seen as the round saw them: in the decision's pools, with a
    time-shared pool's shares of compute (policies.round.with_pools)."""
    if not snapshot.node_names:  # no node to use (all cordoned): nothing is idle (run_round)
        return IdleCapacity(waiting=len(snapshot.jobs))
    view = with_pools(snapshot, decision.pools)
    ledger = Ledger(view, BinPack(), decision.pools)
    given = {name: d for name, d in decision.jobs.items() if d.ps or d.workers}
    ledger.book_held([(j, given[j.name]) for j in view.jobs if j.name in given])
    free_cpus, free_gpus = float(ledger.free_total[0]), float(ledger.free_total[1])
    waiting = sorted((j for j in view.jobs if j.name not in given),
                     key=lambda j: (j.arrival_s, j.name))
    started: list[str] = []
    gpus = cpus = 0.0
    tasks = 0
    for job in waiting:
        before = ledger.free_total.copy()
        if not ledger.grow(job, "worker"):  # a job holding nothing grows by its starting gang
            continue
        used = before - ledger.free_total
        cpus, gpus = cpus + float(used[0]), gpus + float(used[1])
        tasks += sum(job.starting_gang)
        started.append(job.name)
    return IdleCapacity(gpus=round(gpus, 6), cpus=round(cpus, 6), tasks=tasks,
                        jobs=tuple(started), waiting=len(waiting),
                        free_gpus=round(max(free_gpus, 0.0), 6),
                        free_cpus=round(max(free_cpus, 0.0), 6))

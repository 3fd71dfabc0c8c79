"""Whether a pool plan's moves fit: a running job moved into a pool whose nodes cannot hold
it stops there and waits ("does not fit what is free now ..."), having lost the nodes it ran
on, which is worse than not moving it (issue 55).

The test is the one the ledger applies: every pooled job's starting gang booked first-fit
in arrival order on its pool's nodes, at its pool's share, from the snapshot's capacity
(in the cluster, what other tenants' pods and other policies' reservations leave). The jobs
of the policy are booked afresh, as a full round books them; its jobs outside pools do not
use pools' nodes (policies.round.with_pools), so they are left out.
"""

from __future__ import annotations

import dataclasses

from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import WAITING_POOL, PoolPlan, Snapshot
from mlsched.policies.placement.heuristics import FirstFit
from mlsched.policies.round import with_pools


def moved_into(snapshot: Snapshot, plan: PoolPlan) -> list[str]:
    """Running jobs the plan puts in a pool other than the one they are in (from no pool too)."""
    out = []
    for j in snapshot.jobs:
        pool = plan.job_pools.get(j.name)
        if j.workers > 0 and pool not in (None, WAITING_POOL) and pool != j.pool:
            out.append(j.name)
    return out


def unfit_moves(snapshot: Snapshot, plan: PoolPlan) -> list[str]:
    """The running jobs the plan moves into a pool where their starting gang does not fit
    beside the pool's other members (module docstring)."""
    moved = moved_into(snapshot, plan)
    if not moved:
        return []
    emptied = [dataclasses.replace(j, ps=0, workers=0, ps_nodes=(), worker_nodes=())
               for j in snapshot.jobs]
    view = with_pools(dataclasses.replace(snapshot, jobs=emptied), plan)
    ledger = Ledger(view, FirstFit(), plan)
    pooled = [j for j in view.jobs if j.pool not in (None, WAITING_POOL)]
    for job in sorted(pooled, key=lambda j: (j.arrival_s, j.name)):
        ledger.grant(job, *job.starting_gang)
    return [name for name in moved if name not in ledger.jobs]

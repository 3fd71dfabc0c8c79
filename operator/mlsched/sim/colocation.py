"""Harmony's co-location performance model, per node, for jobs in time-shared pools.

The paper (Lee et al., §IV-B2) runs every job of a group on all of the group's machines,
one compute subtask at a time per machine and the network likewise, each job one iteration
per round, so a group's iteration takes

    T_g = max(Σ_j T_cpu_j, Σ_j T_net_j, max_j T_itr_j)

and each member trains at T_itr_j / T_g of its speed alone. Our allocation policies need not
spread every member over every node of its pool, so the simulator applies the same rule per
node, weighting each job's compute by the share of the node's compute its workers hold there
(a worker holding half the GPUs keeps half of the node busy while it computes), and a job
runs at the pace of its slowest node, as a synchronous job does under the interference
model. When every member fills every node of the pool this is exactly the paper's T_g.

Compute is (cpu, gpu): whichever of them a worker holds the larger share of. Communication
occupies the NIC of every node the job has a task on. PS tasks count only for
communication: in the PS model, servers work while workers push and pull.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PhasedJob:
    iteration_s: float  # T_itr alone at its (ps, workers)
    compute_s: float
    comm_s: float
    worker_nodes: tuple[int, ...]
    nodes: tuple[int, ...]  # every node it has a task on (PS and workers)
    worker_demand: np.ndarray  # (cpu, gpu, mem) of one worker, as physically used


def worker_compute_share(demand: np.ndarray, capacity_row: np.ndarray) -> float:
    """The share of a node's compute one worker keeps busy while it computes."""
    shares = [demand[r] / capacity_row[r] for r in (0, 1) if demand[r] > 0 and capacity_row[r] > 0]
    return max(shares, default=0.0)


def node_round_times(jobs: dict[str, PhasedJob], capacity: np.ndarray) -> dict[int, float]:
    """Per node with co-located jobs: the round time max(compute load, NIC load, slowest job)."""
    compute: dict[int, float] = {}
    comm: dict[int, float] = {}
    slowest: dict[int, float] = {}
    for job in jobs.values():
        for n in job.worker_nodes:
            compute[n] = compute.get(n, 0.0) + job.compute_s * worker_compute_share(job.worker_demand, capacity[n])
        for n in set(job.nodes):
            comm[n] = comm.get(n, 0.0) + job.comm_s
            slowest[n] = max(slowest.get(n, 0.0), job.iteration_s)
    return {n: max(compute.get(n, 0.0), comm[n], slowest[n]) for n in comm}


def colocation_factors(jobs: dict[str, PhasedJob], capacity: np.ndarray) -> dict[str, float]:
    """Speed multiplier (0, 1] per job: T_itr alone / its slowest node's round time."""
    rounds = node_round_times(jobs, capacity)
    out = {}
    for name, job in jobs.items():
        pace = max((rounds[n] for n in set(job.nodes)), default=job.iteration_s)
        out[name] = min(1.0, job.iteration_s / pace) if pace > 0 and np.isfinite(pace) else 1.0
    return out

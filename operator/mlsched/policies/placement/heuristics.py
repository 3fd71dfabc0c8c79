"""Placement heuristics. Each looks only at nodes the task fits on (and its job's pool).

- load-balance: the least-loaded node (load = Σ used/capacity over resources), the
  Kubernetes/Mesos spreading default and DL²'s placement.
- bin-pack: the node with the least remaining capacity that still fits (Harmony's baseline).
- first-fit: the lowest-numbered node that fits.
- tetris: the node whose free resources best align with the demand (dot product of
  normalised free capacity and normalised demand; Grandl et al., SIGCOMM'14).
Ties go to the lowest node index, so every choice is deterministic. Each places a round's
tasks by replaying the allocation's grants (TaskByTaskPlacement); stickiness wraps them
(sticky.py).
"""

from __future__ import annotations

import numpy as np

from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import JobView, Role
from mlsched.policies.base import TaskByTaskPlacement


def _pick(ledger: Ledger, job: JobView, role: Role, demand: np.ndarray,
          score: np.ndarray) -> int | None:
    mask = ledger.fits_mask(demand, job, role)
    # Scores are finite, so the lowest one among nodes that fit is a node that fits, unless none
    # does (then all are inf and argmin lands on a node that does not): no separate any().
    best = int(np.where(mask, score, np.inf).argmin())
    return best if mask[best] else None


class LoadBalance(TaskByTaskPlacement):
    name = "load-balance"

    def choose_node(self, ledger: Ledger, job: JobView, role: Role, demand: np.ndarray) -> int | None:
        # The least-loaded node (the first, on ties), when the task fits there, is also the
        # least-loaded node it fits on: one node to check instead of all, the common case.
        node = int(ledger.load.argmin())
        if ledger.fits_on(demand, node, job, role):
            return node
        return _pick(ledger, job, role, demand, ledger.load)


class BinPack(TaskByTaskPlacement):
    name = "bin-pack"

    def choose_node(self, ledger: Ledger, job: JobView, role: Role, demand: np.ndarray) -> int | None:
        return _pick(ledger, job, role, demand, -ledger.load)


class FirstFit(TaskByTaskPlacement):
    name = "first-fit"

    def choose_node(self, ledger: Ledger, job: JobView, role: Role, demand: np.ndarray) -> int | None:
        mask = ledger.fits_mask(demand, job, role)
        idx = np.flatnonzero(mask)
        return int(idx[0]) if idx.size else None


class TetrisPlacement(TaskByTaskPlacement):
    name = "tetris"

    def choose_node(self, ledger: Ledger, job: JobView, role: Role, demand: np.ndarray) -> int | None:
        cap = ledger.capacity
        free_norm = np.divide(ledger.free, cap, out=np.zeros_like(cap), where=cap > 0)
        total = ledger.snapshot.total_capacity / len(cap)  # a mean node
        d_norm = np.divide(demand, total, out=np.zeros(3), where=total > 0)
        return _pick(ledger, job, role, demand, -(free_norm @ d_norm))

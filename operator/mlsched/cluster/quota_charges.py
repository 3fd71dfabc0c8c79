"""What one task books against a round's quota budget (Snapshot.budget: a namespace's
ResourceQuotas, per the dimensions of JobView.quota_charge), made once per job and role.
"""

from __future__ import annotations

import numpy as np

from mlsched.cluster.types import JobView, Role


class QuotaCharges:
    """The charges of one round's ledger, each beside itself as plain floats: a round checks
    the budget tens of thousands of times (DL² rechecks every demand of its window after each
    grant), and comparing six floats in Python takes a quarter of what one numpy comparison
    does."""

    def __init__(self):
        # (job, role[, kept ordinal]) -> (charge, the charge as floats)
        self._made: dict[tuple, tuple[np.ndarray, list[float]]] = {}

    def of(self, job: JobView | None, role: Role | None, demand: np.ndarray, ordinal: int | None,
           budget: np.ndarray) -> tuple[np.ndarray, list[float]]:
        """The charge of the task of `ordinal` of `job`'s `role` (the ledger's count of the role
        so far for the next one; read only where the job keeps pods): its job's quota charge
        for `role`, or, kept in an existing pod, that pod's own (JobView.kept_charges); zero in
        the dimensions `budget` does not bound (so that a limit nobody checks is never NaN
        there). Without a job or role: `demand` alone, no limits, one pod."""
        size = len(budget)
        if job is None or role is None:
            charge = _padded(np.array([*demand, 0.0, 0.0, 1.0]), size)  # no limits, one pod
            return charge, charge.tolist()
        key: tuple = (job.name, role)
        charge = None
        if job.kept_charges:
            kept = job.kept_charges.get(role, ())
            if ordinal < len(kept) and kept[ordinal] is not None:
                key, charge = (job.name, role, ordinal), kept[ordinal]
        found = self._made.get(key)
        if found is None:
            charge = _padded(job.quota_charge(role) if charge is None else charge, size)
            charge = np.where(np.isinf(budget), 0.0, charge)
            found = self._made[key] = (charge, charge.tolist())
        return found


def _padded(charge: np.ndarray, size: int) -> np.ndarray:
    """A quota charge cut or padded with zeros to the budget's `size`: the dimensions after
    the six standard ones (counted resources a quota bounds) are taken only by the tasks
    whose charge says so."""
    if len(charge) >= size:
        return charge[:size]
    return np.concatenate([charge, np.zeros(size - len(charge))])

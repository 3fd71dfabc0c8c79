"""A namespace quota in the simulator (SimConfig.quota): what all the simulated jobs together
may request, per resource, as a ResourceQuota bounds one namespace's pods in the cluster.

The operator mirrors a namespace's ResourceQuotas into `Snapshot.budget` (controller/admission/
quotas.py) and every policy grows jobs through the ledger, which refuses a task the budget has
no room for. The simulator sets the same field, so a policy is trained and measured under the
constraint it is served under (issue 50). Each decision is checked against the quota as it is
against node capacity: a policy that books past it fails the run (QuotaExceeded), it is not
scored.

Spelled `cpu=32,gpu=8,mem=256` (`mlsched simulate --quota`); a resource left out is unbounded.
The charge of a task is its full request (cpu, gpu, mem_gib), as a ResourceQuota counts
requests: a time-shared pool's smaller CPU requests are not modelled here.
"""

from __future__ import annotations

import math

import numpy as np

RESOURCES = ("cpu", "gpu", "mem")  # the Snapshot's (cpu, gpu, mem_gib) order


class QuotaExceeded(RuntimeError):
    pass


def parse(text: str) -> tuple[float, float, float]:
    """`cpu=32,gpu=8,mem=256` -> (32.0, 8.0, 256.0); a resource left out is inf."""
    bounds = dict.fromkeys(RESOURCES, math.inf)
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in bounds:
            raise ValueError(f"quota {part!r}: expected RESOURCE=AMOUNT with RESOURCE one of "
                             f"{', '.join(RESOURCES)} (e.g. cpu=32,gpu=8,mem=256)")
        try:
            amount = float(value)
        except ValueError:
            raise ValueError(f"quota {part!r}: {value.strip()!r} is not a number") from None
        if not math.isfinite(amount) or amount < 0:
            raise ValueError(f"quota {part!r}: the amount must be a finite number >= 0")
        bounds[name] = amount
    if all(math.isinf(b) for b in bounds.values()):
        raise ValueError(f"quota {text!r} bounds nothing; e.g. cpu=32,gpu=8,mem=256")
    return bounds["cpu"], bounds["gpu"], bounds["mem"]


def budget(quota: tuple[float, float, float] | None) -> np.ndarray | None:
    """Snapshot.budget for `quota`: what the round may book in all (the simulator's rounds
    decide every job, so nothing else is charged against it)."""
    return None if quota is None else np.array(quota, dtype=float)


def check(quota: tuple[float, float, float] | None, booked: np.ndarray) -> None:
    """Raise QuotaExceeded when `booked` (the decision's total requests, cpu, gpu, mem_gib)
    passes `quota`."""
    if quota is None:
        return
    for name, used, bound in zip(RESOURCES, booked, quota):
        if used > bound + 1e-9:
            raise QuotaExceeded(f"the decision requests {used:g} {name} in all, over the "
                                f"quota's {bound:g}")

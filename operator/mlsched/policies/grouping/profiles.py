"""Job profiles for grouping: per-iteration compute and communication time at each degree of
parallelism (DoP d = d PS + d workers, Harmony's one server and one worker per machine).

Before a job runs, the profile is its speed prior (the catalog's measured curve for a known
model) split by the catalog's compute fraction (workloads/phases.py). Once it has run, the
snapshot carries `phase_s`, the moving average of its measured (compute, comm) per iteration
at its current counts (Harmony profiles subtasks the same way); the ratio of measurement to
prior at those counts then scales the prior at every DoP, keeping the prior's shape.
"""

from __future__ import annotations

import numpy as np

from mlsched.cluster.types import JobView
from mlsched.workloads.phases import compute_fraction


def _prior_rows(job: JobView, max_dop: int) -> tuple[np.ndarray, np.ndarray]:
    """(compute, comm) seconds per iteration at DoP 0..max_dop (index 0 unused: inf)."""
    c = np.full(max_dop + 1, np.inf)
    n = np.zeros(max_dop + 1)
    curve = job.prior
    for d in range(1, max_dop + 1):
        ps = d if job.uses_ps else 0
        eps = curve.epochs_per_s(ps, d) if curve is not None else 0.0
        if eps <= 0:
            continue
        t = 1.0 / (eps * curve.steps_per_epoch)
        rho = compute_fraction(job.model, job.arch, ps, d)
        c[d], n[d] = rho * t, (1.0 - rho) * t
    return c, n


def profile_table(jobs: list[JobView], max_dop: int) -> tuple[np.ndarray, np.ndarray]:
    """Arrays (J, max_dop + 1) of compute and comm seconds per iteration by DoP."""
    cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
    C = np.empty((len(jobs), max_dop + 1))
    N = np.empty((len(jobs), max_dop + 1))
    for i, job in enumerate(jobs):
        key = (job.model, job.arch, id(job.prior))  # priors are shared objects per model
        rows = cache.get(key)
        if rows is None:
            rows = cache[key] = _prior_rows(job, max_dop)
        c, n = rows
        if job.phase_s is not None and 0 < job.workers <= max_dop:
            kc, kn = _correction(job, c, n)
            c, n = c * kc, n * kn
        C[i], N[i] = c, n
    return C, N


def _correction(job: JobView, c: np.ndarray, n: np.ndarray) -> tuple[float, float]:
    """Measured / prior at the job's counts (clamped, so one bad measurement cannot swamp)."""
    d = job.workers  # the prior's DoP nearest the counts it was measured at
    obs_c, obs_n = job.phase_s  # type: ignore[misc]
    kc = obs_c / c[d] if np.isfinite(c[d]) and c[d] > 0 else 1.0
    kn = obs_n / n[d] if n[d] > 0 else 1.0
    return float(np.clip(kc, 0.25, 4.0)), float(np.clip(kn, 0.25, 4.0))

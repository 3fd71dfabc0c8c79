"""How one training iteration of a job splits into compute and communication (Harmony's
T_cpu and T_net), the simulator's ground truth and the grouping policies' catalog prior.

The length of an iteration (one synchronous step, 1 / steps per second) comes from the speed
model, so nothing here changes how fast a job trains alone. Only the split is new:

- PS jobs, from the catalog's DL² constants: compute = local compute time / workers (the
  global batch is split over the workers, the codebase's convention; this is the paper's
  T_cpu ∝ 1/m), communication = push + pull of the whole model over the inter-node
  bandwidth, 2·S/B, times w/p when the PS side is the bottleneck (each PS receives w shares
  of S/p). The compute fraction ρ = c / (c + n) of that analytic model splits the measured
  iteration time. The DL² constants' units disagree with the measured table (speed_models.py
  says why), so only their ratio is used.
- All-reduce jobs, from the ring model itself (speed_models.py): c/w of compute, the
  2(w-1)/w · S/B rest communication.

A model outside the catalog gets ρ = GENERIC_COMPUTE_FRACTION until it is observed.
"""

from __future__ import annotations

from mlsched.workloads import catalog
from mlsched.workloads.speed_models import SpeedModel, _ring_constants

GENERIC_COMPUTE_FRACTION = 0.5


def compute_fraction(model: str, arch: str, ps: int, workers: int, nodes_spanned: int = 2) -> float:
    """ρ: the share of an iteration spent computing, at (ps, workers)."""
    if not catalog.is_known(model) or workers <= 0:
        return GENERIC_COMPUTE_FRACTION
    prof = catalog.get(model)
    if arch == "allreduce":
        compute, comm = _ring_constants(prof.name)
        if workers == 1:
            return 1.0
        if nodes_spanned <= 1:
            comm = comm * prof.bw_inter_mbps / max(prof.bw_intra_mbps, prof.bw_inter_mbps)
        c, n = compute / workers, 2.0 * (workers - 1) / workers * comm
    else:
        c = prof.local_compute_s / workers
        n = 2.0 * prof.model_size_mb / prof.bw_inter_mbps * max(1.0, workers / max(ps, 1))
    return c / (c + n)


def phase_times(speed: SpeedModel, model: str, arch: str, ps: int, workers: int,
                nodes_spanned: int = 2) -> tuple[float, float, float]:
    """(iteration, compute, communication) seconds of one step alone at (ps, workers)."""
    steps = speed.steps_per_s(model, arch, ps, workers, nodes_spanned)
    if steps <= 0:
        return float("inf"), float("inf"), 0.0
    t = 1.0 / steps
    rho = compute_fraction(model, arch, ps, workers, nodes_spanned)
    return t, rho * t, (1.0 - rho) * t

"""Harmony's co-location performance model over groups (Lee et al., §IV-B2), vectorised.

For a group g of jobs at DoP d: T_g = max(Σ T_cpu, Σ T_net, max T_itr) (eq. 1),
U(g) = (Σ T_cpu / T_g, Σ T_net / T_g) (eq. 3), the cluster's U = machine-weighted mean (eq. 4).
The paper leaves the resource-imbalance metric open; ours is the idle share of the two
resources, 2 − U_cpu − U_net: 0 for a perfectly complementary group, 1 for a job alone whose
phases never overlap, more for a job-bound group (one slow member holds both resources idle).
|Σ T_cpu − Σ T_net| / T_g, the obvious alternative, rewards job-bound groups (their large T_g
hides the difference) and made the swaps pair fast jobs with slow ones. Its objective
weighs CPU over network without a number; ours is `cpu_weight` (default 0.7).
"""

from __future__ import annotations

import numpy as np


def group_time(c_sum, n_sum, t_max):
    return np.maximum(np.maximum(c_sum, n_sum), t_max)


def imbalance(c_sum, n_sum, t_max):
    u_c, u_n = utilisation(c_sum, n_sum, t_max)
    return 2.0 - u_c - u_n


def utilisation(c_sum, n_sum, t_max) -> tuple[np.ndarray, np.ndarray]:
    t = group_time(c_sum, n_sum, t_max)
    t = np.where(t > 0, t, 1.0)
    return np.asarray(c_sum) / t, np.asarray(n_sum) / t


def throughput(c_sum, n_sum, t_max, t1_sum) -> float:
    """Σ over jobs of T_itr_j(DoP 1) / T_g: how many jobs' worth of one-machine-alone
    progress the groups make. Our objective (docs/grouping.md): the paper's U measures
    progress only if compute scales perfectly with machines (its eq. 2); in the measured
    speeds it does not, and U then prefers large comm-bound groups that progress slowly."""
    t = group_time(c_sum, n_sum, t_max)
    return float(np.sum(np.asarray(t1_sum) / np.where(t > 0, t, np.inf)))


def cluster_score(c_sum, n_sum, t_max, machines, cpu_weight: float) -> float:
    """w·U_cpu + (1−w)·U_net over the groups, machine-weighted (eq. 4)."""
    m = np.asarray(machines, dtype=float)
    if m.sum() <= 0:
        return 0.0
    u_c, u_n = utilisation(c_sum, n_sum, t_max)
    return float((cpu_weight * u_c + (1 - cpu_weight) * u_n) @ m / m.sum())

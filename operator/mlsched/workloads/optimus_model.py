"""The Optimus speed model (Peng et al., EuroSys'18) and its least-squares fit.

Synchronous PS training: steps/s f(p, w) = 1 / (θ0·M/w + θ1 + θ2·w/p + θ3·w + θ4·p), θ ≥ 0,
M the global batch. The time per step is linear in θ, so we fit θ by non-negative least
squares on relative step-time errors (each row scaled by the measured speed), which weights
fast and slow configurations alike. Used twice: as a second, swappable simulator speed model
fitted to the measured table, and by the `optimus` policy, which fits it online from the
speeds jobs have shown.
"""

from __future__ import annotations

import numpy as np


def features(ps: np.ndarray, workers: np.ndarray, global_batch: float) -> np.ndarray:
    p = np.asarray(ps, dtype=float)
    w = np.asarray(workers, dtype=float)
    return np.stack([global_batch / w, np.ones_like(w), w / p, w, p], axis=-1)


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int = 200) -> np.ndarray:
    """Lawson-Hanson active-set non-negative least squares: argmin ||Ax-b|| s.t. x >= 0."""
    n = a.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    for _ in range(max_iter):
        grad = a.T @ (b - a @ x)
        if passive.all() or grad[~passive].max(initial=-np.inf) <= 1e-12:
            break
        j = np.argmax(np.where(passive, -np.inf, grad))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > 1e-12
    return x


def fit(ps, workers, speeds, global_batch: float) -> np.ndarray:
    """θ (5 values, >= 0) fitted to measured speeds (steps/s) at (ps, workers)."""
    s = np.asarray(speeds, dtype=float)
    x = features(ps, workers, global_batch)
    # Minimise sum((step_time_pred * s - 1)^2): relative error of step time.
    return nnls(x * s[:, None], np.ones_like(s))


def predict(theta: np.ndarray, ps, workers, global_batch: float) -> np.ndarray:
    p = np.asarray(ps, dtype=float)
    w = np.asarray(workers, dtype=float)
    ok = (p > 0) & (w > 0)
    t = features(np.where(ok, p, 1), np.where(ok, w, 1), global_batch) @ theta
    return np.where(ok & (t > 0), 1.0 / np.where(t > 0, t, 1.0), 0.0)

"""Swappable speed models: how many epochs per second a job trains at (ps, workers).

- `measured` (default): the DL² table, interpolated (speed_table.py), for PS jobs.
- `optimus-fit`: the Optimus form fitted by least squares to the same table.
Both use the ring all-reduce model for `arch=allreduce` jobs.

Ring all-reduce: step time = c/w + 2(w-1)/w · S/B, with c the single-worker compute time and
S/B the model size over the bandwidth. The DL² constants' units do not agree with the measured
table (the table's ResNet-50 runs ~7x faster than 1/local_compute_s), so we ground the ring
model in the table instead: c = 1/max_p f(p PS, 1 worker) (one worker, never PS-bound), and S/B is chosen so a 2-worker ring
spanning two nodes is exactly as fast as the best measured 2-worker PS configuration. Inside
one node the intra/inter bandwidth ratio of the DL² constants speeds communication up.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Protocol

import numpy as np

from mlsched.workloads import catalog, optimus_model, speed_table


class SpeedModel(Protocol):
    name: str

    def steps_per_s(self, model: str, arch: str, ps: int, workers: int,
                    nodes_spanned: int = 2) -> float: ...


def epochs_per_s(speed: SpeedModel, model: str, arch: str, ps: int, workers: int,
                 nodes_spanned: int = 2) -> float:
    steps = speed.steps_per_s(model, arch, ps, workers, nodes_spanned)
    return steps / catalog.MODELS[model].steps_per_epoch


@lru_cache(maxsize=None)
def _ring_constants(model: str) -> tuple[float, float]:
    """(compute seconds of one worker, seconds to move the model once between nodes)."""
    t = speed_table.speed_tables()[model]
    compute = 1.0 / float(t[1:, 1].max())
    best_two = float(t[1:, 2].max())
    # 2(w-1)/w = 1 at w=2; the floor only guards against a superlinear measurement.
    comm = max(1.0 / best_two - compute / 2.0, 0.05 * compute)
    return compute, comm


def ring_allreduce_steps_per_s(model: str, workers: int, nodes_spanned: int = 2) -> float:
    if workers <= 0:
        return 0.0
    compute, comm = _ring_constants(model)
    if workers == 1:
        return 1.0 / compute
    prof = catalog.MODELS[model]
    if nodes_spanned <= 1:
        # Two DL² constants (dssm, resnext-110) give intra < inter bandwidth; a ring inside
        # one node is never slower than across nodes, so take the larger of the two.
        comm = comm * prof.bw_inter_mbps / max(prof.bw_intra_mbps, prof.bw_inter_mbps)
    return 1.0 / (compute / workers + 2.0 * (workers - 1) / workers * comm)


class MeasuredSpeed:
    name = "measured"

    def steps_per_s(self, model: str, arch: str, ps: int, workers: int,
                    nodes_spanned: int = 2) -> float:
        if arch == "allreduce":
            return ring_allreduce_steps_per_s(model, workers, nodes_spanned)
        return speed_table.table_speed(model, ps, workers)


@lru_cache(maxsize=None)
def optimus_fit_to_table(model: str) -> tuple[np.ndarray, float]:
    """θ fitted to the measured table, and the mean absolute relative error of the fit."""
    rows = [m for m in speed_table.load_measurements() if m.model == model and m.speed > 0]
    ps = np.array([m.ps for m in rows])
    w = np.array([m.workers for m in rows])
    s = np.array([m.speed for m in rows])
    batch = catalog.MODELS[model].global_batch
    theta = optimus_model.fit(ps, w, s, batch)
    err = float(np.mean(np.abs(optimus_model.predict(theta, ps, w, batch) - s) / s))
    return theta, err


class OptimusFitSpeed:
    name = "optimus-fit"

    def __init__(self) -> None:
        n = speed_table.MAX_TASKS + 1
        p, w = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        self._tables = {
            m: optimus_model.predict(optimus_fit_to_table(m)[0], p, w, catalog.MODELS[m].global_batch)
            for m in catalog.MODEL_NAMES
        }

    def steps_per_s(self, model: str, arch: str, ps: int, workers: int,
                    nodes_spanned: int = 2) -> float:
        if arch == "allreduce":
            return ring_allreduce_steps_per_s(model, workers, nodes_spanned)
        if ps <= 0 or workers <= 0:
            return 0.0
        cap = speed_table.MAX_TASKS
        return float(self._tables[model][min(ps, cap), min(workers, cap)])


class ScaledSpeed:
    """Another speed model with each model type's speed multiplied by a factor (absent: 1).

    What a calibration of the simulator to a real cluster produces (`mlsched retrain`,
    docs/retraining.md): the catalog's measured table is one testbed's, a cluster's jobs run
    faster or slower, and the factor is how much, per model type. Benchmarks also use it as
    the "cluster" itself: a simulator whose speeds differ from the catalog's."""

    def __init__(self, inner: SpeedModel, factors: dict[str, float]):
        bad = {m: f for m, f in factors.items() if not (f > 0 and np.isfinite(f))}
        if bad:
            raise ValueError(f"speed factors must be finite and > 0: {bad}")
        self.inner, self.factors = inner, {catalog.canonical_name(m): float(f) for m, f in factors.items()}
        self.name = f"{inner.name}-scaled"

    def steps_per_s(self, model: str, arch: str, ps: int, workers: int,
                    nodes_spanned: int = 2) -> float:
        return self.inner.steps_per_s(model, arch, ps, workers, nodes_spanned) * self.factors.get(model, 1.0)


class RecordedSpeed:
    """Another speed model, except at the (model, arch, ps, workers) a cluster's jobs were
    measured at: there, the measured epochs/s (`epochs`, as interval records carry them).

    The catalog's table is one GPU testbed's: how a model's speed changes with its PS and
    workers there need not be how a cluster's program scales (sim-to-real, issue 53: the
    reference programs on a CPU node scale with workers and not with PS). A per-model factor
    (ScaledSpeed) keeps the table's shape; this keeps what was measured where it was measured
    and the inner model elsewhere."""

    def __init__(self, inner: SpeedModel, epochs: dict[tuple[str, str, int, int], float]):
        bad = {k: v for k, v in epochs.items() if not (v > 0 and np.isfinite(v))}
        if bad:
            raise ValueError(f"measured speeds must be finite and > 0: {bad}")
        self.inner, self.name = inner, f"{inner.name}-recorded"
        self.steps = {(catalog.canonical_name(m), arch, ps, w): v * catalog.MODELS[catalog.canonical_name(m)].steps_per_epoch
                      for (m, arch, ps, w), v in epochs.items()}

    def steps_per_s(self, model: str, arch: str, ps: int, workers: int,
                    nodes_spanned: int = 2) -> float:
        found = self.steps.get((model, arch, ps if arch != "allreduce" else 0, workers))
        return found if found is not None else self.inner.steps_per_s(model, arch, ps, workers, nodes_spanned)


SPEED_MODELS = {"measured": MeasuredSpeed, "optimus-fit": OptimusFitSpeed}


def get_speed_model(name: str) -> SpeedModel:
    try:
        return SPEED_MODELS[name]()
    except KeyError:
        raise ValueError(f"unknown speed model {name!r}; choose one of {', '.join(SPEED_MODELS)}") from None

"""A job's speed curve: epochs per second as a function of its PS and worker counts.

Policies see jobs through this curve, never through a model name: its shape is the Optimus
form (optimus_model.py; θ ≥ 0, five terms for compute, overhead and PS communication) plus the
ring all-reduce term 2(w-1)/w (which the Optimus form cannot express: a ring's step time
grows with w and saturates), its scale is in epochs. Where a curve comes from:

- the catalog (`catalog_curve`): for a measured model, the measured speeds themselves (the
  DL² table for PS jobs, the ring model for all-reduce), tabulated, with θ fitted to them for
  use beyond the table — the best prior there is (the table is not monotone, which no smooth
  curve follows: the fit is 18 % off on average for resnet-50);
- the user (`declared_curve`): an MLJob may state its speed at one PS + one worker (one
  worker for all-reduce), `spec.speedPrior.referenceEpochsPerHour`; the shape is then the
  catalog's typical one (`GENERIC_SHAPE_MODEL`);
- nothing at all (`generic_curve`): the typical model's curve.

The online refinement from what a job has shown lives in features/speed_fit.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

from mlsched.workloads import catalog, optimus_model, speed_table
from mlsched.workloads.speed_models import MeasuredSpeed  # the simulator's ground truth

#: The catalog model whose fitted shape serves jobs that bring no better prior: resnet-50
#: has the median reference speed and a middling compute/communication split of the eight.
GENERIC_SHAPE_MODEL = "resnet-50"
_MAX_FIT_COUNT = 16


N_TERMS = 6
_BEST_GRID = 32  # the best speed within caps is searched up to this many tasks per role


def basis(ps, workers, global_batch: float) -> np.ndarray:
    """The step-time terms [M/w, 1, w/p, w, p, 2(w-1)/w] (last axis)."""
    p = np.asarray(ps, dtype=float)
    w = np.asarray(workers, dtype=float)
    return np.stack([global_batch / w, np.ones_like(w), w / p, w, p, 2.0 * (w - 1.0) / w], axis=-1)


@dataclass(frozen=True)
class SpeedCurve:
    """steps/s = 1 / (θ · basis(p, w)); epochs/s = steps/s / steps_per_epoch.

    `scale` multiplies the speed (an online correction that keeps the shape)."""

    theta: tuple[float, ...]  # N_TERMS values, >= 0
    global_batch: float
    steps_per_epoch: float
    uses_ps: bool = True
    scale: float = 1.0
    # Measured steps/s by [ps, workers] (row 0 for all-reduce), counts beyond it clamped;
    # when present it is the curve, and θ only describes it. Catalog models have one.
    table: np.ndarray | None = field(default=None, compare=False, repr=False)

    def epochs_per_s(self, ps: int, workers: int) -> float:
        if workers <= 0 or (self.uses_ps and ps <= 0):
            return 0.0
        if self.table is not None:
            t = self.table
            p = min(ps, t.shape[0] - 1) if self.uses_ps else 0
            return self.scale * float(t[p, min(workers, t.shape[1] - 1)]) / self.steps_per_epoch
        p = ps if self.uses_ps else 1
        t0, t1, t2, t3, t4, t5 = self.theta
        step = (t0 * self.global_batch / workers + t1 + t2 * workers / p + t3 * workers + t4 * p
                + t5 * 2.0 * (workers - 1) / workers)
        return self.scale / (step * self.steps_per_epoch) if step > 0 else 0.0

    def speed_function(self):
        """`epochs_per_s` as a plain function of (ps, workers), for callers that ask hundreds
        of times a round: a table-backed curve answers from nested lists (no numpy scalars)."""
        if self.table is None:
            return self.epochs_per_s
        rows = _table_rows(self.table)
        scale, steps = self.scale, self.steps_per_epoch
        last_p, last_w = len(rows) - 1, len(rows[0]) - 1
        uses_ps = self.uses_ps

        def speed(ps: int, workers: int) -> float:
            if workers <= 0 or (uses_ps and ps <= 0):
                return 0.0
            row = rows[min(ps, last_p) if uses_ps else 0]
            return scale * row[min(workers, last_w)] / steps  # epochs_per_s's arithmetic
        return speed

    def reference_epochs_per_s(self) -> float:
        return self.epochs_per_s(1, 1)

    def scaled(self, factor: float) -> "SpeedCurve":
        return SpeedCurve(self.theta, self.global_batch, self.steps_per_epoch, self.uses_ps,
                          self.scale * factor, self.table)

    def best_epochs_per_s(self, max_ps: int, max_workers: int) -> float:
        """The highest speed with at most these counts (at least one of each role it needs).
        Searched once per shape and caps (a round asks for every job), then scaled."""
        if self.scale <= 0:
            return self._best_epochs_per_s(max_ps, max_workers)
        return self.scale * _per_shape((self._shape_key(), max_ps, max_workers), self.table,
                                       lambda: self._unscaled()._best_epochs_per_s(max_ps, max_workers))

    def _shape_key(self) -> tuple:
        """What the curve's shape depends on (everything but `scale`); a table stands in by
        its identity (_per_shape keeps it alive and checks it, so the id is never another's)."""
        return (self.theta, self.global_batch, self.steps_per_epoch, self.uses_ps,
                id(self.table) if self.table is not None else None)

    def _best_epochs_per_s(self, max_ps: int, max_workers: int) -> float:
        max_w = max(min(max_workers, _BEST_GRID), 1)
        max_p = max(min(max_ps, _BEST_GRID), 1) if self.uses_ps else 1
        if self.table is not None:
            rows = self.table[1:max_p + 1] if self.uses_ps else self.table[:1]
            return self.scale * float(rows[:, 1:max_w + 1].max()) / self.steps_per_epoch
        ps, ws = np.meshgrid(np.arange(1, max_p + 1, dtype=float), np.arange(1, max_w + 1, dtype=float),
                             indexing="ij")
        step = basis(ps, ws, self.global_batch) @ np.array(self.theta)
        step = np.where(step > 0, step, np.inf)
        return float(self.scale / (step.min() * self.steps_per_epoch))

    def grid(self, max_ps: int, max_workers: int) -> np.ndarray:
        """Epochs/s by [ps, workers] for 0..max_ps PS and 0..max_workers workers (0 where a
        role the curve needs is missing; an all-reduce curve has one row, ps = 0), as
        `epochs_per_s` answers. Read-only: computed once per shape and counts, then scaled."""
        max_p = max_ps if self.uses_ps else 0
        unscaled = _per_shape(("grid", self._shape_key(), max_p, max_workers), self.table,
                              lambda: self._unscaled()._grid(max_p, max_workers))
        if self.scale == 1.0:
            return unscaled
        out = unscaled * self.scale
        out.setflags(write=False)
        return out

    def _grid(self, max_p: int, max_w: int) -> np.ndarray:
        out = np.zeros((max_p + 1, max_w + 1))
        first_p = 1 if self.uses_ps else 0
        if max_w >= 1 and max_p >= first_p:
            if self.table is not None:
                t = self.table
                ps = np.minimum(np.arange(first_p, max_p + 1), t.shape[0] - 1) if self.uses_ps else [0]
                ws = np.minimum(np.arange(1, max_w + 1), t.shape[1] - 1)
                out[first_p:, 1:] = t[np.ix_(ps, ws)] / self.steps_per_epoch
            else:
                rows = np.arange(1, max_p + 1, dtype=float) if self.uses_ps else np.ones(1)  # a ring ignores p
                p, w = np.meshgrid(rows, np.arange(1, max_w + 1, dtype=float), indexing="ij")
                step = basis(p, w, self.global_batch) @ np.array(self.theta)
                out[first_p:, 1:] = np.divide(1.0, step * self.steps_per_epoch,
                                              out=np.zeros_like(step), where=step > 0)
        out.setflags(write=False)
        return out

    #: (ps, workers) pairs whose speed ratios describe how a curve scales (see signature).
    PROBES = (((1, 2), (1, 1)), ((1, 4), (1, 1)), ((1, 8), (1, 1)),
              ((2, 4), (1, 4)), ((4, 8), (1, 8)), ((8, 16), (2, 16)))

    def signature(self) -> tuple[float, ...]:
        """How the curve scales, comparable across models whatever their θ: log2 of the
        speed-up from more workers (1 -> 2, 4, 8 at one PS) and from more PS (at 4, 8 and 16
        workers), over 2 and clipped to [-1, 1]. (θ itself is no description: its terms are
        not independent, so two fits of one curve can differ.) Ratios do not depend on
        `scale`: computed once per shape, on the unscaled curve."""
        if self.scale <= 0:
            return self._signature()
        return _per_shape(("signature", self._shape_key()), self.table,
                          lambda: self._unscaled()._signature())

    def _unscaled(self) -> "SpeedCurve":
        return self if self.scale == 1.0 else replace(self, scale=1.0)

    def _signature(self) -> tuple[float, ...]:
        out = []
        for (p1, w1), (p0, w0) in self.PROBES:
            a, b = self.epochs_per_s(p1, w1), self.epochs_per_s(p0, w0)
            r = math.log2(a / b) / 2.0 if a > 0 and b > 0 else -1.0
            out.append(min(max(r, -1.0), 1.0))
        return tuple(out)


_ROWS: dict[int, tuple[np.ndarray, list[list[float]]]] = {}
# Per-shape answers (signature, best speed within caps): a round asks for each of thousands of
# jobs, which share a handful of shapes. Bounded: shapes fitted online could be many.
_SHAPE_CACHE: dict[tuple, tuple[np.ndarray | None, object]] = {}
_SHAPE_CACHE_MAX = 4096


def _per_shape(key: tuple, table: np.ndarray | None, compute):
    """The cached answer for `key` (which holds id(table)), computed on first use. The entry
    keeps its table alive, so no later table can take that id while it exists, and the
    identity is checked all the same: keyed by a bare id, a curve built on a short-lived
    table (a calibrated or test one) got the answers of an earlier, freed table."""
    found = _SHAPE_CACHE.get(key)
    if found is None or found[0] is not table:
        if len(_SHAPE_CACHE) >= _SHAPE_CACHE_MAX:
            _SHAPE_CACHE.clear()
        found = _SHAPE_CACHE[key] = (table, compute())
    return found[1]


def _table_rows(table: np.ndarray) -> list[list[float]]:
    """A (read-only, long-lived) table as nested lists, converted once per table."""
    entry = _ROWS.get(id(table))
    if entry is None or entry[0] is not table:
        entry = _ROWS[id(table)] = (table, table.tolist())
    return entry[1]


@lru_cache(maxsize=None)
def catalog_curve(model: str, arch: str) -> SpeedCurve:
    """The simulator's ground truth for a catalog model, tabulated, and θ fitted to it (NNLS on
    relative error)."""
    prof = catalog.get(model)
    truth = MeasuredSpeed()
    ps_values = range(1, _MAX_FIT_COUNT + 1) if arch == "ps" else [1]
    p, w, s = [], [], []
    for ps in ps_values:
        for workers in range(1, _MAX_FIT_COUNT + 1):
            speed = truth.steps_per_s(prof.name, arch, ps if arch == "ps" else 0, workers)
            if speed > 0:
                p.append(ps), w.append(workers), s.append(speed)
    speed = np.array(s)
    # Relative step-time error, as optimus_model.fit: each row scaled by the measured speed.
    x = basis(np.array(p), np.array(w), prof.global_batch) * speed[:, None]
    if arch != "ps":
        x[:, [2, 4]] = 0.0  # a ring has no PS terms
    # Columns scaled to unit norm for the solver's sake (M/w dwarfs the others); θ scaled back.
    norms = np.linalg.norm(x, axis=0)
    norms = np.where(norms > 0, norms, 1.0)
    theta = optimus_model.nnls(x / norms, np.ones_like(speed)) / norms
    n = speed_table.MAX_TASKS + 1
    table = np.zeros((n, n) if arch == "ps" else (1, n))
    for ps in range(table.shape[0]):
        for workers in range(1, n):
            table[ps, workers] = truth.steps_per_s(prof.name, arch, ps, workers)
    table.setflags(write=False)
    return SpeedCurve(tuple(float(x) for x in theta), float(prof.global_batch),
                      float(prof.steps_per_epoch), uses_ps=arch == "ps", table=table)


def generic_curve(arch: str, reference_epochs_per_s: float | None = None) -> SpeedCurve:
    """The typical shape, at a stated speed at the reference config or, for a job nobody
    knows anything about, at the typical model's (observation corrects it after the first
    interval the job trains)."""
    shape = catalog_curve(GENERIC_SHAPE_MODEL, arch)
    if not reference_epochs_per_s:
        return shape
    return shape.scaled(reference_epochs_per_s / shape.reference_epochs_per_s())


@lru_cache(maxsize=4096)
def prior_curve(model: str, arch: str, declared_epochs_per_hour: float | None = None) -> SpeedCurve:
    """The best prior for a job: a declared speed wins (on the catalog's shape when the model
    is known), then the catalog's fit, then the generic curve. One object per distinct answer:
    readers cache what they derive from a prior by its identity (speed_fit)."""
    known = catalog.is_known(model)
    if declared_epochs_per_hour:
        base = catalog_curve(model, arch) if known else generic_curve(arch)
        return base.scaled(declared_epochs_per_hour / 3600.0 / base.reference_epochs_per_s())
    return catalog_curve(model, arch) if known else generic_curve(arch)

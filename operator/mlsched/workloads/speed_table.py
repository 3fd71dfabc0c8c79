"""Speed of a parameter-server job from the measured DL² table.

The table covers a rectilinear (PS, workers) grid per model (all of 1-23 x 1-12 for the two
ImageNet models, every other value for the rest). We fill the nine failed (zero) runs from
their grid neighbours, interpolate bilinearly between grid points and hold the edge value
beyond the grid, then tabulate every integer (ps, workers) up to MAX_TASKS once, so a lookup
during simulation is an array index. 0 PS or 0 workers trains nothing: speed 0.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources as importlib_resources

import numpy as np

from mlsched.workloads import catalog

MAX_TASKS = 64  # counts above this are clamped (the grid ends at 23 anyway)
DATA_FILE = "dl2-speed-measurements.txt"


@dataclass(frozen=True)
class Measurement:
    model: str
    global_batch: int
    ps: int
    workers: int
    speed: float  # steps/s, sum over workers; 0 = failed run
    ps_cpu: tuple[float, ...]
    worker_cpu: tuple[float, ...]


def load_measurements() -> list[Measurement]:
    text = importlib_resources.files("mlsched.workloads").joinpath("data", DATA_FILE).read_text()
    rows = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            model, _mode, batch, ps, w, speeds, ps_cpu, w_cpu = ast.literal_eval(line)
        except (ValueError, SyntaxError) as exc:  # pragma: no cover - shipped data
            raise ValueError(f"{DATA_FILE}:{lineno}: unreadable row: {exc}") from exc
        rows.append(Measurement(catalog.canonical_name(model), batch, ps, w, float(sum(speeds)),
                                tuple(ps_cpu), tuple(w_cpu)))
    return rows


@dataclass(frozen=True)
class ModelGrid:
    ps_values: np.ndarray  # sorted grid coordinates
    worker_values: np.ndarray
    speed: np.ndarray  # (len(ps_values), len(worker_values)); NaN where missing


def _fill_missing(grid: np.ndarray) -> np.ndarray:
    """Replace NaNs by the mean of their present 4-neighbours, repeating until none are left."""
    g = grid.copy()
    while np.isnan(g).any():
        padded = np.pad(g, 1, constant_values=np.nan)
        neigh = np.stack([padded[:-2, 1:-1], padded[2:, 1:-1], padded[1:-1, :-2], padded[1:-1, 2:]])
        counts = (~np.isnan(neigh)).sum(axis=0)
        means = np.where(counts > 0, np.nansum(neigh, axis=0) / np.maximum(counts, 1), np.nan)
        holes = np.isnan(g) & (counts > 0)
        if not holes.any():
            raise ValueError("speed grid has no measured points")
        g[holes] = means[holes]
    return g


def _interp_axis(values: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lower index, upper index and weight of the upper one, for each x (clamped to the grid)."""
    xc = np.clip(x, values[0], values[-1])
    hi = np.clip(np.searchsorted(values, xc, side="left"), 0, len(values) - 1)
    lo = np.clip(hi - 1, 0, len(values) - 1)
    exact = values[hi] == xc
    lo = np.where(exact, hi, lo)
    span = values[hi] - values[lo]
    w = np.where(span > 0, (xc - values[lo]) / np.where(span > 0, span, 1), 0.0)
    return lo, hi, w


@lru_cache(maxsize=1)
def grids() -> dict[str, ModelGrid]:
    by_model: dict[str, dict[tuple[int, int], float]] = {}
    for m in load_measurements():
        by_model.setdefault(m.model, {})[(m.ps, m.workers)] = m.speed
    out = {}
    for model, points in by_model.items():
        ps_vals = np.array(sorted({p for p, _ in points}), dtype=float)
        w_vals = np.array(sorted({w for _, w in points}), dtype=float)
        g = np.full((len(ps_vals), len(w_vals)), np.nan)
        for (p, w), s in points.items():
            if s > 0:  # zero = failed run: missing, not a real zero
                g[np.searchsorted(ps_vals, p), np.searchsorted(w_vals, w)] = s
        out[model] = ModelGrid(ps_vals, w_vals, _fill_missing(g))
    return out


@lru_cache(maxsize=1)
def speed_tables() -> dict[str, np.ndarray]:
    """steps/s for every integer (ps, workers) in 0..MAX_TASKS, per model."""
    tables = {}
    counts = np.arange(MAX_TASKS + 1, dtype=float)
    for model, grid in grids().items():
        plo, phi, pw = _interp_axis(grid.ps_values, counts)
        wlo, whi, ww = _interp_axis(grid.worker_values, counts)
        s = grid.speed
        t = ((1 - pw)[:, None] * (1 - ww)[None, :] * s[np.ix_(plo, wlo)]
             + (1 - pw)[:, None] * ww[None, :] * s[np.ix_(plo, whi)]
             + pw[:, None] * (1 - ww)[None, :] * s[np.ix_(phi, wlo)]
             + pw[:, None] * ww[None, :] * s[np.ix_(phi, whi)])
        t[0, :] = 0.0
        t[:, 0] = 0.0
        t.setflags(write=False)
        tables[model] = t
    return tables


def table_speed(model: str, ps: int, workers: int) -> float:
    """Interpolated steps/s of a PS job; 0 when it has no PS or no workers."""
    if ps <= 0 or workers <= 0:
        return 0.0
    t = speed_tables()[model]
    return float(t[min(ps, MAX_TASKS), min(workers, MAX_TASKS)])

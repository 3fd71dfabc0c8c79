"""Seeded trace generators shaped like the DL² simulator's workloads.

Arrivals come per time slot (default 1200 s), spread uniformly inside the slot:
- `poisson`: Poisson(rate) jobs per slot;
- `uniform`: exactly `rate` jobs per slot;
- `google`: the 75-slot per-slot arrival-count pattern published with the DL² simulator
  (`trace.py` of pengyanghua/DL2, its 50-per-slot variant, derived from the Google cluster
  trace), rescaled so its busiest regular slot brings `rate` jobs (the second entry, a burst,
  is kept as a burst of 3x `rate`).
Job types are uniform over the catalog (or a given subset). Job lengths are long-tailed: the
time a job would need alone with 1 PS and 1 worker is log-normal (median 80 min, σ = 1,
so the mean is about 130 min, close to the 147 min mean duration the DL² paper reports for
its production trace), clipped to [5 min, 48 h]; epochs follow from the model's measured
speed. `arch_mix` is the fraction of all-reduce jobs.
"""

from __future__ import annotations

import numpy as np

from mlsched.workloads import catalog, speed_table
from mlsched.workloads.traces import TraceJob

# Source: pengyanghua/DL2, trace.py, arrv_pattern_50 (per-slot arrival counts, 75 slots).
GOOGLE_PATTERN_50 = (
    33, 672, 40, 38, 43, 54, 45, 38, 31, 27, 33, 27, 36, 43, 46, 32, 43, 44, 41, 42, 37, 26,
    25, 36, 49, 36, 25, 27, 25, 19, 25, 30, 24, 34, 30, 31, 37, 38, 23, 29, 28, 18, 27, 28,
    24, 30, 29, 30, 28, 18, 23, 22, 34, 36, 35, 39, 37, 38, 34, 34, 30, 34, 36, 31, 21, 34,
    21, 26, 24, 34, 29, 30, 26, 36, 31,
)
PATTERNS = ("poisson", "uniform", "google")


def _per_slot_counts(pattern: str, rate: float, slots: int, rng: np.random.Generator) -> np.ndarray:
    if pattern == "poisson":
        return rng.poisson(rate, slots)
    if pattern == "uniform":
        whole = int(rate)
        extra = rng.random(slots) < (rate - whole)  # fractional rates: Bernoulli remainder
        return np.full(slots, whole) + extra
    if pattern == "google":
        base = np.array(GOOGLE_PATTERN_50, dtype=float)
        regular = np.delete(base, 1).max()
        scaled = base * rate / regular
        scaled[1] = 3 * rate
        offset = rng.integers(len(base))
        idx = (np.arange(slots) + offset) % len(base)
        frac = scaled[idx]
        return np.floor(frac).astype(int) + (rng.random(slots) < frac - np.floor(frac))
    raise ValueError(f"unknown arrival pattern {pattern!r}; choose one of {', '.join(PATTERNS)}")


def generate(
    jobs: int = 60,
    rate: float = 3.0,
    pattern: str = "poisson",
    seed: int = 0,
    interval_s: float = 1200.0,
    models: tuple[str, ...] | None = None,
    median_minutes: float = 80.0,
    sigma: float = 1.0,
    arch_mix: float = 0.0,
) -> list[TraceJob]:
    if jobs <= 0:
        raise ValueError("jobs must be > 0")
    if rate <= 0:
        raise ValueError("rate must be > 0")
    rng = np.random.default_rng(seed)
    names = tuple(catalog.canonical_name(m) for m in models) if models else catalog.MODEL_NAMES
    arrivals: list[float] = []
    slot = 0
    while len(arrivals) < jobs:
        counts = _per_slot_counts(pattern, rate, 64, rng)
        for c in counts:
            arrivals.extend(sorted((slot + rng.random(int(c))) * interval_s))
            slot += 1
            if len(arrivals) >= jobs:
                break
    arrivals = arrivals[:jobs]
    out = []
    for i, arrival in enumerate(arrivals):
        model = names[rng.integers(len(names))]
        arch = "allreduce" if rng.random() < arch_mix else "ps"
        minutes = float(np.clip(rng.lognormal(np.log(median_minutes), sigma), 5, 48 * 60))
        ref_epochs_per_s = speed_table.table_speed(model, 1, 1) / catalog.MODELS[model].steps_per_epoch
        epochs = max(1.0, round(minutes * 60 * ref_epochs_per_s, 1))
        out.append(TraceJob(f"job-{i:04d}", round(arrival, 1), model, epochs, arch))
    return out

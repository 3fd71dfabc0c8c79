"""Candidate against active: the same held-out simulated traces, the same process, greedy both.

Both are loaded from their ONNX files exactly as the operator serves them (DL2Policy.load),
so what is judged is what would ship. The ratio is the candidate's mean average JCT over the
traces to the active model's (below 1: the candidate is faster); a trace where a model
leaves jobs unfinished counts as infinitely slow for it.
"""

from __future__ import annotations

import math
import sys

import numpy as np
from tqdm import tqdm

from mlsched.policies import registry
from mlsched.policies.allocation.dl2 import DL2Policy
from mlsched.sim.simulator import Simulator


def avg_jct(model_path: str, trace, config) -> float:
    result = Simulator(trace, config).run(DL2Policy.load(str(model_path)), registry.make_placement("load-balance"))
    return result.summary()["avg_jct_s"] if result.completed == result.jobs else math.inf


def compare(active: str, candidate: str, cases: list[tuple[list, object]], jct=avg_jct) -> dict:
    """`cases`: (trace, SimConfig) pairs; `jct(model path, trace, config)` runs one (DL²'s by
    default; the Harmony retrainer passes its own). Returns the numbers the evaluation
    annotation holds."""
    a, c = [], []
    for trace, config in tqdm(cases, desc="evaluating", file=sys.stderr, disable=None, leave=False):
        a.append(jct(active, trace, config))
        c.append(jct(candidate, trace, config))
    ratio = float(np.mean(c) / np.mean(a)) if np.isfinite(np.mean(a)) else (0.0 if np.isfinite(np.mean(c)) else 1.0)
    return {"traces": len(cases), "active_avg_jct_s": round(float(np.mean(a)), 1),
            "candidate_avg_jct_s": round(float(np.mean(c)), 1), "ratio": round(ratio, 4),
            "per_trace_ratio": [round(x / y, 4) if np.isfinite(x / y) else None for x, y in zip(c, a)]}


def better_by(evaluation: dict, margin: float) -> bool:
    """Publish only a candidate whose JCT ratio is at most 1 - margin."""
    return evaluation["ratio"] <= 1.0 - margin

"""Calibrate the simulator's per-model speeds to what a cluster's interval records show.

For every job that trained through a whole interval on a grant it already held in the
previous one, the simulator's speed model predicts how many epochs it should have trained:
its speed at (PS, workers, nodes spanned) times the interference factor of the interval's
co-tenants (workloads.interference, from the recorded placements), over the interval's
length less the scaling cost when its tasks moved. The ratio of observed to predicted epochs
is one sample of that model's speed factor; the factor is the median of the samples.

What is left out, and why: jobs that finished inside the interval (they trained less than
the interval allowed), jobs that held nothing in the previous interval (an admission step
may have started them part-way through) and grants of zero workers. Co-tenants that start,
move or finish inside an interval change the interference a job saw for part of it, by an
amount the records cannot tell: samples from jobs none of whose nodes saw such a change
("calm") are used when a model has enough of them, all samples otherwise. The median, not
the mean, so that the remaining odd samples (and measurement noise) do not pull it.

Models with fewer than `min_samples` samples keep the prior (1, or an earlier calibration's
factor), and model types outside the catalog cannot be simulated at all: both are reported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mlsched.policies.decision_log import IntervalRecord
from mlsched.workloads import catalog, interference
from mlsched.workloads.speed_models import epochs_per_s, get_speed_model

FORMAT = "mlsched.io/speed-calibration"
ARCH = {"ParameterServer": "ps", "AllReduce": "allreduce"}


@dataclass
class Calibration:
    speed_factors: dict[str, float]
    samples: dict[str, int] = field(default_factory=dict)
    spread: dict[str, float] = field(default_factory=dict)  # median absolute deviation of the ratios
    kept_prior: list[str] = field(default_factory=list)  # too few samples: the prior factor stands
    unknown_models: list[str] = field(default_factory=list)  # not in the catalog: not simulated
    intervals: tuple[int, int] | None = None

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": 1, "speed_factors": self.speed_factors, "samples": self.samples,
                "spread": self.spread, "kept_prior": self.kept_prior, "unknown_models": self.unknown_models,
                "intervals": list(self.intervals) if self.intervals else None}

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n")

    @classmethod
    def read(cls, path: Path) -> "Calibration":
        doc = json.loads(Path(path).read_text())
        if doc.get("format") != FORMAT:
            raise ValueError(f"{path} is not a speed calibration (format {doc.get('format')!r})")
        return cls(speed_factors=doc["speed_factors"], samples=doc.get("samples", {}), spread=doc.get("spread", {}),
                   kept_prior=doc.get("kept_prior", []), unknown_models=doc.get("unknown_models", []),
                   intervals=tuple(doc["intervals"]) if doc.get("intervals") else None)


def _grant(job) -> tuple:
    return tuple(job.placement.get("ps", [])), tuple(job.placement.get("worker", []))


def speed_samples(records: list[IntervalRecord], scaling_cost_s: float = 30.0, with_interference: bool = True,
                  speed_model: str = "measured") -> dict[str, list[tuple[float, bool]]]:
    """(observed / predicted epochs, calm) per catalog model, over the steady job-intervals;
    `calm`: no job on the job's nodes started, moved or finished in the interval either, so
    the interference it saw was the same all interval long."""
    speed = get_speed_model(speed_model)
    out: dict[str, list[tuple[float, bool]]] = {}
    previous: dict[str, tuple] = {}  # job uid -> grant in the previous interval of the history
    last_interval = None
    for rec in sorted(records, key=lambda r: r.interval):
        if last_interval is not None and rec.interval != last_interval + 1:
            previous = {}  # a gap in the history: nothing is known about the interval before
        last_interval = rec.interval
        index = {}
        placements = {}
        for j in rec.jobs:
            if j.workers > 0 and catalog.is_known(j.model_type):
                nodes = [index.setdefault(n, len(index)) for n in j.placement.get("ps", []) + j.placement.get("worker", [])]
                placements[j.uid] = (catalog.canonical_name(j.model_type), nodes)
        # Jobs that finished, or held nothing before (an admission step may have started them),
        # may have been on their nodes for part of the interval only: interference with them (the records cannot say
        # for how long) brackets the truth between "all interval" and "not at all".
        partial = {j.uid for j in rec.jobs if j.uid in placements and (j.finished or j.uid not in previous)}
        factors = interference.job_speed_factors(placements) if with_interference else {}
        settled = {u: p for u, p in placements.items() if u not in partial}

        def without_partial(uid: str) -> float:  # the job itself stays, whatever it is
            if not with_interference or not partial:
                return factors.get(uid, 1.0)
            return interference.job_speed_factors({**settled, uid: placements[uid]})[uid]
        unsettled = {n for j in rec.jobs if j.workers > 0 and (j.finished or previous.get(j.uid) != _grant(j))
                     for n in j.placement.get("ps", []) + j.placement.get("worker", [])}
        now: dict[str, tuple] = {}
        for j in rec.jobs:
            if j.workers <= 0:
                continue
            grant = _grant(j)
            now[j.uid] = grant
            held_before = previous.get(j.uid)
            if j.finished or held_before is None or not held_before[1] or j.uid not in placements:
                continue
            model = placements[j.uid][0]
            rate = epochs_per_s(speed, model, ARCH.get(j.architecture, "ps"), j.ps, j.workers,
                                len(set(grant[1])))
            usable = rec.length_s - (scaling_cost_s if held_before != grant else 0.0)
            # the geometric middle of the bracket (exact when no neighbour was partial)
            predicted = rate * float(np.sqrt(factors.get(j.uid, 1.0) * without_partial(j.uid))) * usable
            if predicted > 0 and j.epochs > 0:
                calm = not unsettled.intersection(grant[0] + grant[1])
                out.setdefault(model, []).append((j.epochs / predicted, calm))
        previous = now
    return out


def calibrate(records: list[IntervalRecord], prior: dict[str, float] | None = None, min_samples: int = 5,
              scaling_cost_s: float = 30.0, with_interference: bool = True) -> Calibration:
    samples = speed_samples(records, scaling_cost_s, with_interference)
    factors = dict(prior or {})
    counts, spread, kept = {}, {}, []
    for model in catalog.MODEL_NAMES:
        pairs = samples.get(model, [])
        calm = [r for r, c in pairs if c]
        # Calm samples when there are enough of them: a neighbour that finished part-way
        # through sped the job up for the rest of the interval, one that started slowed it.
        ratios = np.array(calm if len(calm) >= min_samples else [r for r, _ in pairs])
        counts[model] = int(ratios.size)
        if ratios.size < min_samples:
            kept.append(model)
            continue
        med = float(np.median(ratios))
        factors[model] = round(med, 4)
        spread[model] = round(float(np.median(np.abs(ratios - med))), 4)
    unknown = sorted({j.model_type for r in records for j in r.jobs if not catalog.is_known(j.model_type)})
    span = (min(r.interval for r in records), max(r.interval for r in records)) if records else None
    return Calibration(factors, counts, spread, kept, unknown, span)

"""How a round serves its learned phases: exploration (bounded by the operator) and the decision
log (issue 17). Pure: the loop passes what it knows, gets back the policy objects to run for
this round and the recorders to finish once the decision is made.

- Exploration: `spec.exploration.epsilon`, at most `--max-exploration` (a tenant cannot make
  the cluster schedule at random); the applied value is in `status.exploration`.
- The generator is seeded by policy, interval, kind and the decision's time as recorded, so a
  recorded decision can be replayed: crc32("<namespace>/<policy>|<interval>|<kind>|<time>").
- A decision log is kept for each learned phase (`learned`, base.LearnedPolicy) when the
  policy keeps a dataset (`spec.retraining.datasetLimit` > 0).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mlsched.policies.decision_log import DecisionRecorder, RoundDecisions
from mlsched.policies.exploration import Serving


def applied_epsilon(requested: float, maximum: float) -> float:
    return max(0.0, min(requested, maximum))


def seed(namespace: str, policy: str, interval: int, kind: str, time: str) -> int:
    return zlib.crc32(f"{namespace}/{policy}|{interval}|{kind}|{time}".encode())


@dataclass
class RoundServing:
    """The phases to run this round, and their recorders."""

    phases: dict[str, Any]  # phase -> policy object (a per-round copy where it explores/records)
    recorders: list[DecisionRecorder] = field(default_factory=list)

    def keep(self, kept: dict[str, tuple[tuple[int, int], tuple[int, int]]]) -> None:
        """What the cycle guard kept (Decision.kept), in the allocation phase's decision log."""
        for recorder in self.recorders:
            if recorder.meta["phase"] == "allocation":
                recorder.keep(kept)

    def decisions(self) -> list[RoundDecisions]:
        return [d for d in (r.finish() for r in self.recorders) if d is not None]


def serve(phases: dict[str, Any], *, namespace: str, policy: str, interval: int, kind: str,
          time: str, epsilon: float, record: bool,
          versions: dict[str, int | None] | None = None) -> RoundServing:
    """`phases`: phase -> the resolved policy object; `versions`: "phase/algorithm" -> the
    published version serving it (None: a spec file or the shipped model)."""
    out = RoundServing(dict(phases))
    if epsilon <= 0 and not record:
        return out
    for phase, chosen in phases.items():
        card = getattr(chosen, "card", None)
        # (a grouping policy is never learned: it has no `learned`)
        if not getattr(chosen, "learned", False) or card is None:
            continue  # a heuristic: nothing to explore or record
        recorder = None
        if record:
            version = (versions or {}).get(f"{phase}/{card.algorithm}")
            recorder = DecisionRecorder(
                algorithm=card.algorithm, phase=phase, kind=kind, time=time,
                model_sha256=card.onnx_sha256,
                model_version=str(version) if version is not None else None,
                encoder=card.encoder_name, encoder_version=card.encoder_version,
                encoder_params=card.encoder_params, epsilon=epsilon)
            out.recorders.append(recorder)
        rng = np.random.default_rng(seed(namespace, policy, interval, kind, time)) if epsilon > 0 else None
        out.phases[phase] = chosen.for_round(Serving(epsilon, rng, recorder))
    return out

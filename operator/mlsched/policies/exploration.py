"""Exploration while serving a learned policy, and the probabilities off-policy learning needs.

With probability epsilon a uniformly random allowed action replaces the policy's own (issue
17): retraining then sees alternatives the greedy policy never takes, and divides by the
probability with which the serving policy took each action (the behaviour probability):

    greedy serving (DL²):     mu(a) = (1 - eps) * [a == greedy] + eps / |allowed|
    sampling serving (Chic):  mu(a) = (1 - eps) * pi(a)        + eps / |allowed|

where pi is the network's distribution renormalised over the allowed actions. The generator
is seeded by the caller (the operator: per policy, interval and step), so a decision can be
replayed exactly; with epsilon 0 it is never drawn from, and serving is what it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from mlsched.policies.decision_log import DecisionRecorder


@dataclass
class Serving:
    """How one round serves a learned phase: exploration and, when asked, a decision log."""

    epsilon: float = 0.0
    rng: np.random.Generator | None = None  # required when epsilon > 0
    recorder: DecisionRecorder | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.epsilon <= 1.0:
            raise ValueError(f"epsilon {self.epsilon} is not a probability")
        if self.epsilon > 0 and self.rng is None:
            raise ValueError("exploration needs a seeded generator")

    def explore(self, mask: np.ndarray) -> int | None:
        """A uniformly random allowed action with probability epsilon, else None."""
        if self.epsilon <= 0 or self.rng.random() >= self.epsilon:
            return None
        return int(self.rng.choice(np.flatnonzero(mask)))


def renormalised(probs: np.ndarray, mask: np.ndarray, action: int) -> float:
    """pi(action) over the allowed actions only (what a sampling actor draws from)."""
    total = float(np.where(mask, probs, 0.0).sum())
    return float(probs[action]) / total if total > 0 else 0.0


def greedy_behaviour(epsilon: float, allowed: int, action: int, greedy: int) -> float:
    return (1.0 - epsilon) * float(action == greedy) + epsilon / max(1, allowed)


def sampling_behaviour(epsilon: float, allowed: int, pi: float) -> float:
    return (1.0 - epsilon) * pi + epsilon / max(1, allowed)

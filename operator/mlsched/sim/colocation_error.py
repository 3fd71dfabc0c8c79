"""How far harmony's co-location model is from what the simulator runs (issue 51, part 4).

Harmony predicts, per pool, the group's iteration time T_g (PoolPlan.forecasts, from its
profiles and model.group_time): each member makes one iteration per T_g. The simulator's
ground truth is the job's rate under the co-location rule per node and interference, at
the counts and nodes the allocation and placement gave it. Each slot, every job in a pool
of two or more members (the pairings the model was used for) adds one (predicted, true)
iteration speed; the error is the mean of |predicted − true| / true.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ColocationError:
    samples: int = 0  # job-slots in shared pools compared
    _sum: float = 0.0

    def add(self, predicted_iteration_s: float, true_iteration_s: float) -> None:
        if predicted_iteration_s > 0 and true_iteration_s > 0:
            # speeds are 1 / iteration time: |1/p − 1/t| / (1/t) = |t/p − 1|
            self._sum += abs(true_iteration_s / predicted_iteration_s - 1.0)
            self.samples += 1

    @property
    def mare(self) -> float:
        """Mean absolute relative error of the predicted co-located speed (0 when none)."""
        return self._sum / self.samples if self.samples else 0.0

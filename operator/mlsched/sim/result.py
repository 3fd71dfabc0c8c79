"""What a simulator run returns (SimResult): each job's JCT and ideal time, utilisation, and
the tallies of the round's checks and guards; `summary()` is the figures a benchmark prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class SimResult:
    jct_s: dict[str, float]
    ideal_s: dict[str, float]
    makespan_s: float
    gpu_util: float
    cpu_util: float
    jobs: int
    completed: int
    slots: int
    inferences: int
    total_reward: float
    compute_util: float = 0.0  # busy compute (cpu/gpu) node-seconds / (nodes x makespan)
    net_util: float = 0.0  # busy NIC node-seconds / (nodes x makespan)
    # Work conservation (policies/work_conservation.py), over the rounds of `run` (admission
    # steps not counted): rounds that left idle capacity a waiting job's minimum would fit,
    # and the mean of what those jobs' minimums would have used in them.
    rounds: int = 0
    nonconserving_rounds: int = 0
    idle_gpus: float = 0.0
    idle_cpus: float = 0.0
    idle_tasks: float = 0.0
    # Model domain (policies/model_domain.py): rounds of `run` checked (those a learned model
    # served; 0 for heuristics), those outside the trained domain of a served model (its
    # card's), what was outside (first value found, per model and figure; "" when nothing),
    # and the served models whose cards record no domain.
    domain_rounds: int = 0
    rounds_outside_domain: int = 0
    outside_domain: str = ""
    no_domain: tuple[str, ...] = ()
    # Harmony grouping (sim/grouping_guard.py, sim/colocation_error.py): decisions won by each
    # candidate (harmony, isolated, none), and the co-location model's mean absolute relative
    # error of predicted vs true co-located speed over the job-slots in pools of 2+ jobs.
    grouping_choices: dict[str, int] = field(default_factory=dict)
    colocation_samples: int = 0
    colocation_mare: float = 0.0
    # A guarded learned placement (policies/placement/guarded.py): decisions won by the
    # network's layout ("learned") and by the fallback's ("fallback") in this run.
    placement_choices: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict:
        jct = np.array(list(self.jct_s.values())) if self.jct_s else np.array([np.nan])
        ideal = np.array([self.ideal_s[n] for n in self.jct_s]) if self.jct_s else np.array([np.nan])
        return {
            "avg_jct_s": float(jct.mean()),
            "p50_jct_s": float(np.percentile(jct, 50)),
            "p95_jct_s": float(np.percentile(jct, 95)),
            "makespan_s": self.makespan_s,
            "gpu_util": self.gpu_util,
            "cpu_util": self.cpu_util,
            "avg_slowdown": float((jct / ideal).mean()),
            "ideal_avg_jct_s": float(ideal.mean()),
            "jobs": self.jobs,
            "completed": self.completed,
            "compute_util": self.compute_util,
            "net_util": self.net_util,
            "rounds": self.rounds,
            "nonconserving_rounds": self.nonconserving_rounds,
            "idle_gpus": self.idle_gpus,
            "idle_cpus": self.idle_cpus,
            "idle_tasks": self.idle_tasks,
            "rounds_outside_domain": self.rounds_outside_domain,
            "outside_domain": self.outside_domain,
            "grouping_choices": dict(self.grouping_choices),
            "colocation_samples": self.colocation_samples,
            "colocation_mare": self.colocation_mare,
            "placement_choices": dict(self.placement_choices),
        }


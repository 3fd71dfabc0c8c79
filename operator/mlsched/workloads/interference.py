"""Interference between tasks of different jobs that share a node.

Each model has an intensity (how much pressure one of its tasks puts on a node's shared CPU,
network and PCIe/disk) and a sensitivity (how much it suffers from such pressure). A task on
node n runs at 1 / (1 + sensitivity · Σ intensity of the other jobs' tasks on n); a
synchronous job runs at the pace of its slowest task. Tasks of the same job do not count
against each other: their cost is already in the measured speed table.

Calibration (see docs/interference.md and tests/test_interference.py): the Harmony placement
paper (Bao et al., §III) reports, on the DL² testbed with 1 PS + 1 worker per job:
  - six jobs bin-packed two per server: about 33 % mean slowdown, ResNeXt nearly 2x slower;
  - ResNeXt+WLM and ResNeXt+Seq2Seq interfere little; CTC hurts every neighbour;
  - ResNeXt suffers more from CTC than VGG-16 does.
The numbers below were set by hand to reproduce these effects, guided by the measured CPU
usage (CTC and DSSM workers use the most CPU; ResNeXt, Inception and WLM PSs too) and by model
size (VGG-16's 553 MB makes it the network-heavy one).
"""

from __future__ import annotations

import numpy as np

DIMENSIONS = ("cpu", "network", "pcie")

# Per task: pressure on (cpu, network, pcie).
INTENSITY: dict[str, np.ndarray] = {
    "resnet-50": np.array([0.25, 0.30, 0.25]),
    "vgg-16": np.array([0.15, 0.65, 0.30]),
    "resnext-110": np.array([0.30, 0.05, 0.15]),
    "inception-bn": np.array([0.30, 0.15, 0.20]),
    "seq2seq": np.array([0.05, 0.10, 0.15]),
    "cnn-text-classification": np.array([0.90, 0.10, 0.05]),
    "dssm": np.array([0.50, 0.05, 0.05]),
    "wlm": np.array([0.05, 0.05, 0.15]),
}

# Per model: sensitivity to (cpu, network, pcie) pressure.
SENSITIVITY: dict[str, np.ndarray] = {
    "resnet-50": np.array([0.35, 0.45, 0.40]),
    "vgg-16": np.array([0.20, 0.80, 0.30]),
    "resnext-110": np.array([0.60, 0.10, 0.20]),
    "inception-bn": np.array([0.40, 0.30, 0.30]),
    "seq2seq": np.array([0.15, 0.25, 0.25]),
    "cnn-text-classification": np.array([0.30, 0.20, 0.10]),
    "dssm": np.array([0.40, 0.20, 0.10]),
    "wlm": np.array([0.20, 0.20, 0.40]),
}


def job_speed_factors(placements: dict[str, tuple[str, list[int]]],
                      groups: dict[str, str] | None = None) -> dict[str, float]:
    """Speed multiplier (0, 1] per job from where every job's tasks are.

    `placements` maps job -> (model, node index of each of its tasks). `groups` maps jobs to
    a coordinated co-location group (Harmony): members of one group do not count against each
    other, like tasks of one job, because their phases are serialised and the simulator's
    co-location model (sim/colocation.py) charges that queueing instead; charging the
    contention as well would count the same sharing twice (docs/grouping.md).
    """
    if groups:
        return _grouped_factors(placements, groups)
    per_node = _intensity_per_node(placements)
    factors = {}
    for job, (model, nodes) in placements.items():
        worst = 0.0
        sens = SENSITIVITY[model]
        for n in set(nodes):
            jobs_here = per_node[n]
            if len(jobs_here) < 2:
                continue
            total = sum(jobs_here.values())
            others = total - jobs_here[job]
            worst = max(worst, float(sens @ others))
        factors[job] = 1.0 / (1.0 + worst)
    return factors


def _intensity_per_node(placements: dict[str, tuple[str, list[int]]]) -> dict[int, dict[str, np.ndarray]]:
    """node -> job -> the summed intensity of the job's tasks on that node."""
    per_node: dict[int, dict[str, np.ndarray]] = {}
    for job, (model, nodes) in placements.items():
        for n in nodes:
            d = per_node.setdefault(n, {})
            d[job] = d.get(job, 0.0) + INTENSITY[model]
    return per_node


def _grouped_factors(placements: dict[str, tuple[str, list[int]]],
                     groups: dict[str, str]) -> dict[str, float]:
    per_node = _intensity_per_node(placements)
    factors = {}
    for job, (model, nodes) in placements.items():
        worst = 0.0
        sens = SENSITIVITY[model]
        mine = groups.get(job)
        for n in set(nodes):
            others = [p for other, p in per_node[n].items()
                      if other != job and (mine is None or groups.get(other) != mine)]
            if others:
                worst = max(worst, float(sens @ sum(others)))
        factors[job] = 1.0 / (1.0 + worst)
    return factors


def pair_slowdown(victim: str, neighbour: str, tasks_each: int = 2) -> float:
    """Slowdown (1 - speed ratio) of `victim` sharing a node with `neighbour`, each with
    `tasks_each` tasks on it — the Harmony paper's pairwise experiment."""
    f = job_speed_factors({"a": (victim, [0] * tasks_each), "b": (neighbour, [0] * tasks_each)})
    return 1.0 - f["a"]

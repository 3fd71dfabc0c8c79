"""Interference-aware placement baselines of the Harmony placement paper (Bao et al., ToN 2022,
§VII-B; digest: shared/research/seed-harmony-placement.md §7; docs/placement.md).

- lif-line / lif-quad (Least Interference First, after Bu et al., HPDC'13, and TRACON): a
  task's slowdown is a linear (or quadratic) function of the CPU and network load its
  co-tenants put on the node, fitted per model by least squares to profiling samples. A task
  goes to the node with the lowest interference score: the predicted slowdown of every task
  on it, its own included, were it added. LIF models CPU and network only, not the PCIe bus,
  which is why it is accurate for CPU-bound CTC and poor for GPU-bound Seq2Seq in the paper.
- tiresias: Tiresias (Gu et al., NSDI'19) consolidates a job onto as few nodes as possible
  when its model's tensor sizes are skewed (a few large tensors make the parameter servers
  holding them a network hot spot) and otherwise spreads, ignoring CPU and I/O interference.

Profiling here means the simulator's interference model (workloads/interference.py) measured
on one reference node with random co-tenants, with 5 % multiplicative noise: what a cluster
operator would measure with stress runs. The fit is made once per process (fixed seed).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import JobView, Role
from mlsched.policies.base import TaskByTaskPlacement
from mlsched.policies.placement.heuristics import _pick
from mlsched.workloads import interference

#: Reference node's CPU cores (interference.node_capacity): node load is demand over this.
REFERENCE_CPUS = 8.0
PROFILE_SAMPLES = 400  # per model
PROFILE_NOISE = 0.05  # relative, on each measured slowdown
PROFILE_SEED = 0


def _features(x: np.ndarray, degree: int) -> np.ndarray:
    """(cpu, net) loads (..., 2) → regression features; no intercept: no co-tenant, no
    slowdown."""
    c, n = x[..., 0], x[..., 1]
    cols = [c, n] if degree == 1 else [c, n, c * c, n * n, c * n]
    return np.stack(cols, axis=-1)


@lru_cache(maxsize=2)
def fitted(degree: int) -> dict[str, np.ndarray]:
    """Per catalog model, the least-squares coefficients of slowdown (extra step time over
    alone) on the co-tenants' (cpu, network) load; '*' is their mean, for models not in the
    catalog."""
    rng = np.random.default_rng(PROFILE_SEED)
    models = list(interference.DEMAND)
    out = {}
    for victim in models:
        X, y = [], []
        for _ in range(PROFILE_SAMPLES):
            placements = {"victim": (victim, [0] * int(rng.integers(1, 3)))}
            for k in range(int(rng.integers(1, 5))):
                placements[f"n{k}"] = (models[int(rng.integers(len(models)))], [0] * int(rng.integers(1, 4)))
            load = sum(len(nodes) * interference.DEMAND[m][:2]
                       for job, (m, nodes) in placements.items() if job != "victim")
            factor = interference.job_speed_factors(placements)["victim"]
            X.append(load)
            y.append((1.0 / factor - 1.0) * (1.0 + PROFILE_NOISE * rng.standard_normal()))
        coef, *_ = np.linalg.lstsq(_features(np.array(X), degree), np.array(y), rcond=None)
        out[victim] = coef
    out["*"] = np.mean([out[m] for m in models], axis=0)
    return out


def predicted_slowdown(model: str, load: np.ndarray, degree: int) -> np.ndarray:
    """LIF's prediction for `model` under co-tenant loads (..., 2), never below 0."""
    coef = fitted(degree).get(model, fitted(degree)["*"])
    return np.maximum(_features(np.asarray(load, dtype=float), degree) @ coef, 0.0)


def _usage(model: str) -> np.ndarray:
    """One task's (cpu, network) demand on the reference node; the catalog mean for a model
    the catalog lacks (any image may run in the cluster)."""
    d = interference.DEMAND.get(model)
    if d is None:
        d = np.mean(list(interference.DEMAND.values()), axis=0)
    return d[:2]


class LeastInterferenceFirst(TaskByTaskPlacement):
    def __init__(self, degree: int = 1, sensitivity: dict[str, float] | None = None):
        self.degree = degree
        self.name = "lif-line" if degree == 1 else "lif-quad"
        # model -> factor on its predicted slowdown: a cluster's calibrated sensitivities
        # (policy_models/retrain/calibration.py), checked as the simulator checks them; the
        # profile's own when None.
        self.sensitivity = interference.sensitivity_factors(sensitivity) or {}

    def choose_node(self, ledger: Ledger, job: JobView, role: Role, demand: np.ndarray) -> int | None:
        mask = ledger.fits_mask(demand, job, role)
        nodes = np.flatnonzero(mask)
        if not nodes.size:
            return None
        scores = np.array([self._score(ledger, int(n), job.name, job.model) for n in nodes])
        return int(nodes[int(scores.argmin())])  # ties: the lowest node index

    def _score(self, ledger: Ledger, node: int, name: str, model: str) -> float:
        """Predicted slowdown of every task on `node` with one more task of job `name`."""
        count: dict[str, int] = {name: 1}
        model_of = {name: model}
        for job, m, _ in ledger.tasks_on[node]:
            count[job] = count.get(job, 0) + 1
            model_of[job] = m
        if len(count) == 1:
            return 0.0  # tasks of one job do not interfere with each other
        cpus = float(ledger.capacity[node, 0])
        scale = np.array([REFERENCE_CPUS / cpus if cpus > 0 else np.inf, 1.0])
        usage = {j: count[j] * _usage(model_of[j]) for j in count}
        total = sum(usage.values())
        return float(sum(count[j] * self.sensitivity.get(model_of[j], 1.0)
                         * predicted_slowdown(model_of[j], (total - usage[j]) * scale, self.degree)
                         for j in count))


#: Share of a model's parameters in its largest tensor: the skew Tiresias decides by. VGG-16
#: and ResNet-50 are computed from their published architectures (VGG-16: fc6, 25088 x 4096 of
#: 138.4 M parameters; ResNet-50: a 3x3x512x512 convolution, 2.4 M of 25.6 M). The others
#: are our estimates by architecture (docs/placement.md): CIFAR ResNeXt and Inception-BN have
#: no dominant layer; the text models' word embedding (or output) matrix is most of the model.
LARGEST_TENSOR_SHARE = {
    "vgg-16": 0.74,
    "resnet-50": 0.09,
    "resnext-110": 0.05,
    "inception-bn": 0.09,
    "seq2seq": 0.35,
    "cnn-text-classification": 0.6,
    "dssm": 0.5,
    "wlm": 0.45,
}


class TiresiasPlacement(TaskByTaskPlacement):
    """Consolidate jobs whose largest tensor holds more than `skew_threshold` of the model
    (onto the nodes it already uses, then the fullest that fits); spread the rest (the least
    loaded node). A model not in the table is spread."""

    name = "tiresias"

    def __init__(self, skew_threshold: float = 0.3):
        self.skew_threshold = skew_threshold

    def consolidates(self, model: str) -> bool:
        return LARGEST_TENSOR_SHARE.get(model, 0.0) > self.skew_threshold

    def choose_node(self, ledger: Ledger, job: JobView, role: Role, demand: np.ndarray) -> int | None:
        if not self.consolidates(job.model):
            return _pick(ledger, job, role, demand, ledger.load)
        held = ledger.jobs.get(job.name)
        mine = np.zeros(len(ledger.load))
        if held is not None:
            np.add.at(mine, held.ps_nodes + held.worker_nodes, 1.0)
        # Nodes holding more of the job first (a large weight), then the fullest (bin-pack).
        return _pick(ledger, job, role, demand, -(mine * 1e3 + ledger.load))

"""Interference between tasks of different jobs that share a node.

Three shared resources a scheduler does not allocate: the CPU (cores, caches, memory
bandwidth), the NIC and the PCIe bus. Each model has a demand per task (the share of a
reference node's capacity of each resource one task keeps busy) and a sensitivity (how much
longer its step gets when other jobs hold the whole of that resource).

On node n, for resource r, with capacity cap (1 on the reference node: the DL² / Harmony
testbed server, 8 cores, one 50 GbE NIC, two GPUs):

    others  O = Σ demand of the other jobs' tasks on n / cap
    load    U = O + Σ demand of the job's own tasks on n / cap
    share   c = O / max(1, U)

c is the share of the resource the other jobs hold: their demand while everything fits, their
proportional share once the resource is oversubscribed. It grows with the others' demand over
the node's capacity, not with their task count, and stays below 1: a job on a node is never
pushed out of the resource entirely, however many tasks a noisy neighbour stacks next to it.
A task on n then takes 1 + Σ_r sensitivity_r · c_r times as long per step, and a synchronous
job runs at the pace of its slowest node: factor = 1 / max over its nodes. The slowdown of a
job is therefore bounded by 1 − 1 / (1 + Σ_r sensitivity_r) whatever shares its nodes.

A calibration to a real cluster (`mlsched retrain`, docs/retraining.md) scales a model's
sensitivity by one factor (`sensitivity`), which scales its slowdown's growth P = Σ_r
sensitivity_r · c_r whoever the neighbours are; the demands stay the table's.

Tasks of the same job do not count against each other (their cost is already in the measured
speed table), and neither do co-members of a coordinated co-location group (docs/grouping.md).

Calibration (docs/simulator.md has the table, tests/test_interference.py holds it): the numbers
below were set by hand to reproduce published measurements of co-located training jobs:
  - Harmony placement (Bao et al., ToN 2022, §III-A, 1 PS + 1 worker per job): six jobs
    bin-packed two per server slow down by about 33 % on average, ResNeXt nearly 2× (next to
    CTC); ResNeXt+WLM and ResNeXt+Seq2Seq interfere little; CTC hurts every neighbour;
    more CTC neighbours hurt more, ResNeXt more than VGG-16 (Fig. 5);
  - Gandiva (Xiao et al., OSDI 2018, DLT job characteristics): two language-model jobs on
    one server both slow down by about 19 %; ResNet-50 is not slowed by a language-model
    neighbour;
  - MLTCP (Rajasekaran et al., 2024) and CASSINI (NSDI 2024): jobs contending for network
    bandwidth lose up to about 2× in iteration time, not more.
Demands are guided by the measured CPU usage (CTC and DSSM workers use the most CPU) and by
model size (VGG-16's 553 MB makes it the network-heavy one); they are effective shares (caches
and memory bandwidth included), not core counts. Where a measured slowdown disagrees with CPU
usage, the slowdown wins: WLM's PS uses 1.7 cores, yet Gandiva saw ResNet-50 unharmed by a
language model, so WLM presses on PCIe rather than on the CPU.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from mlsched.workloads import catalog

DIMENSIONS = ("cpu", "network", "pcie")

# Per task: share of the reference node's (cpu, network, pcie) it keeps busy.
DEMAND: dict[str, np.ndarray] = {
    "resnet-50": np.array([0.30, 0.30, 0.20]),
    "vgg-16": np.array([0.20, 0.45, 0.20]),
    "resnext-110": np.array([0.15, 0.05, 0.20]),
    "inception-bn": np.array([0.25, 0.10, 0.10]),
    "seq2seq": np.array([0.02, 0.20, 0.30]),
    "cnn-text-classification": np.array([0.60, 0.15, 0.10]),
    "dssm": np.array([0.40, 0.05, 0.05]),
    "wlm": np.array([0.02, 0.02, 0.15]),
}

# Per model: extra step time (as a multiple of its step alone) when others hold all of (cpu, network, pcie).
SENSITIVITY: dict[str, np.ndarray] = {
    "resnet-50": np.array([0.35, 0.50, 0.05]),
    "vgg-16": np.array([0.35, 0.95, 0.35]),
    "resnext-110": np.array([1.20, 0.05, 0.10]),
    "inception-bn": np.array([0.50, 0.30, 0.30]),
    "seq2seq": np.array([0.20, 0.25, 0.45]),
    "cnn-text-classification": np.array([0.45, 0.35, 0.20]),
    "dssm": np.array([0.50, 0.20, 0.10]),
    "wlm": np.array([0.25, 0.30, 0.60]),
}


def node_capacity(cpus: float, reference_cpus: float = 8.0) -> np.ndarray:
    """(cpu, network, pcie) capacity of a node relative to the reference node: CPU scales with
    its cores; every simulated node has the reference NIC and PCIe bus."""
    return np.array([max(cpus, 1e-6) / reference_cpus, 1.0, 1.0])  # no cores: every share is proportional


def job_speed_factors(placements: dict[str, tuple[str, list[int]]],
                      groups: dict[str, str] | None = None,
                      capacity: np.ndarray | dict[int, np.ndarray] | None = None,
                      sensitivity: dict[str, float] | None = None) -> dict[str, float]:
    """Speed multiplier (0, 1] per job from where every job's tasks are: 1 / (1 + s · P),
    P its pressure (`job_pressures`), s its model's factor in `sensitivity` (a calibration
    to a real cluster, `mlsched retrain`; 1 when absent or None).

    `placements` maps job -> (model, node index of each of its tasks). `groups` maps jobs to
    a coordinated co-location group (Harmony): members of one group do not count against each
    other, like tasks of one job, because their phases are serialised and the simulator's
    co-location model (sim/colocation.py) charges that queueing instead; charging the
    contention as well would count the same sharing twice (docs/grouping.md). `capacity` is
    each node's (cpu, network, pcie) relative to the reference node (one vector for all
    nodes, or node -> vector); the reference node when None.
    """
    return speed_factors(placements, job_pressures(placements, groups, capacity), sensitivity)


def speed_factors(placements: dict[str, tuple[str, list[int]]], pressures: dict[str, float],
                  sensitivity: dict[str, float] | None = None) -> dict[str, float]:
    """job_speed_factors from pressures already computed (job_pressures, PressureTracker)."""
    scale = sensitivity or {}
    return {job: 1.0 / (1.0 + scale.get(placements[job][0], 1.0) * p) for job, p in pressures.items()}


def job_pressures(placements: dict[str, tuple[str, list[int]]],
                  groups: dict[str, str] | None = None,
                  capacity: np.ndarray | dict[int, np.ndarray] | None = None) -> dict[str, float]:
    """Per job: the largest Σ_r sensitivity_r · c_r over its nodes (module doc), its step
    time's relative growth. Arguments as for `job_speed_factors`. Calibration fits a factor
    on it per model (policy_models/retrain/calibration.py), since a job's slowdown scales
    with it whatever the neighbours are."""
    per_node = _demand_per_node(placements)
    return {job: max([0.0, *(_node_pressure(job, model, n, per_node[n], groups, capacity)
                             for n in set(nodes))])
            for job, (model, nodes) in placements.items()}


def _node_pressure(job: str, model: str, n: int, here: dict[str, np.ndarray],
                   groups: dict[str, str] | None, capacity) -> float:
    """Σ_r sensitivity_r · c_r of `job` on node `n`, `here` the node's demand per job
    (_demand_per_node's): a job's pressure is the largest over its nodes (0 alone)."""
    if len(here) < 2:
        return 0.0
    mine = groups.get(job) if groups else None
    others = [d for other, d in here.items()
              if other != job and (mine is None or groups.get(other) != mine)]  # type: ignore[union-attr]
    if not others:
        return 0.0
    cap = _capacity_of(capacity, n)
    mine_d = here[job].tolist()
    caps = cap.tolist() if isinstance(cap, np.ndarray) else [cap] * len(mine_d)
    rows = [d.tolist() for d in others]
    # Per resource, the others' share o and the node's load, in plain floats: the doubles that
    # `o = sum(others) / cap; o / np.maximum(1.0, o + mine / cap)` makes on arrays, at a third
    # of the cost (the simulator asks for tens of thousands of terms a run). The sum is a loop,
    # not sum(): from Python 3.12 sum() of floats compensates its rounding.
    shares = []
    for r in range(len(mine_d)):
        total = 0.0
        for row in rows:
            total += row[r]
        o = total / caps[r]
        shares.append(o / max(1.0, o + mine_d[r] / caps[r]))
    return float(SENSITIVITY[model] @ np.array(shares))  # (numpy's dot, as before: its rounding)


class PressureTracker:
    """job_pressures for placements that change a few jobs at a time, kept between calls.

    The simulator asks for every job's pressure at each stretch of a slot (with admission on
    arrival, after every arrival and completion: 465 times in the 200-job, 500-node run), and
    recomputing all of them cost more than the rest of the run (issue 52). A job's pressure
    on a node depends only on the jobs on that node and their tasks there, so a call redoes
    only the nodes where a job started, finished, gained or lost tasks or changed group, and
    there the terms of the jobs on them; a job's pressure is the largest of its nodes' terms,
    as before.

    The answer is job_pressures' to the last bit (tests/test_interference.py holds it): both
    compute each term with _node_pressure from a node's demands summed job by job in the
    order `placements` lists the jobs; when the jobs that stay come in another order than
    before, everything is recomputed. `capacity` is fixed for the tracker's life."""

    def __init__(self, capacity: np.ndarray | dict[int, np.ndarray] | None = None):
        self.capacity = capacity
        self._forget()

    def _forget(self) -> None:
        # job -> (model, nodes, group) as last seen: what its terms were computed from
        self._seen: dict[str, tuple[str, tuple[int, ...], str | None]] = {}
        self._on_node: dict[int, set[str]] = {}  # node -> the jobs with a task on it
        self._per_node: dict[int, dict[str, np.ndarray]] = {}  # as _demand_per_node's
        self._terms: dict[str, dict[int, float]] = {}  # job -> node -> _node_pressure
        self._pressures: dict[str, float] = {}  # job -> the largest of its terms

    def pressures(self, placements: dict[str, tuple[str, Sequence[int]]],
                  groups: dict[str, str] | None = None) -> dict[str, float]:
        """job_pressures(placements, groups, self.capacity) (nodes as a list or a tuple)."""
        now = {job: (model, tuple(nodes), groups.get(job) if groups else None)
               for job, (model, nodes) in placements.items()}
        if [job for job in self._seen if job in now] != [job for job in now if job in self._seen]:
            self._forget()  # another order: the nodes' sums would differ from job_pressures'
        changed = [job for job in dict.fromkeys((*self._seen, *now))
                   if self._seen.get(job) != now.get(job)]
        dirty: set[int] = set()  # nodes whose demands per job changed
        touched: set[str] = set()  # jobs whose terms changed: their pressure is taken again
        for job in changed:
            old, new = self._seen.get(job), now.get(job)
            old_count = Counter(old[1] if old else ())
            new_count = Counter(new[1] if new else ())
            # A job that only gained or lost tasks changes the nodes where its count changed:
            # elsewhere its demand, and so every term there, is what it was.
            same = old is not None and new is not None and (old[0], old[2]) == (new[0], new[2])
            for n in old_count.keys() | new_count.keys():
                if same and old_count[n] == new_count[n]:
                    continue
                dirty.add(n)
                if n in new_count:
                    self._on_node.setdefault(n, set()).add(job)
                else:
                    self._on_node[n].discard(job)
                    self._terms.get(job, {}).pop(n, None)
            if new is None:
                self._terms.pop(job, None)
                self._pressures.pop(job, None)
            else:
                touched.add(job)
        self._seen = now
        order = {job: i for i, job in enumerate(now)} if dirty else {}
        for n in dirty:
            jobs = sorted(self._on_node[n], key=order.__getitem__)
            if not jobs:
                del self._on_node[n]
                self._per_node.pop(n, None)
                continue
            here: dict[str, np.ndarray] = {}
            for job in jobs:  # the sum _demand_per_node makes: one demand per task, in order
                model, nodes, _ = now[job]
                for m in nodes:
                    if m == n:
                        here[job] = here.get(job, 0.0) + DEMAND[model]
            self._per_node[n] = here
            for job in jobs:
                self._terms.setdefault(job, {})[n] = _node_pressure(job, now[job][0], n, here, groups,
                                                                    self.capacity)
            touched.update(jobs)
        for job in touched:
            self._pressures[job] = max([0.0, *self._terms.get(job, {}).values()])
        return {job: self._pressures[job] for job in now}


def sensitivity_factors(factors: dict[str, float] | None) -> dict[str, float] | None:
    """Checked per-model sensitivity factors by canonical model name (None stays None)."""
    if not factors:
        return None
    bad = {m: f for m, f in factors.items() if not (f >= 0 and np.isfinite(f))}
    if bad:
        raise ValueError(f"sensitivity factors must be finite and >= 0: {bad}")
    return {catalog.canonical_name(m): float(f) for m, f in factors.items()}


def _capacity_of(capacity, n: int) -> np.ndarray | float:
    if capacity is None:
        return 1.0
    if isinstance(capacity, dict):
        return capacity[n]
    return capacity


def _demand_per_node(placements: dict[str, tuple[str, list[int]]]) -> dict[int, dict[str, np.ndarray]]:
    """node -> job -> the summed demand of the job's tasks on that node (shared by the plain
    and the grouped factors: the two differ only in whose demand counts as the others')."""
    per_node: dict[int, dict[str, np.ndarray]] = {}
    for job, (model, nodes) in placements.items():
        for n in nodes:
            d = per_node.setdefault(n, {})
            d[job] = d.get(job, 0.0) + DEMAND[model]
    return per_node


def max_slowdown(model: str) -> float:
    """The most any placement can slow `model` down: 1 − 1 / (1 + Σ sensitivity)."""
    return 1.0 - 1.0 / (1.0 + float(SENSITIVITY[model].sum()))


def pair_slowdown(victim: str, neighbour: str, tasks_each: int = 2) -> float:
    """Slowdown (1 - speed ratio) of `victim` sharing a node with `neighbour`, each with
    `tasks_each` tasks on it — the Harmony paper's pairwise experiment."""
    f = job_speed_factors({"a": (victim, [0] * tasks_each), "b": (neighbour, [0] * tasks_each)})
    return 1.0 - f["a"]

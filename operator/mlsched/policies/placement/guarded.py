"""A learned placement never served where the simulator's own model says it loses (issue 51,
part 4; docs/placement.md, "The guard").

Harmony placement (harmony.py) was trained on some cluster sizes and job mixes; elsewhere its
network's choices can be worse than least-interference-first (measured: 1.14 x LIF-Line on a
held-out 20-node trace). Its own estimate of a layout's worth is the network, which is what
cannot be trusted there. So every round (and admission step) `GuardedPlacement` lays the
granted tasks out twice, once by the learned policy and once by the fallback (LIF-Line), and
scores both layouts, with the tasks held in place, by the model the simulator runs:

    score = sum over placed jobs of  epochs/s(counts, nodes spanned) x interference factor
                                     / total epochs

i.e. the interval's predicted reward (the simulator's `advance` reward, Harmony's training
signal): the measured speed table (`workloads/speed_models.py`, the simulator's default) at
the job's counts and the nodes its workers span, times `interference.job_speed_factors` on
the layout (the simulator's slowdown rule, with the node capacities of the snapshot and, when
given, a cluster's calibrated sensitivities). A job left without its gang scores 0. A model
the speed table does not know counts 1 epoch/s over its total: its interference still counts.

The learned layout is served only where its score beats the fallback's by more than
`min_gain` (relative; default 0, ties to the fallback); else the fallback's layout is served.
The rule holds for any cluster, trace or model file: nothing in it is fitted to a benchmark.
`choices` counts the decisions each side won, `gains` the learned layout's predicted gain.

The allocation phase's fit checks ask `choose_node` of the learned policy, so its tentative
layout is reused as before; the fallback replays the same grants (a gang it cannot fit is
released, and scores 0 for that job).

Exploring or recording rounds (`for_round` with epsilon > 0 or a decision log) serve the
learned policy unguarded: the decision log must hold what ran, and exploration is off-greedy
by design (those rounds are what retraining learns from).
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import replace

import numpy as np

from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import JobDecision, JobView, Role
from mlsched.policies.base import PlacementPolicy, PlacementRequest
from mlsched.workloads import catalog, interference
from mlsched.workloads.speed_models import SpeedModel, epochs_per_s, get_speed_model


GAINS_KEPT = 1000


class GuardedPlacement:
    def __init__(self, learned: PlacementPolicy, fallback: PlacementPolicy,
                 speed: SpeedModel | None = None, sensitivity: dict[str, float] | None = None,
                 min_gain: float = 0.0):
        self.network = learned  # the learned placement guarded
        self.fallback = fallback
        self.name = learned.name  # what runs, to rounds and reports
        self.speed = speed if speed is not None else get_speed_model("measured")
        self.sensitivity = interference.sensitivity_factors(sensitivity)
        self.min_gain = min_gain
        self.choices: Counter[str] = Counter()  # decisions won: "learned" / "fallback"
        # The learned layout's predicted gain, per decision, the latest GAINS_KEPT: the operator
        # keeps one guard per policy for as long as it serves, so the tally must not grow forever.
        self.gains: deque[float] = deque(maxlen=GAINS_KEPT)
        self.last: str | None = None  # who served the latest decision

    @property
    def learned(self) -> bool:
        """As the guarded policy: the network decides wherever it wins."""
        return self.network.learned

    @property
    def card(self):
        return getattr(self.network, "card", None)

    def for_round(self, serving):
        """The learned policy's per-round copy: guarded when it neither explores nor records,
        else the learned copy alone (module doc)."""
        copy = self.network.for_round(serving)
        if serving.epsilon > 0 or serving.recorder is not None:
            return copy
        guarded = GuardedPlacement(copy, self.fallback, self.speed, None, self.min_gain)
        guarded.sensitivity = self.sensitivity
        guarded.choices, guarded.gains = self.choices, self.gains  # one tally across rounds
        return guarded

    def choose_node(self, ledger: Ledger, job: JobView, role: Role, demand: np.ndarray) -> int | None:
        return self.network.choose_node(ledger, job, role, demand)

    def place(self, request: PlacementRequest) -> dict[str, JobDecision]:
        learned_request = request
        if request.tentative_placer is self:  # the fit checks asked the learned policy
            learned_request = _with_placer(request, self.network)
        fallback_request = _with_placer(request, None)
        ours = self.network.place(learned_request)
        theirs = self.fallback.place(fallback_request)
        if _same(ours, theirs):
            self.choices["learned"] += 1
            self.gains.append(0.0)
            self.last = "learned"
            return ours
        score_ours, score_theirs = self.score(request, ours), self.score(request, theirs)
        gain = score_ours / score_theirs - 1.0 if score_theirs > 0 else (np.inf if score_ours > 0 else 0.0)
        self.gains.append(float(gain))
        self.last = "learned" if gain > self.min_gain else "fallback"
        self.choices[self.last] += 1
        return ours if self.last == "learned" else theirs

    def score(self, request: PlacementRequest, decided: dict[str, JobDecision]) -> float:
        """The interval's predicted reward of `decided` with the request's held tasks (module doc)."""
        jobs = {j.name: j for j in request.snapshot.jobs}
        layout = {job.name: d for job, d in request.held}
        layout.update(decided)
        placements = {name: (jobs[name].model, list(d.ps_nodes) + list(d.worker_nodes))
                      for name, d in layout.items() if name in jobs and d.worker_nodes}
        if not placements:
            return 0.0
        capacity = request.snapshot.capacity
        cpus = {n: interference.node_capacity(float(capacity[n, 0]))
                for n in {n for _, nodes in placements.values() for n in nodes}}
        pools = request.pools
        groups = ({name: jobs[name].pool for name in placements if jobs[name].pool in pools.shares}
                  if pools is not None and pools.coordinated and pools.shares else None)
        factors = interference.job_speed_factors(placements, groups or None, cpus, self.sensitivity)
        total = 0.0
        for name, d in layout.items():
            if name not in placements:
                continue
            job = jobs[name]
            base = 1.0
            if catalog.is_known(job.model):
                base = epochs_per_s(self.speed, job.model, job.arch, len(d.ps_nodes),
                                    len(d.worker_nodes), len(set(d.worker_nodes)))
            total += base * factors.get(name, 1.0) / max(float(job.total_epochs), 1e-9)
        return total


def _with_placer(request: PlacementRequest, placer) -> PlacementRequest:
    return replace(request, tentative_placer=placer)


def _same(a: dict[str, JobDecision], b: dict[str, JobDecision]) -> bool:
    if a.keys() != b.keys():
        return False
    return all(list(a[n].ps_nodes) == list(b[n].ps_nodes)
               and list(a[n].worker_nodes) == list(b[n].worker_nodes) for n in a)

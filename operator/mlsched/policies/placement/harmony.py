"""Harmony placement (Bao et al., ToN 2022): a learned network places one task per inference.

For each task the allocation phase grants (in its order: a job's starting gang first), the
state is one token per job in the snapshot and one per node (features/harmony_state.py); the
network returns a probability per node with the nodes the task does not fit on at exactly 0,
and the task goes to the most probable node (ties: the lowest index). The paper samples in
training and does not say what it does in serving; the mode is what ships here, so a
snapshot always gets the same placement. A task that fits on one node only needs no
inference.

Running jobs keep their nodes (Sticky, from the registry), as in the paper: Harmony places new
tasks and never migrates.

The operator serves a per-round copy (`for_round`) when the policy explores (with probability
epsilon a uniformly random node the task fits on, from a generator the operator seeds per
policy and interval) or records its decisions (issue 17): each inference goes to the decision
log with its state (features/harmony_state.py `flat_state`), mask, node, and the probabilities
with which serving and the network chose it. A state grows with the jobs and nodes (23 values
a job, 23 a node), so a round records decisions until RECORD_BUDGET values are logged and
serves the rest unrecorded: the dataset of a 1,000-node cluster stays a few MB an interval.
The interval's reward is shared by all its decisions, so the recorded ones are a fair
sample for off-policy learning, biased only towards the round's first grants.

The model is served with ONNX Runtime from a card-checked file (policies/onnx_runner.py);
training uses the same loop with a torch actor (policy_models/harmony/train.py).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import JobView, Role
from mlsched.features import harmony_state
from mlsched.policies.base import TaskByTaskPlacement
from mlsched.policies.exploration import Serving, greedy_behaviour, renormalised
from mlsched.policies.onnx_runner import LoadedModel, ModelBytes, greedy_action, load_model


#: Values (float16 in the record, before gzip) one round's placement decisions may log.
RECORD_BUDGET = 1_000_000


class Actor(Protocol):
    def probs(self, feeds: dict[str, np.ndarray]) -> np.ndarray: ...


class OnnxActor:
    def __init__(self, model: LoadedModel):
        self.model = model

    def probs(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        return self.model.run(feeds)["probs"][0]


class HarmonyPlacement(TaskByTaskPlacement):
    name = "harmony"
    learned = True

    def __init__(self, actor: Actor, serving: Serving | None = None):
        self.actor = actor
        self.serving = serving  # exploration and the decision log of one round (for_round)
        self.inferences = 0
        self.recorded_values = 0
        self.unrecorded = 0  # decisions served past RECORD_BUDGET this round

    def for_round(self, serving: Serving) -> "HarmonyPlacement":
        """This policy for one round, exploring and recording as `serving` says (a copy
        sharing the loaded model)."""
        if serving.epsilon <= 0 and serving.recorder is None:
            return self
        return HarmonyPlacement(self.actor, serving)

    @property
    def card(self):
        model = getattr(self.actor, "model", None)
        return model.card if model is not None else None

    @classmethod
    def load(cls, model_path: str | ModelBytes | None = None, provider: str = "CPU") -> "HarmonyPlacement":
        return cls(OnnxActor(load_model(model_path, algorithm="harmony", phase="placement",
                                        provider=provider)))

    def choose_node(self, ledger: Ledger, job: JobView, role: Role, demand: np.ndarray) -> int | None:
        mask = ledger.fits_mask(demand, job, role)
        nodes = np.flatnonzero(mask)
        if not nodes.size:
            return None
        if nodes.size == 1:
            return int(nodes[0])
        self.inferences += 1
        feeds = harmony_state.encode(ledger, job, role, mask)
        probs = self.actor.probs(feeds)
        greedy = greedy_action(probs, mask)
        if self.serving is None:
            return greedy
        explored = self.serving.explore(mask)
        node = greedy if explored is None else explored
        if self.serving.recorder is not None:
            state = harmony_state.flat_state(feeds)
            if self.recorded_values + state.size > RECORD_BUDGET:
                self.unrecorded += 1
                return node
            self.recorded_values += state.size
            # granted: the node was booked (a gang that finds no node for a later task is
            # released as a whole by the ledger afterwards).
            self.serving.recorder.record(
                state, mask, node, greedy_behaviour(self.serving.epsilon, int(nodes.size), node, greedy),
                renormalised(probs, mask, node), granted=True)
        return node

"""Harmony placement (Bao et al., ToN 2022): a learned network places one task per inference.

For each task the allocation phase grants (in its order: a job's starting gang first), the
state is one token per job in the snapshot and one per node (features/harmony_state.py); the
network returns a probability per node with the nodes the task does not fit on at exactly 0,
and the task goes to the most probable node (ties: the lowest index). The paper samples in
training and does not say what it does in serving; the mode is what ships here, so a
snapshot always gets the same placement. A task that fits on one node only needs no
inference.

Running jobs keep their nodes (Sticky, from the registry), as in the paper: Harmony places new
tasks and never migrates. The model is served with ONNX Runtime from a card-checked file
(policies/onnx_runner.py); training uses the same loop with a torch actor
(policy_models/harmony/train.py).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import JobView, Role
from mlsched.features import harmony_state
from mlsched.policies.base import TaskByTaskPlacement
from mlsched.policies.onnx_runner import LoadedModel, greedy_action, load_model


class Actor(Protocol):
    def probs(self, feeds: dict[str, np.ndarray]) -> np.ndarray: ...


class OnnxActor:
    def __init__(self, model: LoadedModel):
        self.model = model

    def probs(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        return self.model.run(feeds)["probs"][0]


class HarmonyPlacement(TaskByTaskPlacement):
    name = "harmony"

    def __init__(self, actor: Actor):
        self.actor = actor
        self.inferences = 0

    @property
    def card(self):
        model = getattr(self.actor, "model", None)
        return model.card if model is not None else None

    @classmethod
    def load(cls, model_path: str | None = None, provider: str = "CPU") -> "HarmonyPlacement":
        return cls(OnnxActor(load_model(model_path, algorithm="harmony", phase="placement",
                                        provider=provider)))

    def choose_node(self, ledger: Ledger, job: JobView, role: Role, demand: np.ndarray) -> int | None:
        mask = ledger.fits_mask(demand, job)
        nodes = np.flatnonzero(mask)
        if not nodes.size:
            return None
        if nodes.size == 1:
            return int(nodes[0])
        self.inferences += 1
        probs = self.actor.probs(harmony_state.encode(ledger, job, role, mask))
        return greedy_action(probs, mask)

"""Chic and Chic-Pair allocation (Gong et al., IWQoS '19): a policy network builds, one task
(Chic) or one worker-PS pair (Chic-Pair) per step, the allocation of the first I jobs in
arrival order; jobs beyond them wait. Every round starts from nothing (the paper rebuilds
the schedule on every event); the round ends when the actor stops or the state is in S'
(nothing fits, or nothing speeds any job up: features/chic_state.py). Serving is greedy (the
most probable allowed action) from the ONNX graph; training samples a numpy copy of the same
network through this same loop (policy_models/chic/train.py).
"""

from __future__ import annotations

from typing import Callable, Protocol

import numpy as np

from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import Snapshot
from mlsched.features.chic_state import ChicState, first_jobs
from mlsched.policies.onnx_runner import greedy_action, load_model

MAX_STEPS = 512  # a safety net: a round grants at most a few dozen tasks on the paper's cluster


class Actor(Protocol):
    def act(self, state: ChicState, mask: np.ndarray) -> int: ...


class ChicPolicy:
    def __init__(self, actor: Actor, jobs: int = 3, pair: bool = False,
                 on_step: Callable[[np.ndarray, np.ndarray, int], None] | None = None):
        self.actor, self.jobs, self.pair = actor, jobs, pair
        self.name = "chic-pair" if pair else "chic"
        self.on_step = on_step  # training hook: (state vector, mask, action) of every decision

    @classmethod
    def load(cls, model_path: str | None = None, pair: bool = False) -> "ChicPolicy":
        model = load_model(model_path, algorithm="chic-pair" if pair else "chic", phase="allocation")
        params = model.card.encoder_params
        if bool(params["pair"]) != pair:
            raise ValueError(f"{model.path}: encoder params {params} are not for {'chic-pair' if pair else 'chic'}")
        return cls(GreedyOnnxActor(model), jobs=int(params["jobs"]), pair=pair)

    def allocate(self, snapshot: Snapshot, ledger: Ledger) -> None:
        jobs, backlog = first_jobs(snapshot.jobs, self.jobs)
        if not jobs:
            return
        state = ChicState(snapshot, ledger, jobs, self.jobs, self.pair, backlog)
        for _ in range(MAX_STEPS):
            if state.forced_void():
                break
            mask = state.mask()
            action = self.actor.act(state, mask)
            if self.on_step:
                self.on_step(state.vector.copy(), mask, action)
            if action == state.void:
                break
            state.apply(action)


class GreedyOnnxActor:
    def __init__(self, model):
        self.model = model  # onnx_runner.LoadedModel

    def act(self, state: ChicState, mask: np.ndarray) -> int:
        probs = self.model.run({"state": state.vector[None, :], "mask": mask[None, :].astype(np.float32)})["probs"][0]
        return greedy_action(probs, mask)

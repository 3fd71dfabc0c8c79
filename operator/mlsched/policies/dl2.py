"""DL² allocation: a policy network grows jobs one task (or bundle) per inference.

Per round and per window of J jobs (arrival order): encode the state, ask the actor for an
action among the unmasked ones, grant it through the Packer (so the placement policy picks
the node), update the state and ask again, until the actor stops or nothing more fits. The
actor is the ONNX runner when serving (greedy: the most probable action, so the same snapshot
always gives the same decision) and a sampling numpy copy of the torch network in training;
both see exactly the same states from this one loop.
"""

from __future__ import annotations

from typing import Callable, Protocol

import numpy as np

from mlsched.cluster.packing import Packer
from mlsched.cluster.types import Snapshot
from mlsched.features import dl2_state
from mlsched.features.dl2_state import WindowState

MAX_STEPS_PER_WINDOW = 4096  # a safety net; a window can never need more grants than this


class Actor(Protocol):
    def act(self, state: WindowState, mask: np.ndarray) -> int: ...


class DL2Policy:
    name = "dl2"

    def __init__(self, actor: Actor, window: int = 40,
                 on_step: Callable[[np.ndarray, np.ndarray, int, bool], None] | None = None):
        self.actor = actor
        self.window = window
        self.on_step = on_step  # training hook: (state vector before, mask, action, granted)

    @classmethod
    def load(cls, model_path: str | None = None) -> "DL2Policy":
        from mlsched.policies.onnx_runner import GreedyOnnxActor, load_model

        model = load_model(model_path, kind="dl2")
        return cls(GreedyOnnxActor(model), window=model.card.window)

    def allocate(self, snapshot: Snapshot, packer: Packer) -> None:
        groups = dl2_state.windows(snapshot.jobs, self.window)
        for k, jobs in enumerate(groups):
            if not jobs:
                continue
            backlog = sum(len(g) for g in groups[k + 1:])
            state = WindowState(snapshot, packer, jobs, self.window, backlog)
            for _ in range(MAX_STEPS_PER_WINDOW):
                if not state.can_grow():
                    break
                mask = state.mask()
                before = state.vector.copy() if self.on_step else None
                action = self.actor.act(state, mask)
                granted = action != state.void and state.apply(action)
                if self.on_step:
                    self.on_step(before, mask, action, granted)
                if action == state.void:
                    break

"""DL² allocation: a policy network grows jobs one task (or bundle) per inference.

Per round and per window of J jobs (arrival order): encode the state, ask the actor for an
action among the unmasked ones, grant it through the ledger (which asks the placement phase
where the task fits), update the state and ask again, until the actor stops or nothing more
fits. The actor is the ONNX runner when serving (greedy: the most probable action, so the same
snapshot always gives the same decision) and a sampling numpy copy of the torch network in
training; both see exactly the same states from this one loop.
"""

from __future__ import annotations

from typing import Callable, Protocol

import numpy as np

from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import Snapshot
from mlsched.features import dl2_state
from mlsched.features.dl2_state import WindowState
from mlsched.policies.exploration import Serving, greedy_behaviour, renormalised
from mlsched.policies.onnx_runner import ModelBytes, greedy_action, load_model  # onnxruntime itself loads lazily

MAX_STEPS_PER_WINDOW = 4096  # a safety net; a window can never need more grants than this


class Actor(Protocol):
    def act(self, state: WindowState, mask: np.ndarray) -> int: ...


class DL2Policy:
    name = "dl2"
    learned = True

    def __init__(self, actor: Actor, window: int = 40,
                 on_step: Callable[[np.ndarray, np.ndarray, int, bool], None] | None = None,
                 recorder=None, typed: bool = False):
        self.actor = actor
        self.window = window
        self.typed = typed  # the state's GPU-type columns (a model trained on typed clusters)
        self.on_step = on_step  # training hook: (state vector before, mask, action, granted)
        # Serving's decision log (a DecisionRecorder) of one round; the actor is then an
        # ExploringActor, which says with what probabilities it chose.
        self.recorder = recorder

    @property
    def card(self):
        """The served model's card (None for a training actor)."""
        model = getattr(self.actor, "model", None)
        return model.card if model is not None else None

    def for_round(self, serving: Serving) -> "DL2Policy":
        """This policy for one round, exploring and recording as `serving` says. A copy that
        shares the loaded model: the cached policy may serve several SchedulingPolicies."""
        if serving.epsilon <= 0 and serving.recorder is None:
            return self
        actor = ExploringActor(GreedyOnnxActor(self.actor.model), serving)
        return DL2Policy(actor, self.window, recorder=serving.recorder, typed=self.typed)

    @classmethod
    def load(cls, model_path: str | ModelBytes | None = None, provider: str = "CPU") -> "DL2Policy":
        model = load_model(model_path, algorithm="dl2", phase="allocation", provider=provider)
        params = model.card.encoder_params
        return cls(GreedyOnnxActor(model), window=int(params["window"]), typed=dl2_state.typed(params))

    def allocate(self, snapshot: Snapshot, ledger: Ledger) -> None:
        groups = dl2_state.windows(snapshot.jobs, self.window)
        # One state buffer for the round's windows: the actor binds it to ONNX Runtime once.
        vector = np.zeros(dl2_state.state_dim(self.window, self.typed), dtype=np.float32)
        for k, jobs in enumerate(groups):
            if not jobs:
                continue
            backlog = sum(len(g) for g in groups[k + 1:])
            state = WindowState(snapshot, ledger, jobs, self.window, backlog, vector, self.typed)
            keep = self.on_step is not None or self.recorder is not None
            for _ in range(MAX_STEPS_PER_WINDOW):
                if not state.can_grow():
                    break
                mask = state.mask(copy=keep)  # kept by the training hook or the decision log
                before = state.vector.copy() if keep else None  # apply() updates it in place
                action = self.actor.act(state, mask)
                granted = action != state.void and state.apply(action)
                if self.on_step:
                    self.on_step(before, mask, action, granted)
                if self.recorder is not None:
                    behaviour, policy = self.actor.last
                    self.recorder.record(before, mask, action, behaviour, policy, granted, k)
                if action == state.void:
                    break


class GreedyOnnxActor:
    """Serving: the most probable unmasked action.

    A round asks thousands of times about windows whose state vector is updated in place
    (one buffer for all of a round's windows), so the inputs and the output are bound to ONNX
    Runtime once per buffer (IO binding: no per-call dict, output allocation or input
    conversion)."""

    def __init__(self, model):
        self.model = model  # onnx_runner.LoadedModel
        self._vector = None  # the state buffer the binding reads from
        self._binding = None
        self._mask = self._probs = self._probs_row = None

    def _bind(self, state: WindowState) -> None:
        self._mask = np.zeros((1, state.void + 1), dtype=np.float32)
        self._probs = np.zeros((1, state.void + 1), dtype=np.float32)
        self._probs_row = self._probs[0]
        # The state vector is float32 and contiguous: bound without a copy.
        self._binding = self.model.bind({"state": state.vector[None, :], "mask": self._mask},
                                        {"probs": self._probs})
        self._vector = state.vector

    @property
    def probs(self) -> np.ndarray:
        """The probabilities of the latest `act` (a view, overwritten by the next)."""
        return self._probs_row

    def act(self, state: WindowState, mask: np.ndarray) -> int:
        if state.vector is not self._vector:
            self._bind(state)
        self._mask[0] = mask
        self.model.run_bound(self._binding)
        return greedy_action(self._probs_row, mask)


class ExploringActor:
    """Serving with exploration: the greedy action, replaced with probability epsilon by a
    uniformly random allowed one; `last` is (behaviour probability, network probability) of
    the action just returned, for the decision log."""

    def __init__(self, greedy: GreedyOnnxActor, serving: Serving):
        self.greedy, self.serving = greedy, serving
        self.model = greedy.model
        self.last = (1.0, 1.0)

    def act(self, state: WindowState, mask: np.ndarray) -> int:
        best = self.greedy.act(state, mask)
        explored = self.serving.explore(mask)
        action = best if explored is None else explored
        allowed = int(np.count_nonzero(mask))
        self.last = (greedy_behaviour(self.serving.epsilon, allowed, action, best),
                     renormalised(self.greedy.probs, mask, action))
        return action

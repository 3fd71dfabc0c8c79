"""Chic and Chic-Pair allocation (Gong et al., IWQoS '19): a policy network builds, one task
(Chic) or one worker-PS pair (Chic-Pair) per step, the allocation of the first I jobs in
arrival order; jobs beyond them wait. Every round starts from nothing (the paper rebuilds
the schedule on every event); the round ends when the actor stops or the state is in S'
(nothing fits, or nothing speeds any job up: features/chic_state.py).

Serving samples the policy, π(a|s) of the paper's eq. (6), from the ONNX graph's
probabilities, with a random generator seeded by the round (time and window jobs), so the
same snapshot always gets the same decision. Not its mode: the cross-entropy method
optimises the return of the sampling policy, and the mode of a policy CEM trained can be far
worse than the policy (measured: docs/chic.md). `greedy_decision` is kept for comparison.
Training samples a numpy copy of the same network through this same loop
(policy_models/chic/train.py).

The operator serves a per-round copy (`for_round`) when the policy explores (with probability
epsilon a uniformly random allowed action, drawn from a generator of its own, seeded by the
operator per policy and interval) or records its decisions (issue 17).
"""

from __future__ import annotations

import zlib
from typing import Callable, Protocol

import numpy as np

from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import Snapshot
from mlsched.features import chic_state
from mlsched.features.chic_state import ChicState, first_jobs
from mlsched.policies.exploration import Serving, renormalised, sampling_behaviour
from mlsched.policies.onnx_runner import ModelBytes, greedy_action, load_model

MAX_STEPS = 512  # a safety net: a round grants at most a few dozen tasks on the paper's cluster


class Actor(Protocol):
    def act(self, state: ChicState, mask: np.ndarray) -> int: ...


class ChicPolicy:
    learned = True

    def __init__(self, actor: Actor, jobs: int = 3, pair: bool = False,
                 on_step: Callable[[np.ndarray, np.ndarray, int], None] | None = None,
                 recorder=None):
        self.actor, self.jobs, self.pair = actor, jobs, pair
        self.name = "chic-pair" if pair else "chic"
        self.on_step = on_step  # training hook: (state vector, mask, action) of every decision
        self.recorder = recorder  # serving's decision log of one round (a DecisionRecorder)

    @property
    def card(self):
        model = getattr(self.actor, "model", None)
        return model.card if model is not None else None

    def for_round(self, serving: Serving) -> "ChicPolicy":
        """This policy for one round, exploring and recording as `serving` says (a copy sharing
        the loaded model)."""
        if serving.epsilon <= 0 and serving.recorder is None:
            return self
        actor = ExploringActor(self.actor.model, serving, greedy=self.actor.greedy)
        return ChicPolicy(actor, self.jobs, self.pair, recorder=serving.recorder)

    @classmethod
    def load(cls, model_path: str | ModelBytes | None = None, pair: bool = False,
             provider: str = "CPU") -> "ChicPolicy":
        model = load_model(model_path, algorithm="chic-pair" if pair else "chic", phase="allocation",
                           provider=provider)
        params = model.card.encoder_params
        if bool(params["pair"]) != pair:
            raise ValueError(f"{model.path}: encoder params {params} are not for {'chic-pair' if pair else 'chic'}")
        return cls(OnnxActor(model), jobs=int(params["jobs"]), pair=pair)

    def allocate(self, snapshot: Snapshot, ledger: Ledger) -> None:
        jobs, backlog = first_jobs(snapshot.jobs, self.jobs)
        if not jobs:
            return
        state = ChicState(snapshot, ledger, jobs, self.jobs, self.pair, backlog)
        state.rng = np.random.default_rng(round_seed(snapshot, jobs))
        for _ in range(MAX_STEPS):
            if state.forced_void():
                break
            mask = state.mask()
            action = self.actor.act(state, mask)
            if self.on_step:
                self.on_step(state.vector.copy(), mask, action)
            before = state.vector.copy() if self.recorder is not None else None  # apply() updates it
            granted = action != state.void and bool(state.apply(action))
            if self.recorder is not None:
                self.recorder.record(before, mask, action, *self.actor.last, granted)
            if action == state.void:
                break


def round_seed(snapshot: Snapshot, jobs) -> int:
    """A seed that depends only on what the round sees: its time and its window's jobs."""
    key = f"{snapshot.time_s:.3f}|" + "|".join(j.name for j in jobs)
    return zlib.crc32(key.encode())


def sample_action(probs: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> int:
    p = np.where(mask, probs, 0.0).astype(np.float64)
    total = p.sum()
    if total <= 0:  # every allowed action has probability 0 (cannot happen with a softmax)
        return int(np.flatnonzero(mask)[-1])
    return int(rng.choice(len(p), p=p / total))


def greedy_decision(probs: np.ndarray, mask: np.ndarray, void: int) -> int:
    """Greedy in two levels: stop when stopping has more than half the probability, otherwise
    the most probable task. (Plain argmax is biased to stop: the continue-mass is split over up
    to 2I task actions, so a policy that would continue 70 % of the time can still have ∅ as
    its single most probable action, and its rounds end after one task.)"""
    if mask[void] and probs[void] > 0.5:
        return void
    tasks = mask.copy()
    tasks[void] = False
    if not tasks.any():
        return void
    return greedy_action(np.where(tasks, probs, 0.0), tasks)


class OnnxActor:
    """Serving: the ONNX graph's probabilities, sampled with the round's generator."""

    def __init__(self, model, greedy: bool = False):
        self.model = model  # onnx_runner.LoadedModel
        self.greedy = greedy

    def act(self, state: ChicState, mask: np.ndarray) -> int:
        probs = self.model.run({"state": state.vector[None, :], "mask": mask[None, :].astype(np.float32)})["probs"][0]
        if self.greedy:
            return greedy_decision(probs, mask, state.void)
        return sample_action(probs, mask, state.rng)


class ExploringActor(OnnxActor):
    """Serving with exploration: with probability epsilon a uniformly random allowed action
    (from the exploration generator), else what OnnxActor would do; `last` is (behaviour
    probability, network probability) of the action just returned."""

    def __init__(self, model, serving: Serving, greedy: bool = False):
        super().__init__(model, greedy)
        self.serving = serving
        self.last = (1.0, 1.0)

    def act(self, state: ChicState, mask: np.ndarray) -> int:
        probs = self.model.run({"state": state.vector[None, :], "mask": mask[None, :].astype(np.float32)})["probs"][0]
        explored = self.serving.explore(mask)
        if explored is not None:
            action = explored
        elif self.greedy:
            action = greedy_decision(probs, mask, state.void)
        else:
            action = sample_action(probs, mask, state.rng)
        pi = renormalised(probs, mask, action)
        allowed = int(np.count_nonzero(mask))
        if self.greedy:
            chosen = greedy_decision(probs, mask, state.void)
            mu = (1.0 - self.serving.epsilon) * float(action == chosen) + self.serving.epsilon / allowed
        else:
            mu = sampling_behaviour(self.serving.epsilon, allowed, pi)
        self.last = (mu, pi)
        return action


class GainActor:
    """A heuristic in Chic's loop: the allowed task with the largest relative speed-up of its
    job (the state's gain columns; a job holding nothing scores 1, so every window job starts
    first); it never stops by choice, the round ends in S'. It sees only the state: the
    trainer's warm-start teacher, and the benchmark's reference for other windows I."""

    def act(self, state: ChicState, mask: np.ndarray) -> int:
        rows = state.vector[: state.window * chic_state.JOB_FEATURES].reshape(state.window, -1)
        best, best_gain = state.void, -np.inf
        for a in np.flatnonzero(mask[: state.void]):
            i, kind = divmod(int(a), state.per_job)
            gain = rows[i, chic_state.GAIN_PAIR if state.pair else chic_state.GAIN_WORKER + kind]
            if gain > best_gain:
                best, best_gain = int(a), gain
        return best

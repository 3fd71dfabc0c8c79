"""Off-policy fine-tuning on the recorded decisions themselves (`mlsched retrain --mode offpolicy`).

The records hold every inference the serving policy made (state, mask, action, the serving
policy's probability of it, exploration included) and each interval's reward. They are one
long sequence of steps, as a simulated episode is in train.py: the interval's reward lands
on its last step, the discount is 1 between the steps of one interval and γ from one
interval to the next, and a gap in the interval numbers ends the sequence.

The update is train.py's `rl_update`, with two choices for data the network did not collect:
- the ratio's base is the network's own probability *before* fine-tuning, so the clip is a
  trust region around the active model (where the serving policy's greedy action has a
  probability near 1 - ε but the network's may be 0.6, a ratio to the serving probability
  would start outside the clip and the update would do nothing, or everything);
- each sample is weighted by min(π_before / μ, ρ̄), the truncated importance weight of the
  network over the serving policy (Retrace/V-trace truncation: an exploratory action with μ
  = ε / (allowed actions) would otherwise weigh hundreds of times more than the rest).
The critic (not in the ONNX graph) is first fitted to the discounted returns, then
advantages are GAE over the sequence with that critic.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from mlsched.features.card import ModelCard
from mlsched.policies.decision_log import IntervalRecord
from policy_models.dl2 import networks
from policy_models.dl2.train import gae, rl_update


@dataclass
class OffPolicyArgs:
    gamma: float = 0.9  # per interval, as train.py per slot
    gae_lambda: float = 0.95
    lr: float = 3e-5  # train.py's RL rate: larger steps left the warm start behind there
    batch: int = 256
    critic_updates: int = 400
    policy_epochs: int = 4  # passes over the recorded steps
    clip: float = 0.2
    rho_max: float = 2.0  # importance-weight truncation
    entropy: float = 0.001
    time_budget_s: float = 300.0


@dataclass
class Transitions:
    states: np.ndarray
    masks: np.ndarray
    actions: np.ndarray
    behaviour: np.ndarray
    reward: np.ndarray  # after each step
    discount: np.ndarray  # from each step to the next
    skipped: int = 0  # decisions of another algorithm, encoder or window

    def __len__(self) -> int:
        return len(self.actions)


def transitions(records: list[IntervalRecord], card: ModelCard, gamma: float) -> Transitions:
    """The records' DL² steps as one sequence (see the module doc)."""
    states, masks, actions, mu, reward, discount = [], [], [], [], [], []
    skipped, last_interval, pending = 0, None, 1.0
    for rec in sorted(records, key=lambda r: r.interval):
        if last_interval is not None and rec.interval != last_interval + 1 and discount:
            discount[-1] = 0.0  # a gap: what came before does not lead here
        last_interval = rec.interval
        steps = 0
        for d in rec.decisions:
            if (d.algorithm, d.encoder, d.encoder_version, d.encoder_params) != (
                    "dl2", card.encoder_name, card.encoder_version, card.encoder_params):
                skipped += d.steps
                continue
            states.append(d.states.astype(np.float32))
            masks.append(d.masks.astype(np.float32))
            actions.append(d.actions)
            mu.append(d.behaviour_probs)
            reward.extend([0.0] * d.steps)
            discount.extend([1.0] * d.steps)
            steps += d.steps
        if steps:
            reward[-1] += rec.reward
            discount[-1] = gamma
            pending = 1.0
        elif reward:  # no inference this interval: its reward belongs to the last step (train.py)
            pending *= gamma
            reward[-1] += pending * rec.reward
    if not actions:
        raise ValueError("the records hold no DL² decisions this model's encoder can read")
    discount[-1] = 0.0
    return Transitions(np.concatenate(states), np.concatenate(masks), np.concatenate(actions).astype(np.int64),
                       np.concatenate(mu).astype(np.float32), np.array(reward, np.float32),
                       np.array(discount, np.float32), skipped)


def returns(t: Transitions) -> np.ndarray:
    out = np.zeros(len(t), np.float32)
    nxt = 0.0
    for i in reversed(range(len(t))):
        nxt = t.reward[i] + t.discount[i] * nxt
        out[i] = nxt
    return out


def probabilities_of(net, t: Transitions, batch: int = 4096) -> np.ndarray:
    out = []
    with torch.no_grad():
        for k in range(0, len(t), batch):
            logits = networks.masked_logits(net.logits(torch.from_numpy(t.states[k:k + batch])),
                                            torch.from_numpy(t.masks[k:k + batch]))
            p = torch.softmax(logits, dim=-1).gather(1, torch.from_numpy(t.actions[k:k + batch])[:, None])
            out.append(p.squeeze(1).numpy())
    return np.concatenate(out)


def fine_tune(net, t: Transitions, args: OffPolicyArgs, rng: np.random.Generator, log=print) -> dict:
    t0 = time.time()
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    n = len(t)
    before = probabilities_of(net, t)
    weight = np.minimum(before / np.maximum(t.behaviour, 1e-6), args.rho_max).astype(np.float32)
    tensors = [torch.from_numpy(x) for x in (t.states, t.masks, t.actions)]

    def batch(idx, g, adv):
        i = torch.from_numpy(idx)
        return (tensors[0][i], tensors[1][i], tensors[2][i], torch.from_numpy(g[idx]), torch.from_numpy(adv[idx]),
                torch.from_numpy(before[idx])), torch.from_numpy(weight[idx])

    # 1. the critic alone, on discounted returns (the policy term is off: policy_weight 0)
    g = returns(t)
    zeros = np.zeros(n, np.float32)
    for _ in tqdm(range(args.critic_updates), desc="critic", file=sys.stderr, disable=None, leave=False):
        b, _w = batch(rng.integers(0, n, min(args.batch, n)), g, zeros)
        rl_update(net, opt, b, 0.0, policy_weight=0.0)
    # 2. advantages with that critic, then clipped, importance-weighted policy updates
    targets, adv = gae(net, t.states, t.reward, t.discount, args.gae_lambda)
    passes = Minibatches(n, args, rng, t0)
    for idx in passes:
        b, w = batch(idx, targets, adv)
        rl_update(net, opt, b, args.entropy, clip=args.clip, weight=w)
    return summarise(n, t.skipped, passes.updates, passes.stopped, weight, before, probabilities_of(net, t), adv,
                     t0, "steps", "action", log)


class Minibatches:
    """`args.policy_epochs` passes over n samples in shuffled minibatches of `args.batch`
    (a progress bar beside), ending early once `args.time_budget_s` since `t0` is spent
    (`stopped`); `updates` counts the minibatches the caller was given and used."""

    def __init__(self, n: int, args: OffPolicyArgs, rng: np.random.Generator, t0: float):
        self.n, self.args, self.rng, self.t0 = n, args, rng, t0
        self.updates, self.stopped = 0, False

    def __iter__(self):
        per_epoch = max(self.n // self.args.batch, 1)
        with tqdm(total=self.args.policy_epochs * per_epoch, desc="off-policy", file=sys.stderr, disable=None,
                  leave=False) as bar:
            for _ in range(self.args.policy_epochs):
                perm = self.rng.permutation(self.n)
                for k in range(per_epoch):
                    if time.time() - self.t0 > self.args.time_budget_s:
                        self.stopped = True
                        return
                    yield perm[k * self.args.batch:(k + 1) * self.args.batch]
                    self.updates += 1
                    bar.update(1)


def summarise(n: int, skipped: int, updates: int, stopped: bool, weight: np.ndarray, before: np.ndarray,
              after: np.ndarray, adv: np.ndarray, t0: float, unit: str, action: str, log=print) -> dict:
    """A fine-tuning run's summary (the card's training.summary) and its log line: how the
    probability of the action taken moved where the advantage was positive and negative."""
    summary = {"steps": n, "skipped_steps": skipped, "updates": updates, "stopped_by_budget": stopped,
               "mean_importance_weight": float(weight.mean()),
               "mean_prob_change_positive_adv": float((after - before)[adv > 0].mean()) if (adv > 0).any() else 0.0,
               "mean_prob_change_negative_adv": float((after - before)[adv < 0].mean()) if (adv < 0).any() else 0.0,
               "wall_s": round(time.time() - t0, 1)}
    log(f"off-policy: {n} {unit}, {updates} updates in {summary['wall_s']} s; probability of the {action} taken "
        f"{summary['mean_prob_change_positive_adv']:+.4f} where the advantage was positive, "
        f"{summary['mean_prob_change_negative_adv']:+.4f} where negative")
    return summary

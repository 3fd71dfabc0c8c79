"""Off-policy fine-tuning of Harmony placement on its recorded decisions
(`mlsched retrain harmony --mode offpolicy`).

The operator logs each Harmony inference (policies/placement/harmony.py): the state as one
vector (`harmony_state.flat_state`), the node mask, the node taken, the probability with
which serving took it (exploration included) and the network's own. Those decisions are the
data here, as DL²'s are in offpolicy.py, with the same two choices for data the network did
not collect:
- the clipped ratio's base is the network's probability *before* fine-tuning, so the clip is
  a trust region around the active model;
- each decision is weighted by min(π_before / μ, ρ̄), the truncated importance weight of the
  network over the serving policy.
What differs from DL²'s:
- **Returns.** Every decision of an interval shares the interval's return, the discounted sum
  of its reward and those after it (γ per interval; a gap in the interval numbers ends the
  sum), as harmony/train.py's actor-critic credits its samples. The advantage is that return
  less the critic's value of the decision's state.
- **The critic** is the network's value head, which shares the encoder with the policy: it
  is fitted first with every other weight frozen (the policy does not move), and only the
  policy term trains afterwards, against those fixed advantages.
- A state is a set of job and node tokens whose sizes change from round to round
  (`harmony_state.unflatten`); minibatches pad them (harmony/train.py `collate`).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from mlsched.features import harmony_state
from mlsched.features.card import ModelCard
from mlsched.policies.decision_log import IntervalRecord
from policy_models.harmony.train import Sample, collate
from policy_models.retrain import offpolicy


@dataclass
class OffPolicyArgs(offpolicy.OffPolicyArgs):
    """DL²'s off-policy settings (γ 0.9 per interval, learning rate 3e-5, the clip, ρ̄ 2, four
    passes), with Harmony's minibatch (the paper's 32), a shorter critic fit and no entropy
    bonus (the trained start is already near-deterministic). `gae_lambda` is unused: every
    decision of an interval shares its return."""

    batch: int = 32
    critic_updates: int = 300
    entropy: float = 0.0


@dataclass
class Decisions:
    samples: list[Sample]  # feeds, action, and `ret`: the return of the decision's interval
    behaviour: np.ndarray  # μ of each action (serving, exploration included)
    skipped: int = 0  # decisions of another algorithm or encoder


def decisions(records: list[IntervalRecord], card: ModelCard, gamma: float) -> Decisions:
    """The records' Harmony decisions with their intervals' returns (module doc)."""
    ordered = sorted(records, key=lambda r: r.interval)
    returns, following = {}, 0.0
    for k in range(len(ordered) - 1, -1, -1):
        rec = ordered[k]
        consecutive = k + 1 < len(ordered) and ordered[k + 1].interval == rec.interval + 1
        following = rec.reward + (gamma * following if consecutive else 0.0)
        returns[rec.interval] = following
    samples, behaviour, skipped = [], [], 0
    for rec in ordered:
        for d in rec.decisions:
            if (d.algorithm, d.phase, d.encoder, d.encoder_version) != (
                    "harmony", "placement", card.encoder_name, card.encoder_version):
                skipped += d.steps
                continue
            for i in range(d.steps):
                feeds = harmony_state.unflatten(d.states[i], d.masks[i])
                sample = Sample(feeds, int(d.actions[i]), interval=rec.interval)
                sample.ret = returns[rec.interval]
                samples.append(sample)
                behaviour.append(float(d.behaviour_probs[i]))
    if not samples:
        raise ValueError("the records hold no Harmony placement decisions this model's encoder can read "
                         "(does the policy keep a dataset, spec.retraining.datasetLimit > 0?)")
    return Decisions(samples, np.array(behaviour, np.float32), skipped)


def _forward(net, chunk: list[Sample]):
    x = collate(chunk)
    logits, value = net.logits_and_value(x["jobs"], x["current"], x["role"], x["nodes"], x["mask"],
                                         x["job_pad"], x["node_pad"])
    return torch.log_softmax(logits, dim=-1), value, x["mask"]


def probabilities_of(net, samples: list[Sample], batch: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """(π(action), value) of every sample under `net`."""
    probs, values = [], []
    net.eval()
    with torch.no_grad():
        for k in range(0, len(samples), batch):
            chunk = samples[k:k + batch]
            logp, value, _ = _forward(net, chunk)
            probs.append(logp.gather(1, torch.tensor([s.action for s in chunk])[:, None]).squeeze(1).exp().numpy())
            values.append(value.numpy())
    return np.concatenate(probs), np.concatenate(values)


def fine_tune(net, data: Decisions, args: OffPolicyArgs, rng: np.random.Generator, log=print) -> dict:
    t0 = time.time()
    samples, n = data.samples, len(data.samples)
    before, _ = probabilities_of(net, samples)
    weight = np.minimum(before / np.maximum(data.behaviour, 1e-6), args.rho_max).astype(np.float32)
    ret = np.array([s.ret for s in samples], np.float32)

    # 1. the critic: the value head alone on the returns (the shared encoder frozen)
    critic_opt = torch.optim.Adam(net.value_head.parameters(), lr=1e-3)
    net.train()
    for _ in tqdm(range(args.critic_updates), desc="critic", file=sys.stderr, disable=None, leave=False):
        idx = rng.integers(0, n, min(args.batch, n))
        _, value, _ = _forward(net, [samples[i] for i in idx])
        loss = torch.nn.functional.mse_loss(value, torch.from_numpy(ret[idx]))
        critic_opt.zero_grad()
        loss.backward()
        critic_opt.step()
    _, values = probabilities_of(net, samples)
    adv = ret - values
    adv = ((adv - adv.mean()) / (adv.std() + 1e-8)).astype(np.float32)

    # 2. the policy: clipped, importance-weighted updates around the active model
    policy_params = [p for name, p in net.named_parameters() if not name.startswith("value_head.")]
    opt = torch.optim.Adam(policy_params, lr=args.lr)
    passes = offpolicy.Minibatches(n, args, rng, t0)
    for idx in passes:
        net.train()
        logp_all, _, mask = _forward(net, [samples[i] for i in idx])
        logp = logp_all.gather(1, torch.tensor([samples[i].action for i in idx])[:, None]).squeeze(1)
        ratio = torch.exp(logp - torch.log(torch.from_numpy(before[idx]).clamp(min=1e-6)))
        a = torch.from_numpy(adv[idx])
        surrogate = torch.min(ratio * a, torch.clamp(ratio, 1 - args.clip, 1 + args.clip) * a)
        probs = logp_all.exp()
        entropy = -(probs * torch.where(mask > 0, logp_all, torch.zeros_like(logp_all))).sum(-1).mean()
        loss = -(torch.from_numpy(weight[idx]) * surrogate).mean() - args.entropy * entropy
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy_params, 1.0)
        opt.step()
    net.eval()
    after, _ = probabilities_of(net, samples)
    return offpolicy.summarise(n, data.skipped, passes.updates, passes.stopped, weight, before, after, adv, t0,
                               "decisions", "node", log)

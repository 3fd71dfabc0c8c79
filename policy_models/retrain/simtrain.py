"""Continue DL²'s RL in the calibrated simulator (`mlsched retrain --mode simulator`).

train.py's RL phase, unchanged (rl_episode, Replay, rl_update, validate), on traces drawn
from the cluster's recorded workload (workload.py) in a simulator whose per-model speeds are
the calibration's. The network starts from the active model (warm_start.py); its critic is
not in the graph, so the first episodes fit the critic alone (train.py does the same after
its warm-up). Every `validate_every` episodes the greedy policy runs on validation traces of
the same workload, and the best network seen, the start included, is what comes out: a
run that does not improve returns the active model's weights and publishes nothing.
"""

from __future__ import annotations

import dataclasses
import sys
import time

import numpy as np
import torch
from tqdm import tqdm

from mlsched.features import dl2_state
from policy_models.dl2 import train as dl2_train
from policy_models.retrain.workload import TRAIN_SEEDS, VALIDATION_SEEDS, Workload


@dataclasses.dataclass
class SimRLArgs:
    time_budget_s: float = 300.0
    episodes: int = 100_000  # the budget ends training first
    validate_every: int = 20
    validation_traces: int = 3
    critic_warmup_episodes: int = 10
    max_slots_per_episode: int = 40
    lr: float = 3e-5  # train.py's: larger left the warm start behind
    explore: float = 0.05
    random: float = 0.02
    entropy: float = 0.002


def train_in_simulator(net, spec, workload: Workload, calibration,
                       args: SimRLArgs, seed: int, log=print) -> dict:
    t0 = time.time()
    rng = np.random.default_rng(seed)
    base = dl2_train.Args(window=spec.window, arch=spec.arch, hidden=spec.hidden, seed=seed,
                          max_slots_per_episode=args.max_slots_per_episode)

    def setup(_args, k):
        s = TRAIN_SEEDS + 10_000 * seed + k
        return workload.trace(s), workload.config(s, calibration)

    val_sets = []
    for k in range(args.validation_traces):
        s = VALIDATION_SEEDS + 1_000 * seed + k
        val_sets.append(("cluster", workload.trace(s), workload.config(s, calibration)))
    start_val = dl2_train.validate(base, net, val_sets)["cluster"]
    best = {"jct": start_val, "state": {k: v.clone() for k, v in net.state_dict().items()}, "episode": 0}
    curve = [(0, start_val)]
    replay = dl2_train.Replay(base.replay, dl2_state.state_dim(spec.window), dl2_state.n_actions(spec.window))
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    bar = tqdm(desc="RL (calibrated simulator)", file=sys.stderr, disable=None, leave=False)
    ep = 0
    while ep < args.episodes and time.time() - t0 < args.time_budget_s:
        ep += 1
        samples, _ = dl2_train.rl_episode(base, ep, net, rng, args.explore, args.random, setup=setup)
        for smp in samples:
            replay.add(*smp)
        warm = ep <= args.critic_warmup_episodes
        for _ in range(base.updates_per_episode if replay.size else 0):
            dl2_train.rl_update(net, opt, replay.sample(rng, base.batch), args.entropy,
                                policy_weight=0.0 if warm else 1.0)
        bar.update(1)
        if ep % args.validate_every == 0 and not warm:
            jct = dl2_train.validate(base, net, val_sets)["cluster"]
            curve.append((ep, jct))
            if jct < best["jct"]:
                best = {"jct": jct, "state": {k: v.clone() for k, v in net.state_dict().items()}, "episode": ep}
            bar.set_postfix(val=f"{jct / start_val:.3f}", best=f"{best['jct'] / start_val:.3f}")
    bar.close()
    net.load_state_dict(best["state"])
    summary = {"episodes": ep, "best_episode": best["episode"], "validation_start_avg_jct_s": round(start_val, 1),
               "validation_best_avg_jct_s": round(best["jct"], 1), "wall_s": round(time.time() - t0, 1),
               "curve": [(e, round(j, 1)) for e, j in curve]}
    log(f"simulator RL: {ep} episodes in {summary['wall_s']} s; validation avg JCT {start_val:.0f} s at the "
        f"start, best {best['jct']:.0f} s (episode {best['episode']})")
    return summary

"""Imitate the relative-oracle teacher in the calibrated simulator (`mlsched retrain --mode
imitate`).

What made the shipped DL² model good was not its RL but its imitation of a privileged teacher
(docs/dl2.md): Optimus with the simulator's true speeds and a relative gain, with DAgger.
Retraining can do the same where RL from a warm start moves little (docs/retraining.md): in
the simulator calibrated to the cluster's records, on traces of the recorded workload, the
teacher is given the *calibrated* speeds, so what it teaches is what is best in this cluster
as far as the records show. The network starts from the active model; teacher rollouts are
labelled, then DAgger rounds roll the student out and label its own states; after each fit
the greedy student runs on validation traces, and the best network seen, the start included,
comes out (a run that does not improve returns the active model, which is then not published).
"""

from __future__ import annotations

import dataclasses
import sys
import time

import numpy as np
import torch
from tqdm import tqdm

from mlsched.policies.allocation.dl2 import DL2Policy
from mlsched.policies.speed_estimate import TrueSpeed
from mlsched.workloads.speed_models import MeasuredSpeed, ScaledSpeed
from policy_models.dl2 import networks
from policy_models.dl2 import train as dl2_train
from policy_models.retrain.workload import TRAIN_SEEDS, VALIDATION_SEEDS, Workload


@dataclasses.dataclass
class ImitateArgs:
    time_budget_s: float = 600.0
    teacher_traces: int = 20  # teacher rollouts labelled first
    dagger_traces: int = 10  # student rollouts per DAgger round
    max_rounds: int = 20  # the budget usually ends it first
    epochs: int = 8  # passes over all samples after each round
    lr: float = 1e-3
    batch: int = 256
    validation_traces: int = 3
    max_slots_per_episode: int = 40


def calibrated_teacher(speed_factors: dict[str, float] | None):
    """train.py's relative-oracle teacher, seeing the calibrated speeds instead of the table."""
    teacher = dl2_train.TEACHERS["relative-oracle"]()
    speed = MeasuredSpeed()
    teacher.estimator = TrueSpeed(ScaledSpeed(speed, speed_factors) if speed_factors else speed)
    return teacher


def rollouts(window: int, teacher, traces, student=None, max_slots: int = 40):
    """(states, masks, teacher's actions) of rollouts on `traces` ((trace, config) pairs),
    driven by the teacher, or by the greedy `student` with the teacher's labels (DAgger)."""
    states, masks, actions = [], [], []
    actor = teacher if student is None else dl2_train.LabelledByTeacher(
        dl2_train.GreedyActor(networks.NumpyPolicy(student)), teacher)

    def record(vec, mask, action, granted):
        states.append(vec)
        masks.append(mask)
        actions.append(action if student is None else actor.label)

    policy = DL2Policy(actor, window=window, on_step=record)
    for trace, config in traces:
        dl2_train.simulate(trace, config, policy, max_slots=max_slots)
    return (torch.tensor(np.array(states)), torch.tensor(np.array(masks), dtype=torch.float32),
            torch.tensor(actions, dtype=torch.long))


def imitate_in_simulator(net, spec, workload: Workload, calibration,
                         args: ImitateArgs, seed: int, log=print) -> dict:
    t0 = time.time()
    torch.manual_seed(seed)
    base = dl2_train.Args(window=spec.window, arch=spec.arch, hidden=spec.hidden, seed=seed,
                          max_slots_per_episode=args.max_slots_per_episode)
    teacher = calibrated_teacher(calibration.speed_factors if calibration else None)
    next_trace = iter(range(TRAIN_SEEDS + 10_000 * seed, TRAIN_SEEDS + 10_000 * (seed + 1)))

    def traces(n: int):
        return [(workload.trace(s), workload.config(s, calibration)) for s in (next(next_trace) for _ in range(n))]

    val_sets = [("cluster", workload.trace(s), workload.config(s, calibration))
                for s in (VALIDATION_SEEDS + 1_000 * seed + k for k in range(args.validation_traces))]
    start_val = dl2_train.validate(base, net, val_sets)["cluster"]
    best = {"jct": start_val, "state": {k: v.clone() for k, v in net.state_dict().items()}, "round": 0}
    curve = [(0, start_val)]
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    s, m, a = rollouts(spec.window, teacher, traces(args.teacher_traces), max_slots=args.max_slots_per_episode)
    bar = tqdm(total=args.max_rounds + 1, desc="imitation (calibrated simulator)", file=sys.stderr,
               disable=None, leave=False)
    rounds = 0
    while True:
        dl2_train.fit(net, opt, s, m, a, args.epochs, args.batch, f"fit {rounds}")
        jct = dl2_train.validate(base, net, val_sets)["cluster"]
        curve.append((rounds + 1, jct))
        if jct < best["jct"]:
            best = {"jct": jct, "state": {k: v.clone() for k, v in net.state_dict().items()}, "round": rounds + 1}
        bar.update(1)
        bar.set_postfix(val=f"{jct / start_val:.3f}", best=f"{best['jct'] / start_val:.3f}")
        if rounds >= args.max_rounds or time.time() - t0 >= args.time_budget_s:
            break
        rounds += 1
        ds, dm, da = rollouts(spec.window, teacher, traces(args.dagger_traces), student=net,
                              max_slots=args.max_slots_per_episode)
        s, m, a = torch.cat([s, ds]), torch.cat([m, dm]), torch.cat([a, da])
    bar.close()
    net.load_state_dict(best["state"])
    summary = {"dagger_rounds": rounds, "samples": len(a), "best_fit": best["round"],
               "validation_start_avg_jct_s": round(start_val, 1),
               "validation_best_avg_jct_s": round(best["jct"], 1), "wall_s": round(time.time() - t0, 1),
               "curve": [(r, round(j, 1)) for r, j in curve]}
    log(f"imitation: {len(a)} labelled steps, {rounds} DAgger rounds in {summary['wall_s']} s; validation avg "
        f"JCT {start_val:.0f} s at the start, best {best['jct']:.0f} s (fit {best['round']})")
    return summary

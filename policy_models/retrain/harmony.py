"""`mlsched retrain harmony`: improve the active Harmony placement model from the cluster's
interval records, the way `mlsched retrain dl2` does for DL² (cli.py; docs/retraining.md).

    mlsched retrain harmony --namespace NS --policy NAME          # in the cluster
    mlsched retrain harmony --records DIR --store DIR             # local files

1. Read the records not yet consumed by a published placement/harmony version.
2. Calibrate the simulator's per-model speeds and interference to them (calibration.py, as DL²'s).
3. Rebuild the cluster's workload from them with each job's counts (the most workers and PS
   it held: under the `fixed` allocation, the user's), arriving at the recorded rate.
4. Start from the active model (its exported graph: harmony/export.state_from_onnx; the critic
   is not in the graph and starts afresh) and train it, in the mode the user picks:
   `--mode simulator` (default) continues Harmony's actor-critic (harmony/train.py
   `actor_critic`) on traces of that workload in the calibrated simulator, under the
   allocation the records name; every `--validate-every` episodes the greedy policy runs on
   validation traces of the same workload, and the best network seen, the start included,
   comes out (a run that does not improve returns the active model's weights).
   `--mode offpolicy` fine-tunes on the recorded decisions themselves (harmony_offpolicy.py).
5. Candidate against active on held-out traces of the workload in the calibrated simulator;
   published as the next version (a ConfigMap, phase placement) only if its average JCT is
   lower by --margin.

"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from mlsched.features.card import ModelCard, card_path
from mlsched.policies import registry
from mlsched.sim.simulator import Simulator
from policy_models.harmony import export
from policy_models.harmony import train as harmony_train
from policy_models.retrain import cli, evaluate, harmony_offpolicy, workload

PHASE, ALGORITHM = "placement", "harmony"
#: Allocations the simulator runs for a recorded policy without a model of the policy's own.
#: A learned allocation (dl2) runs its shipped model: the records do not say which version.
SIMULATED_ALLOCATIONS = ("fixed", "drf", "fifo", "srtf", "tetris", "optimus", "dl2")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.common_parser("mlsched retrain harmony", __doc__)
    p.add_argument("--mode", choices=("simulator", "offpolicy"), default="simulator",
                   help="simulator: actor-critic in the calibrated simulator; offpolicy: fine-tune on the "
                        "recorded decisions (the policy must keep a dataset)")
    p.add_argument("--episodes", type=int, default=200, help="at most this many actor-critic episodes")
    p.add_argument("--validate-every", type=int, default=20)
    p.add_argument("--validation-traces", type=int, default=6)
    p.add_argument("--lr", type=float, default=3e-5,
                   help="actor-critic learning rate (train.py's 1e-4 drifts from a trained start within 40 episodes)")
    a = cli.parse_common(p, argv)
    if a.validate_every < 1 or a.episodes < 0:
        p.error("--validate-every must be at least 1 and --episodes not negative")
    return a


def recorded_allocation(records) -> str:
    """The allocation most of the records ran under (the one the placement learned beside)."""
    names = Counter(r.algorithms.get("allocation", "fixed") for r in records)
    name = names.most_common(1)[0][0]
    if name not in SIMULATED_ALLOCATIONS:
        raise ValueError(f"the records were scheduled by allocation {name!r}, which the retrainer cannot "
                         f"simulate (one of {', '.join(SIMULATED_ALLOCATIONS)})")
    return name


def jct_with(allocation: str):
    """avg JCT of a Harmony model (path) on (trace, config) beside `allocation`, as served."""
    def run(model_path: str, trace, config) -> float:
        sim = Simulator(trace, config)
        placement = registry.make_placement("harmony", registry.PolicyContext(model_path=str(model_path)))
        result = sim.run(registry.make_allocation(allocation, registry.PolicyContext(speed_model=sim.speed)),
                         placement)
        return result.summary()["avg_jct_s"] if result.completed == result.jobs else float("inf")
    return run


def train_in_simulator(net, load: workload.Workload, calibration, allocation: str,
                       a, deadline: float, log=print) -> dict:
    """Harmony's actor-critic on the workload in the calibrated simulator; the best network on
    the validation traces (the start included) is left in `net`."""
    rng = np.random.default_rng(a.seed)
    args = harmony_train.Args(seed=a.seed, ac_episodes=a.episodes, validate_every=a.validate_every, ac_lr=a.lr,
                              d=net.config["d"], heads=net.config["heads"], layers=net.config["layers"],
                              # A trained start: little forced exploration, none of the entropy
                              # push that helps a fresh network (train.py's schedules start higher).
                              epsilon=(0.05, 0.0), entropy=(0.0, 0.0))
    val_cases = [(load.trace(s), load.config(s, calibration)) for s in
                 (workload.VALIDATION_SEEDS + 1_000 * a.seed + k for k in range(a.validation_traces))]

    def val_jct() -> float:
        net.eval()
        greedy = harmony_train.Learner(net, "greedy", np.random.default_rng(0))
        return float(np.mean([harmony_train.run_case(t, c, greedy, None, allocation)[0]["avg_jct_s"]
                              for t, c in val_cases]))

    start = val_jct()
    best = {"jct": start, "state": {k: v.clone() for k, v in net.state_dict().items()}, "episode": 0}
    curve = [(0, round(start, 1))]

    def draw(e: int):
        s = workload.TRAIN_SEEDS + 10_000 * a.seed + e
        return load.trace(s), load.config(s, calibration), allocation

    def validate_at(done: int, _eps: float, _beta: float) -> None:
        jct = val_jct()
        curve.append((done, round(jct, 1)))
        if jct < best["jct"]:
            best.update(jct=jct, state={k: v.clone() for k, v in net.state_dict().items()}, episode=done)
        log(f"episode {done}: validation avg JCT {jct:.0f} s ({jct / start:.3f} x the start; best "
            f"{best['jct'] / start:.3f} at episode {best['episode']})")

    t0 = time.time()
    done = harmony_train.actor_critic(net, args, rng, draw, validate_at, deadline=deadline)
    net.load_state_dict(best["state"])
    net.eval()
    return {"episodes": done, "best_episode": best["episode"], "validation_start_avg_jct_s": round(start, 1),
            "validation_best_avg_jct_s": round(best["jct"], 1), "wall_s": round(time.time() - t0, 1),
            "curve": curve, "allocation": allocation}


def run(a, log=print) -> dict:
    t0 = time.time()
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)  # the critic head, which the graph does not hold, starts from it
    records, store, policy_obj = cli.sources(a)
    versions = store.versions() if store else []
    fresh, span = cli.new_intervals(records, versions, PHASE, ALGORITHM, log)
    if not fresh:
        return {"status": "nothing-new", "trained_through_interval": span[1]}
    warnings = cli.progress_warnings(fresh, log)
    placements = {r.algorithms.get("placement") for r in fresh}
    if ALGORITHM not in placements:
        log(f"note: the records were placed by {', '.join(sorted(map(str, placements)))}, not harmony; "
            "learning from their workload all the same")

    work = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="mlsched-retrain-harmony-"))
    base_path, base_version = cli.base_model(a, store, policy_obj, work, PHASE, ALGORITHM)
    cal = cli.calibrate(fresh, versions, PHASE, ALGORITHM, a.min_samples, log)
    load = workload.from_records(fresh, counts=True)
    allocation = recorded_allocation(fresh)

    net = export.state_from_onnx(base_path)
    base_sha = hashlib.sha256(Path(base_path).read_bytes()).hexdigest()
    if a.mode == "offpolicy":
        settings = harmony_offpolicy.OffPolicyArgs(lr=a.lr, time_budget_s=a.time_budget_min * 60)
        data = harmony_offpolicy.decisions(fresh, ModelCard.read(card_path(base_path)), settings.gamma)
        summary = harmony_offpolicy.fine_tune(net, data, settings, np.random.default_rng(a.seed), log)
    else:
        summary = train_in_simulator(net, load, cal, allocation, a, t0 + a.time_budget_min * 60, log)
    candidate = work / "candidate" / f"{ALGORITHM}.onnx"
    training = {"command": " ".join(["mlsched retrain harmony", *sys.argv[1:]]), "mode": a.mode,
                "base_sha256": base_sha, "base_version": base_version, "intervals": list(span),
                "seed": a.seed, "summary": summary, "calibration": cal.to_json(), "workload": load.to_json()}
    cases = [(load.trace(workload.EVALUATION_SEEDS + k), load.config(workload.EVALUATION_SEEDS + k, cal))
             for k in range(a.eval_traces)]
    domain = load.widened_domain(ModelCard.read(card_path(base_path)).domain, len(fresh))
    export.export(net, candidate, training, {}, domain=domain)
    judged = evaluate.compare(str(base_path), str(candidate), cases, jct=jct_with(allocation))
    evaluation = {**judged, "mode": a.mode, "margin": a.margin, "trained_through_interval": span[1],
                  "first_interval": span[0], "intervals": len(fresh), "base_version": base_version,
                  "base_sha256": base_sha, "speed_factors": cal.speed_factors,
                  "sensitivity_factors": cal.sensitivity_factors, "restart_cost_s": cal.restart_cost_s,
                  "start_cost_s": cal.start_cost_s, "seed": a.seed,
                  "allocation": allocation}
    card_json = json.dumps(export.export(net, candidate, training, {"retrain_evaluation": evaluation},
                                         domain=domain),
                           indent=1, sort_keys=True)
    return cli.conclude(a, work, store, versions, PHASE, ALGORITHM, candidate, card_json, evaluation, cal, t0, log,
                        warnings)


def main(argv: list[str] | None = None) -> int:
    return cli.main(argv, run=run, parse_args=parse_args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

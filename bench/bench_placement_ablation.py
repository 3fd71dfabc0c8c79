"""Harmony placement's ablation (issue 15; the paper's component study): what the critic, the
job-aware exploration, the replay buffer and the attention over jobs each add.

Every variant starts from the same imitation network (DAgger on LIF-Line, as `mlsched train
harmony` does; one per encoder shape, since removing attention changes the network) and then
runs the same actor-critic training, with one component taken out:

    full            the shipped recipe (policy_models/harmony/train.py)
    no-critic       --no-critic: REINFORCE, the return minus the minibatch's mean return
    no-exploration  --epsilon 0 0: no bin-pack / load-balance nodes, the policy's own samples
    no-replay       --replay 0: each episode's samples only, no FIFO replay
    no-attention    --layers 0: no Transformer layers; each job's embedding alone is its query

each with `--train-seeds` actor-critic seeds. Per variant it prints the validation score
(avg JCT / LIF-Line on the validation traces) of the start, of the selected network (the best
validation, what training ships) and of the network after the last episode, averaged over
the seeds; then the selected networks' avg JCT on the benchmark's unseen traces (seeds
700000+, bench/bench_placement.py's) at each node count, as a ratio to the best heuristic of
the row (LIF-Quad, LIF-Line, ..., computed in the same run), averaged over the seeds.

    python bench/bench_placement_ablation.py [--out /tmp/harmony-ablation] [--train-seeds 3]
        [--episodes 100] [--jobs 2] [--eval-seeds 3] [--nodes 6 30 100] [--skip-training]

About 30 minutes on 2 cores with the defaults (`--jobs 2` trains two variants at a time).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from bench_placement import HEURISTICS, SEED0, trace  # noqa: E402
from mlsched.policies import registry  # noqa: E402
from mlsched.sim.simulator import SimConfig, Simulator  # noqa: E402

VARIANTS: dict[str, dict] = {
    "full": {},
    "no-critic": {"critic": False},
    "no-exploration": {"epsilon": (0.0, 0.0)},
    "no-replay": {"replay": 0},
    "no-attention": {"layers": 0},
}


def _train(kwargs: dict) -> str:
    """One `mlsched train harmony` run in a worker process (its log goes to <out>.log)."""
    from policy_models.harmony import train

    out = kwargs["out"]
    argv = []  # the same run as a command line, for the model card
    for k, v in kwargs.items():
        flag = "--" + k.replace("_", "-")
        if isinstance(v, bool):
            argv.append(flag if v else flag.replace("--", "--no-", 1))
        else:
            argv += [flag, *map(str, v if isinstance(v, tuple) else (v,))]
    with open(out + ".log", "w") as log:
        sys.stderr = log  # the trainer reports progress on stderr
        train.train(train.parse_args(argv), argv=argv)
    return out


def start_of(out: Path, layers: int) -> Path:
    return out / f"start-l{layers}"


def run_dir(out: Path, variant: str, seed: int) -> Path:
    return out / f"{variant}-s{seed}"


def train_all(out: Path, seeds: list[int], episodes: int, jobs: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    layers = sorted({VARIANTS[v].get("layers", 2) for v in VARIANTS})
    with ProcessPoolExecutor(jobs) as pool:
        starts = [dict(out=str(start_of(out, n)), layers=n, ac_episodes=0) for n in layers]
        for done in pool.map(_train, starts):
            print(f"imitation start: {done}", flush=True)
        runs = []
        for variant, change in VARIANTS.items():
            for seed in seeds:
                n = change.get("layers", 2)
                runs.append(dict(out=str(run_dir(out, variant, seed)), seed=seed, dagger_rounds=0,
                                 ac_episodes=episodes, init=str(start_of(out, n) / "imitation.pt"),
                                 **change))
        for done in pool.map(_train, runs):
            print(f"trained: {done}", flush=True)


def avg_jct(placement, nodes: int, seeds: range) -> float:
    out = []
    for seed in seeds:
        sim = Simulator(trace(nodes, seed), SimConfig(nodes=nodes, seed=seed))
        result = sim.run(registry.make_allocation("fixed", registry.PolicyContext(speed_model=sim.speed)),
                         placement)
        out.append(result.summary()["avg_jct_s"])
    return float(np.mean(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="/tmp/harmony-ablation")
    parser.add_argument("--train-seeds", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--eval-seeds", type=int, default=3)
    parser.add_argument("--nodes", type=int, nargs="+", default=[6, 30, 100])
    parser.add_argument("--skip-training", action="store_true", help="evaluate what --out holds")
    args = parser.parse_args()
    out = Path(args.out)
    seeds = list(range(1, args.train_seeds + 1))
    if not args.skip_training:
        train_all(out, seeds, args.episodes, args.jobs)

    evals = range(SEED0, SEED0 + args.eval_seeds)
    best = {n: min(avg_jct(registry.make_placement(h), n, evals) for h in HEURISTICS) for n in args.nodes}
    print(f"\nablation: {args.train_seeds} actor-critic seed(s) x {args.episodes} episodes per variant; "
          f"validation = avg JCT / LIF-Line on the validation traces; test = avg JCT / the best "
          f"heuristic on {args.eval_seeds} unseen trace(s) per size (seeds {evals[0]}+)")
    print(f"{'variant':<15} {'start':>6} {'selected':>8} {'last':>6} " + " ".join(f"{f'test@{n}':>9}" for n in args.nodes))
    for variant in VARIANTS:
        rows = []
        for seed in seeds:
            folder = run_dir(out, variant, seed)
            curve = json.loads((folder / "learning-curve.json").read_text())
            placement = registry.make_placement("harmony", registry.PolicyContext(model_path=str(folder / "harmony.onnx")))
            rows.append([curve[0]["val_jct_over_lif"], min(c["val_jct_over_lif"] for c in curve),
                         curve[-1]["val_jct_over_lif"],
                         *(avg_jct(placement, n, evals) / best[n] for n in args.nodes)])
        m = np.mean(rows, axis=0)
        print(f"{variant:<15} {m[0]:>6.3f} {m[1]:>8.3f} {m[2]:>6.3f} " + " ".join(f"{x:>9.3f}" for x in m[3:]), flush=True)


if __name__ == "__main__":
    main()

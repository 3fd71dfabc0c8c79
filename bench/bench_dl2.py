"""DL² quality and inference speed, as ratios measured in one run.

Quality: on generated traces whose seeds training never used (workloads.scenarios
BENCHMARK_SEEDS) at 13, 60 and 500 nodes, the average JCT of DL² (SL+RL), DL² (SL only), DRF,
Optimus (fits its model from observed speeds) and Optimus-oracle (true speed function); the
ratios the issue sets (DL² <= 0.70 x DRF, <= 0.90 x Optimus, <= 1.00 x Optimus-oracle) and the
mean slowdown against each job's ideal.
Speed: one ONNX inference at J = 40 (median over realistic states, one thread; target 50 µs)
and a whole round of decisions for 40 jobs (median; target 10 ms).
Ablation (--ablation): the same ratios at 13 nodes with the simulator's interference on and
off, under load-balance and bin-pack placement: how much of the gap to DRF is allocation.
Generalisation (--holdout-model M.onnx --holdout-models vgg-16 dssm): a model trained without
those model types against the shipped one (trained on all eight), on the benchmark traces
(which contain them) and on traces made of the held-out types only.

    python bench/bench_dl2.py [--seeds 3] [--first-seed 100000] [--model policy_models/artifacts/dl2/dl2.onnx] [--ablation]
    python bench/bench_dl2.py --skip-speed --skip-quality --holdout-model runs/hold2/dl2.onnx --holdout-models vgg-16 dssm
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from mlsched.cluster.ledger import Ledger  # noqa: E402
from mlsched.features.dl2_state import WindowState, windows  # noqa: E402
from mlsched.policies import registry  # noqa: E402
from mlsched.policies.round import run_round  # noqa: E402
from mlsched.policies.allocation.dl2 import DL2Policy  # noqa: E402
from mlsched.policies.onnx_runner import default_model_path, load_model  # noqa: E402
from mlsched.sim.simulator import Simulator  # noqa: E402
from mlsched.workloads import generators  # noqa: E402
from mlsched.sim.scenarios import BENCHMARK_SEEDS, SCENARIOS  # noqa: E402

TARGETS = {"drf": 0.70, "optimus": 0.90, "optimus-oracle": 1.00}


def mean_summaries(sc, seeds: list[int], learned: dict[str, DL2Policy], heuristics: tuple[str, ...],
                   placement: str = "load-balance", models: tuple[str, ...] | None = None,
                   **config) -> dict[str, dict[str, float]]:
    """Each policy's avg JCT and slowdown on `sc` at these seeds, averaged over the seeds.
    Learned policies are loaded once by the caller; heuristics are built per trace (Optimus
    and the oracle need that trace's speed function)."""
    runs: dict[str, list[dict]] = {}
    for seed in seeds:
        sim = Simulator(sc.trace(seed, models), sc.config(seed, **config))
        ctx = registry.PolicyContext(speed_model=sim.speed)
        policies = {name: registry.make_allocation(name, ctx) for name in heuristics} | learned
        for name, alloc in policies.items():
            sim.reset()
            runs.setdefault(name, []).append(sim.run(alloc, registry.make_placement(placement)).summary())
    return {name: {key: float(np.mean([r[key] for r in rs])) for key in ("avg_jct_s", "avg_slowdown")}
            for name, rs in runs.items()}


def quality(model: Path, seeds: list[int]) -> None:
    learned = {"dl2": DL2Policy.load(str(model)),
               "dl2 (SL only)": DL2Policy.load(str(model.with_name(model.stem + "-sl.onnx")))}
    print(f"quality: avg JCT over {len(seeds)} unseen trace(s) per size (seeds {seeds[0]}-{seeds[-1]}); model {model}")
    print(f"{'scenario':<8} {'nodes':>5} {'policy':<15} {'avg JCT h':>9} {'slowdown':>8}")
    for sc in SCENARIOS.values():
        res = mean_summaries(sc, seeds, learned, tuple(TARGETS))
        jct = {name: r["avg_jct_s"] for name, r in res.items()}
        for name, r in res.items():
            print(f"{sc.name:<8} {sc.nodes:>5} {name:<15} {r['avg_jct_s'] / 3600:>9.2f} {r['avg_slowdown']:>8.2f}")
        for base, target in TARGETS.items():
            ratio = jct["dl2"] / jct[base]
            verdict = "meets" if ratio <= target else "misses"
            print(f"{'':<8} {'':>5} dl2 / {base:<15} {ratio:.3f}  (target <= {target:.2f}: {verdict})")
        print(f"{'':<8} {'':>5} Fig.10-style: SL only / DRF {jct['dl2 (SL only)'] / jct['drf']:.3f}, "
              f"SL+RL / DRF {jct['dl2'] / jct['drf']:.3f}")


def ablation(model: Path, seeds: list[int]) -> None:
    sc = SCENARIOS["small"]
    learned = {"dl2": DL2Policy.load(str(model))}
    print(f"ablation: {sc.name} ({sc.nodes} nodes), avg JCT (h) over {len(seeds)} unseen trace(s)")
    print(f"{'interference':<12} {'placement':<13} {'drf':>6} {'oracle':>7} {'dl2':>6} {'dl2/drf':>8} {'oracle/drf':>10}")
    for interference in (True, False):
        for placement in ("load-balance", "bin-pack"):
            res = mean_summaries(sc, seeds, learned, ("drf", "optimus-oracle"), placement, interference=interference)
            drf, oracle, dl2 = (res[n]["avg_jct_s"] for n in ("drf", "optimus-oracle", "dl2"))
            print(f"{'on' if interference else 'off':<12} {placement:<13} {drf / 3600:>6.2f} {oracle / 3600:>7.2f} "
                  f"{dl2 / 3600:>6.2f} {dl2 / drf:>8.3f} {oracle / drf:>10.3f}")


def holdout(model: Path, holdout_model: Path, held: tuple[str, ...], seeds: list[int]) -> None:
    learned = {"all eight": DL2Policy.load(str(model)), "held out": DL2Policy.load(str(holdout_model))}
    print(f"generalisation: {holdout_model} was trained without {', '.join(held)}; {model} on all eight")
    print(f"{'traces':<14} {'scenario':<8} {'nodes':>5} {'all8/drf':>9} {'held/drf':>9} {'held/all8':>10}")
    for label, models in (("all models", None), ("held-out only", held)):
        for sc in SCENARIOS.values():
            res = mean_summaries(sc, seeds, learned, ("drf",), models=models)
            drf, full, part = (res[n]["avg_jct_s"] for n in ("drf", "all eight", "held out"))
            print(f"{label:<14} {sc.name:<8} {sc.nodes:>5} {full / drf:>9.3f} {part / drf:>9.3f} {part / full:>10.3f}"
                  f"   (targets: held/all8 <= 1.05, held/drf <= 0.80)")


def speed(model_path: Path) -> None:
    model = load_model(model_path, "dl2", "allocation")
    window = int(model.card.encoder_params["window"])
    # `window` jobs arriving together on the 60-node cluster: the first round sees all of them.
    sc = SCENARIOS["medium"]
    trace = generators.generate(jobs=window, rate=10 * window, seed=next(iter(BENCHMARK_SEEDS)))
    sim = Simulator(trace, sc.config())
    lb = registry.make_placement("load-balance")
    snap = sim.snapshot()
    jobs = windows(snap.jobs, window)[0]
    state = WindowState(snap, Ledger(snap, lb), jobs, window)
    mask = state.mask()
    x, m = state.vector[None, :], mask[None, :]
    feeds = {"state": x, "mask": m.astype(np.float32)}
    for _ in range(200):
        model.run(feeds)
    per_call = []
    for _ in range(2000):
        t = time.perf_counter()
        model.run(feeds)
        per_call.append(time.perf_counter() - t)
    policy, drf = DL2Policy.load(str(model_path)), registry.make_allocation("drf")
    rounds, drf_rounds, decisions = [], [], 0
    for _ in range(50):  # interleaved with DRF's round on the same snapshot: a same-process yardstick
        t = time.perf_counter()
        d = run_round(snap, policy, lb)
        rounds.append(time.perf_counter() - t)
        decisions = d.inferences
        t = time.perf_counter()
        run_round(snap, drf, lb)
        drf_rounds.append(time.perf_counter() - t)
    inf_us = statistics.median(per_call) * 1e6
    round_ms = statistics.median(rounds) * 1e3
    print(f"speed: {len(snap.jobs)} active jobs, J = {window}, onnxruntime 1 thread")
    print(f"  one inference      median {inf_us:7.1f} µs   target 50 µs   ratio {inf_us / 50:.2f}x")
    print(f"  one round (40 jobs) median {round_ms:7.2f} ms   target 10 ms   ratio {round_ms / 10:.2f}x "
          f"({decisions} grants)")
    drf_ms = statistics.median(drf_rounds) * 1e3
    print(f"  DRF's round, same jobs median {drf_ms:7.2f} ms   dl2 / DRF {round_ms / drf_ms:.2f}x "
          "(a yardstick measured in this process: this machine's speed varies between processes)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=BENCHMARK_SEEDS.start,
                        help="trace seeds first-seed .. first-seed+seeds-1 (default: the benchmark seeds; "
                             "training uses 1000+ and validation 50000+, so keep clear of those)")
    parser.add_argument("--skip-quality", action="store_true")
    parser.add_argument("--ablation", action="store_true", help="also the 13-node interference/placement ablation")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--holdout-model", type=Path, help="a model trained with --holdout-models")
    parser.add_argument("--holdout-models", nargs="+", default=["vgg-16", "dssm"])
    args = parser.parse_args()
    model = args.model or default_model_path("dl2")
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    if seeds[0] < BENCHMARK_SEEDS.start:
        parser.error(f"seeds below {BENCHMARK_SEEDS.start} may overlap training (1000+) or validation (50000+) traces")
    if not args.skip_speed:
        speed(model)
    if not args.skip_quality:
        quality(model, seeds)
    if args.ablation:
        ablation(model, seeds)
    if args.holdout_model:
        holdout(model, args.holdout_model, tuple(args.holdout_models), seeds)


if __name__ == "__main__":
    main()

"""Chic and Chic-Pair against Optimus, DRF and the ideal bound, as ratios measured in one run.

1. The paper's setting (sim/chic_scenario.py): at each load 0.9..2.7 jobs/h, the average JCT
   over unseen arrival sequences (CHIC_TEST_SEEDS, disjoint from training and validation) of
   chic and chic-pair (event-driven rounds, their I-job window), optimus (as deployed: speeds
   fitted from what jobs showed), optimus-oracle (true speeds) and drf (rounds every 600 s),
   and the ideal bound (every job alone on the empty cluster at its best configuration).
   Targets (the issue): chic <= 0.87 x optimus, chic-pair <= 0.90 x optimus at every load.
   The pair bound (`pair-ideal`: every job alone at its best allocation with as many PS as
   workers, all a pair policy can reach) says how low Chic-Pair could go at all.
   A diagnostic row, optimus on Chic's event-driven rounds, separates what rescheduling on
   events brings from what the learned allocation brings.
2. The DL² scenarios (sim/scenarios.py at BENCHMARK_SEEDS): chic and chic-pair next to dl2,
   drf and optimus, each in the scenario's own slotted setting.
3. Training wall time of each shipped model, from its card.

    python bench/bench_chic.py [--sequences 30] [--dl2-seeds 2] [--skip-dl2] [--skip-paper] [--dl2-model M.onnx] [--window-sweep 10]
                               [--chic-model M.onnx] [--chic-pair-model M.onnx]

The shipped 5-job-window model: --chic-model policy_models/artifacts/chic/chic-window5.onnx.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from mlsched.features.card import ModelCard, card_path  # noqa: E402
from mlsched.policies import registry  # noqa: E402
from mlsched.policies.onnx_runner import default_model_path  # noqa: E402
from mlsched.sim import chic_scenario  # noqa: E402
from mlsched.sim.scenarios import BENCHMARK_SEEDS, SCENARIOS  # noqa: E402
from mlsched.sim.simulator import Simulator  # noqa: E402

TARGETS = {"chic": 0.87, "chic-pair": 0.90}
LEARNED = ("chic", "chic-pair")
HEURISTICS = ("optimus", "optimus-oracle", "drf")


def learned_policies(models: dict[str, str | None]) -> dict:
    """chic and chic-pair, each from its shipped model or the file `models` names (its window
    I comes from the model's card)."""
    return {name: registry.make_allocation(name, registry.PolicyContext(model_path=models.get(name)))
            for name in LEARNED}


def paper_setting(seeds: list[int], models: dict[str, str | None]) -> None:
    learned = learned_policies(models)
    lb = registry.make_placement("load-balance")
    print(f"paper setting: 1 pool (120 CPU, 10 GPU, 600 GB), {chic_scenario.JOBS_PER_SEQUENCE} jobs per sequence, "
          f"avg JCT in hours over {len(seeds)} unseen sequences (seeds {seeds[0]}-{seeds[-1]}) per load; windows "
          + ", ".join(f"{n} I={p.jobs}" for n, p in learned.items()))
    cols = ("ideal", "pair-ideal") + LEARNED + HEURISTICS + ("optimus-events",)
    print(f"{'jobs/h':>6} " + " ".join(f"{c:>14}" for c in cols)
          + "   chic/opt  pair/opt  chic/oracle  chic/ideal  pair-ideal/opt")
    misses = []
    for rate in chic_scenario.RATES_PER_HOUR:
        jct: dict[str, list[float]] = {c: [] for c in cols}
        for seed in seeds:
            trace = chic_scenario.trace(rate, seed)
            for name, policy in learned.items():
                window = policy.jobs
                result = Simulator(trace, chic_scenario.config(seed, window=window)).run(policy, lb)
                jct[name].append(result.summary()["avg_jct_s"])
            sim = Simulator(trace, chic_scenario.config(seed, event_driven=False))
            ctx = registry.PolicyContext(speed_model=sim.speed)
            for name in HEURISTICS:
                sim.reset()
                summary = sim.run(registry.make_allocation(name, ctx), lb).summary()
                jct[name].append(summary["avg_jct_s"])
            jct["ideal"].append(summary["ideal_avg_jct_s"])
            jct["pair-ideal"].append(float(np.mean([sim.ideal_time(job, pairs=True) for job in trace])))
            events = Simulator(trace, chic_scenario.config(seed, arrival_trigger_below=None))
            jct["optimus-events"].append(events.run(registry.make_allocation("optimus"), lb).summary()["avg_jct_s"])
        mean = {c: float(np.mean(v)) for c, v in jct.items()}
        ratios = {n: mean[n] / mean["optimus"] for n in LEARNED}
        for n, target in TARGETS.items():
            if ratios[n] > target:
                misses.append(f"{n} at {rate:g}/h: {ratios[n]:.3f} > {target}")
        print(f"{rate:>6.2f} " + " ".join(f"{mean[c] / 3600:>14.3f}" for c in cols)
              + f"   {ratios['chic']:>8.3f}  {ratios['chic-pair']:>8.3f}  {mean['chic'] / mean['optimus-oracle']:>11.3f}"
              f"  {mean['chic'] / mean['ideal']:>10.3f}  {mean['pair-ideal'] / mean['optimus']:>14.3f}")
    print("targets: chic <= 0.87 x optimus, chic-pair <= 0.90 x optimus at every load: "
          + ("met" if not misses else "MISSED (" + "; ".join(misses) + ")"))


def window_sweep(seeds: list[int], windows=(3, 5, 10)) -> None:
    """How much the I-job window costs: the gain heuristic in Chic's loop (GainActor, the
    trainer's warm-start teacher) at several windows I, against optimus."""
    from mlsched.policies.allocation.chic import ChicPolicy, GainActor

    lb = registry.make_placement("load-balance")
    print(f"\nwindow sweep: avg JCT in hours of the gain heuristic in Chic's loop (event-driven) at window I, "
          f"{len(seeds)} test sequences per load")
    print(f"{'jobs/h':>6} {'optimus':>8} " + " ".join(f"{'I=' + str(i):>8}" for i in windows)
          + "  " + " ".join(f"{'I=' + str(i) + '/opt':>9}" for i in windows))
    for rate in chic_scenario.RATES_PER_HOUR:
        jct: dict[str, list[float]] = {}
        for seed in seeds:
            trace = chic_scenario.trace(rate, seed)
            for i in windows:
                sim = Simulator(trace, chic_scenario.config(seed, window=i))
                jct.setdefault(f"I={i}", []).append(sim.run(ChicPolicy(GainActor(), jobs=i), lb).summary()["avg_jct_s"])
            sim = Simulator(trace, chic_scenario.config(seed, event_driven=False))
            jct.setdefault("optimus", []).append(sim.run(registry.make_allocation("optimus"), lb).summary()["avg_jct_s"])
        m = {k: float(np.mean(v)) for k, v in jct.items()}
        print(f"{rate:>6.2f} {m['optimus'] / 3600:>8.3f} " + " ".join(f"{m[f'I={i}'] / 3600:>8.3f}" for i in windows)
              + "  " + " ".join(f"{m[f'I={i}'] / m['optimus']:>9.3f}" for i in windows))


def dl2_scenarios(seeds: list[int], dl2_model: str | None, models: dict[str, str | None]) -> None:
    learned = learned_policies(models)
    learned["dl2"] = registry.make_allocation("dl2", registry.PolicyContext(model_path=dl2_model))
    lb = registry.make_placement("load-balance")
    print(f"\nDL² scenarios: avg JCT in hours over {len(seeds)} benchmark trace(s) (seeds {seeds[0]}-{seeds[-1]}), "
          "every policy in the scenario's slotted setting (1200 s rounds)")
    names = LEARNED + ("dl2", "drf", "optimus")
    print(f"{'scenario':<8} {'nodes':>5} " + " ".join(f"{n:>10}" for n in names) + "   chic/drf  chic/dl2  chic/opt")
    for sc in SCENARIOS.values():
        jct: dict[str, list[float]] = {n: [] for n in names}
        for seed in seeds:
            sim = Simulator(sc.trace(seed), sc.config(seed))
            policies = learned | {n: registry.make_allocation(n) for n in ("drf", "optimus")}
            for name in names:
                sim.reset()
                jct[name].append(sim.run(policies[name], lb).summary()["avg_jct_s"])
        m = {n: float(np.mean(v)) for n, v in jct.items()}
        print(f"{sc.name:<8} {sc.nodes:>5} " + " ".join(f"{m[n] / 3600:>10.2f}" for n in names)
              + f"   {m['chic'] / m['drf']:>8.2f}  {m['chic'] / m['dl2']:>8.2f}  {m['chic'] / m['optimus']:>8.2f}")


def training_times(models: dict[str, str | None]) -> None:
    print("\ntraining wall time (from the models' cards):")
    for name in LEARNED:
        card = ModelCard.read(card_path(Path(models.get(name) or default_model_path(name))))
        t = card.training
        print(f"  {name:<10} {t['wall_time_s'] / 60:.1f} min, {t['iterations']} CEM iterations "
              f"(best at {t['best_iteration']}), {t['machine']}; validation {card.validation['ratio_to_optimus']:.3f} x optimus")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequences", type=int, default=30, help="test sequences per load (the paper: 30)")
    parser.add_argument("--dl2-seeds", type=int, default=2, help="benchmark traces per DL² scenario")
    parser.add_argument("--skip-dl2", action="store_true")
    parser.add_argument("--skip-paper", action="store_true")
    parser.add_argument("--window-sweep", type=int, default=0, metavar="N",
                        help="also sweep the window I with the gain heuristic on N test sequences per load")
    parser.add_argument("--dl2-model", help="DL² model for the comparison (default: the shipped one)")
    parser.add_argument("--chic-model", help="Chic model (default: the shipped one; e.g. one trained with "
                                             "`mlsched train chic --jobs 10`)")
    parser.add_argument("--chic-pair-model", help="Chic-Pair model (default: the shipped one)")
    args = parser.parse_args()
    models = {"chic": args.chic_model, "chic-pair": args.chic_pair_model}
    t0 = time.time()
    if not args.skip_paper:
        paper_setting(list(chic_scenario.CHIC_TEST_SEEDS)[: args.sequences], models)
    if args.window_sweep:
        window_sweep(list(chic_scenario.CHIC_TEST_SEEDS)[: args.window_sweep])
    if not args.skip_dl2:
        dl2_scenarios(list(BENCHMARK_SEEDS)[: args.dl2_seeds], args.dl2_model, models)
    training_times(models)
    print(f"\nbenchmark wall time {(time.time() - t0) / 60:.1f} min")


if __name__ == "__main__":
    main()

"""The retraining loop on simulated clusters (issue 17, docs/retraining.md), ratios in one run.

A "cluster" is the simulator, optionally with per-model speeds perturbed ±30 %
(policy_models/retrain/history.py); its interval records are what the operator would write.
Truth is measured on the DL² benchmark traces (13 nodes, seeds 100000+, never used by
training, validation, recorded histories or retraining's own evaluation) in that cluster.

1. From the SL-only DL² model: record a history with it (ε = 0.1), `mlsched retrain`
   (`--mode simulator`, the default, or `imitate`; and off-policy on the same records), promote if better by the
   margin; repeat for --rounds rounds, each on the new intervals only. Prints the promoted
   model's avg JCT against the SL-only model's, per round.
2. ±30 % per-model perturbation: a history under the shipped model; calibration error per
   model; retrain from the shipped model; retrained (and promoted) vs shipped in that cluster.
3. Wall time of a retraining run (calibration, off-policy fine-tuning, evaluation) on a
   1,000-interval history.
4. Harmony placement (`mlsched retrain harmony`): users fix the counts (placement traces,
   `--harmony-nodes` nodes), the shipped harmony.onnx places (ε = 0.1, decisions recorded),
   models ±30 % off; a history under it, then an off-policy run (judged only) and a
   simulator-mode run from it; each candidate vs shipped in that cluster on
   bench_placement.py's unseen traces (seeds 700000+).
5. What knowing the cluster exactly is worth to the shipped policies (an upper bound on any
   calibration's gain): DL² with each job's prior speed the true one instead of the
   catalog's; LIF-line placement knowing the true interference sensitivities.

With --sensitivity-perturbation X, parts 2 and 4's cluster also differs in interference: each
model's sensitivity to its neighbours × a factor log-uniform in [1/(1+X), 1+X]; they print the
calibration's sensitivities against the truth, and how well the catalog, the speed-only and the
full calibration predict the epochs of the intervals recorded next.

    python bench/bench_retrain.py [--rounds 2] [--intervals 150] [--budget-min 3] [--parts 1 2 3 4 5]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from mlsched.policies import registry  # noqa: E402
from mlsched.policies.allocation.dl2 import DL2Policy  # noqa: E402
from mlsched.sim.scenarios import BENCHMARK_SEEDS, SCENARIOS  # noqa: E402
from mlsched.sim.simulator import Simulator  # noqa: E402
from mlsched.formats import model_versions  # noqa: E402
from policy_models.retrain import calibration, cli, history, publish  # noqa: E402

SL = "policy_models/artifacts/dl2/dl2-sl.onnx"
SHIPPED = "policy_models/artifacts/dl2/dl2.onnx"


def truth_jct(model: str, factors: dict | None, seeds, sensitivity: dict | None = None) -> float:
    """Mean avg JCT on the benchmark's small-scenario traces in the (perturbed) cluster."""
    sc, out = SCENARIOS["small"], []
    for seed in seeds:
        result = Simulator(sc.trace(seed), sc.config(seed, speed_factors=factors, sensitivity_factors=sensitivity)).run(
            DL2Policy.load(model), registry.make_placement("load-balance"))
        out.append(result.summary()["avg_jct_s"] if result.completed == result.jobs else float("inf"))
    return float(np.mean(out))


def promoted(store: Path, base: str, work: Path) -> str:
    """The newest published version's ONNX on disk (the base if none was published)."""
    cms = publish.DirStore(store, "default").configmaps()
    if not cms:
        return base
    cm = max(cms, key=lambda c: model_versions.parse(c).version)
    return str(cli._write_model(work / f"v{model_versions.parse(cm).version}", *publish.model_bytes(cm, "dl2")))


def retrain(records: Path, store: Path, out: Path | None, mode: str, budget: float, eval_traces: int,
            base: str | None = None) -> dict:
    argv = ["--records", str(records), "--mode", mode, "--time-budget-min", str(budget),
            "--eval-traces", str(eval_traces)]
    argv += ["--out", str(out)] if out else ["--store", str(store)]
    argv += ["--base-model", base] if base else []
    return cli.run(cli.parse_args(argv), log=lambda m: print("   ", m, file=sys.stderr))


def part_rounds(a, work: Path, seeds) -> None:
    print(f"\n1. from {a.start}, unperturbed cluster; {a.intervals} intervals per round, "
          f"{a.budget_min} min of training per round")
    records, store = work / "r-records", work / "r-store"
    sl_jct = truth_jct(a.start, None, seeds)
    print(f"   start: avg JCT {sl_jct / 3600:.3f} h on benchmark seeds {seeds[0]}-{seeds[-1]}")
    print(f"   {'round':>5} {'mode':<10} {'retrain eval ratio':>18} {'status':<12} {'promoted / start (truth)':>27}")
    current, first = a.start, 1
    for rnd in range(1, a.rounds + 1):
        history.write_records(history.record_history(a.intervals, model_path=current, seed=100 + rnd,
                                                     first_interval=first), records)
        first += a.intervals
        if rnd == 1 and not a.skip_offpolicy:  # off-policy on the same history, aside (publishes nothing)
            rep = retrain(records, store, work / "offpolicy-out", "offpolicy", a.budget_min, a.eval_traces, base=a.start)
            cand = truth_jct(rep["candidate"], None, seeds)
            print(f"   {rnd:>5} {'offpolicy':<10} {rep['evaluation']['ratio']:>18.4f} {'(candidate)':<12} "
                  f"{cand / sl_jct:>27.4f}")
        rep = retrain(records, store, None, a.mode, a.budget_min, a.eval_traces,
                      base=a.start if rnd == 1 else None)
        current = promoted(store, a.start, work)
        ratio = truth_jct(current, None, seeds) / sl_jct
        ev = rep.get("evaluation", {})
        print(f"   {rnd:>5} {a.mode:<10} {ev.get('ratio', float('nan')):>18.4f} {rep['status']:<12} {ratio:>27.4f}")


def cluster_sensitivity(a) -> dict | None:
    """The "cluster"'s interference sensitivity factors (--sensitivity-perturbation), or None."""
    if a.sensitivity_perturbation <= 0:
        return None
    return history.sensitivity_perturbation(a.sensitivity_perturbation, seed=a.perturbation_seed)


def report_calibration(recs, factors: dict, sensitivity: dict | None, later) -> None:
    """Calibration errors against the truth, and how well each simulator predicts the epochs of
    `later` intervals (recorded after, not fitted on)."""
    cal = calibration.calibrate(recs)
    errors = {m: cal.speed_factors.get(m, 1.0) / f - 1 for m, f in factors.items()}
    print("   speed calibration error per model: "
          + ", ".join(f"{m} {e:+.3f} (n={cal.samples[m]})" for m, e in errors.items()))
    print(f"   max |error| {max(abs(e) for e in errors.values()):.3f}; kept prior: {cal.kept_prior}")
    truth = sensitivity or {}
    print("   sensitivity: " + ", ".join(
        f"{m} {cal.sensitivity_factors[m]:.3f} (true {truth.get(m, 1.0):.3f})" if m in cal.sensitivity_factors
        else f"{m} prior (true {truth.get(m, 1.0):.3f})" for m in factors))
    held_out = calibration.samples(later)
    speed_only = calibration.calibrate(recs, fit_sensitivity=False)
    print("   epochs of the next intervals, median |predicted / observed - 1|: catalog "
          f"{calibration.prediction_error(held_out, None):.3f}, speeds calibrated "
          f"{calibration.prediction_error(held_out, speed_only):.3f}, speeds and sensitivities "
          f"{calibration.prediction_error(held_out, cal):.3f}")


def part_perturbed(a, work: Path, seeds) -> None:
    factors = history.perturbation(0.3, seed=a.perturbation_seed)
    sensitivity = cluster_sensitivity(a)
    print(f"\n2. ±30 % per-model speed perturbation (seed {a.perturbation_seed}), {a.mode} mode: "
          f"{json.dumps(factors)}" + (f"; interference sensitivity {json.dumps(sensitivity)}" if sensitivity else ""))
    records = work / "p-records"
    both = history.record_history(2 * a.intervals, model_path=SHIPPED, speed_factors=factors, seed=200,
                                  sensitivity_factors=sensitivity)
    recs = both[: a.intervals]
    history.write_records(recs, records)
    report_calibration(recs, factors, sensitivity, both[a.intervals:])
    store = work / "p-store"
    rep = retrain(records, store, None, a.mode, a.budget_min, a.eval_traces, base=SHIPPED)
    shipped_jct = truth_jct(SHIPPED, factors, seeds, sensitivity)
    cand_jct = truth_jct(rep["candidate"], factors, seeds, sensitivity)
    prom_jct = truth_jct(promoted(store, SHIPPED, work / "p"), factors, seeds, sensitivity)
    print(f"   retrain eval ratio {rep['evaluation']['ratio']:.4f} ({rep['status']}); in the perturbed cluster: "
          f"candidate / shipped {cand_jct / shipped_jct:.4f}, promoted / shipped {prom_jct / shipped_jct:.4f} "
          f"(shipped {shipped_jct / 3600:.3f} h)")


def part_wall_time(a, work: Path) -> None:
    print(f"\n3. wall time for a {a.wall_intervals}-interval history (torch threads: 1)")
    records = work / "w-records"
    t0 = time.time()
    history.write_records(history.record_history(a.wall_intervals, model_path=SHIPPED, seed=300), records)
    t1 = time.time()
    rep = retrain(records, work / "w-store", work / "w-out", "offpolicy", 60.0, a.eval_traces, base=SHIPPED)
    t2 = time.time()
    s = rep["evaluation"]
    print(f"   recording the history (simulation): {t1 - t0:.0f} s; retrain --mode offpolicy end to end "
          f"(read, calibrate, {json.load(open(work / 'w-out' / 'candidate' / 'dl2.card.json'))['training']['summary']['steps']} "
          f"steps x 4 epochs, {s['traces']} evaluation traces x 2 models): {t2 - t1:.0f} s")
    print("   simulator mode runs for its --time-budget-min, plus the same reading, calibration and evaluation")


HARMONY = "policy_models/artifacts/harmony/harmony.onnx"


def placement_truth(model: str, factors: dict, nodes: int, seeds, sensitivity: dict | None = None) -> float:
    """Mean avg JCT of a Harmony model beside `fixed` on bench_placement.py's traces."""
    from mlsched.sim.scenarios import placement_trace
    from mlsched.sim.simulator import SimConfig
    from policy_models.retrain.harmony import jct_with

    run = jct_with("fixed")
    return float(np.mean([run(model, placement_trace(nodes, s), SimConfig(nodes=nodes, seed=s, speed_factors=factors,
                                                                           sensitivity_factors=sensitivity))
                          for s in seeds]))


def part_harmony(a, work: Path) -> None:
    from policy_models.retrain import harmony

    factors = history.perturbation(0.3, seed=a.perturbation_seed)
    sensitivity = cluster_sensitivity(a)
    n = a.harmony_nodes
    print(f"\n4. Harmony placement, fixed counts, {n} nodes, ±30 % perturbation (seed {a.perturbation_seed}); "
          f"{a.intervals} intervals recorded under the shipped model, {a.budget_min} min of training"
          + (f"; interference sensitivity {json.dumps(sensitivity)}" if sensitivity else ""))
    records, store = work / "h-records", work / "h-store"
    both = history.record_history(2 * a.intervals, policy="fixed", nodes=n, speed_factors=factors, seed=400,
                                  placement="harmony", sensitivity_factors=sensitivity)
    recs = both[: a.intervals]
    history.write_records(recs, records)
    report_calibration(recs, factors, sensitivity, both[a.intervals:])
    argv = ["--records", str(records), "--store", str(store), "--time-budget-min", str(a.budget_min),
            "--eval-traces", str(a.eval_traces)]
    seeds = range(700000, 700000 + a.seeds)
    shipped = placement_truth(HARMONY, factors, n, seeds, sensitivity)
    # The off-policy learner on the same records, aside (its candidate is judged, not published).
    off = ["--records", str(records), "--out", str(work / "h-offpolicy"), "--mode", "offpolicy",
           "--time-budget-min", str(a.budget_min), "--eval-traces", str(a.eval_traces)]
    rep = harmony.run(harmony.parse_args(off), log=lambda m: print("   ", m, file=sys.stderr))
    cand = placement_truth(rep["candidate"], factors, n, seeds, sensitivity)
    print(f"   offpolicy: retrain eval ratio {rep['evaluation']['ratio']:.4f} ({rep['status']}); "
          f"candidate / shipped in the perturbed cluster {cand / shipped:.4f}; "
          f"{rep['evaluation'].get('intervals')} intervals, wall {rep['wall_s']} s")
    rep = harmony.run(harmony.parse_args(argv), log=lambda m: print("   ", m, file=sys.stderr))
    cand = placement_truth(rep["candidate"], factors, n, seeds, sensitivity)
    print(f"   simulator: retrain eval ratio {rep['evaluation']['ratio']:.4f} ({rep['status']}; "
          f"allocation {rep['evaluation']['allocation']}); in the perturbed cluster on "
          f"{len(seeds)} unseen traces: candidate / shipped {cand / shipped:.4f} (shipped {shipped / 3600:.3f} h); "
          f"training {rep['evaluation'].get('intervals')} intervals, wall {rep['wall_s']} s")


def part_truth_worth(a, seeds) -> None:
    """What knowing the cluster exactly would buy the shipped policies: an upper bound on what
    any calibration can give them."""
    from mlsched.cluster import types
    from mlsched.policies.placement.interference_aware import LeastInterferenceFirst
    from mlsched.policies.placement.sticky import Sticky
    from mlsched.sim.scenarios import placement_trace
    from mlsched.sim.simulator import SimConfig

    print("\n5. what the truth is worth: the shipped DL² in ±30 % speed-perturbed clusters with each job's "
          "prior speed from the catalog vs from the true (perturbed) speeds; Harmony placement in clusters "
          "whose interference sensitivities also differ (log-uniform, up to 2x), against LIF-line with the "
          "table's and with the true sensitivities")
    prior_curve = types.prior_curve
    for pseed in (a.perturbation_seed, a.perturbation_seed + 1, a.perturbation_seed + 2):
        factors = history.perturbation(0.3, seed=pseed)
        catalog_prior = truth_jct(SHIPPED, factors, seeds)
        # JobView's default prior (cluster/types.py), scaled by the true factor, for this measurement only.
        types.prior_curve = lambda m, arch, declared=None: prior_curve(m, arch, declared).scaled(factors.get(m, 1.0))
        try:
            true_prior = truth_jct(SHIPPED, factors, seeds)
        finally:
            types.prior_curve = prior_curve
        print(f"   perturbation seed {pseed}: DL² with the true speeds as its prior / with the catalog's: "
              f"{true_prior / catalog_prior:.4f} ({catalog_prior / 3600:.3f} h)")
    n = a.harmony_nodes
    for pseed in (a.perturbation_seed, a.perturbation_seed + 1):
        factors = history.perturbation(0.3, seed=pseed)
        sensitivity = history.sensitivity_perturbation(1.0, seed=pseed)
        harmony_jct = placement_truth(HARMONY, factors, n, range(700000, 700000 + a.seeds), sensitivity)

        def lif(known: dict | None) -> float:
            out = []
            for s in range(700000, 700000 + a.seeds):
                sim = Simulator(placement_trace(n, s), SimConfig(nodes=n, seed=s, speed_factors=factors,
                                                                 sensitivity_factors=sensitivity))
                result = sim.run(registry.make_allocation("fixed"), Sticky(LeastInterferenceFirst(1, known)))
                out.append(result.summary()["avg_jct_s"])
            return float(np.mean(out))
        print(f"   perturbation seed {pseed}, {n} nodes: x shipped Harmony ({harmony_jct / 3600:.3f} h): "
              f"LIF-line {lif(None) / harmony_jct:.4f}, LIF-line knowing the true sensitivities "
              f"{lif(sensitivity) / harmony_jct:.4f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--mode", default="simulator", choices=("simulator", "imitate"),
                   help="the retraining mode of parts 1 and 2 (docs/retraining.md)")
    p.add_argument("--skip-offpolicy", action="store_true", help="part 1: no off-policy candidate")
    p.add_argument("--start", default=SL, help="part 1's starting model (default: the shipped "
                   "SL-only model, which imitates a privileged oracle; the paper's SL-only model "
                   "imitates DRF: `mlsched train dl2 --teacher drf --dagger-rounds 0`)")
    p.add_argument("--intervals", type=int, default=150, help="recorded intervals per round")
    p.add_argument("--budget-min", type=float, default=3.0, help="training time per retraining run")
    p.add_argument("--eval-traces", type=int, default=4)
    p.add_argument("--seeds", type=int, default=5, help="benchmark traces for the truth")
    p.add_argument("--perturbation-seed", type=int, default=7)
    p.add_argument("--sensitivity-perturbation", type=float, default=0.0,
                   help="parts 2 and 4: the cluster's interference sensitivity per model also differs, "
                        "log-uniform in [1/(1+x), 1+x] (0: the table's)")
    p.add_argument("--wall-intervals", type=int, default=1000)
    p.add_argument("--parts", nargs="+", default=["1", "2", "3", "4", "5"])
    p.add_argument("--harmony-nodes", type=int, default=13, help="part 4's cluster")
    a = p.parse_args()
    torch.set_num_threads(1)
    seeds = list(BENCHMARK_SEEDS)[: a.seeds]
    work = Path(tempfile.mkdtemp(prefix="bench-retrain-"))
    t0 = time.time()
    if "1" in a.parts:
        part_rounds(a, work, seeds)
    if "2" in a.parts:
        part_perturbed(a, work, seeds)
    if "3" in a.parts:
        part_wall_time(a, work)
    if "4" in a.parts:
        part_harmony(a, work)
    if "5" in a.parts:
        part_truth_worth(a, seeds)
    print(f"\ntotal wall time {(time.time() - t0) / 60:.1f} min; work files in {work}")


if __name__ == "__main__":
    main()

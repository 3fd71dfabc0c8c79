"""Heterogeneous GPUs (issue 54): each heterogeneity-aware heuristic against its agnostic
version, average JCT, on held-out traces of a cluster with a third of its nodes (and GPUs) of
each type (V100, P100, K80; per-model speeds from Gavel's measurements, workloads/gpu_types.py).

    drf / load-balance        vs  drf-hetero / gpu-type-aware
    optimus / load-balance    vs  optimus-hetero / gpu-type-aware

The issue's floor: hetero avg JCT <= 0.75 x the agnostic version's. The heuristics were
tuned on 12 nodes (4 per type) at seeds 54000-54002 only; the defaults here are other seeds
(540100-540104, sim/scenarios.HETERO_SEEDS) and other sizes (18 and 30 nodes). Traces: about
5 jobs per node arriving at nodes / 4 per 20-minute slot (the DL² scenarios' load), Poisson by
default (`--pattern google` for the DL² simulator's Google-trace pattern).

`--ablation` adds the agnostic allocations with the type-aware placement: how much of the gain
is the placement's (keeping a job on one type, the fastest for it) and how much the allocation's.

`--dl2` adds DL²: the typed model (its state has the GPU-type columns, trained on typed
clusters: policy_models/artifacts/dl2-hetero, or `--dl2-model`) with gpu-type-aware placement,
against its agnostic version (the shipped untyped model with load-balance, as it is served on
a cluster whose types it does not know) and against the best heuristic of the same trace
(the lowest of drf, optimus, drf-hetero and optimus-hetero, each with gpu-type-aware
placement); and the shipped untyped model with gpu-type-aware placement, to show what the
type columns add. The issue's floors: <= 0.75 x its agnostic version, <= 0.90 x the best
heuristic.

    python bench/bench_hetero.py [--per-type 6 10] [--seeds 5] [--first-seed 540100] [--pattern poisson] [--ablation] [--dl2]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from mlsched.policies import registry  # noqa: E402
from mlsched.sim.scenarios import HETERO_SEEDS, hetero_cluster, hetero_trace  # noqa: E402
from mlsched.sim.simulator import SimConfig, Simulator  # noqa: E402
from mlsched.workloads import generators, gpu_types  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

PAIRS = (("drf", "load-balance", "drf-hetero", "gpu-type-aware"),
         ("optimus", "load-balance", "optimus-hetero", "gpu-type-aware"))
FLOOR = 0.75
DL2_FLOOR = 0.90  # DL² against the best heuristic
HEURISTICS = ("drf", "optimus", "drf-hetero", "optimus-hetero")  # each with gpu-type-aware
TYPED_DL2 = REPO / "policy_models" / "artifacts" / "dl2-hetero" / "dl2-hetero.onnx"


def avg_jct_h(trace, types, seed: int, allocation: str, placement: str, model: str | None = None) -> float:
    sim = Simulator(trace, SimConfig(nodes=len(types), seed=seed, gpu_types=types))
    ctx = registry.PolicyContext(speed_model=sim.speed, model_path=model)
    result = sim.run(registry.make_allocation(allocation, ctx), registry.make_placement(placement, ctx))
    assert result.completed == result.jobs, (allocation, placement, seed)
    return result.summary()["avg_jct_s"] / 3600


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-type", type=int, nargs="+", default=[6, 10],
                        help="nodes of each GPU type (default 6 and 10: 18 and 30 nodes)")
    parser.add_argument("--seeds", type=int, default=len(HETERO_SEEDS))
    parser.add_argument("--first-seed", type=int, default=HETERO_SEEDS.start)
    parser.add_argument("--pattern", default="poisson", choices=generators.PATTERNS)
    parser.add_argument("--ablation", action="store_true",
                        help="also the agnostic allocations with gpu-type-aware placement")
    parser.add_argument("--dl2", action="store_true",
                        help="also DL²: the typed model against its agnostic version and the best heuristic")
    parser.add_argument("--dl2-model", default=str(TYPED_DL2), help="the typed DL² model (default: %(default)s)")
    parser.add_argument("--no-pairs", action="store_true", help="skip the heuristic pairs (with --dl2)")
    args = parser.parse_args()
    if args.dl2 and not Path(args.dl2_model).is_file():
        parser.error(f"--dl2-model {args.dl2_model} does not exist (mlsched train dl2 --gpu-types "
                     "v100,p100,k80 --out DIR writes one)")
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    started = time.perf_counter()
    verdicts = []
    if args.dl2:
        verdicts += dl2_rows(args, seeds)
    if not args.no_pairs:
        print(f"avg JCT (h), pattern {args.pattern}, seeds {seeds[0]}-{seeds[-1]}; "
              f"ratio = hetero-aware / agnostic (floor {FLOOR})")
        print(f"{'cluster':<22} {'seed':>7} {'drf':>7} {'drf-het':>8} {'ratio':>6} "
              f"{'optimus':>8} {'opt-het':>8} {'ratio':>6}")
    for per_type in ([] if args.no_pairs else args.per_type):
        types = hetero_cluster(per_type)
        label = gpu_types.format_cluster(types)
        ratios: dict[str, list[float]] = {p[0]: [] for p in PAIRS}
        ablation: dict[str, list[float]] = {p[0]: [] for p in PAIRS}
        cells_base: dict[str, float] = {}
        for seed in seeds:
            trace = hetero_trace(len(types), seed, args.pattern)
            cells = []
            for agnostic, a_place, hetero, h_place in PAIRS:
                base = avg_jct_h(trace, types, seed, agnostic, a_place)
                aware = avg_jct_h(trace, types, seed, hetero, h_place)
                ratios[agnostic].append(aware / base)
                cells_base[agnostic] = base
                cells.append(f"{base:>7.2f} {aware:>8.2f} {aware / base:>6.3f}")
            print(f"{label:<22} {seed:>7} " + " ".join(cells), flush=True)
            if args.ablation:
                placed = [avg_jct_h(trace, types, seed, agnostic, "gpu-type-aware")
                          for agnostic, *_ in PAIRS]
                for (agnostic, *_), jct in zip(PAIRS, placed):
                    ablation[agnostic].append(jct / float(cells_base[agnostic]))
                print(f"{'':<22} {'':>7} ablation: " + ", ".join(
                    f"{a} / gpu-type-aware {j:.2f} h ({j / cells_base[a]:.3f})"
                    for (a, *_), j in zip(PAIRS, placed)), flush=True)
        for agnostic, _, hetero, _ in PAIRS:
            r = np.array(ratios[agnostic])
            ok = bool((r <= FLOOR).all())
            verdicts.append(ok)
            print(f"  {label}: {hetero} / {agnostic}: mean {r.mean():.3f}, worst {r.max():.3f} "
                  f"({'every seed within' if ok else 'MISSES'} the {FLOOR} floor)")
            if args.ablation:
                print(f"  {label}: {agnostic} / gpu-type-aware over {agnostic}: mean "
                      f"{np.mean(ablation[agnostic]):.3f} (the placement alone)")
    print(f"wall time {time.perf_counter() - started:.0f} s; "
          f"{'all within the floor' if all(verdicts) else 'some MISS the floor'}")


def dl2_rows(args, seeds: list[int]) -> list[bool]:
    """The typed DL² against its agnostic version and the best heuristic, per trace."""
    print(f"DL²: typed model {args.dl2_model}; agnostic = the shipped untyped model with "
          f"load-balance; best heuristic = min of {', '.join(HEURISTICS)} with gpu-type-aware")
    print(f"{'cluster':<22} {'seed':>7} {'agnostic':>9} {'untyped+gta':>12} {'typed':>7} "
          f"{'best heur.':>16} {'/agnostic':>10} {'/best':>6}")
    verdicts = []
    for per_type in args.per_type:
        types = hetero_cluster(per_type)
        label = gpu_types.format_cluster(types)
        vs_agnostic, vs_best = [], []
        for seed in seeds:
            trace = hetero_trace(len(types), seed, args.pattern)
            agnostic = avg_jct_h(trace, types, seed, "dl2", "load-balance")
            untyped = avg_jct_h(trace, types, seed, "dl2", "gpu-type-aware")
            typed = avg_jct_h(trace, types, seed, "dl2", "gpu-type-aware", args.dl2_model)
            heuristics = {h: avg_jct_h(trace, types, seed, h, "gpu-type-aware") for h in HEURISTICS}
            best = min(heuristics, key=heuristics.get)
            vs_agnostic.append(typed / agnostic)
            vs_best.append(typed / heuristics[best])
            print(f"{label:<22} {seed:>7} {agnostic:>9.2f} {untyped:>12.2f} {typed:>7.2f} "
                  f"{heuristics[best]:>6.2f} {best:>9} {vs_agnostic[-1]:>10.3f} {vs_best[-1]:>6.3f}",
                  flush=True)
        for what, r, floor in (("its agnostic version", vs_agnostic, FLOOR),
                               ("the best heuristic", vs_best, DL2_FLOOR)):
            ok = max(r) <= floor
            verdicts.append(ok)
            print(f"  {label}: typed DL² / {what}: mean {np.mean(r):.3f}, worst {max(r):.3f} "
                  f"({'every seed within' if ok else 'MISSES'} the {floor} floor)")
    return verdicts


if __name__ == "__main__":
    main()

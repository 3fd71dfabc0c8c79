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

    python bench/bench_hetero.py [--per-type 6 10] [--seeds 5] [--first-seed 540100] [--pattern poisson] [--ablation]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from mlsched.policies import registry  # noqa: E402
from mlsched.sim.scenarios import HETERO_SEEDS, hetero_cluster, hetero_trace  # noqa: E402
from mlsched.sim.simulator import SimConfig, Simulator  # noqa: E402
from mlsched.workloads import generators, gpu_types  # noqa: E402

PAIRS = (("drf", "load-balance", "drf-hetero", "gpu-type-aware"),
         ("optimus", "load-balance", "optimus-hetero", "gpu-type-aware"))
FLOOR = 0.75


def avg_jct_h(trace, types, seed: int, allocation: str, placement: str) -> float:
    sim = Simulator(trace, SimConfig(nodes=len(types), seed=seed, gpu_types=types))
    ctx = registry.PolicyContext(speed_model=sim.speed)
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
    args = parser.parse_args()
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    started = time.perf_counter()
    print(f"avg JCT (h), pattern {args.pattern}, seeds {seeds[0]}-{seeds[-1]}; "
          f"ratio = hetero-aware / agnostic (floor {FLOOR})")
    print(f"{'cluster':<22} {'seed':>7} {'drf':>7} {'drf-het':>8} {'ratio':>6} "
          f"{'optimus':>8} {'opt-het':>8} {'ratio':>6}")
    verdicts = []
    for per_type in args.per_type:
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


if __name__ == "__main__":
    main()

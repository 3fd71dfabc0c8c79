"""What the cycle guard (policies/cycle_guard.py) costs a learned policy's JCT, in one run.

On the benchmark's held-out traces (workloads BENCHMARK_SEEDS, never used in training) at 13,
60 and 500 nodes, each learned allocation runs twice, through the guard (SimConfig.cycle_guard,
the default, as the operator serves it) and without it (as the simulator ran before the
guard), beside DRF and Optimus-oracle on the same traces. Prints each one's average JCT, the
ratio guarded / unguarded, the ratios to DRF and the oracle both ways, how many job-rounds the
guard kept, and the geometric mean over the sizes. The guard must not make JCT worse.

    python bench/bench_cycle_guard.py [--seeds 3] [--allocations dl2 chic]
"""

from __future__ import annotations

import argparse
import math
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from mlsched.policies import registry  # noqa: E402
from mlsched.sim.scenarios import BENCHMARK_SEEDS, SCENARIOS  # noqa: E402
from mlsched.sim.simulator import Simulator  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="held-out traces per size")
    parser.add_argument("--allocations", nargs="+", default=["dl2"])
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS))
    args = parser.parse_args()
    seeds = list(BENCHMARK_SEEDS)[:args.seeds]
    lb = registry.make_placement("load-balance")
    learned = {name: registry.make_allocation(name) for name in args.allocations}
    print(f"avg JCT (h) over held-out traces {seeds[0]}-{seeds[-1]}, load-balance placement; "
          f"'+guard' as served, '-guard' without the cycle guard")
    ratios: dict[str, list[float]] = {}
    for sc in (SCENARIOS[s] for s in args.scenarios):
        jct: dict[str, list[float]] = {}
        kept: dict[str, int] = {}
        for seed in seeds:
            trace = sc.trace(seed)
            runs = [("drf", "drf", True), ("optimus-oracle", "optimus-oracle", True)]
            runs += [(f"{n} {'+' if g else '-'}guard", n, g) for n in learned for g in (True, False)]
            for label, name, guarded in runs:
                sim = Simulator(trace, sc.config(seed, cycle_guard=guarded))
                policy = learned.get(name) or registry.make_allocation(
                    name, registry.PolicyContext(speed_model=sim.speed))
                jct.setdefault(label, []).append(sim.run(policy, lb).summary()["avg_jct_s"])
                if sim.cycle_guard is not None:
                    kept[label] = kept.get(label, 0) + sim.cycle_guard.kept_total
        mean = {label: float(np.mean(v)) for label, v in jct.items()}
        print(f"{sc.name} ({sc.nodes} nodes): " + ", ".join(
            f"{label} {v / 3600:.3f}" for label, v in mean.items()))
        for name in learned:
            on, off = mean[f"{name} +guard"], mean[f"{name} -guard"]
            ratios.setdefault(f"{name} +guard / -guard", []).append(on / off)
            for base in ("drf", "optimus-oracle"):
                ratios.setdefault(f"{name} / {base} +guard", []).append(on / mean[base])
                ratios.setdefault(f"{name} / {base} -guard", []).append(off / mean[base])
            print(f"  {name}: +guard / -guard {on / off:.4f}; / drf {on / mean['drf']:.4f} "
                  f"(without {off / mean['drf']:.4f}); / optimus-oracle "
                  f"{on / mean['optimus-oracle']:.4f} (without {off / mean['optimus-oracle']:.4f}); "
                  f"guard kept {kept.get(f'{name} +guard', 0)} job-rounds over {len(seeds)} traces")
    print("geometric mean over sizes:")
    for key, values in ratios.items():
        print(f"  {key:32} {math.exp(np.mean(np.log(values))):.4f}")


if __name__ == "__main__":
    main()

"""Placement heuristics against each other on mixed parameter-server / all-reduce traces with
fixed task counts (issue 15's setting: the user fixes workers and PS, the policy decides only
where each task runs), at 6, 30 and 100 nodes; then with DL² deciding the counts.

Traces: the DL² generator (Poisson arrivals per 1200 s slot, log-normal lengths, all eight
models), 30 % all-reduce jobs, `nodes / 2` arrivals per slot on average and `4 x nodes` jobs;
each job asks for 1-4 workers and, for parameter-server jobs, 1-2 PS (uniform, from the
trace seed). Nodes: the DL² simulator's (8 CPUs, 2 GPUs, 48 GiB), interference on (sim-2).
Average JCT per placement, averaged over the seeds, and its ratio to the best placement in
the same run (1.000 is the best; issue 15 asks a learned Harmony placement for <= 0.80).

    python bench/bench_placement.py [--seeds 3] [--nodes 6 30 100] [--skip-dl2]
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from mlsched.policies import registry  # noqa: E402
from mlsched.sim.simulator import SimConfig, Simulator  # noqa: E402
from mlsched.workloads import generators  # noqa: E402

PLACEMENTS = ("load-balance", "bin-pack", "tetris", "lif-line", "lif-quad", "tiresias")
SEED0 = 700000  # disjoint from every training seed (docs/dl2.md, docs/chic.md)


def trace(nodes: int, seed: int):
    jobs = generators.generate(jobs=4 * nodes, rate=nodes / 2, seed=seed, arch_mix=0.3)
    rng = np.random.default_rng(seed + 1)
    return [replace(j, workers=int(rng.integers(1, 5)),
                    ps=int(rng.integers(1, 3)) if j.arch == "ps" else None) for j in jobs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--nodes", type=int, nargs="+", default=[6, 30, 100])
    parser.add_argument("--skip-dl2", action="store_true")
    args = parser.parse_args()
    allocations = ["fixed"] + ([] if args.skip_dl2 else ["dl2"])
    seeds = range(SEED0, SEED0 + args.seeds)
    print(f"avg JCT (h) over {args.seeds} traces (seeds {seeds[0]}-{seeds[-1]}); "
          f"ratio to the best placement of the row")
    print(f"{'alloc':<6} {'nodes':>5} " + " ".join(f"{p:>12}" for p in PLACEMENTS))
    for allocation in allocations:
        for nodes in args.nodes:
            jct = {p: [] for p in PLACEMENTS}
            spent = {p: 0.0 for p in PLACEMENTS}
            for seed in seeds:
                sim = Simulator(trace(nodes, seed), SimConfig(nodes=nodes, seed=seed))
                ctx = registry.PolicyContext(speed_model=sim.speed)
                for p in PLACEMENTS:
                    sim.reset()
                    t0 = time.perf_counter()
                    result = sim.run(registry.make_allocation(allocation, ctx), registry.make_placement(p))
                    spent[p] += time.perf_counter() - t0
                    summary = result.summary()
                    if summary["completed"] != summary["jobs"]:
                        raise SystemExit(f"{allocation}/{p} at {nodes} nodes, seed {seed}: only "
                                         f"{summary['completed']} of {summary['jobs']} jobs finished")
                    jct[p].append(summary["avg_jct_s"] / 3600)
            mean = {p: float(np.mean(v)) for p, v in jct.items()}
            best = min(mean.values())
            print(f"{allocation:<6} {nodes:>5} " + " ".join(f"{mean[p]:>6.2f} {mean[p] / best:>5.3f}" for p in PLACEMENTS))
            print(f"{'':<6} {'':>5} " + " ".join(f"{spent[p]:>11.1f}s" for p in PLACEMENTS), flush=True)


if __name__ == "__main__":
    main()

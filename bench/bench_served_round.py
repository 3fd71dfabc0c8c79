"""The served round in the simulator (SimConfig.served_round, issue 50): what deciding
heuristic rounds as the operator serves them, settled (policies/round.run_served_round),
changes against deciding each round once, as the shipped figures were measured. Per
heuristic allocation (load-balance placement), the average JCT both ways on the same
generated trace, the ratio served / once, and the CPU seconds each run took. Learned rounds
are the same both ways (never settled; both go through the cycle guard).

Traces: `mlsched trace generate`'s generator, about 3 arrivals per 13 nodes per 20-minute
slot, seeds 101-103 at 13, 60 and 30 nodes (none used in any training or tuning).

    python bench/bench_served_round.py [--sizes 13:60 60:120 30:80] [--seed0 101]
"""

from __future__ import annotations

import argparse
import math
import os
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from mlsched.policies import registry  # noqa: E402
from mlsched.sim.simulator import SimConfig, Simulator  # noqa: E402
from mlsched.workloads import generators  # noqa: E402
from mlsched.workloads.speed_models import get_speed_model  # noqa: E402

ALLOCATIONS = ("drf", "optimus", "tetris", "srtf", "fifo", "optimus-oracle")


def run(trace, nodes: int, allocation: str, served: bool) -> tuple[float, float]:
    ctx = registry.PolicyContext(speed_model=get_speed_model("measured"))
    started = time.process_time()
    result = Simulator(trace, SimConfig(nodes=nodes, seed=1, served_round=served)).run(
        registry.make_allocation(allocation, ctx), registry.make_placement("load-balance", ctx))
    return result.summary()["avg_jct_s"] / 3600, time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["13:60", "60:120", "30:80"], metavar="NODES:JOBS")
    parser.add_argument("--seed0", type=int, default=101)
    args = parser.parse_args()
    ratios = []
    print(f"{'nodes':>5} {'jobs':>4} {'allocation':15} {'once':>8} {'served':>8} {'served/once':>11} "
          f"{'cpu once':>9} {'cpu served':>10}")
    for i, size in enumerate(args.sizes):
        nodes, jobs = (int(x) for x in size.split(":"))
        trace = generators.generate(jobs=jobs, rate=3.0 * nodes / 13, seed=args.seed0 + i)
        for allocation in ALLOCATIONS:
            (once, cpu_once), (served, cpu_served) = (run(trace, nodes, allocation, s) for s in (False, True))
            ratios.append(served / once)
            print(f"{nodes:5d} {jobs:4d} {allocation:15} {once:7.3f}h {served:7.3f}h {served / once:11.3f} "
                  f"{cpu_once:8.1f}s {cpu_served:9.1f}s", flush=True)
    geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    print(f"served / once: geomean {geomean:.3f}, range {min(ratios):.3f}-{max(ratios):.3f}")


if __name__ == "__main__":
    main()

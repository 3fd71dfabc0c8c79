"""Simulator speed: the 200-job, 500-node simulation under DRF (target <= 2 s) and Optimus
(target <= 10 s) on one core. Prints wall time, scheduling decisions per second and the ratio
to each target (< 1.00 meets it). Run: `make bench` or `python bench/bench_simulator.py`."""

from __future__ import annotations

import os

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")  # one core, as the target says; set before numpy loads

import statistics  # noqa: E402
import time  # noqa: E402

from mlsched.policies import registry  # noqa: E402
from mlsched.sim.simulator import SimConfig, Simulator  # noqa: E402
from mlsched.workloads import generators  # noqa: E402

TARGETS_S = {"drf": 2.0, "optimus": 10.0, "optimus-oracle": 10.0}
REPEATS = 3


def main() -> None:
    trace = generators.generate(jobs=200, rate=10, seed=42)
    print(f"200 jobs, 500 nodes, placement load-balance, best of {REPEATS} runs")
    print(f"{'policy':<15} {'wall s':>8} {'decisions':>10} {'decisions/s':>12} {'target s':>9} {'ratio':>7}")
    for policy, target in TARGETS_S.items():
        times, decisions = [], 0
        for _ in range(REPEATS):
            start = time.perf_counter()
            sim = Simulator(trace, SimConfig(nodes=500))
            ctx = registry.PolicyContext(speed_model=sim.speed)
            result = sim.run(registry.make_allocation(policy, ctx), registry.make_placement("load-balance"))
            times.append(time.perf_counter() - start)
            decisions = result.inferences
            assert result.completed == 200
        best = min(times)
        print(f"{policy:<15} {best:>8.2f} {decisions:>10} {decisions / best:>12.0f} {target:>9.1f} "
              f"{best / target:>6.2f}x   (median {statistics.median(times):.2f} s)")


if __name__ == "__main__":
    main()

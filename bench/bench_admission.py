"""What waiting for the next slot costs: average JCT with admission at slot starts only (the
papers' rule) and with admission on arrival and completion (what the operator does), for DRF,
Optimus and DL², on the DL² benchmark traces (13, 60 and 500 nodes; seeds training never used).

The ratio arrival / interval < 1 is the share of average JCT the slot wait was costing. Both
modes run in this process on the same traces; the shipped DL² model decides in both (with
admission, it decides for the waiting jobs only, running jobs held: policies.round.run_admission).

    python bench/bench_admission.py [--seeds 5] [--model policy_models/artifacts/dl2/dl2.onnx]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from mlsched.policies import registry  # noqa: E402
from mlsched.policies.allocation.dl2 import DL2Policy  # noqa: E402
from mlsched.sim.scenarios import BENCHMARK_SEEDS, SCENARIOS  # noqa: E402
from mlsched.sim.simulator import Simulator  # noqa: E402

POLICIES = ("drf", "optimus", "dl2")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--model", default=None, help="DL² model (default: the shipped one)")
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    args = parser.parse_args()
    seeds = list(BENCHMARK_SEEDS)[: args.seeds] if args.seeds <= len(BENCHMARK_SEEDS) else \
        list(range(BENCHMARK_SEEDS.start, BENCHMARK_SEEDS.start + args.seeds))
    dl2 = DL2Policy.load(args.model)
    print(f"avg JCT (h) over {len(seeds)} unseen traces per size, seeds {seeds[0]}-{seeds[-1]}")
    print(f"{'scenario':<8} {'nodes':>5} {'policy':<8} {'interval':>9} {'arrival':>9} {'arrival/interval':>17}")
    for sc in (SCENARIOS[n] for n in args.scenarios):
        jct: dict[tuple[str, str], list[float]] = {}
        for seed in seeds:
            for mode in ("interval", "arrival"):
                sim = Simulator(sc.trace(seed), sc.config(seed, admission=mode))
                ctx = registry.PolicyContext(speed_model=sim.speed)
                for name in POLICIES:
                    policy = dl2 if name == "dl2" else registry.make_allocation(name, ctx)
                    sim.reset()
                    result = sim.run(policy, registry.make_placement("load-balance"))
                    jct.setdefault((name, mode), []).append(result.summary()["avg_jct_s"])
        for name in POLICIES:
            slotted, admitted = (float(np.mean(jct[(name, m)])) for m in ("interval", "arrival"))
            print(f"{sc.name:<8} {sc.nodes:>5} {name:<8} {slotted / 3600:>9.2f} {admitted / 3600:>9.2f} "
                  f"{admitted / slotted:>17.3f}")


if __name__ == "__main__":
    main()

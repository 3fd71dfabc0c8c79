"""The regret guard (issue 51, part 3) as ratios measured in one run.

1. A cluster unlike chic's training: generated 80-job traces (`mlsched trace generate --jobs 80
   --seed N`) on 30 nodes of 8 CPUs and 2 GPUs. Per seed, the average JCT of chic unguarded and
   of chic under `--guard 10%:6` (fallback drf), each over drf's. Target: guarded <= 1.10 x.
2. Chic's own setting (sim/chic_scenario.py: one 10-GPU pool, event-driven rounds), at every
   load 0.9..2.7 jobs/h: how many runs the guard trips in (target: none), and the guarded
   chic's average JCT over chic's.

    python bench/bench_regret_guard.py [--seeds 21,22,23,24,25] [--chic-seeds 300020,300021]

An empty list skips its part (`--chic-seeds ''`). The guard judges a rolling window at every
interval: a guarded run takes several times as long as an unguarded one.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from mlsched.policies import registry  # noqa: E402
from mlsched.policies.regret_guard import GuardSpec  # noqa: E402
from mlsched.sim import chic_scenario  # noqa: E402
from mlsched.sim.regret_guard import SimGuard  # noqa: E402
from mlsched.sim.simulator import SimConfig, Simulator  # noqa: E402
from mlsched.workloads import generators  # noqa: E402


def avg_jct(trace, config, policy: str, guard: str | None = None):
    sim = Simulator(trace, config)
    ctx = registry.PolicyContext(speed_model=sim.speed)
    g = SimGuard(GuardSpec.parse(guard), registry.make_allocation("drf", ctx)) if guard else None
    result = sim.run(registry.make_allocation(policy, ctx), registry.make_placement("load-balance"),
                     guard=g)
    return result.summary()["avg_jct_s"], g


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="21,22,23,24,25")
    p.add_argument("--chic-seeds", default="300020,300021")
    p.add_argument("--guard", default="10%:6")
    a = p.parse_args()
    print(f"1. 80 jobs on 30 nodes (8 CPU, 2 GPU), guard {a.guard}, fallback drf: avg JCT / drf's")
    print(f"{'seed':>6} {'chic':>6} {'guarded':>8} {'trip at':>8} {'|error|':>8} {'clears':>7}")
    ratios = []
    for seed in (int(s) for s in a.seeds.split(",") if s):
        trace, config = generators.generate(jobs=80, seed=seed), SimConfig(nodes=30, seed=seed)
        drf, _ = avg_jct(trace, config, "drf")
        chic, _ = avg_jct(trace, config, "chic")
        guarded, g = avg_jct(trace, config, "chic", a.guard)
        s = g.summary()
        ratios.append(guarded / drf)
        err = s["guard_mean_abs_error"]
        print(f"{seed:>6} {chic / drf:>6.2f} {guarded / drf:>8.3f} {str(s['guard_first_trip_round']):>8} "
              f"{(f'{err:.1%}' if err is not None else '-'):>8} {s['guard_clears']:>7}", flush=True)
    if ratios:
        print(f"mean guarded / drf: {sum(ratios) / len(ratios):.3f}, max {max(ratios):.3f}",
              flush=True)
    print(f"\n2. Chic's setting (one 10-GPU pool), guard {a.guard}: trips, guarded avg JCT / chic's")
    for seed in (int(s) for s in a.chic_seeds.split(",") if s):
        for rate in chic_scenario.RATES_PER_HOUR:
            trace, config = chic_scenario.trace(rate, seed), chic_scenario.config(seed)
            chic, _ = avg_jct(trace, config, "chic")
            guarded, g = avg_jct(trace, config, "chic", a.guard)
            print(f"  seed {seed} rate {rate:g}/h: {g.trips} trips in {len(g.estimates)} windows, "
                  f"{guarded / chic:.3f} x chic", flush=True)


if __name__ == "__main__":
    main()

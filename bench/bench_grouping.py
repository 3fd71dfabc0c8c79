"""Harmony co-location, as ratios measured in one run (docs/grouping.md).

1. Cluster scale: 80 PS jobs submitted at t=0 on 100 nodes (4 CPU, 1 GPU, 96 GiB: one PS and
   one worker of a job fill a node's compute, as in the paper's one server and one worker per
   machine), DRF allocation, load-balance placement. Groupings isolated, naive, harmony and
   none; ratios to isolated of compute and network utilisation (busy time, docs/grouping.md),
   mean JCT and makespan. Two job mixes: `catalog` (all eight models) and `matched` (the five
   whose iteration times lie within 3x of each other, like the paper's jobs at their DoPs).
2. The same with DL² allocation (the shipped model): what grouping adds to a learned policy.
3. Grouping time of harmony for 8,000 jobs on 10,000 nodes (median of 3).
4. Closeness to exhaustive search: random 8-job instances on 8 nodes; every partition of
   the jobs into groups (machines by the same allocation step), best predicted throughput
   against harmony's.
5. `--arrivals JOBS,NODES,RATE,SEED ...` (off by default: slow): generated traces with Poisson
   arrivals on the default node (8 CPU, 2 GPU), DRF; mean JCT x isolated of harmony alone
   and guarded, and of none, and the co-location model's error.

In every table `harmony` is its search alone (SimConfig.grouping_guard off) and `guarded` is
harmony as it runs by default, compared with isolated and none by rollouts at every arrival
(sim/grouping_guard.py).

    python bench/bench_grouping.py [--jobs 80] [--nodes 100] [--seed 1] [--skip-dl2]
    python bench/bench_grouping.py --skip-dl2 --exhaustive 0 --arrivals 20,6,3,5 30,8,2,23
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from mlsched.cluster.types import JobView, Snapshot  # noqa: E402
from mlsched.policies import registry  # noqa: E402
from mlsched.policies.grouping import algorithm, local_search  # noqa: E402
from mlsched.policies.grouping.harmony import Harmony, HarmonyConfig  # noqa: E402
from mlsched.policies.grouping.profiles import profile_table  # noqa: E402
from mlsched.sim.simulator import SimConfig, Simulator  # noqa: E402
from mlsched.workloads import catalog, generators  # noqa: E402
from mlsched.workloads.speed_models import MeasuredSpeed, epochs_per_s  # noqa: E402
from mlsched.workloads.traces import TraceJob  # noqa: E402

MIXES = {
    "catalog": catalog.MODEL_NAMES,
    "matched": ("dssm", "seq2seq", "resnext-110", "inception-bn", "wlm"),
}
GROUPINGS = ("isolated", "naive", "harmony", "none", "guarded")  # guarded: harmony, SimConfig.grouping_guard


def ps_trace(jobs: int, models, seed: int) -> list[TraceJob]:
    """All at t=0 (the paper's main experiment); length alone at 1 PS + 1 worker log-normal,
    median 80 min (the generator's), σ 0.5."""
    rng = np.random.default_rng(seed)
    speed = MeasuredSpeed()
    out = []
    for i, m in enumerate(rng.choice(list(models), jobs)):
        minutes = rng.lognormal(np.log(80.0), 0.5)
        out.append(TraceJob(f"j{i:03d}", 0.0, str(m), float(minutes * 60 * epochs_per_s(speed, str(m), "ps", 1, 1))))
    return out


def cluster(nodes: int, seed: int) -> SimConfig:
    return SimConfig(nodes=nodes, node_cpus=4, node_gpus=1, node_mem_gib=96, seed=seed)


def run(trace, config, allocation: str, grouping: str) -> dict:
    # "harmony": its search alone; "guarded": harmony as it runs by default, compared with
    # isolated and none by rollouts at every arrival (sim/grouping_guard.py)
    config = dataclasses.replace(config, grouping_guard=grouping == "guarded")
    grouping = "harmony" if grouping == "guarded" else grouping
    sim = Simulator(trace, config)
    ctx = registry.PolicyContext(speed_model=sim.speed)
    g = None if grouping == "none" else registry.make_grouping(grouping, ctx)
    r = sim.run(registry.make_allocation(allocation, ctx), registry.make_placement("load-balance"), g)
    return r.summary()


def scale_table(args, allocation: str) -> None:
    for mix, models in MIXES.items():
        trace = ps_trace(args.jobs, models, args.seed)
        rows = {g: run(trace, cluster(args.nodes, args.seed), allocation, g) for g in GROUPINGS}
        base = rows["isolated"]
        print(f"\n{allocation}, mix {mix}: {args.jobs} PS jobs at t=0 on {args.nodes} nodes "
              f"(ratios to isolated; targets for harmony: util >= 1.5, JCT <= 0.60, makespan <= 0.75)")
        print(f"{'grouping':<10} {'compute util':>13} {'net util':>9} {'mean JCT':>9} {'makespan':>9} "
              f"{'x util c':>9} {'x util n':>9} {'x JCT':>6} {'x mksp':>7} done")
        for g, r in rows.items():
            if g == "guarded":
                print(f"{g:<10} mean JCT x isolated {r['avg_jct_s'] / base['avg_jct_s']:.2f}, x none "
                      f"{r['avg_jct_s'] / rows['none']['avg_jct_s']:.2f}, x harmony "
                      f"{r['avg_jct_s'] / rows['harmony']['avg_jct_s']:.2f}; decisions won: {r['grouping_choices']}")
                continue
            print(f"{g:<10} {r['compute_util']:>13.3f} {r['net_util']:>9.3f} {r['avg_jct_s'] / 3600:>8.2f}h "
                  f"{r['makespan_s'] / 3600:>8.2f}h {r['compute_util'] / base['compute_util']:>9.2f} "
                  f"{r['net_util'] / base['net_util']:>9.2f} {r['avg_jct_s'] / base['avg_jct_s']:>6.2f} "
                  f"{r['makespan_s'] / base['makespan_s']:>7.2f} {r['completed']}/{r['jobs']}")
        h = rows["harmony"]
        print(f"harmony's co-location model vs the simulator: mean abs. relative error of predicted vs "
              f"true co-located speed {h['colocation_mare']:.1%} over {h['colocation_samples']} job-slots")


def random_jobs(count: int, rng, prefix="j") -> list[JobView]:
    models = rng.choice(list(catalog.MODEL_NAMES), count)
    return [JobView(f"{prefix}{i}", str(m), "ps", float(i), 100.0) for i, m in enumerate(models)]


def grouping_time() -> None:
    rng = np.random.default_rng(0)
    jobs = random_jobs(8000, rng)
    snap = Snapshot(0.0, 1200.0, [f"n{i}" for i in range(10000)], np.tile([4.0, 1.0, 96.0], (10000, 1)), jobs)
    times = []
    for _ in range(3):
        t = time.perf_counter()
        Harmony().group(snap)
        times.append(time.perf_counter() - t)
    print(f"\ngrouping time, 8,000 jobs on 10,000 nodes: {statistics.median(times):.2f} s median of 3 "
          f"(target <= 2 s; the paper: < 5 s)")


def partitions(items: list[int]):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in partitions(rest):
        for i in range(len(part)):
            yield part[:i] + [[first] + part[i]] + part[i + 1:]
        yield [[first]] + part


def best_split(curves: list[np.ndarray], nodes: int) -> float:
    """Σ V_g(m_g) over the best machine counts with Σ m_g <= nodes, each group >= 1 (a DP:
    the oracle is exhaustive over machine splits as well as over partitions)."""
    best = np.zeros(nodes + 1)  # best[b]: groups so far with at most b machines
    for v in curves:
        env = np.maximum.accumulate(v)  # at most m machines (using more never hurts then)
        L = len(v) - 1
        nxt = np.full(nodes + 1, -np.inf)
        for b in range(1, nodes + 1):
            m = np.arange(1, b + 1)
            nxt[b] = np.max(best[b - m] + env[np.minimum(m, L)])
        best = nxt
    return float(best[nodes])


def exhaustive(instances: int, jobs: int, nodes: int) -> None:
    """Oracle: every partition of the jobs (groups of at most k_max) with its best machine
    split; harmony: its own plan, its own machines. Both by predicted throughput."""
    cfg = HarmonyConfig()
    rng = np.random.default_rng(7)
    ratios = []
    for k in range(instances):
        views = random_jobs(jobs, rng, prefix=f"x{k}-")
        snap = Snapshot(0.0, 1200.0, [f"n{i}" for i in range(nodes)], np.tile([4.0, 1.0, 96.0], (nodes, 1)), views)
        C, N = profile_table(views, cfg.max_dop)
        k_max = Harmony()._k_max(snap)
        curves = local_search.Curves(C, N, cfg.max_dop)
        cache: dict[tuple, np.ndarray] = {}

        def curve(g):
            key = tuple(sorted(views[i].model for i in g))  # same models, same curve
            if key not in cache:
                cache[key] = curves.of(list(g))
            return cache[key]

        best = max(best_split([curve(g) for g in p], nodes) for p in partitions(list(range(jobs)))
                   if len(p) <= nodes and max(len(g) for g in p) <= k_max) / jobs
        plan = Harmony().group(snap)
        mine: dict[str, list[int]] = {}
        for i, j in enumerate(views):
            mine.setdefault(plan.job_pools[j.name], []).append(i)
        groups = list(mine.values())
        machines = np.array([sum(p == name for p in plan.node_pools) for name in mine])
        got = algorithm.score(groups, C, N, algorithm.dop_of(machines, cfg.max_dop), machines,
                              "throughput", cfg.cpu_weight, 0.0)
        ratios.append(got / best)
    print(f"\ncloseness to exhaustive search ({instances} random instances, {jobs} jobs on {nodes} nodes, "
          f"predicted throughput; oracle over partitions and machine splits): harmony / best = "
          f"mean {statistics.mean(ratios):.3f}, worst {min(ratios):.3f} (the paper: within about 2 %)")


def arrivals_table(specs: list[str]) -> None:
    print("\nPoisson arrivals (generated traces, DRF, load-balance; mean JCT x isolated)")
    print(f"{'jobs,nodes,rate,seed':<22} {'harmony':>8} {'guarded':>8} {'none':>6} {'guarded x none':>15} "
          f"{'coloc. err':>10}  decisions won")
    for spec in specs:
        jobs, nodes, rate, seed = spec.split(",")
        trace = generators.generate(jobs=int(jobs), rate=float(rate), seed=int(seed))
        config = SimConfig(nodes=int(nodes), seed=int(seed))
        rows = {g: run(trace, config, "drf", g) for g in ("isolated", "none", "harmony", "guarded")}
        iso = rows["isolated"]["avg_jct_s"]
        g = rows["guarded"]
        print(f"{spec:<22} {rows['harmony']['avg_jct_s'] / iso:>8.3f} {g['avg_jct_s'] / iso:>8.3f} "
              f"{rows['none']['avg_jct_s'] / iso:>6.3f} {g['avg_jct_s'] / rows['none']['avg_jct_s']:>15.3f} "
              f"{g['colocation_mare']:>10.1%}  {g['grouping_choices']}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=80)
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--skip-dl2", action="store_true")
    p.add_argument("--exhaustive", type=int, default=5,
                   help="instances for the exhaustive comparison (0 skips it)")
    p.add_argument("--arrivals", nargs="*", default=[], metavar="JOBS,NODES,RATE,SEED",
                   help="generated Poisson traces to compare harmony, guarded harmony and the baselines on")
    args = p.parse_args()
    scale_table(args, "drf")
    if not args.skip_dl2:
        scale_table(args, "dl2")
    grouping_time()
    if args.exhaustive > 0:
        exhaustive(args.exhaustive, 8, 8)
    if args.arrivals:
        arrivals_table(args.arrivals)


if __name__ == "__main__":
    main()

"""How many rounds a policy takes to settle after a burst of arrivals, in process.

A round that finds nothing new should change nothing: every change it makes is a
checkpoint-restart of someone's training. This benchmark starts from what bench_e2e.py's (b)
builds (1,000 nodes of 8 CPU, 2 GPUs; 200 jobs decided alone on the empty cluster, then 1,800
more admitted on arrival in a few admission steps, as the operator admits them) and runs
rounds of the operator's own snapshot → run_served_round → desired-state diff, each on the
cluster the previous one decided (pods bound where it put them, nothing finishing,
nothing arriving), until a round changes nothing. Per round: the actions the operator would
apply, the jobs whose decision changed, those whose counts changed, and the tasks of jobs with
unchanged counts that were moved anyway. No API server: what it shows is the policy's own
(allocation + sticky placement) fixed point, not the cluster's. `bench_e2e.py` (b) shows the
same settling on the real control plane ("rounds until settled").

Run: `python bench/bench_settling.py [--allocations drf dl2] [--seed 1 | --seeds 10]
[--batches 6] [--unsettled] [--no-guard]` (about 20 s a seed on a quiet machine). 28 Nov 2026, seed 1, `--unsettled` (rounds as the simulator
decides them, and as the operator did before it settled heuristic rounds): DRF 1,326 changes
in the first round, then 76, 23, 12, 2, 0 (the real control plane, bench_e2e (b) the same
day: 1,401, then 143, 50, 18, 9, 0), 911 jobs changed in all; settled (the operator now):
1,379, then 0, 852 jobs changed. DL² 445, 3, 0 (seed 2: 411, then 9, 10, 10, ... every
round: see docs/e2e.md).

29 Nov 2026, DL² rounds through the operator's cycle guard (policies/cycle_guard.py; the
column "guard kept" counts the jobs it kept), `--allocations dl2 --seeds 10`: every seed
settled within two rounds (0, 0, 0, 2, 0, 6, 6, 0, 3, 0 actions after the first round; 24
job-rounds kept); before the guard 5 of the 10 seeds made 4-10 actions (restarts) every round
for good (docs/e2e.md, session 31).
"""

from __future__ import annotations

import argparse
import random

import bench_operator as bo
from mlsched.controller.objects.desired import roles_of, statefulset_manifest
from mlsched.controller.objects.job_records import job_record
from mlsched.policies import registry
from mlsched.policies.cycle_guard import CycleGuard
from mlsched.policies.round import run_admission, run_round, run_served_round


def workload(seed: int, n_jobs: int) -> list[dict]:
    """bench_operator's job bodies with bench_e2e's bounds (worker max 1/2/4, PS max 1/2)."""
    rng = random.Random(seed)
    jobs = []
    for i in range(n_jobs):
        body = bo.job_body(i, rng)
        specs = body["spec"]["replicaSpecs"]
        specs["worker"]["max"] = rng.choice((1, 2, 4))
        if "ps" in specs:
            specs["ps"]["max"] = rng.choice((1, 2))
        body["status"] = {"phase": "Pending"}
        jobs.append(body)
    return jobs


def indexes_for(nodes: list[dict], jobs: list[dict], targets: dict) -> tuple:
    """What the operator's indexes hold once `targets` runs: StatefulSets at the decided
    counts, each pod bound on its decided node; jobs without a target wait at zero."""
    sts, pods = [], []
    for body in jobs:
        rec = job_record(body)
        target = targets.get(rec.name)
        for role in roles_of(rec):
            count = target.count(role) if target else 0
            sts.append(statefulset_manifest(rec, role, count, target.counts if target else {},
                                            bo.SETTINGS))
            if target:
                pods += [bo.pod_body(body, role, k, node)
                         for k, node in enumerate(target.nodes.get(role, ()))]
    return bo.build_indexes(nodes, jobs, pods, sts)


def decide(allocation: str, indexes: tuple, step=run_served_round,
           guard: CycleGuard | None = None) -> tuple[dict, list, int]:
    """A round as the operator runs it (`step` run_served_round, through the operator's
    cycle `guard` kept across rounds), as the simulator does (run_round) or an admission
    step (run_admission) on `indexes`. Also returns how many jobs the guard kept."""
    jobs, snap = bo.snapshot_of(*indexes)
    phases = (registry.make_allocation(allocation), registry.make_placement("load-balance"))
    decision = (step(snap, *phases, guard=guard) if step is run_served_round
                else step(snap, *phases))
    targets = bo.job_targets(decision, snap)
    return targets, bo.plan_all(jobs, targets, indexes[2], indexes[3]), len(decision.kept)


def settle(allocation: str, seed: int, n_nodes: int, n_first: int, n_jobs: int,
           max_rounds: int, batches: int, round_step=run_served_round, guarded: bool = True
           ) -> list[tuple[int, int, int, int, int]]:
    nodes = [bo.node_body(i) for i in range(n_nodes)]
    jobs = workload(seed, n_jobs)
    guard = CycleGuard() if guarded else None  # the operator keeps one per policy
    targets, _, _ = decide(allocation, indexes_for(nodes, jobs[:n_first], {}), round_step, guard)
    # The arrivals: new in the first round (batches 0), or admitted on arrival in `batches`
    # admission steps from what is free, as the operator admits them (running jobs held).
    size = -(-(n_jobs - n_first) // batches) if batches else 0  # (ceiling division)
    for start in range(n_first, n_jobs, size) if batches else ():
        arrived = jobs[:start + size]
        admitted, _, _ = decide(allocation, indexes_for(nodes, arrived, targets), run_admission)
        targets.update({name: t for name, t in admitted.items() if t.count("worker")})
    out = []
    for _ in range(max_rounds):
        new, actions, kept = decide(allocation, indexes_for(nodes, jobs, targets), round_step,
                                    guard)
        changed = counts = moved = 0
        for name, target in new.items():
            old = targets.get(name)
            if old is None or (old.counts, old.nodes) != (target.counts, target.nodes):
                changed += 1
            if old is not None and old.counts != target.counts:
                counts += 1
            elif old is not None:
                moved += sum(a != b for role in target.nodes
                             for a, b in zip(old.nodes.get(role, ()), target.nodes[role]))
        out.append((len(actions), changed, counts, moved, kept))
        targets = new
        if not actions:
            break
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--allocations", nargs="+", default=["drf", "dl2"])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seeds", type=int, default=None,
                        help="run seeds 1..N (instead of --seed) and print a summary per policy")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--first", type=int, default=200, help="jobs decided alone first")
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--max-rounds", type=int, default=8)
    parser.add_argument("--batches", type=int, default=6,
                        help="admission steps the arrivals come in (0: all new at the round)")
    parser.add_argument("--unsettled", action="store_true",
                        help="rounds as the simulator decides them (run_round), not settled")
    parser.add_argument("--no-guard", action="store_true",
                        help="served rounds without the operator's cycle guard (cycle_guard.py)")
    args = parser.parse_args()
    seeds = list(range(1, args.seeds + 1)) if args.seeds else [args.seed]
    arrivals = (f"admitted on arrival in {args.batches} admission steps" if args.batches
                else "new at the first round")
    print(f"{args.first} jobs decided alone on {args.nodes} empty nodes, then {args.jobs} in "
          f"all ({arrivals}); {'unsettled ' if args.unsettled else ''}rounds on what the "
          f"previous one decided{', no cycle guard' if args.no_guard else ''} "
          f"(seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}):")
    print(f"  {'allocation':10} {'seed':>4} {'round':>5} {'actions':>8} {'jobs changed':>13} "
          f"{'counts changed':>15} {'kept tasks moved':>17} {'guard kept':>11}")
    summary = {}
    for allocation in args.allocations:
        for seed in seeds:
            rounds = settle(allocation, seed, args.nodes, args.first, args.jobs,
                            args.max_rounds, args.batches,
                            run_round if args.unsettled else run_served_round,
                            guarded=not args.no_guard)
            for k, (actions, changed, counts, moved, kept) in enumerate(rounds, 1):
                print(f"  {allocation:10} {seed:4d} {k:5d} {actions:8d} {changed:13d} "
                      f"{counts:15d} {moved:17d} {kept:11d}")
            settled = not rounds[-1][0]
            after = sum(r[0] for r in rounds[1:])
            print(f"  {allocation} seed {seed}: {'settled after' if settled else 'not settled in'} "
                  f"{len(rounds) - settled} round(s) with changes; after the first, "
                  f"{after} actions", flush=True)
            summary.setdefault(allocation, []).append((settled, len(rounds) - settled, after,
                                                       sum(r[4] for r in rounds)))
    if len(seeds) > 1:
        print(f"summary over seeds {seeds[0]}-{seeds[-1]} (actions after the first round per "
              f"seed; a seed not settled restarts jobs every round for good):")
        for allocation, runs in summary.items():
            unsettled = [s for s, (ok, _, _, _) in zip(seeds, runs) if not ok]
            print(f"  {allocation:10} settled {len(runs) - len(unsettled)}/{len(runs)}"
                  f"{' (not: seeds ' + ', '.join(map(str, unsettled)) + ')' if unsettled else ''}; "
                  f"rounds with changes max {max(r[1] for r in runs)}; actions after the first "
                  f"round {', '.join(str(r[2]) for r in runs)}; guard kept {sum(r[3] for r in runs)} "
                  f"job-rounds")


if __name__ == "__main__":
    main()

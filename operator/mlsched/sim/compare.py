"""Run several (allocation, placement) pairs on one trace and tabulate the results."""

from __future__ import annotations

from dataclasses import dataclass

from mlsched.policies import registry
from mlsched.policies.regret_guard import GuardSpec
from mlsched.sim.regret_guard import SimGuard
from mlsched.sim.simulator import SimConfig, SimResult, Simulator
from mlsched.workloads.traces import TraceJob


@dataclass
class Run:
    policy: str
    placement: str
    result: SimResult
    grouping: str = "none"
    guard: dict | None = None  # the regret guard's summary (sim/regret_guard.py), when guarded

    def row(self) -> dict:
        return {"policy": self.policy, "placement": self.placement, **self.result.summary(),
                "grouping": self.grouping, **(self.guard or {})}


def run_pairs(trace: list[TraceJob], config: SimConfig, policies: list[str], placements: list[str],
              model_path: str | None = None, progress=None,
              groupings: list[str] | None = None, placement_model_path: str | None = None,
              guard: GuardSpec | None = None, fallback: str = "drf") -> list[Run]:
    """`guard`: runs that serve a learned allocation or placement do so under a regret guard
    (sim/regret_guard.py) whose fallback is `fallback` (and load-balance for a learned
    placement), as the operator's spec.guard and spec.fallback."""
    # Build every policy before running any, so a bad name fails at once, not after minutes.
    sim = Simulator(trace, config)
    ctx = registry.PolicyContext(speed_model=sim.speed, model_path=model_path)
    allocs = [(p, registry.make_allocation(p, ctx)) for p in policies]
    # A learned placement has its own model file (`model_path` is the allocation's).
    place_ctx = registry.PolicyContext(model_path=placement_model_path)
    places = [(p, registry.make_placement(p, place_ctx)) for p in placements]
    groups = [(g, registry.make_grouping(g, ctx)) for g in (groupings or ["none"])]
    if guard is not None and (registry.is_learned("allocation", fallback)
                              or not registry.known("allocation", fallback)):
        raise ValueError(f"fallback {fallback!r}: a heuristic allocation expected (one that needs no model)")
    runs = []
    for (pname, alloc), (lname, place), (gname, grouping) in (
            (a, p, g) for a in allocs for p in places for g in groups):
        sim.reset()
        before = [0]

        def tick(done: int) -> None:
            if progress is not None:
                progress(done - before[0])
            before[0] = done

        sim_guard = None
        if guard is not None and (registry.is_learned("allocation", pname)
                                  or registry.is_learned("placement", lname)):
            sim_guard = SimGuard(guard, registry.make_allocation(fallback, ctx),
                                 registry.make_placement("load-balance")
                                 if registry.is_learned("placement", lname) else None)
        # `none` runs with no grouping at all: exactly the results of before grouping existed
        result = sim.run(alloc, place, grouping if gname != "none" else None, progress=tick,
                         guard=sim_guard)
        if progress is not None:
            progress(len(trace) - before[0])
        runs.append(Run(pname, lname, result, gname, sim_guard.summary() if sim_guard else None))
    return runs


def format_table(runs: list[Run]) -> str:
    rows = [r.row() for r in runs]
    base = rows[0]
    grouped = any(r["grouping"] != "none" for r in rows)
    gcol = (lambda r: f"{r['grouping']:<9} ") if grouped else (lambda r: "")
    head = (f"{'policy':<15} {'placement':<13} {gcol({'grouping': 'grouping'})}{'avg JCT':>9} {'p50':>9} {'p95':>9} {'makespan':>9} "
            f"{'GPU':>5} {'CPU':>5} {'slowdn':>7} {'done':>7} {'vs first':>9}")
    lines = [head, "-" * len(head)]
    for r in rows:
        ratio = r["avg_jct_s"] / base["avg_jct_s"] if base["avg_jct_s"] else float("nan")
        lines.append(
            f"{r['policy']:<15} {r['placement']:<13} {gcol(r)}{_dur(r['avg_jct_s']):>9} {_dur(r['p50_jct_s']):>9} "
            f"{_dur(r['p95_jct_s']):>9} {_dur(r['makespan_s']):>9} {r['gpu_util']:>5.0%} "
            f"{r['cpu_util']:>5.0%} {r['avg_slowdown']:>7.2f} {r['completed']:>3}/{r['jobs']:<3} {ratio:>8.2f}x")
    lines.append(f"JCT in hours (h) or minutes (m); slowdn = mean JCT / ideal JCT "
                 f"(ideal avg {_dur(base['ideal_avg_jct_s'])}); 'vs first' = avg JCT / first row's.")
    lines += work_conservation_lines(runs)
    lines += model_domain_lines(runs)
    lines += colocation_lines(runs)
    lines += placement_guard_lines(runs)
    lines += guard_lines(runs)
    return "\n".join(lines)


def guard_lines(runs: list[Run]) -> list[str]:
    """Per guarded run (sim/regret_guard.py): windows judged, trips, rounds the fallback
    served, the replay's error against the records, and the latest judgement."""
    lines = []
    for run in runs:
        g = run.guard
        if g is None:
            continue
        grouping = f" / {run.grouping}" if run.grouping != "none" else ""
        name = f"{run.policy} / {run.placement}{grouping}"
        error = (f"{g['guard_mean_abs_error']:.1%}" if g["guard_mean_abs_error"] is not None else "-")
        first = (f", first at round {g['guard_first_trip_round']}"
                 if g["guard_first_trip_round"] is not None else "")
        failed = f"; {g['guard_failures']} windows could not be replayed" if g["guard_failures"] else ""
        lines.append(f"  {name}: {g['guard_windows']} windows judged, tripped {g['guard_trips']} "
                     f"times{first}, cleared {g['guard_clears']}; the fallback served "
                     f"{g['guard_fallback_rounds']} of {run.result.rounds} rounds; the replay's mean "
                     f"|error| against the records {error}{failed}")
        if g["guard_last"]:
            lines.append(f"    latest: {g['guard_last']}")
    if lines:
        lines.insert(0, "regret guard (each window replayed under the learned policy and the fallback):")
    return lines


def placement_guard_lines(runs: list[Run]) -> list[str]:
    """Per run of a guarded learned placement (policies/placement/guarded.py): in how many
    decisions its layout was served, and in how many the fallback's (LIF-Line)."""
    lines = []
    for run in runs:
        c = run.result.placement_choices
        if not c:
            continue
        grouping = f" / {run.grouping}" if run.grouping != "none" else ""
        total = sum(c.values())
        lines.append(f"  {run.policy} / {run.placement}{grouping}: the network's layout served in "
                     f"{c.get('learned', 0)} of {total} decisions, LIF-Line's in {c.get('fallback', 0)}")
    if lines:
        lines.insert(0, "placement guard (LIF-Line's layout served where the guard judged the "
                        "network's would lose):")
    return lines


def colocation_lines(runs: list[Run]) -> list[str]:
    """Per harmony-grouped run, its co-location model against the simulator's ground truth on
    the pools of 2+ jobs it formed (sim/colocation_error.py), and, when guarded
    (sim/grouping_guard.py), which grouping won its decisions."""
    lines = []
    for run in runs:
        r = run.result
        if run.grouping != "harmony":
            continue
        name = f"{run.policy} / {run.placement} / harmony"
        if r.colocation_samples:
            lines.append(f"  {name}: mean absolute relative error of predicted vs true co-located speed "
                         f"{r.colocation_mare:.1%} over {r.colocation_samples} job-slots in shared pools")
        else:
            lines.append(f"  {name}: no pool of 2+ jobs formed (nothing to check)")
        if r.grouping_choices:
            won = ", ".join(f"{g} {n}" for g, n in sorted(r.grouping_choices.items()))
            lines.append(f"    guarded: decisions won by {won}")
    if lines:
        lines.insert(0, "harmony co-location model vs the simulator's ground truth:")
    return lines


def model_domain_lines(runs: list[Run]) -> list[str]:
    """Per run that served a learned model, whether its rounds were inside the model's
    trained domain (its card's; policies/model_domain.py): the operator's ModelInDomain."""
    lines = []
    for run in runs:
        r = run.result
        if not r.domain_rounds:
            continue  # heuristics only
        grouping = f" / {run.grouping}" if run.grouping != "none" else ""
        name = f"{run.policy} / {run.placement}{grouping}"
        if r.rounds_outside_domain:
            lines.append(f"  WARNING {name}: outside its model's trained domain in "
                         f"{r.rounds_outside_domain} of {r.domain_rounds} rounds: {r.outside_domain}")
        if r.no_domain:
            lines.append(f"  {name}: the model card of {', '.join(r.no_domain)} records no "
                         "training domain (not checked)")
        if not r.rounds_outside_domain and not r.no_domain:
            lines.append(f"  {name}: every round inside its model's trained domain ({r.domain_rounds})")
    if lines:
        lines.insert(0, "model domain (each round against the served learned models' cards):")
    return lines


def work_conservation_lines(runs: list[Run]) -> list[str]:
    """Per run, how many rounds left idle capacity a waiting job's minimum would fit
    (policies/work_conservation.py) and the mean idle capacity in those rounds."""
    lines = ["work conservation (rounds leaving idle what a waiting job's minimum would fit):"]
    for run in runs:
        r = run.result
        grouping = f" / {run.grouping}" if run.grouping != "none" else ""
        name = f"{run.policy} / {run.placement}{grouping}"
        if r.nonconserving_rounds:
            lines.append(f"  {name}: {r.nonconserving_rounds} of {r.rounds} rounds not work "
                         f"conserving; idle then (mean): {r.idle_gpus:.1f} GPUs, "
                         f"{r.idle_cpus:.1f} CPUs, {r.idle_tasks:.1f} tasks")
        else:
            lines.append(f"  {name}: every round work conserving ({r.rounds})")
    return lines


def _dur(seconds: float) -> str:
    if seconds != seconds:  # NaN
        return "-"
    if seconds >= 3600:
        return f"{seconds / 3600:.2f}h"
    return f"{seconds / 60:.1f}m"

"""The `domain` a learned model's card records: the setting its training used, derived from
the training arguments (the same dict the card keeps under training.args), so the exporters
write it with every model and the shipped cards were filled by the same functions.

The format and how a round is checked against it: operator/mlsched/policies/model_domain.py.
Each figure's `sources` entry says where it came from (the generator or config that set it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from mlsched.sim import chic_scenario
from mlsched.sim.scenarios import SCENARIOS
from mlsched.sim.simulator import SIMULATOR_VERSION, SimConfig
from mlsched.workloads import catalog, gpu_types

#: dl2/train.py train_episode_setup: jobs per training trace, drawn uniformly in this range.
DL2_JOBS_PER_EPISODE = (30, 60)
#: sim/scenarios.py placement_trace: jobs per node of a Harmony placement trace, and its
#: share of all-reduce jobs.
HARMONY_JOBS_PER_NODE = 4
HARMONY_ARCH_MIX = 0.3


def span(lo: float, hi: float) -> dict[str, float]:
    return {"min": lo, "max": hi}


def node_shape(cfg: SimConfig) -> dict[str, dict[str, float]]:
    """The one node shape a simulator config trains on, as spans."""
    return {"node_gpus": span(cfg.node_gpus, cfg.node_gpus),
            "node_cpus": span(cfg.node_cpus, cfg.node_cpus),
            "node_mem_gib": span(cfg.node_mem_gib, cfg.node_mem_gib)}


def _hours(per_slot: float, interval_s: float) -> float:
    return round(per_slot * 3600.0 / interval_s, 2)


def chic(args: Mapping[str, Any]) -> dict[str, Any]:
    """Chic / Chic-Pair (policy_models/chic/train.py): the paper's one pool, 30-job sequences."""
    jobs, window = int(args["jobs_per_episode"]), int(args["jobs"])
    cfg = chic_scenario.config(window=window)
    return {
        "nodes": span(cfg.nodes, cfg.nodes),
        **node_shape(cfg),
        "pools": 1,
        "jobs_per_trace": span(jobs, jobs),
        "jobs_present": span(0, jobs),
        "arrivals_per_hour": span(float(args["rate_min"]), float(args["rate_max"])),
        "models": sorted(chic_scenario.MODELS),
        "architectures": ["ps"],
        "window": window,
        "simulator_version": SIMULATOR_VERSION,
        "sources": {
            "nodes": "sim/chic_scenario.py config(): the paper's pool as one node of 10 GPUs, "
                     "120 CPUs, 600 GiB (the CEM episodes and the validation sequences)",
            "jobs_per_trace": "training.args.jobs_per_episode (the paper's W)",
            "jobs_present": "at most a sequence's jobs at once (an upper bound, not measured)",
            "arrivals_per_hour": "training.args.rate_min..rate_max (Poisson)",
            "models": "sim/chic_scenario.py MODELS (the paper's three, drawn uniformly)",
            "window": "training.args.jobs (I): the jobs it sees, the first I in arrival order",
            "not_counted": "the warm start also imitated a teacher on "
                           f"{args.get('warm_start_dl2_traces', 0)} DL² traces (13 and 60 nodes, "
                           "eight models); the model was then trained and selected on the pool only",
        },
    }


def dl2(args: Mapping[str, Any]) -> dict[str, Any]:
    """DL² (policy_models/dl2/train.py train_episode_setup): train_nodes of the simulator's
    default node, rate 3 x nodes/13 x U(0.6, 1.4) per slot, 30-60 jobs per trace."""
    cfg = SimConfig()
    nodes = [int(n) for n in args["train_nodes"]]
    lo_rate = 3.0 * min(nodes) / 13 * 0.6
    hi_rate = 3.0 * max(nodes) / 13 * 1.4
    held = {catalog.canonical_name(m) for m in args.get("holdout_models") or ()}
    models = sorted(m for m in catalog.MODEL_NAMES if m not in held)
    val = [SCENARIOS[s] for s in args.get("val_scenarios") or ()]
    return {
        "nodes": span(min(nodes), max(nodes)),
        **node_shape(cfg),
        "pools": 1,
        "jobs_per_trace": span(*DL2_JOBS_PER_EPISODE),
        "jobs_present": span(0, DL2_JOBS_PER_EPISODE[1]),
        "arrivals_per_hour": span(_hours(lo_rate, cfg.interval_s), _hours(hi_rate, cfg.interval_s)),
        "models": models,
        "architectures": ["ps"],
        "window": int(args["window"]),
        "simulator_version": SIMULATOR_VERSION,
        # Typed training (issue 54) only: absent, the domain is untyped clusters.
        **({"gpu_types": sorted({gpu_types.canonical_type(t.strip()) for t in args["gpu_types"].split(",")
                                 if t.strip()})} if args.get("gpu_types") else {}),
        "sources": {
            "nodes": "training.args.train_nodes (one drawn per episode); node shape: SimConfig's "
                     "default node",
            "jobs_per_trace": "dl2/train.py train_episode_setup (uniform 30..60)",
            "jobs_present": "at most a training trace's jobs at once (an upper bound, not measured)",
            "arrivals_per_hour": "train_episode_setup: 3 x nodes/13 x U(0.6, 1.4) per 1200 s slot",
            "models": "the catalog's models less training.args.holdout_models; generators.generate "
                      "with arch_mix 0 (parameter-server jobs only)",
            "window": "training.args.window: the jobs it sees, in arrival order",
            "validation": ", ".join(f"{s.name}: {s.nodes} nodes, {s.jobs} jobs" for s in val)
                          or "none",
        },
    }


def harmony(args: Mapping[str, Any]) -> dict[str, Any]:
    """Harmony placement (policy_models/harmony/train.py): sim/scenarios.py placement_trace on
    train_nodes of the simulator's default node, 4 jobs per node arriving at nodes/2 a slot."""
    cfg = SimConfig()
    nodes = [int(n) for n in args["train_nodes"]]
    jobs = (HARMONY_JOBS_PER_NODE * min(nodes), HARMONY_JOBS_PER_NODE * max(nodes))
    return {
        "nodes": span(min(nodes), max(nodes)),
        **node_shape(cfg),
        "pools": 1,
        "jobs_per_trace": span(*jobs),
        "jobs_present": span(0, jobs[1]),
        "arrivals_per_hour": span(_hours(min(nodes) / 2, cfg.interval_s),
                                  _hours(max(nodes) / 2, cfg.interval_s)),
        "models": sorted(catalog.MODEL_NAMES),
        "architectures": ["allreduce", "ps"],
        "simulator_version": SIMULATOR_VERSION,
        "sources": {
            "nodes": "training.args.train_nodes (one drawn per episode); node shape: SimConfig's "
                     "default node",
            "jobs_per_trace": "sim/scenarios.py placement_trace: 4 jobs per node",
            "jobs_present": "at most a training trace's jobs at once (an upper bound, not measured)",
            "arrivals_per_hour": "placement_trace: nodes/2 per 1200 s slot",
            "models": "generators.generate's catalog models, 30 % all-reduce jobs; counts fixed "
                      f"by their owners, allocations {', '.join(args.get('allocations') or ['fixed'])}",
        },
    }


def widened(base: Mapping[str, Any], nodes: int, models: Iterable[str],
            architectures: Iterable[str], source: str) -> dict[str, Any]:
    """A retrained model's domain: its base model's, widened by the recorded cluster it was
    retrained on (its node count and the jobs' models and architectures). A base without a
    domain gives none: what the base was trained on is not known."""
    if not base:
        return {}
    out = dict(base)
    if "nodes" in out:
        out["nodes"] = span(min(out["nodes"]["min"], nodes), max(out["nodes"]["max"], nodes))
    for key, seen in (("models", models), ("architectures", architectures)):
        if key in out:
            out[key] = sorted(set(out[key]) | set(seen))
    out["simulator_version"] = SIMULATOR_VERSION
    out["sources"] = {**(out.get("sources") or {}), "retrained": source}
    return out

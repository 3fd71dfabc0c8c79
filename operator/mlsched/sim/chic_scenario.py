"""The Chic paper's setting (Gong et al., IWQoS '19 §4): one pool of 10 GPUs, 120 CPUs and
600 GB, VGG-16, ResNet-50 and ResNeXt-110 jobs with the paper's per-task demands, Poisson
arrivals at 0.9 to 2.7 jobs per hour, W = 30 jobs per sequence.

Choices the paper leaves open (docs/chic.md has the reasoning):
- The pool is one node of the aggregate capacity: the paper has no servers or placement.
- Speeds are the simulator's ground truth (the DL² measured table) for the three models; the
  paper gives no speed model. Its tasks' demands go in through SimConfig.demands (the catalog's
  PS demand, 2 CPU / 8 GB, is DL²'s, not Chic's).
- A job's size is U{100..200} "iterations" (the paper's unit), one iteration being what its
  model trains in one minute with 1 PS and 1 worker alone: jobs of 1.7 to 3.3 hours at the
  smallest configuration, under an hour for VGG-16 and ResNet-50 at their best.
- Model types are drawn uniformly. No interference (one pool, the paper models none) and no
  rescaling cost (the paper models none), for every policy alike.
- Chic reschedules on events (a job finishes; a job arrives while fewer than I are present);
  the heuristics reschedule every 600 s, the paper's (and Optimus's) default interval.
"""

from __future__ import annotations

import numpy as np

from mlsched.sim.simulator import SimConfig
from mlsched.workloads.speed_models import MeasuredSpeed, epochs_per_s
from mlsched.workloads.traces import TraceJob

#: model -> (PS demand, worker demand), (cpu, gpu, mem_gib): the paper's Table (§4.1).
PAPER_DEMANDS = {
    "vgg-16": ((4.0, 0.0, 10.0), (2.0, 1.0, 10.0)),
    "resnet-50": ((3.0, 0.0, 9.0), (2.0, 1.0, 8.0)),
    "resnext-110": ((3.0, 0.0, 10.0), (2.0, 1.0, 10.0)),
}
MODELS = tuple(PAPER_DEMANDS)
RATES_PER_HOUR = (0.9, 1.35, 1.8, 2.25, 2.7)
JOBS_PER_SEQUENCE = 30  # W
ITERATION_S = 60.0  # one "iteration" = this long at 1 PS + 1 worker
HEURISTIC_INTERVAL_S = 600.0
EVENT_CAP_S = 6 * 3600.0  # event-driven: a safety round if nothing happens for this long

#: Seeds the Chic benchmark evaluates on (30 test sequences, as the paper); training and
#: validation use seeds below 100_000 (policy_models/chic/train.py).
CHIC_TEST_SEEDS = range(300_000, 300_030)


def trace(rate_per_hour: float, seed: int, jobs: int = JOBS_PER_SEQUENCE) -> list[TraceJob]:
    """One arrival sequence: Poisson arrivals, uniform model types, U{100..200} iterations."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(3600.0 / rate_per_hour, jobs)
    arrivals = np.cumsum(gaps) - gaps[0]  # the first job arrives at t = 0
    truth = MeasuredSpeed()
    out = []
    for k in range(jobs):
        model = MODELS[int(rng.integers(len(MODELS)))]
        iterations = int(rng.integers(100, 201))
        epochs = iterations * ITERATION_S * epochs_per_s(truth, model, "ps", 1, 1)
        out.append(TraceJob(f"job-{k:03d}", float(arrivals[k]), model, float(epochs)))
    return out


def config(seed: int = 0, event_driven: bool = True, window: int = 3, **overrides) -> SimConfig:
    """The paper's cluster. `event_driven`: Chic's rounds (window = I, the arrival trigger);
    otherwise a round every 600 s."""
    # admission="interval": Chic's own rescheduling events decide when jobs start (event-driven
    # rounds on arrivals and completions); the heuristic baselines' 600 s rounds are the paper's.
    base = dict(nodes=1, node_cpus=120.0, node_gpus=10.0, node_mem_gib=600.0, max_ps=32, max_workers=10,
                scaling_cost_s=0.0, interference=False, seed=seed, demands=PAPER_DEMANDS,
                admission="interval")
    if event_driven:
        base.update(event_driven=True, arrival_trigger_below=window, interval_s=EVENT_CAP_S)
    else:
        base.update(interval_s=HEURISTIC_INTERVAL_S)
    base.update(overrides)
    return SimConfig(**base)

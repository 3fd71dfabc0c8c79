"""Named workloads at the three cluster sizes the benchmarks compare policies on.

The sizes follow the DL² paper: its 13-server testbed, a 60-node cluster, and its 500-server
simulation (200 jobs). Arrival rates grow with the cluster so each is busy: about 3 jobs per
20-minute slot on 13 nodes (the DL² default), 8 on 60 and 20 on 500. Training uses other
seeds from the same generator (see policy_models/dl2/train.py), never the benchmark seeds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from mlsched.sim.simulator import SimConfig
from mlsched.workloads import generators
from mlsched.workloads.traces import TraceJob


@dataclass(frozen=True)
class Scenario:
    name: str
    nodes: int
    jobs: int
    rate: float  # mean arrivals per slot

    def trace(self, seed: int, models: tuple[str, ...] | None = None) -> list[TraceJob]:
        return generators.generate(jobs=self.jobs, rate=self.rate, seed=seed, models=models)

    def config(self, seed: int = 0, **overrides) -> SimConfig:
        return SimConfig(nodes=self.nodes, seed=seed, **overrides)


SCENARIOS = {
    "small": Scenario("small", 13, 60, 3.0),
    "medium": Scenario("medium", 60, 120, 8.0),
    "large": Scenario("large", 500, 200, 20.0),
}

#: Seeds the benchmarks evaluate on; training and validation must use others.
BENCHMARK_SEEDS = range(100_000, 100_005)


def placement_trace(nodes: int, seed: int, jobs_per_node: int = 4, arch_mix: float = 0.3,
                    max_workers: int = 4) -> list[TraceJob]:
    """Harmony placement's setting (issue 15): mixed parameter-server / all-reduce jobs (30 %
    all-reduce) whose owners fix the counts: 1-4 workers and, for PS jobs, 1-2 PS each
    (uniform, from the seed); `jobs_per_node x nodes` jobs arriving at `nodes / 2` per slot.
    Run with the `fixed` allocation. bench/bench_placement.py tests on seeds 700000+;
    training (policy_models/harmony) uses others. `arch_mix` (the all-reduce share) and
    `max_workers` give job mixes the shipped model was not trained on (bench --mix)."""
    jobs = generators.generate(jobs=jobs_per_node * nodes, rate=nodes / 2, seed=seed, arch_mix=arch_mix)
    rng = np.random.default_rng(seed + 1)
    return [replace(j, workers=int(rng.integers(1, max_workers + 1)),
                    ps=int(rng.integers(1, 3)) if j.arch == "ps" else None) for j in jobs]


#: Heterogeneous GPUs (issue 54, bench/bench_hetero.py): equal node counts of each GPU type,
#: held-out seeds no other benchmark or trainer uses; the heuristics were tuned on
#: HETERO_TUNING_SEEDS at 12 nodes (4 per type) only.
HETERO_TYPES = ("v100", "p100", "k80")
HETERO_SEEDS = range(540_100, 540_105)
HETERO_TUNING_SEEDS = range(54_000, 54_003)


def hetero_cluster(nodes_per_type: int, types: tuple[str, ...] = HETERO_TYPES) -> tuple[str, ...]:
    """One GPU type per node, `nodes_per_type` nodes of each (a third of the GPUs each)."""
    return tuple(t for t in types for _ in range(nodes_per_type))


def hetero_trace(nodes: int, seed: int, pattern: str = "poisson") -> list[TraceJob]:
    """The DL² scenarios' load per node (about 5 jobs per node, nodes / 4 arrivals per slot),
    with the project's arrival patterns (poisson, uniform, google)."""
    return generators.generate(jobs=5 * nodes, rate=nodes / 4, seed=seed, pattern=pattern)

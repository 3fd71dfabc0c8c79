"""What makes the regret guard's replays cheaper changes no figure (issue 50): chic's lookahead
(features/chic_state._Lookahead) against the formula it computes, to the digit, and a window's
two replays sharing one simulator (sim/regret_replay.py) against replays from fresh ones."""

from __future__ import annotations

import itertools

import numpy as np

from mlsched.cluster.types import JobView
from mlsched.features.chic_state import _Lookahead, _speed_grid
from mlsched.policies import registry
from mlsched.policies.regret_guard import LEARNED
from mlsched.sim import regret_replay
from mlsched.sim.regret_guard import interval_record
from mlsched.sim.simulator import SimConfig, Simulator
from mlsched.policies.round import run_round
from mlsched.workloads import generators


def reference_gains(job: JobView, grid: np.ndarray, ps: int, workers: int, now: float,
                    free: np.ndarray) -> tuple[float, float, float]:
    """_Lookahead.gains as first written: every cell of the grid, at every call."""
    p, w = np.indices(grid.shape)
    ps_demand = np.asarray(job.ps_demand, dtype=float) if job.uses_ps else np.zeros(3)
    more_p, more_w = p - ps, w - workers
    added = np.maximum(more_p, 0) + np.maximum(more_w, 0)
    need = (np.maximum(more_p, 0)[..., None] * ps_demand
            + np.maximum(more_w, 0)[..., None] * np.asarray(job.worker_demand, dtype=float))
    reachable = (more_p >= 0) & (more_w >= 0) & (need <= free + 1e-9).all(axis=-1)

    def best_through(action):
        where = reachable & action & (grid > 0)
        if not where.any():
            return -1.0
        if now <= 0:
            return 1.0
        return max(-1.0, float(((1.0 - now / grid[where]) / added[where]).max()))

    via_worker = best_through(more_w >= 1)
    if not job.uses_ps:
        return via_worker, -1.0, via_worker
    return via_worker, best_through(more_p >= 1), best_through((more_p == more_w) & (more_w >= 1))


def test_the_lookahead_gives_the_formulas_figures_to_the_digit():
    rng = np.random.default_rng(50)
    frees = [np.zeros(3), np.array([8.0, 2.0, 48.0]), np.array([240.0, 60.0, 1440.0]),
             *(rng.uniform(0, [64, 16, 400]) for _ in range(6))]
    for model, arch in itertools.product(("resnet-50", "vgg-16", "inception-bn", "seq2seq"),
                                         ("ps", "allreduce")):
        job = JobView(name="j", model=model, arch=arch, arrival_s=0.0, total_epochs=10.0)
        for scale in (1.0, 0.7):
            curve = job.prior if scale == 1.0 else job.prior.scaled(scale)
            grid = _speed_grid(curve, job)
            look = _Lookahead(job, grid)
            for ps, workers in itertools.product((0, 1, 3, 16), (0, 1, 2, 9, 16)):
                if arch == "allreduce" and ps:
                    continue
                now = curve.epochs_per_s(ps, workers)
                for free in frees:  # each counts asked again with other free capacity (cached)
                    got = look.gains(ps, workers, now, free)
                    assert got == reference_gains(job, grid, ps, workers, now, free), \
                        (model, arch, scale, ps, workers, free)


def test_a_windows_replays_on_one_simulator_are_those_on_fresh_ones():
    sim = Simulator(generators.generate(jobs=20, seed=7), SimConfig(nodes=8, seed=7))
    chic, lb = registry.make_allocation("chic"), registry.make_placement("load-balance")
    drf = registry.make_allocation("drf")
    records = []
    while not sim.done and len(records) < 4:
        before, start = {s.spec.name: s.epochs_done for s in sim.active}, sim.time_s
        decision = run_round(sim.snapshot(), chic, lb)
        records.append(interval_record(sim, start, before, decision, sim.advance(decision), sim.slot))
    window = regret_replay.window_start(records)
    fresh = [regret_replay.replay(window, sim.config, sim.node_names, a, lb) for a in (chic, drf)]
    shared = regret_replay.estimate(records, sim.config, sim.node_names, (chic, lb), (drf, lb),
                                    LEARNED)
    assert [shared.learned, shared.fallback] == fresh and fresh[0] != fresh[1]
    # The simulator's records bound every job as its snapshots do: the snapshot as it is.
    snap = sim.snapshot()
    assert regret_replay.bounded(snap, {j.name: (1, 16, 1, 16) for j in snap.jobs}) is snap

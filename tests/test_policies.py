"""Each heuristic's defining property, not just that it runs."""

import numpy as np
import pytest

from conftest import job, make_snapshot
from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import SpeedObservation
from mlsched.policies import registry
from mlsched.policies.allocation.optimus import Optimus
from mlsched.policies.round import run_round
from mlsched.policies.speed_estimate import ObservedSpeed, TrueSpeed
from mlsched.workloads import catalog
from mlsched.workloads.speed_models import MeasuredSpeed

LB = registry.make_placement("load-balance")


def decide(policy: str, snap, placement="load-balance", **ctx):
    alloc = registry.make_allocation(policy, registry.PolicyContext(**ctx))
    return run_round(snap, alloc, registry.make_placement(placement))


def test_fifo_fills_jobs_in_arrival_order():
    jobs = [job("late", arrival=50), job("early", arrival=10), job("mid", arrival=30)]
    d = decide("fifo", make_snapshot(jobs, nodes=4))  # 8 GPUs: the first job takes them all
    assert d.counts("early")[1] >= 6  # (load-balancing may strand a GPU behind PS tasks)
    assert d.counts("mid") == (0, 0) and d.counts("late") == (0, 0)


def test_fifo_moves_on_when_the_first_job_cannot_grow():
    jobs = [job("big", arrival=0, max_workers=2, max_ps=2), job("next", arrival=1)]
    d = decide("fifo", make_snapshot(jobs, nodes=4))
    assert d.counts("big") == (2, 2)
    assert d.counts("next")[1] > 0


def test_srtf_serves_the_shortest_remaining_time_first():
    long_ = job("long", arrival=0, epochs=1000)
    short = job("short", arrival=5, epochs=1000, done=990)
    d = decide("srtf", make_snapshot([long_, short], nodes=2))
    assert d.counts("short")[1] == 4 - d.counts("long")[1]
    assert d.counts("short")[1] >= 3


def test_srtf_orders_by_time_not_by_fraction_of_epochs():
    # Same fraction left, but vgg-16 trains far slower per epoch than resnext-110.
    slow = job("slow", model="vgg-16", arrival=0, epochs=100, done=50)
    fast = job("fast", model="resnext-110", arrival=1, epochs=100, done=50)
    snap = make_snapshot([slow, fast], nodes=1)
    d = decide("srtf", snap)
    assert d.counts("fast")[1] >= 1 and d.counts("slow") == (0, 0)


def test_drf_equalises_dominant_shares():
    gpu_job = job("gpu", model="resnet-50")  # dominant resource: GPU
    cpu_job = job("cpu", model="dssm")  # CPU-only workers: dominant resource CPU
    snap = make_snapshot([gpu_job, cpu_job], nodes=6)
    ledger = Ledger(snap, LB)
    registry.make_allocation("drf").allocate(snap, ledger)
    a, b = ledger.dominant_share(gpu_job), ledger.dominant_share(cpu_job)
    bundle = max(np.max((catalog.MODELS[m].worker_demand + catalog.MODELS[m].ps_demand)
                        / snap.total_capacity) for m in ("resnet-50", "dssm"))
    assert abs(a - b) <= bundle + 1e-9
    assert ledger.count(gpu_job, "worker") > 0 and ledger.count(cpu_job, "worker") > 0


def test_tetris_favours_the_shortest_remaining_work():
    a = job("a", arrival=0, epochs=1000, done=0)
    b = job("b", arrival=1, epochs=1000, done=900)
    snap = make_snapshot([a, b], nodes=1)  # room for two bundles
    d = decide("tetris", snap, placement="tetris")
    assert d.counts("b")[1] >= d.counts("a")[1]
    assert d.counts("b") != (0, 0)


def test_optimus_grants_the_largest_marginal_gain_first():
    jobs = [job("r", model="resnet-50", epochs=500), job("v", model="vgg-16", epochs=500)]
    snap = make_snapshot(jobs, nodes=8)
    est = TrueSpeed(MeasuredSpeed())
    opt = Optimus(lambda s: est)
    ledger = Ledger(snap, LB)
    # After the starting gangs, the first extra task must be the best (gain, role) over jobs.
    for j in jobs:
        ledger.grow_bundle(j)
    total = snap.total_capacity
    gains = {j.name: opt.best_gain(j, ledger, est, total) for j in jobs}
    best_job = max(gains, key=lambda n: gains[n][0])
    role = gains[best_job][1]
    before = ledger.count(jobs[[j.name for j in jobs].index(best_job)], role)
    full = Ledger(snap, LB)
    opt.allocate(snap, full)
    assert full.count(jobs[[j.name for j in jobs].index(best_job)], role) > before


def test_optimus_stops_when_no_task_shortens_any_job():
    j = job("r", model="resnet-50", epochs=500)
    d = decide("optimus-oracle", make_snapshot([j], nodes=50), speed_model=MeasuredSpeed())
    ps, w = d.counts("r")
    speed = MeasuredSpeed()
    f = speed.steps_per_s("resnet-50", "ps", ps, w)
    assert f >= speed.steps_per_s("resnet-50", "ps", ps + 1, w)
    assert f >= speed.steps_per_s("resnet-50", "ps", ps, w + 1)


def test_deployed_optimus_learns_speeds_from_observations_and_can_be_wrong():
    true = TrueSpeed(MeasuredSpeed())
    j = job("r", model="resnet-50")
    j.observations = tuple(SpeedObservation(p, w, true.epochs_per_s(j, p, w))
                           for p, w in ((1, 1), (1, 2), (2, 2), (2, 4)))
    est = ObservedSpeed(make_snapshot([j]))
    near = est.epochs_per_s(j, 2, 2) / true.epochs_per_s(j, 2, 2)
    far = est.epochs_per_s(j, 12, 12) / true.epochs_per_s(j, 12, 12)
    assert abs(near - 1) < 0.25  # fitted where it has seen the job
    assert abs(far - 1) > 0.05  # and extrapolates, imperfectly, where it has not


def test_optimus_oracle_is_only_available_with_the_true_speed_function():
    with pytest.raises(registry.UnknownPolicyError, match="only in the simulator"):
        registry.make_allocation("optimus-oracle")


def test_fixed_gives_the_requested_counts_all_or_nothing():
    a = job("a", requested_ps=2, requested_workers=3, arrival=0)
    b = job("b", requested_ps=1, requested_workers=4, arrival=1)  # does not fit next to a
    d = decide("fixed", make_snapshot([a, b], nodes=3))
    assert d.counts("a") == (2, 3)
    assert d.counts("b") == (0, 0)


def test_unknown_policy_names_are_clear_errors():
    with pytest.raises(registry.UnknownPolicyError, match="unknown allocation policy 'best'; known: fixed"):
        registry.make_allocation("best")
    with pytest.raises(registry.UnknownPolicyError, match="unknown placement policy"):
        registry.make_placement("random")


# ---- placement ----------------------------------------------------------------------------
def _packer_with_load(placement: str):
    snap = make_snapshot([job("x"), job("y")], nodes=3)
    ledger = Ledger(snap, registry.make_placement(placement, registry.PolicyContext(sticky=False)))
    # Preload node 1 with one worker of y (1 GPU, 2 CPU).
    ledger.book(snap.jobs[1], "worker", 1)
    return snap, ledger


@pytest.mark.parametrize("placement,expected", [
    ("load-balance", 0), ("bin-pack", 1), ("first-fit", 0), ("tetris", 0)])
def test_placement_heuristics_pick_their_node(placement, expected):
    snap, ledger = _packer_with_load(placement)
    node = ledger.placer.choose_node(ledger, snap.jobs[0], "worker", catalog.MODELS["resnet-50"].worker_demand)
    assert node == expected


@pytest.mark.parametrize("placement", ["load-balance", "bin-pack", "first-fit", "tetris"])
def test_placement_tries_other_nodes_before_giving_up(placement):
    snap = make_snapshot([job("x")], nodes=3)
    ledger = Ledger(snap, registry.make_placement(placement, registry.PolicyContext(sticky=False)))
    ledger._free_t[:, 0] = 0  # nodes 0 and 1 are full
    ledger._free_t[:, 1] = 0
    assert ledger.placer.choose_node(ledger, snap.jobs[0], "worker", catalog.MODELS["resnet-50"].worker_demand) == 2
    ledger._free_t[:, 2] = 0
    assert ledger.placer.choose_node(ledger, snap.jobs[0], "worker", catalog.MODELS["resnet-50"].worker_demand) is None


# ---- ledger rules ---------------------------------------------------------------------------
def test_packer_starts_jobs_with_their_minimum_gang_atomically():
    j = job("g", min_workers=3, max_workers=8)
    snap = make_snapshot([j], nodes=1)  # 2 GPUs: the 3-worker gang cannot fit
    ledger = Ledger(snap, LB)
    assert not ledger.grow(j, "ps")
    assert ledger.jobs == {}
    assert np.array_equal(ledger.free, snap.capacity)


def test_packer_respects_caps_and_allreduce_has_no_ps():
    j = job("c", max_ps=1, max_workers=2)
    ledger = Ledger(make_snapshot([j], nodes=4), LB)
    assert ledger.grow_bundle(j) and ledger.grow(j, "worker")
    assert not ledger.grow(j, "worker") and not ledger.grow(j, "ps")
    ar = job("ar", arch="allreduce")
    ledger2 = Ledger(make_snapshot([ar], nodes=4), LB)
    assert not ledger2.grow(ar, "ps")
    assert ledger2.grow_bundle(ar) and ledger2.count(ar, "ps") == 0


def test_packer_keeps_tasks_on_their_previous_nodes():
    j = job("s", ps=1, workers=2, ps_nodes=(3,), worker_nodes=(2, 3))
    ledger = Ledger(make_snapshot([j], nodes=4), LB)
    ledger.grow_bundle(j)
    ledger.grow(j, "worker")
    d = ledger.jobs["s"]
    assert d.ps_nodes == [3] and d.worker_nodes == [2, 3]


def test_job_pools_restrict_placement():
    j = job("p", pool="b")
    snap = make_snapshot([j], nodes=4)
    snap.node_pools = ["a", "a", "b", "b"]
    ledger = Ledger(snap, LB)
    while ledger.grow_bundle(j):
        pass
    nodes = ledger.jobs["p"].ps_nodes + ledger.jobs["p"].worker_nodes
    assert set(nodes) <= {2, 3} and len(ledger.jobs["p"].worker_nodes) == 4


# ---- fast paths must give what the full scans give ------------------------------------------
def _random_packer(rng, nodes: int, pooled: bool):
    snap = make_snapshot([job("x", pool="a" if pooled else None)], nodes=nodes)
    if pooled:
        snap.node_pools = [str(p) for p in rng.choice(["a", "b"], size=nodes)]
    ledger = Ledger(snap, LB)
    # Free capacity on a coarse grid (so ties and exact fits happen), some of it exhausted.
    ledger._free_t[:] = rng.integers(0, 5, size=ledger._free_t.shape) * np.array([[2.0], [0.5], [8.0]])
    ledger.load[:] = rng.integers(0, 3, size=nodes) / 2  # many ties for the least-loaded node
    return snap, ledger


@pytest.mark.parametrize("pooled", [False, True])
def test_fits_on_agrees_with_fits_mask_and_load_balance_with_its_full_scan(pooled):
    from mlsched.policies.placement.heuristics import _pick

    rng = np.random.default_rng(11)
    demands = [catalog.MODELS[m].demand(r) for m in ("resnet-50", "dssm") for r in ("ps", "worker")]
    for _ in range(200):
        snap, ledger = _random_packer(rng, int(rng.integers(1, 9)), pooled)
        j = snap.jobs[0]
        for demand in demands:
            mask = ledger.fits_mask(demand, j)
            assert [ledger.fits_on(demand, n, j) for n in range(len(mask))] == mask.tolist()
            assert LB.choose_node(ledger, j, "worker", demand) == _pick(ledger, j, "worker", demand, ledger.load)


def test_a_resource_a_task_does_not_use_never_blocks_it():
    snap = make_snapshot([job("x", model="dssm")], nodes=2)  # dssm workers need no GPU
    ledger = Ledger(snap, LB)
    ledger._free_t[1, :] = -1.0  # both nodes overcommitted in GPUs
    demand = catalog.MODELS["dssm"].demand("worker")
    assert ledger.fits_mask(demand).tolist() == [True, True] and ledger.fits_on(demand, 1)
    assert not ledger.fits_on(catalog.MODELS["resnet-50"].demand("worker"), 1)

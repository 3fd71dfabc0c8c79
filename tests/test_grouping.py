"""Grouping (Harmony co-location): the performance model, the algorithm, the policies' plans,
the simulator's accounting and the CLI flag (docs/grouping.md)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mlsched.cluster.types import WAITING_POOL, PoolPlan, Snapshot
from mlsched.policies import registry
from mlsched.policies.grouping import algorithm, local_search
from mlsched.policies.grouping.harmony import Harmony, HarmonyConfig
from mlsched.policies.grouping.model import group_time, imbalance, utilisation
from mlsched.policies.grouping.partitions import isolated, naive
from mlsched.policies.grouping.profiles import profile_table
from mlsched.sim.colocation import PhasedJob, colocation_factors
from mlsched.sim.simulator import SimConfig, Simulator
from mlsched.workloads import catalog, interference
from mlsched.workloads.traces import TraceJob
from tests.conftest import job

GPU_WORKER = np.array([2.0, 1.0, 8.0])
NODE = np.array([[4.0, 1.0, 96.0]])


def snap(jobs, nodes=8, node_pools=None, shares=None, time_s=0.0):
    cap = np.tile([4.0, 1.0, 96.0], (nodes, 1))
    return Snapshot(time_s, 1200.0, [f"n{i}" for i in range(nodes)], cap, jobs, node_pools, shares)


# ---- the performance model, by hand ----------------------------------------------------
def test_group_model_hand_computed():
    # complementary: Σc = 1+3 = 4, Σn = 3+1 = 4, slowest 4 -> T = 4, both resources full
    assert group_time(4.0, 4.0, 4.0) == 4.0
    u_c, u_n = utilisation(4.0, 4.0, 4.0)
    assert (u_c, u_n) == (1.0, 1.0) and imbalance(4.0, 4.0, 4.0) == 0.0
    # two compute-heavy jobs: Σc = 4 dominates
    assert group_time(4.0, 2.0, 3.0) == 4.0
    assert imbalance(4.0, 2.0, 3.0) == pytest.approx(2 - 1 - 0.5)
    # job-bound: one slow member
    assert group_time(2.0, 2.0, 10.0) == 10.0


def test_colocation_factors_per_node_match_the_paper_when_jobs_fill_the_node():
    a = PhasedJob(4.0, 1.0, 3.0, (0,), (0,), GPU_WORKER)
    b = PhasedJob(4.0, 3.0, 1.0, (0,), (0,), GPU_WORKER)
    assert colocation_factors({"a": a, "b": b}, NODE) == {"a": 1.0, "b": 1.0}
    c = PhasedJob(3.0, 2.0, 1.0, (0,), (0,), GPU_WORKER)
    d = PhasedJob(3.0, 2.0, 1.0, (0,), (0,), GPU_WORKER)
    f = colocation_factors({"c": c, "d": d}, NODE)
    assert f["c"] == pytest.approx(3.0 / 4.0) and f["d"] == pytest.approx(0.75)  # T = Σc = 4
    # a CPU-only worker holds half a 4-CPU node: two of them compute side by side
    cpu = np.array([2.0, 0.0, 6.0])
    e = PhasedJob(3.0, 2.0, 1.0, (0,), (0,), cpu)
    g = PhasedJob(3.0, 2.0, 1.0, (0,), (0,), cpu)
    assert colocation_factors({"e": e, "g": g}, NODE) == {"e": 1.0, "g": 1.0}


def test_coordinated_co_members_are_not_charged_interference_twice():
    placements = {"a": ("cnn-text-classification", [0, 0]), "b": ("resnext-110", [0, 0])}
    plain = interference.job_speed_factors(placements)
    assert plain["b"] < 0.9  # CTC hurts ResNeXt when they contend freely
    grouped = interference.job_speed_factors(placements, {"a": "g0", "b": "g0"})
    assert grouped == {"a": 1.0, "b": 1.0}
    # a job of another group on the node still interferes
    placements["c"] = ("cnn-text-classification", [0])
    mixed = interference.job_speed_factors(placements, {"a": "g0", "b": "g0", "c": "g1"})
    assert mixed["b"] < 1.0


def _two_job_sim(coordinated: bool):
    trace = [TraceJob("a", 0.0, "dssm", 1e6), TraceJob("b", 0.0, "seq2seq", 1e6)]
    sim = Simulator(trace, SimConfig(nodes=1, node_cpus=4, node_gpus=1, node_mem_gib=96, admission="interval"))
    plan = PoolPlan({"a": "g0", "b": "g0"}, ("g0",), {"g0": 2}, coordinated=coordinated)
    from mlsched.cluster.types import Decision, JobDecision
    sim.plan = plan
    sim._apply(Decision({"a": JobDecision([0], [0]), "b": JobDecision([0], [0])}, pools=plan), 1200, False)
    return sim


def test_simulator_charges_a_coordinated_group_once_and_a_naive_one_both_ways():
    from mlsched.workloads.speed_models import epochs_per_s
    sim = _two_job_sim(True)
    rates = sim._rates()
    phased = {n: sim.pace.phased(sim.states[n]) for n in ("a", "b")}
    coloc = colocation_factors(phased, sim.capacity)
    for n, model in (("a", "dssm"), ("b", "seq2seq")):
        assert rates[n] == pytest.approx(epochs_per_s(sim.speed, model, "ps", 1, 1, 1) * coloc[n])
    naive_rates = _two_job_sim(False)._rates()
    assert all(naive_rates[n] < rates[n] for n in rates)  # uncoordinated: interference on top


# ---- the algorithm ----------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(5))
def test_swaps_never_raise_imbalance_and_keep_every_job_once(seed):
    rng = np.random.default_rng(seed)
    c, n = rng.uniform(0.1, 2.0, 40), rng.uniform(0.1, 2.0, 40)
    order = np.argsort(-(c + n))
    groups = algorithm.fill(order, 10, c, n)
    before = algorithm.total_imbalance(groups, c, n)
    made = algorithm.swap(groups, c, n)
    after = algorithm.total_imbalance(groups, c, n)
    assert after <= before + 1e-9
    if made:
        assert after < before
    assert sorted(j for g in groups for j in g) == list(range(40))
    # one more pass finds nothing left to swap that helps
    assert algorithm.total_imbalance(groups, c, n) <= after + 1e-12


def test_each_swap_step_lowers_imbalance():
    rng = np.random.default_rng(3)
    c, n = rng.uniform(0.1, 2.0, 24), rng.uniform(0.1, 2.0, 24)
    groups = algorithm.fill(np.argsort(-(c + n)), 6, c, n)
    last = algorithm.total_imbalance(groups, c, n)
    while algorithm.swap(groups, c, n, max_swaps=1):
        now = algorithm.total_imbalance(groups, c, n)
        assert now < last
        last = now


def _throughput(groups, machines, C, N, max_dop=16):
    return algorithm.score(groups, C, N, algorithm.dop_of(np.asarray(machines), max_dop), machines,
                           "throughput", 0.7, 0.0)


@pytest.mark.parametrize("seed", range(4))
def test_local_search_never_lowers_the_score_and_keeps_a_valid_grouping(seed):
    rng = np.random.default_rng(seed)
    models = rng.choice(catalog.MODEL_NAMES, 24)
    jobs = [job(f"j{i}", str(m)) for i, m in enumerate(models)]
    C, N = profile_table(jobs, 16)
    groups = algorithm.fill(np.arange(24), 8, C[:, 3], N[:, 3])
    machines = algorithm.allocate_machines(groups, C, N, 30, 16)
    before = _throughput(groups, machines, C, N)
    new_groups, new_machines = local_search.improve(groups, machines, C, N, 30, 16, k_max=4)
    assert _throughput(new_groups, new_machines, C, N) >= before - 1e-12
    assert sorted(j for g in new_groups for j in g) == list(range(24))
    assert all(1 <= len(g) <= 4 for g in new_groups)
    assert new_machines.min() >= 1 and new_machines.sum() <= 30


def test_local_search_finds_the_exhaustive_best_on_a_small_instance():
    from bench.bench_grouping import best_split, partitions
    models = ["dssm", "dssm", "cnn-text-classification", "cnn-text-classification", "wlm", "resnet-50"]
    jobs = [job(f"j{i}", m) for i, m in enumerate(models)]
    C, N = profile_table(jobs, 16)
    curves = local_search.Curves(C, N, 16)
    best = max(best_split([curves.of(g) for g in p], 6) for p in partitions(list(range(6))) if len(p) <= 6) / 6
    singletons = [[i] for i in range(6)]  # the start harmony's step 1 picks here: no sharing
    assert _throughput(singletons, np.ones(6, int), C, N) < 0.95 * best
    groups, machines = local_search.improve(singletons, np.ones(6, int), C, N, 6, 16, k_max=8)
    assert _throughput(groups, machines, C, N) == pytest.approx(best, rel=1e-9)
    # and harmony returns that plan, machines included
    plan = Harmony().group(snap(jobs, nodes=6))
    mine: dict = {}
    for i, j in enumerate(jobs):
        mine.setdefault(plan.job_pools[j.name], []).append(i)
    counts = [sum(p == name for p in plan.node_pools) for name in mine]
    assert _throughput(list(mine.values()), np.array(counts), C, N) == pytest.approx(best, rel=1e-9)


def test_machine_allocation_uses_at_most_the_machines_and_gives_each_group_one():
    jobs = [job(f"j{i}", m) for i, m in enumerate(["dssm", "seq2seq", "resnet-50", "wlm"])]
    C, N = profile_table(jobs, 16)
    machines = algorithm.allocate_machines([[0, 1], [2, 3]], C, N, 10, 16)
    assert machines.min() >= 1 and machines.sum() <= 10


def test_profiles_follow_measured_phases():
    base = job("a", "dssm")
    C, N = profile_table([base], 4)
    seen = job("a", "dssm", ps=2, workers=2, phase_s=(2 * C[0, 2], N[0, 2]))
    C2, N2 = profile_table([seen], 4)
    assert C2[0, 3] == pytest.approx(2 * C[0, 3]) and N2[0, 3] == pytest.approx(N[0, 3])


# ---- the policies' plans ----------------------------------------------------------------
def _check_plan(plan: PoolPlan, s: Snapshot):
    assert set(plan.job_pools) == {j.name for j in s.jobs}  # every job exactly once
    assert len(plan.node_pools) == len(s.node_names)  # every node in at most one pool
    pools = {p for p in plan.node_pools if p is not None}
    for name, pool in plan.job_pools.items():
        assert pool == WAITING_POOL or pool in pools
    members = {}
    for pool in plan.job_pools.values():
        members[pool] = members.get(pool, 0) + 1
    for pool, share in plan.shares.items():
        assert members.get(pool, 0) <= share


@pytest.mark.parametrize("grouping", [Harmony(), isolated(), naive()])
def test_every_job_and_node_in_exactly_one_pool(grouping):
    rng = np.random.default_rng(0)
    jobs = [job(f"j{i}", str(m)) for i, m in enumerate(rng.choice(catalog.MODEL_NAMES, 20))]
    s = snap(jobs, nodes=12)
    _check_plan(grouping.group(s), s)


def test_isolated_gives_dedicated_nodes_and_makes_the_rest_wait():
    s = snap([job(f"j{i}") for i in range(10)], nodes=8)
    plan = isolated().group(s)
    running = [p for p in plan.job_pools.values() if p != WAITING_POOL]
    assert len(running) == len(set(running)) == 8
    assert list(plan.job_pools.values())[8:] == [WAITING_POOL, WAITING_POOL]


def _grouped_state(threshold: float, time_s: float, min_pool_s: float = 0.0):
    """Four jobs in two poorly matched pools of two, and one newcomer (a trigger)."""
    models = ["dssm", "dssm", "seq2seq", "seq2seq", "resnext-110"]
    pools = ["g0", "g0", "g1", "g1", None]
    jobs = [job(f"j{i}", m, ps=1, workers=1, ps_nodes=(i % 2 + 2 * (p == "g1"),), worker_nodes=(i % 2 + 2 * (p == "g1"),),
                pool=p, pool_since_s=0.0 if p else None)
            for i, (m, p) in enumerate(zip(models, pools))]
    s = snap(jobs, nodes=4, node_pools=["g0", "g0", "g1", "g1"], shares={"g0": 2, "g1": 2}, time_s=time_s)
    return Harmony(HarmonyConfig(threshold=threshold, min_pool_s=min_pool_s)).group(s), s


def test_regroups_only_when_the_gain_beats_the_threshold():
    keep, s = _grouped_state(threshold=1e9, time_s=5000.0)
    assert not keep.regrouped and keep.moved == ()
    assert [keep.job_pools[f"j{i}"] for i in range(4)] == ["g0", "g0", "g1", "g1"]
    _check_plan(keep, s)
    fresh, _ = _grouped_state(threshold=-1.0, time_s=5000.0)
    assert fresh.regrouped and fresh.predicted_gain > -1.0
    # the two same-model pairs are not kept together: dssm (compute) goes with seq2seq (comm)
    assert fresh.job_pools["j0"] != fresh.job_pools["j1"] or fresh.job_pools["j2"] != fresh.job_pools["j3"]


def test_minimum_time_in_pool_blocks_moves():
    plan, _ = _grouped_state(threshold=-1.0, time_s=100.0, min_pool_s=1200.0)
    assert not plan.regrouped and plan.moved == ()


def test_no_trigger_no_regroup():
    plan, s = _grouped_state(threshold=-1.0, time_s=5000.0)
    jobs = [j for j in s.jobs if j.pool is not None]  # no newcomer, no empty pool
    quiet = Harmony(HarmonyConfig(threshold=-1.0, min_pool_s=0.0)).group(
        snap(jobs, nodes=4, node_pools=list(s.node_pools), shares=s.pool_shares, time_s=5000.0))
    assert not quiet.regrouped
    assert [quiet.job_pools[j.name] for j in jobs] == ["g0", "g0", "g1", "g1"]


def test_grouping_400_jobs_on_500_nodes_gives_a_valid_plan():
    # How long this takes is measured by bench/bench_grouping.py (its third part, 8,000 jobs
    # on 10,000 nodes, as ratios in one run), not here: a wall-clock assert in a unit test
    # measures the machine. This checks the plan at a scale where every search step runs.
    rng = np.random.default_rng(0)
    jobs = [job(f"j{i}", str(m), arrival=float(i)) for i, m in enumerate(rng.choice(catalog.MODEL_NAMES, 400))]
    plan = Harmony().group(snap(jobs, nodes=500))
    _check_plan(plan, snap(jobs, nodes=500))


# ---- the simulator and the CLI -----------------------------------------------------------
def _trace():
    return [TraceJob(f"t{i}", 0.0, m, 30.0) for i, m in enumerate(["dssm", "seq2seq", "resnext-110", "wlm"])]


@pytest.mark.parametrize("name", ["isolated", "naive", "harmony"])
def test_each_grouping_runs_with_drf_to_completion(name):
    cfg = SimConfig(nodes=4, node_cpus=4, node_gpus=1, node_mem_gib=96)
    r = Simulator(_trace(), cfg).run(registry.make_allocation("drf"), registry.make_placement("load-balance"),
                                     registry.make_grouping(name))
    assert r.completed == 4 and r.compute_util > 0 and r.net_util > 0


def test_moving_a_job_to_another_pool_costs_a_checkpoint_restart():
    from mlsched.cluster.types import Decision, JobDecision
    sim = _two_job_sim(True)
    s = sim.states["a"]
    s.cost_left = 0.0
    plan = PoolPlan({"a": "g1", "b": "g0"}, ("g0",), {"g0": 2, "g1": 1}, coordinated=True)
    sim.plan = plan
    sim._apply(Decision({"a": JobDecision([0], [0]), "b": JobDecision([0], [0])}, pools=plan), 1200, False)
    assert s.cost_left == sim.config.scaling_cost_s and sim.states["b"].cost_left == 0.0


def test_cli_grouping_flag_and_json_field(tmp_path, capsys):
    # In process (a Python start-up each was most of this test's time); that `python -m
    # mlsched.cli simulate --json` prints exactly one JSON value is tests/test_cli.py's.
    from mlsched.cli import main

    trace = tmp_path / "t.csv"
    trace.write_text("name,arrival_s,model,epochs\n" + "".join(
        f"j{i},0,{m},20\n" for i, m in enumerate(["dssm", "seq2seq", "resnext-110", "wlm"])))
    args = ["simulate", "--trace", str(trace), "--nodes", "4",
            "--node-cpus", "4", "--node-gpus", "1", "--node-mem-gib", "96", "--policies", "drf", "--json"]
    assert main(args + ["--grouping", "none,isolated,naive,harmony"]) == 0
    rows = json.loads(capsys.readouterr().out)["results"]
    assert [r["grouping"] for r in rows] == ["none", "isolated", "naive", "harmony"]
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)["results"]
    assert plain[0] == rows[0]  # `none` is exactly the run without grouping


def test_registry_knows_the_groupings():
    for name in ("none", "isolated", "naive", "harmony"):
        assert registry.known("grouping", name)

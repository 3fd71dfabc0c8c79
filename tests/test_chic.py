"""Chic and Chic-Pair: event-driven simulation, the paper's setting, state and masks, the
forced void, ONNX parity, the trainer and the shipped models. Training needs torch: a
missing one is an import error here, never a skip."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import job, make_snapshot
from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import Decision, JobDecision
from mlsched.features import chic_state
from mlsched.features import registry as encoders
from mlsched.features.chic_state import ChicState
from mlsched.policies import registry
from mlsched.policies.allocation.chic import ChicPolicy, OnnxActor
from mlsched.policies.allocation.simple import FIFO
from mlsched.policies.onnx_runner import ModelLoadError, load_model
from mlsched.policies.placement.heuristics import LoadBalance
from mlsched.sim import chic_scenario
from mlsched.sim.simulator import CapacityExceeded, SimConfig, Simulator
from mlsched.workloads.speed_curve import SpeedCurve
from mlsched.workloads.speed_models import epochs_per_s
from mlsched.workloads.traces import TraceJob
from policy_models.chic import export, networks, train

# torch: the training tier (`make test`'s second step; conftest.py keeps the fast tier from
# importing this module).
pytestmark = pytest.mark.training


class RecordingFIFO(FIFO):
    """FIFO that records the time of every round it is asked to decide, once per round: a
    served round (SimConfig.served_round) settles by deciding again at the same time."""

    def __init__(self):
        self.times: list[float] = []

    def allocate(self, snapshot, ledger):
        if not self.times or self.times[-1] != snapshot.time_s:
            self.times.append(snapshot.time_s)
        super().allocate(snapshot, ledger)


def _two_jobs() -> list[TraceJob]:
    return [TraceJob("a", 0.0, "resnet-50", 20.0), TraceJob("b", 100.0, "resnet-50", 20.0)]


# ---- simulator: event-driven rounds, demands --------------------------------------------------
def test_event_driven_rounds_happen_at_arrivals_and_finishes_only():
    fifo = RecordingFIFO()
    sim = Simulator(_two_jobs(), SimConfig(nodes=2, event_driven=True, interval_s=10_000.0))
    result = sim.run(fifo, LoadBalance())
    finishes = sorted(a + j for a, j in zip((0.0, 100.0), (result.jct_s["a"], result.jct_s["b"])))
    assert fifo.times[0] == 0.0 and fifo.times[1] == pytest.approx(100.0)  # b's arrival triggers a round
    assert fifo.times[2] == pytest.approx(finishes[0])  # then the first finish, nothing in between
    assert len(fifo.times) == 3 and result.completed == 2


def test_an_arrival_at_or_above_the_trigger_waits_for_the_next_event():
    fifo = RecordingFIFO()
    sim = Simulator(_two_jobs(), SimConfig(nodes=2, event_driven=True, arrival_trigger_below=1,
                                           interval_s=10_000.0))
    result = sim.run(fifo, LoadBalance())
    assert fifo.times[1] == pytest.approx(result.jct_s["a"])  # b waited for a's finish
    assert result.jct_s["b"] > result.jct_s["a"] - 100.0


def test_interval_mode_decides_at_slot_starts_only():
    fifo = RecordingFIFO()
    Simulator(_two_jobs(), SimConfig(nodes=2, admission="interval")).run(fifo, LoadBalance())
    assert all(t % 1200.0 == 0 for t in fifo.times)


def test_paper_demands_reach_the_job_views_and_the_capacity_check():
    trace = chic_scenario.trace(1.8, seed=3, jobs=5)
    sim = Simulator(trace, chic_scenario.config(3))
    snap = sim.snapshot()
    vgg = TraceJob("v", 0.0, "vgg-16", 10.0)
    assert all(tuple(j.ps_demand) == chic_scenario.PAPER_DEMANDS[j.model][0] for j in snap.jobs)
    assert snap.total_capacity.tolist() == [120.0, 10.0, 600.0] and len(snap.node_names) == 1
    sim = Simulator([vgg], chic_scenario.config(0))
    with pytest.raises(CapacityExceeded):  # 30 PS x 4 CPU + 2 CPU > 120: only Chic's demands exceed it
        sim.advance(Decision({"v": JobDecision(ps_nodes=[0] * 30, worker_nodes=[0])}))


def test_the_pair_bound_is_each_jobs_best_allocation_with_as_many_ps_as_workers():
    """bench_chic's pair-ideal column: what a policy that only adds worker-PS pairs can reach."""
    vgg = TraceJob("v", 0.0, "vgg-16", 10.0)
    sim = Simulator([vgg], chic_scenario.config(0))
    cfg, cap = sim.config, np.array([120.0, 10.0, 600.0])
    fits = [k for k in range(1, cfg.max_workers + 1)
            if np.all(k * (np.array(cfg.demand("vgg-16", "ps")) + cfg.demand("vgg-16", "worker")) <= cap)]
    best_pair = max(epochs_per_s(sim.speed, "vgg-16", "ps", k, k) for k in fits)
    assert sim.ideal_time(vgg, pairs=True) == pytest.approx(10.0 / best_pair)
    # VGG-16 runs fastest with many more PS than workers: pairs cannot get there.
    assert sim.ideal_time(vgg, pairs=True) > 1.5 * sim.ideal_time(vgg)


def test_chic_traces_are_seeded_and_sized_as_the_paper():
    a, b = chic_scenario.trace(2.7, 11), chic_scenario.trace(2.7, 11)
    assert a == b and len(a) == 30 and a[0].arrival_s == 0.0
    assert {j.model for j in a} <= set(chic_scenario.MODELS)
    assert not set(chic_scenario.CHIC_TEST_SEEDS) & {train.Args().train_seed_base, train.Args().val_seed_base}


# ---- state, masks, forced void --------------------------------------------------------------------
def _state(jobs, pair=False, nodes=1, **snap):
    snapshot = make_snapshot(jobs, nodes=nodes, **snap)
    ledger = Ledger(snapshot, LoadBalance())
    window, backlog = chic_state.first_jobs(snapshot.jobs, 3)
    return ChicState(snapshot, ledger, window, 3, pair, backlog), ledger


def test_layout_masks_and_backlog():
    jobs = [job(f"j{i}", arrival=float(i)) for i in range(5)]
    state, _ = _state(jobs, cpu=120, gpu=10, mem=600)
    assert state.vector.shape == (chic_state.state_dim(3),) and state.void == 6
    assert [j.name for j in state.jobs] == ["j0", "j1", "j2"]
    assert state.vector[-2] == pytest.approx(2 / 3)  # backlog N = 2, over I
    assert not state.mask()[6]  # nobody holds a task yet: stopping is masked
    state2, _ = _state(jobs[:1], cpu=120, gpu=10, mem=600)
    assert state2.mask().tolist() == [True, True, False, False, False, False, False]  # empty slots


def test_a_first_grant_is_the_gang_and_then_each_action_adds_its_role():
    state, ledger = _state([job("a")], cpu=120, gpu=10, mem=600)
    assert state.apply(1)  # "+PS" on a job holding nothing: its starting gang
    assert state.counts(0) == (1, 1) and state.mask()[state.void]
    assert state.apply(0) and state.counts(0) == (1, 2)
    assert state.apply(1) and state.counts(0) == (2, 2)
    pair, _ = _state([job("a")], pair=True, cpu=120, gpu=10, mem=600)
    assert pair.void == 3 and pair.apply(0) and pair.apply(0) and pair.counts(0) == (2, 2)


def test_allreduce_jobs_have_no_ps_action():
    state, _ = _state([job("r", arch="allreduce")], cpu=120, gpu=10, mem=600)
    state.apply(0)
    assert state.mask()[0] and not state.mask()[1]


def test_forced_void_when_the_cluster_is_full():
    state, _ = _state([job("a")], cpu=4, gpu=1, mem=48)  # room for exactly the gang
    assert not state.forced_void()
    assert state.apply(0)
    assert not state.mask()[:state.void].any() and state.forced_void()


def test_forced_void_when_no_task_speeds_any_job_up():
    slower = SpeedCurve(theta=(0.0, 1.0, 0.0, 1.0, 1.0, 0.0), global_batch=32, steps_per_epoch=10)  # more tasks, slower
    state, _ = _state([job("a", prior=slower)], cpu=120, gpu=10, mem=600)
    assert not state.forced_void()  # it holds nothing: starting it is a gain
    state.apply(0)
    assert not state.mask()[:2].any() and state.forced_void()
    both, _ = _state([job("a", prior=slower), job("b", arrival=1.0)], cpu=120, gpu=10, mem=600)
    both.apply(0)
    assert not both.mask()[6]  # b could start: stopping is masked
    both.apply(2)
    assert not both.mask()[:2].any() and both.mask()[2:4].any() and not both.forced_void()


def test_policy_serves_only_the_first_jobs_and_stops_in_s_prime():
    class AlwaysFirstJobWorker:
        def act(self, state, mask):
            return int(np.flatnonzero(mask)[0])

    jobs = [job(f"j{i}", arrival=float(i)) for i in range(5)]
    snapshot = make_snapshot(jobs, nodes=1, cpu=120, gpu=10, mem=600)
    ledger = Ledger(snapshot, LoadBalance())
    ChicPolicy(AlwaysFirstJobWorker()).allocate(snapshot, ledger)
    assert set(ledger.jobs) <= {"j0", "j1", "j2"} and ledger.has_tasks(jobs[0])


def test_episode_return_is_minus_the_total_jct_in_20_minute_units():
    assert chic_state.episode_return([1200.0, 2400.0]) == pytest.approx(-3.0)


# ---- network, export, parity ---------------------------------------------------------------------
@pytest.mark.parametrize("pair", [False, True])
def test_torch_numpy_and_onnx_runtime_agree_masks_included(pair, tmp_path):
    torch.manual_seed(0)
    net = networks.ChicNet(3, pair).eval()
    name = "chic-pair" if pair else "chic"
    path = tmp_path / f"{name}.onnx"
    export.export(net, name, 3, pair, path, training={}, validation={})
    model = load_model(path, algorithm=name, phase="allocation")
    rng = np.random.default_rng(0)
    states = rng.normal(size=(16, chic_state.state_dim(3))).astype(np.float32)
    masks = (rng.random((16, chic_state.n_actions(3, pair))) < 0.6).astype(np.float32)
    masks[:, -1] = 1.0
    got = model.run({"state": states, "mask": masks})["probs"]
    with torch.no_grad():
        want = networks.ProbabilityModule(net)(torch.from_numpy(states), torch.from_numpy(masks)).numpy()
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert (got[masks == 0] == 0).all()
    numpy_probs = np.array([networks.NumpyPolicy(net).probabilities(s, m > 0) for s, m in zip(states, masks)])
    np.testing.assert_allclose(numpy_probs, want, atol=1e-5)
    with pytest.raises(ModelLoadError, match="not the allocation model of 'chic-pair'" if not pair else "chic"):
        load_model(path, algorithm="chic" if pair else "chic-pair", phase="allocation")


def test_trainer_runs_cem_and_writes_a_servable_model(tmp_path):
    args = train.Args(out=str(tmp_path), episodes_per_iteration=3, iterations=2, val_sequences=1,
                      jobs_per_episode=6, time_budget_min=5, warm_start_sequences=2, warm_start_dl2_traces=1,
                      warm_start_epochs=2)
    result = train.train(args, log=lambda *_: None, argv=["--test"])
    card = json.loads((tmp_path / "chic.card.json").read_text())
    assert card["encoder"] == {"name": "chic-state", "version": chic_state.ENCODER_VERSION,
                               "params": {"jobs": 3, "pair": False}}
    assert card["training"]["warm_start"]["teacher"] == "gain" and card["training"]["warm_start"]["pairs"] > 0
    assert card["training"]["iterations"] == 2 and (tmp_path / "learning-curve.png").stat().st_size > 0
    assert [p["iteration"] for p in result["curve"]] == [1, 2] and "val_act_s" in result["curve"][1]
    policy = ChicPolicy.load(str(tmp_path / "chic.onnx"))
    assert isinstance(policy.actor, OnnxActor)


# ---- the shipped models ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["chic", "chic-pair"])
def test_the_shipped_models_load_and_schedule_the_papers_setting(name):
    assert encoders.get("chic-state").version == chic_state.ENCODER_VERSION
    assert registry.is_learned("allocation", name)
    policy = registry.make_allocation(name)
    sim = Simulator(chic_scenario.trace(2.7, seed=77, jobs=12), chic_scenario.config(77))
    seen = []
    original = policy.allocate

    def watched(snapshot, ledger):
        original(snapshot, ledger)
        first = {j.name for j in chic_state.first_jobs(snapshot.jobs, 3)[0]}
        seen.append(set(ledger.jobs) <= first and (not snapshot.jobs or any(map(ledger.has_tasks, snapshot.jobs))))

    policy.allocate = watched
    result = sim.run(policy, registry.make_placement("load-balance"))
    assert result.completed == 12 and all(seen)
    assert result.summary()["avg_jct_s"] < 4 * result.summary()["ideal_avg_jct_s"]


def test_greedy_decision_stops_only_on_a_majority_for_stopping():
    from mlsched.policies.allocation.chic import greedy_decision

    mask = np.array([True, True, True, False, False, False, True])
    probs = np.array([0.2, 0.15, 0.25, 0.0, 0.0, 0.0, 0.4])  # ∅ is the argmax but continuing is likelier
    assert greedy_decision(probs, mask, 6) == 2
    assert greedy_decision(np.array([0.1, 0.1, 0.1, 0, 0, 0, 0.7]), mask, 6) == 6
    only_stop = np.array([False] * 6 + [True])
    assert greedy_decision(np.array([0, 0, 0, 0, 0, 0, 1.0]), only_stop, 6) == 6


def test_served_sampling_is_deterministic_per_snapshot_and_capacity_safe(tmp_path):
    from mlsched.policies.round import run_round

    torch.manual_seed(3)
    path = tmp_path / "chic.onnx"
    export.export(networks.ChicNet(3, False).eval(), "chic", 3, False, path, training={}, validation={})
    policy = ChicPolicy.load(str(path))
    jobs = [job(f"j{i}", arrival=float(i), model=m) for i, m in enumerate(chic_scenario.MODELS * 2)]
    snapshot = make_snapshot(jobs, nodes=1, cpu=120, gpu=10, mem=600)
    decisions = [run_round(snapshot, policy, LoadBalance()) for _ in range(3)]
    counts = [{n: d.counts(n) for n in d.jobs} for d in decisions]
    assert counts[0] == counts[1] == counts[2] and set(counts[0]) <= {"j0", "j1", "j2"}
    assert all(c[0] >= 1 and c[1] >= 1 for c in counts[0].values()) and len(counts[0]) == 3  # all started


def test_gain_actor_starts_every_window_job_then_takes_the_largest_speed_up():
    from mlsched.policies.allocation.chic import GainActor

    jobs = [job("a", model="vgg-16"), job("b", model="resnext-110", arrival=1.0)]
    state, ledger = _state(jobs, cpu=120, gpu=10, mem=600)
    first = GainActor().act(state, state.mask())
    state.apply(first)
    state.apply(GainActor().act(state, state.mask()))
    assert ledger.has_tasks(jobs[0]) and ledger.has_tasks(jobs[1])
    rows = state.vector[:3 * chic_state.JOB_FEATURES].reshape(3, -1)
    a = GainActor().act(state, state.mask())
    i, kind = divmod(a, 2)
    gains = [rows[j, chic_state.GAIN_WORKER + k] for j in range(2) for k in range(2) if state.mask()[2 * j + k]]
    assert rows[i, chic_state.GAIN_WORKER + kind] == max(gains) > 0


def _vgg(**kw):
    ps, worker = chic_scenario.PAPER_DEMANDS["vgg-16"]
    return job("v", model="vgg-16", ps_demand=np.array(ps), worker_demand=np.array(worker), max_ps=32,
               max_workers=10, **kw)


def test_a_job_is_grown_through_a_dip_of_its_curve_to_the_best_allocation_that_fits():
    """VGG-16's measured speed is 1.96x its 1 PS + 1 worker speed at 4 PS, 1.86x at 5 and
    2.98x at 14 (one worker). One step of lookahead stopped it at 4 PS; the round now takes it
    through the dip to its best speed, but for steps worth less than 1 % per task."""
    from mlsched.policies.allocation.chic import GainActor

    v = _vgg()
    curve = v.prior
    best = max(curve.epochs_per_s(p, w) for p in range(1, 33) for w in range(1, 11))
    assert curve.epochs_per_s(5, 1) < curve.epochs_per_s(4, 1) < 0.7 * best  # the dip this is about
    snapshot = make_snapshot([v], nodes=1, cpu=120, gpu=10, mem=600)
    ledger = Ledger(snapshot, LoadBalance())
    ChicPolicy(GainActor()).allocate(snapshot, ledger)
    d = ledger.jobs["v"]
    assert curve.epochs_per_s(d.ps, d.workers) >= (1 - chic_state.MIN_GAIN_PER_TASK) * best


def test_a_dip_is_not_entered_when_nothing_better_beyond_it_fits():
    """With room for 5 PS and a worker (22 CPU) the best reachable allocation is 4 PS (5 PS is
    slower than 4): the fifth PS, a slowdown with nothing better behind it, stays masked."""
    v = _vgg()
    state, ledger = _state([v], cpu=22, gpu=10, mem=600)
    assert state.apply(1)  # the gang: 1 PS + 1 worker
    while state.mask()[1]:
        assert state.apply(1)
    assert state.counts(0) == (4, 1) and state.forced_void()
    rows = state.vector[:3 * chic_state.JOB_FEATURES].reshape(3, -1)
    assert rows[0, chic_state.GAIN_PS] <= 0


def test_a_long_way_through_a_dip_for_a_few_per_cent_is_not_taken():
    """Lookahead counts per added task: 11 more PS for 3 % more speed (0.3 % a task) is below
    MIN_GAIN_PER_TASK, so the job keeps its 2 PS and leaves the CPUs to others (on the
    CPU-bound DL² clusters, jobs pushed to such configurations starved the rest)."""
    from mlsched.policies.allocation.chic import GainActor

    tables = []  # kept alive: curves cache per-shape answers by their table's identity

    def decided(best_beyond_the_dip: float) -> tuple[int, int]:
        table = np.zeros((17, 3))
        tables.append(table)
        table[1:, 1:] = 1.4
        table[1, 1:], table[2, 1:], table[13:, 1:] = 1.0, 1.5, best_beyond_the_dip
        curve = SpeedCurve(theta=(0.0, 1.0, 0.0, 0.0, 0.0, 0.0), global_batch=32, steps_per_epoch=1.0,
                           table=table)
        snapshot = make_snapshot([job("a", prior=curve, max_ps=16, max_workers=2)], nodes=1, cpu=120, gpu=10,
                                 mem=600)
        ledger = Ledger(snapshot, LoadBalance())
        ChicPolicy(GainActor()).allocate(snapshot, ledger)
        return ledger.jobs["a"].ps, ledger.jobs["a"].workers

    assert decided(1.545) == (2, 1)
    assert decided(2.0)[0] >= 13  # 33 % more over 11 tasks (3 % a task): worth it


def test_the_shipped_window_5_model_serves_five_jobs_from_its_path():
    """policy_models/artifacts/chic/chic-window5.onnx (I = 5, docs/chic.md): mounted beside the
    default model, named by path in a SchedulingPolicy; its window comes from its card."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "policy_models" / "artifacts" / "chic" / "chic-window5.onnx"
    policy = ChicPolicy.load(str(path))
    assert policy.jobs == 5 and policy.card.algorithm == "chic"
    sim = Simulator(chic_scenario.trace(2.7, seed=78, jobs=12), chic_scenario.config(78, window=5))
    result = sim.run(policy, registry.make_placement("load-balance"))
    assert result.completed == 12 and result.summary()["avg_jct_s"] < 2 * result.summary()["ideal_avg_jct_s"]

"""Harmony placement (issue 15): tokens, the network and its ONNX export with symbolic job and
node counts, serving through the registry, the trainer, the reward model. Training needs
torch (the `train` extra, installed by `make dev`)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import JobView, Snapshot
from mlsched.features import harmony_state
from mlsched.policies import registry
from mlsched.policies.onnx_runner import ModelLoadError, load_model
from mlsched.policies.placement.harmony import HarmonyPlacement
from mlsched.policies.placement.heuristics import FirstFit
from mlsched.policies.placement.sticky import Sticky
from mlsched.policies.round import run_round
from mlsched.sim import scenarios
from mlsched.sim.simulator import SimConfig, Simulator
from policy_models.harmony import export, networks, reward_model
from policy_models.harmony import train as harmony_train

# torch: the training tier (`make test`'s second step; conftest.py keeps the fast tier from
# importing this module).
pytestmark = pytest.mark.training


def _snapshot(nodes: int = 4) -> Snapshot:
    jobs = [JobView("a", "resnet-50", "ps", 0.0, 10.0, ps=1, workers=2, ps_nodes=(0,), worker_nodes=(0, 1)),
            JobView("b", "vgg-16", "allreduce", 5.0, 10.0, min_ps=0, requested_workers=3),
            JobView("c", "my-own-bert", "ps", 6.0, 10.0, worker_demand=np.array([2.0, 1.0, 8.0]),
                    ps_demand=np.array([1.0, 0.0, 4.0]))]
    cap = np.tile([8.0, 2.0, 48.0], (nodes, 1))
    return Snapshot(0.0, 1200.0, [f"n{i}" for i in range(nodes)], cap, jobs)


def _ledger_with_a_held(snap: Snapshot) -> Ledger:
    ledger = Ledger(snap, FirstFit())
    a = snap.jobs[0]
    ledger.book(a, "ps", 0)
    ledger.book(a, "worker", 0)
    ledger.book(a, "worker", 1)
    return ledger


def test_tokens_describe_jobs_and_nodes_for_the_task_being_placed():
    snap = _snapshot()
    ledger = _ledger_with_a_held(snap)
    b = snap.jobs[1]
    mask = ledger.fits_mask(b.worker_demand, b)
    feeds = harmony_state.encode(ledger, b, "worker", mask)
    jobs, nodes = feeds["jobs"][0], feeds["nodes"][0]
    assert jobs.shape == (3, harmony_state.JOB_FEATURES) and nodes.shape == (4, harmony_state.NODE_FEATURES)
    assert feeds["current"][0].tolist() == [0.0, 1.0, 0.0] and feeds["role"][0, 0] == 0.0
    k = harmony_state.N_MODELS
    assert jobs[1, k] == 1.0 and jobs[0, k] == 0.0  # all-reduce flag
    assert jobs[2, k - 1] == 1.0  # a model the catalog lacks is "other"
    assert jobs[0, k + 9] == pytest.approx(2 / 8) and jobs[0, k + 10] == pytest.approx(1 / 4)  # placed
    assert jobs[1, k + 11] == 1.0 and jobs[0, k + 11] == 0.0  # new
    # Node 0 holds resnet-50's PS and a worker: two tasks of another job, by model.
    slot = harmony_state.model_slot("resnet-50")
    assert nodes[0, 4 + slot] == pytest.approx(0.5) and nodes[1, 4 + slot] == pytest.approx(0.25)
    assert nodes[2, 4:4 + k].sum() == 0 and nodes[0, 4 + k + 2] == pytest.approx(2 / 8)
    assert nodes[1, 1] == pytest.approx(0.5)  # one GPU of two used
    # Placing a's own next task: its tasks are the current job's, not co-tenants'.
    feeds = harmony_state.encode(ledger, snap.jobs[0], "ps", mask)
    assert feeds["nodes"][0, 0, 4:4 + k].sum() == 0
    assert feeds["nodes"][0, 0, 4 + k + 1] == pytest.approx(0.25) and feeds["role"][0, 0] == 1.0


def test_onnx_graph_serves_any_number_of_jobs_and_nodes_like_torch(tmp_path):
    torch.manual_seed(0)
    net = networks.HarmonyNet(d=32, heads=4, layers=2).eval()
    path = tmp_path / "harmony.onnx"
    export.export(net, path, {"command": "test"}, {})
    model = load_model(path, "harmony", "placement")
    for jobs, nodes in ((1, 2), (3, 6), (40, 100)):
        feeds = {k: v.numpy() for k, v in zip(export.INPUTS, export.example_inputs(jobs, nodes))}
        feeds["mask"][0, ::3] = 0.0
        got = model.run(feeds)["probs"][0]
        x = [torch.from_numpy(feeds[k]) for k in export.INPUTS]
        with torch.no_grad():
            want = networks.ProbabilityModule(net)(*x)[0].numpy()
            # The graph computes the last layer for the current job only; training's full
            # encoder (every job's output, as the critic reads them) gives the same scores.
            full, _ = net.logits_and_value(*x)
        np.testing.assert_allclose(want, torch.softmax(full, dim=-1)[0].numpy(), atol=1e-6)
        assert got.shape == (nodes,)
        np.testing.assert_allclose(got, want, atol=1e-5)
        assert np.all(got[::3] == 0.0) and got.sum() == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("layers", [0, 1, 2])
def test_weights_come_back_from_the_exported_graph_and_reexport_computes_the_same(tmp_path, layers):
    torch.manual_seed(layers)
    net = networks.HarmonyNet(d=16, heads=2, layers=layers).eval()
    path = tmp_path / "harmony.onnx"
    export.export(net, path, {"command": "test"}, {"avg_jct_over_lif_line": 0.9})
    back = export.state_from_onnx(path)
    policy_keys = [k for k in net.state_dict() if not k.startswith("value_head.")]
    for k in policy_keys:
        torch.testing.assert_close(back.state_dict()[k], net.state_dict()[k], rtol=0, atol=0)
    feeds = {k: v.numpy() for k, v in zip(export.INPUTS, export.example_inputs(6, 9))}
    before = load_model(path, "harmony", "placement").run(feeds)["probs"]
    card = export.reexport(path)
    assert card["validation"] == {"avg_jct_over_lif_line": 0.9} and card["training"]["command"] == "test"
    assert "reexported" in card["training"]
    np.testing.assert_allclose(load_model(path, "harmony", "placement").run(feeds)["probs"], before, atol=1e-6)
    # --init takes an exported graph too (fine-tuning a shipped model; the critic starts afresh).
    assert export.load_state(path).config == net.config


def test_a_card_with_a_fixed_node_count_does_not_load_a_symbolic_graph(tmp_path):
    net = networks.HarmonyNet(d=16, heads=2, layers=1).eval()
    path = tmp_path / "harmony.onnx"
    export.export(net, path, {}, {})
    card_file = tmp_path / "harmony.card.json"
    card = json.loads(card_file.read_text())
    card["outputs"][0]["shape"] = [6]
    card_file.write_text(json.dumps(card))
    with pytest.raises(ModelLoadError, match="not what encoder"):
        load_model(path, "harmony", "placement")


def test_serving_places_every_task_where_it_fits_and_is_deterministic(tmp_path):
    torch.manual_seed(1)
    path = tmp_path / "harmony.onnx"
    export.export(networks.HarmonyNet(d=16, heads=2, layers=1).eval(), path, {}, {})
    results = []
    for _ in range(2):
        sim = Simulator(scenarios.placement_trace(6, 11), SimConfig(nodes=6, seed=11))
        placement = registry.make_placement("harmony", registry.PolicyContext(model_path=str(path),
                                                                              placement_guard=False))
        assert isinstance(placement, Sticky) and placement.card.algorithm == "harmony"
        summary = sim.run(registry.make_allocation("fixed"), placement).summary()  # the simulator checks capacity
        assert summary["completed"] == summary["jobs"] == 24
        assert placement.inner.inferences > 0
        results.append(summary["avg_jct_s"])
    assert results[0] == results[1]


def test_the_choice_is_the_most_probable_node_that_fits():
    snap = _snapshot()
    ledger = _ledger_with_a_held(snap)

    class Fixed:
        def probs(self, feeds):
            return np.array([0.0, 0.9, 0.1, 0.0]) * feeds["mask"][0]

    b = snap.jobs[1]
    assert HarmonyPlacement(Fixed()).choose_node(ledger, b, "worker", b.worker_demand) == 1
    # Node 1 full for GPUs: its probability is masked to 0, the next one is taken.
    ledger.book(b, "worker", 1)
    assert HarmonyPlacement(Fixed()).choose_node(ledger, b, "worker", b.worker_demand) == 2


@pytest.mark.parametrize("name", ["harmony.onnx", "harmony-dl2.onnx"])
def test_shipped_models_load_with_a_card_naming_their_training(name):
    from mlsched.policies.onnx_runner import default_model_path

    path = default_model_path("harmony").with_name(name)
    placement = registry.make_placement("harmony", registry.PolicyContext(model_path=str(path)))
    card = placement.card
    assert card.phase == "placement" and card.encoder_version == harmony_state.ENCODER_VERSION
    assert card.training["simulator_version"] and "avg_jct_over_lif_line" in card.validation
    # It serves a cluster size it was not trained on.
    sim = Simulator(scenarios.placement_trace(9, 21), SimConfig(nodes=9, seed=21))
    summary = sim.run(registry.make_allocation("fixed"), placement).summary()
    assert summary["completed"] == summary["jobs"]


def test_trainer_imitates_then_runs_actor_critic_and_writes_a_servable_model(tmp_path):
    out = tmp_path / "h"
    result = harmony_train.train(harmony_train.parse_args(
        ["--out", str(out), "--d", "16", "--heads", "2", "--layers", "1", "--dagger-rounds", "1",
         "--dagger-episodes", "1", "--ac-episodes", "2", "--validate-every", "1", "--val-traces", "1",
         "--train-nodes", "6", "--val-nodes", "6", "--updates-per-episode", "2"]))
    assert [c["where"] for c in result["curve"]] == ["imitation", "actor-critic 1", "actor-critic 2"]
    assert (out / "learning-curve.png").stat().st_size > 0
    load_model(out / "harmony.onnx", "harmony", "placement")
    assert result["card"]["training"]["labels"] > 0


def test_reward_model_labels_are_the_simulators_speeds():
    trace = [replace(j, arrival_s=0.0) for j in scenarios.placement_trace(6, 3)[:8]]
    sim = Simulator(trace, SimConfig(nodes=6, seed=3))
    decision = run_round(sim.snapshot(), registry.make_allocation("fixed"), registry.make_placement("first-fit"))
    sim._apply(decision, cost_cap=0.0, only_idle=False)
    placed = [s for s in sim.active if s.worker_nodes]
    assert len(placed) >= 2  # first-fit packs several jobs onto shared nodes
    rates = sim._rates()
    jobs = [{"model": s.spec.model, "arch": s.spec.arch, "ps": s.ps_nodes, "workers": s.worker_nodes}
            for s in placed]
    labels = reward_model.true_epochs(sim.speed, jobs)
    np.testing.assert_allclose(labels, [rates[s.spec.name] * reward_model.INTERVAL_S for s in placed], rtol=1e-9)


def test_reward_model_learns_and_drives_a_simulator():
    torch.manual_seed(0)
    net, report = reward_model.train(samples=600, epochs=3, seed=2, warmup=50, d=16)
    assert report["mean_relative_error"] < 0.6  # from ~1.0 for an untrained net
    sim = reward_model.RewardModelSimulator(scenarios.placement_trace(6, 4), SimConfig(nodes=6, seed=4), net)
    summary = sim.run(registry.make_allocation("fixed"), registry.make_placement("load-balance")).summary()
    assert summary["completed"] == summary["jobs"]
    with pytest.raises(ValueError, match="for 6 nodes"):
        reward_model.RewardModelSimulator([], SimConfig(nodes=30), net)


def test_served_rounds_explore_and_record_decisions_that_replay(tmp_path):
    from mlsched.formats.serving import serve

    torch.manual_seed(2)
    path = tmp_path / "harmony.onnx"
    export.export(networks.HarmonyNet(d=16, heads=2, layers=1).eval(), path, {}, {})
    placement = registry.make_placement("harmony", registry.PolicyContext(model_path=str(path)))
    trace = [replace(j, arrival_s=0.0) for j in scenarios.placement_trace(6, 5)[:10]]
    # Exploring and recording rounds serve the network unguarded (the log holds what ran).
    sim = Simulator(trace, SimConfig(nodes=6, seed=5))
    served = serve({"placement": placement}, namespace="ns", policy="p", interval=3, kind="round",
                   time="2026-11-24T00:00:00Z", epsilon=0.5, record=True)
    assert isinstance(served.phases["placement"], Sticky)
    decision = run_round(sim.snapshot(), registry.make_allocation("fixed"), served.phases["placement"])
    sim._check_capacity(decision)
    (log,) = served.decisions()
    assert (log.algorithm, log.phase, log.encoder, log.epsilon) == ("harmony", "placement", "harmony-state", 0.5)
    assert log.steps > 5 and log.masks.shape == (log.steps, 6)
    model = load_model(path, "harmony", "placement")
    explored = 0
    for state, mask, action, mu, pi in zip(log.states, log.masks, log.actions, log.behaviour_probs,
                                           log.policy_probs):
        assert mask[action]  # exploration only ever picks a node the task fits on
        probs = model.run(harmony_state.unflatten(state, mask))["probs"][0]
        assert pi == pytest.approx(probs[action] / probs[mask].sum(), rel=1e-3)  # float16 states
        greedy = int(np.argmax(np.where(mask, probs, -1)))
        explored += action != greedy
        want = 0.5 * (action == greedy) + 0.5 / mask.sum()
        assert mu == pytest.approx(want, rel=1e-6)
    assert explored > 0
    # Without exploration or recording, serving is the cached policy itself.
    plain = serve({"placement": placement}, namespace="ns", policy="p", interval=3, kind="round",
                  time="t", epsilon=0.0, record=False)
    assert plain.phases["placement"] is placement
    # A heuristic placement has nothing to explore or record.
    lb = registry.make_placement("load-balance")
    assert not lb.learned
    assert serve({"placement": lb}, namespace="ns", policy="p", interval=3, kind="round", time="t",
                 epsilon=0.5, record=True).recorders == []


def test_recording_stops_at_the_budget_and_serving_goes_on(tmp_path, monkeypatch):
    from mlsched.policies.decision_log import DecisionRecorder
    from mlsched.policies.exploration import Serving
    from mlsched.policies.placement import harmony

    path = tmp_path / "harmony.onnx"
    export.export(networks.HarmonyNet(d=16, heads=2, layers=1).eval(), path, {}, {})
    trace = [replace(j, arrival_s=0.0) for j in scenarios.placement_trace(6, 5)[:10]]
    snapshot = Simulator(trace, SimConfig(nodes=6, seed=5)).snapshot()
    one_state = 1 + 10 * (harmony_state.JOB_FEATURES + 1) + 6 * harmony_state.NODE_FEATURES
    monkeypatch.setattr(harmony, "RECORD_BUDGET", 3 * one_state)
    recorder = DecisionRecorder(algorithm="harmony", phase="placement", kind="round", time="t",
                                model_sha256="x", model_version=None, encoder="harmony-state",
                                encoder_version=harmony_state.ENCODER_VERSION, encoder_params={}, epsilon=0.0)
    policy = harmony.HarmonyPlacement.load(str(path)).for_round(Serving(0.0, None, recorder))
    decision = run_round(snapshot, registry.make_allocation("fixed"), policy)
    assert len(recorder) == 3 and policy.unrecorded > 0
    assert policy.inferences == 3 + policy.unrecorded
    assert sum(d.workers for d in decision.jobs.values()) > 3


def _node_tokens_reference(ledger: Ledger, current: str) -> np.ndarray:
    """The node tokens as the encoder defines them, computed from scratch."""
    cap = ledger.capacity
    out = np.zeros((len(cap), harmony_state.NODE_FEATURES), dtype=np.float32)
    out[:, 0:3] = ledger.free / cap
    out[:, 3] = cap[:, 0] / 8.0
    k = 4 + harmony_state.N_MODELS
    for node, tasks in enumerate(ledger.tasks_on):
        for name, model, role in tasks:
            if name == current:
                out[node, k + (1 if role == "ps" else 0)] += 0.25
            else:
                out[node, 4 + harmony_state.model_slot(model)] += 0.25
        out[node, k + 2] = len(tasks) / 8.0
    return out


def test_node_and_job_tokens_counted_incrementally_equal_a_recount_through_books_and_releases():
    rng = np.random.default_rng(0)
    trace = [replace(j, arrival_s=0.0) for j in scenarios.placement_trace(8, 9)[:20]]
    snapshot = Simulator(trace, SimConfig(nodes=8, seed=9)).snapshot()
    ledger = Ledger(snapshot, FirstFit())
    booked = []
    for step in range(200):
        job = snapshot.jobs[int(rng.integers(len(snapshot.jobs)))]
        if booked and rng.random() < 0.3:  # release a random earlier task, as a failed gang does
            j, role, node = booked.pop(int(rng.integers(len(booked))))
            d = ledger.jobs[j.name]
            nodes = d.ps_nodes if role == "ps" else d.worker_nodes
            nodes.remove(node)  # release pops the newest of the role: keep the one we release last
            nodes.append(node)
            ledger.release(j, [(role, node)])
        else:
            role = "ps" if job.uses_ps and rng.random() < 0.4 else "worker"
            free = np.flatnonzero(ledger.fits_mask(job.demand(role), job))
            if not free.size:
                continue
            node = int(rng.choice(free))
            ledger.book(job, role, node)
            booked.append((job, role, node))
        current = snapshot.jobs[int(rng.integers(len(snapshot.jobs)))].name
        np.testing.assert_array_equal(harmony_state.node_tokens(ledger, current),
                                      _node_tokens_reference(ledger, current), err_msg=f"step {step}")
        # Job tokens, also kept incrementally (the ledger's job changes): placed counts as held.
        jobs, _ = harmony_state.job_tokens(ledger, current)
        k = harmony_state.N_MODELS
        for i, j in enumerate(snapshot.jobs):
            held = ledger.jobs.get(j.name)
            want = (held.workers / 8.0, held.ps / 4.0) if held else (0.0, 0.0)
            assert tuple(jobs[i, k + 9:k + 11]) == pytest.approx(want), f"step {step}, job {j.name}"
    assert len(booked) > 10


def test_trainer_refuses_a_reward_model_environment_without_its_file(tmp_path):
    with pytest.raises(SystemExit, match="needs --reward-model FILE"):
        harmony_train.train(harmony_train.parse_args(
            ["--out", str(tmp_path), "--environment", "reward-model", "--train-nodes", "6"]))
    with pytest.raises(SystemExit, match="simulator or reward-model"):
        harmony_train.train(harmony_train.parse_args(["--out", str(tmp_path), "--environment", "cluster"]))

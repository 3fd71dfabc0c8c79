"""`mlsched retrain harmony` (policy_models/retrain/harmony.py): the cluster's records of a
fixed-count, Harmony-placed policy become a workload with each job's counts, a calibrated
simulator, a candidate trained from the active model, judged against it and published once.
Needs torch (the `train` extra, installed by `make dev`)."""

from __future__ import annotations

import base64
import importlib
import tomllib
from pathlib import Path

import numpy as np
import pytest

from mlsched.formats import model_versions
from mlsched.policies.onnx_runner import load_model
from policy_models.retrain import harmony, history, publish, workload

# torch: the training tier (`make test`'s second step; conftest.py keeps the fast tier from
# importing this module).
pytestmark = pytest.mark.training

ROOT = Path(__file__).resolve().parents[1]
ALGORITHM_PATH = ROOT / "policy_models/artifacts/harmony/harmony.onnx"  # the shipped model


@pytest.fixture(scope="module")
def fixed_history():
    """A 6-node cluster whose users fix their jobs' counts, placed by the shipped Harmony
    model, its models running ±30 % off the catalog's speeds."""
    factors = history.perturbation(0.3, seed=3)
    return factors, history.record_history(24, policy="fixed", nodes=6, speed_factors=factors, seed=3,
                                           placement="harmony")


def test_records_name_the_placement_and_the_workload_keeps_each_jobs_counts(fixed_history):
    _, records = fixed_history
    assert {r.algorithms["placement"] for r in records} == {"harmony"}
    assert harmony.recorded_allocation(records) == "fixed"
    load = workload.from_records(records, counts=True)
    jobs = load.trace(1)
    assert jobs and all(1 <= j.workers <= 4 for j in jobs)
    assert all((j.ps is None) == (j.arch == "allreduce") for j in jobs)
    assert all(1 <= j.ps <= 2 for j in jobs if j.ps is not None)
    # Arrivals per interval in which jobs arrived: placement traces bring nodes / 2 = 3 a slot
    # (counting every interval with a job present made it about 1).
    assert 2.4 <= load.rate <= 5.0, load.to_json()
    # A simulated trace is one recorded burst long: a 6-node placement trace has 24 jobs.
    assert load.burst_jobs == 24 and len(jobs) == 24
    # Without counts (DL²'s retrainer) the trace leaves them to the allocation, as before.
    assert all(j.workers is None and j.ps is None for j in workload.from_records(records).trace(1))


def test_a_policy_the_simulator_cannot_run_is_a_clear_error(fixed_history):
    _, records = fixed_history
    other = [type(r)(**{**r.__dict__, "algorithms": {"allocation": "my-own", "placement": "harmony"}})
             for r in records]
    with pytest.raises(ValueError, match="cannot simulate"):
        harmony.recorded_allocation(other)


def test_retraining_publishes_a_servable_placement_version_once(fixed_history, tmp_path):
    _, records = fixed_history
    history.write_records(records, tmp_path / "records")
    argv = ["--records", str(tmp_path / "records"), "--store", str(tmp_path / "store"), "--episodes", "2",
            "--validate-every", "1", "--validation-traces", "1", "--eval-traces", "1",
            "--margin", "-0.9"]  # a forced promotion: this test is about the publishing path
    report = harmony.run(harmony.parse_args(argv), log=lambda m: None)
    assert report["status"] == "published" and report["version"] == 1, report
    evaluation = report["evaluation"]
    assert evaluation["allocation"] == "fixed" and evaluation["trained_through_interval"] == records[-1].interval
    assert evaluation["traces"] == 1 and np.isfinite(evaluation["ratio"])
    (cm,) = publish.DirStore(tmp_path / "store", "default").configmaps()
    version = model_versions.parse(cm)
    assert (version.phase, version.algorithm, version.version) == ("placement", "harmony", 1)
    assert version.model_ref["configMapKeyRef"]["key"] == "harmony.onnx"
    onnx = base64.b64decode(cm["binaryData"]["harmony.onnx"])
    served = tmp_path / "served"
    served.mkdir()
    (served / "harmony.onnx").write_bytes(onnx)
    (served / "harmony.card.json").write_text(cm["data"]["harmony.card.json"])
    model = load_model(served / "harmony.onnx", "harmony", "placement")
    assert model.card.training["mode"] == "simulator"
    # Every interval is consumed: a rerun (a Job restarted after publishing) trains nothing.
    again = harmony.run(harmony.parse_args(argv), log=lambda m: None)
    assert again == {"status": "nothing-new", "trained_through_interval": records[-1].interval}


def test_a_candidate_that_is_not_better_by_the_margin_is_not_published(fixed_history, tmp_path):
    _, records = fixed_history
    history.write_records(records, tmp_path / "records")
    argv = ["--records", str(tmp_path / "records"), "--store", str(tmp_path / "store"), "--episodes", "0",
            "--validation-traces", "1", "--eval-traces", "1", "--margin", "0.02"]
    report = harmony.run(harmony.parse_args(argv), log=lambda m: None)
    # No episode: the candidate is the active model's weights, equal on every trace.
    assert report["status"] == "not-better" and report["evaluation"]["ratio"] == pytest.approx(1.0, abs=1e-3)
    assert publish.DirStore(tmp_path / "store", "default").configmaps() == []


def test_mlsched_retrain_harmony_is_an_entry_point():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    module, _, func = project["project"]["entry-points"]["mlsched.retrainers"]["harmony"].partition(":")
    assert getattr(importlib.import_module(module), func) is harmony.main


# ---- off-policy: the recorded decisions -----------------------------------------------------
def test_harmony_decisions_are_recorded_as_the_operator_serves_them(fixed_history):
    _, records = fixed_history
    steps = [d for r in records for d in r.decisions]
    assert steps and {(d.algorithm, d.phase) for d in steps} == {("harmony", "placement")}
    assert {d.kind for d in steps} <= {"round", "admission"} and all(d.epsilon == 0.1 for d in steps)
    for d in steps:
        allowed = d.masks.sum(axis=1)
        greedy = np.isclose(d.behaviour_probs, 0.9 + 0.1 / allowed, atol=1e-6)
        explored = np.isclose(d.behaviour_probs, 0.1 / allowed, atol=1e-6)
        assert (greedy | explored).all() and d.masks[np.arange(d.steps), d.actions].all()


def test_recorded_states_give_back_the_networks_own_probabilities(fixed_history):
    """unflatten + the torch network rebuilt from the graph reproduce, decision by decision,
    the probability the served ONNX model gave the node taken (float16 states: 1e-2)."""
    from mlsched.features.card import ModelCard, card_path
    from policy_models.harmony import export
    from policy_models.retrain import harmony_offpolicy

    _, records = fixed_history
    card = ModelCard.read(card_path(ALGORITHM_PATH))
    data = harmony_offpolicy.decisions(records, card, gamma=0.9)
    recorded = np.concatenate([d.policy_probs for r in sorted(records, key=lambda r: r.interval)
                               for d in r.decisions])
    probs, _ = harmony_offpolicy.probabilities_of(export.state_from_onnx(ALGORITHM_PATH), data.samples)
    assert len(probs) == len(recorded) == len(data.samples) and data.skipped == 0
    assert np.abs(probs - recorded).max() < 1e-2
    # Every decision of an interval carries that interval's discounted return.
    by_interval = {r.interval: r.reward for r in records}
    last = max(by_interval)
    assert all(s.ret == pytest.approx(by_interval[last]) for s in data.samples if s.interval == last)
    first = min(s.interval for s in data.samples)
    assert next(s.ret for s in data.samples if s.interval == first) > by_interval[first]


def test_off_policy_fine_tuning_moves_towards_actions_with_positive_advantage(fixed_history):
    from mlsched.features.card import ModelCard, card_path
    from policy_models.harmony import export
    from policy_models.retrain import harmony_offpolicy

    _, records = fixed_history
    card = ModelCard.read(card_path(ALGORITHM_PATH))
    data = harmony_offpolicy.decisions(records, card, gamma=0.9)
    net = export.state_from_onnx(ALGORITHM_PATH)
    args = harmony_offpolicy.OffPolicyArgs(lr=1e-3, critic_updates=50, policy_epochs=3, batch=16)
    summary = harmony_offpolicy.fine_tune(net, data, args, np.random.default_rng(0), log=lambda m: None)
    assert summary["updates"] > 0 and summary["steps"] == len(data.samples)
    assert summary["mean_prob_change_positive_adv"] > summary["mean_prob_change_negative_adv"]


def test_records_without_harmony_decisions_are_a_clear_error(fixed_history):
    from mlsched.features.card import ModelCard, card_path
    from policy_models.retrain import harmony_offpolicy

    _, records = fixed_history
    bare = [type(r)(**{**r.__dict__, "decisions": []}) for r in records]
    with pytest.raises(ValueError, match="no Harmony placement decisions"):
        harmony_offpolicy.decisions(bare, ModelCard.read(card_path(ALGORITHM_PATH)), gamma=0.9)


def test_offpolicy_mode_publishes_through_the_same_gate(fixed_history, tmp_path):
    _, records = fixed_history
    history.write_records(records, tmp_path / "records")
    argv = ["--records", str(tmp_path / "records"), "--out", str(tmp_path / "out"), "--mode", "offpolicy",
            "--eval-traces", "1", "--time-budget-min", "0.5"]
    report = harmony.run(harmony.parse_args(argv), log=lambda m: None)
    assert report["evaluation"]["mode"] == "offpolicy" and np.isfinite(report["evaluation"]["ratio"])
    model = load_model(report["candidate"], "harmony", "placement")
    assert model.card.training["mode"] == "offpolicy"
    assert model.card.training["summary"]["steps"] == sum(d.steps for r in records for d in r.decisions)

"""Retraining (issue 17, docs/retraining.md): simulated records, calibration, warm start,
off-policy updates, publishing once, consuming once. Needs the `train` extra (torch, onnx)."""

from __future__ import annotations

import base64
import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest
import torch

from mlsched.formats import model_versions
from mlsched.features import dl2_state
from mlsched.policies import registry
from mlsched.policies.decision_log import IntervalRecord, RoundDecisions
from mlsched.sim.simulator import SimConfig, Simulator
from mlsched.workloads import generators
from policy_models.dl2 import export, networks
from policy_models.retrain import calibration, cli, history, offpolicy, publish, warm_start

# torch: the training tier (`make test`'s second step; conftest.py keeps the fast tier from
# importing this module).
pytestmark = pytest.mark.training

SHIPPED = "policy_models/artifacts/dl2/dl2.onnx"


@pytest.fixture(scope="module")
def perturbed_history():
    """A DRF-scheduled 13-node cluster whose models run ±30 % off the catalog's speeds."""
    factors = history.perturbation(0.3, seed=7)
    return factors, history.record_history(120, policy="drf", speed_factors=factors, seed=7)


# ---- the simulator's speed factors ---------------------------------------------------------
def test_speed_factors_off_or_one_change_nothing_and_scale_when_set():
    trace = generators.generate(jobs=20, rate=3.0, seed=3)
    drf, lb = registry.make_allocation("drf"), registry.make_placement("load-balance")

    def jct(**kw):
        return Simulator(trace, SimConfig(seed=3, **kw)).run(drf, lb).summary()["avg_jct_s"]

    plain = jct()
    assert jct(speed_factors={}) == plain
    assert jct(speed_factors={m: 1.0 for m in ("resnet-50", "vgg-16")}) == plain
    assert jct(speed_factors={m: 2.0 for m in history.catalog.MODEL_NAMES}) < plain
    with pytest.raises(ValueError, match="finite and > 0"):
        jct(speed_factors={"vgg-16": 0.0})


# ---- records from the simulator ------------------------------------------------------------
def test_recorded_intervals_add_up_and_round_trip(perturbed_history):
    _, records = perturbed_history
    assert [r.interval for r in records] == list(range(1, 121))
    for r in records[:30]:
        assert r.reward == pytest.approx(sum(j.reward for j in r.jobs), rel=1e-9, abs=1e-12)
        assert not r.decisions  # a heuristic records no learned decisions
    back = IntervalRecord.from_bytes(records[5].to_bytes())
    assert back.jobs == records[5].jobs


def test_dl2_records_carry_behaviour_and_policy_probabilities():
    records = history.record_history(4, model_path=SHIPPED, epsilon=0.2, seed=2)
    steps = [d for r in records for d in r.decisions]
    assert steps and {d.kind for d in steps} <= {"round", "admission"}
    for d in steps:
        assert d.epsilon == 0.2 and d.encoder_version == dl2_state.ENCODER.version
        allowed = d.masks.sum(axis=1)
        # ε-greedy: the greedy action has 1 - ε + ε/n, any other ε/n
        greedy = np.isclose(d.behaviour_probs, 0.8 + 0.2 / allowed, atol=1e-6)
        explored = np.isclose(d.behaviour_probs, 0.2 / allowed, atol=1e-6)
        assert (greedy | explored).all()
        assert d.masks[np.arange(d.steps), d.actions].all()


# ---- calibration ---------------------------------------------------------------------------
def test_calibration_recovers_known_speed_factors_despite_noise(perturbed_history):
    factors, records = perturbed_history
    rng = np.random.default_rng(0)
    noisy = []
    for r in records:  # ±5 % measurement noise on every job, and one job in 20 wildly off
        jobs = [dataclasses.replace(j, epochs=j.epochs * (rng.uniform(0.2, 3.0) if rng.random() < 0.05
                                                           else rng.normal(1.0, 0.05))) for j in r.jobs]
        noisy.append(dataclasses.replace(r, jobs=jobs))
    cal = calibration.calibrate(noisy)
    checked = [m for m in factors if m not in cal.kept_prior]
    assert len(checked) >= 6, cal.samples
    for m in checked:
        assert cal.speed_factors[m] == pytest.approx(factors[m], rel=0.10), (m, cal.samples[m])


def test_calibration_ignores_finished_and_newly_started_jobs(perturbed_history):
    factors, records = perturbed_history
    # Finished jobs trained less than the interval allowed: were they counted, factors would sink.
    worst = [dataclasses.replace(r, jobs=[dataclasses.replace(j, epochs=j.epochs * 0.1) if j.finished else j
                                          for j in r.jobs]) for r in records]
    cal = calibration.calibrate(worst)
    for m in factors:
        if m not in cal.kept_prior:
            assert cal.speed_factors[m] == pytest.approx(factors[m], rel=0.10)


def test_too_few_samples_keep_the_prior_and_a_calibration_round_trips(perturbed_history, tmp_path):
    _, records = perturbed_history
    cal = calibration.calibrate(records[:3], prior={"vgg-16": 1.25}, min_samples=10_000)
    assert cal.speed_factors == {"vgg-16": 1.25} and len(cal.kept_prior) == 8
    cal.write(tmp_path / "c.json")
    assert calibration.Calibration.read(tmp_path / "c.json").speed_factors == {"vgg-16": 1.25}


@pytest.fixture(scope="module")
def interference_history():
    """As `perturbed_history`, and each model's sensitivity to its neighbours off the table's by
    up to 2x either way; 600 intervals (about 2 s), since separating the two needs many."""
    factors = history.perturbation(0.3, seed=7)
    sensitivity = history.sensitivity_perturbation(1.0, seed=7)
    return factors, sensitivity, history.record_history(600, policy="drf", speed_factors=factors, seed=7,
                                                        sensitivity_factors=sensitivity)


def test_sensitivity_factors_scale_interference_in_the_simulator():
    trace = generators.generate(jobs=20, rate=3.0, seed=3)
    drf, packed = registry.make_allocation("drf"), registry.make_placement("bin-pack")

    def jct(**kw):
        return Simulator(trace, SimConfig(seed=3, **kw)).run(drf, packed).summary()["avg_jct_s"]

    everyone = history.catalog.MODEL_NAMES
    plain = jct()
    assert jct(sensitivity_factors={m: 1.0 for m in everyone}) == plain
    assert jct(sensitivity_factors={m: 0.0 for m in everyone}) == jct(interference=False) < plain
    assert jct(sensitivity_factors={m: 2.0 for m in everyone}) > plain
    with pytest.raises(ValueError, match="finite and >= 0"):
        jct(sensitivity_factors={"vgg-16": -1.0})


def test_calibration_recovers_interference_sensitivity_and_speed_together(interference_history):
    factors, sensitivity, records = interference_history
    cal = calibration.calibrate(records)
    # Noiseless records: every model's pair is determined, and found (a bookkeeping check).
    assert cal.sensitivity_kept_prior == [] and cal.kept_prior == []
    for m in factors:
        assert cal.sensitivity_factors[m] == pytest.approx(sensitivity[m], rel=0.02), m
        assert cal.speed_factors[m] == pytest.approx(factors[m], rel=0.02), m
    # Charging the table's sensitivities instead would have got the speeds wrong.
    table = calibration.calibrate(records, fit_sensitivity=False)
    assert table.sensitivity_factors == {} and len(table.sensitivity_kept_prior) == 8
    assert max(abs(table.speed_factors[m] / factors[m] - 1) for m in factors) > 0.10


def test_sensitivity_the_samples_cannot_tell_from_speed_keeps_the_prior(interference_history):
    factors, sensitivity, records = interference_history
    rng = np.random.default_rng(0)
    noisy = [dataclasses.replace(r, jobs=[dataclasses.replace(j, epochs=j.epochs * rng.normal(1.0, 0.05))
                                          for j in r.jobs]) for r in records]
    prior = {m: 1.0 for m in factors}
    cal = calibration.calibrate(noisy, sensitivity_prior=prior)
    # With 5 % noise most models were seen at too similar pressures to separate the two factors:
    # those keep the prior rather than a guess, and are named; what is fitted is close.
    assert cal.sensitivity_kept_prior and all(cal.sensitivity_factors[m] == 1.0 for m in cal.sensitivity_kept_prior)
    fitted = [m for m in factors if m not in cal.sensitivity_kept_prior]
    assert len(fitted) >= 2, cal.sensitivity_factors
    for m in fitted:  # (4 noise draws measured: sensitivity within 17 %, speed within 5.3 %)
        assert cal.sensitivity_factors[m] == pytest.approx(sensitivity[m], rel=0.25), m
        assert cal.speed_factors[m] == pytest.approx(factors[m], rel=0.10), m


def test_a_calibration_round_trips_with_its_sensitivities_and_reads_version_1(interference_history, tmp_path):
    _, _, records = interference_history
    cal = calibration.calibrate(records)
    cal.write(tmp_path / "c.json")
    back = calibration.Calibration.read(tmp_path / "c.json")
    assert back.sensitivity_factors == cal.sensitivity_factors and back.speed_factors == cal.speed_factors
    doc = json.loads((tmp_path / "c.json").read_text())
    doc["version"] = 1
    del doc["sensitivity_factors"], doc["sensitivity_kept_prior"]
    (tmp_path / "v1.json").write_text(json.dumps(doc))
    old = calibration.Calibration.read(tmp_path / "v1.json")
    assert old.speed_factors == cal.speed_factors and old.sensitivity_factors == {}


# ---- warm start ----------------------------------------------------------------------------
def test_warm_start_from_onnx_reproduces_the_graphs_probabilities():
    net, card = warm_start.load(SHIPPED)
    session = ort.InferenceSession(SHIPPED)
    rng = np.random.default_rng(1)
    window = card.encoder_params["window"]
    f = dl2_state.JOB_FEATURES
    states = rng.uniform(0, 1.5, (7, dl2_state.state_dim(window))).astype(np.float32)
    masks = (rng.random((7, dl2_state.n_actions(window))) < 0.4).astype(np.float32)
    for k, jobs in enumerate(rng.integers(1, window, 7)):  # occupied rows first, as the encoder fills them
        states[k, jobs * f: window * f] = 0.0
        states[k, f - 1: jobs * f: f] = 1.0
        masks[k, 3 * jobs:-1] = 0.0
    masks[:, -1] = 1
    want = session.run(["probs"], {"state": states, "mask": masks})[0]
    with torch.no_grad():
        got = networks.ProbabilityModule(net)(torch.from_numpy(states), torch.from_numpy(masks)).numpy()
    np.testing.assert_allclose(got, want, atol=1e-5)
    # and the numpy copy the rollouts use agrees too
    np.testing.assert_allclose(networks.NumpyPolicy(net).probabilities(states[0], masks[0] > 0), want[0], atol=1e-5)


# ---- off-policy ----------------------------------------------------------------------------
def _tiny_model(tmp_path):
    spec = SimpleNamespace(window=2, arch="shared", hidden=(8, 8))
    torch.manual_seed(0)
    net = networks.build(spec.arch, spec.window, spec.hidden)
    export.export(net, spec, tmp_path / "dl2.onnx", phase="test", training={}, validation={})
    return warm_start.load(tmp_path / "dl2.onnx")


def test_off_policy_update_moves_probability_towards_high_advantage_actions(tmp_path):
    net, card = _tiny_model(tmp_path)
    rng = np.random.default_rng(0)
    state = np.zeros(dl2_state.state_dim(2), np.float32)
    state[: dl2_state.JOB_FEATURES - 1] = rng.uniform(0, 1, dl2_state.JOB_FEATURES - 1)
    state[dl2_state.JOB_FEATURES - 1] = 1.0  # job row 0 is valid
    mask = np.zeros(dl2_state.n_actions(2), bool)
    mask[[0, 2]] = True  # +1 worker or a bundle for job 0
    records = []
    for k in range(200):  # the serving policy tried both half the time; action 0 earned 1, action 2 nothing
        a = k % 2 * 2
        d = RoundDecisions("dl2", "allocation", "round", "t", card.onnx_sha256, None, card.encoder_name,
                           card.encoder_version, card.encoder_params, 0.5, state[None], mask[None],
                           np.array([a]), np.array([0.5], np.float32), np.array([0.5], np.float32),
                           np.array([True]), np.array([0], np.int32))
        records.append(IntervalRecord("ns", "p", "u", k + 1, "s", "e", 1200.0, {}, 4, 1.0 if a == 0 else 0.0,
                                      [], [d]))
    steps = offpolicy.transitions(records, card, gamma=0.0)
    assert len(steps) == 200 and steps.reward.sum() == 100
    before = offpolicy.probabilities_of(net, steps)[0]
    args = offpolicy.OffPolicyArgs(lr=3e-3, batch=50, critic_updates=50, policy_epochs=20, gamma=0.0)
    summary = offpolicy.fine_tune(net, steps, args, np.random.default_rng(0), log=lambda m: None)
    after = offpolicy.probabilities_of(net, steps)[0]
    assert after > before + 0.05, (before, after)
    assert summary["mean_prob_change_positive_adv"] > 0 > summary["mean_prob_change_negative_adv"]


def test_decisions_of_another_encoder_are_skipped(tmp_path):
    _, card = _tiny_model(tmp_path)
    d = RoundDecisions("dl2", "allocation", "round", "t", "0" * 64, None, "dl2-state", "dl2-state-v1",
                       {"window": 2}, 0.0, np.zeros((1, 3), np.float32), np.ones((1, 2), bool),
                       np.array([0]), np.ones(1, np.float32), np.ones(1, np.float32), np.array([True]),
                       np.zeros(1, np.int32))
    rec = IntervalRecord("ns", "p", "u", 1, "s", "e", 1200.0, {}, 4, 1.0, [], [d])
    with pytest.raises(ValueError, match="no DL² decisions"):
        offpolicy.transitions([rec], card, 0.9)


# ---- publishing and consuming --------------------------------------------------------------
def _publish(store, onnx, through):
    evaluation = {"ratio": 0.9, "trained_through_interval": through}
    return publish.publish(store, "ns", "p", "allocation", "dl2", onnx, "{}", evaluation)


def test_publishing_is_idempotent_and_numbers_versions(tmp_path):
    store = publish.DirStore(tmp_path, "p")
    v1, created = _publish(store, b"model-a", 10)
    assert created and v1.version == 1 and v1.configmap == "p-dl2-v1"
    again, created = _publish(store, b"model-a", 10)  # a Job killed after publishing, rerun
    assert not created and again.version == 1
    v2, created = _publish(store, b"model-b", 20)
    assert created and v2.version == 2
    assert len(list(tmp_path.glob("*.configmap.json"))) == 2
    assert publish.DirStore(tmp_path, "other").versions() == []


def test_a_candidate_must_be_better_by_the_margin():
    assert evaluate_better(0.97, 0.02) and not evaluate_better(0.99, 0.02) and not evaluate_better(1.05, 0.0)


def evaluate_better(ratio, margin):
    from policy_models.retrain import evaluate

    return evaluate.better_by({"ratio": ratio}, margin)


def test_each_interval_is_consumed_once(tmp_path):
    records = [SimpleNamespace(interval=i) for i in range(1, 31)]
    store = publish.DirStore(tmp_path, "p")
    assert len(publish.unconsumed(records, store.versions(), "allocation", "dl2")) == 30
    _publish(store, b"a", 20)
    assert [r.interval for r in publish.unconsumed(records, store.versions(), "allocation", "dl2")] == list(range(21, 31))
    _publish(store, b"b", 30)
    assert publish.unconsumed(records, store.versions(), "allocation", "dl2") == []
    assert publish.unconsumed(records, store.versions(), "placement", "dl2") == records


def test_a_rerun_with_nothing_new_trains_nothing(tmp_path, perturbed_history):
    _, records = perturbed_history
    history.write_records(records[:5], tmp_path / "records")
    store = publish.DirStore(tmp_path / "store", "default")
    publish.publish(store, "ns", "default", "allocation", "dl2", b"x", "{}", {"trained_through_interval": 5})
    args = cli.parse_args(["--records", str(tmp_path / "records"), "--store", str(tmp_path / "store")])
    assert cli.run(args, log=lambda m: None) == {"status": "nothing-new", "trained_through_interval": 5}


class FakeCore:
    """CoreV1Api's ConfigMap calls as the retraining Job uses them (list by label, create)."""

    def __init__(self, taken=()):
        self.items, self.taken = [], set(taken)
        self.api_client = SimpleNamespace(sanitize_for_serialization=lambda x: x)

    def list_namespaced_config_map(self, namespace, label_selector):
        key, _, value = label_selector.partition("=")
        return SimpleNamespace(items=[c for c in self.items if c["metadata"]["labels"].get(key) == value])

    def read_namespaced_config_map(self, name, namespace):
        from kubernetes.client.exceptions import ApiException

        found = [c for c in self.items if c["metadata"]["name"] == name]
        if not found:
            raise ApiException(status=404)
        return found[0]

    def create_namespaced_config_map(self, namespace, body):
        from kubernetes.client.exceptions import ApiException

        if any(c["metadata"]["name"] == body["metadata"]["name"] for c in self.items):
            raise ApiException(status=409)
        if body["metadata"]["name"] in self.taken:
            self.taken.discard(body["metadata"]["name"])
            self.items.append(model_versions.manifest(namespace, "p", "allocation", "dl2", 1, b"other", "{}", {}))
            raise ApiException(status=409)
        self.items.append(json.loads(json.dumps(body)))


def test_a_version_taken_by_a_concurrent_run_is_not_overwritten():
    from policy_models.retrain.kube_io import KubeStore

    core = FakeCore(taken={"p-dl2-v1"})
    version, created = _publish(KubeStore(core, "ns", "p"), b"mine", 9)
    assert created and version.version == 2
    assert [c["metadata"]["name"] for c in core.items] == ["p-dl2-v1", "p-dl2-v2"]


def test_a_split_model_losing_the_race_for_a_version_number_reuses_its_parts():
    from kubernetes.client.exceptions import ApiException

    from policy_models.retrain.kube_io import KubeStore

    core = FakeCore()
    create = core.create_namespaced_config_map

    def another_run_takes_v1_first(namespace, body):
        if body["metadata"]["name"] == "p-harmony-v1":
            core.items.append(model_versions.manifest(namespace, "p", "placement", "harmony", 1, b"other", "{}", {}))
            raise ApiException(status=409)
        return create(namespace, body)

    core.create_namespaced_config_map = another_run_takes_v1_first
    store = KubeStore(core, "ns", "p")
    version, created = _publish_big(store)
    assert created and version.version == 2
    names = [c["metadata"]["name"] for c in core.items]
    assert [n.rsplit("-", 1)[-1] for n in names] == ["1", "2", "3", "v1", "v2"], names  # each part once
    (v2,) = [c for c in core.items if c["metadata"]["name"] == "p-harmony-v2"]
    assert publish.model_bytes(store, v2, "harmony")[0] == BIG


BIG = bytes(range(256)) * 8_000  # 2,048,000 bytes: three parts of 900 KiB


def _publish_big(store, onnx=BIG, through=10):
    evaluation = {"ratio": 0.9, "trained_through_interval": through}
    return publish.publish(store, "ns", "p", "placement", "harmony", onnx, '{"card": 1}', evaluation)


def test_a_model_over_a_configmap_is_published_in_parts_once(tmp_path):
    store = publish.DirStore(tmp_path, "p")
    v1, created = _publish_big(store)
    assert created and v1.version == 1
    names = sorted(p.name for p in tmp_path.glob("*.configmap.json"))
    assert len(names) == 4 and "p-harmony-v1.configmap.json" in names
    (cm,) = store.configmaps()
    assert publish.model_bytes(store, cm, "harmony") == (BIG, '{"card": 1}')
    # Every ConfigMap within the API server's 1 MiB (data and binaryData, decoded).
    for path in tmp_path.glob("*.configmap.json"):
        body = json.loads(path.read_text())
        size = sum(len(v) for v in (body.get("data") or {}).values()) + \
            sum(len(base64.b64decode(v)) for v in (body.get("binaryData") or {}).values())
        assert size <= 2**20, (path.name, size)
    again, created = _publish_big(store)  # a Job killed after publishing, rerun
    assert not created and again == v1 and len(list(tmp_path.glob("*.configmap.json"))) == 4


def test_parts_left_by_a_killed_run_are_reused_and_a_foreign_one_is_refused(tmp_path):
    store = publish.DirStore(tmp_path, "p")
    parts = model_versions.part_manifests("ns", "p", "harmony", BIG, '{"card": 1}')
    store.create(parts[0])  # the run was killed after its first part
    version, created = _publish_big(store)
    assert created and version.version == 1 and len(list(tmp_path.glob("*.configmap.json"))) == 4
    other = publish.DirStore(tmp_path / "other", "p")
    squatter = dict(parts[1], binaryData={"harmony.onnx": base64.b64encode(b"not this").decode()})
    other.create(squatter)
    with pytest.raises(RuntimeError, match=f"ConfigMap {parts[1]['metadata']['name']} exists and does not hold"):
        _publish_big(other)
    assert other.versions() == []  # no version names a part it does not have


def test_retraining_starts_from_the_newest_split_version_joined(tmp_path):
    store = publish.DirStore(tmp_path / "store", "p")
    _publish_big(store)
    args = SimpleNamespace(base_model=None)
    path, version = cli.base_model(args, store, None, tmp_path / "work", "placement", "harmony")
    assert version == 1 and path.read_bytes() == BIG and path.with_name("harmony.card.json").read_text() == '{"card": 1}'


def test_a_dry_run_of_a_model_over_a_configmap_writes_its_parts_before_its_version(tmp_path):
    candidate = tmp_path / "harmony.onnx"
    candidate.write_bytes(BIG)
    a = SimpleNamespace(margin=0.02, out=str(tmp_path), dry_run=True, namespace="ns", policy="p")
    cal = SimpleNamespace(write=lambda path: path.write_text("{}"))
    report = cli.conclude(a, tmp_path, None, [], "placement", "harmony", candidate, '{"card": 1}',
                          {"ratio": 0.9, "traces": 1}, cal, 0.0, log=lambda m: None)
    assert report["status"] == "dry-run"
    doc = json.loads((tmp_path / "configmap.json").read_text())
    assert doc["kind"] == "List" and [i["metadata"]["name"].rsplit("-", 1)[-1] for i in doc["items"]] == ["1", "2", "3", "v1"]
    store = publish.DirStore(tmp_path / "applied", "p")
    for item in doc["items"]:  # what `kubectl create -f configmap.json` does
        store.create(item)
    assert publish.model_bytes(store, store.configmaps()[0], "harmony")[0] == BIG


def test_a_split_version_whose_part_was_replaced_is_not_a_base_to_retrain_from(tmp_path):
    from mlsched.formats.model_sources import ModelLoadError

    store = publish.DirStore(tmp_path, "p")
    _publish_big(store)
    part = model_versions.part_manifests("ns", "p", "harmony", BIG, '{"card": 1}')[2]
    path = tmp_path / f"{part['metadata']['name']}.configmap.json"
    path.write_text(json.dumps(dict(part, binaryData={"harmony.onnx": base64.b64encode(b"x").decode()})))
    with pytest.raises(ModelLoadError, match="the 3 parts of ConfigMap p-harmony-v1 key harmony.onnx join to"):
        publish.model_bytes(store, store.configmaps()[0], "harmony")


def test_mlsched_retrain_is_an_entry_point_of_the_retrain_cli():
    import importlib
    import tomllib
    from pathlib import Path

    from mlsched import cli as mlsched_cli

    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    target = project["project"]["entry-points"]["mlsched.retrainers"]["dl2"]
    module, _, func = target.partition(":")
    assert getattr(importlib.import_module(module), func) is cli.main
    assert mlsched_cli.main(["retrain", "no-such-algorithm"]) == 2


def test_mlsched_simulate_applies_a_calibration(tmp_path, capsys):
    from mlsched import cli as mlsched_cli

    def avg_jct(*extra):
        assert mlsched_cli.main(["simulate", "--policies", "drf", "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)["results"][0]

    cal = tmp_path / "calibration.json"
    cal.write_text(json.dumps({"speed_factors": {m: 1.5 for m in history.catalog.MODEL_NAMES}}))
    plain, faster = avg_jct(), avg_jct("--speed-calibration", str(cal))
    key = next(k for k in plain if "jct" in k)
    assert faster[key] < plain[key]
    cal.write_text(json.dumps({"speed_factors": {}, "sensitivity_factors": {m: 3.0 for m in history.catalog.MODEL_NAMES}}))
    assert avg_jct("--speed-calibration", str(cal))[key] > plain[key]  # neighbours hurt 3x more
    cal.write_text("{}")
    assert mlsched_cli.main(["simulate", "--speed-calibration", str(cal)]) == 2


def test_mlsched_simulate_charges_the_costs_a_calibration_measured(tmp_path, capsys):
    """A calibration `mlsched retrain` wrote with measured restart and start costs: simulate
    charges them (as the retraining simulator does); --scaling-cost given by hand wins; a
    file without costs (version 2) charges the default as before."""
    from mlsched import cli as mlsched_cli
    from policy_models.retrain import calibration

    def avg_jct(*extra):
        assert mlsched_cli.main(["simulate", "--policies", "drf", "--json", *extra]) == 0
        row = json.loads(capsys.readouterr().out)["results"][0]
        return row[next(k for k in row if "jct" in k)]

    cal = tmp_path / "calibration.json"
    calibration.Calibration({}).write(cal)  # no costs measured
    assert avg_jct("--speed-calibration", str(cal)) == avg_jct()
    calibration.Calibration({}, restart_cost_s=3000.0, restart_changes=5, start_cost_s=3000.0, start_jobs=5).write(cal)
    slow = avg_jct("--speed-calibration", str(cal))
    assert slow > avg_jct()  # 3,000 s a restart and a start, paid in full
    assert avg_jct("--speed-calibration", str(cal), "--scaling-cost", "30") == avg_jct()
    cal.write_text(json.dumps({"speed_factors": {}, "restart_cost_s": "slow"}))
    assert mlsched_cli.main(["simulate", "--speed-calibration", str(cal)]) == 2
    assert "restart_cost_s and start_cost_s must be seconds" in capsys.readouterr().err


# ---- imitation in the calibrated simulator ---------------------------------------------------
def test_the_imitation_teacher_sees_the_calibrated_speeds():
    from mlsched.cluster.types import JobView
    from policy_models.retrain import imitate

    job = JobView(name="j", model="resnet-50", arch="ps", arrival_s=0.0, total_epochs=10.0, epochs_done=0.0, min_ps=1)
    table = imitate.calibrated_teacher(None).estimator.epochs_per_s(job, 2, 4)
    assert imitate.calibrated_teacher({"resnet-50": 1.5}).estimator.epochs_per_s(job, 2, 4) == pytest.approx(1.5 * table)
    assert imitate.calibrated_teacher({"vgg-16": 1.5}).estimator.epochs_per_s(job, 2, 4) == pytest.approx(table)


def test_imitation_keeps_the_best_network_seen_the_start_included(tmp_path, perturbed_history):
    from policy_models.retrain import imitate, workload

    factors, records = perturbed_history
    load = workload.from_records(records)
    net, card = _tiny_model(tmp_path)
    spec = warm_start.network_args(card)
    start = {k: v.clone() for k, v in net.state_dict().items()}
    args = imitate.ImitateArgs(teacher_traces=3, dagger_traces=1, max_rounds=1, epochs=10, lr=3e-3,
                               validation_traces=1, max_slots_per_episode=6)
    summary = imitate.imitate_in_simulator(net, spec, load, calibration.Calibration(factors), args, seed=1,
                                           log=lambda m: None)
    assert summary["samples"] > 0 and summary["dagger_rounds"] == 1 and len(summary["curve"]) == 3
    best = min(j for _, j in summary["curve"])
    assert summary["validation_best_avg_jct_s"] == best <= summary["validation_start_avg_jct_s"]
    same = all(torch.equal(v, start[k]) for k, v in net.state_dict().items())
    assert same == (summary["best_fit"] == 0)  # a fit that never beat the start is not kept


def test_the_teachers_labels_in_the_calibrated_simulator_are_learnable(tmp_path, perturbed_history):
    from policy_models.dl2 import train as dl2_train
    from policy_models.retrain import imitate, workload

    factors, records = perturbed_history
    load = workload.from_records(records)
    net, card = _tiny_model(tmp_path)
    teacher = imitate.calibrated_teacher(factors)
    rollouts = [(load.trace(s), load.config(s, calibration.Calibration(factors))) for s in (123, 124, 125)]
    s, m, a = imitate.rollouts(2, teacher, rollouts, max_slots=6)
    before = dl2_train.agreement(net, s, m, a)
    dl2_train.fit(net, torch.optim.Adam(net.parameters(), lr=3e-3), s, m, a, 30, 64, "test")
    assert dl2_train.agreement(net, s, m, a) > before + 0.2, before


def test_a_dry_run_on_records_without_progress_says_so(tmp_path, perturbed_history, capsys):
    """`mlsched retrain dl2 --dry-run` on intervals in which no job reported progress used to
    train a candidate from the priors alone without a word: it says so on stderr, at once and
    again at the end, and in the report (stdout's last line)."""
    from mlsched import cli as mlsched_cli

    _, records = perturbed_history
    idle = [dataclasses.replace(r, jobs=[dataclasses.replace(j, epochs=0.0, reward=0.0, speed=None,
                                                             samples_per_second=None)
                                         for j in r.jobs])
            for r in records[:6]]
    history.write_records(idle, tmp_path / "records")
    argv = ["retrain", "dl2", "--records", str(tmp_path / "records"), "--dry-run",
            "--out", str(tmp_path / "out"), "--time-budget-min", "0.005", "--episodes", "1",
            "--eval-traces", "1"]
    assert mlsched_cli.main(argv) == 0
    out, err = capsys.readouterr()
    report = json.loads(out.strip().splitlines()[-1])
    (warning,) = report["warnings"]
    jobs = sum(len(r.jobs) for r in idle)
    assert warning.startswith(f"no progress recorded: none of the {jobs} job-intervals in the 6 "
                              f"intervals (1-6) trained any epoch or reported a speed"), warning
    assert err.count(f"WARNING: {warning}") == 2 and err.rstrip().splitlines()[-1] == f"WARNING: {warning}"
    # Records with progress carry no warning.
    assert cli.progress_warnings(records[:6], log=lambda m: None) == []

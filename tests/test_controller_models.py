"""Model loading for SchedulingPolicies: missing, corrupt and mismatched models fall back,
a verified model is served, and an unchanged model is not loaded again."""

from __future__ import annotations

import base64
import hashlib

import pytest

from mlsched.api import SchedulingPolicySpec
from mlsched.controller import models
from mlsched.controller.models import ModelResolver
from mlsched.policies import registry
from mlsched.policies.allocation.drf import DRF
from test_controller_fixtures import NS, run


class ToyLearned:
    """A stand-in learned allocation: its 'model' must start with TOY."""

    name = "toy"
    loads = 0

    def __init__(self, path: str):
        with open(path, "rb") as f:
            if not f.read().startswith(b"TOY"):
                raise ValueError("not a toy model")
        ToyLearned.loads += 1

    def allocate(self, snapshot, ledger):
        DRF().allocate(snapshot, ledger)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(registry.ALLOCATION, "toy", registry.Entry(lambda ctx: ToyLearned(ctx.model_path)))
    ToyLearned.loads = 0
    return ToyLearned


def spec(**kw) -> SchedulingPolicySpec:
    return SchedulingPolicySpec.model_validate(kw)


def resolver(tmp_path, configmaps=None) -> ModelResolver:
    async def read(namespace, name):
        return (configmaps or {}).get((namespace, name))

    return ModelResolver(str(tmp_path / "cache"), read)


def test_heuristics_need_no_model(tmp_path):
    r = run(resolver(tmp_path).resolve(NS, spec(allocation="srtf", placement="bin-pack")))
    assert r.allocation.name == "srtf" and r.placement.name == "bin-pack"
    assert (r.model_loaded.status, r.model_loaded.reason) == (True, "NoModelNeeded")
    assert r.ready.reason == "Scheduling" and not r.load_failed


def test_missing_model_file_falls_back(tmp_path):
    s = spec(allocation="dl2", models={"allocation": {"dl2": {"path": str(tmp_path / "nope.onnx")}}}, fallback="fifo")
    r = run(resolver(tmp_path).resolve(NS, s))
    assert (r.model_loaded.status, r.model_loaded.reason) == (False, "ModelNotFound")
    assert "nope.onnx" in r.model_loaded.message
    assert r.allocation.name == "fifo" and r.ready.reason == "FallbackActive" and r.load_failed


def test_no_model_reference_and_none_shipped(tmp_path, monkeypatch):
    monkeypatch.setattr(models, "shipped_model", lambda name: None)
    r = run(resolver(tmp_path).resolve(NS, spec(allocation="dl2")))
    assert r.model_loaded.reason == "NoModelReference" and r.allocation.name == "drf"


def test_without_a_reference_the_shipped_model_serves(tmp_path, toy, monkeypatch):
    shipped = tmp_path / "toy.onnx"
    shipped.write_bytes(b"TOY shipped with the image")
    monkeypatch.setattr(models, "shipped_model", lambda name: str(shipped))
    monkeypatch.setitem(registry.ALLOCATION, "toy", registry.Entry(lambda ctx: ToyLearned(ctx.model_path), learned=True))
    r = run(resolver(tmp_path).resolve(NS, spec(allocation="toy", models={})))
    assert r.model_loaded.status and r.allocation.name == "toy"


def test_corrupt_model_falls_back_with_a_clear_reason(tmp_path):
    garbage = tmp_path / "policy.onnx"
    garbage.write_bytes(b"\x00not an onnx graph\xff" * 10)
    s = spec(allocation="dl2", models={"allocation": {"dl2": {"path": str(garbage)}}})
    r = run(resolver(tmp_path).resolve(NS, s))
    # Without the DL² runner installed the import fails; with it the file is refused. Either
    # way the policy says why and schedules with drf.
    assert r.model_loaded.status is False
    assert r.model_loaded.reason in ("ModelInvalid", "RunnerUnavailable", "ModelLoadFailed")
    assert r.model_loaded.message.startswith("allocation/dl2: ")
    assert r.allocation.name == "drf"


def test_sha256_mismatch_is_refused_before_loading(tmp_path, toy):
    model = tmp_path / "toy.onnx"
    model.write_bytes(b"TOY model v1")
    s = spec(allocation="toy", models={"allocation": {"toy": {"path": str(model), "sha256": "0" * 64}}})
    r = run(resolver(tmp_path).resolve(NS, s))
    assert r.model_loaded.reason == "ModelDigestMismatch" and toy.loads == 0
    assert r.allocation.name == "drf"


def test_verified_model_is_served_and_cached_by_digest(tmp_path, toy):
    model = tmp_path / "toy.onnx"
    model.write_bytes(b"TOY model v1")
    digest = hashlib.sha256(b"TOY model v1").hexdigest()
    res = resolver(tmp_path)
    s = spec(allocation="toy", models={"allocation": {"toy": {"path": str(model), "sha256": digest}}})
    first = run(res.resolve(NS, s))
    second = run(res.resolve(NS, s))
    assert first.allocation is second.allocation and toy.loads == 1
    assert first.active_models == {"allocation/toy": digest}
    assert (first.model_loaded.status, first.model_loaded.reason) == (True, "ModelVerified")
    # A new file is a new digest: loaded once more.
    model.write_bytes(b"TOY model v2")
    third = run(res.resolve(NS, spec(allocation="toy", models={"allocation": {"toy": {"path": str(model)}}})))
    assert third.allocation is not first.allocation and toy.loads == 2


def test_bad_file_is_remembered_not_reloaded_every_round(tmp_path, toy):
    model = tmp_path / "toy.onnx"
    model.write_bytes(b"garbage")
    res = resolver(tmp_path)
    s = spec(allocation="toy", models={"allocation": {"toy": {"path": str(model)}}})
    first, second = run(res.resolve(NS, s)), run(res.resolve(NS, s))
    assert first.model_loaded.reason == second.model_loaded.reason == "ModelInvalid"
    assert first.load_failed and not second.load_failed  # the metric counts attempts


def test_model_from_configmap_binary_data(tmp_path, toy):
    data = b"TOY from a ConfigMap"
    cms = {(NS, "toy-model"): {"binaryData": {"policy.onnx": base64.b64encode(data).decode()},
                               "data": {"card.json": "{}"}}}
    s = spec(allocation="toy", models={"allocation": {"toy": {"configMapKeyRef": {"name": "toy-model", "key": "policy.onnx"}}}})
    r = run(resolver(tmp_path, cms).resolve(NS, s))
    digest = hashlib.sha256(data).hexdigest()
    assert r.model_loaded.status and r.active_models == {"allocation/toy": digest}
    # Every key lands in one folder, so a model card stored next to the model is found there.
    assert sorted(p.name for p in (tmp_path / "cache" / digest).iterdir()) == ["card.json", "policy.onnx"]


@pytest.mark.parametrize("configmaps, reason", [({}, "ModelNotFound"),
                                                ({(NS, "toy-model"): {"data": {"other": "x"}}}, "ModelNotFound")])
def test_configmap_missing_or_without_key(tmp_path, toy, configmaps, reason):
    s = spec(allocation="toy", models={"allocation": {"toy": {"configMapKeyRef": {"name": "toy-model", "key": "policy.onnx"}}}})
    r = run(resolver(tmp_path, configmaps).resolve(NS, s))
    assert r.model_loaded.reason == reason and r.allocation.name == "drf"


def test_unknown_algorithms_fall_back_and_say_so(tmp_path):
    r = run(resolver(tmp_path).resolve(NS, spec(allocation="nope", placement="nope2", grouping="x",
                                                fallback="srtf")))
    assert r.allocation.name == "srtf" and r.placement.name == "load-balance" and r.grouping.name == "none"
    assert r.ready.status and r.ready.reason == "FallbackActive"
    assert "nope" in r.ready.message and "nope2" in r.ready.message


def test_a_learned_placement_loads_its_model_by_phase_and_falls_back_to_load_balance(tmp_path, monkeypatch):
    """Models are keyed by phase: a learned placement named like an allocation (tetris is
    both) gets its own entry, and when its model cannot serve the placement phase falls back."""
    from mlsched.policies.placement.heuristics import LoadBalance

    built = []

    def build(ctx):
        built.append(ctx.model_path)
        if not ctx.model_path or not open(ctx.model_path, "rb").read().startswith(b"TOY"):
            raise ValueError("not a toy placement model")
        return LoadBalance()

    monkeypatch.setitem(registry.PLACEMENT, "toy-place", registry.Entry(build, learned=True))
    good = tmp_path / "place.onnx"
    good.write_bytes(b"TOY placement")
    r = run(resolver(tmp_path).resolve(NS, spec(placement="toy-place",
                                                 models={"placement": {"toy-place": {"path": str(good)}}})))
    assert r.model_loaded.status and set(r.active_models) == {"placement/toy-place"}
    assert built == [str(good)]
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"garbage")
    r = run(resolver(tmp_path).resolve(NS, spec(placement="toy-place",
                                                 models={"placement": {"toy-place": {"path": str(bad)}}})))
    assert (r.model_loaded.status, r.model_loaded.reason) == (False, "ModelInvalid")
    assert r.ready.reason == "FallbackActive" and "placing with load-balance" in r.ready.message
    assert r.placement.name == "load-balance" and r.allocation.name == "drf"

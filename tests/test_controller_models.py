"""Model loading for SchedulingPolicies: missing, corrupt and mismatched models fall back,
a verified model is served, and an unchanged model is not loaded again. A tenant's policy
reads nothing outside the model directories, nothing unbounded, and cannot change what
another tenant's policy is told about its own model and card."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from pathlib import Path

import pytest

from mlsched.api import SchedulingPolicySpec
from mlsched.controller.serving import models
from mlsched.formats.model_sources import MODEL_PARTS, ModelDirs, ModelLoadError, read_bounded
from mlsched.controller.serving.models import ModelResolver
from mlsched.features.card import card_path
from mlsched.policies.onnx_runner import ModelBytes
from mlsched.policies import registry
from mlsched.policies.allocation.drf import DRF
from builders import NS, run

POLICY = (NS, "default")


class ToyLearned:
    """A stand-in learned allocation: its 'model' must start with TOY."""

    name = "toy"
    learned = False  # no per-round copy: served as a heuristic is (nothing to explore or record)
    loads = 0

    def __init__(self, source: ModelBytes):
        if not source.model.startswith(b"TOY"):
            raise ValueError("not a toy model")
        ToyLearned.loads += 1

    def allocate(self, snapshot, ledger):
        DRF().allocate(snapshot, ledger)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(registry.ALLOCATION, "toy", registry.Entry(lambda ctx: ToyLearned(ctx.model_path)))
    ToyLearned.loads = 0
    return ToyLearned


GOOD_CARD, BAD_CARD = b"card: for carded", b"card: for something else"


class CardedLearned:
    """A stand-in learned allocation that, like the ONNX runner, reads the card that came with
    its model and refuses one that is not GOOD_CARD."""

    name = "carded"
    learned = False  # as ToyLearned
    cards: list[bytes] = []

    def __init__(self, source: ModelBytes):
        if source.card is None:
            raise ValueError(f"model card {source.card_name}: No such file")
        CardedLearned.cards.append(source.card)
        if source.card != GOOD_CARD:
            raise ValueError(f"model card {source.card_name} is not the card of {source.model_name}")

    def allocate(self, snapshot, ledger):
        DRF().allocate(snapshot, ledger)


@pytest.fixture
def carded(monkeypatch):
    monkeypatch.setitem(registry.ALLOCATION, "carded",
                        registry.Entry(lambda ctx: CardedLearned(ctx.model_path), learned=True))
    CardedLearned.cards = []
    return CardedLearned


def toy_configmap(model: bytes, card: bytes | None) -> dict:
    return {"binaryData": {"policy.onnx": base64.b64encode(model).decode()},
            "data": {"policy.card.json": card.decode()} if card is not None else {}}


def cm_model(algorithm: str, name: str = "toy-model") -> dict:
    return {"allocation": {algorithm: {"configMapKeyRef": {"name": name, "key": "policy.onnx"}}}}


def path_model(algorithm: str, path) -> dict:
    return {"allocation": {algorithm: {"path": str(path)}}}


def spec(**kw) -> SchedulingPolicySpec:
    return SchedulingPolicySpec.model_validate(kw)


def resolver(tmp_path, configmaps=None, model_dirs=None, **kw) -> ModelResolver:
    """A resolver whose model directory is tmp_path (where most tests write their files)."""
    async def read(namespace, name):
        return (configmaps or {}).get((namespace, name))

    return ModelResolver(read, [str(tmp_path)] if model_dirs is None else model_dirs, **kw)


def test_heuristics_need_no_model(tmp_path):
    r = run(resolver(tmp_path).resolve(POLICY, spec(allocation="srtf", placement="bin-pack")))
    assert r.allocation.name == "srtf" and r.placement.name == "bin-pack"
    assert (r.model_loaded.status, r.model_loaded.reason) == (True, "NoModelNeeded")
    assert r.ready.reason == "Scheduling" and not r.load_failed


def test_missing_model_file_falls_back(tmp_path):
    s = spec(allocation="dl2", models={"allocation": {"dl2": {"path": str(tmp_path / "nope.onnx")}}}, fallback="fifo")
    r = run(resolver(tmp_path).resolve(POLICY, s))
    assert (r.model_loaded.status, r.model_loaded.reason) == (False, "ModelNotFound")
    assert "nope.onnx" in r.model_loaded.message
    assert r.allocation.name == "fifo" and r.ready.reason == "FallbackActive" and r.load_failed


def test_no_model_reference_and_none_shipped(tmp_path, monkeypatch):
    monkeypatch.setattr(models, "shipped_model", lambda name: None)
    r = run(resolver(tmp_path).resolve(POLICY, spec(allocation="dl2")))
    assert r.model_loaded.reason == "NoModelReference" and r.allocation.name == "drf"


def test_without_a_reference_the_shipped_model_serves(tmp_path, toy, monkeypatch):
    shipped = tmp_path / "toy.onnx"
    shipped.write_bytes(b"TOY shipped with the image")
    monkeypatch.setattr(models, "shipped_model", lambda name: str(shipped))
    monkeypatch.setitem(registry.ALLOCATION, "toy", registry.Entry(lambda ctx: ToyLearned(ctx.model_path), learned=True))
    r = run(resolver(tmp_path).resolve(POLICY, spec(allocation="toy", models={})))
    assert r.model_loaded.status and r.allocation.name == "toy"


def test_corrupt_model_falls_back_with_a_clear_reason(tmp_path):
    garbage = tmp_path / "policy.onnx"
    garbage.write_bytes(b"\x00not an onnx graph\xff" * 10)
    s = spec(allocation="dl2", models={"allocation": {"dl2": {"path": str(garbage)}}})
    r = run(resolver(tmp_path).resolve(POLICY, s))
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
    r = run(resolver(tmp_path).resolve(POLICY, s))
    assert r.model_loaded.reason == "ModelDigestMismatch" and toy.loads == 0
    assert r.allocation.name == "drf"


def test_verified_model_is_served_and_cached_by_digest(tmp_path, toy):
    model = tmp_path / "toy.onnx"
    model.write_bytes(b"TOY model v1")
    digest = hashlib.sha256(b"TOY model v1").hexdigest()
    res = resolver(tmp_path)
    s = spec(allocation="toy", models={"allocation": {"toy": {"path": str(model), "sha256": digest}}})
    first = run(res.resolve(POLICY, s))
    second = run(res.resolve(POLICY, s))
    assert first.allocation is second.allocation and toy.loads == 1
    assert first.active_models == {"allocation/toy": digest}
    assert (first.model_loaded.status, first.model_loaded.reason) == (True, "ModelVerified")
    # A new file is a new digest: loaded once more.
    model.write_bytes(b"TOY model v2")
    third = run(res.resolve(POLICY, spec(allocation="toy", models={"allocation": {"toy": {"path": str(model)}}})))
    assert third.allocation is not first.allocation and toy.loads == 2


def test_bad_file_is_remembered_not_reloaded_every_round(tmp_path, toy):
    model = tmp_path / "toy.onnx"
    model.write_bytes(b"garbage")
    res = resolver(tmp_path)
    s = spec(allocation="toy", models={"allocation": {"toy": {"path": str(model)}}})
    first, second = run(res.resolve(POLICY, s)), run(res.resolve(POLICY, s))
    assert first.model_loaded.reason == second.model_loaded.reason == "ModelInvalid"
    assert first.load_failed and not second.load_failed  # the metric counts attempts


def test_model_from_configmap_binary_data_with_its_card_beside_it(tmp_path, carded):
    data = b"TOY from a ConfigMap"
    cms = {(NS, "toy-model"): toy_configmap(data, GOOD_CARD) | {"data": {
        "policy.card.json": GOOD_CARD.decode(), "notes.txt": "not read"}}}
    r = run(resolver(tmp_path, cms).resolve(POLICY, spec(allocation="carded", models=cm_model("carded"))))
    assert r.model_loaded.status and r.active_models == {"allocation/carded": hashlib.sha256(data).hexdigest()}
    # The card reached the loader with the model (bytes: nothing was written to disk).
    assert carded.cards == [GOOD_CARD]


@pytest.mark.parametrize("configmaps, reason", [({}, "ModelNotFound"),
                                                ({(NS, "toy-model"): {"data": {"other": "x"}}}, "ModelNotFound")])
def test_configmap_missing_or_without_key(tmp_path, toy, configmaps, reason):
    s = spec(allocation="toy", models={"allocation": {"toy": {"configMapKeyRef": {"name": "toy-model", "key": "policy.onnx"}}}})
    r = run(resolver(tmp_path, configmaps).resolve(POLICY, s))
    assert r.model_loaded.reason == reason and r.allocation.name == "drf"


def test_unknown_algorithms_fall_back_and_say_so(tmp_path):
    r = run(resolver(tmp_path).resolve(POLICY, spec(allocation="nope", placement="nope2", grouping="x",
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
        built.append(ctx.model_path.model)  # the bytes that were hashed
        if not built[-1].startswith(b"TOY"):
            raise ValueError("not a toy placement model")
        return LoadBalance()

    monkeypatch.setitem(registry.PLACEMENT, "toy-place", registry.Entry(build, learned=True))
    good = tmp_path / "place.onnx"
    good.write_bytes(b"TOY placement")
    r = run(resolver(tmp_path).resolve(POLICY, spec(placement="toy-place",
                                                 models={"placement": {"toy-place": {"path": str(good)}}})))
    assert r.model_loaded.status and set(r.active_models) == {"placement/toy-place"}
    assert built == [b"TOY placement"]
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"garbage")
    r = run(resolver(tmp_path).resolve(POLICY, spec(placement="toy-place",
                                                 models={"placement": {"toy-place": {"path": str(bad)}}})))
    assert (r.model_loaded.status, r.model_loaded.reason) == (False, "ModelInvalid")
    assert r.ready.reason == "FallbackActive" and "placing with load-balance" in r.ready.message
    assert r.placement.name == "load-balance" and r.allocation.name == "drf"


@pytest.mark.parametrize("grouping", ["harmony", "isolated", "naive"])
def test_every_grouping_runs_in_the_cluster(tmp_path, grouping):
    # controller/scheduling/pools.py renders their pools (labels, affinity, divided CPU requests).
    r = run(resolver(tmp_path).resolve(POLICY, spec(grouping=grouping)))
    assert r.grouping.name == grouping
    assert r.ready.reason == "Scheduling"


def test_an_unknown_grouping_still_falls_back_to_none(tmp_path):
    r = run(resolver(tmp_path).resolve(POLICY, spec(grouping="no-such-grouping")))
    assert r.grouping.name == "none"
    assert r.ready.reason == "FallbackActive"
    assert "unknown grouping 'no-such-grouping', grouping with none" in r.ready.message


# ---- paths: only inside the configured model directories ----------------------------------

HEX64 = re.compile(r"[0-9a-f]{64}")


def test_paths_outside_the_model_dirs_are_refused_without_being_touched(tmp_path, toy, monkeypatch):
    models_dir = tmp_path / "models"
    models_dir.mkdir()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "toy.onnx").write_bytes(b"TOY but not in a model directory")
    touched = []
    for name in ("open", "stat", "lstat"):
        real = getattr(os, name)

        def spy(path, *args, _real=real, **kwargs):
            touched.append(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else None
            return _real(path, *args, **kwargs)

        monkeypatch.setattr(os, name, spy)
    res = resolver(tmp_path, model_dirs=[str(models_dir)])
    refused = {}
    for path in ("/etc/passwd", "/dev/zero", "/etc/no-such-file", str(outside / "toy.onnx"),
                 str(outside / "absent.onnx"), str(tmp_path / "models-evil" / "toy.onnx")):
        r = run(res.resolve(POLICY, spec(allocation="toy", models=path_model("toy", path))))
        assert (r.model_loaded.status, r.model_loaded.reason) == (False, "ModelPathNotAllowed"), path
        assert f"configured model directories ({models_dir})" in r.model_loaded.message
        assert not HEX64.search(r.model_loaded.message) and r.active_models == {}
        assert r.allocation.name == "drf" and r.ready.reason == "FallbackActive"
        refused[path] = r.model_loaded.message.replace(repr(path), "PATH")
    # Existing or not, the answer is the same: status tells a tenant nothing about the file.
    assert len(set(refused.values())) == 1, refused
    assert not [p for p in touched if "elsewhere" in p or p.startswith(("/etc", "/dev"))], touched
    assert toy.loads == 0
    # The spies do see what is read: a path inside the directory is looked at.
    run(res.resolve(POLICY, spec(allocation="toy", models=path_model("toy", models_dir / "absent.onnx"))))
    assert any(p.endswith("models/absent.onnx") for p in touched), touched


def test_dot_dot_is_resolved_as_text_before_anything_is_touched(tmp_path):
    """The CRD refuses '..' (CEL); an older CRD does not, and the check does not rely on it."""
    dirs = ModelDirs([str(tmp_path / "models")])
    with pytest.raises(ModelLoadError, match="is not$") as refused:
        dirs.check(f"{tmp_path}/models/../elsewhere/toy.onnx")
    assert refused.value.reason == "ModelPathNotAllowed"
    assert dirs.check(f"{tmp_path}/models/sub/../toy.onnx") == f"{tmp_path}/models/toy.onnx"
    with pytest.raises(ModelLoadError, match="is not$"):
        dirs.check("models/toy.onnx")  # relative: not inside anything


def test_a_symlink_out_of_a_model_dir_is_refused(tmp_path, toy):
    models_dir, outside = tmp_path / "models", tmp_path / "elsewhere"
    models_dir.mkdir(), outside.mkdir()
    (outside / "toy.onnx").write_bytes(b"TOY outside")
    (models_dir / "link.onnx").symlink_to(outside / "toy.onnx")
    (models_dir / "linked-dir").symlink_to(outside)
    (models_dir / "passwd.onnx").symlink_to("/etc/passwd")
    res = resolver(tmp_path, model_dirs=[str(models_dir)])
    for name in ("link.onnx", "linked-dir/toy.onnx", "passwd.onnx"):
        r = run(res.resolve(POLICY, spec(allocation="toy", models=path_model("toy", models_dir / name))))
        assert r.model_loaded.reason == "ModelPathNotAllowed", name
        assert "resolves (through a symlink) outside them" in r.model_loaded.message
    assert toy.loads == 0


def test_a_symlink_inside_a_model_dir_and_a_symlinked_model_dir_serve(tmp_path, toy):
    """Kubernetes mounts ConfigMap volumes as symlinks into a ..data folder: that stays inside."""
    real_dir = tmp_path / "volume"
    (real_dir / "..data").mkdir(parents=True)
    (real_dir / "..data" / "toy.onnx").write_bytes(b"TOY from a volume")
    (real_dir / "toy.onnx").symlink_to("..data/toy.onnx")
    (tmp_path / "models").symlink_to(real_dir)
    res = resolver(tmp_path, model_dirs=[str(tmp_path / "models")])
    for path in (tmp_path / "models" / "toy.onnx", real_dir / "toy.onnx"):
        r = run(res.resolve(POLICY, spec(allocation="toy", models=path_model("toy", path))))
        assert (r.model_loaded.status, r.model_loaded.reason) == (True, "ModelVerified"), r.model_loaded


def test_only_regular_files_are_read(tmp_path, toy):
    fifo = tmp_path / "fifo.onnx"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer forever
    (tmp_path / "folder.onnx").mkdir()
    (tmp_path / "loop.onnx").symlink_to("loop.onnx")
    res = resolver(tmp_path)
    for path in (fifo, tmp_path / "folder.onnx"):
        r = run(res.resolve(POLICY, spec(allocation="toy", models=path_model("toy", path))))
        assert r.model_loaded.reason == "ModelPathNotAllowed" and "is not a regular file" in r.model_loaded.message
    r = run(res.resolve(POLICY, spec(allocation="toy", models=path_model("toy", tmp_path / "loop.onnx"))))
    assert r.model_loaded.reason == "ModelPathNotAllowed" and "does not resolve (a loop)" in r.model_loaded.message


def test_no_model_dirs_configured_refuses_every_path(tmp_path, toy):
    (tmp_path / "toy.onnx").write_bytes(b"TOY")
    r = run(resolver(tmp_path, model_dirs=[]).resolve(POLICY, spec(
        allocation="toy", models=path_model("toy", tmp_path / "toy.onnx"))))
    assert r.model_loaded.reason == "ModelPathNotAllowed" and "none are configured" in r.model_loaded.message


# ---- a model split over several ConfigMaps --------------------------------------------------
def split_configmaps(model: bytes, size: int, card: bytes | None = None, name: str = "toy-model") -> dict:
    """`model` under policy.onnx in parts of `size` bytes: ConfigMaps `name`-1, -2, ..., named
    with the whole's digest by `name`'s annotation (model_sources.MODEL_PARTS)."""
    pieces = [model[i:i + size] for i in range(0, len(model), size)]
    parts = {(NS, f"{name}-{k}"): {"binaryData": {"policy.onnx": base64.b64encode(p).decode()}}
             for k, p in enumerate(pieces, 1)}
    entry = {"sha256": hashlib.sha256(model).hexdigest(), "parts": [n for _, n in parts]}
    main = {"metadata": {"annotations": {MODEL_PARTS: json.dumps({"policy.onnx": entry})}},
            "data": {"policy.card.json": card.decode()} if card is not None else {}}
    return {(NS, name): main, **parts}


def test_a_model_split_over_configmaps_is_joined_and_served(tmp_path, carded):
    model = b"TOY" + bytes(range(256)) * 8
    cms = split_configmaps(model, 700, GOOD_CARD)
    r = run(resolver(tmp_path, cms).resolve(POLICY, spec(allocation="carded", models=cm_model("carded"))))
    assert (r.model_loaded.reason, r.allocation.name) == ("ModelVerified", "carded"), r.model_loaded
    assert r.active_models == {"allocation/carded": hashlib.sha256(model).hexdigest()}
    assert carded.cards == [GOOD_CARD]  # the card beside the key of the ConfigMap the reference names


def _split_verdict(tmp_path, cms, **kw):
    r = run(resolver(tmp_path, cms, **kw).resolve(POLICY, spec(allocation="toy", models=cm_model("toy"))))
    assert r.allocation.name == "drf"  # the fallback schedules
    return r.model_loaded.reason, r.model_loaded.message


def test_a_missing_or_replaced_part_is_refused_with_the_part_named(tmp_path, toy):
    model = b"TOY" + b"a" * 2000
    cms = split_configmaps(model, 700)
    del cms[(NS, "toy-model-2")]
    reason, message = _split_verdict(tmp_path, cms)
    assert reason == "ModelNotFound" and \
        f"ConfigMap {NS}/toy-model-2 (part 2 of 3 of ConfigMap {NS}/toy-model key policy.onnx) not found" in message
    cms = split_configmaps(model, 700)
    cms[(NS, "toy-model-2")] = {"binaryData": {"policy.onnx": base64.b64encode(b"b" * 700).decode()}}
    reason, message = _split_verdict(tmp_path, cms)
    assert reason == "ModelDigestMismatch" and "the 3 parts of" in message and "a part was replaced" in message
    cms = split_configmaps(model, 700)
    cms[(NS, "toy-model-3")] = {"data": {"other": "x"}}
    assert _split_verdict(tmp_path, cms) == (
        "ModelNotFound", f"allocation/toy: ConfigMap {NS}/toy-model-3 (part 3 of 3 of ConfigMap {NS}/toy-model key policy.onnx) "
                         "has no key 'policy.onnx'")
    assert toy.loads == 0


def test_split_models_are_bounded_by_the_size_limit_in_all(tmp_path, toy):
    cms = split_configmaps(b"TOY" + b"x" * 1500, 600)  # each part under 1 KiB, the whole over
    assert _split_verdict(tmp_path, cms, max_model_bytes=1024) == (
        "ModelTooLarge", f"allocation/toy: ConfigMap {NS}/toy-model key policy.onnx (in 3 parts) is larger than the model size "
                         "limit of 1 KiB (--max-model-bytes)")
    too_many = split_configmaps(b"TOY" + b"x" * 100, 1)
    reason, message = _split_verdict(tmp_path, too_many)
    assert reason == "ModelInvalid" and "names 103 parts for 'policy.onnx', at most 80" in message


def test_reading_a_split_model_stops_at_the_first_missing_or_oversized_part(tmp_path, toy):
    reads = []

    def counting(cms):
        async def read(namespace, name):
            reads.append(name)
            return cms.get((namespace, name))
        return ModelResolver(read, [str(tmp_path)], max_model_bytes=1024)

    cms = split_configmaps(b"TOY" + b"x" * 2997, 600)  # five parts
    del cms[(NS, "toy-model-2")]
    run(counting(cms).resolve(POLICY, spec(allocation="toy", models=cm_model("toy"))))
    assert reads == ["toy-model", "toy-model-1", "toy-model-2"]
    reads.clear()
    run(counting(split_configmaps(b"TOY" + b"x" * 2997, 600)).resolve(POLICY, spec(allocation="toy",
                                                                                  models=cm_model("toy"))))
    assert reads == ["toy-model", "toy-model-1", "toy-model-2"]  # 1,200 bytes > 1 KiB: no third read


@pytest.mark.parametrize("annotation, says", [
    ("not json", "is not JSON of the form"),
    (json.dumps({"policy.onnx": {"sha256": "0" * 64, "parts": []}}), "entry 'policy.onnx' is not of the form"),
    (json.dumps({"policy.onnx": {"sha256": "short", "parts": ["a"]}}), "is not of the form"),
    (json.dumps({"policy.onnx": {"sha256": "0" * 64, "parts": ["../x"]}}), "is not of the form"),
])
def test_an_ill_formed_parts_annotation_is_refused(tmp_path, toy, annotation, says):
    cms = split_configmaps(b"TOY" + b"x" * 100, 60)
    cms[(NS, "toy-model")]["metadata"]["annotations"][MODEL_PARTS] = annotation
    reason, message = _split_verdict(tmp_path, cms)
    assert reason == "ModelInvalid" and says in message and MODEL_PARTS in message


def test_a_key_held_and_split_at_once_is_refused_and_other_keys_are_not_split(tmp_path, toy):
    cms = split_configmaps(b"TOY" + b"x" * 100, 60)
    cms[(NS, "toy-model")]["binaryData"] = {"policy.onnx": base64.b64encode(b"TOY").decode()}
    reason, message = _split_verdict(tmp_path, cms)
    assert reason == "ModelInvalid" and "holds key 'policy.onnx' and also names parts for it" in message
    # The annotation splits only the keys it names: another key is read as it is.
    other = {(NS, "toy-model"): toy_configmap(b"TOY whole", None)}
    other[(NS, "toy-model")]["metadata"] = {"annotations": {MODEL_PARTS: json.dumps(
        {"other.onnx": {"sha256": "0" * 64, "parts": ["x"]}})}}
    r = run(resolver(tmp_path, other).resolve(POLICY, spec(allocation="toy", models=cm_model("toy"))))
    assert r.model_loaded.reason == "ModelVerified"


# ---- bounded reads ------------------------------------------------------------------------


def test_a_model_over_the_size_limit_is_refused(tmp_path, toy):
    (tmp_path / "big.onnx").write_bytes(b"TOY" + b"x" * 2048)
    (tmp_path / "fits.onnx").write_bytes(b"TOY" + b"x" * (1024 - 3))  # exactly the limit
    res = resolver(tmp_path, max_model_bytes=1024)
    r = run(res.resolve(POLICY, spec(allocation="toy", models=path_model("toy", tmp_path / "big.onnx"))))
    assert (r.model_loaded.reason, r.allocation.name) == ("ModelTooLarge", "drf") and toy.loads == 0
    assert r.model_loaded.message.endswith("big.onnx is larger than the model size limit of 1 KiB "
                                           "(--max-model-bytes)")
    r = run(res.resolve(POLICY, spec(allocation="toy", models=path_model("toy", tmp_path / "fits.onnx"))))
    assert r.model_loaded.reason == "ModelVerified"


def test_a_card_over_the_size_limit_is_refused(tmp_path, carded):
    (tmp_path / "m.onnx").write_bytes(b"TOY")
    (tmp_path / "m.card.json").write_bytes(b" " * 2048)
    r = run(resolver(tmp_path, max_model_bytes=1024).resolve(POLICY, spec(
        allocation="carded", models=path_model("carded", tmp_path / "m.onnx"))))
    assert r.model_loaded.reason == "ModelTooLarge" and "m.card.json is larger" in r.model_loaded.message


def test_reads_stop_at_the_limit_even_when_the_size_is_unknown():
    """/proc files say they are empty (st_size 0) and are not: the read itself is bounded."""
    assert os.stat("/proc/self/maps").st_size == 0
    with pytest.raises(ModelLoadError, match="larger than the model size limit of 64 bytes"):
        read_bounded("/proc/self/maps", "/proc/self/maps", 64)
    assert len(read_bounded("/proc/self/maps", "maps", 1 << 20)) > 64


@pytest.mark.parametrize("where", ["binaryData", "data"])
def test_a_configmap_value_over_the_size_limit_is_refused(tmp_path, toy, where):
    model = b"TOY" + b"x" * 2048
    value = base64.b64encode(model).decode() if where == "binaryData" else model.decode()
    cms = {(NS, "toy-model"): {where: {"policy.onnx": value}}}
    r = run(resolver(tmp_path, cms, max_model_bytes=1024).resolve(POLICY, spec(
        allocation="toy", models=cm_model("toy"))))
    assert r.model_loaded.reason == "ModelTooLarge" and toy.loads == 0
    assert f"ConfigMap {NS}/toy-model key policy.onnx is larger than" in r.model_loaded.message


# ---- the cache: keyed by model and card, shared only where the verdict is the same --------


def test_a_bad_card_in_one_namespace_does_not_poison_another(tmp_path, carded):
    model = b"TOY the same bytes in both namespaces"
    cms = {("team-b", "toy-model"): toy_configmap(model, BAD_CARD),
           (NS, "toy-model"): toy_configmap(model, GOOD_CARD)}
    res = resolver(tmp_path, cms)
    s = spec(allocation="carded", models=cm_model("carded"))
    bad = run(res.resolve(("team-b", "default"), s))
    assert (bad.model_loaded.status, bad.model_loaded.reason) == (False, "ModelInvalid")
    good = run(res.resolve((NS, "default"), s))
    assert (good.model_loaded.status, good.model_loaded.reason) == (True, "ModelVerified")
    assert good.allocation.name == "carded"
    # ... and the good card's success is not lent to the bad one either.
    again = run(res.resolve(("team-b", "default"), s))
    assert again.model_loaded.reason == "ModelInvalid" and again.allocation.name == "drf"


def test_a_cache_hit_never_skips_the_card_check(tmp_path, carded):
    model = b"TOY the same bytes in both namespaces"
    cms = {(NS, "toy-model"): toy_configmap(model, GOOD_CARD),
           ("team-b", "toy-model"): toy_configmap(model, BAD_CARD),
           ("team-c", "toy-model"): toy_configmap(model, None)}
    res = resolver(tmp_path, cms)
    s = spec(allocation="carded", models=cm_model("carded"))
    assert run(res.resolve((NS, "default"), s)).model_loaded.reason == "ModelVerified"
    for namespace in ("team-b", "team-c"):
        r = run(res.resolve((namespace, "default"), s))
        assert (r.model_loaded.status, r.model_loaded.reason) == (False, "ModelInvalid"), namespace
    # Same model and same card: the verdict is the same, so it is shared, not loaded again.
    run(res.resolve((NS, "second"), s))
    assert carded.cards == [GOOD_CARD, BAD_CARD]


def test_a_card_edited_next_to_an_unchanged_model_is_checked_again(tmp_path, carded):
    (tmp_path / "m.onnx").write_bytes(b"TOY")
    (tmp_path / "m.card.json").write_bytes(GOOD_CARD)
    res = resolver(tmp_path)
    s = spec(allocation="carded", models=path_model("carded", tmp_path / "m.onnx"))
    assert run(res.resolve(POLICY, s)).model_loaded.reason == "ModelVerified"
    (tmp_path / "m.card.json").write_bytes(BAD_CARD)
    assert run(res.resolve(POLICY, s)).model_loaded.reason == "ModelInvalid"


@pytest.fixture
def dl2_artifact() -> tuple[bytes, dict]:
    shipped = models.shipped_model("dl2")
    if shipped is None:
        pytest.fail("the shipped DL² artifact (policy_models/artifacts/dl2/) is missing")
    return Path(shipped).read_bytes(), json.loads(card_path(Path(shipped)).read_text())


def test_the_onnx_runner_checks_each_namespace_card_for_the_same_graph(tmp_path, dl2_artifact):
    """The real runner and model: a card naming another encoder version, in one namespace,
    next to the genuine card for the very same graph in another, in both orders."""
    model, card = dl2_artifact
    stale = {**card, "encoder": {**card["encoder"], "version": "dl2-state-v0"}}
    cms = {(ns, "dl2-policy"): {"binaryData": {"policy.onnx": base64.b64encode(model).decode()},
                                "data": {"policy.card.json": json.dumps(c)}}
           for ns, c in (("team-good", card), ("team-stale", stale))}
    s = spec(allocation="dl2", models=cm_model("dl2", "dl2-policy"))
    for order in (("team-stale", "team-good"), ("team-good", "team-stale")):
        res = resolver(tmp_path, cms)
        verdicts = {ns: run(res.resolve((ns, "default"), s)).model_loaded for ns in order}
        assert verdicts["team-good"].reason == "ModelVerified", order
        assert verdicts["team-stale"].reason == "ModelInvalid", order
        assert "trained with state encoder 'dl2-state-v0'" in verdicts["team-stale"].message
        # The message names the policy's own ConfigMap, not a cache file or another namespace.
        assert "ConfigMap team-stale/dl2-policy key policy.onnx" in verdicts["team-stale"].message
        assert "team-good" not in verdicts["team-stale"].message


def test_a_shared_failure_names_each_policy_own_source_and_counts_once_per_policy(tmp_path, toy):
    cms = {(ns, "toy-model"): toy_configmap(b"garbage", None) for ns in (NS, "team-b")}
    res = resolver(tmp_path, cms)
    s = spec(allocation="toy", models=cm_model("toy"))
    a, b = run(res.resolve((NS, "default"), s)), run(res.resolve(("team-b", "default"), s))
    assert a.model_loaded.reason == b.model_loaded.reason == "ModelInvalid"
    assert a.load_failed and b.load_failed  # each policy's metric counts its own failure once
    assert not run(res.resolve(("team-b", "default"), s)).load_failed


def test_unused_entries_are_evicted(tmp_path, toy):
    (tmp_path / "v1.onnx").write_bytes(b"TOY v1")
    (tmp_path / "v2.onnx").write_bytes(b"TOY v2")
    v1, v2 = (spec(allocation="toy", models=path_model("toy", tmp_path / f"{v}.onnx")) for v in ("v1", "v2"))
    res = resolver(tmp_path)
    digest = {v: hashlib.sha256(f"TOY {v}".encode()).hexdigest() for v in ("v1", "v2")}
    run(res.resolve((NS, "a"), v1))
    run(res.resolve((NS, "b"), v1))
    assert {k[2] for k in res.cached()} == {digest["v1"]}
    run(res.resolve((NS, "a"), v2))  # a changed model; b still uses v1
    assert {k[2] for k in res.cached()} == {digest["v1"], digest["v2"]}
    run(res.resolve((NS, "b"), spec(allocation="drf")))  # b no longer needs a model
    assert {k[2] for k in res.cached()} == {digest["v2"]}
    res.forget((NS, "a"))  # a deleted
    assert res.cached() == set()
    run(res.resolve((NS, "a"), v2))  # gone means loaded afresh
    assert toy.loads == 3


def test_a_failed_verdict_is_evicted_too_so_a_fix_elsewhere_is_not_needed(tmp_path, toy):
    (tmp_path / "bad.onnx").write_bytes(b"garbage")
    res = resolver(tmp_path)
    run(res.resolve(POLICY, spec(allocation="toy", models=path_model("toy", tmp_path / "bad.onnx"))))
    assert len(res.cached()) == 1
    res.forget(POLICY)
    assert res.cached() == set()


# ---- settings ------------------------------------------------------------------------------


def test_model_dirs_and_size_limit_from_flags_and_environment(monkeypatch):
    from mlsched.controller.__main__ import export, parse_args
    from mlsched.controller.process.config import OperatorConfig, shipped_model_dirs

    default = OperatorConfig.from_env({})
    assert default.model_dirs == shipped_model_dirs() and default.max_model_bytes == 64 * 2**20
    assert default.model_dirs and default.model_dirs[0].endswith(os.path.join("policy_models", "artifacts"))
    for name in ("MLSCHED_ALLOWED_MODEL_DIRS", "MLSCHED_MAX_MODEL_BYTES"):
        monkeypatch.setenv(name, "")  # so that what export() writes is undone after the test
    export(parse_args(["--allowed-model-dir", "/models", "--allowed-model-dir", "/srv/a,b",
                       "--max-model-bytes", "2Mi"]))
    config = OperatorConfig.from_env()
    assert config.model_dirs == ("/models", "/srv/a,b") and config.max_model_bytes == 2 * 2**20
    with pytest.raises(SystemExit):
        parse_args(["--max-model-bytes", "lots"])
    with pytest.raises(ValueError, match="'0' is not a positive byte count"):
        OperatorConfig.from_env({"MLSCHED_MAX_MODEL_BYTES": "0"})


def test_an_unavailable_execution_provider_is_a_reason_and_the_policy_falls_back(
        tmp_path, dl2_artifact):
    """The real runner on this machine's CPU-only onnxruntime, asked for CUDA: a verdict
    that says so (and what to install), the fallback allocates, nothing raises."""
    model, card = dl2_artifact
    cms = {(NS, "dl2-policy"): {"binaryData": {"policy.onnx": base64.b64encode(model).decode()},
                                "data": {"policy.card.json": json.dumps(card)}}}
    s = spec(allocation="dl2", fallback="drf", models=cm_model("dl2", "dl2-policy"))
    resolved = run(resolver(tmp_path, cms, execution_provider="CUDA").resolve(POLICY, s))
    assert resolved.model_loaded.status is False
    assert resolved.model_loaded.reason == "ExecutionProviderUnavailable"
    assert "execution provider CUDA is not in this onnxruntime build" in resolved.model_loaded.message
    assert "onnxruntime-gpu" in resolved.model_loaded.message
    assert resolved.ready.reason == "FallbackActive" and isinstance(resolved.allocation, DRF)
    served = run(resolver(tmp_path, cms).resolve(POLICY, s))  # the default: CPU
    assert served.model_loaded.reason == "ModelVerified"


def test_execution_provider_from_flags_and_a_wrong_one_refused_at_start(monkeypatch):
    from mlsched.controller.__main__ import export, parse_args
    from mlsched.controller.process.config import OperatorConfig

    assert OperatorConfig.from_env({}).execution_provider == "CPU"
    monkeypatch.setenv("MLSCHED_EXECUTION_PROVIDER", "")  # undone after the test
    export(parse_args(["--execution-provider", "CUDA"]))
    assert OperatorConfig.from_env().execution_provider == "CUDA"
    assert not OperatorConfig.from_env().problems()
    wrong = OperatorConfig.from_env({"MLSCHED_EXECUTION_PROVIDER": "TPU"}).problems()
    assert wrong == ["--execution-provider 'TPU': choose one of CPU, CUDA"]


def test_one_model_load_error_for_reading_and_for_checking_against_the_card():
    """What reading refuses (model_sources) and what the runner refuses (onnx_runner) are the
    same error, with the condition reason, a ValueError (the registry's contract), and it
    survives a process pool (pickled with its reason)."""
    import pickle

    from mlsched.formats import model_sources
    from mlsched.policies import onnx_runner

    assert model_sources.ModelLoadError is onnx_runner.ModelLoadError is models.ModelLoadError
    with pytest.raises(ModelLoadError) as refused:
        onnx_runner.load_model(ModelBytes(b"x", None, "m.onnx", "m.card.json"), "dl2", "allocation")
    assert refused.value.reason == "ModelInvalid" and isinstance(refused.value, ValueError)
    back = pickle.loads(pickle.dumps(ModelLoadError("ModelNotFound", "no file m.onnx", attempted=False)))
    assert (back.reason, str(back), back.attempted) == ("ModelNotFound", "no file m.onnx", False)

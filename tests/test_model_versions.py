"""Published model versions: the ConfigMap retraining writes is the one the operator reads."""

from __future__ import annotations

import base64
import hashlib
import json

from mlsched.formats import model_versions as mv


def _published(version: int, onnx: bytes = b"graph", policy: str = "default") -> dict:
    return mv.manifest("ns", policy, "allocation", "dl2", version, onnx, '{"card": 1}',
                       {"ratio": 0.8})


def test_a_manifest_parses_back_to_its_version():
    body = _published(3)
    v = mv.parse(body)
    assert (v.policy, v.phase, v.algorithm, v.version) == ("default", "allocation", "dl2", 3)
    assert v.configmap == "default-dl2-v3" == body["metadata"]["name"]
    assert v.sha256 == hashlib.sha256(b"graph").hexdigest()
    assert v.evaluation == {"ratio": 0.8}
    assert base64.b64decode(body["binaryData"]["dl2.onnx"]) == b"graph"
    assert body["data"]["dl2.card.json"] == '{"card": 1}'
    # Pinning it is an ordinary ConfigMap model reference, its card on the key beside it.
    assert v.model_ref == {"configMapKeyRef": {"name": "default-dl2-v3", "key": "dl2.onnx"},
                           "sha256": v.sha256}


def test_ill_formed_or_foreign_configmaps_are_not_versions():
    good = _published(1)
    assert mv.parse({"metadata": {"name": "x"}}) is None
    no_digest = _published(1)
    del no_digest["metadata"]["annotations"][mv.SHA256]
    assert mv.parse(no_digest) is None
    bad_version = _published(1)
    bad_version["metadata"]["labels"][mv.VERSION] = "01"
    assert mv.parse(bad_version) is None
    no_graph = _published(1)
    no_graph["binaryData"] = {}
    assert mv.parse(no_graph) is None
    garbled = _published(1)
    garbled["metadata"]["annotations"][mv.EVALUATION] = "{not json"
    assert mv.parse(garbled).evaluation == {} and mv.parse(good) is not None


def test_versions_count_up_and_identical_bytes_are_found():
    versions = [mv.parse(_published(k, onnx=f"g{k}".encode())) for k in (1, 2, 5)]
    assert mv.newest(versions, "allocation", "dl2").version == 5
    assert mv.next_version(versions, "allocation", "dl2") == 6
    assert mv.next_version(versions, "allocation", "chic") == 1
    assert mv.already_published(versions, "allocation", "dl2", b"g2").version == 2
    assert mv.already_published(versions, "allocation", "dl2", b"new") is None


def test_long_policy_names_still_give_valid_distinct_names():
    a = mv.configmap_name("p" * 250, "dl2", 12)
    b = mv.configmap_name("p" * 249 + "q", "dl2", 12)
    assert len(a) <= 253 and len(b) <= 253 and a != b and a.endswith("-dl2-v12")


def test_a_long_policy_name_is_a_valid_label_and_parses_back_in_full():
    policy = "p" * 100
    body = _published(1, policy=policy)
    label = body["metadata"]["labels"][mv.MODEL_OF]
    assert len(label) <= 63 and mv.selector(policy).startswith(f"{mv.MODEL_OF}={label}")
    assert mv.parse(body).policy == policy


def test_the_selector_names_policy_phase_and_algorithm():
    assert mv.selector("p") == "mlsched.io/model-of=p"
    assert mv.selector("p", "allocation", "dl2") == \
        "mlsched.io/model-of=p,mlsched.io/phase=allocation,mlsched.io/algorithm=dl2"


# ---- a model too large for one ConfigMap -----------------------------------------------------
def test_a_model_over_a_configmap_is_published_as_parts_named_by_the_version():
    onnx = bytes(range(256)) * 10  # 2,560 bytes; parts of 1,000
    parts = mv.part_manifests("ns", "default", "harmony", onnx, '{"card": 1}', part_bytes=1000)
    body = mv.manifest("ns", "default", "placement", "harmony", 2, onnx, '{"card": 1}', {}, parts)
    digest = hashlib.sha256(onnx).hexdigest()
    assert [p["metadata"]["name"] for p in parts] == [f"default-harmony-{digest[:16]}-part-{k}" for k in (1, 2, 3)]
    assert b"".join(base64.b64decode(p["binaryData"]["harmony.onnx"]) for p in parts) == onnx
    assert all(p["metadata"]["labels"] == {mv.PART_OF: "default", mv.ALGORITHM: "harmony",
                                           "app.kubernetes.io/managed-by": "mlsched-retrain"} for p in parts)
    # The version holds the card and names its parts, and is still a version (parts are not).
    assert "binaryData" not in body and body["data"] == {"harmony.card.json": '{"card": 1}'}
    assert json.loads(body["metadata"]["annotations"][mv.MODEL_PARTS]) == {
        "harmony.onnx": {"sha256": digest, "parts": [p["metadata"]["name"] for p in parts]}}
    assert mv.parse(body).sha256 == digest and [mv.parse(p) for p in parts] == [None] * 3
    # A model that fits (with its card) is one ConfigMap, as before.
    assert mv.part_manifests("ns", "default", "harmony", onnx, "{}", part_bytes=4096) == []


def test_a_split_version_with_an_ill_formed_parts_annotation_is_not_a_version():
    parts = mv.part_manifests("ns", "p", "dl2", b"x" * 30, "{}", part_bytes=10)
    body = mv.manifest("ns", "p", "allocation", "dl2", 1, b"x" * 30, "{}", {}, parts)
    body["metadata"]["annotations"][mv.MODEL_PARTS] = '{"dl2.onnx": {"parts": []}}'
    assert mv.parse(body) is None


def test_part_names_stay_valid_for_long_policy_names():
    a = mv.part_name("p" * 250, "harmony", "a" * 64, 12)
    b = mv.part_name("p" * 249 + "q", "harmony", "a" * 64, 12)
    assert len(a) <= 253 and len(b) <= 253 and a != b and a.endswith(f"-harmony-{'a' * 16}-part-12")

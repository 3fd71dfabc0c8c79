"""Published model versions in the scheduling loop (controller/serving/version_adoption.py): Auto adopts
the newest at the next round, Manual only reports it, an explicit model wins (rollback), an
ill-formed or broken version never breaks scheduling; exploration is bounded."""

from __future__ import annotations

from pathlib import Path

from mlsched.api import get_condition
from mlsched.formats import dataset_store as store
from mlsched.controller.scheduling import loop
from mlsched.formats import model_versions
from builders import NOW, NS, cluster, create_jobs, make_runtime, policy, ps_job, run

ARTIFACTS = Path(__file__).resolve().parents[1] / "policy_models" / "artifacts" / "dl2"


def publish(kube, version: int, stem: str, evaluation=None, policy_name="default") -> dict:
    body = model_versions.manifest(NS, policy_name, "allocation", "dl2", version,
                                   (ARTIFACTS / f"{stem}.onnx").read_bytes(),
                                   (ARTIFACTS / f"{stem}.card.json").read_text(),
                                   evaluation or {"jct_gain": 0.1 * version, "note": "text"})
    return kube.put(body)


def step(rt, kube, now):
    async def go():
        result = await loop.run_policy_round(rt, kube.obj("SchedulingPolicy", NS, "default"),
                                             kube.indexes(), now=now)
        assert await rt.writers.status.flush(10) and await rt.writers.objects.flush(10)
        return result

    return run(go())


def setup(**spec):
    rt, kube = make_runtime(cluster(4))
    kube.put(policy(allocation="dl2", **spec))
    run(create_jobs(rt, kube, ps_job("a", epochs=100)))
    rt.cluster.indexes = kube.indexes()
    return rt, kube


def status(kube):
    return kube.obj("SchedulingPolicy", NS, "default")["status"]


def reasons(kube):
    return [e["reason"] for e in kube.events("default")]


def test_auto_adopts_the_newest_published_version_at_the_next_round():
    rt, kube = setup(updatePolicy="Auto")
    step(rt, kube, NOW)
    shipped = status(kube)["modelVersions"]["allocation/dl2"]["active"]
    assert shipped["source"] == "shipped" and status(kube)["modelVersion"] == "dl2 shipped"
    v1 = publish(kube, 1, "dl2-sl")
    step(rt, kube, NOW + 1200)
    active = status(kube)["modelVersions"]["allocation/dl2"]["active"]
    assert active == {"source": "published", "sha256": v1["metadata"]["annotations"]["mlsched.io/sha256"],
                      "configMap": "default-dl2-v1", "version": 1, "evaluation": {"jct_gain": 0.1}}
    assert "candidate" not in status(kube)["modelVersions"]["allocation/dl2"]
    assert status(kube)["modelVersion"] == "dl2 v1"
    assert status(kube)["activeModels"]["allocation/dl2"] == active["sha256"]
    assert "VersionAdopted" in reasons(kube)
    # The decisions of that interval name the version.
    (opened,) = [r for r in store.read_records(kube.of_kind("ConfigMap"), include_open=True)
                 if r.interval == 1]
    assert [d.model_version for d in opened.decisions] == ["1"]


def test_adopting_a_version_with_the_shipped_bytes_is_still_an_event():
    """A version published from the shipped model's weights (a retraining run that kept its
    start, promoted by a negative margin) serves the same sha256: status and the Event must
    still say that version 1 now serves."""
    rt, kube = setup(updatePolicy="Auto")
    step(rt, kube, NOW)
    publish(kube, 1, "dl2")  # the shipped dl2.onnx's bytes
    step(rt, kube, NOW + 1200)
    active = status(kube)["modelVersions"]["allocation/dl2"]["active"]
    assert active["source"] == "published" and active["version"] == 1
    assert "VersionAdopted" in reasons(kube)


def test_manual_only_reports_the_candidate_and_a_pin_rolls_back():
    rt, kube = setup()
    publish(kube, 1, "dl2-sl")
    publish(kube, 2, "dl2", {"jct_gain": 0.25})
    step(rt, kube, NOW)
    entry = status(kube)["modelVersions"]["allocation/dl2"]
    assert entry["active"]["source"] == "shipped"
    # The shipped dl2.onnx is version 2's bytes: then it is not a candidate. Else it is.
    if entry.get("candidate"):
        assert entry["candidate"]["version"] == 2 and entry["candidate"]["evaluation"] == {"jct_gain": 0.25}
    # Auto then adopts v2; pinning v1 in the spec (one edit) serves v1 again.
    run(kube.patch("SchedulingPolicy", NS, "default", {"spec": {"updatePolicy": "Auto"}}))
    step(rt, kube, NOW + 1200)
    assert status(kube)["modelVersions"]["allocation/dl2"]["active"]["version"] == 2
    pin = model_versions.parse(kube.obj("ConfigMap", NS, "default-dl2-v1")).model_ref
    run(kube.patch("SchedulingPolicy", NS, "default", {"spec": {"models": {"allocation": {"dl2": pin}}}}))
    step(rt, kube, NOW + 2400)
    entry = status(kube)["modelVersions"]["allocation/dl2"]
    assert entry["active"]["source"] == "spec" and entry["active"]["version"] == 1
    assert entry["candidate"]["version"] == 2
    assert status(kube)["modelVersion"] == "dl2 v1"


def test_ill_formed_and_broken_versions_never_break_scheduling():
    rt, kube = setup(updatePolicy="Auto")
    publish(kube, 1, "dl2-sl")
    ill = publish(kube, 5, "dl2")
    del ill["metadata"]["annotations"]["mlsched.io/sha256"]  # labelled, but not a version
    kube.put(ill)
    step(rt, kube, NOW)
    assert status(kube)["modelVersions"]["allocation/dl2"]["active"]["version"] == 1
    v1_sha = status(kube)["modelVersions"]["allocation/dl2"]["active"]["sha256"]
    broken = publish(kube, 2, "dl2")
    broken["binaryData"]["dl2.onnx"] = "Z2FyYmFnZQ=="  # garbage, sha256 annotation stale
    kube.put(broken)
    report = step(rt, kube, NOW + 1200)
    loaded = get_condition(status(kube)["conditions"], "ModelLoaded")
    assert loaded.status == "False" and loaded.reason == "ModelDigestMismatch"
    assert "published version in ConfigMap default-dl2-v2" in loaded.message
    # The previous good version keeps serving, not the heuristic fallback, and status says so.
    assert report.allocation == "dl2" and report.targets["a"].count("worker") > 0
    entry = status(kube)["modelVersions"]["allocation/dl2"]
    assert entry["active"]["version"] == 1 and entry["active"]["sha256"] == v1_sha
    assert entry["candidate"]["version"] == 2
    ready = get_condition(status(kube)["conditions"], "Ready")
    assert ready.reason == "FallbackActive" and "serving ConfigMap default-dl2-v1" in ready.message
    # Every published version broken: the shipped model serves; it unusable too: the fallback.
    v1 = kube.obj("ConfigMap", NS, "default-dl2-v1")
    v1["binaryData"]["dl2.onnx"] = "Z2FyYmFnZQ=="
    kube.put(v1)
    report = step(rt, kube, NOW + 2400)
    assert report.allocation == "dl2"
    assert status(kube)["modelVersions"]["allocation/dl2"]["active"]["source"] == "shipped"


def test_a_broken_pinned_model_is_not_replaced_by_another_version():
    """A model the spec names is what the user asked for: if it fails, the heuristic fallback
    runs (and says so), never some other published version."""
    rt, kube = setup(updatePolicy="Auto")
    publish(kube, 1, "dl2-sl")
    step(rt, kube, NOW)
    pin = model_versions.parse(kube.obj("ConfigMap", NS, "default-dl2-v1")).model_ref
    pin["sha256"] = "0" * 64
    run(kube.patch("SchedulingPolicy", NS, "default", {"spec": {"models": {"allocation": {"dl2": pin}}}}))
    report = step(rt, kube, NOW + 1200)
    assert report.allocation == "drf"
    loaded = get_condition(status(kube)["conditions"], "ModelLoaded")
    assert loaded.reason == "ModelDigestMismatch" and "published version" not in loaded.message


def test_exploration_is_clamped_and_said_so():
    rt, kube = setup(exploration={"epsilon": 0.5})
    step(rt, kube, NOW)
    assert status(kube)["exploration"] == {"requested": 0.5, "applied": 0.2}
    assert "ExplorationClamped" in reasons(kube)
    (opened,) = store.read_records(kube.of_kind("ConfigMap"), include_open=True)
    assert opened.decisions[0].epsilon == 0.2


def test_a_heuristic_policy_lists_no_versions():
    rt, kube = make_runtime(cluster(2))
    kube.put(policy())
    step(rt, kube, NOW)
    assert not [c for c in kube.calls if c[0] == "list" and "model-of" in c[3]]
    assert "modelVersions" not in status(kube) or status(kube)["modelVersions"] == {}

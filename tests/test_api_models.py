"""The pydantic API models: good objects parse, bad ones fail with messages naming the field."""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from mlsched.api import (
    MAX_HISTORY,
    ConditionStatus,
    InvalidObject,
    MLJob,
    Progress,
    SchedulingPolicy,
    append_bounded,
    get_condition,
    immutable_changes,
    is_condition_true,
    set_condition,
)
from mlsched.api.mljob import MAX_NAME_LENGTH
from mlsched.workloads.catalog import ALIASES, MODEL_NAMES

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "manifests" / "samples"
TEMPLATE = {"spec": {"containers": [{"name": "main", "image": "python:3.12-slim"}]}}


def mljob(**spec) -> dict:
    """A valid ParameterServer MLJob; keyword arguments replace spec fields."""
    base = {
        "modelType": "resnet-50",
        "architecture": "ParameterServer",
        "epochs": 100,
        "replicaSpecs": {
            "ps": {"min": 1, "max": 2, "template": TEMPLATE},
            "worker": {"min": 1, "max": 4, "template": TEMPLATE},
        },
    }
    base.update(spec)
    return {"apiVersion": "mlsched.io/v1alpha1", "kind": "MLJob",
            "metadata": {"name": "job", "namespace": "team-a"}, "spec": copy.deepcopy(base)}


def policy(**spec) -> dict:
    return {"apiVersion": "mlsched.io/v1alpha1", "kind": "SchedulingPolicy",
            "metadata": {"name": "p", "namespace": "team-a"}, "spec": spec}


def rejection(model, obj) -> str:
    with pytest.raises(InvalidObject) as info:
        model.from_k8s(obj)
    message = str(info.value)
    assert "\n" not in message
    return message


# ------------------------------------------------------------------------------ MLJob


def test_good_mljob_parses_with_defaults():
    job = MLJob.from_k8s(mljob())
    assert job.spec.scheduling_policy == "default"  # the namespace's `default` policy
    assert job.spec.run_policy.suspend is False
    assert job.spec.run_policy.clean_pod_policy == "Running"
    assert job.spec.replica_specs.worker.max == 4
    assert job.status.phase is None and job.status.history == []


def test_mljob_round_trips_through_wire_form():
    job = MLJob.from_k8s(mljob(globalBatchSize=64))
    assert MLJob.from_k8s(job.to_k8s()) == job
    assert job.to_k8s()["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"


@pytest.mark.parametrize("name", [*MODEL_NAMES, *ALIASES])
def test_every_catalog_model_and_alias_is_accepted(name):
    assert MLJob.from_k8s(mljob(modelType=name)).spec.model_type == name


def test_min_above_max_names_the_field():
    obj = mljob()
    obj["spec"]["replicaSpecs"]["worker"].update(min=5, max=3)
    assert rejection(MLJob, obj) == (
        "MLJob team-a/job: spec.replicaSpecs.worker.max: must be >= min")


def test_any_model_label_is_accepted_and_a_malformed_one_names_the_field():
    # The catalog is a source of priors, not a closed list: any lowercase label schedules.
    assert MLJob.from_k8s(mljob(modelType="gpt-9")).spec.model_type == "gpt-9"
    assert MLJob.from_k8s(mljob(modelType=None)).spec.model_type is None
    assert "spec.modelType:" in rejection(MLJob, mljob(modelType="GPT 9!"))


def test_speed_prior_must_be_positive():
    ok = MLJob.from_k8s(mljob(modelType="gpt-9", speedPrior={"referenceEpochsPerHour": 12.5}))
    assert ok.spec.speed_prior.reference_epochs_per_hour == 12.5
    assert "spec.speedPrior.referenceEpochsPerHour:" in rejection(
        MLJob, mljob(speedPrior={"referenceEpochsPerHour": 0}))


@pytest.mark.parametrize("epochs", [0, -1])
def test_non_positive_epochs_rejected(epochs):
    assert "spec.epochs: Input should be greater than 0" in rejection(MLJob, mljob(epochs=epochs))


def test_ps_on_allreduce_rejected():
    message = rejection(MLJob, mljob(architecture="AllReduce"))
    assert message.endswith("spec.replicaSpecs.ps: must not be set for AllReduce jobs")


def test_parameter_server_job_needs_ps():
    obj = mljob()
    del obj["spec"]["replicaSpecs"]["ps"]
    assert "spec.replicaSpecs.ps: is required for ParameterServer jobs" in rejection(MLJob, obj)


def test_allreduce_without_ps_is_fine():
    obj = mljob(architecture="AllReduce")
    del obj["spec"]["replicaSpecs"]["ps"]
    assert MLJob.from_k8s(obj).spec.replica_specs.ps is None


def test_unknown_clean_pod_policy_rejected():
    message = rejection(MLJob, mljob(runPolicy={"cleanPodPolicy": "Sometimes"}))
    assert "spec.runPolicy.cleanPodPolicy: Input should be 'All', 'Running' or 'None'" in message


def test_unknown_architecture_rejected():
    assert "spec.architecture:" in rejection(MLJob, mljob(architecture="Ring"))


def test_typo_in_spec_is_an_error_not_a_silent_drop():
    assert "spec.replicaSpecs.worker.maxx: Extra inputs are not permitted" in rejection(
        MLJob, _with_worker(maxx=3))


def _with_worker(**fields) -> dict:
    obj = mljob()
    obj["spec"]["replicaSpecs"]["worker"].update(fields)
    return obj


@pytest.mark.parametrize("bad", [{"min": 0}, {"max": 1001}, {"template": {}}])
def test_replica_bounds_and_template_checked(bad):
    field = next(iter(bad))
    assert f"spec.replicaSpecs.worker.{field}:" in rejection(MLJob, _with_worker(**bad))


def test_missing_worker_and_several_errors_on_one_line():
    obj = mljob(epochs=0)
    del obj["spec"]["replicaSpecs"]["worker"]
    message = rejection(MLJob, obj)
    assert "spec.epochs:" in message and "spec.replicaSpecs.worker: Field required" in message
    assert "; " in message


def test_name_must_fit_pod_and_service_names():
    obj = mljob()
    obj["metadata"]["name"] = "x" * (MAX_NAME_LENGTH + 1)
    assert "metadata.name must be a DNS-1035 label" in rejection(MLJob, obj)
    obj["metadata"]["name"] = "1job"
    assert "DNS-1035" in rejection(MLJob, obj)
    del obj["metadata"]["name"]  # generateName: nothing to check before the apiserver names it
    MLJob.from_k8s(obj)


def test_parses_read_only_mappings_like_kopf_bodies():
    class Body(Mapping):  # kopf's Body is a Mapping view, not a dict
        def __init__(self, data):
            self._data = data

        def __getitem__(self, key):
            value = self._data[key]
            return Body(value) if isinstance(value, dict) else value

        def __iter__(self):
            return iter(self._data)

        def __len__(self):
            return len(self._data)

    assert MLJob.from_k8s(Body(mljob())).spec.epochs == 100


def test_status_parses_and_ignores_unknown_status_fields():
    obj = mljob()
    obj["status"] = {
        "phase": "Running",
        "kopf": {"progress": {}},  # written by an older operator; must not break parsing
        "conditions": [{"type": "Running", "status": "True", "reason": "PodsReady",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        "replicaStatuses": {"ps": {"desired": 2, "ready": 1}, "worker": {"desired": 4}},
        "placement": {"pool": "a", "ps": ["n1", "n2"], "worker": ["n1", "n2", "n3", "n3"]},
        "progress": {"epochsDone": 12.0, "speed": 0.01, "summary": "12.0/100"},
        "history": [{"interval": 0, "start": "2026-01-01T00:00:00Z", "ps": 2, "workers": 4,
                     "epochs": 1.5, "reward": 0.3}],
    }
    job = MLJob.from_k8s(obj)
    assert job.status.replica_statuses.worker.ready == 0
    assert job.status.history[0].start == datetime(2026, 1, 1, tzinfo=UTC)
    wire = job.to_k8s()["status"]
    assert "kopf" not in wire and wire["history"][0]["start"] == "2026-01-01T00:00:00Z"


def test_status_values_are_validated_too():
    obj = mljob()
    obj["status"] = {"phase": "Exploded"}
    assert "status.phase:" in rejection(MLJob, obj)
    obj["status"] = {"history": [{"interval": 0}]}
    assert "status.history[0].start: Field required" in rejection(MLJob, obj)


def test_progress_summary_for_the_printer_column():
    assert Progress.of(12, 100, 0.01).summary == "12.0/100"
    assert Progress.of(3.25, 7.5, 0.01).summary == "3.2/7.5"


def test_immutable_fields_are_reported():
    old = MLJob.from_k8s(mljob()).spec
    new = MLJob.from_k8s(mljob(modelType="vgg-16", epochs=50)).spec
    assert immutable_changes(old, new) == ["modelType"]


# -------------------------------------------------------------------- SchedulingPolicy


def test_empty_policy_is_the_heuristic_default():
    spec = SchedulingPolicy.from_k8s(policy()).spec
    assert (spec.interval, spec.allocation, spec.placement, spec.grouping, spec.fallback,
            spec.history_limit, spec.exploration.epsilon) == (
        1200, "drf", "load-balance", "none", "drf", 50, 0.0)
    no_spec = policy()
    del no_spec["spec"]
    assert SchedulingPolicy.from_k8s(no_spec).spec == spec


def test_model_reference_needs_exactly_one_source():
    cm = {"configMapKeyRef": {"name": "dl2-policy", "key": "policy.onnx"}}
    ok = SchedulingPolicy.from_k8s(policy(allocation="dl2", models={"allocation": {"dl2": cm}}))
    assert ok.spec.models.allocation["dl2"].config_map_key_ref.key == "policy.onnx"
    both = {**cm, "path": "/models/dl2.onnx"}
    for ref in (both, {}):
        assert rejection(SchedulingPolicy, policy(models={"allocation": {"dl2": ref}})).endswith(
            "spec.models.allocation.dl2: set exactly one of configMapKeyRef or path")


def test_sha256_must_be_a_real_digest_not_a_placeholder():
    ref = {"path": "/models/dl2/policy.onnx", "sha256": "<sha256>"}
    assert "spec.models.allocation.dl2.sha256:" in rejection(SchedulingPolicy, policy(models={"allocation": {"dl2": ref}}))
    ref["sha256"] = "ab" * 32
    SchedulingPolicy.from_k8s(policy(models={"allocation": {"dl2": ref}}))


@pytest.mark.parametrize("spec, field", [
    ({"interval": 0}, "interval"),
    ({"historyLimit": 1001}, "historyLimit"),
    ({"exploration": {"epsilon": 1.5}}, "exploration.epsilon"),
    ({"allocation": "DL2"}, "allocation"),
    ({"models": {"allocation": {"dl2": {"path": "relative.onnx"}}}}, "models.allocation.dl2.path"),
])
def test_policy_bounds(spec, field):
    assert f"spec.{field}:" in rejection(SchedulingPolicy, policy(**spec))


@pytest.mark.parametrize("path, refused", [
    ("/models/../etc/passwd", True), ("/models/dl2/..", True), ("/../x.onnx", True),
    ("/models/..dl2/x.onnx", False), ("/models/dl2..onnx", False), ("/models/dl2/x.onnx", False),
])
def test_model_paths_with_parent_segments_are_refused_at_admission(path, refused):
    body = policy(allocation="dl2", models={"allocation": {"dl2": {"path": path}}})
    if refused:
        assert rejection(SchedulingPolicy, body).endswith(
            "spec.models.allocation.dl2.path: path must not contain '..' segments")
    else:
        SchedulingPolicy.from_k8s(body)


# --------------------------------------------------------------------------- samples


def load_samples() -> list[tuple[str, dict]]:
    return [(p.name, yaml.safe_load(p.read_text())) for p in sorted(SAMPLES.glob("*.yaml"))
            if p.name != "kustomization.yaml"]


def test_samples_exist():
    names = {name for name, _ in load_samples()}
    assert names == {"mljob-resnet50-ps.yaml", "mljob-allreduce.yaml", "schedulingpolicy-dl2.yaml",
                     "pvc-resnet50-ps.yaml", "pvc-resnext110-allreduce.yaml"}
    listed = yaml.safe_load((SAMPLES / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(names)


@pytest.mark.parametrize("name, obj", load_samples())
def test_samples_validate_against_the_models(name, obj):
    if obj["kind"] == "PersistentVolumeClaim":  # the jobs' checkpoint volumes
        assert obj["spec"]["accessModes"] == ["ReadWriteMany"]
        return
    model = {"MLJob": MLJob, "SchedulingPolicy": SchedulingPolicy}[obj["kind"]]
    model.from_k8s(obj)


def test_sample_jobs_checkpoint_into_a_claim_the_samples_make():
    samples = dict(load_samples())
    claims = {o["metadata"]["name"] for o in samples.values() if o["kind"] == "PersistentVolumeClaim"}
    for name in ("mljob-resnet50-ps.yaml", "mljob-allreduce.yaml"):
        for role in samples[name]["spec"]["replicaSpecs"].values():
            spec = role["template"]["spec"]
            (volume,) = [v for v in spec["volumes"] if v["name"] == "checkpoint"]
            assert volume["persistentVolumeClaim"]["claimName"] in claims
            assert {"name": "checkpoint", "mountPath": "/checkpoint"} in spec["containers"][0]["volumeMounts"]


def test_sample_policies_match_what_the_jobs_reference():
    samples = dict(load_samples())
    # Applying the samples must not replace a namespace's own `default` (the training
    # namespace's, which the all-reduce job uses): they bring no object of a name it has.
    namespace = {(d["kind"], d["metadata"]["name"])
                 for p in (SAMPLES.parent / "base" / "training-namespace").glob("*.yaml")
                 for d in yaml.safe_load_all(p.read_text()) if d and d.get("kind") != "Kustomization"}
    assert ("SchedulingPolicy", "default") in namespace
    assert not namespace & {(o["kind"], o["metadata"]["name"]) for o in samples.values()}
    dl2 = SchedulingPolicy.from_k8s(samples["schedulingpolicy-dl2.yaml"]).spec
    # No model named: the operator serves the one it ships, so the sample runs as shipped.
    assert dl2.allocation == "dl2" and not dl2.models.allocation
    ps_job = MLJob.from_k8s(samples["mljob-resnet50-ps.yaml"]).spec
    assert ps_job.architecture == "ParameterServer" and ps_job.scheduling_policy == "dl2"
    ar_job = MLJob.from_k8s(samples["mljob-allreduce.yaml"]).spec
    assert ar_job.architecture == "AllReduce" and ar_job.scheduling_policy == "default"


# ------------------------------------------------------------------------ conditions

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_set_condition_adds_and_replaces_by_type():
    conds = set_condition([], "Ready", True, "Loaded", now=T0)
    conds = set_condition(conds, "ModelLoaded", "False", "Missing", "no ConfigMap", now=T0)
    assert [c.type for c in conds] == ["Ready", "ModelLoaded"]
    assert is_condition_true(conds, "Ready") and not is_condition_true(conds, "ModelLoaded")
    assert get_condition(conds, "Absent") is None


def test_transition_time_kept_when_status_unchanged_and_moved_when_changed():
    first = set_condition(None, "Running", ConditionStatus.TRUE, "PodsReady", now=T0)
    later = T0 + timedelta(hours=1)
    same = set_condition(first, "Running", True, "StillReady", "all pods ready", now=later)
    assert same[0].last_transition_time == T0 and same[0].reason == "StillReady"
    flipped = set_condition(same, "Running", False, "PodFailed", now=later)
    assert flipped[0].last_transition_time == later
    assert first[0].reason == "PodsReady"  # inputs are not modified


def test_set_condition_accepts_raw_dicts_and_returns_wire_ready_models():
    raw = [{"type": "Ready", "status": "True", "reason": "Ok",
            "lastTransitionTime": "2026-01-01T00:00:00Z", "message": ""}]
    out = set_condition(raw, "Ready", True, "Ok", observed_generation=3, now=T0 + timedelta(1))
    assert out[0].to_k8s() == {"type": "Ready", "status": "True", "reason": "Ok",
                               "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z",
                               "observedGeneration": 3}


def test_bad_reason_rejected():
    with pytest.raises(ValueError):
        set_condition([], "Ready", True, "not camel case")


def test_append_bounded_keeps_the_newest():
    assert append_bounded([1, 2, 3], 4, limit=2) == [3, 4]
    assert append_bounded(None, 1, limit=5) == [1]
    assert len(append_bounded(list(range(MAX_HISTORY)), -1, limit=10**6)) == MAX_HISTORY


# ----------------------------------------------------------------------------- hygiene


def test_api_never_imports_torch():
    code = ("import sys, mlsched.api, mlsched.api.crdgen; "
            "sys.exit('torch' in sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True,
                   env={"PYTHONPATH": str(ROOT / "operator")})

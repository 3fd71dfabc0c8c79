"""Learned models served from ConfigMaps and model directories: a corrupt model, and the
model paths a tenant's policy may and may not name; in both the fallback's pods run.

A model that cannot be served must be reported (condition, Warning Event) while the policy
goes on scheduling with its fallback. A policy names files only in the operator's model
directories, never anything bigger than its size limit. The tests of this module that need
no pod (a live policy swap, one tenant's bad card, an unavailable execution provider) run on
an API server alone: e2e/apiserver/test_api_models.py.
"""

from __future__ import annotations

import hashlib
import json
import re

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dl2_model import (
    configmap_ref, corrupt_configmap, model_configmap, model_directory, path_ref,
)
from job_state import counts
from mlsched_objects import condition, mljob, scheduling_policy
from signals import ROUND_TIMEOUT, model_loaded
from waiting import wait_for

HEX64 = re.compile(r"[0-9a-f]{64}")  # a sha256 digest


def test_corrupt_model_is_reported_and_scheduling_falls_back(api, mlsched, operator, dl2_files):
    model, card, _ = dl2_files
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map(mlsched.namespace, corrupt_configmap("dl2-policy", card))
    mlsched.create(scheduling_policy("learned", allocation="dl2", fallback="drf",
                                     models={"allocation": {"dl2": configmap_ref("dl2-policy")}}))
    mlsched.create(mljob("resnet", ps=(1, 2), workers=(1, 2), epochs=1e9, policy="learned"))

    policy = wait_for(lambda: (c := condition(p := mlsched.policy("learned"), "ModelLoaded"))
                      and c["status"] == "False" and p, ROUND_TIMEOUT,
                      "ModelLoaded=False on the policy")
    loaded = condition(policy, "ModelLoaded")
    assert loaded["reason"] == "ModelInvalid"
    assert re.search(r"sha256 .* does not match its card", loaded["message"]), loaded["message"]
    ready = condition(policy, "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "FallbackActive")
    assert "allocating with drf" in ready["message"]
    assert policy["status"]["activeModels"] == {}
    warnings = wait_for(lambda: [e for e in mlsched.events("learned", "SchedulingPolicy")
                                 if e.type == "Warning" and e.reason == "ModelInvalid"],
                        30, "a Warning Event ModelInvalid")
    assert "does not match its card" in warnings[0].message

    # Scheduling goes on with the fallback: the job gets its tasks and its pods run.
    wait_for(lambda: all(counts(mlsched, "resnet").values()), ROUND_TIMEOUT,
             "the fallback (drf) to allocate the job")
    wait_for(lambda: len([p for p in mlsched.pods("resnet") if p.status.phase == "Running"])
             == sum(counts(mlsched, "resnet").values()), 90, "the job's pods to run")
    metrics = operator.metrics()
    assert re.search(r'mlsched_model_load_failures_total\{[^}]*reason="ModelInvalid"[^}]*\} '
                     r'[1-9]', metrics), metrics

    # Replacing the ConfigMap with the genuine model heals the policy at the next round.
    core.replace_namespaced_config_map("dl2-policy", mlsched.namespace,
                                       model_configmap("dl2-policy", model, card))
    healed = wait_for(lambda: (c := condition(p := mlsched.policy("learned"), "ModelLoaded"))
                      and c["status"] == "True" and p, ROUND_TIMEOUT,
                      "ModelLoaded=True after the fix")
    assert condition(healed, "ModelLoaded")["reason"] == "ModelVerified"
    assert set(healed["status"]["activeModels"]) == {"allocation/dl2"}


def test_model_paths_outside_the_model_directories_are_refused(mlsched, start_operator,
                                                                dl2_files, tmp_path):
    model, card, _ = dl2_files
    models_dir = tmp_path / "models"
    good = model_directory(models_dir, model, card)
    (models_dir / "big.onnx").write_bytes(b"\0" * (2**20 + 1))  # one byte over --max-model-bytes
    operator = start_operator(model_dirs=[models_dir], max_model_bytes="1Mi")

    # '..' never reaches the operator: the apiserver refuses it (the CRD's CEL rule).
    with pytest.raises(ApiException) as refused:
        mlsched.create(scheduling_policy("dotdot", allocation="dl2", models={
            "allocation": {"dl2": path_ref(f"{models_dir}/../../../etc/passwd")}}))
    assert refused.value.status == 422
    assert "path must not contain '..' segments" in refused.value.body

    paths = {"passwd": "/etc/passwd", "zero": "/dev/zero", "absent": "/etc/no-such-file",
             "big": models_dir / "big.onnx", "good": good}
    for name, path in paths.items():
        mlsched.create(scheduling_policy(name, allocation="dl2", fallback="drf",
                                         models={"allocation": {"dl2": path_ref(path)}}))
    # Never finishes within the test: a job of the tenant whose policy names /dev/zero.
    mlsched.create(mljob("resnet", ps=(1, 2), workers=(1, 2), epochs=1e9, policy="zero"))

    policies = {name: model_loaded(mlsched, name) for name in paths}
    refusals = {}
    for name in ("passwd", "zero", "absent"):
        loaded, status = condition(policies[name], "ModelLoaded"), policies[name]["status"]
        assert (loaded["status"], loaded["reason"]) == ("False", "ModelPathNotAllowed"), loaded
        assert f"must be inside one of the configured model directories ({models_dir})" in loaded["message"]
        # Nothing read, nothing told: no digest anywhere in status, and the same words
        # for a file that exists as for one that does not.
        assert not HEX64.search(json.dumps(status)), status
        assert status["activeModels"] == {}
        ready = condition(policies[name], "Ready")
        assert (ready["status"], ready["reason"]) == ("True", "FallbackActive")
        assert "allocating with drf" in ready["message"]
        refusals[name] = loaded["message"].replace(repr(paths[name]), "PATH")
    assert refusals["passwd"] == refusals["zero"] == refusals["absent"], refusals

    big = condition(policies["big"], "ModelLoaded")
    assert (big["status"], big["reason"]) == ("False", "ModelTooLarge")
    assert "big.onnx is larger than the model size limit of 1 MiB" in big["message"]
    served = policies["good"]
    assert condition(served, "ModelLoaded")["reason"] == "ModelVerified"
    assert served["status"]["activeModels"] == {
        "allocation/dl2": hashlib.sha256(model.read_bytes()).hexdigest()}

    warning = wait_for(lambda: [e for e in mlsched.events("zero", "SchedulingPolicy")
                                if e.type == "Warning" and e.reason == "ModelPathNotAllowed"],
                       30, "a Warning Event ModelPathNotAllowed")[0]
    assert "configured model directories" in warning.message and not HEX64.search(warning.message)

    # The operator did not read /dev/zero (it would have run out of memory): it is alive and
    # the tenant's job is scheduled by the fallback and runs.
    wait_for(lambda: all(counts(mlsched, "resnet").values()), ROUND_TIMEOUT,
             "the fallback (drf) to allocate the job under policy zero")
    wait_for(lambda: len([p for p in mlsched.pods("resnet") if p.status.phase == "Running"])
             == sum(counts(mlsched, "resnet").values()), 90, "the job's pods to run")
    assert operator.running()
    assert re.search(r'mlsched_model_load_failures_total\{[^}]*policy="zero"[^}]*'
                     r'reason="ModelPathNotAllowed"[^}]*\} [1-9]', operator.metrics())

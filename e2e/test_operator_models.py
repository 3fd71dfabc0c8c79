"""Learned models served from ConfigMaps and model directories: a live policy swap, a
corrupt model, and what one tenant's policy may and may not do.

Editing a SchedulingPolicy must change the very next round's decisions without a
restart; a model that cannot be served must be reported (condition, Warning Event)
while the policy goes on scheduling with its fallback. A policy names files only in the
operator's model directories, never anything bigger than its size limit, and a tenant's
card never changes the verdict another tenant gets for the same model.
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
    stale_card_configmap,
)
from job_state import counts
from mlsched_objects import condition, mljob, scheduling_policy
from signals import ROUND_TIMEOUT, model_loaded, round_of_generation
from waiting import wait_for

HEX64 = re.compile(r"[0-9a-f]{64}")  # a sha256 digest


def test_swapping_drf_to_dl2_and_back_changes_the_next_round(api, mlsched, operator, dl2_files):
    model, card, origin = dl2_files
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    client.CoreV1Api(api).create_namespaced_config_map(
        mlsched.namespace, model_configmap("dl2-policy", model, card))
    policy = mlsched.create(scheduling_policy("swap", allocation="drf"))
    # Never finishes within the test: every round re-decides it.
    mlsched.create(mljob("resnet", ps=(1, 4), workers=(1, 8), epochs=1e9, policy="swap"))

    before = wait_for(lambda: all(counts(mlsched, "resnet").values()) and counts(mlsched, "resnet"),
                      ROUND_TIMEOUT, "a drf allocation for the job")
    status = mlsched.policy("swap")["status"]
    assert status["activeModels"] == {}
    assert condition(mlsched.policy("swap"), "ModelLoaded")["reason"] == "NoModelNeeded"

    # drf → dl2, as `kubectl edit` would: the next round loads the model and decides with it.
    generation = mlsched.patch_policy("swap", {"allocation": "dl2",
                                              "models": {"allocation": {"dl2": configmap_ref("dl2-policy")}}}
                                      )["metadata"]["generation"]
    assert generation > policy["metadata"].get("generation", 1)
    swapped = round_of_generation(mlsched, "swap", generation)
    assert swapped["status"]["activeModels"] == {"allocation/dl2": digest}, origin
    loaded = condition(swapped, "ModelLoaded")
    assert (loaded["status"], loaded["reason"]) == ("True", "ModelVerified")
    assert loaded["observedGeneration"] == generation
    under_dl2 = counts(mlsched, "resnet")
    assert {"ModelLoaded"} <= {e.reason for e in mlsched.events("swap", "SchedulingPolicy")
                               if e.type == "Normal"}
    print(f"drf decided {before}, dl2 ({origin}) decided {under_dl2}")

    # dl2 → drf: the model is dropped from activeModels and drf decides again.
    generation = mlsched.patch_policy("swap", {"allocation": "drf"})["metadata"]["generation"]
    back = round_of_generation(mlsched, "swap", generation)
    assert back["status"]["activeModels"] == {}
    assert condition(back, "ModelLoaded")["reason"] == "NoModelNeeded"
    after = wait_for(lambda: counts(mlsched, "resnet") == before and counts(mlsched, "resnet"),
                     ROUND_TIMEOUT, f"drf's allocation {before} again",
                     describe=lambda: counts(mlsched, "resnet"))
    assert after == before
    if origin.startswith("untrained"):
        # The seeded test network is known to give this job all 8 workers where drf
        # gives 4: the two rounds really decided differently. (A trained artifact may
        # agree with drf here; then the reported algorithm above is the difference.)
        assert under_dl2 != before, f"dl2 decided like drf ({before}); model: {origin}"


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


def test_a_bad_card_in_one_namespace_does_not_break_another(api, mlsched, second_tenant,
                                                            start_operator, dl2_files):
    """Two tenants, the same model bytes: B's card names an encoder version this operator
    does not have, A's is the genuine card. B is refused, A is served, in that order (the
    cache once remembered B's refusal for A's bytes) and back (A's success for B's)."""
    model, card, _ = dl2_files
    tenant_a, tenant_b = mlsched, second_tenant
    start_operator(namespaces=[tenant_a.namespace, tenant_b.namespace])
    client.CoreV1Api(api).create_namespaced_config_map(
        tenant_b.namespace, stale_card_configmap("dl2-policy", model, card))
    client.CoreV1Api(api).create_namespaced_config_map(
        tenant_a.namespace, model_configmap("dl2-policy", model, card))
    learned = {"allocation": {"dl2": configmap_ref("dl2-policy")}}

    tenant_b.create(scheduling_policy("learned", allocation="dl2", models=learned))
    refused = condition(model_loaded(tenant_b, "learned"), "ModelLoaded")
    assert (refused["status"], refused["reason"]) == ("False", "ModelInvalid"), refused
    assert "trained with state encoder 'dl2-state-v0'" in refused["message"]
    assert f"ConfigMap {tenant_b.namespace}/dl2-policy" in refused["message"]

    tenant_a.create(scheduling_policy("learned", allocation="dl2", models=learned))
    tenant_a.create(mljob("resnet", ps=(1, 2), workers=(1, 2), epochs=1e9, policy="learned"))
    served = model_loaded(tenant_a, "learned")
    assert condition(served, "ModelLoaded")["reason"] == "ModelVerified", condition(served, "ModelLoaded")
    assert served["status"]["activeModels"] == {
        "allocation/dl2": hashlib.sha256(model.read_bytes()).hexdigest()}
    assert tenant_b.namespace not in json.dumps(served["status"])
    wait_for(lambda: all(counts(tenant_a, "resnet").values()), ROUND_TIMEOUT,
             "dl2 to allocate tenant A's job")

    # B's later rounds still refuse its card: A's verified load is not lent to it.
    generation = tenant_b.patch_policy("learned", {"interval": 1100})["metadata"]["generation"]
    later = round_of_generation(tenant_b, "learned", generation)
    assert condition(later, "ModelLoaded")["reason"] == "ModelInvalid"
    assert later["status"]["activeModels"] == {}


def test_an_unavailable_execution_provider_is_a_condition_and_scheduling_goes_on(
        mlsched, start_operator):
    """An operator told to serve models on CUDA where onnxruntime has no usable CUDA (this
    machine: the CPU build) does not crash: every learned policy says why in ModelLoaded and
    a Warning Event, and schedules with its fallback; heuristic policies are untouched."""
    operator = start_operator(extra_args=["--execution-provider", "CUDA"])
    mlsched.create(scheduling_policy("learned", allocation="dl2", fallback="drf"))
    mlsched.create(scheduling_policy("plain", allocation="drf"))
    mlsched.create(mljob("resnet", ps=(1, 2), workers=(1, 2), epochs=1e9, policy="learned"))

    policy = wait_for(lambda: (c := condition(p := mlsched.policy("learned"), "ModelLoaded"))
                      and c["status"] == "False" and p, ROUND_TIMEOUT,
                      "ModelLoaded=False on the learned policy",
                      describe=lambda: mlsched.policy("learned").get("status"))
    loaded = condition(policy, "ModelLoaded")
    assert loaded["reason"] == "ExecutionProviderUnavailable", loaded
    assert "execution provider CUDA" in loaded["message"], loaded["message"]
    ready = condition(policy, "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "FallbackActive"), ready
    assert "allocating with drf" in ready["message"]
    wait_for(lambda: [e for e in mlsched.events("learned", "SchedulingPolicy")
                      if e.type == "Warning" and e.reason == "ExecutionProviderUnavailable"],
             30, "a Warning Event ExecutionProviderUnavailable")
    assert condition(model_loaded(mlsched, "plain"), "ModelLoaded")["reason"] == "NoModelNeeded"

    wait_for(lambda: all(counts(mlsched, "resnet").values()), ROUND_TIMEOUT,
             "the fallback (drf) to allocate the job")
    assert operator.process.poll() is None, operator.log_tail()

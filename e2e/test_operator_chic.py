"""Chic served from a ConfigMap: a running policy swapped from DRF to Chic and back.

Uses the shipped artifact (policy_models/artifacts/chic/): the card and graph pass the
operator's checks, and the edit takes effect at once (a policy edit wakes a full round).
"""

from __future__ import annotations

import hashlib

from kubernetes import client

from dl2_model import configmap_ref, model_configmap
from job_state import counts
from mlsched_objects import REPO, condition, mljob, scheduling_policy
from signals import round_of_generation
from waiting import wait_for

CHIC = REPO / "policy_models" / "artifacts" / "chic" / "chic.onnx"


def test_swapping_drf_to_chic_and_back(api, mlsched, operator):
    card = CHIC.with_name("chic.card.json")
    assert CHIC.is_file() and card.is_file(), f"the shipped Chic model is missing: {CHIC}"
    digest = hashlib.sha256(CHIC.read_bytes()).hexdigest()
    client.CoreV1Api(api).create_namespaced_config_map(
        mlsched.namespace, model_configmap("chic-policy", CHIC, card))
    mlsched.create(scheduling_policy("swap", allocation="drf"))
    mlsched.create(mljob("resnet", ps=(1, 4), workers=(1, 8), epochs=1e9, policy="swap"))
    wait_for(lambda: all(counts(mlsched, "resnet").values()), 60, "a drf allocation for the job")

    generation = mlsched.patch_policy("swap", {
        "allocation": "chic", "models": {"allocation": {"chic": configmap_ref("chic-policy")}}})["metadata"]["generation"]
    swapped = round_of_generation(mlsched, "swap", generation)
    assert swapped["status"]["activeModels"] == {"allocation/chic": digest}
    loaded = condition(swapped, "ModelLoaded")
    assert (loaded["status"], loaded["reason"]) == ("True", "ModelVerified")
    under_chic = wait_for(lambda: all((c := counts(mlsched, "resnet")).values()) and c, 60,
                          "a chic allocation for the job")
    assert under_chic["ps"] >= 1 and under_chic["worker"] >= 1

    generation = mlsched.patch_policy("swap", {"allocation": "drf"})["metadata"]["generation"]
    back = round_of_generation(mlsched, "swap", generation)
    assert back["status"]["activeModels"] == {}
    assert condition(back, "ModelLoaded")["reason"] == "NoModelNeeded"

"""Learned models served from ConfigMaps: a live policy swap, and a corrupt model.

Editing a SchedulingPolicy must change the very next round's decisions without a
restart; a model that cannot be served must be reported (condition, Warning Event)
while the policy goes on scheduling with its fallback.
"""

from __future__ import annotations

import hashlib
import re

from kubernetes import client

from dl2_model import configmap_ref, corrupt_configmap, model_configmap
from mlsched_objects import condition, mljob, scheduling_policy
from waiting import wait_for

ROUND_TIMEOUT = 60  # a round every 6 s; generous for a loaded 2-core machine


def counts(mlsched, name: str) -> dict[str, int]:
    desired = ((mlsched.job(name) or {}).get("status") or {}).get("replicaStatuses") or {}
    return {role: (desired.get(role) or {}).get("desired", 0) for role in ("ps", "worker")}


def round_of_generation(mlsched, policy: str, generation: int) -> dict:
    """The policy once a round has run with spec `generation` (rounds record it)."""
    return wait_for(lambda: ((p := mlsched.policy(policy))["status"].get("observedGeneration")
                             == generation) and p, ROUND_TIMEOUT,
                    f"a round of {policy} with generation {generation}",
                    describe=lambda: mlsched.policy(policy)["status"])


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

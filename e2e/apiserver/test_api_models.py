"""Learned models on an API server alone (the apiserver-only tier; from
test_operator_models.py): a live policy swap, one tenant's bad card, an execution provider
that is not there. Editing a SchedulingPolicy must change the very next round's decisions
without a restart; a model that cannot be served must be reported (condition, Warning Event)
while the policy goes on deciding with its fallback; a tenant's card never changes the verdict
another tenant gets for the same model. What these test is status the operator writes
(conditions, activeModels, Events, the desired counts of its decision), never a pod: no pod
was waited for where they ran on the full plane either, so they need no KCM, no scheduler and
no kwok.

A round decides only on Ready nodes with room, so each test has the full plane's 13 nodes
(8 CPU, 2 GPU, 48 Gi each, the kwok taint) as plain Node objects written with a Ready
condition (`static_nodes`): what a kubelet registers, with the taint the node lifecycle
controller would lift once they are Ready taken off by the test. No lease is renewed and no
controller marks them NotReady, so they stay Ready; no pod ever runs on them (the operator's
StatefulSets keep their replicas without pods: no KCM makes any).
"""

from __future__ import annotations

import hashlib
import json

import pytest
from kubernetes import client

from dl2_model import configmap_ref, model_configmap, stale_card_configmap
from fake_nodes import node_manifest
from job_state import counts
from mlsched_objects import condition, mljob, scheduling_policy
from signals import ROUND_TIMEOUT, model_loaded, round_of_generation
from waiting import wait_for

pytestmark = pytest.mark.usefixtures("static_nodes")


@pytest.fixture
def static_nodes(api, node_shape):
    """The full plane's session nodes (node_shape), as Node objects with a Ready condition;
    deleted after the test (set up before its operator, removed after it stopped)."""
    core = client.CoreV1Api(api)
    names = []
    try:
        for serial in range(node_shape.count):
            node = node_manifest(f"static-node-{serial}", serial, cpu=node_shape.cpu,
                                 gpu=node_shape.gpu, memory_gib=node_shape.memory_gib)
            node["status"]["conditions"] = [{"type": "Ready", "status": "True",
                                             "reason": "KubeletReady",
                                             "message": "a Node object written by the test"}]
            names.append(core.create_node(node).metadata.name)
            # The TaintNodesByCondition admission plugin taints every new node
            # node.kubernetes.io/not-ready, which KCM's node lifecycle controller lifts once
            # the node is Ready; nothing here runs it, so the taints are set back as written.
            core.patch_node(names[-1], {"spec": {"taints": node["spec"]["taints"]}})
        yield names
    finally:
        for name in names:
            core.delete_node(name)


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

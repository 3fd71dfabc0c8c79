"""Harmony placement in the cluster (issue 15): a SchedulingPolicy with `placement: harmony`
serves the shipped ONNX model (policy_models/artifacts/harmony/), its decision is recorded in
each MLJob's status and the pods run on exactly the nodes it names.
"""

from __future__ import annotations

import hashlib

from job_state import placed_as_decided, placement_problems
from mlsched_objects import REPO, condition, mljob, scheduling_policy
from signals import model_loaded
from waiting import wait_for

HARMONY = REPO / "policy_models" / "artifacts" / "harmony" / "harmony.onnx"


def test_harmony_placement_places_pods_where_its_decision_says(mlsched, operator):
    assert HARMONY.is_file(), f"the shipped Harmony model is missing: {HARMONY}"
    digest = hashlib.sha256(HARMONY.read_bytes()).hexdigest()
    # The user fixes the counts (`fixed` allocation); Harmony decides only where tasks run.
    mlsched.create(scheduling_policy("place", allocation="fixed", placement="harmony"))
    jobs = {"resnet": mljob("resnet", model="resnet-50", ps=(1, 1), workers=(2, 2), epochs=1e9, policy="place"),
            "ctc": mljob("ctc", model="cnn-text-classification", ps=(1, 1), workers=(1, 1), epochs=1e9,
                         policy="place"),
            "vgg": mljob("vgg", model="vgg-16", ps=None, workers=(2, 2), epochs=1e9, policy="place")}
    for body in jobs.values():
        mlsched.create(body)

    policy = model_loaded(mlsched, "place")
    loaded = condition(policy, "ModelLoaded")
    assert (loaded["status"], loaded["reason"]) == ("True", "ModelVerified"), loaded
    assert policy["status"]["activeModels"] == {"placement/harmony": digest}
    ready = condition(policy, "Ready")
    assert ready["reason"] != "FallbackActive", ready

    for name, (ps, workers) in {"resnet": (1, 2), "ctc": (1, 1), "vgg": (0, 2)}.items():
        status = wait_for(lambda n=name: placed_as_decided(mlsched, n), 90, f"{name}'s pods on its decided nodes",
                          describe=lambda n=name: placement_problems(mlsched, n))
        placement = status["placement"]
        assert len(placement.get("worker") or []) == workers
        assert len(placement.get("ps") or []) == ps

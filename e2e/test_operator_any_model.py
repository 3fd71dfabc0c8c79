"""A job of a model the catalog has never heard of runs, planned by its pods' requests.

`modelType` is a free-form label: the scheduler describes jobs by what their pod templates
request and by their speed curve (declared in `speedPrior`, then learned from progress), so
a new model is scheduled like any other. Its workers ask for 2 GPUs each: every node the
operator chooses must have room for them (the catalog's 1 GPU a worker would overcommit).
"""

from __future__ import annotations

from collections import Counter

from job_state import placed_as_decided, placement_problems
from mlsched_objects import mljob, phase, scheduling_policy
from waiting import wait_for

TWO_GPU_WORKER = {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "2"}


def test_a_model_outside_the_catalog_runs_on_its_own_requests(mlsched, operator, emulator, node_shape):
    mlsched.create(scheduling_policy("open", allocation="drf"))
    job = mljob("my-llm", model="my-llm-7b", ps=(1, 2), workers=(1, 4), epochs=1e9, policy="open")
    job["spec"]["speedPrior"] = {"referenceEpochsPerHour": 20.0}
    worker = job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]
    worker["resources"] = {"requests": TWO_GPU_WORKER, "limits": TWO_GPU_WORKER}
    mlsched.create(job)

    status = wait_for(lambda: placed_as_decided(mlsched, "my-llm"), 90,
                      "my-llm's pods to run where its policy placed them",
                      describe=lambda: placement_problems(mlsched, "my-llm"))
    workers = status["placement"]["worker"]
    assert status["replicaStatuses"]["worker"]["desired"] == len(workers) >= 1
    per_node = Counter(workers)
    assert all(2 * n <= node_shape.gpu for n in per_node.values()), per_node
    wait_for(lambda: phase(mlsched.job("my-llm")) == "Running", 60, "my-llm to be Running")
    trained = wait_for(lambda: [h for h in (mlsched.job("my-llm")["status"].get("history") or ())
                                if h["epochs"] > 0], 120, "an interval with training in it")
    assert trained[0]["reward"] > 0


def test_a_sidecar_s_requests_are_planned_with_the_app_container_s(mlsched, operator, node_shape):
    """A worker of 2 CPU with a native sidecar (an init container with restartPolicy Always,
    as service meshes and log shippers inject) of 3 CPU asks kube-scheduler for 5 CPU. The
    operator counted max(2, 3) = 3 (the init-container rule), so bin-packing put two workers
    on an 8-CPU node, and the second stayed Pending with "Insufficient cpu"."""
    mlsched.create(scheduling_policy("packed", allocation="fixed", placement="bin-pack"))
    job = mljob("meshed", ps=None, workers=(4, 4), epochs=1e9, policy="packed")
    spec = job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]
    proxy = {"cpu": "3", "memory": "1Gi"}
    spec["initContainers"] = [{"name": "proxy", "image": "registry.invalid/proxy:1",
                               "restartPolicy": "Always",
                               "resources": {"requests": proxy, "limits": proxy}}]
    mlsched.create(job)
    status = wait_for(lambda: placed_as_decided(mlsched, "meshed"), 90,
                      "every worker to run where its policy placed it",
                      describe=lambda: placement_problems(mlsched, "meshed"))
    per_node = Counter(status["placement"]["worker"])
    assert all(5 * n <= node_shape.cpu for n in per_node.values()), per_node


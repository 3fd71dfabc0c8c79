"""Pods of another workload (no job label) holding GPUs on the session's shared plane, and a job
waiting for the GPUs they hold."""

from __future__ import annotations

from kubernetes import client

from mlsched_objects import IMAGE, KWOK_TOLERATION, mljob, scheduling_policy
from waiting import wait_for


def gpu_hog(name: str, node: str) -> dict:
    gpus = {"nvidia.com/gpu": "2"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node, "tolerations": [KWOK_TOLERATION],
                     "containers": [{"name": "c", "image": IMAGE,
                                     "resources": {"requests": gpus, "limits": gpus}}]}}


def every_gpu_held_and_a_job_waiting(core: client.CoreV1Api, node_shape, mlsched, prefix: str,
                                     restart_policy: str = "Always") -> list[str]:
    """Pods of another workload (no job label) in the job's namespace holding every GPU, and
    a job `after` of one GPU worker waiting for them (a day-long interval): the hogs' names."""
    hogs = [f"{prefix}-{i}" for i in range(node_shape.count)]
    for i, name in enumerate(hogs):
        body = gpu_hog(name, f"kwok-node-{i}")
        body["spec"]["restartPolicy"] = restart_policy
        core.create_namespaced_pod(mlsched.namespace, body)
    wait_for(lambda: all(core.read_namespaced_pod(n, mlsched.namespace).status.phase == "Running"
                         for n in hogs), 60, "the other workload's pods to run")
    mlsched.create(scheduling_policy("daily", allocation="drf", interval=86400))
    mlsched.create(mljob("after", ps=None, workers=(1, 1), epochs=1e9, policy="daily"))
    wait_for(lambda: any(c["type"] == "Admitted" and c["status"] == "False"
                         for c in (mlsched.job("after").get("status") or {}).get("conditions", [])),
             30, "the job to wait for GPUs")
    return hogs

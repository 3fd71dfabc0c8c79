"""GPU types in the cluster (issue 54): kwok nodes labelled with NVIDIA GPU feature discovery's
`nvidia.com/gpu.product`; a job whose workers may use only V100s lands only on the V100 nodes
and says so in status, a second one waits naming the type that has no room. (An unknown type
name refused by the API server with the known ones: e2e/apiserver/test_api_validation.py.)"""

from __future__ import annotations

import contextlib

from kubernetes import client

from mlsched_objects import condition, mljob, scheduling_policy
from waiting import wait_for

LABEL = "nvidia.com/gpu.product"
V100 = ["kwok-node-2", "kwok-node-6"]  # 2 GPUs each
K80 = ["kwok-node-4", "kwok-node-8"]
A100 = ["kwok-node-10"]  # a product the measured table does not know: untyped


@contextlib.contextmanager
def products(core: client.CoreV1Api, labels: dict[str, str]):
    """Nodes of the session's shared plane labelled with a GPU product for one test, and
    unlabelled after it."""
    try:
        for name, product in labels.items():
            core.patch_node(name, {"metadata": {"labels": {LABEL: product}}})
        yield
    finally:
        for name in labels:
            core.patch_node(name, {"metadata": {"labels": {LABEL: None}}})


def _restricted(name: str, workers: int, types: list[str]) -> dict:
    job = mljob(name, ps=None, workers=(workers, workers))
    job["spec"]["replicaSpecs"]["worker"]["gpuTypes"] = types
    return job


def _running_pods(mlsched, job: str, count: int):
    pods = mlsched.pods(job)
    ok = len(pods) == count and all(p.status.phase == "Running" for p in pods)
    return pods if ok else None


def test_a_job_limited_to_a_type_lands_on_it_and_one_without_room_waits_naming_it(
        control_plane, api, mlsched, operator):
    core = client.CoreV1Api(api)
    labels = {**{n: "Tesla-V100-SXM2-16GB" for n in V100}, **{n: "Tesla-K80" for n in K80},
              **{n: "NVIDIA-A100-SXM4-80GB" for n in A100}}
    with products(core, labels):
        mlsched.create(scheduling_policy("default", interval=600, allocation="fixed"))
        # Four workers, V100 only: every GPU of the two V100 nodes (a planner ignoring the
        # restriction spreads them over the least-loaded of 13 nodes).
        mlsched.create(_restricted("on-v100", 4, ["v100"]))
        pods = wait_for(lambda: _running_pods(mlsched, "on-v100", 4), 90,
                        "the V100 job's four workers to run",
                        describe=lambda: [(p.metadata.name, p.status.phase, p.spec.node_name)
                                          for p in mlsched.pods("on-v100")])
        nodes = sorted(p.spec.node_name for p in pods)
        assert set(nodes) <= set(V100) and len(nodes) == 4, nodes
        status = wait_for(lambda: (s := (mlsched.job("on-v100") or {}).get("status") or {})
                          and ((s.get("placement") or {}).get("gpuTypes") or {}).get("worker")
                          and s, 60, "the job's status to name its GPU type")
        assert status["placement"]["gpuTypes"] == {"worker": "v100"}, status["placement"]
        assert sorted(status["placement"]["worker"]) == nodes
        # `kubectl get -o wide` has the GPU column.
        table = control_plane.kubectl("get", "mljob", "on-v100", "-n", mlsched.namespace,
                                      "-o", "wide").stdout.splitlines()
        header, row = table  # columns are aligned; empty cells (GROUP, ...) split to nothing
        assert "GPU" in header.split() and row[header.index("GPU"):].split()[0] == "v100", table

        # A K80 job goes to the K80 nodes, which are free.
        mlsched.create(_restricted("on-k80", 2, ["k80"]))
        k80 = wait_for(lambda: _running_pods(mlsched, "on-k80", 2), 90, "the K80 job to run")
        assert {p.spec.node_name for p in k80} <= set(K80)

        # Another V100 job: no V100 has room (11 other nodes do), so it waits, saying which
        # type has none, and holds no pod.
        mlsched.create(_restricted("late-v100", 1, ["v100"]))

        def admitted_false():
            c = condition(mlsched.job("late-v100"), "Admitted")
            return c if c and c["status"] == "False" and "GPU type v100" in c.get("message", "") \
                else None

        admitted = wait_for(admitted_false, 60, "the late V100 job to say why it waits",
                            describe=lambda: condition(mlsched.job("late-v100"), "Admitted"))
        assert admitted["reason"] == "WaitingForAllocation", admitted
        assert "no node of GPU type v100 has room for a worker" in admitted["message"], admitted
        assert mlsched.pods("late-v100") == []
        assert not ((mlsched.job("late-v100")["status"].get("placement") or {}).get("worker"))

"""Jobs that really train, under the operator: the reference programs (examples/pytorch) run as
the pods the operator's StatefulSets created on this control plane, with exactly the environment
those Pod objects carry (resolved as the kubelet resolves it: e2e/pod_runner.py), through two
rescales the operator decides, and report progress to its real endpoint with tokens bound to
their pods.

kwok binds the pods and runs nothing; e2e/local_kubelet.py plays the kubelet's part for the
job: it starts each bound pod's command as a local process and, when a rescale deletes the pod,
sends it SIGTERM and gives it the pod's grace period. Each rescale here is a spec edit
(`min = max`), which the operator decides again at once; the counts then reach the pods only
through the operator: StatefulSet replicas and template (WORLD_SIZE, RANK, TF_CONFIG, ...).

EXAMPLE_SAMPLE_COST_S stands in for a bigger model (4 ms of compute per sample a worker trains,
divided among the workers), so that an epoch lasts seconds: rescales land mid-epoch, and every
count trains for a few of the policy's 6 s intervals.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mlsched.controller.objects.desired import MASTER_PORT, MASTER_PORT_NAME, TF_PORT, TF_PORT_NAME
from local_kubelet import LocalKubelet
from mlsched_objects import KWOK_TOLERATION, condition, phase, scheduling_policy
from pod_runner import PodRunner
from training_logs import (
    EPOCH_DONE, START, check_every_step_trained_once, check_resumed_where_stopped, logged,
)
from waiting import wait_for

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "pytorch"
CHECKPOINT_MOUNT = "/mnt/mlsched-checkpoint"
GLOBAL_BATCH = 64
EPOCHS = 14
SAMPLE_COST_S = 0.004  # 256 ms a step with 1 worker (5.9 s an epoch), 85 ms with 3
# The rendezvous ports, named as a user names them (Kubeflow's names; the operator renders
# MASTER_PORT and TF_CONFIG from them). Not the defaults (23456, 2222): the pods here are local
# processes on the host's network, rank 0 listens on every address, and the full plane runs
# test_reference_programs.py, whose jobs use the defaults, at the same time on another worker
# (EADDRINUSE when both used 23456). Below the kernel's ephemeral range, so no outgoing
# connection holds them.
PORTS = [{"name": MASTER_PORT_NAME, "containerPort": MASTER_PORT + 1},
         {"name": TF_PORT_NAME, "containerPort": TF_PORT + 1}]


def training_job(name: str, architecture: str, program: str, counts: dict[str, int]) -> dict:
    def template(role: str) -> dict:
        return {"spec": {
            "tolerations": [KWOK_TOLERATION],
            # kwok mounts nothing: the local kubelet binds a host directory here.
            "volumes": [{"name": "checkpoint", "emptyDir": {}}],
            "containers": [{
                "name": role, "image": "mlsched-training:latest",
                "command": [sys.executable, str(EXAMPLES / program)],
                "args": ["--global-batch-size", str(GLOBAL_BATCH), "--report-interval", "2"],
                "env": [{"name": "OMP_NUM_THREADS", "value": "1"},
                        {"name": "EXAMPLE_TRACE_STEPS", "value": "1"},
                        {"name": "EXAMPLE_SAMPLE_COST_S", "value": str(SAMPLE_COST_S)}],
                "volumeMounts": [{"name": "checkpoint", "mountPath": CHECKPOINT_MOUNT}],
                "ports": PORTS,
                "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}}}]}}

    roles = {role: {"min": n, "max": n, "template": template(role)} for role, n in counts.items()}
    return {"apiVersion": "mlsched.io/v1alpha1", "kind": "MLJob", "metadata": {"name": name},
            "spec": {"modelType": "mlp-digits", "architecture": architecture, "epochs": EPOCHS,
                     "globalBatchSize": GLOBAL_BATCH, "replicaSpecs": roles}}


def rescale_to(mlsched, name: str, counts: dict[str, int]) -> None:
    mlsched.patch_job(name, {"replicaSpecs": {role: {"min": n, "max": n}
                                              for role, n in counts.items()}})


def history_at(mlsched, name: str, counts: dict[str, int]) -> list[dict]:
    """The job's interval records at these counts in which it reported its measured speed."""
    history = ((mlsched.job(name) or {}).get("status") or {}).get("history") or []
    return [h for h in history if h["workers"] == counts["worker"]
            and h["ps"] == counts.get("ps", 0) and (h.get("samplesPerSecond") or 0) > 0]


@pytest.mark.parametrize("architecture, program, stages", [
    ("AllReduce", "allreduce.py", [{"worker": 1}, {"worker": 3}, {"worker": 2}]),
    ("ParameterServer", "parameter_server.py",
     [{"ps": 1, "worker": 1}, {"ps": 2, "worker": 3}, {"ps": 1, "worker": 2}]),
])
def test_a_job_trains_through_rescales_the_operator_decides(api, mlsched, start_operator,
                                                            tmp_path, capsys, architecture,
                                                            program, stages):
    operator = start_operator()
    mlsched.create(scheduling_policy("default", allocation="drf"))
    name = "ring" if architecture == "AllReduce" else "bert"
    mlsched.create(training_job(name, architecture, program, stages[0]))
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    status = lambda: (mlsched.job(name) or {}).get("status")  # noqa: E731

    with PodRunner(tmp_path / "pods") as runner:
        kubelet = LocalKubelet(api, mlsched.namespace, name, runner,
                               volumes={"checkpoint": checkpoint}, token_dir=tmp_path / "tokens")
        kubelet.start()
        try:
            for number, counts in enumerate(stages):
                if number:
                    rescale_to(mlsched, name, counts)
                wait_for(lambda: len(kubelet.generations) > number and
                         logged(kubelet.generations[number], START), 120,
                         f"the pods of {counts} to start training",
                         describe=lambda: (kubelet.errors, [p.log(tail=3) for g in
                                                           kubelet.generations for p in g]))
                if number < len(stages) - 1:
                    # Trained at these counts for an interval, reported, recorded: then rescale.
                    wait_for(lambda: history_at(mlsched, name, counts), 120,
                             f"an interval record at {counts} with its measured speed",
                             describe=lambda: (status() or {}).get("history"))
            wait_for(lambda: phase(mlsched.job(name)) == "Succeeded", 180, f"{name} to succeed",
                     describe=lambda: ((status() or {}).get("progress"), kubelet.errors,
                                       kubelet.generations[-1][0].log(tail=3)))
            wait_for(lambda: not kubelet.running(), 60, "every training process to exit")
        finally:
            kubelet.stop()
    assert not kubelet.errors, kubelet.errors
    runs = kubelet.generations
    assert len(runs) == 3, [[p.name for p in run] for run in runs]
    for run, counts in zip(runs, stages):
        assert sorted(p.name for p in run) == sorted(
            f"{name}-{role}-{k}" for role, n in counts.items() for k in range(n))
        codes = {p.name: p.wait(5) for p in run}
        assert set(codes.values()) == {0}, (codes, [p.log(tail=15) for p in run])

    # The training itself: every sample of every epoch exactly once, across the counts; each run
    # resumed where the last stopped (mid-epoch, when the StatefulSet deleted its pods), with the
    # same model; the loss fell; exactly the epochs asked for.
    check_every_step_trained_once(runs, EPOCHS, GLOBAL_BATCH)
    stops = check_resumed_where_stopped(runs, GLOBAL_BATCH, mid_epoch=False)
    assert any(step > 0 for _, step in stops), f"no rescale landed mid-epoch: {stops}"
    first, last = logged(runs[0], START)[0], logged(runs[-1], EPOCH_DONE)
    assert int(last[-1][0]) == EPOCHS
    assert float(last[-1][1]) < 0.5 * float(first[2]), (first, last[-1])

    # What the operator shows: progress reached through its endpoint, the rescales, and the
    # speed measured at each count in the interval records.
    final = status()
    assert final["progress"]["epochsDone"] == EPOCHS
    assert condition(mlsched.job(name), "Succeeded")["reason"] == "EpochsReached"
    rescales = final["rescales"]
    assert rescales["count"] == 2 and rescales["seconds"] > 0
    key = lambda c: {"ps": c.get("ps", 0), "workers": c["worker"]}  # noqa: E731
    assert (rescales["last"]["from"], rescales["last"]["to"]) == (key(stages[1]), key(stages[2]))
    assert rescales["last"]["seconds"] > 0 and rescales["last"]["completionTime"]
    assert condition(mlsched.job(name), "Rescaling")["status"] == "False"
    reasons = [e.reason for e in mlsched.events(name, "MLJob")]
    assert reasons.count("Rescaling") == 2 and reasons.count("Rescaled") == 2, reasons
    speeds = {}
    for counts in stages:
        wait_for(lambda: history_at(mlsched, name, counts), 30,
                 f"the interval record at {counts}", describe=lambda: status().get("history"))
        speeds[str(counts)] = max(h["samplesPerSecond"] for h in history_at(mlsched, name, counts))
    # 3 workers share the stand-in compute three ways: the records show it.
    assert speeds[str(stages[1])] > speeds[str(stages[0])], speeds
    assert operator.running()
    with capsys.disabled():
        print(f"\n{architecture} {' -> '.join(map(str, stages))}: stopped at {stops}; rescales "
              f"{rescales['count']} taking {rescales['seconds']} s; samples/s recorded per count "
              f"{ {k: round(v) for k, v in speeds.items()} }; loss {first[2]} -> {last[-1][1]}")

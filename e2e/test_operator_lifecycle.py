"""The samples, applied as a user applies them, run from creation to TTL deletion.

manifests/samples holds a policy (`dl2`, serving the model shipped with the operator) and two
jobs (ResNet-50 with parameter servers under dl2, ResNeXt-110 all-reduce under the namespace's
`default`, from manifests/base/training-namespace). The first test applies them unchanged with
`kubectl apply -k` into a namespace set up as the README says, whose `default` they leave alone;
the second adjusts the jobs to finish within the test (epochs, TTL). Every step is checked on
what the API server stores: children, replica counts, the node of every pod,
progress, per-interval history and rewards, phase, and deletion.
"""

from __future__ import annotations

import pytest
from kubernetes import client

from job_state import placed_as_decided, placement_problems
from mlsched_objects import (
    SAMPLES, TRAINING_NAMESPACE, checkpoint_volumes, condition, default_policy, for_kwok, phase,
    sample,
)
from waiting import wait_for

# Enough epochs for a few rounds of training at the emulator's compressed speed
# (ResNet-50 trains ~200-340 epochs per interval, ResNeXt-110 ~1500).
EPOCHS = {"resnet50-ps": 900, "resnext110-allreduce": 6000}
ROLES = {"resnet50-ps": ("ps", "worker"), "resnext110-allreduce": ("worker",)}
POLICY = {"resnet50-ps": "dl2", "resnext110-allreduce": "default"}
TTL_SECONDS = 3


@pytest.fixture
def checkpoint_storage(api, mlsched):
    """ReadWriteMany volumes for the samples' checkpoint claims, as an admin provides them."""
    core = client.CoreV1Api(api)
    names = checkpoint_volumes(core, mlsched.namespace)
    yield names
    for name in names:
        core.delete_persistent_volume(name)


def test_the_samples_run_as_shipped_with_kubectl_apply_k(control_plane, mlsched, operator,
                                                         checkpoint_storage):
    # The namespace's `default` policy as manifests/base/training-namespace brings it (applied
    # alone: the session's fixtures made that kustomization's ClusterRole with another field
    # manager), and as its admin then tuned it.
    control_plane.kubectl("apply", "--server-side", "-n", mlsched.namespace, "-f",
                          str(TRAINING_NAMESPACE / "default-schedulingpolicy.yaml"))
    tuned = mlsched.patch_policy("default", {"historyLimit": 20})
    # Unchanged: no toleration, epochs or TTL added for the test. The operator adds the
    # tolerations of the taints it places on (kwok's here, nvidia.com/gpu in most clusters).
    applied = control_plane.kubectl("apply", "-k", str(SAMPLES), "-n", mlsched.namespace).stdout
    for kind_name in ("mljob.mlsched.io/resnet50-ps", "mljob.mlsched.io/resnext110-allreduce",
                      "schedulingpolicy.mlsched.io/dl2",
                      "persistentvolumeclaim/resnet50-ps-checkpoints",
                      "persistentvolumeclaim/resnext110-allreduce-checkpoints"):
        assert f"{kind_name} created" in applied, applied
    # The samples used to bring a `default` of their own and silently replace this one.
    assert "schedulingpolicy.mlsched.io/default" not in applied, applied
    kept = mlsched.policy("default")
    assert kept["spec"] == tuned["spec"] and kept["spec"]["historyLimit"] == 20
    for name in ROLES:
        wait_for(lambda: phase(mlsched.job(name)) == "Running", 90, f"{name} to be Running",
                 describe=lambda: (mlsched.job(name) or {}).get("status"))
    # The learned policy serves the model shipped with the operator.
    wait_for(lambda: (c := condition(mlsched.policy("dl2"), "ModelLoaded")) and
             c["reason"] == "ModelVerified", 30, "the dl2 sample to load its shipped model",
             describe=lambda: condition(mlsched.policy("dl2"), "ModelLoaded"))
    table = control_plane.kubectl("get", "mljobs", "-n", mlsched.namespace).stdout
    lines = {line.split()[0]: line for line in table.splitlines()[1:]}
    assert set(lines) == set(ROLES) and all("Running" in line for line in lines.values()), table
    assert table.split()[:3] == ["NAME", "PHASE", "REASON"], table
    assert all(line.split()[1:3] == ["Running", "AllRolesReady"] for line in lines.values()), table
    # Nothing on them still reports a cause that has passed (the jobs come before their policies
    # in kustomize's order): no Warning, no condition saying a policy is missing.
    for name in ROLES:
        reasons = {c["reason"] for c in mlsched.job(name)["status"]["conditions"]}
        assert not reasons & {"PolicyNotFound", "WaitingForPolicy"}, (name, reasons)
        assert [e.reason for e in mlsched.events(name, "MLJob") if e.type == "Warning"] == [], name


def test_samples_run_from_apply_to_ttl_deletion(api, mlsched, operator, emulator):
    mlsched.create(default_policy())  # the training namespace's
    mlsched.create(sample("schedulingpolicy-dl2.yaml"))
    for name, file_name in (("resnet50-ps", "mljob-resnet50-ps.yaml"),
                            ("resnext110-allreduce", "mljob-allreduce.yaml")):
        job = for_kwok(sample(file_name), epochs=EPOCHS[name], ttl=TTL_SECONDS)
        assert job["metadata"]["name"] == name
        assert job["spec"].get("schedulingPolicy", "default") == POLICY[name]
        mlsched.create(job)

    # Children: a headless Service and one StatefulSet per role, owned by the MLJob.
    for name, roles in ROLES.items():
        sets = wait_for(lambda: (s := mlsched.statefulsets(name)) and set(s) == set(roles) and s,
                        60, f"StatefulSets of {name}")
        uid = mlsched.job(name)["metadata"]["uid"]
        for role, sts in sets.items():
            assert sts.metadata.name == f"{name}-{role}"
            (owner,) = sts.metadata.owner_references
            assert (owner.kind, owner.uid, owner.controller) == ("MLJob", uid, True)
            # Pods start gated: kube-scheduler waits for the operator's placement.
            gates = sts.spec.template.spec.scheduling_gates or []
            assert [g.name for g in gates] == ["mlsched.io/placement"]
        # The Service comes right after the StatefulSets (controller/objects/services.py says why).
        service = wait_for(lambda: mlsched.service(name), 30, f"the Service of {name}")
        assert service.spec.cluster_ip == "None"
        assert service.metadata.owner_references[0].uid == uid

    # Replicas as the policy decided, and every pod on the node the policy chose.
    for name in ROLES:
        wait_for(lambda: placed_as_decided(mlsched, name), 90,
                 f"{name}'s pods to run where its policy placed them",
                 describe=lambda: placement_problems(mlsched, name))
        for pod in mlsched.pods(name):
            # kube-scheduler bound it, and only the operator's pin made it eligible.
            assert pod.spec.node_selector["kubernetes.io/hostname"] == pod.spec.node_name
            assert not pod.spec.scheduling_gates
        wait_for(lambda: phase(mlsched.job(name)) in ("Running", "Succeeded"), 60,
                 f"{name} to be Running")

    # Progress reported by the emulated training lands in status, intervals get closed.
    for name in ROLES:
        job = wait_for(lambda: (j := mlsched.job(name)) and any(
            h["epochs"] > 0 for h in j["status"].get("history") or ()) and j, 120,
            f"{name} to have a history entry with training in it",
            describe=lambda: (mlsched.job(name) or {}).get("status"))
        assert job["status"]["progress"]["epochsDone"] > 0
        for entry in job["status"]["history"]:
            # reward = epochs trained in the interval / epochs the job needs
            assert abs(entry["reward"] - entry["epochs"] / EPOCHS[name]) < 1e-6
            assert entry["workers"] == len(entry["placement"]["worker"])
        numbers = [h["interval"] for h in job["status"]["history"]]
        assert numbers == sorted(set(numbers))
    for policy in ("default", "dl2"):
        rewards = wait_for(lambda: [r for r in (mlsched.policy(policy)["status"].get("rewards")
                                                or ()) if r["reward"] > 0], 60,
                           f"a positive reward in SchedulingPolicy {policy}")
        assert all(r["jobs"] >= 1 for r in rewards)
    dl2 = mlsched.policy("dl2")["status"]
    assert condition(mlsched.policy("dl2"), "ModelLoaded")["reason"] == "ModelVerified"
    assert set(dl2["activeModels"]) == {"allocation/dl2"}

    # Every job trains all its epochs and succeeds; its pods are cleaned up.
    uids = {}
    for name in ROLES:
        job = wait_for(lambda: phase(j := mlsched.job(name)) == "Succeeded" and j, 180,
                       f"{name} to succeed",
                       describe=lambda: ((mlsched.job(name) or {}).get("status", {})
                                         .get("progress"), emulator.speeds.get(name),
                                         dict(emulator.reports), emulator.last_error))
        uids[name] = job["metadata"]["uid"]
        status = job["status"]
        assert status["progress"]["epochsDone"] >= EPOCHS[name]
        assert condition(job, "Succeeded")["status"] == "True"
        assert status["completionTime"] >= status["startTime"]
        reasons = {e.reason for e in mlsched.events(name, "MLJob")}
        assert {"Created", "Scaled", "Running", "Succeeded"} <= reasons, reasons

    # ttlSecondsAfterFinished: the MLJob is deleted, and its children go with it.
    for name in ROLES:
        wait_for(lambda: mlsched.job(name) is None, 60, f"{name} to be deleted by its TTL")
        wait_for(lambda: not mlsched.statefulsets(name) and mlsched.service(name) is None
                 and not mlsched.pods(name), 90, f"{name}'s children to be garbage-collected")
        reasons = {e.reason for e in mlsched.events(name, "MLJob")
                   if e.involved_object.uid == uids[name]}
        assert "TTLExpired" in reasons
    assert emulator.reports["accepted"] > 0
    assert emulator.refusals == [], emulator.refusals

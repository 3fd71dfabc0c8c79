"""Decision → desired objects and minimal actions (pure): labels, owner references, env, gates,
replica bounds, per-ordinal pinning, and no action when nothing changes."""

from __future__ import annotations

from mlsched.cluster.types import Decision, JobDecision
from mlsched.controller.objects.desired import (
    DeletePod, PatchStatefulSet, PinPod, PodSettings, job_targets, plan_pods, plan_statefulset,
    pod_template, service_manifest, statefulset_manifest, template_hash,
)
from mlsched.controller.objects.records import pod_record, sts_record
from mlsched.controller.objects.job_records import job_record
from mlsched.controller.scheduling.snapshot import build_snapshot
from mlsched.controller.scheduling.cluster_state import ClusterState
from mlsched.controller.objects.records import node_record
from builders import NS, env_of, node, pod, ps_job

SETTINGS = PodSettings(progress_url="http://op:8080/v1/progress")


def record(**kw):
    body = ps_job("bert", **kw)
    body["metadata"].update(uid="uid-bert", generation=1, creationTimestamp="2024-01-01T00:00:00Z")
    return job_record(body)


def test_statefulset_manifest_labels_owner_env_gate():
    job = record()
    sts = statefulset_manifest(job, "worker", 3, {"ps": 2, "worker": 3}, SETTINGS)
    meta, spec = sts["metadata"], sts["spec"]
    assert meta["name"] == "bert-worker" and meta["namespace"] == NS
    assert meta["labels"]["mlsched.io/job-name"] == "bert" and meta["labels"]["mlsched.io/role"] == "worker"
    owner = meta["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == ("MLJob", "bert", "uid-bert", True)
    assert spec["replicas"] == 3 and spec["serviceName"] == "bert"
    assert spec["podManagementPolicy"] == "Parallel"
    assert spec["selector"]["matchLabels"] == {"mlsched.io/job-name": "bert", "mlsched.io/role": "worker",
                                               "app.kubernetes.io/managed-by": "mlsched-operator"}
    tpl = spec["template"]
    assert tpl["metadata"]["labels"]["mlsched.io/role"] == "worker"
    assert tpl["spec"]["schedulingGates"] == [{"name": "mlsched.io/placement"}]
    assert tpl["spec"]["restartPolicy"] == "Always"
    assert env_of(tpl, "MLSCHED_JOB_NAME") == "bert" and env_of(tpl, "MLSCHED_ROLE") == "worker"
    assert env_of(tpl, "MLSCHED_PS_HOSTS") == f"bert-ps-0.bert.{NS}.svc,bert-ps-1.bert.{NS}.svc"
    assert env_of(tpl, "MLSCHED_WORKER_REPLICAS") == "3"
    assert env_of(tpl, "MLSCHED_PROGRESS_URL") == "http://op:8080/v1/progress"
    assert env_of(tpl, "MLSCHED_NAMESPACE") == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    token = next(v for v in tpl["spec"]["volumes"] if v["name"] == "mlsched-progress-token")
    assert token["projected"]["sources"][0]["serviceAccountToken"]["audience"] == "mlsched.io/progress"
    assert tpl["spec"]["containers"][0]["volumeMounts"][-1]["mountPath"] == "/var/run/secrets/mlsched.io"
    assert meta["annotations"]["mlsched.io/template-hash"] == template_hash(job, "worker", {"ps": 2, "worker": 3}, SETTINGS)


def test_template_rendering_keeps_the_users_settings_and_drops_pins():
    body = ps_job("bert")
    wspec = body["spec"]["replicaSpecs"]["worker"]["template"]["spec"]
    wspec["nodeSelector"] = {"kubernetes.io/hostname": "n9", "gpu": "a100"}
    wspec["containers"][0]["env"] = [{"name": "MINE", "value": "1"}, {"name": "MLSCHED_ROLE", "value": "x"}]
    body["metadata"].update(uid="u")
    tpl = pod_template(job_record(body), "worker", {"ps": 1, "worker": 1}, SETTINGS)
    assert tpl["spec"]["nodeSelector"] == {"gpu": "a100"}
    names = [e["name"] for e in tpl["spec"]["containers"][0]["env"]]
    assert names[0] == "MINE" and names.count("MLSCHED_ROLE") == 1
    # The job's own spec is untouched (the record references it).
    assert wspec["nodeSelector"]["kubernetes.io/hostname"] == "n9"
    # Rendering is deterministic; the hash names its inputs, so a spec edit (a new generation)
    # or other counts give another hash, and the same inputs the same one.
    again = pod_template(job_record(body), "worker", {"ps": 1, "worker": 1}, SETTINGS)
    assert again == tpl
    rec = job_record(body)
    same = template_hash(rec, "worker", {"ps": 1, "worker": 1}, SETTINGS)
    assert same == template_hash(job_record(body), "worker", {"ps": 1, "worker": 1}, SETTINGS)
    assert same != template_hash(rec, "worker", {"ps": 2, "worker": 1}, SETTINGS)
    wspec["containers"][0]["image"] = "trainer:v2"
    body["metadata"]["generation"] = 2
    assert same != template_hash(job_record(body), "worker", {"ps": 1, "worker": 1}, SETTINGS)


def test_headless_service():
    svc = service_manifest(record())
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"]
    assert svc["spec"]["selector"] == {"mlsched.io/job-name": "bert"}
    assert svc["metadata"]["ownerReferences"][0]["uid"] == "uid-bert"


def snapshot_for(job):
    state = ClusterState(nodes=[node_record(node(f"n{i}")) for i in range(3)])
    return build_snapshot([job], state, now_s=0, interval_s=60)


def test_targets_respect_bounds_and_gang():
    job = record(min_workers=2, max_workers=3)
    snap = snapshot_for(job)
    too_many = Decision({"bert": JobDecision(ps_nodes=[0], worker_nodes=[0, 1, 2, 0, 1])})
    assert job_targets(too_many, snap)["bert"].nodes == {"ps": ("n0",), "worker": ("n0", "n1", "n2")}
    too_few = Decision({"bert": JobDecision(ps_nodes=[0], worker_nodes=[1])})
    assert job_targets(too_few, snap)["bert"].counts == {"ps": 0, "worker": 0}
    absent = Decision({})
    assert job_targets(absent, snap)["bert"].counts == {"ps": 0, "worker": 0}


def sts(role, replicas, template_hash=None):
    return sts_record({"metadata": {"name": f"bert-{role}", "labels": {"mlsched.io/role": role},
                                    "annotations": {"mlsched.io/template-hash": template_hash} if template_hash else {}},
                       "spec": {"replicas": replicas}})


def test_statefulset_plan_is_idempotent():
    job = record()
    counts = {"ps": 1, "worker": 2}
    first = plan_statefulset(job, "worker", sts("worker", 0), counts, SETTINGS)
    assert first.replicas == 2 and first.template is not None
    ops = first.patch()
    assert ops[0] == {"op": "replace", "path": "/spec/replicas", "value": 2}
    assert ops[2]["path"] == "/metadata/annotations/mlsched.io~1template-hash"
    # Once the StatefulSet shows that hash and count, the same decision plans nothing.
    assert plan_statefulset(job, "worker", sts("worker", 2, first.template_hash), counts, SETTINGS) is None
    # A count change elsewhere changes the environment, hence the template.
    changed = plan_statefulset(job, "worker", sts("worker", 2, first.template_hash),
                               {"ps": 2, "worker": 2}, SETTINGS)
    assert changed.template is not None and changed.replicas == 2
    # Scaling a role to zero leaves its template alone.
    to_zero = plan_statefulset(job, "worker", sts("worker", 2, first.template_hash), {"ps": 1, "worker": 0}, SETTINGS)
    assert to_zero == PatchStatefulSet(NS, "bert-worker", 0, None, first.template_hash)
    assert len(to_zero.patch()) == 1


def test_pod_plan_pins_gated_pods_and_moves_misplaced_ones():
    pods = [pod_record(pod("bert", "worker", 0, gated=True, phase="Pending")),
            pod_record(pod("bert", "worker", 1, node_name="n1")),
            pod_record(pod("bert", "worker", 2, node_name="n0")),
            pod_record(pod("bert", "worker", 3, node_name="n2")),  # beyond the count: left to the scale-down
            pod_record(pod("bert", "ps", 0, gated=True, pinned="n2", phase="Pending"))]
    actions = plan_pods(NS, pods, {"ps": ("n0",), "worker": ("n2", "n1", "n1")})
    pins = {a.name: a.node for a in actions if isinstance(a, PinPod)}
    deletes = {a.name: (a.was, a.node) for a in actions if isinstance(a, DeletePod)}
    assert pins == {"bert-worker-0": "n2"}
    assert deletes == {"bert-worker-2": ("n0", "n1"), "bert-ps-0": ("n2", "n0")}
    pin = PinPod(NS, "bert-worker-0", "u", "worker", 0, "n2").patch()
    assert pin == {"spec": {"nodeSelector": {"kubernetes.io/hostname": "n2"},
                            "schedulingGates": [{"name": "mlsched.io/placement", "$patch": "delete"}]}}


def test_applying_the_same_decision_twice_plans_nothing():
    settled = [pod_record(pod("bert", "worker", k, node_name=n)) for k, n in enumerate(("n2", "n1"))]
    assert plan_pods(NS, settled, {"worker": ("n2", "n1")}) == []
    pinned_not_bound = [pod_record(pod("bert", "worker", 0, pinned="n2", phase="Pending"))]
    assert plan_pods(NS, pinned_not_bound, {"worker": ("n2",)}) == []


def test_pods_run_as_the_training_service_account_unless_the_template_names_one():
    from dataclasses import replace

    settings = replace(SETTINGS, service_account="mlsched-training")
    counts = {"ps": 1, "worker": 1}
    assert pod_template(record(), "worker", counts, settings)["spec"]["serviceAccountName"] == \
        "mlsched-training"
    assert "serviceAccountName" not in pod_template(record(), "worker", counts, SETTINGS)["spec"]
    body = ps_job("bert")
    body["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["serviceAccountName"] = "reader"
    body["metadata"].update(uid="uid-bert", generation=1)
    own = pod_template(job_record(body), "worker", counts, settings)
    assert own["spec"]["serviceAccountName"] == "reader"
    # Changing the default re-renders running jobs (it is part of what the hash covers).
    assert template_hash(record(), "worker", counts, settings) != \
        template_hash(record(), "worker", counts, SETTINGS)


def test_the_endpoints_ca_is_passed_to_pods_when_there_is_one():
    from dataclasses import replace

    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    tpl = pod_template(record(), "worker", {"ps": 1, "worker": 1}, replace(SETTINGS, progress_ca=pem))
    assert env_of(tpl, "MLSCHED_PROGRESS_CA") == pem
    plain = pod_template(record(), "worker", {"ps": 1, "worker": 1}, SETTINGS)
    assert "MLSCHED_PROGRESS_CA" not in {e["name"] for e in plain["spec"]["containers"][0]["env"]}


def _resolved(template: dict, ordinal: int) -> dict[str, str]:
    """The first container's environment as the kubelet gives it to pod `ordinal`: the
    pod-index fieldRef filled in, then $(VAR) references to earlier variables expanded."""
    out: dict[str, str] = {}
    for e in template["spec"]["containers"][0]["env"]:
        if "valueFrom" in e:
            path = e["valueFrom"]["fieldRef"]["fieldPath"]
            value = str(ordinal) if "pod-index" in path else f"<{path}>"
        else:
            value = e["value"]
            for name, known in out.items():
                value = value.replace(f"$({name})", known)
        out[e["name"]] = value
    return out


def test_allreduce_pods_get_what_torchrun_and_pytorchjob_set():
    import json
    from builders import allreduce_job
    body = allreduce_job("ring")
    body["metadata"].update(uid="u", generation=1)
    tpl = pod_template(job_record(body), "worker", {"worker": 3}, SETTINGS)
    env = _resolved(tpl, 2)
    master = f"ring-worker-0.ring.{NS}.svc"
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["WORLD_SIZE"], env["RANK"]) == \
        (master, "23456", "3", "2")
    assert (env["PET_MASTER_ADDR"], env["PET_MASTER_PORT"], env["PET_NNODES"],
            env["PET_NODE_RANK"]) == (master, "23456", "3", "2")
    assert env["MLSCHED_ARCHITECTURE"] == "AllReduce" and "TF_CONFIG" not in env
    # A port named as PyTorchJob names it moves MASTER_PORT.
    body["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]["ports"] = [
        {"name": "pytorchjob-port", "containerPort": 29500}]
    env = _resolved(pod_template(job_record(body), "worker", {"worker": 3}, SETTINGS), 0)
    assert env["MASTER_PORT"] == env["PET_MASTER_PORT"] == "29500" and env["RANK"] == "0"
    assert "TF_CONFIG" not in json.dumps(tpl)


def test_parameter_server_pods_get_tf_config_as_tfjob_renders_it():
    import json
    job = record()
    for role, ordinal in (("ps", 1), ("worker", 2)):
        tpl = pod_template(job, role, {"ps": 2, "worker": 3}, SETTINGS)
        config = json.loads(_resolved(tpl, ordinal)["TF_CONFIG"])
        assert config == {
            "cluster": {"ps": [f"bert-ps-{k}.bert.{NS}.svc:2222" for k in range(2)],
                        "worker": [f"bert-worker-{k}.bert.{NS}.svc:2222" for k in range(3)]},
            "task": {"type": role, "index": ordinal}, "environment": "cloud"}
        assert "MASTER_ADDR" not in _resolved(tpl, ordinal)


def test_the_pod_index_is_defined_before_anything_that_refers_to_it():
    from builders import allreduce_job
    body = allreduce_job("ring")
    for job, role in ((record(), "worker"), (job_record(body), "worker")):
        names = [e["name"] for e in pod_template(job, role, {"ps": 1, "worker": 2},
                                                 SETTINGS)["spec"]["containers"][0]["env"]]
        refs = [e["name"] for e in pod_template(job, role, {"ps": 1, "worker": 2},
                                                SETTINGS)["spec"]["containers"][0]["env"]
                if "$(MLSCHED_REPLICA_INDEX)" in e.get("value", "")]
        assert refs and all(names.index("MLSCHED_REPLICA_INDEX") < names.index(r) for r in refs)


def test_a_container_mounting_the_checkpoint_volume_is_told_where():
    body = ps_job("bert")
    spec = body["spec"]["replicaSpecs"]["worker"]["template"]["spec"]
    spec["volumes"] = [{"name": "checkpoint", "persistentVolumeClaim": {"claimName": "ckpt"}}]
    spec["containers"][0]["volumeMounts"] = [{"name": "checkpoint", "mountPath": "/ckpt"}]
    spec["containers"].append({"name": "sidecar", "image": "busybox"})
    body["metadata"].update(uid="u", generation=1)
    tpl = pod_template(job_record(body), "worker", {"ps": 1, "worker": 1}, SETTINGS)
    assert env_of(tpl, "MLSCHED_CHECKPOINT_DIR") == "/ckpt"
    sidecar = {e["name"] for e in tpl["spec"]["containers"][1]["env"]}
    assert "MLSCHED_CHECKPOINT_DIR" not in sidecar and "TF_CONFIG" in sidecar
    body["spec"]["replicaSpecs"]["ps"]["template"]["spec"]["containers"][0].pop("volumeMounts", None)
    ps_tpl = pod_template(job_record(body), "ps", {"ps": 1, "worker": 1}, SETTINGS)
    assert "MLSCHED_CHECKPOINT_DIR" not in {e["name"] for e in ps_tpl["spec"]["containers"][0]["env"]}

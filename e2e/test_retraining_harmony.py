"""`mlsched retrain harmony` on the real control plane: emulated jobs whose users fix their
counts, placed by Harmony under `updatePolicy: Auto`, leave interval records; the retraining
Job's container (run as a subprocess with the `mlsched-retrain` ServiceAccount's token and
Role, as in test_retraining_loop.py, whose helpers this uses) reads them, trains the placement
model from the active one, publishes a `placement/harmony` version; the operator adopts it at
the next round. Killing and rerunning, "nothing new" and the Role's limits are DL²'s test's:
the Harmony retrainer shares that code (retrain/cli.py `sources`, `conclude`, publish.py).

The paper's encoder size (128 units, 8 heads) makes a 1.4 MB graph, over a ConfigMap's 1 MiB:
retrained from such a model, the version is published in part ConfigMaps
(formats/model_versions.py), adopted, and refused once a part is replaced; made by hand with
`mlsched model-configmap` and `kubectl create -f`, it serves when a policy pins it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys

from kubernetes import client

from mlsched.formats import model_versions
from mlsched.formats.model_sources import MODEL_PARTS
from mlsched_objects import condition, mljob, scheduling_policy
from retraining_runs import (
    POLICY, ROUND_TIMEOUT, SHORT_INTERVAL, RetrainingJob, job_args, policy_status, records, require_torch,
    retraining_kubeconfig, versions,
)
from waiting import wait_for


def placement_active(mlsched) -> dict:
    return ((policy_status(mlsched).get("modelVersions") or {}).get("placement/harmony") or {}) \
        .get("active") or {}


def test_harmony_retraining_job_publishes_a_placement_version_that_auto_adopts(
        api, control_plane, mlsched, operator, emulator, tmp_path):
    require_torch()
    ns = mlsched.namespace
    job = RetrainingJob(retraining_kubeconfig(api, ns, control_plane.apiserver_url,
                                              control_plane.ca_cert_path, tmp_path / "retrain.kubeconfig"),
                        ns, tmp_path / "retrain")
    mlsched.create(scheduling_policy(POLICY, allocation="fixed", placement="harmony",
                                     interval=SHORT_INTERVAL, updatePolicy="Auto"))
    counts = {"h1": ("resnet-50", (1, 1), (2, 2)), "h2": ("vgg-16", None, (2, 2)),
              "h3": ("inception-bn", (1, 1), (1, 1))}
    for name, (model, ps, workers) in counts.items():
        mlsched.create(mljob(name, model=model, ps=ps, workers=workers, epochs=1e9))
    recorded = wait_for(lambda: r if len(r := records(api, ns)) >= 3 else None, ROUND_TIMEOUT * 2,
                        "three closed interval records", describe=lambda: [r.interval for r in records(api, ns)])
    assert recorded[-1].algorithms.get("placement") == "harmony", recorded[-1].algorithms
    assert placement_active(mlsched).get("source") == "shipped", policy_status(mlsched).get("modelVersions")

    # The Job's args with `harmony` as the algorithm (the manifests' comment says so); a
    # forced promotion (-0.5) and a tiny budget: this is about the loop, not quality
    # (bench/bench_retrain.py --parts 4 measures that).
    args = job_args(time_budget_min=0.3, eval_traces=1, validation_traces=1, episodes=2,
                    validate_every=1, margin=-0.5)
    assert args[0] == "dl2" and "--mode=simulator" in args, args
    # The off-policy mode learns from the decisions the operator logged for Harmony (state,
    # mask, node, probabilities): a dry run, so nothing is published or consumed here.
    logged = sum(d.steps for r in recorded for d in r.decisions if d.algorithm == "harmony")
    assert logged > 0, [(r.interval, [(d.algorithm, d.steps) for d in r.decisions]) for r in recorded]
    off = job.run(["harmony", *[a for a in args[1:] if not a.startswith("--mode=")], "--mode=offpolicy",
                   "--dry-run"])
    assert off["status"] in ("dry-run", "not-better") and off["evaluation"]["mode"] == "offpolicy", off
    assert versions(api, ns) == []
    report = job.run(["harmony", *args[1:]])
    assert report["status"] == "published" and report["version"] == 1, report
    evaluation = report["evaluation"]
    assert evaluation["allocation"] == "fixed" and evaluation["trained_through_interval"] >= recorded[-1].interval
    (cm,) = versions(api, ns)
    version = model_versions.parse(cm)
    assert (version.phase, version.algorithm, version.version) == ("placement", "harmony", 1)
    assert cm["metadata"]["name"] == report["configmap"] == f"{POLICY}-harmony-v1"
    workload = json.loads(cm["data"]["harmony.card.json"])["training"]["workload"]
    assert workload["distinct_jobs"] == 3, workload  # each job kept, with the counts it held

    # Auto: the operator serves v1 for placement from the next round.
    adopted = wait_for(lambda: (a := placement_active(mlsched)).get("version") == 1 and a, ROUND_TIMEOUT,
                       "Auto: placement v1 adopted", describe=lambda: policy_status(mlsched).get("modelVersions"))
    assert adopted["source"] == "published" and adopted["sha256"] == version.sha256, adopted
    assert policy_status(mlsched)["activeModels"]["placement/harmony"] == version.sha256
    wait_for(lambda: any(e.reason == "VersionAdopted" for e in mlsched.events(POLICY, "SchedulingPolicy")),
             ROUND_TIMEOUT, "the VersionAdopted Event (Events go out in the background)",
             describe=lambda: [e.reason for e in mlsched.events(POLICY, "SchedulingPolicy")])


def paper_size_harmony(directory) -> tuple:
    """An (untrained, seeded) Harmony network at the paper's encoder size, exported with its card."""
    import torch

    from policy_models.harmony import export, networks

    torch.manual_seed(0)
    path = directory / "harmony.onnx"
    export.export(networks.HarmonyNet(d=128, heads=8, layers=2), path, {"note": "e2e paper-size"}, {})
    return path, path.stat().st_size


def test_a_placement_model_over_a_configmaps_limit_is_published_in_parts_and_adopted(
        api, control_plane, mlsched, operator, emulator, tmp_path):
    require_torch()
    ns, core = mlsched.namespace, client.CoreV1Api(api)
    job = RetrainingJob(retraining_kubeconfig(api, ns, control_plane.apiserver_url,
                                              control_plane.ca_cert_path, tmp_path / "retrain.kubeconfig"),
                        ns, tmp_path / "retrain")
    base, size = paper_size_harmony(tmp_path / "base")
    assert size > 2**20, size  # what a single ConfigMap cannot hold
    mlsched.create(scheduling_policy(POLICY, allocation="fixed", placement="harmony",
                                     interval=SHORT_INTERVAL, updatePolicy="Auto"))
    for name, (model, ps, workers) in {"b1": ("resnet-50", (1, 1), (2, 2)),
                                       "b2": ("inception-bn", (1, 1), (1, 1))}.items():
        mlsched.create(mljob(name, model=model, ps=ps, workers=workers, epochs=1e9))
    wait_for(lambda: len(records(api, ns)) >= 2, ROUND_TIMEOUT * 2, "two closed interval records",
             describe=lambda: [r.interval for r in records(api, ns)])

    args = job_args(time_budget_min=0.2, eval_traces=1, validation_traces=1, episodes=1,
                    validate_every=1, margin=-0.5)
    report = job.run(["harmony", *args[1:], f"--base-model={base}"])
    assert report["status"] == "published" and report["version"] == 1, report
    (cm,) = versions(api, ns)
    version = model_versions.parse(cm)
    assert "harmony.onnx" not in (cm.get("binaryData") or {}), "the graph is in the parts"
    named = json.loads(cm["metadata"]["annotations"][MODEL_PARTS])["harmony.onnx"]
    assert named["sha256"] == version.sha256 and len(named["parts"]) == 2, named
    parts = {p.metadata.name: p for p in core.list_namespaced_config_map(
        ns, label_selector=f"{model_versions.PART_OF}={POLICY}").items}
    assert sorted(parts) == sorted(named["parts"]), (sorted(parts), named)
    joined = b"".join(base64.b64decode(parts[n].binary_data["harmony.onnx"]) for n in named["parts"])
    assert len(joined) > 2**20 and hashlib.sha256(joined).hexdigest() == version.sha256

    # Auto: the operator joins the parts, checks them and serves v1 for placement.
    adopted = wait_for(lambda: (a := placement_active(mlsched)).get("version") == 1 and a, ROUND_TIMEOUT,
                       "Auto: the split placement v1 adopted",
                       describe=lambda: policy_status(mlsched).get("modelVersions"))
    assert adopted["source"] == "published" and adopted["sha256"] == version.sha256, adopted
    loaded = condition(mlsched.policy(POLICY), "ModelLoaded")
    assert (loaded["status"], loaded["reason"]) == ("True", "ModelVerified"), loaded

    # A part replaced (by hand, or another model's): refused, never served; the shipped model serves.
    second = named["parts"][1]
    core.patch_namespaced_config_map(second, ns, {"binaryData": {"harmony.onnx": base64.b64encode(
        b"not the second half").decode()}})
    refused = wait_for(lambda: (c := condition(mlsched.policy(POLICY), "ModelLoaded"))
                       and c["reason"] == "ModelDigestMismatch" and c, ROUND_TIMEOUT,
                       "ModelLoaded False, ModelDigestMismatch",
                       describe=lambda: condition(mlsched.policy(POLICY), "ModelLoaded"))
    assert refused["status"] == "False" and "a part was replaced" in refused["message"], refused
    wait_for(lambda: placement_active(mlsched).get("source") == "shipped", ROUND_TIMEOUT,
             "the shipped placement model serving again", describe=lambda: policy_status(mlsched).get("modelVersions"))


def test_a_model_over_a_configmaps_limit_made_with_mlsched_model_configmap_serves_when_pinned(
        api, control_plane, mlsched, operator, tmp_path):
    require_torch()
    ns = mlsched.namespace
    model, size = paper_size_harmony(tmp_path / "model")
    printed = subprocess.run([sys.executable, "-m", "mlsched.cli", "model-configmap", "big-harmony", str(model),
                              "--key", "harmony.onnx"], capture_output=True, text=True, check=True)
    assert "2 parts, then big-harmony naming them" in printed.stderr, printed.stderr
    (tmp_path / "big.json").write_text(printed.stdout)
    created = control_plane.kubectl("create", "-n", ns, "-f", str(tmp_path / "big.json")).stdout
    assert created.split() == ["configmap/big-harmony-part-1", "created", "configmap/big-harmony-part-2", "created",
                               "configmap/big-harmony", "created"], created
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    mlsched.create(scheduling_policy("pinned", allocation="fixed", placement="harmony", models={"placement": {
        "harmony": {"configMapKeyRef": {"name": "big-harmony", "key": "harmony.onnx"}, "sha256": digest}}}))
    loaded = wait_for(lambda: (c := condition(mlsched.policy("pinned"), "ModelLoaded")) and c, ROUND_TIMEOUT,
                      "ModelLoaded on the pinned policy")
    assert (loaded["status"], loaded["reason"]) == ("True", "ModelVerified"), loaded
    assert mlsched.policy("pinned")["status"]["activeModels"] == {"placement/harmony": digest}
    assert size > 2**20

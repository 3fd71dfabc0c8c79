"""Every kustomization renders with `kubectl kustomize`, and what it renders is what the
README promises: the base with probes, requests, a locked-down security context and the
shipped models mounted from ConfigMaps where the operator reads them; `dev` one replica with
debug logs and a namespace ready for jobs; `prod` two spread replicas and a
PodDisruptionBudget; custom resources valid against the generated CRDs. (The built-in kinds
are validated against the API server's own schemas in e2e/test_deploy_manifests.py.)"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import yaml

from mlsched.controller.__main__ import parse_args
from mlsched.controller.process.config import OperatorConfig
from mlsched.controller.kube.constants import LEADER_LABEL
from manifest_tools import render, strict_validator

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "manifests"
ARTIFACTS = ROOT / "policy_models" / "artifacts"
KUSTOMIZATIONS = ["manifests", "manifests/base", "manifests/base/training-rbac",
                  "manifests/base/training-namespace", "manifests/overlays/dev",
                  "manifests/overlays/prod", "manifests/overlays/namespaced",
                  "manifests/overlays/namespaced/served-namespace", "manifests/samples",
                  "manifests/overlays/label-nodes",
                  "manifests/retraining", "manifests/monitoring",
                  "policy_models/artifacts", "crds"]
#: `kubectl apply` without --server-side keeps a copy of the object in this annotation.
LAST_APPLIED_LIMIT = 256 * 1024


def the(objects: list[dict], kind: str, name: str | None = None) -> dict:
    found = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''}"
    return found[0]


def container(objects: list[dict]) -> dict:
    (operator,) = the(objects, "Deployment", "mlsched-operator")["spec"]["template"]["spec"]["containers"]
    return operator


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_every_kustomization_renders(path):
    objects = render(path)
    assert objects
    for obj in objects:
        assert obj["apiVersion"] and obj["kind"] and obj["metadata"]["name"]


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_custom_resources_validate_against_the_crds(path):
    for obj in render(path):
        if obj["apiVersion"].startswith("mlsched.io/"):
            strict_validator(obj["kind"]).validate(obj)


def test_base_deployment_is_probed_bounded_and_locked_down():
    objects = render("manifests/base")
    deployment = the(objects, "Deployment", "mlsched-operator")
    pod = deployment["spec"]["template"]["spec"]
    operator = container(objects)
    assert operator["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert operator["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert set(operator["resources"]["requests"]) == {"cpu", "memory"}
    assert "memory" in operator["resources"]["limits"]
    security = operator["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    # The only writable place is /tmp (models are loaded from bytes: no cache folder).
    writable = [m["mountPath"] for m in operator["volumeMounts"] if not m.get("readOnly")]
    assert writable == ["/tmp"]
    # The metrics Service reaches the pod's port.
    service = the(objects, "Service", "mlsched-operator")
    assert service["spec"]["ports"][0]["targetPort"] == operator["ports"][0]["name"]
    # ...of the leader only: the label it puts on its own pod (leadership.label_own_pod).
    selector = dict(service["spec"]["selector"])
    assert selector.pop(LEADER_LABEL) == "true"
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    probe = operator["readinessProbe"]["httpGet"]["path"]
    assert probe == "/readyz"  # 200 on leader and standby alike (both count for a PDB)


def test_every_shipped_model_is_a_configmap_mounted_where_the_operator_reads_models():
    objects = render("manifests/base")
    operator = container(objects)
    env = {e["name"]: e.get("value") for e in operator["env"]}
    models_dir = env["MLSCHED_MODELS_DIR"]
    # Model paths are locked to that directory alone (and the default models come from it).
    config = OperatorConfig.from_env(env)
    assert config.model_dirs == (models_dir,)
    pod = the(objects, "Deployment", "mlsched-operator")["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in operator["volumeMounts"]}
    config_maps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
    files: dict[str, bytes] = {}  # path in the container -> content
    for volume in pod["volumes"]:
        if "projected" not in volume:
            continue
        mount = mounts[volume["name"]]
        assert mount["readOnly"] is True and Path(mount["mountPath"]).parent == Path(models_dir)
        for source in volume["projected"]["sources"]:
            config_map = config_maps[source["configMap"]["name"]]  # the hashed name
            for key, value in (config_map.get("binaryData") or {}).items():
                files[f"{mount['mountPath']}/{key}"] = base64.b64decode(value)
            for key, value in (config_map.get("data") or {}).items():
                files[f"{mount['mountPath']}/{key}"] = value.encode()
    shipped = {f"{models_dir}/{p.relative_to(ARTIFACTS)}": p.read_bytes()
               for pattern in ("*/*.onnx", "*/*.card.json") for p in ARTIFACTS.glob(pattern)}
    assert files.keys() == shipped.keys()
    assert all(files[k] == shipped[k] for k in files)
    # Each learned algorithm's default, <dir>/<algorithm>/<algorithm>.onnx, is among them.
    for algorithm in ("dl2", "chic", "chic-pair", "harmony"):
        assert f"{models_dir}/{algorithm}/{algorithm}.onnx" in files
    # Small enough for a ConfigMap, and for plain `kubectl apply`'s last-applied annotation.
    for config_map in config_maps.values():
        assert len(json.dumps(config_map)) < LAST_APPLIED_LIMIT, config_map["metadata"]["name"]


def test_dev_is_one_verbose_replica_with_a_namespace_ready_for_jobs():
    objects = render("manifests/overlays/dev")
    deployment = the(objects, "Deployment", "mlsched-operator")
    operator = container(objects)
    assert deployment["spec"]["replicas"] == 1
    assert operator["image"] == "mlsched-operator:dev"
    args = parse_args(operator["args"])
    assert args.verbose and args.leader_election == "mlsched-system/mlsched-operator"
    namespace = the(objects, "Namespace", "mlsched-dev")
    assert the(objects, "ServiceAccount", "mlsched-training")["metadata"]["namespace"] == "mlsched-dev"
    policy = the(objects, "SchedulingPolicy", "default")
    assert policy["metadata"]["namespace"] == namespace["metadata"]["name"]
    # The operator serves every namespace (bound cluster-wide), mlsched-dev included.
    assert the(objects, "ClusterRoleBinding", "mlsched-operator")
    assert {e["name"]: e.get("value") for e in operator["env"]}["MLSCHED_NAMESPACES"] == ""


def test_prod_is_two_spread_replicas_with_a_disruption_budget():
    objects = render("manifests/overlays/prod")
    deployment = the(objects, "Deployment", "mlsched-operator")
    assert deployment["spec"]["replicas"] == 2
    assert parse_args(container(objects)["args"]).leader_election
    image = container(objects)["image"]
    assert image.rsplit(":", 1)[1] not in ("latest", "dev")
    pdb = the(objects, "PodDisruptionBudget", "mlsched-operator")
    assert pdb["spec"]["minAvailable"] == 1
    # Both replicas are Ready, so a drain evicts one at a time; a replica that is not Ready
    # (crash-looping, say) must stay evictable.
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    (term,) = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= labels.items()
    # No custom resources: nothing in prod waits for its CRD in the same sync.
    assert not [o for o in objects if o["apiVersion"].startswith("mlsched.io/")]


def _node_writes(objects: list[dict]) -> list[tuple[str, list[str]]]:
    return [(o["metadata"]["name"], rule["verbs"]) for o in objects if o["kind"] == "ClusterRole"
            for rule in o.get("rules") or () if "nodes" in rule.get("resources", ())
            and set(rule["verbs"]) - {"get", "list", "watch"}]


def test_only_the_label_nodes_overlay_may_write_nodes_and_it_says_so_with_its_flag():
    # The default install stays least-privilege: node labels for grouping are opt-in.
    for path in ("manifests/base", "manifests/overlays/dev", "manifests/overlays/prod",
                 "manifests/overlays/namespaced"):
        assert not _node_writes(render(path)), path
        assert "--label-nodes" not in container(render(path))["args"], path
    objects = render("manifests/overlays/label-nodes")
    assert _node_writes(objects) == [("mlsched-operator-label-nodes", ["patch"])]
    binding = the(objects, "ClusterRoleBinding", "mlsched-operator-label-nodes")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "mlsched-operator",
                                    "namespace": "mlsched-system"}]
    assert "--label-nodes" in container(objects)["args"]


def test_the_plain_install_is_the_base():
    assert render("manifests") == render("manifests/base")


def test_retraining_runs_the_train_image_with_least_privilege():
    objects = render("manifests/retraining")
    rules = the(objects, "Role", "mlsched-retrain")["rules"]
    # read records and versions, read the policy, create a version; never update or delete
    assert {(tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r["verbs"])) for r in rules} == {
        (("",), ("configmaps",), ("get", "list", "create")),
        (("mlsched.io",), ("schedulingpolicies",), ("get",))}
    binding = the(objects, "RoleBinding", "mlsched-retrain")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "mlsched-retrain"}]
    cron = the(objects, "CronJob", "mlsched-retrain")
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    job = yaml.safe_load((MANIFESTS / "retraining" / "job.yaml").read_text())
    assert job["apiVersion"] == "batch/v1" and job["kind"] == "Job"
    for pod in (cron["spec"]["jobTemplate"]["spec"]["template"]["spec"], job["spec"]["template"]["spec"]):
        assert pod["serviceAccountName"] == "mlsched-retrain"
        (c,) = pod["containers"]
        assert c["image"].startswith("mlsched-train:") and c["args"][0] == "dl2"
        assert c["securityContext"]["readOnlyRootFilesystem"] and pod["securityContext"]["runAsNonRoot"]
        assert any(m["mountPath"] == "/tmp" for m in c["volumeMounts"])
    assert cron["spec"]["jobTemplate"]["spec"]["template"]["spec"] == job["spec"]["template"]["spec"]

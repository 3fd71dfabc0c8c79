"""The deployable pieces agree with the code: RBAC covers every call the operator makes and
nothing for training pods on mlsched.io; Deployment, Service and CLI agree on the port."""

from __future__ import annotations

from pathlib import Path

import yaml

from mlsched.controller.__main__ import parse_args

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "manifests" / "base"


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def rules_of(kind: str, directory: Path = BASE) -> list[dict]:
    found = [d for f in directory.glob("*.yaml") for d in docs(f) if d.get("kind") == kind]
    return [r for d in found for r in d.get("rules") or []]


def allowed(rules: list[dict], group: str, resource: str, verb: str) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"]
               for r in rules)


# What the operator calls (kube.py, kopf's watches and patches), as (group, resource, verb).
NEEDED = [
    ("mlsched.io", "mljobs", v) for v in ("list", "watch", "patch", "delete")] + [
    ("mlsched.io", "schedulingpolicies", v) for v in ("list", "watch", "patch")] + [
    ("mlsched.io", "mljobs/status", "patch"), ("mlsched.io", "schedulingpolicies/status", "patch"),
    ("mlsched.io", "mljobs/finalizers", "update"),
    ("apps", "statefulsets", "create"), ("apps", "statefulsets", "patch"), ("apps", "statefulsets", "watch"),
    ("", "services", "create"), ("", "pods", "watch"), ("", "pods", "patch"), ("", "pods", "delete"),
    ("", "nodes", "watch"), ("", "configmaps", "get"), ("", "events", "create"),
    ("authentication.k8s.io", "tokenreviews", "create"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"), ("", "namespaces", "watch"),
]


def test_operator_role_covers_every_call_and_no_more_than_needed():
    rules = rules_of("ClusterRole")
    missing = [n for n in NEEDED if not allowed(rules, *n)]
    assert not missing
    # Least privilege: nothing on secrets, no wildcards, no deleting what GC deletes.
    assert not any("*" in r["verbs"] or "*" in r["resources"] for r in rules)
    assert not allowed(rules, "", "secrets", "get")
    assert not allowed(rules, "apps", "statefulsets", "delete")


def test_training_pods_get_nothing_on_mlsched_io():
    rules = rules_of("Role", BASE / "training-rbac")
    assert not any("mlsched.io" in r.get("apiGroups", ()) for r in rules)
    sa = next(d for d in docs(BASE / "training-rbac" / "training-rbac.yaml") if d["kind"] == "ServiceAccount")
    assert sa["automountServiceAccountToken"] is False


def test_deployment_service_and_cli_agree():
    deployment = docs(BASE / "deployment.yaml")[0]
    service = docs(BASE / "service.yaml")[0]
    spec = deployment["spec"]
    assert spec["replicas"] == 1 and spec["strategy"]["type"] == "Recreate"
    container = spec["template"]["spec"]["containers"][0]
    assert container["image"] == "mlsched-operator:latest"
    args = parse_args(container["args"])
    assert args.port == container["ports"][0]["containerPort"] == service["spec"]["ports"][0]["port"]
    assert args.progress_url == f"http://{service['metadata']['name']}.mlsched-system.svc:{args.port}/v1/progress"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert spec["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_kustomization_references_the_generated_crds():
    kustomization = docs(BASE / "kustomization.yaml")[0]
    assert "../../crds" in kustomization["resources"] and kustomization["namespace"] == "mlsched-system"
    for name in kustomization["resources"]:
        assert (BASE / name).exists()


def test_dockerfile_runs_the_operator_as_non_root():
    text = (ROOT / "Dockerfile").read_text()
    assert text.startswith("#") and "FROM python:3.11-slim" in text
    assert "USER 10001" in text and "RUN pip install . " in text and "[train]" not in text
    assert 'ENTRYPOINT ["python", "-m", "mlsched.controller"]' in text

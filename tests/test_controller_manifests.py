"""The deployable pieces agree with the code: RBAC covers every call the operator makes, writes
only where it is bound (everywhere in the base, served namespaces in the namespaced overlay),
nothing for training pods on mlsched.io, user roles aggregate into view/edit/admin;
Deployment, Service and CLI agree on the port."""

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


# What the operator calls (kube.py, kopf's watches), as (group, resource, verb): what the
# audit log of e2e/test_deploy_manifests.py shows it requesting, plus the calls made only in
# rarer cases (a 409, an index miss). That test compares the audit log with the rules both
# ways; this one is the quick check.
NEEDED = [
    ("mlsched.io", "mljobs", v) for v in ("get", "list", "watch", "patch", "delete")] + [
    ("mlsched.io", "schedulingpolicies", v) for v in ("list", "watch", "patch")] + [
    ("mlsched.io", "mljobs/status", "patch"), ("mlsched.io", "schedulingpolicies/status", "patch"),
    ("mlsched.io", "mljobs/finalizers", "update"),
    ("apps", "statefulsets", "create"), ("apps", "statefulsets", "patch"), ("apps", "statefulsets", "watch"),
    ("apps", "statefulsets", "get"), ("apps", "statefulsets", "list"),
    ("", "services", "create"), ("", "services", "get"), ("", "services", "list"), ("", "services", "watch"),
    ("", "pods", "get"), ("", "pods", "list"),
    ("", "pods", "watch"), ("", "pods", "patch"), ("", "pods", "delete"),
    ("", "nodes", "list"), ("", "nodes", "watch"), ("", "configmaps", "get"), ("", "events", "create"),
    # Published model versions (list) and the retraining dataset (controller/dataset/dataset.py).
    ("", "configmaps", "list"), ("", "configmaps", "create"), ("", "configmaps", "patch"),
    ("", "configmaps", "delete"),
    ("authentication.k8s.io", "tokenreviews", "create"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    ("", "namespaces", "list"), ("", "namespaces", "watch"),
    # RuntimeClasses: what pods naming one will be (controller/constraints/runtimeclasses.py).
    ("node.k8s.io", "runtimeclasses", "list"), ("node.k8s.io", "runtimeclasses", "watch"),
    # The globalDefault PriorityClass: what PriorityClass-scoped quotas count (controller/admission/quotas.py).
    ("scheduling.k8s.io", "priorityclasses", "list"), ("scheduling.k8s.io", "priorityclasses", "watch"),
    # Dynamic Resource Allocation: devices per node and what claims take (controller/constraints/dra.py).
    *(("resource.k8s.io", r, v) for r in ("deviceclasses", "resourceslices", "resourceclaimtemplates",
                                          "resourceclaims") for v in ("list", "watch")),
    # The namespace's ResourceQuotas: a round's budget (controller/admission/quotas.py).
    ("", "resourcequotas", "list"), ("", "resourcequotas", "watch"),
    # The namespace's LimitRanges: the requests its pods get (controller/admission/limitranges.py).
    ("", "limitranges", "list"), ("", "limitranges", "watch"),
    # A StatefulSet's FailedCreate Events: why the API server refuses a job's pods.
    ("", "events", "list"),
    # Dry-run creates of a job's pods before it is given capacity (controller/objects/preflight.py).
    ("", "pods", "create"),
]


OPERATOR_SA = {"kind": "ServiceAccount", "name": "mlsched-operator", "namespace": "mlsched-system"}
NAMESPACED = ROOT / "manifests" / "overlays" / "namespaced"
READ = {"get", "list", "watch"}


def cluster_roles(directory: Path = BASE) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for f in directory.glob("*.yaml") for d in docs(f)
            if d.get("kind") == "ClusterRole"}


def bound_cluster_roles(files: list[Path]) -> set[str]:
    """ClusterRoles bound to the operator's ServiceAccount by the bindings in these files."""
    return {d["roleRef"]["name"] for f in files for d in docs(f)
            if d.get("kind") in ("ClusterRoleBinding", "RoleBinding")
            and OPERATOR_SA in d.get("subjects", []) and d["roleRef"]["kind"] == "ClusterRole"}


def test_operator_role_covers_every_call_and_no_more_than_needed():
    roles = cluster_roles()
    rules = [r for name in bound_cluster_roles(list(BASE.glob("*.yaml")))
             for r in roles[name]["rules"]]
    missing = [n for n in NEEDED if not allowed(rules, *n)]
    assert not missing
    granted = {(g, res, v) for r in rules for g in r["apiGroups"] for res in r["resources"]
               for v in r["verbs"]}
    assert granted - set(NEEDED) == set(), "granted, but the operator never asks for it"
    # Least privilege: nothing on secrets, no wildcards, no deleting what GC deletes.
    assert not any("*" in r["verbs"] or "*" in r["resources"] for r in rules)
    assert not allowed(rules, "", "secrets", "get")
    assert not allowed(rules, "apps", "statefulsets", "delete")


def test_cluster_wide_the_operator_only_reads_and_reviews_tokens():
    """What is bound cluster-wide in both modes: reads (and TokenReviews, which change
    nothing); no ConfigMaps at all, so kube-system's are out of reach in namespaced mode."""
    (always,) = bound_cluster_roles([BASE / "rbac.yaml"])
    rules = cluster_roles()[always]["rules"]
    for rule in rules:
        if rule["resources"] != ["tokenreviews"]:
            assert set(rule["verbs"]) <= READ, rule
    assert not allowed(rules, "", "configmaps", "get")
    assert not allowed(rules, "apps", "statefulsets", "list")


def test_namespaced_overlay_binds_the_writes_in_served_namespaces_only():
    # The base binds the operator's namespaced rights cluster-wide in one file, and the
    # overlay deletes exactly the objects of that file.
    (clusterwide,) = docs(BASE / "rbac-all-namespaces.yaml")
    assert clusterwide["kind"] == "ClusterRoleBinding" and OPERATOR_SA in clusterwide["subjects"]
    (kustomization,) = docs(NAMESPACED / "kustomization.yaml")
    assert kustomization["resources"] == ["../../base"]
    deleted = [yaml.safe_load(p["patch"]) for p in kustomization["patches"]
               if "$patch: delete" in p["patch"]]
    assert [(d["kind"], d["metadata"]["name"]) for d in deleted] == [
        (clusterwide["kind"], clusterwide["metadata"]["name"])]
    env = [yaml.safe_load(p["patch"]) for p in kustomization["patches"]
           if "Deployment" in p["patch"]][0]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert any(e["name"] == "MLSCHED_NAMESPACES" and e["value"] for e in env)
    # Per served namespace: a RoleBinding (namespaced, so it grants nothing elsewhere) of the
    # same ClusterRole, and the training ServiceAccount.
    served = NAMESPACED / "served-namespace"
    (kust,) = docs(served / "kustomization.yaml")
    assert "namespace" not in kust  # `kubectl apply -n <namespace> -k` decides where
    assert "../../../base/training-rbac" in kust["resources"]
    (binding,) = docs(served / "operator-rolebinding.yaml")
    assert binding["kind"] == "RoleBinding" and OPERATOR_SA in binding["subjects"]
    assert binding["roleRef"] == clusterwide["roleRef"]


def test_user_roles_aggregate_into_view_edit_and_admin_and_never_write_status():
    roles = cluster_roles()
    view, edit = roles["mlsched-view"], roles["mlsched-edit"]
    label = "rbac.authorization.k8s.io/aggregate-to-{}"
    assert all(view["metadata"]["labels"][label.format(r)] == "true" for r in ("view", "edit", "admin"))
    assert all(edit["metadata"]["labels"][label.format(r)] == "true" for r in ("edit", "admin"))
    assert label.format("view") not in edit["metadata"]["labels"]
    for kind in ("mljobs", "schedulingpolicies"):
        assert allowed(view["rules"], "mlsched.io", kind, "list")
        assert allowed(view["rules"], "mlsched.io", f"{kind}/status", "get")
        assert not allowed(view["rules"], "mlsched.io", kind, "create")
        assert allowed(edit["rules"], "mlsched.io", kind, "create")
        assert allowed(edit["rules"], "mlsched.io", kind, "delete")
        for verb in ("patch", "update"):
            assert not allowed(edit["rules"] + view["rules"], "mlsched.io", f"{kind}/status", verb)


def test_training_pods_get_nothing_on_mlsched_io():
    rules = rules_of("Role", BASE / "training-rbac")
    assert not any("mlsched.io" in r.get("apiGroups", ()) for r in rules)
    sa = next(d for d in docs(BASE / "training-rbac" / "training-rbac.yaml") if d["kind"] == "ServiceAccount")
    assert sa["automountServiceAccountToken"] is False


def test_deployment_service_and_cli_agree():
    deployment = docs(BASE / "deployment.yaml")[0]
    service = docs(BASE / "service.yaml")[0]
    spec = deployment["spec"]
    # Active/standby: two replicas elect a leader with a Lease; only the leader is Ready.
    assert spec["replicas"] == 2 and spec["strategy"]["type"] == "RollingUpdate"
    container = spec["template"]["spec"]["containers"][0]
    assert container["image"] == "mlsched-operator:latest"
    args = parse_args(container["args"])
    assert args.port == container["ports"][0]["containerPort"] == service["spec"]["ports"][0]["port"]
    # HTTPS with the operator's own CA, kept in a Secret only it may read (docs/operator.md).
    assert args.progress_url == f"https://{service['metadata']['name']}.mlsched-system.svc:{args.port}/v1/progress"
    assert args.tls_secret == "mlsched-system/mlsched-operator-tls"
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert container[probe]["httpGet"]["path"] == path
        assert container[probe]["httpGet"]["scheme"] == "HTTPS"
    lease_ns, lease_name = args.leader_election.split("/")
    assert args.leader_identity == "$(POD_NAME)"
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} \
        in container["env"]
    election = next(d for d in docs(BASE / "rbac.yaml") if d["kind"] == "Role"
                    and d["metadata"]["name"] == "mlsched-operator-leader-election")
    assert election["metadata"]["namespace"] == lease_ns
    for rule in election["rules"]:
        if rule["resources"] == ["pods"]:  # the leader label on its own pod: patch, nothing else
            assert rule["apiGroups"] == [""] and rule["verbs"] == ["patch"]
            continue
        assert rule["apiGroups"] == ["coordination.k8s.io"] and rule["resources"] == ["leases"]
        assert rule.get("resourceNames") == [lease_name] or rule["verbs"] == ["create"]
    assert {"name": "POD_NAMESPACE",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}} in container["env"]
    secret_ns, secret_name = args.tls_secret.split("/")
    tls_role = next(d for d in docs(BASE / "rbac.yaml") if d["kind"] == "Role"
                    and d["metadata"]["name"] == "mlsched-operator-tls")
    assert tls_role["metadata"]["namespace"] == secret_ns
    for rule in tls_role["rules"]:
        assert rule["resources"] == ["secrets"]
        assert rule.get("resourceNames") == [secret_name] or rule["verbs"] == ["create"]
    assert spec["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_kustomization_references_the_generated_crds():
    kustomization = docs(BASE / "kustomization.yaml")[0]
    assert "../../crds" in kustomization["resources"] and kustomization["namespace"] == "mlsched-system"
    for name in kustomization["resources"]:
        assert (BASE / name).exists()


"""The identity the e2e operator runs as: its own ServiceAccount with the shipped RBAC.

Not the cluster admin: the operator gets exactly what the namespaced install gives it in a
cluster (manifests/overlays/namespaced, since every e2e operator serves only its test's
namespace): the mlsched-system namespace, the mlsched-operator ServiceAccount, the
ClusterRoles of base/rbac.yaml with only the cluster-wide read part bound cluster-wide
(base/rbac-all-namespaces.yaml, which that overlay deletes, is left out), and in each test
namespace what overlays/namespaced/served-namespace holds. So every e2e test also checks
that those rules are enough, and test_operator_least_privilege.py that they are no more.
The token is minted by TokenRequest, as the kubelet would mint the operator pod's, and
written into a kubeconfig for the subprocess.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from mlsched_objects import REPO, load_yaml

MANIFESTS = REPO / "manifests"
BASE = MANIFESTS / "base"
#: What the namespaced overlay takes from the base besides the operator's Deployment.
CLUSTER_FILES = [BASE / "namespace.yaml", BASE / "serviceaccount.yaml", BASE / "rbac.yaml",
                 BASE / "user-roles.yaml"]
SERVED_NAMESPACE = MANIFESTS / "overlays" / "namespaced" / "served-namespace"
NAMESPACE = "mlsched-system"
SERVICE_ACCOUNT = "mlsched-operator"
USER = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
TOKEN_SECONDS = 24 * 3600  # outlives any test session


def kustomization_files(directory: Path) -> list[Path]:
    """The YAML files a kustomization's `resources` name, following nested kustomizations.
    Only for kustomizations that transform nothing (asserted), like served-namespace."""
    (kustomization,) = load_yaml(directory / "kustomization.yaml")
    extra = set(kustomization) - {"apiVersion", "kind", "resources"}
    assert not extra, f"{directory}: {extra} would need kustomize itself"
    files: list[Path] = []
    for entry in kustomization["resources"]:
        path = (directory / entry).resolve()
        files += kustomization_files(path) if path.is_dir() else [path]
    return files


def _create(api: client.ApiClient, doc: dict, namespace: str | None) -> None:
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    creators = {
        "Namespace": lambda: core.create_namespace(doc),
        "ServiceAccount": lambda: core.create_namespaced_service_account(namespace, doc),
        "ClusterRole": lambda: rbac.create_cluster_role(doc),
        "ClusterRoleBinding": lambda: rbac.create_cluster_role_binding(doc),
        "Role": lambda: rbac.create_namespaced_role(namespace, doc),
        "RoleBinding": lambda: rbac.create_namespaced_role_binding(namespace, doc),
    }
    if doc["kind"] not in creators:
        raise ValueError(f"unexpected {doc['kind']} in the manifests: extend this installer")
    try:
        creators[doc["kind"]]()
    except ApiException as err:
        if err.status != 409:  # already there from an earlier call in this session
            raise


def install_operator_rbac(api: client.ApiClient) -> None:
    for path in CLUSTER_FILES:
        for doc in load_yaml(path):
            _create(api, doc, doc.get("metadata", {}).get("namespace") or NAMESPACE)


def serve_namespace(api: client.ApiClient, namespace: str) -> None:
    """`kubectl apply -n <namespace> -k manifests/overlays/namespaced/served-namespace`:
    the operator's RoleBinding and the training ServiceAccount."""
    for path in kustomization_files(SERVED_NAMESPACE):
        for doc in load_yaml(path):
            _create(api, doc, namespace)


def operator_token(api: client.ApiClient) -> str:
    answer = client.CoreV1Api(api).create_namespaced_service_account_token(
        SERVICE_ACCOUNT, NAMESPACE, {"apiVersion": "authentication.k8s.io/v1",
                                     "kind": "TokenRequest",
                                     "spec": {"expirationSeconds": TOKEN_SECONDS}})
    return answer.status.token


def operator_kubeconfig(api: client.ApiClient, server: str, ca_cert: Path,
                        path: Path) -> Path:
    """A kubeconfig that authenticates as system:serviceaccount:mlsched-system:mlsched-operator."""
    install_operator_rbac(api)
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": server,
                                                 "certificate-authority": str(ca_cert)}}],
        "users": [{"name": USER, "user": {"token": operator_token(api)}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": USER}}],
        "current-context": "e2e",
    }))
    path.chmod(0o600)
    return path

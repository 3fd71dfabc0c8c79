"""The identity the e2e operator runs as: its own ServiceAccount with the shipped RBAC.

Not the cluster admin: the operator gets exactly what manifests/base gives it in a
cluster (the mlsched-system namespace, the mlsched-operator ServiceAccount and the
least-privilege ClusterRole in rbac.yaml), so every e2e test also checks that those
rules are enough. The token is minted by TokenRequest, as the kubelet would mint the
operator pod's, and written into a kubeconfig for the subprocess.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from mlsched_objects import REPO, load_yaml

BASE = REPO / "manifests" / "base"
NAMESPACE = "mlsched-system"
SERVICE_ACCOUNT = "mlsched-operator"
TOKEN_SECONDS = 24 * 3600  # outlives any test session


def _create(fn, *args) -> None:
    try:
        fn(*args)
    except ApiException as err:
        if err.status != 409:  # already there from an earlier call in this session
            raise


def install_operator_rbac(api: client.ApiClient) -> None:
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    for doc in load_yaml(BASE / "namespace.yaml"):
        _create(core.create_namespace, doc)
    for doc in load_yaml(BASE / "serviceaccount.yaml"):
        _create(core.create_namespaced_service_account, NAMESPACE, doc)
    for doc in load_yaml(BASE / "rbac.yaml"):
        if doc["kind"] == "ClusterRole":
            _create(rbac.create_cluster_role, doc)
        elif doc["kind"] == "ClusterRoleBinding":
            _create(rbac.create_cluster_role_binding, doc)
        else:
            raise ValueError(f"unexpected {doc['kind']} in rbac.yaml: extend this installer")


def operator_kubeconfig(api: client.ApiClient, server: str, ca_cert: Path,
                        path: Path) -> Path:
    """A kubeconfig that authenticates as system:serviceaccount:mlsched-system:mlsched-operator."""
    install_operator_rbac(api)
    answer = client.CoreV1Api(api).create_namespaced_service_account_token(
        SERVICE_ACCOUNT, NAMESPACE, {"apiVersion": "authentication.k8s.io/v1",
                                     "kind": "TokenRequest",
                                     "spec": {"expirationSeconds": TOKEN_SECONDS}})
    user = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": server,
                                                 "certificate-authority": str(ca_cert)}}],
        "users": [{"name": user, "user": {"token": answer.status.token}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
        "current-context": "e2e",
    }))
    path.chmod(0o600)
    return path

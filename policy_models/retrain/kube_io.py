"""The cluster side of `mlsched retrain`: published versions, the policy, the recorded dataset.

Least privilege (manifests/retraining/rbac.yaml): list/get/create ConfigMaps and get
SchedulingPolicies in the policy's namespace; nothing is ever updated or deleted.
"""

from __future__ import annotations

from mlsched.api import GROUP
from mlsched.formats import model_versions
from mlsched.formats.model_versions import PublishedVersion

API_VERSION = "v1alpha1"
PLURAL = "schedulingpolicies"


def clients():
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.CoreV1Api(), client.CustomObjectsApi()


class KubeStore:
    def __init__(self, core_v1, namespace: str, policy: str):
        self.core, self.namespace, self.policy = core_v1, namespace, policy

    def configmaps(self) -> list[dict]:
        items = self.core.list_namespaced_config_map(self.namespace, label_selector=model_versions.selector(self.policy)).items
        return [self.core.api_client.sanitize_for_serialization(cm) for cm in items]

    def versions(self) -> list[PublishedVersion]:
        return [v for v in map(model_versions.parse, self.configmaps()) if v is not None]

    def read(self, name: str) -> dict | None:
        from kubernetes.client.exceptions import ApiException

        try:
            cm = self.core.read_namespaced_config_map(name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return self.core.api_client.sanitize_for_serialization(cm)

    def create(self, manifest: dict) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.create_namespaced_config_map(self.namespace, manifest)
        except ApiException as exc:
            if exc.status == 409:
                raise FileExistsError(manifest["metadata"]["name"]) from None
            raise


def scheduling_policy(custom_api, namespace: str, name: str) -> dict:
    return custom_api.get_namespaced_custom_object(GROUP, API_VERSION, namespace, PLURAL, name)


def active_sha256(policy: dict, phase: str, algorithm: str) -> str | None:
    """The sha256 the operator reports serving (status.activeModels["<phase>/<algorithm>"])."""
    return ((policy.get("status") or {}).get("activeModels") or {}).get(f"{phase}/{algorithm}")


def list_records(core_v1, namespace: str, policy: str) -> list:
    """The policy's recorded intervals. The operator side of issue 17 owns the dataset format
    (mlsched/formats/dataset_store.py); this is the one place that reads it."""
    try:
        from mlsched.formats import dataset_store
    except ImportError:
        raise ValueError("this mlsched has no dataset store (mlsched.formats.dataset_store): "
                         "read records from a directory with --records DIR") from None
    return dataset_store.list_records(core_v1, namespace, policy)

"""Least privilege on the real API server, as a cluster admin and the cluster's users see it.

- The operator, installed namespaced as shipped (operator_identity.py), can write, and read
  ConfigMaps, only in the namespaces it serves: not in kube-system, not in a namespace it
  does not serve; cluster-wide it only reads (`kubectl auth can-i --as=...`, here as
  SubjectAccessReviews, and real requests with its token).
- Users bound to the built-in `edit` role can create MLJobs; `view` can read but not create;
  neither can write status (manifests/base/user-roles.yaml, aggregated by
  kube-controller-manager).
- Pods of a sample job run as the training ServiceAccount without naming it.
"""

from __future__ import annotations

import uuid

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from job_state import running_pod
from mlsched_objects import GROUP, VERSION, default_policy, for_kwok, mljob, sample
from operator_identity import USER as OPERATOR, operator_token
from pod_tokens import client_with_token
from waiting import wait_for

TRAINING_SA = "mlsched-training"

#: Everything the operator writes in a namespace it serves, plus reading model ConfigMaps and
#: listing published versions and dataset records: (verb, group, resource, subresource).
NAMESPACED_RIGHTS = [
    ("create", "apps", "statefulsets", ""), ("patch", "apps", "statefulsets", ""),
    ("patch", "", "pods", ""), ("delete", "", "pods", ""), ("create", "", "pods", ""),
    ("create", "", "services", ""), ("list", "", "services", ""), ("watch", "", "services", ""),
    ("get", "", "configmaps", ""), ("list", "", "configmaps", ""),
    ("create", "", "configmaps", ""), ("patch", "", "configmaps", ""),
    ("delete", "", "configmaps", ""), ("create", "", "events", ""),
    ("patch", GROUP, "mljobs", "status"), ("patch", GROUP, "schedulingpolicies", "status"),
    ("delete", GROUP, "mljobs", ""),
]


def can(api: client.ApiClient, user: str, verb: str, group: str, resource: str,
        subresource: str = "", namespace: str | None = None) -> bool:
    """`kubectl auth can-i <verb> <resource> --as=<user> [-n <namespace>]`."""
    attributes = {"verb": verb, "group": group, "resource": resource,
                  "subresource": subresource}
    if namespace:
        attributes["namespace"] = namespace
    review = client.AuthorizationV1Api(api).create_subject_access_review({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user, "resourceAttributes": attributes}})
    return bool(review.status.allowed)


@pytest.fixture
def unserved_namespace(api):
    core = client.CoreV1Api(api)
    name = f"e2e-unserved-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    core.create_namespaced_config_map(name, {"metadata": {"name": "model"},
                                             "data": {"policy.onnx": "not for the operator"}})
    yield name
    core.delete_namespace(name)


def test_the_operator_writes_only_in_namespaces_it_serves(control_plane, api, mlsched, operator,
                                                          unserved_namespace):
    served = mlsched.namespace
    # It works where it serves: a sample job gets its StatefulSets and a pinned, running pod.
    mlsched.create(default_policy())
    mlsched.create(for_kwok(sample("mljob-allreduce.yaml")))
    running_pod(mlsched, "resnext110-allreduce")

    allowed = {(ns, right): can(api, OPERATOR, right[0], right[1], right[2], right[3], ns)
               for ns in (served, "kube-system", unserved_namespace) for right in NAMESPACED_RIGHTS}
    assert [right for (ns, right), ok in allowed.items() if ns == served and not ok] == []
    assert [(ns, right) for (ns, right), ok in allowed.items() if ns != served and ok] == []

    # Cluster-wide: reads for the capacity view, nothing written, no Secrets.
    assert can(api, OPERATOR, "list", "", "nodes") and can(api, OPERATOR, "watch", "", "pods")
    assert not can(api, OPERATOR, "patch", "", "nodes")
    assert not can(api, OPERATOR, "get", "", "secrets", namespace="kube-system")
    assert not can(api, OPERATOR, "patch", "apps", "statefulsets")  # in all namespaces

    # And really trying, with the operator's own token.
    with client_with_token(control_plane, operator_token(api)) as as_operator:
        core, apps = client.CoreV1Api(as_operator), client.AppsV1Api(as_operator)
        for attempt in (
            lambda: core.read_namespaced_config_map("extension-apiserver-authentication",
                                                    "kube-system"),
            lambda: core.read_namespaced_config_map("model", unserved_namespace),
            lambda: apps.create_namespaced_stateful_set("kube-system", {
                "metadata": {"name": "x"}, "spec": {
                    "selector": {"matchLabels": {"a": "b"}}, "serviceName": "x",
                    "template": {"metadata": {"labels": {"a": "b"}},
                                 "spec": {"containers": [{"name": "c", "image": "x"}]}}}}),
        ):
            with pytest.raises(ApiException) as refused:
                attempt()
            assert refused.value.status == 403
        assert core.list_node().items  # what it may do, it can
        assert core.read_namespaced_config_map("kube-root-ca.crt", served).data


def as_user(control_plane, user: str) -> client.ApiClient:
    """The cluster admin impersonating `user` (kubectl --as=<user>)."""
    api = control_plane.api_client()
    api.set_default_header("Impersonate-User", user)
    return api


def test_edit_users_create_mljobs_view_users_only_read(control_plane, api, mlsched,
                                                       operator_identity):
    namespace = mlsched.namespace
    rbac = client.RbacAuthorizationV1Api(api)
    for user, role in (("alice", "edit"), ("bob", "view")):
        rbac.create_namespaced_role_binding(namespace, {
            "metadata": {"name": f"{user}-{role}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": user}]})
    # kube-controller-manager aggregates the labelled roles into edit and view shortly after
    # they are created (operator_identity installed them at the start of the session).
    wait_for(lambda: can(api, "alice", "create", GROUP, "mljobs", namespace=namespace)
             and can(api, "bob", "list", GROUP, "mljobs", namespace=namespace), 60,
             "mlsched-edit and mlsched-view to be aggregated into edit and view")

    with as_user(control_plane, "alice") as alice, as_user(control_plane, "bob") as bob:
        as_alice, as_bob = client.CustomObjectsApi(alice), client.CustomObjectsApi(bob)
        as_alice.create_namespaced_custom_object(GROUP, VERSION, namespace, "mljobs",
                                                 mljob("alices-job"))
        as_alice.patch_namespaced_custom_object(GROUP, VERSION, namespace, "mljobs",
                                                "alices-job", {"spec": {"epochs": 10}})
        names = [j["metadata"]["name"] for j in
                 as_bob.list_namespaced_custom_object(GROUP, VERSION, namespace, "mljobs")["items"]]
        assert names == ["alices-job"]
        for attempt in (
            lambda: as_bob.create_namespaced_custom_object(GROUP, VERSION, namespace, "mljobs",
                                                           mljob("bobs-job")),
            lambda: as_bob.delete_namespaced_custom_object(GROUP, VERSION, namespace, "mljobs",
                                                           "alices-job"),
            # Status is the operator's: not even an editor can fake progress.
            lambda: as_alice.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, "mljobs", "alices-job",
                {"status": {"progress": {"epochsDone": 10}}}),
        ):
            with pytest.raises(ApiException) as refused:
                attempt()
            assert refused.value.status == 403
    assert mlsched.job("alices-job")["spec"]["epochs"] == 10
    assert "progress" not in (mlsched.job("alices-job").get("status") or {})


def test_sample_jobs_run_as_the_training_service_account(api, mlsched, operator):
    mlsched.create(default_policy())
    mlsched.create(for_kwok(sample("mljob-allreduce.yaml")))  # names no ServiceAccount
    own = for_kwok(mljob("own-account", ps=None, workers=(1, 1)), service_account="default")
    mlsched.create(own)
    pod = running_pod(mlsched, "resnext110-allreduce")
    assert pod.spec.service_account_name == TRAINING_SA
    # The training ServiceAccount mounts no API token: only the progress token is there (and
    # the sample's own checkpoint volume).
    assert sorted(v.name for v in pod.spec.volumes) == ["checkpoint", "mlsched-progress-token"]
    # A template that names its ServiceAccount keeps it.
    assert running_pod(mlsched, "own-account").spec.service_account_name == "default"

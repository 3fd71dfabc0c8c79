"""The e2e control plane itself: every test asserts state read back from the API.

These tests guard the harness the operator's e2e tests stand on; if one of them
fails, the operator's e2e results mean nothing.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import time
import urllib.request

import pytest
from kubernetes import client

import fake_nodes

KWOK_TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}
NOT_READY_TAINT = "node.kubernetes.io/not-ready"


def wait_for(check, timeout: float, what: str, interval: float = 0.5):
    """Polls check() until it returns something truthy, which is returned."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def gpu_statefulset(name: str, replicas: int) -> dict:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "serviceName": name,
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "tolerations": [KWOK_TOLERATION],
                    "containers": [{
                        "name": "trainer",
                        # Never pulled: kwok only pretends to run containers.
                        "image": "registry.invalid/mlsched/trainer:e2e",
                        "resources": {"limits": {fake_nodes.GPU_RESOURCE: "1"}},
                    }],
                },
            },
        },
    }


def create_gpu_statefulset(api: client.ApiClient, namespace: str, name: str,
                           replicas: int) -> None:
    client.CoreV1Api(api).create_namespaced_service(namespace, {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
        "spec": {"clusterIP": "None", "selector": {"app": name}}})
    client.AppsV1Api(api).create_namespaced_stateful_set(
        namespace, gpu_statefulset(name, replicas))


def running_pods(api: client.ApiClient, namespace: str, app: str) -> list[client.V1Pod]:
    pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=f"app={app}")
    return [p for p in pods.items if p.status.phase == "Running"]


def wait_statefulset_ready(api: client.ApiClient, namespace: str, name: str,
                           replicas: int, timeout: float = 90.0) -> list[client.V1Pod]:
    apps = client.AppsV1Api(api)
    wait_for(lambda: (apps.read_namespaced_stateful_set(name, namespace).status.ready_replicas
                      or 0) == replicas, timeout, f"StatefulSet {name} to have {replicas} ready")
    pods = running_pods(api, namespace, name)
    assert len(pods) == replicas
    return pods


# ------------------------------------------------------------------- versions


def test_apiserver_reports_the_built_version(control_plane, api):
    version = client.VersionApi(api).get_code()
    expected = control_plane.versions["K8S_VERSION"]
    assert version.git_version == expected
    assert (version.major, version.minor) == ("1", expected.split(".")[1])
    assert version.git_tree_state == "clean"


def test_etcd_reports_the_built_version(control_plane):
    with urllib.request.urlopen(f"{control_plane.etcd_url}/version", timeout=5) as answer:
        reported = json.load(answer)
    assert reported["etcdserver"] == control_plane.versions["ETCD_VERSION"].lstrip("v")


# ---------------------------------------------------------------------- nodes


def test_kwok_nodes_are_ready_with_gpus(api, node_shape):
    core = client.CoreV1Api(api)
    nodes = core.list_node(label_selector="type=kwok").items
    default_nodes = [n for n in nodes if n.metadata.name.startswith("kwok-node-")]
    assert len(default_nodes) == node_shape.count
    for node in default_nodes:
        assert fake_nodes.ready_status(node) == "True", node.metadata.name
        allocatable = node.status.allocatable
        assert allocatable[fake_nodes.GPU_RESOURCE] == str(node_shape.gpu)
        assert allocatable["cpu"] == str(node_shape.cpu)
        assert allocatable["memory"] == f"{node_shape.memory_gib}Gi"
        # kwok stands in for the kubelet: it reports the node info and holds the
        # node's Lease, which KCM reads as the heartbeat.
        assert node.status.node_info.kubelet_version.startswith("kwok-")
        lease = client.CoordinationV1Api(api).read_namespaced_lease(
            node.metadata.name, "kube-node-lease")
        assert lease.spec.renew_time is not None


# ------------------------------------------------------------------ workloads


def test_statefulset_pods_are_created_scheduled_and_running(api, namespace, node_shape):
    create_gpu_statefulset(api, namespace, "trainer", replicas=3)
    pods = wait_statefulset_ready(api, namespace, "trainer", 3)

    assert sorted(p.metadata.name for p in pods) == ["trainer-0", "trainer-1", "trainer-2"]
    core = client.CoreV1Api(api)
    for pod in pods:
        # Created by KCM's StatefulSet controller...
        assert pod.metadata.owner_references[0].kind == "StatefulSet"
        # ...bound by kube-scheduler to a kwok node...
        assert pod.spec.node_name.startswith("kwok-node-")
        assert pod.spec.scheduler_name == "default-scheduler"
        # ...and started by kwok, with an address from that node's pod CIDR.
        node = core.read_node(pod.spec.node_name)
        assert ipaddress.ip_address(pod.status.pod_ip) in ipaddress.ip_network(node.spec.pod_cidr)
        assert pod.status.host_ip == node.status.addresses[0].address
        assert pod.status.container_statuses[0].state.running is not None

    # The scheduler honoured the GPU capacity: no node holds more than it has.
    per_node: dict[str, int] = {}
    for pod in pods:
        per_node[pod.spec.node_name] = per_node.get(pod.spec.node_name, 0) + 1
    assert max(per_node.values()) <= node_shape.gpu


def test_job_pods_complete(api, namespace):
    # kwok's pod-complete Stage ends a Job's pods as if their command exited 0,
    # and KCM's Job controller counts them.
    client.BatchV1Api(api).create_namespaced_job(namespace, {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "retrain"},
        "spec": {"completions": 2, "parallelism": 2, "template": {"spec": {
            "restartPolicy": "Never",
            "tolerations": [KWOK_TOLERATION],
            "containers": [{"name": "retrain", "image": "registry.invalid/retrain:e2e"}]}}}})
    wait_for(lambda: (client.BatchV1Api(api).read_namespaced_job("retrain", namespace)
                      .status.succeeded or 0) == 2, 60, "the Job to succeed")


# ---------------------------------------------------------- service accounts


def token_review(api: client.ApiClient, token: str) -> client.V1TokenReviewStatus:
    review = client.AuthenticationV1Api(api).create_token_review(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
         "spec": {"token": token}})
    return review.status


def test_service_account_tokens(control_plane, api, namespace):
    core = client.CoreV1Api(api)
    # KCM's serviceaccount controller made the namespace's default account, and
    # its root-CA publisher the CA bundle that projected token volumes mount.
    wait_for(lambda: core.list_namespaced_service_account(
        namespace, field_selector="metadata.name=default").items, 30, "default ServiceAccount")
    root_ca = wait_for(lambda: core.list_namespaced_config_map(
        namespace, field_selector="metadata.name=kube-root-ca.crt").items, 30, "kube-root-ca.crt")
    assert root_ca[0].data["ca.crt"].strip() == \
        control_plane.ca_cert_path.read_text().strip()

    create_gpu_statefulset(api, namespace, "worker", replicas=1)
    (pod,) = wait_statefulset_ready(api, namespace, "worker", 1)
    # The ServiceAccount admission plugin mounted a projected token volume.
    assert pod.spec.service_account_name == "default"
    projected = [v.projected for v in pod.spec.volumes if v.projected]
    sources = [s for p in projected for s in p.sources]
    assert any(s.service_account_token for s in sources)
    assert any(s.config_map and s.config_map.name == "kube-root-ca.crt" for s in sources)

    # A token bound to the pod, made the way a kubelet makes it (TokenRequest).
    request = core.create_namespaced_service_account_token("default", namespace, {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 600, "boundObjectRef": {
            "apiVersion": "v1", "kind": "Pod",
            "name": pod.metadata.name, "uid": pod.metadata.uid}}})
    status = token_review(api, request.status.token)
    assert status.authenticated, status.error
    assert status.user.username == f"system:serviceaccount:{namespace}:default"
    assert status.user.extra["authentication.kubernetes.io/pod-name"] == [pod.metadata.name]

    # A legacy token Secret, filled in by KCM's serviceaccount-token controller
    # with a token signed by --service-account-private-key-file.
    core.create_namespaced_secret(namespace, {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
        "metadata": {"name": "default-token",
                     "annotations": {"kubernetes.io/service-account.name": "default"}}})
    secret = wait_for(
        lambda: (s := core.read_namespaced_secret("default-token", namespace)).data
        and "token" in s.data and s, 30, "the token controller to fill the Secret")
    legacy = base64.b64decode(secret.data["token"]).decode()
    assert token_review(api, legacy).authenticated

    # And the review really checks signatures.
    assert not token_review(api, legacy[:-4] + "AAAA").authenticated


# -------------------------------------------------------------------- NotReady


def node_taints(api: client.ApiClient, name: str) -> set[tuple[str, str]]:
    node = client.CoreV1Api(api).read_node(name)
    return {(t.key, t.effect) for t in node.spec.taints or []}


def test_node_not_ready_and_back(control_plane, api, namespace):
    core = client.CoreV1Api(api)
    # A node of its own, so the other tests' pods are not evicted.
    (name,) = control_plane.create_nodes(1, prefix="flaky")
    try:
        control_plane.set_node_ready(name, False)
        # Reported by kwok's node-not-ready Stage, not a lost heartbeat ("Unknown").
        (ready,) = [c for c in core.read_node(name).status.conditions if c.type == "Ready"]
        assert (ready.status, ready.reason) == ("False", "E2ENodeNotReady")

        # Kubernetes reacts as to a real failed node: KCM taints it...
        wait_for(lambda: {(NOT_READY_TAINT, "NoSchedule"), (NOT_READY_TAINT, "NoExecute")}
                 <= node_taints(api, name), 60, "KCM's not-ready taints")
        # ...and the scheduler will not place a pod there.
        core.create_namespaced_pod(namespace, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pinned"},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": name},
                     "tolerations": [KWOK_TOLERATION],
                     "containers": [{"name": "c", "image": "registry.invalid/c:1"}]}})
        wait_for(lambda: any(c.type == "PodScheduled" and c.reason == "Unschedulable"
                             for c in core.read_namespaced_pod("pinned", namespace)
                             .status.conditions or []), 30, "the pod to be Unschedulable")

        # kwok does not undo it: the node is still NotReady after kwok has acted on it again
        # (renewed its Lease, about every 10 s), not merely after a fixed sleep.
        leases = client.CoordinationV1Api(api)
        renewed = leases.read_namespaced_lease(name, "kube-node-lease").spec.renew_time
        wait_for(lambda: leases.read_namespaced_lease(name, "kube-node-lease").spec.renew_time
                 > renewed, 30, "kwok to renew the node's Lease")
        assert fake_nodes.ready_status(core.read_node(name)) == "False"

        control_plane.set_node_ready(name, True)
        wait_for(lambda: not {k for k, _ in node_taints(api, name)} & {NOT_READY_TAINT},
                 60, "KCM to lift the not-ready taints")
        pod = wait_for(lambda: (p := core.read_namespaced_pod("pinned", namespace))
                       .status.phase == "Running" and p, 60, "the pinned pod to run")
        assert pod.spec.node_name == name
    finally:
        core.delete_namespaced_pod("pinned", namespace, grace_period_seconds=0)
        core.delete_node(name)


# --------------------------------------------------------------------- faults


@pytest.mark.parametrize("crash", [False, True], ids=["graceful", "crash"])
def test_apiserver_restart_keeps_state(control_plane, api, namespace, node_shape, crash):
    core = client.CoreV1Api(api)
    apps = client.AppsV1Api(api)
    core.create_namespaced_config_map(namespace, {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "marker"},
        "data": {"written": "before restart"}})
    create_gpu_statefulset(api, namespace, "survivor", replicas=1)
    wait_statefulset_ready(api, namespace, "survivor", 1)

    down = datetime.datetime.now(datetime.timezone.utc)
    control_plane.restart_apiserver(crash=crash)
    # kwok holds every node's Lease again (restart_apiserver waits for it, and restarts kwok
    # if it does not: a node whose Lease lapses turns NotReady with its pods, for good, once
    # KCM's --node-monitor-grace-period has passed; see flags.controller_manager).
    assert fake_nodes.stale_leases(api, down) == []

    # The API answers again, on the same address, with what etcd kept.
    assert client.VersionApi(api).get_code().git_version == control_plane.versions["K8S_VERSION"]
    marker = core.read_namespaced_config_map("marker", namespace)
    assert marker.data == {"written": "before restart"}
    assert apps.read_namespaced_stateful_set("survivor", namespace).spec.replicas == 1
    assert len(core.list_node(label_selector="type=kwok").items) >= node_shape.count

    # The controllers reconnected too: scaling up still yields a running pod.
    apps.patch_namespaced_stateful_set_scale(
        "survivor", namespace, {"spec": {"replicas": 2}},
        _content_type="application/merge-patch+json")
    wait_statefulset_ready(api, namespace, "survivor", 2, timeout=120)


"""A control plane with one real node (e2e/real_node.py), the images built from this checkout
loaded into it (e2e/build_images.sh), and the operator installed the way a user installs it:
`kubectl apply --server-side -k` of the shipped dev overlay, under an overlay of the test's own
that names the local images and keeps the base's two replicas.

Used by e2e/test_real_node.py as a module fixture: its own control plane (the session's serves
on loopback, which pods in the node cannot reach).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from kubernetes import client

import real_node
from build_scripts import BuildScriptError, run_build_script
from controlplane import ControlPlane, ControlPlaneError
from mlsched_objects import REPO, load_yaml
from processes import ComponentError
from waiting import wait_for

BUILD_IMAGES = Path(__file__).resolve().parent / "build_images.sh"
IMAGES = ("pause", "operator", "training")
OPERATOR_IMAGE = "localhost/mlsched-operator:e2e"
TRAINING_IMAGE = "localhost/mlsched-training:e2e"
OPERATOR_NAMESPACE = "mlsched-system"
JOBS_NAMESPACE = "mlsched-dev"  # the dev overlay's namespace for jobs, with its `default` policy
LEASE = "mlsched-operator"
LEADER_LABEL = "mlsched.io/leader"


def build_images() -> Path:
    """The OCI archives of this checkout's images (instant when cached); progress on stderr."""
    return run_build_script(BUILD_IMAGES, "the real node's images",
                            needs="root, Debian's buildah and mmdebstrap, Debian's mirrors and PyPI")


@dataclass
class RealCluster:
    plane: ControlPlane
    node: real_node.RealNode
    workdir: Path

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.plane.kubectl(*args, check=check)

    def api_client(self) -> client.ApiClient:
        return self.plane.api_client()


def install_operator(cluster: RealCluster) -> Path:
    """`kubectl apply --server-side -k` of an overlay over manifests/overlays/dev naming the
    local image (never pulled: imported into containerd) with the base's two replicas. As the
    README says, a first apply on a fresh cluster may come before the CRDs are served: a second
    one then applies the custom resources."""
    overlay = cluster.workdir / "operator-overlay"
    overlay.mkdir(parents=True, exist_ok=True)
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(REPO / "manifests" / "overlays" / "dev", overlay)],
        "images": [{"name": "mlsched-operator", "newName": OPERATOR_IMAGE.split(":")[0],
                    "newTag": OPERATOR_IMAGE.split(":")[1]}],
        "replicas": [{"name": "mlsched-operator", "count": 2}],
        "patches": [{"target": {"kind": "Deployment", "name": "mlsched-operator"},
                     "patch": yaml.safe_dump([{
                         "op": "replace",
                         "path": "/spec/template/spec/containers/0/imagePullPolicy",
                         "value": "Never"}])}],
    }))
    first = cluster.kubectl("apply", "--server-side", "-k", str(overlay), check=False)
    if first.returncode != 0:
        assert "no matches for kind" in first.stderr, first.stderr
        wait_for(lambda: cluster.kubectl("apply", "--server-side", "-k", str(overlay),
                                         check=False).returncode == 0,
                 60, "the second apply of the operator's overlay")
    return overlay


def operator_pods(core: client.CoreV1Api) -> list[client.V1Pod]:
    return [p for p in core.list_namespaced_pod(
        OPERATOR_NAMESPACE, label_selector="app.kubernetes.io/name=mlsched-operator").items
        if p.metadata.deletion_timestamp is None]


def ready(pod: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def lease_holder(api: client.ApiClient) -> str | None:
    lease = client.CoordinationV1Api(api).read_namespaced_lease(LEASE, OPERATOR_NAMESPACE)
    return lease.spec.holder_identity


def wait_operator_ready(cluster: RealCluster, timeout: float) -> tuple[str, list[str]]:
    """Both replicas Ready, one of them holding the Lease and labelled leader; (leader, pods)."""
    api = cluster.api_client()
    core = client.CoreV1Api(api)

    def settled():
        pods = operator_pods(core)
        if len(pods) != 2 or not all(ready(p) for p in pods):
            return None
        try:
            holder = lease_holder(api)
        except client.ApiException:
            return None
        leaders = [p.metadata.name for p in pods
                   if (p.metadata.labels or {}).get(LEADER_LABEL) == "true"]
        names = [p.metadata.name for p in pods]
        return (holder, names) if holder in names and leaders == [holder] else None

    def describe():
        return [(p.metadata.name, p.status.phase, ready(p), p.metadata.labels.get(LEADER_LABEL),
                 [(s.name, s.state.waiting and s.state.waiting.reason, s.restart_count)
                  for s in p.status.container_statuses or []]) for p in operator_pods(core)]

    try:
        return wait_for(settled, timeout, "two Ready operator pods, one leader",
                        describe=describe)
    finally:
        api.close()


def checkpoint_volume(cluster: RealCluster, claim_file: Path) -> str:
    """What an admin provides for a sample's ReadWriteMany claim on a one-node cluster: a
    hostPath PersistentVolume bound to it by claimRef, its directory writable by the image's
    user (a hostPath volume ignores fsGroup)."""
    (claim,) = load_yaml(claim_file)
    name = f"{JOBS_NAMESPACE}-{claim['metadata']['name']}"
    directory = cluster.workdir / "volumes" / name
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o1777)
    api = cluster.api_client()
    try:
        client.CoreV1Api(api).create_persistent_volume({
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"capacity": claim["spec"]["resources"]["requests"],
                     "accessModes": claim["spec"]["accessModes"],
                     "persistentVolumeReclaimPolicy": "Retain",
                     "hostPath": {"path": str(directory), "type": "Directory"},
                     "claimRef": {"namespace": JOBS_NAMESPACE,
                                  "name": claim["metadata"]["name"]}}})
    finally:
        api.close()
    return name


def claim_with_volume(cluster: RealCluster, name: str) -> tuple[str, str]:
    """A ReadWriteMany claim `name` and the hostPath volume bound to it: (claim, volume)."""
    path = cluster.workdir / f"claim-{name}.yaml"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "",
                 "resources": {"requests": {"storage": "1Gi"}}}}))
    volume = checkpoint_volume(cluster, path)
    cluster.kubectl("apply", "-n", JOBS_NAMESPACE, "-f", str(path))
    return name, volume


class RealClusterError(RuntimeError):
    """The real node did not come up; the message says what failed."""


@contextlib.contextmanager
def real_cluster(live_output=contextlib.nullcontext()) -> Iterator[RealCluster]:
    """The images built (cached), the bridge, a control plane and the real node started; all
    of it stopped and removed on exit. `live_output`: a context under which cold builds may
    print their progress (pytest's capture disabled). Used by the tests' fixture below and by
    bench/bench_real_runs.py."""
    plane = ControlPlane(address=real_node.ADDRESS)
    node = None
    try:
        real_node.check_requirements()
        with live_output:  # cold builds show their progress
            started = time.monotonic()
            images = build_images()
            built = time.monotonic()
            real_node.make_bridge()
            plane.start()
            versions = plane.versions
            node = real_node.RealNode(plane.workdir / "node", plane.bin_dir,
                                      f"coredns-{versions['COREDNS_VERSION']}")
            node.start(plane, [images / f"{name}.tar" for name in IMAGES])
            print(f"[real_cluster] images {built - started:.0f} s, control plane and node "
                  f"(images imported) {time.monotonic() - built:.0f} s", file=sys.stderr)
    except (real_node.RealNodeError, ControlPlaneError, ComponentError, BuildScriptError) as err:
        if node is not None:
            node.stop()
        plane.stop()
        real_node.remove_bridge()
        raise RealClusterError(str(err)) from err
    try:
        yield RealCluster(plane, node, plane.workdir)
    finally:
        node.stop()
        plane.stop()
        real_node.remove_bridge()


@contextlib.contextmanager
def running_real_cluster(request: pytest.FixtureRequest) -> Iterator[RealCluster]:
    capture = request.config.pluginmanager.getplugin("capturemanager")
    live_output = capture.global_and_fixture_disabled() if capture else contextlib.nullcontext()
    with contextlib.ExitStack() as stack:
        try:
            cluster = stack.enter_context(real_cluster(live_output))
        except RealClusterError as err:
            pytest.fail(f"the real node did not come up:\n{err}", pytrace=False)
        yield cluster

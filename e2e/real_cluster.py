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
from mlsched_objects import REPO
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


@contextlib.contextmanager
def running_real_cluster(request: pytest.FixtureRequest) -> Iterator[RealCluster]:
    capture = request.config.pluginmanager.getplugin("capturemanager")
    live_output = capture.global_and_fixture_disabled() if capture else contextlib.nullcontext()
    failure = None
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
        failure = str(err)
    if failure:
        if node is not None:
            node.stop()
        plane.stop()
        real_node.remove_bridge()
        pytest.fail(f"the real node did not come up:\n{failure}", pytrace=False)
    try:
        yield RealCluster(plane, node, plane.workdir)
    finally:
        node.stop()
        plane.stop()
        real_node.remove_bridge()

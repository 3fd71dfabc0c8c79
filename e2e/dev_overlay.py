"""The shipped `dev` overlay (manifests/overlays/dev) rendered with the kubectl under test and
installed as the README says. `dev` is a module-scoped fixture, registered by conftest.py: it
installs on the `cluster` fixture of the module that asks for it (a plane of that module's
own)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from controlplane import ControlPlane
from mlsched_objects import REPO

MANIFESTS = REPO / "manifests"
DEV_NAMESPACE = "mlsched-dev"


def render(cluster: ControlPlane, directory: Path) -> list[dict]:
    """`kubectl kustomize` with the kubectl of the Kubernetes version under test."""
    text = cluster.kubectl("kustomize", str(directory)).stdout
    return [d for d in yaml.safe_load_all(text) if d]


@pytest.fixture(scope="module")
def dev(cluster, api, tmp_path_factory) -> list[dict]:
    """The dev overlay, installed as the README says: server-side apply, again if the first
    came before the CRDs were served."""
    objects = render(cluster, MANIFESTS / "overlays" / "dev")
    path = tmp_path_factory.mktemp("dev") / "dev.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    first = cluster.kubectl("apply", "--server-side", "-f", str(path), check=False)
    if first.returncode != 0:
        # The only acceptable failure: custom resources sent before their CRD was served.
        assert 'no matches for kind "SchedulingPolicy"' in first.stderr, first.stderr
        print("\nfirst apply came before the CRDs were served; applying again:\n" + first.stderr)
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                        "crd/mljobs.mlsched.io", "crd/schedulingpolicies.mlsched.io")
        cluster.kubectl("apply", "--server-side", "-f", str(path))
    return objects


def find(objects: list[dict], kind: str, name: str) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found

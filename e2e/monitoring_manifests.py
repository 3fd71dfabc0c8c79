"""manifests/monitoring as kustomize renders it, and the tools to check it with: promtool and
the Prometheus Operator's CRDs, built by build_prometheus_tools.sh (about 4 minutes cold,
cached after). `tools` is a fixture, registered by conftest.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from build_scripts import build_for_fixture
from controlplane import ControlPlane
from mlsched_objects import REPO

MONITORING = REPO / "manifests" / "monitoring"
BUILD_SCRIPT = Path(__file__).resolve().parent / "build_prometheus_tools.sh"
CRDS = ("monitoring.coreos.com_podmonitors.yaml", "monitoring.coreos.com_prometheusrules.yaml")


@pytest.fixture(scope="module")
def tools(request: pytest.FixtureRequest) -> Path:
    """The directory with promtool and the CRDs."""
    return build_for_fixture(request, BUILD_SCRIPT, "promtool and the Prometheus Operator CRDs")


def rendered(cluster: ControlPlane) -> list[dict]:
    return [d for d in yaml.safe_load_all(cluster.kubectl("kustomize", str(MONITORING)).stdout) if d]

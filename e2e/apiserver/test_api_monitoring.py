"""manifests/monitoring on an API server alone (the apiserver-only tier): the kustomization
applied with the Prometheus Operator's CRDs installed, strict field validation on: a field the
CRDs do not know (a typo in the TLS settings) is an error, not silently pruned, and what was
applied reads back as written. promtool's checks and a running operator scraped as the
PodMonitor says are in e2e/test_monitoring.py; the CRDs come from the same build
(build_prometheus_tools.sh, about 4 minutes cold, cached after).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from controlplane import ControlPlane
from monitoring_manifests import CRDS, rendered


@pytest.fixture(scope="module")
def monitoring_crds(control_plane: ControlPlane, tools: Path):
    for crd in CRDS:
        control_plane.kubectl("apply", "--server-side", "-f", str(tools / crd))
    control_plane.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                          "crd/podmonitors.monitoring.coreos.com",
                          "crd/prometheusrules.monitoring.coreos.com")
    yield
    for crd in CRDS:
        control_plane.kubectl("delete", "--ignore-not-found", "-f", str(tools / crd))


def test_the_monitoring_objects_are_accepted_as_written(control_plane, api, monitoring_crds,
                                                       operator_identity, tmp_path):
    # (operator_identity: the mlsched-system namespace the operator's objects live in.)
    objects = rendered(control_plane)
    assert sorted(o["kind"] for o in objects) == ["ConfigMap", "PodMonitor", "PrometheusRule"]
    path = tmp_path / "monitoring.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    try:
        control_plane.kubectl("apply", "--server-side", "--validate=strict", "-f", str(path))
        custom = client.CustomObjectsApi(api)
        for obj in objects:
            if obj["kind"] == "ConfigMap":
                stored = client.CoreV1Api(api).read_namespaced_config_map(
                    obj["metadata"]["name"], "mlsched-system")
                assert stored.metadata.labels["grafana_dashboard"] == "1"
                json.loads(stored.data["mlsched.json"])  # the dashboard, intact
                continue
            plural = obj["kind"].lower() + "s"
            stored = custom.get_namespaced_custom_object("monitoring.coreos.com", "v1", "mlsched-system",
                                                         plural, obj["metadata"]["name"])
            assert stored["spec"] == obj["spec"], f"{obj['kind']} was not stored as written"

        # A typo in the TLS settings is refused, naming the field.
        (monitor,) = [o for o in objects if o["kind"] == "PodMonitor"]
        monitor["spec"]["podMetricsEndpoints"][0]["tlsConfig"]["servername"] = "typo"
        typo = tmp_path / "typo.yaml"
        typo.write_text(yaml.safe_dump(monitor))
        refused = control_plane.kubectl("apply", "--server-side", "--validate=strict", "--dry-run=server",
                                        "-f", str(typo), check=False)
        assert refused.returncode != 0 and "servername" in refused.stderr, refused.stdout + refused.stderr
    finally:
        control_plane.kubectl("delete", "--ignore-not-found", "-f", str(path))

"""The Argo CD health checks of manifests/argocd/, run by Argo CD itself.

Every case of every health_test.yaml (laid out as Argo CD's resource_customizations: one
object per MLJob phase and condition that matters, one per SchedulingPolicy state) goes
through Argo CD's own settings and health code with the argocd-cm.yaml a user pastes (what
`argocd admin settings resource-overrides health` runs; e2e/argocd_health/main.go), so the Lua
runs in Argo CD's own Lua VM with its own libraries, and the status and
message must be exactly what the test file says. tests/test_argocd_manifests.py checks that
argocd-cm.yaml holds exactly the health.lua files and that every test object is valid
against the CRDs.

The program is built against Argo CD's module from the Go module proxy on first use
(build_argocd.sh, about 5 minutes cold, cached after). A failed build fails these tests with
what to run; nothing is skipped.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from argocd_cli import BUILD_SCRIPT, assess_health
from build_scripts import build_for_fixture

REPO = Path(__file__).resolve().parent.parent
ARGOCD = REPO / "manifests" / "argocd"
ARGOCD_CM = ARGOCD / "argocd-cm.yaml"
CASES = [(test_file.parent, case)
         for test_file in sorted((ARGOCD / "resource_customizations").glob("*/*/health_test.yaml"))
         for case in yaml.safe_load(test_file.read_text())["tests"]]


@pytest.fixture(scope="module")
def argocd(request: pytest.FixtureRequest) -> Path:
    return build_for_fixture(request, BUILD_SCRIPT, "Argo CD's health assessment")


def test_every_kind_and_health_status_is_covered():
    kinds = {directory.name for directory, _ in CASES}
    assert kinds == {"MLJob", "SchedulingPolicy"}
    statuses = {(d.name, case["healthStatus"]["status"]) for d, case in CASES}
    for status in ("Progressing", "Healthy", "Degraded", "Suspended"):
        assert ("MLJob", status) in statuses
    for status in ("Progressing", "Healthy", "Degraded"):
        assert ("SchedulingPolicy", status) in statuses


@pytest.mark.parametrize("directory,case", CASES,
                         ids=[f"{d.name}/{Path(c['inputPath']).stem}" for d, c in CASES])
def test_argocd_assesses_each_object_as_the_test_file_says(argocd, directory, case):
    status, message = assess_health(argocd, directory / case["inputPath"], ARGOCD_CM)
    assert (status, message) == (case["healthStatus"]["status"], case["healthStatus"]["message"])


def test_argocd_reports_no_check_for_kinds_the_file_does_not_cover(argocd, tmp_path):
    """The check is found by group and kind: an object of another group gets none (so the
    cases above really ran our scripts, not a built-in or a default)."""
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"apiVersion": "example.com/v1", "kind": "MLJob",
                                     "metadata": {"name": "x"}}))
    with pytest.raises(AssertionError, match="Health script is not configured"):
        assess_health(argocd, other, ARGOCD_CM)


def strict(schema: dict) -> dict:
    """The schema with unknown fields forbidden where it lists fields (the API server would
    prune them silently; here they are errors)."""
    if "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        schema.setdefault("additionalProperties", False)
    for sub in schema.get("properties", {}).values():
        strict(sub)
    if isinstance(schema.get("items"), dict):
        strict(schema["items"])
    if isinstance(schema.get("additionalProperties"), dict):
        strict(schema["additionalProperties"])
    return schema


@pytest.mark.parametrize("name,crd", [("application.yaml", "application-crd.yaml"),
                                      ("application-monitoring.yaml", "application-crd.yaml"),
                                      ("appproject.yaml", "appproject-crd.yaml")])
def test_application_and_project_are_valid_for_argo_cd(argocd, name, crd):
    """Against Argo CD's own CRDs of the version built (copied beside the binary)."""
    import jsonschema  # dev extra

    definition = yaml.safe_load((argocd.parent / crd).read_text())
    (version,) = [v for v in definition["spec"]["versions"] if v["served"]]
    obj = yaml.safe_load((ARGOCD / name).read_text())
    assert obj["apiVersion"] == f"{definition['spec']['group']}/{version['name']}"
    assert obj["kind"] == definition["spec"]["names"]["kind"]
    jsonschema.Draft4Validator(strict(version["schema"]["openAPIV3Schema"])).validate(obj)

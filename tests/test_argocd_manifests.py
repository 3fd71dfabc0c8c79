"""manifests/argocd/ holds together: the argocd-cm form is exactly the health.lua files, the
health tests' objects are valid MLJobs and SchedulingPolicies that show every phase and every
reason the operator writes, and the Applications and AppProject agree with what they sync.
Argo CD itself runs the health checks on those objects in e2e/test_argocd_health.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from argocd_cm import ARGOCD, ARGOCD_CM, CUSTOMIZATIONS, health_scripts, render
from mlsched.api.mljob import JobPhase
from manifest_tools import render as kustomize, strict_validator

ROOT = Path(__file__).resolve().parent.parent
CONTROLLER = ROOT / "operator" / "mlsched" / "controller"


def cases(kind: str) -> list[tuple[dict, dict]]:
    """(object, expected healthStatus) of every case in the kind's health_test.yaml."""
    directory = CUSTOMIZATIONS / "mlsched.io" / kind
    tests = yaml.safe_load((directory / "health_test.yaml").read_text())["tests"]
    return [(yaml.safe_load((directory / t["inputPath"]).read_text()), t["healthStatus"])
            for t in tests]


def reasons(obj: dict) -> set[str]:
    return {c["reason"] for c in (obj.get("status") or {}).get("conditions", [])}


def test_argocd_cm_is_generated_from_the_health_scripts():
    assert set(health_scripts()) == {("mlsched.io", "MLJob"), ("mlsched.io", "SchedulingPolicy")}
    assert ARGOCD_CM.read_text() == render(), (
        "manifests/argocd/argocd-cm.yaml is stale: run `python tests/argocd_cm.py`")
    config_map = yaml.safe_load(ARGOCD_CM.read_text())
    for (group, kind), path in health_scripts().items():
        assert config_map["data"][f"resource.customizations.health.{group}_{kind}"] == path.read_text()


@pytest.mark.parametrize("kind", ["MLJob", "SchedulingPolicy"])
def test_health_test_objects_are_valid_and_all_used(kind):
    directory = CUSTOMIZATIONS / "mlsched.io" / kind
    used = {t["inputPath"] for t in yaml.safe_load((directory / "health_test.yaml").read_text())["tests"]}
    on_disk = {f"testdata/{p.name}" for p in (directory / "testdata").glob("*.yaml")}
    assert used == on_disk
    for obj, expected in cases(kind):
        strict_validator(kind).validate(obj)
        assert expected["status"] in ("Healthy", "Progressing", "Degraded", "Suspended", "Unknown")


def written_reasons(path: Path, pattern: str) -> set[str]:
    return set(re.findall(pattern, path.read_text()))


def test_mljob_cases_show_every_phase_and_every_reason_the_operator_writes():
    objects = [obj for obj, _ in cases("MLJob")]
    phases = {(obj.get("status") or {}).get("phase") for obj in objects}
    assert {p.value for p in JobPhase} <= phases
    # The reasons lifecycle.py gives a phase (`reason, message = "X"`), and InvalidSpec.
    written = written_reasons(CONTROLLER / "objects" / "lifecycle.py", r'reason, message = (?:JobPhase\.\w+, )?"(\w+)"')
    assert {"PolicyNotFound", "CannotFit", "Unschedulable", "BackoffLimitExceeded"} <= written
    shown = set().union(*(reasons(obj) for obj in objects))
    assert written | {"InvalidSpec"} <= shown, written | {"InvalidSpec"} - shown


def test_policy_cases_show_every_condition_reason_the_operator_writes():
    objects = [obj for obj, _ in cases("SchedulingPolicy")]
    written = written_reasons(CONTROLLER / "serving" / "models.py", r'Verdict\(True, "(\w+)"')
    written |= written_reasons(CONTROLLER / "scheduling" / "reporting.py", r'_policy_not_ready\(rt, body, ref, "(\w+)"')
    assert {"NoModelNeeded", "ModelVerified", "Scheduling", "FallbackActive", "InvalidSpec",
            "RoundFailed"} <= written
    shown = set().union(*(reasons(obj) for obj in objects))
    assert written <= shown, written - shown
    loaded = {c["status"] for obj in objects for c in (obj.get("status") or {}).get("conditions", [])
              if c["type"] == "ModelLoaded"}
    assert loaded == {"True", "False"}


def test_applications_and_project_agree_with_what_they_sync():
    """application.yaml (the prod overlay) and application-monitoring.yaml (manifests/monitoring):
    each in the project, from its repository, into the namespace its objects name; the
    project allows exactly the kinds the two render."""
    project = yaml.safe_load((ARGOCD / "appproject.yaml").read_text())
    objects = []
    for name, path in (("application.yaml", "manifests/overlays/prod"),
                       ("application-monitoring.yaml", "manifests/monitoring")):
        spec = yaml.safe_load((ARGOCD / name).read_text())["spec"]
        assert spec["source"]["path"] == path
        assert spec["project"] == project["metadata"]["name"]
        assert spec["source"]["repoURL"] in project["spec"]["sourceRepos"]
        assert {"server": spec["destination"]["server"], "namespace": spec["destination"]["namespace"]} \
            in project["spec"]["destinations"]
        assert "ServerSideApply=true" in spec["syncPolicy"]["syncOptions"]
        rendered = kustomize(path)
        # The destination namespace is where the kustomization puts its namespaced objects.
        assert {o["metadata"]["namespace"] for o in rendered if "namespace" in o["metadata"]} == {
            spec["destination"]["namespace"]}
        objects += rendered

    def group_kind(o: dict) -> dict:
        group = o["apiVersion"].rpartition("/")[0]
        return {"group": group, "kind": o["kind"]}

    def as_set(entries: list[dict]) -> set[tuple[str, str]]:
        return {(e["group"], e["kind"]) for e in entries}

    cluster = as_set([group_kind(o) for o in objects if "namespace" not in o["metadata"]])
    namespaced = as_set([group_kind(o) for o in objects if "namespace" in o["metadata"]])
    assert as_set(project["spec"]["clusterResourceWhitelist"]) == cluster
    assert as_set(project["spec"]["namespaceResourceWhitelist"]) == namespaced

"""The generated CRDs: in sync with the models, structural, and agreeing with them on samples.

The apiserver's verdict is approximated by two halves: the openAPIV3Schema checked with
jsonschema (draft 4 has OpenAPI 3.0's boolean exclusiveMinimum), and the CEL rules, whose
Python twins run inside the models (`cel_rule` errors).
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

try:
    import jsonschema
except ImportError as exc:  # a missing test dependency is an error, never a skip
    raise ImportError("tests/test_crds.py needs jsonschema (dev extra): "
                      "pip install 'jsonschema>=4'") from exc

from mlsched.api import MLJob, SchedulingPolicy
from mlsched.api.crdgen import REGENERATE, render, stale_files
from mlsched.api.openapi import UnsupportedSchema, openapi_schema
from mlsched.api.structural import structural_errors
from manifest_tools import committed, schema_of, strict_validator, version_of, walk

ROOT = Path(__file__).resolve().parents[1]
CRDS = ROOT / "crds"
SAMPLES = ROOT / "manifests" / "samples"
MODELS = {"MLJob": MLJob, "SchedulingPolicy": SchedulingPolicy}


# ------------------------------------------------------------------------ generation


def test_committed_crds_match_the_models():
    stale = stale_files(CRDS)
    assert not stale, f"crds/ drifted from the models ({', '.join(stale)}); run: {REGENERATE}"


def test_generation_is_deterministic_across_processes(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "operator"), "PYTHONHASHSEED": "7"}
    cmd = [sys.executable, "-m", "mlsched.api.crdgen", "--out", str(tmp_path)]
    subprocess.run(cmd, check=True, env=env, capture_output=True)
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == render()
    assert subprocess.run([*cmd, "--check"], env=env).returncode == 0
    (tmp_path / "mlsched.io_mljobs.yaml").write_text("# edited by hand\n")
    check = subprocess.run([*cmd, "--check"], env=env, capture_output=True, text=True)
    assert check.returncode == 1 and "mlsched.api.crdgen --out crds/" in check.stderr


@pytest.mark.parametrize("kind, plural, short, columns", [
    ("MLJob", "mljobs", "mlj", ["Phase", "Reason", "PS", "Workers", "Progress", "Policy", "Group",
                                "Age"]),
    ("SchedulingPolicy", "schedulingpolicies", "schedpol",
     ["Allocation", "Placement", "Model loaded", "Ready", "Admitted", "Waiting", "GPUs", "Model version",
      "Last round", "Age"]),
])
def test_crd_names_subresources_and_columns(kind, plural, short, columns):
    crd = committed(kind)
    assert crd["metadata"]["name"] == f"{plural}.mlsched.io"
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"]) == (kind, plural)
    assert short in names["shortNames"] and names["categories"] == ["mlsched"]
    version = version_of(kind)
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    shown = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert shown == columns


# ------------------------------------------------------------------------ structural


@pytest.mark.parametrize("kind", MODELS)
def test_generated_schemas_are_structural(kind):
    assert structural_errors(schema_of(kind)) == []
    text = yaml.safe_dump(schema_of(kind))
    for word in ("$ref", "definitions", "anyOf", "allOf", "oneOf", "const:", "title:"):
        assert word not in text


@pytest.mark.parametrize("kind", MODELS)
def test_preserve_unknown_fields_only_on_pod_templates(kind):
    paths = [path for path, node in walk(schema_of(kind))
             if node.get("x-kubernetes-preserve-unknown-fields")]
    # Inside a template: its spec and containers are declared (so that they are required)
    # and keep unknown fields too.
    outside = sorted({p.split(".template")[0] + ".template" if ".template" in p else p
                      for p in paths})
    expected = {"MLJob": ["spec.replicaSpecs.ps.template", "spec.replicaSpecs.worker.template"],
                "SchedulingPolicy": []}[kind]
    assert outside == expected


@pytest.mark.parametrize("bad, complaint", [
    ({"$ref": "#/definitions/X"}, "not allowed"),
    ({"properties": {"a": {"description": "untyped"}}}, "a: missing type"),
    ({"properties": {"a": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}, "missing type"),
    ({"properties": {"a": {"type": "integer", "anyOf": [{"type": "integer"}]}}},
     "'type' is not allowed inside a junctor"),
    ({"properties": {}, "additionalProperties": {"type": "string"}}, "mutually exclusive"),
    ({"additionalProperties": True}, "must be a schema"),
    ({"properties": {"a": {"type": "number", "minimum": 0, "exclusiveMinimum": 0}}},
     "must be a boolean"),
    ({"properties": {"a": {"type": "string", "nullable": "yes"}}}, "nullable must be a boolean"),
    ({"properties": {"a": {"type": "string", "const": "x"}}}, "'const' is not allowed"),
    ({"properties": {"a": {"type": "array"}}}, "array without an items schema"),
    ({"properties": {"a": {"type": "string"}}, "required": ["b"]}, "'b' is not a property"),
    ({"properties": {"metadata": {"type": "object", "properties": {"labels": {"type": "object"}}}}},
     "only name and generateName"),
    ({"properties": {"a": {"type": "array", "x-kubernetes-list-type": "map",
                           "x-kubernetes-list-map-keys": ["k"],
                           "items": {"type": "object", "properties": {"k": {"type": "string"}}}}}},
     "must be required or defaulted"),
])
def test_structural_checker_catches_violations(bad, complaint):
    errors = structural_errors({"type": "object", **bad})
    assert any(complaint in e for e in errors), errors


def test_converter_refuses_non_optional_unions():
    from pydantic import BaseModel

    class Loose(BaseModel):
        value: int | str

    with pytest.raises(UnsupportedSchema, match="unions"):
        openapi_schema(Loose)


# -------------------------------------------------------------------------- defaults


def test_defaults_the_apiserver_fills_in():
    job = schema_of("MLJob")["properties"]["spec"]["properties"]
    assert job["schedulingPolicy"]["default"] == "default"
    assert job["runPolicy"]["default"] == {}
    run = job["runPolicy"]["properties"]
    assert run["suspend"]["default"] is False and run["cleanPodPolicy"]["default"] == "Running"
    assert job["replicaSpecs"]["properties"]["worker"]["properties"]["min"]["default"] == 1
    pol = schema_of("SchedulingPolicy")["properties"]["spec"]["properties"]
    assert {k: pol[k]["default"] for k in ("interval", "allocation", "placement", "grouping",
                                           "fallback", "historyLimit")} == {
        "interval": 1200, "allocation": "drf", "placement": "load-balance", "grouping": "none",
        "fallback": "drf", "historyLimit": 50}
    assert pol["historyLimit"]["maximum"] == 1000 and pol["interval"]["minimum"] == 1


@pytest.mark.parametrize("kind", MODELS)
def test_every_default_validates_against_its_own_schema(kind):
    for path, node in walk(schema_of(kind)):
        if "default" in node:
            jsonschema.Draft4Validator(node).validate(node["default"])


# --------------------------------------------------------------------- printer columns


@pytest.mark.parametrize("kind", MODELS)
def test_printer_columns_point_at_existing_fields_of_the_right_type(kind):
    schema = schema_of(kind)
    for column in version_of(kind)["additionalPrinterColumns"]:
        path = column["jsonPath"]
        if path == ".metadata.creationTimestamp":
            continue  # owned by the apiserver, not declared in our schema
        node = resolve_jsonpath(schema, path)
        expected = {"date": ("string", "date-time"), "integer": ("integer", None),
                    "number": ("number", None), "string": ("string", None),
                    "boolean": ("boolean", None)}[column["type"]]
        assert node["type"] == expected[0], path
        if expected[1]:
            assert node.get("format") == expected[1], path


def resolve_jsonpath(schema: dict[str, Any], path: str) -> dict[str, Any]:
    """Follow `.a.b[?(@.type=="X")].c` / `[0]` through a schema; fail on unknown steps."""
    node = schema
    for name, index in re.findall(r"\.([A-Za-z_][A-Za-z0-9_]*)|(\[[^\]]*\])", path):
        if name:
            assert name in node.get("properties", {}), f"{path}: no field {name!r}"
            node = node["properties"][name]
        else:
            assert node.get("type") == "array", f"{path}: {index} on a non-list"
            node = node["items"]
            filt = re.fullmatch(r'\[\?\(@\.(\w+)==["\'](\w+)["\']\)\]', index)
            if filt:
                assert filt.group(1) in node["properties"], f"{path}: filter on unknown field"
    return node


# ------------------------------------------------------------------------- CEL rules


@pytest.mark.parametrize("kind", MODELS)
def test_cel_rules_only_reference_declared_fields(kind):
    schema = schema_of(kind)
    for where, node in walk(schema):
        for rule in node.get("x-kubernetes-validations", []):
            for ref in re.findall(r"\bself((?:\.[A-Za-z_]\w*)+)", rule["rule"]):
                if ref.startswith(".metadata.") and node is schema:
                    continue  # root rules may read metadata.name, which the apiserver owns
                resolve_declared(node, ref.removesuffix(".size").removesuffix(".matches"))
            if "fieldPath" in rule:
                resolve_jsonpath(node, rule["fieldPath"])


def resolve_declared(node: dict[str, Any], path: str) -> None:
    """Like resolve_jsonpath, but a field that keeps unknown fields (a pod template) may be
    read below: the API server types it dynamically."""
    for name in path.strip(".").split("."):
        if node.get("x-kubernetes-preserve-unknown-fields"):
            return
        assert name in node.get("properties", {}), f"{path}: no field {name!r}"
        node = node["properties"][name]


def test_mljob_cel_rules_present():
    spec = schema_of("MLJob")["properties"]["spec"]
    rules = [r["rule"] for r in spec["x-kubernetes-validations"]]
    assert any("'AllReduce'" in r and "!has(self.replicaSpecs.ps)" in r for r in rules)
    worker = spec["properties"]["replicaSpecs"]["properties"]["worker"]
    assert worker["x-kubernetes-validations"][0]["rule"] == "self.min <= self.max"
    assert spec["properties"]["architecture"]["x-kubernetes-validations"][0]["rule"] == (
        "self == oldSelf")
    ref = schema_of("SchedulingPolicy")["properties"]["spec"]["properties"]["models"]
    assert "has(self.configMapKeyRef) != has(self.path)" in str(ref)


# ------------------------------------------------------------- samples against schema


def samples() -> list[tuple[str, dict]]:
    """The samples of mlsched's kinds (the checkpoint claims beside them are core objects)."""
    objs = [(p.name, yaml.safe_load(p.read_text())) for p in sorted(SAMPLES.glob("*.yaml"))
            if p.name != "kustomization.yaml"]
    return [(name, obj) for name, obj in objs if obj["kind"] in ("MLJob", "SchedulingPolicy")]


@pytest.mark.parametrize("name, obj", samples())
def test_samples_validate_against_the_crd_schema_without_pruning(name, obj):
    strict_validator(obj["kind"]).validate(obj)


@pytest.mark.parametrize("name, obj", samples())
def test_crd_defaults_equal_model_defaults(name, obj):
    """What the apiserver stores after defaulting is what the model parses the sample into."""
    stored = copy.deepcopy(obj)
    apply_defaults(stored, schema_of(obj["kind"]))
    parsed = MODELS[obj["kind"]].from_k8s(obj).to_k8s()
    assert stored["spec"] == parsed["spec"]


BAD_JOBS = {
    "min above max": lambda s: s["replicaSpecs"]["worker"].update(min=9, max=2),
    "malformed model label": lambda s: s.update(modelType="GPT 9!"),
    "zero epochs": lambda s: s.update(epochs=0),
    "negative epochs": lambda s: s.update(epochs=-3),
    "ps on allreduce": lambda s: s.update(architecture="AllReduce"),
    "unknown cleanPodPolicy": lambda s: s.update(runPolicy={"cleanPodPolicy": "Some"}),
    "unknown architecture": lambda s: s.update(architecture="Ring"),
    "zero min": lambda s: s["replicaSpecs"]["ps"].update(min=0),
    "negative backoff": lambda s: s.update(runPolicy={"backoffLimit": -1}),
}


@pytest.mark.parametrize("case", BAD_JOBS)
def test_models_and_apiserver_agree_on_bad_jobs(case):
    obj = dict(samples())["mljob-resnet50-ps.yaml"]
    BAD_JOBS[case](obj["spec"])
    assert apiserver_rejects(obj), "the CRD would accept it"
    with pytest.raises(ValidationError):
        MLJob.model_validate(obj)


@pytest.mark.parametrize("name, obj", samples())
def test_models_and_apiserver_agree_on_good_objects(name, obj):
    assert not apiserver_rejects(obj)


def apiserver_rejects(obj: dict) -> bool:
    """Schema violations (jsonschema) or CEL violations (the models' cel_rule twins)."""
    if not jsonschema.Draft4Validator(schema_of(obj["kind"])).is_valid(obj):
        return True
    try:
        MODELS[obj["kind"]].model_validate(obj)
    except ValidationError as exc:
        return any(e["type"] == "cel_rule" for e in exc.errors())
    return False


# ---------------------------------------------------------------------------- helpers


def apply_defaults(obj: Any, schema: dict[str, Any]) -> None:
    """Structural defaulting as the apiserver does it: absent fields get their default, then
    defaulting continues inside (so a `default: {}` block receives its fields' defaults)."""
    if isinstance(obj, dict):
        if "properties" in schema:
            for name, sub in schema["properties"].items():
                if name not in obj and "default" in sub:
                    obj[name] = copy.deepcopy(sub["default"])
                if name in obj:
                    apply_defaults(obj[name], sub)
        elif isinstance(schema.get("additionalProperties"), dict):
            for value in obj.values():
                apply_defaults(value, schema["additionalProperties"])
    elif isinstance(obj, list) and "items" in schema:
        for value in obj:
            apply_defaults(value, schema["items"])


def test_the_crds_algorithm_names_are_the_registrys():
    """The enums the API server checks names against (api/algorithms.py) are exactly what the
    operator can run: a name missing there would be refused although it works, a name only
    there would be accepted and run as the fallback."""
    from mlsched.api import algorithms
    from mlsched.policies import registry

    for phase, names in algorithms.BY_PHASE.items():
        assert set(names) == set(registry.REGISTRY[phase]), phase
    heuristics = {n for n in registry.REGISTRY["allocation"]
                  if not registry.is_learned("allocation", n)}
    assert set(algorithms.ALLOCATION_HEURISTICS) == heuristics
    spec = schema_of("SchedulingPolicy")["properties"]["spec"]["properties"]
    for field, names in (*algorithms.BY_PHASE.items(),
                         ("fallback", algorithms.ALLOCATION_HEURISTICS)):
        assert spec[field]["enum"] == list(names), field


@pytest.mark.parametrize("field, typo", [("allocation", "foobar"), ("placement", "spread"),
                                         ("grouping", "harmonie"), ("fallback", "dl2")])
def test_an_unknown_algorithm_name_is_refused_by_the_schema(field, typo):
    obj = dict(samples())["schedulingpolicy-dl2.yaml"]
    obj["spec"][field] = typo
    assert not jsonschema.Draft4Validator(schema_of("SchedulingPolicy")).is_valid(obj)

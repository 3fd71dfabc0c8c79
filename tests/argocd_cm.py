"""The argocd-cm form of the health checks, made from the health.lua files, so that the
two cannot drift (tests/test_argocd_manifests.py compares; e2e/test_argocd_health.py runs
Argo CD on the committed file). After editing a health.lua:

    python tests/argocd_cm.py      # rewrites manifests/argocd/argocd-cm.yaml
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
ARGOCD = ROOT / "manifests" / "argocd"
CUSTOMIZATIONS = ARGOCD / "resource_customizations"
ARGOCD_CM = ARGOCD / "argocd-cm.yaml"

HEADER = """\
# Generated from resource_customizations/*/*/health.lua by `python tests/argocd_cm.py`: edit
# those, not this. Argo CD's health checks for mlsched's kinds, in the form its argocd-cm
# ConfigMap takes them (one key per group_kind). Merge the keys into your argocd-cm, e.g.
#   kubectl apply --server-side -n argocd -f manifests/argocd/argocd-cm.yaml
# (server-side apply owns only these keys; the others in argocd-cm are left as they are).
"""


def health_scripts() -> dict[tuple[str, str], Path]:
    """(group, kind) -> its health.lua, laid out as Argo CD's resource_customizations."""
    return {(p.parent.parent.name, p.parent.name): p
            for p in sorted(CUSTOMIZATIONS.glob("*/*/health.lua"))}


class _Literal(str):
    pass


def _literal(dumper: yaml.SafeDumper, text: _Literal) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|")


def render() -> str:
    data = {f"resource.customizations.health.{group}_{kind}": _Literal(path.read_text())
            for (group, kind), path in health_scripts().items()}
    config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": "argocd-cm", "namespace": "argocd",
                               "labels": {"app.kubernetes.io/name": "argocd-cm",
                                          "app.kubernetes.io/part-of": "argocd"}},
                  "data": data}
    dumper = type("LiteralDumper", (yaml.SafeDumper,), {})
    dumper.add_representer(_Literal, _literal)
    return HEADER + yaml.dump(config_map, Dumper=dumper, sort_keys=False, width=1000)


if __name__ == "__main__":
    ARGOCD_CM.write_text(render())
    print(f"wrote {ARGOCD_CM.relative_to(ROOT)}", file=sys.stderr)

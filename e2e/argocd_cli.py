"""Argo CD's health assessment, for testing the health checks in manifests/argocd/ with Argo
CD's own settings and Lua code: e2e/argocd_health/main.go, built against Argo CD's module from
the Go module proxy by build_argocd.sh (cached in ~/.cache/mlsched-e2e like the control
plane). It does what `argocd admin settings resource-overrides health` does, without
compiling the whole CLI."""

from __future__ import annotations

import subprocess
from pathlib import Path

#: Instant when cached; about 5 minutes cold on 2 cores. Prints the binary's path.
BUILD_SCRIPT = Path(__file__).resolve().parent / "build_argocd.sh"


def assess_health(argocd: Path, resource: Path, argocd_cm: Path) -> tuple[str, str]:
    """What `argocd admin settings resource-overrides health RESOURCE --argocd-cm-path CM`
    prints: the (status, message) Argo CD's health code computes for the object in the file."""
    result = subprocess.run(
        [str(argocd), str(resource), str(argocd_cm)],
        capture_output=True, text=True, timeout=60)
    fields = dict(line.split(": ", 1) for line in result.stdout.splitlines()
                  if line.startswith(("STATUS: ", "MESSAGE: ")))
    if result.returncode != 0 or "STATUS" not in fields:
        raise AssertionError(f"argocd could not assess {resource} (exit {result.returncode}):\n"
                             f"{result.stdout}{result.stderr}")
    return fields["STATUS"], fields.get("MESSAGE", "")

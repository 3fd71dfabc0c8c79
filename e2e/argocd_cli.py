"""Argo CD's own `argocd` CLI, built from the Go module proxy by build_argocd.sh (cached in
~/.cache/mlsched-e2e like the control plane), for testing the health checks in
manifests/argocd/ with Argo CD's Lua code."""

from __future__ import annotations

import subprocess
from pathlib import Path

#: Instant when cached; about 15 minutes cold on 2 cores. Prints the binary's path.
BUILD_SCRIPT = Path(__file__).resolve().parent / "build_argocd.sh"


def assess_health(argocd: Path, resource: Path, argocd_cm: Path) -> tuple[str, str]:
    """`argocd admin settings resource-overrides health RESOURCE --argocd-cm-path CM`:
    the (status, message) Argo CD's health code computes for the object in the file."""
    result = subprocess.run(
        [str(argocd), "admin", "settings", "resource-overrides", "health", str(resource),
         "--argocd-cm-path", str(argocd_cm)],
        capture_output=True, text=True, timeout=60)
    fields = dict(line.split(": ", 1) for line in result.stdout.splitlines()
                  if line.startswith(("STATUS: ", "MESSAGE: ")))
    if result.returncode != 0 or "STATUS" not in fields:
        raise AssertionError(f"argocd could not assess {resource} (exit {result.returncode}):\n"
                             f"{result.stdout}{result.stderr}")
    return fields["STATUS"], fields.get("MESSAGE", "")

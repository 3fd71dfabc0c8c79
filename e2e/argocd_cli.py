"""Argo CD's own `argocd` CLI, built from the Go module proxy by build_argocd.sh (cached in
~/.cache/mlsched-e2e like the control plane), for testing the health checks in
manifests/argocd/ with Argo CD's Lua code."""

from __future__ import annotations

import collections
import subprocess
import sys
from pathlib import Path

BUILD_SCRIPT = Path(__file__).resolve().parent / "build_argocd.sh"


class ArgoCDBuildError(RuntimeError):
    pass


def build_argocd() -> Path:
    """Runs the build script (instant when cached; about 15 minutes cold on 2 cores, with its
    progress passed on) and returns the binary's path."""
    messages: collections.deque[str] = collections.deque(maxlen=40)
    with subprocess.Popen(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as script:
        for line in script.stderr:
            sys.stderr.write(line)
            messages.append(line)
        stdout = script.stdout.read()
    lines = stdout.strip().splitlines()
    if script.returncode != 0 or not lines or not Path(lines[-1]).is_file():
        raise ArgoCDBuildError(
            f"the argocd CLI is not built: `bash {BUILD_SCRIPT}` failed (exit "
            f"{script.returncode}). It needs Go >= 1.26 (on PATH, or GO=/path/to/go) and the Go "
            "module proxy. Its messages:\n" + "".join(messages))
    return Path(lines[-1])


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

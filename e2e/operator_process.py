"""The mlsched operator as a child process, so a test can SIGKILL and restart it.

It runs exactly as docs/operator.md says to run it outside a cluster
(`python -m mlsched.controller` with a kubeconfig), against the e2e control plane as
the cluster admin. Its progress endpoint listens on 127.0.0.1:<port>, and the URL it
tells training pods is that same address, because the workload emulator, which plays
the pods, runs on this host.

The log of every run goes to one file (appended across restarts), which the
fixtures print when a test fails.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # A pytest killed hard leaves no operator behind writing to a dead cluster.
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OperatorError(RuntimeError):
    pass


class OperatorProcess:
    def __init__(self, kubeconfig: Path, log_path: Path, *, namespaces: list[str],
                 interval_scale: float, job_sync_seconds: float = 1.0,
                 model_dirs: list[Path] | None = None,
                 max_model_bytes: str | None = None, extra_env: dict[str, str] | None = None,
                 tls_secret: str | None = None, extra_args: list[str] | None = None):
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.namespaces = namespaces
        self.interval_scale = interval_scale
        self.job_sync_seconds = job_sync_seconds
        self.model_dirs = model_dirs or []  # none: the operator's default (the shipped models)
        self.max_model_bytes = max_model_bytes
        self.extra_env = extra_env or {}
        # `namespace/name`: serve HTTPS as the Deployment does (--tls-secret).
        self.tls_secret = tls_secret
        self.extra_args = extra_args or []  # after the defaults: a repeated flag wins
        self.port = free_port()  # kept across restarts: pods were told this URL
        self.process: subprocess.Popen | None = None
        self.starts = 0

    @property
    def base_url(self) -> str:
        return f"{'https' if self.tls_secret else 'http'}://127.0.0.1:{self.port}"

    def _open(self, path: str, timeout: float):
        # The harness's own calls (/healthz, /metrics) do not check the certificate, as the
        # kubelet's probes do not; tests that do check it use the CA the pods are given.
        context = ssl._create_unverified_context() if self.tls_secret else None
        return urllib.request.urlopen(f"{self.base_url}{path}", timeout=timeout, context=context)

    @property
    def progress_url(self) -> str:
        return f"{self.base_url}/v1/progress"

    @property
    def pid(self) -> int:
        assert self.process is not None, "the operator is not running"
        return self.process.pid

    def argv(self) -> list[str]:
        args = [sys.executable, "-m", "mlsched.controller",
                "--port", str(self.port), "--progress-url", self.progress_url,
                "--interval-scale", str(self.interval_scale),
                "--job-sync-seconds", str(self.job_sync_seconds)]
        for namespace in self.namespaces:
            args += ["--namespace", namespace]
        if self.tls_secret:
            args += ["--tls-secret", self.tls_secret]
        for directory in self.model_dirs:
            args += ["--allowed-model-dir", str(directory)]
        if self.max_model_bytes:
            args += ["--max-model-bytes", self.max_model_bytes]
        return args + self.extra_args

    def start(self, timeout: float = 120.0) -> None:
        """Starts the operator and returns once its endpoint answers /healthz."""
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig),
               # Unbuffered, so the log is complete up to a SIGKILL.
               "PYTHONUNBUFFERED": "1", **self.extra_env}
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== start #{self.starts}: {' '.join(self.argv())}\n".encode())
            log.flush()
            self.process = subprocess.Popen(self.argv(), env=env, stdin=subprocess.DEVNULL,
                                            stdout=log, stderr=subprocess.STDOUT,
                                            preexec_fn=_die_with_parent)
        self._wait_healthy(timeout)

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise OperatorError(f"the operator exited with code {self.process.returncode} "
                                    f"while starting\n{self.log_tail()}")
            try:
                with self._open("/healthz", timeout=5) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError) as err:
                last = str(err)
            time.sleep(0.25)
        raise OperatorError(f"the operator's /healthz did not answer in {timeout:.0f}s "
                            f"(last: {last})\n{self.log_tail()}")

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: no cleanup handler runs, as when a node dies under the operator's pod."""
        if self.running():
            self._note("SIGKILL by the test")
            self.process.kill()
            self.process.wait()
        self.process = None

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (kopf's graceful shutdown), then SIGKILL if it hangs."""
        if self.running():
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self._note(f"still running {timeout:.0f}s after SIGTERM: SIGKILL")
                self.process.kill()
                self.process.wait()
        self.process = None

    def rss_kib(self) -> int:
        """Resident memory now, from /proc (VmRSS, in KiB)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise OperatorError(f"no VmRSS in /proc/{self.pid}/status")

    def metrics(self) -> str:
        with self._open("/metrics", timeout=10) as answer:
            return answer.read().decode()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 60) -> str:
        return f"--- operator log ({self.log_path}), last {lines} lines ---\n" + "\n".join(
            self.log_text().splitlines()[-lines:])

    def _note(self, line: str) -> None:
        with open(self.log_path, "a") as log:
            log.write(f"\n=== {line}\n")

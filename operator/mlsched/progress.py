"""Report training progress to the mlsched operator, from inside a training pod.

    from mlsched import progress
    for epoch in range(start, epochs):
        train_one_epoch()
        progress.report(epoch + 1)

Everything it needs is in the environment the operator gives every training pod
(MLSCHED_PROGRESS_URL, MLSCHED_NAMESPACE, MLSCHED_JOB_NAME, MLSCHED_TOKEN_FILE, and for an HTTPS
endpoint MLSCHED_PROGRESS_CA, the CA to verify it with). The token is the
pod's own audience-bound ServiceAccount token, re-read on every call because the kubelet
rotates it. Report from one process per job (e.g. worker 0); reports from several are
harmless, the operator keeps the highest count.

Standard library only, so it can be vendored into any training image. A failed report returns
False and logs a warning: training should not stop because the operator is briefly unreachable.
Use `strict=True` to raise instead.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass

log = logging.getLogger("mlsched.progress")
DEFAULT_TOKEN_FILE = "/var/run/secrets/mlsched.io/token"


class ProgressError(RuntimeError):
    pass


@dataclass(frozen=True)
class Reporter:
    url: str
    namespace: str
    job: str
    token_file: str = DEFAULT_TOKEN_FILE
    timeout_s: float = 5.0
    ca_file: str | None = None  # for an HTTPS endpoint with a private CA
    # The same as PEM text: what the operator puts into MLSCHED_PROGRESS_CA when it serves
    # HTTPS with its own CA (no file to mount, no ConfigMap to copy into every namespace).
    ca_pem: str | None = None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Reporter:
        env = dict(os.environ if env is None else env)
        missing = [k for k in ("MLSCHED_PROGRESS_URL", "MLSCHED_NAMESPACE", "MLSCHED_JOB_NAME")
                   if not env.get(k)]
        if missing:
            raise ProgressError(f"not running in an mlsched training pod: {', '.join(missing)} unset")
        return cls(url=env["MLSCHED_PROGRESS_URL"], namespace=env["MLSCHED_NAMESPACE"],
                   job=env["MLSCHED_JOB_NAME"],
                   token_file=env.get("MLSCHED_TOKEN_FILE") or DEFAULT_TOKEN_FILE,
                   ca_file=env.get("MLSCHED_PROGRESS_CA_FILE") or None,
                   ca_pem=env.get("MLSCHED_PROGRESS_CA") or None)

    def ssl_context(self) -> ssl.SSLContext | None:
        """Verifies the endpoint against the given CA only (not the system's): a private CA
        is what signs it. None for plain HTTP or a publicly trusted endpoint."""
        if not (self.ca_file or self.ca_pem):
            return None
        return ssl.create_default_context(cafile=self.ca_file, cadata=self.ca_pem)

    def request(self, epochs_done: float, speed: float | None = None, *,
                samples_per_second: float | None = None) -> urllib.request.Request:
        with open(self.token_file, encoding="utf-8") as f:
            token = f.read().strip()
        payload = {"namespace": self.namespace, "job": self.job, "epochsDone": float(epochs_done)}
        if speed is not None:
            payload["speed"] = float(speed)
        if samples_per_second is not None:
            # Measured by the program itself: the operator cannot derive it from epochs alone
            # (it does not know the dataset's size), and it is what speed records compare.
            payload["samplesPerSecond"] = float(samples_per_second)
        return urllib.request.Request(
            self.url, data=json.dumps(payload).encode(), method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})

    def report(self, epochs_done: float, speed: float | None = None, *, strict: bool = False,
               samples_per_second: float | None = None) -> bool:
        try:
            request = self.request(epochs_done, speed, samples_per_second=samples_per_second)
            with urllib.request.urlopen(request, timeout=self.timeout_s,
                                        context=self.ssl_context()) as response:
                return 200 <= response.status < 300
        except (OSError, urllib.error.URLError) as err:
            detail = err.read().decode(errors="replace") if isinstance(err, urllib.error.HTTPError) else err
            if strict:
                raise ProgressError(f"progress report to {self.url} failed: {detail}") from err
            log.warning("progress report to %s failed: %s", self.url, detail)
            return False


def report(epochs_done: float, speed: float | None = None, *, strict: bool = False,
           samples_per_second: float | None = None) -> bool:
    """Tell the operator that `epochs_done` epochs (cumulative, may be fractional) are done.
    `speed` (epochs per second) is optional; the operator estimates it from the reports.
    `samples_per_second`, optional, is the training throughput the program measured."""
    try:
        reporter = Reporter.from_env()
    except ProgressError:
        if strict:
            raise
        log.warning("mlsched progress not reported: not in an mlsched training pod")
        return False
    return reporter.report(epochs_done, speed, strict=strict, samples_per_second=samples_per_second)

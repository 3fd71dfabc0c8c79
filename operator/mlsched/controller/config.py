"""Operator settings: from the environment, which the CLI (`python -m mlsched.controller`) fills
from its flags, so that `kopf run -m mlsched.controller.handlers` sees the same settings."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field

from mlsched.controller.constants import TOKEN_AUDIENCE

ENV_PREFIX = "MLSCHED_"


def _csv(text: str | None) -> tuple[str, ...]:
    return tuple(t.strip() for t in (text or "").split(",") if t.strip())


def _selector(text: str | None) -> dict[str, str]:
    """`a=b,c` → {'a': 'b', 'c': ''} (an empty value means: the label must exist)."""
    out = {}
    for item in _csv(text):
        key, _, value = item.partition("=")
        out[key.strip()] = value.strip()
    return out


@dataclass(frozen=True)
class OperatorConfig:
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    port: int = 8080  # progress endpoint, /metrics and /healthz
    # Multiplies every SchedulingPolicy's spec.interval; 0.01 turns 1200 s into 12 s for tests.
    interval_scale: float = 1.0
    job_sync_seconds: float = 10.0  # how often each MLJob's lifecycle is re-evaluated
    # The URL training pods are told to report to (the operator's Service in-cluster).
    progress_url: str = "http://mlsched-operator.mlsched-system.svc:8080/v1/progress"
    token_audience: str = TOKEN_AUDIENCE
    tls_cert: str | None = None  # serve the endpoint over HTTPS when both are set
    tls_key: str | None = None
    model_cache_dir: str = field(default_factory=lambda: os.path.join(tempfile.gettempdir(),
                                                                      "mlsched-models"))
    # Nodes the operator places tasks on: label selector, and NoSchedule/NoExecute taint keys
    # training pods are expected to tolerate (nodes with other such taints are left out).
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerated_taints: frozenset[str] = frozenset({"nvidia.com/gpu", "kwok.x-k8s.io/node"})
    api_concurrency: int = 16  # API calls in flight during one round

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorConfig:
        env = os.environ if env is None else env

        def get(name: str) -> str | None:
            value = env.get(ENV_PREFIX + name)
            return value if value not in (None, "") else None

        defaults = cls()
        taints = get("TOLERATED_TAINTS")
        return cls(
            namespaces=_csv(get("NAMESPACES")),
            port=int(get("PORT") or defaults.port),
            interval_scale=float(get("INTERVAL_SCALE") or defaults.interval_scale),
            job_sync_seconds=float(get("JOB_SYNC_SECONDS") or defaults.job_sync_seconds),
            progress_url=get("OPERATOR_PROGRESS_URL") or defaults.progress_url,
            token_audience=get("TOKEN_AUDIENCE") or defaults.token_audience,
            tls_cert=get("TLS_CERT"),
            tls_key=get("TLS_KEY"),
            model_cache_dir=get("MODEL_CACHE_DIR") or defaults.model_cache_dir,
            node_selector=_selector(get("NODE_SELECTOR")),
            tolerated_taints=frozenset(_csv(taints)) if taints is not None
            else defaults.tolerated_taints,
            api_concurrency=int(get("API_CONCURRENCY") or defaults.api_concurrency),
        )

    def round_seconds(self, spec_interval: float) -> float:
        """Wall-clock seconds between two rounds of a policy with this spec.interval."""
        return max(0.05, spec_interval * self.interval_scale)

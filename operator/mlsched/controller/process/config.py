"""Operator settings: from the environment, which the CLI (`python -m mlsched.controller`) fills
from its flags, so that `kopf run -m mlsched.controller.app.handlers` sees the same settings."""

from __future__ import annotations

import os
import re
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from mlsched.controller.kube.constants import TOKEN_AUDIENCE
from mlsched.formats.model_sources import DEFAULT_MAX_MODEL_BYTES
from mlsched.policies.onnx_runner import PROVIDERS

ENV_PREFIX = "MLSCHED_"
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_EXTENDED_RESOURCE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def _csv(text: str | None) -> tuple[str, ...]:
    return tuple(t.strip() for t in (text or "").split(",") if t.strip())


def _selector(text: str | None) -> dict[str, str]:
    """`a=b,c` → {'a': 'b', 'c': ''} (an empty value means: the label must exist)."""
    out = {}
    for item in _csv(text):
        key, _, value = item.partition("=")
        out[key.strip()] = value.strip()
    return out


def _paths(text: str | None) -> tuple[str, ...]:
    """A PATH-style list (`/a:/b`): directory names may hold commas, not the path separator."""
    return tuple(t for t in (text or "").split(os.pathsep) if t.strip())


_BINARY_SUFFIX = {"": 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


def parse_bytes(text: str) -> int:
    """`67108864` or `64Mi` (Ki, Mi, Gi); anything else is a ValueError saying so."""
    match = re.fullmatch(r"\s*([0-9]+)\s*(Ki|Mi|Gi)?\s*", text)
    if not match or int(match.group(1)) == 0:
        raise ValueError(f"{text!r} is not a positive byte count such as 67108864 or 64Mi")
    return int(match.group(1)) * _BINARY_SUFFIX[match.group(2) or ""]


def shipped_model_dirs() -> tuple[str, ...]:
    """The directory of the models installed with the operator (policy_models/artifacts in the
    image, or $MLSCHED_MODELS_DIR); none when they are not installed."""
    from mlsched.policies.onnx_runner import ModelLoadError, shipped_models_dir

    try:
        return (str(shipped_models_dir()),)
    except ModelLoadError:
        return ()


@dataclass(frozen=True)
class OperatorConfig:
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    port: int = 8080  # progress endpoint, /metrics and /healthz
    # Multiplies every SchedulingPolicy's spec.interval; 0.01 turns 1200 s into 12 s for tests.
    interval_scale: float = 1.0
    job_sync_seconds: float = 10.0  # how often each MLJob's lifecycle is re-evaluated
    # How long a pinned pod may wait for its scheduler to act at all before the job says so
    # (pod_problems.unscheduled): a schedulerName with no such scheduler running, kube-scheduler down.
    # Generous: kube-scheduler binds a pinned pod in a second, but a burst of thousands of
    # pods can queue it for tens of seconds, which must not read as a scheduler that is down.
    scheduler_grace_seconds: float = 60.0
    # How long a bound pod may wait for its containers to be created before its Warning Events
    # are read (jobs.stuck_creating): mounting volumes and pulling images take seconds to
    # minutes, a volume that does not exist is never mounted.
    creating_grace_seconds: float = 60.0
    # The URL training pods are told to report to (the operator's Service in-cluster).
    progress_url: str = "http://mlsched-operator.mlsched-system.svc:8080/v1/progress"
    token_audience: str = TOKEN_AUDIENCE
    tls_cert: str | None = None  # serve the endpoint over HTTPS when both are set
    tls_key: str | None = None
    # The CA (PEM file) that signed tls_cert, told to training pods so they can verify it.
    tls_ca: str | None = None
    # `namespace/name` of a Secret holding a CA and the endpoint's serving certificate, made
    # by the operator when missing (controller/serving/serving_tls.py): HTTPS with no cert-manager.
    tls_secret: str | None = None
    # Pods whose template names no ServiceAccount run as this one (manifests/base/training-rbac:
    # no API rights, no API token). `default` keeps the namespace's default account.
    training_service_account: str = "mlsched-training"
    # TokenReviews the progress endpoint may send: `rate` per second, bursts of `burst`. Each
    # answer is cached per token (controller/kube/token_reviews.py), so a reporting pod needs about
    # one a minute; beyond the limit a report is answered 429, never with a TokenReview.
    token_review_rate: float = 10.0
    token_review_burst: int = 50
    # The only directories a SchedulingPolicy's spec.models.*.path may name a file in (checked
    # after symlinks): any tenant can write that field, and the operator's container holds its
    # service-account token and devices such as /dev/zero.
    model_dirs: tuple[str, ...] = field(default_factory=shipped_model_dirs)
    # Largest model file, ConfigMap value or model card read: a bigger one is refused unread.
    max_model_bytes: int = DEFAULT_MAX_MODEL_BYTES
    # Where learned policies' models run (policies/onnx_runner.PROVIDERS): CPU, or CUDA with
    # the `gpu` extra and a GPU in the operator's pod. An operator setting, not a policy's:
    # the operator's own hardware decides it. Unavailable: every learned policy says so in its
    # ModelLoaded condition and schedules with its fallback.
    execution_provider: str = "CPU"
    # Nodes the operator places tasks on: label selector, and NoSchedule/NoExecute taint keys
    # training pods are expected to tolerate (nodes with other such taints are left out).
    node_selector: Mapping[str, str] = field(default_factory=dict)
    # The accelerator's extended resource name (quantities.GPU_RESOURCE reads the same variable);
    # a GPU node pool's taint conventionally has that key, so it is tolerated by default.
    gpu_resource: str = "nvidia.com/gpu"
    # DRA DeviceClasses whose devices are GPUs (dra.GPU_CLASSES reads the same variable):
    # counted per node and folded into the GPU dimension. NVIDIA's DRA driver's by default.
    gpu_device_classes: tuple[str, ...] = ("gpu.nvidia.com",)
    # The node label a node's GPU type is read from (constraints/gpu_labels.py, which reads
    # the same variable): NVIDIA GPU feature discovery's product name by default, mapped to
    # the measured types (v100, p100, k80). It fills the snapshot's GPU types (the type-aware
    # policies) and decides which nodes a role's spec gpuTypes allows.
    gpu_type_label: str = "nvidia.com/gpu.product"
    # None: the GPU resource's key and kwok's (set in __post_init__).
    tolerated_taints: frozenset[str] = None  # type: ignore[assignment]
    # API calls in flight (creates aside). 48, not 16: a round that re-decides 1,400-2,400
    # StatefulSets after a mass arrival applied 84-98 changes/s through 16 (five bench_e2e
    # runs), 163/s through 48 (docs/e2e.md, 28 Nov).
    api_concurrency: int = 48
    create_concurrency: int = 32  # creates in flight (a burst's children, Events; kube.py)
    # Status records (controller/kube/status_writer.py: interval records, placement): written in
    # the background, this many at a time, at most `record_rate` a second (bursts of
    # `record_burst`); 0 is no rate limit.
    record_concurrency: int = 8
    record_rate: float = 50.0
    record_burst: int = 100
    # The largest spec.exploration.epsilon served (issue 17): a tenant may ask its policy to
    # explore, within this bound; above it the operator clamps and says so in status.
    max_exploration: float = 0.2
    # Grouping's LabelNodes mode (controller/scheduling/pools.py): the operator may label nodes with
    # mlsched.io/pool. Off by default: it needs a cluster-wide nodes patch right.
    label_nodes: bool = False
    # `namespace/name` of the coordination.k8s.io Lease replicas elect a leader with
    # (controller/process/leadership.py); None: this process leads alone (one replica).
    leader_election: str | None = None
    # This replica's name in the Lease: the pod's name in a cluster, unique per process.
    leader_identity: str = field(default_factory=lambda: f"{socket.gethostname()}-"
                                                         f"{uuid.uuid4().hex[:8]}")

    def __post_init__(self) -> None:
        if self.tolerated_taints is None:
            object.__setattr__(self, "tolerated_taints",
                               frozenset({self.gpu_resource, "kwok.x-k8s.io/node"}))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorConfig:
        env = os.environ if env is None else env

        def get(name: str) -> str | None:
            value = env.get(ENV_PREFIX + name)
            return value if value not in (None, "") else None

        defaults = cls()
        taints, max_bytes = get("TOLERATED_TAINTS"), get("MAX_MODEL_BYTES")
        return cls(
            namespaces=_csv(get("NAMESPACES")),
            port=int(get("PORT") or defaults.port),
            interval_scale=float(get("INTERVAL_SCALE") or defaults.interval_scale),
            job_sync_seconds=float(get("JOB_SYNC_SECONDS") or defaults.job_sync_seconds),
            scheduler_grace_seconds=float(get("SCHEDULER_GRACE_SECONDS")
                                          or defaults.scheduler_grace_seconds),
            creating_grace_seconds=float(get("CREATING_GRACE_SECONDS")
                                         or defaults.creating_grace_seconds),
            progress_url=get("OPERATOR_PROGRESS_URL") or defaults.progress_url,
            token_audience=get("TOKEN_AUDIENCE") or defaults.token_audience,
            tls_cert=get("TLS_CERT"),
            tls_key=get("TLS_KEY"),
            tls_ca=get("TLS_CA"),
            tls_secret=get("TLS_SECRET"),
            training_service_account=get("TRAINING_SERVICE_ACCOUNT")
            or defaults.training_service_account,
            token_review_rate=float(get("TOKEN_REVIEW_RATE") or defaults.token_review_rate),
            token_review_burst=int(get("TOKEN_REVIEW_BURST") or defaults.token_review_burst),
            model_dirs=_paths(get("ALLOWED_MODEL_DIRS")) or defaults.model_dirs,
            max_model_bytes=parse_bytes(max_bytes) if max_bytes else defaults.max_model_bytes,
            execution_provider=get("EXECUTION_PROVIDER") or defaults.execution_provider,
            node_selector=_selector(get("NODE_SELECTOR")),
            gpu_resource=get("GPU_RESOURCE") or defaults.gpu_resource,
            gpu_device_classes=_csv(get("GPU_DEVICE_CLASSES")) or defaults.gpu_device_classes,
            gpu_type_label=get("GPU_TYPE_LABEL") or defaults.gpu_type_label,
            tolerated_taints=frozenset(_csv(taints)) if taints is not None else None,
            api_concurrency=int(get("API_CONCURRENCY") or defaults.api_concurrency),
            create_concurrency=int(get("CREATE_CONCURRENCY") or defaults.create_concurrency),
            record_concurrency=int(get("RECORD_CONCURRENCY") or defaults.record_concurrency),
            record_rate=float(get("RECORD_RATE") or defaults.record_rate),
            record_burst=int(get("RECORD_BURST") or defaults.record_burst),
            max_exploration=float(get("MAX_EXPLORATION") or defaults.max_exploration),
            leader_election=get("LEADER_ELECTION"),
            label_nodes=(get("LABEL_NODES") or "").lower() in ("1", "true", "yes"),
            leader_identity=get("LEADER_IDENTITY") or defaults.leader_identity,
        )

    def problems(self) -> list[str]:
        """Settings that cannot work together; the CLI refuses to start with any."""
        out = []
        if not _EXTENDED_RESOURCE.match(self.gpu_resource):
            out.append(f"--gpu-resource {self.gpu_resource!r} is not an extended resource name "
                       "(<domain>/<name>, e.g. nvidia.com/gpu or amd.com/gpu)")
        for name in self.gpu_device_classes:
            if not _DNS_SUBDOMAIN.match(name):
                out.append(f"--gpu-device-class {name!r} is not a DeviceClass name (a DNS "
                           "subdomain, e.g. gpu.nvidia.com)")
        if not _LABEL_KEY.match(self.gpu_type_label) or \
                len(self.gpu_type_label.rpartition("/")[2]) > 63:
            out.append(f"--gpu-type-label {self.gpu_type_label!r} is not a label key "
                       "([<domain>/]<name>, e.g. nvidia.com/gpu.product)")
        https = self.progress_url.startswith("https://")
        tls = bool(self.tls_secret or (self.tls_cert and self.tls_key))
        if bool(self.tls_cert) != bool(self.tls_key):
            out.append("--tls-cert and --tls-key go together")
        if self.tls_secret and self.tls_cert:
            out.append("--tls-secret and --tls-cert are two sources of one certificate: pick one")
        if tls and not https:
            out.append(f"the endpoint serves HTTPS but pods are told {self.progress_url}: "
                       "make --progress-url https://")
        if self.leader_election and self.leader_election.count("/") != 1:
            out.append(f"--leader-election {self.leader_election!r}: expected NAMESPACE/NAME "
                       "of a Lease")
        if not 0.0 <= self.max_exploration <= 1.0:
            out.append(f"--max-exploration {self.max_exploration}: a probability (0 to 1) is "
                       "expected")
        if self.execution_provider not in PROVIDERS:
            out.append(f"--execution-provider {self.execution_provider!r}: choose one of "
                       f"{', '.join(PROVIDERS)}")
        if https and not tls:
            out.append(f"pods are told {self.progress_url} but the endpoint serves plain HTTP: "
                       "add --tls-secret (or --tls-cert/--tls-key)")
        return out

    def round_seconds(self, spec_interval: float) -> float:
        """Wall-clock seconds between two rounds of a policy with this spec.interval."""
        return max(0.05, spec_interval * self.interval_scale)

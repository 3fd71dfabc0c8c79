"""Operator-wide state shared by the handlers, the scheduling loops and the progress endpoint.

kopf passes it around as `memo.runtime`. It holds nine things: the process (`Process`: its
config, metrics and leadership), the API seam (`api`), the model resolver (`models`), what
pods are told about the operator (`pod_settings`), the background writers to the API
(`ApiWriters`: Events, status records, the retraining dataset's ConfigMaps), and one object per
owner of the in-memory state (state.py): `pods`, `jobs`, `cluster` and `scheduling`, each with
its `forget_job`. The kopf indexes it reads are in indexes.py (`cluster.indexes`).
tests/test_architecture.py fails when it holds ten or more.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from mlsched.controller.process.config import OperatorConfig
from mlsched.controller.dataset.dataset import Dataset
from mlsched.controller.objects.desired import PodSettings
from mlsched.controller.kube.events import Recorder
from mlsched.controller.kube.kube import KubeApi
from mlsched.controller.process.leadership import Leadership
from mlsched.controller.process.metrics import Metrics
from mlsched.controller.serving.models import ModelResolver
from mlsched.controller.kube.object_writer import ObjectWriter
from mlsched.controller.scheduling.cluster_fit import ClusterFit
from mlsched.controller.kube.status_writer import Seen, StatusWriter
from mlsched.controller.scheduling.indexes import Indexes, JobKey
from mlsched.controller.scheduling.state import ClusterView, JobState, PodBooks, Scheduling


@dataclass
class Process:
    """The process's own machinery (controller/process/): its configuration, its metrics, and
    whether this replica may write (leadership.py: it does unless it stands by; a standby's
    Leadership is swapped in at startup, so read `leadership` when it is needed)."""

    config: OperatorConfig
    metrics: Metrics = field(default_factory=Metrics)
    leadership: Leadership = field(default_factory=Leadership)


@dataclass
class ApiWriters:
    """What the operator writes to the API server in the background, each queued, rate-limited
    and retried: Events (`events`), the MLJobs' and SchedulingPolicies' status records
    (`status`, merged with what the MLJob index shows when written), and the retraining
    dataset (`dataset`, whose ConfigMaps `objects` writes)."""

    events: Recorder
    status: StatusWriter
    objects: ObjectWriter
    dataset: Dataset

    @classmethod
    def create(cls, api: KubeApi, process: Process,
               seen: Callable[[str, str, str], Seen | None]) -> ApiWriters:
        config, metrics = process.config, process.metrics
        events = Recorder(api)
        status = StatusWriter(api, concurrency=config.record_concurrency, rate=config.record_rate,
                              burst=config.record_burst, lookup=seen,
                              on_failure=metrics.api_errors.labels("record").inc)
        objects = ObjectWriter(concurrency=max(1, config.record_concurrency // 2),
                               on_failure=metrics.api_errors.labels("dataset").inc)
        return cls(events, status, objects, Dataset(api, objects, config.interval_scale))


@dataclass
class Runtime:
    process: Process
    api: KubeApi
    models: ModelResolver
    pods: PodBooks = field(default_factory=PodBooks)
    jobs: JobState = field(default_factory=JobState)
    cluster: ClusterView = field(default_factory=ClusterView)
    scheduling: Scheduling = field(default_factory=Scheduling)

    def __post_init__(self) -> None:
        metrics, config = self.process.metrics, self.process.config
        if hasattr(self.api, "on_request"):  # the production KubeApi: count what it sends
            self.api.on_request = lambda verb, resource: \
                self.process.metrics.api_requests.labels(verb, resource).inc()
        self.writers = ApiWriters.create(self.api, self.process, self._seen)
        metrics.watch_pending_records(self.writers.status.pending)
        # Read at scrape time: a standby's Leadership object is swapped in after creation.
        metrics.watch_leadership(lambda: self.process.leadership.leading)
        # The progress endpoint adds its CA at startup (progress_server.serving_context).
        self.pod_settings = PodSettings(progress_url=config.progress_url,
                                        tolerated_taints=tuple(sorted(config.tolerated_taints)),
                                        token_audience=config.token_audience,
                                        service_account=config.training_service_account)

    @classmethod
    def create(cls, config: OperatorConfig, api: KubeApi) -> Runtime:
        async def read_configmap(namespace: str, name: str):
            return await api.get("ConfigMap", namespace, name)

        return cls(process=Process(config), api=api,
                   models=ModelResolver(read_configmap, config.model_dirs,
                                        config.max_model_bytes, config.execution_provider))

    def cluster_fit(self, idx: Indexes) -> ClusterFit:
        """The schedulable nodes summed, at most once a second (a sweep asks once per job)."""
        config = self.process.config
        return self.cluster.fit(idx, config.node_selector, config.tolerated_taints)

    def _seen(self, kind: str, namespace: str, name: str) -> Seen | None:
        indexes = self.cluster.indexes
        job = indexes.job(namespace, name) if indexes and kind == "MLJob" else None
        return Seen(job.uid, {"history": job.history}) if job else None

    def forget_job(self, key: JobKey) -> None:
        """One call per owner: a deleted job leaves nothing behind (but JobState.departed)."""
        self.jobs.forget_job(key)
        self.pods.forget_job(key)
        self.cluster.forget_job(key)
        self.scheduling.forget_job(key)

"""Operator-wide state shared by the handlers, the scheduling loops and the progress endpoint.

kopf passes it around as `memo.runtime`. Besides the seams (config, API, models, metrics,
leadership; Events and the background writers, made from them) it holds one object per owner
of the in-memory state (state.py): `pods`, `jobs`, `cluster` and `scheduling`, each with its
`forget_job`. The kopf indexes it reads are in indexes.py (`cluster.indexes`).
"""

from __future__ import annotations

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
class Runtime:
    config: OperatorConfig
    api: KubeApi
    models: ModelResolver
    metrics: Metrics = field(default_factory=Metrics)
    # Whether this replica may write (controller/process/leadership.py); it does unless it stands by.
    leadership: Leadership = field(default_factory=Leadership)
    pods: PodBooks = field(default_factory=PodBooks)
    jobs: JobState = field(default_factory=JobState)
    cluster: ClusterView = field(default_factory=ClusterView)
    scheduling: Scheduling = field(default_factory=Scheduling)

    def __post_init__(self) -> None:
        if hasattr(self.api, "on_request"):  # the production KubeApi: count what it sends
            self.api.on_request = lambda verb, resource: \
                self.metrics.api_requests.labels(verb, resource).inc()
        self.recorder = Recorder(self.api)
        # Status records go out in the background (status_writer.py); what is written is
        # merged with what the MLJob index shows then.
        self.records = StatusWriter(
            self.api, concurrency=self.config.record_concurrency, rate=self.config.record_rate,
            burst=self.config.record_burst, lookup=self._seen,
            on_failure=self.metrics.api_errors.labels("record").inc)
        self.metrics.watch_pending_records(self.records.pending)
        # Read at scrape time: a standby's Leadership object is swapped in after creation.
        self.metrics.watch_leadership(lambda: self.leadership.leading)
        # The retraining dataset's ConfigMaps (dataset.py), also written in the background.
        self.objects = ObjectWriter(concurrency=max(1, self.config.record_concurrency // 2),
                                    on_failure=self.metrics.api_errors.labels("dataset").inc)
        self.dataset = Dataset(self.api, self.objects, self.config.interval_scale)
        self.pod_settings = PodSettings(progress_url=self.config.progress_url,
                                        tolerated_taints=tuple(sorted(self.config.tolerated_taints)),
                                        token_audience=self.config.token_audience,
                                        service_account=self.config.training_service_account)

    @classmethod
    def create(cls, config: OperatorConfig, api: KubeApi) -> Runtime:
        async def read_configmap(namespace: str, name: str):
            return await api.get("ConfigMap", namespace, name)

        return cls(config=config, api=api,
                   models=ModelResolver(read_configmap, config.model_dirs,
                                        config.max_model_bytes, config.execution_provider))

    def cluster_fit(self, idx: Indexes) -> ClusterFit:
        """The schedulable nodes summed, at most once a second (a sweep asks once per job)."""
        return self.cluster.fit(idx, self.config.node_selector, self.config.tolerated_taints)

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

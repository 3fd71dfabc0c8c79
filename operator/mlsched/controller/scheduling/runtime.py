"""Operator-wide state shared by the handlers, the scheduling loops and the progress endpoint.

kopf passes it around as `memo.runtime`. Besides the seams (API, Events, metrics) it holds a few
small in-memory books (books.py) and per-policy and per-job state; each says what is lost on an
operator restart and why that is fine. The kopf indexes it reads are in indexes.py.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from mlsched.controller.process.config import OperatorConfig
from mlsched.controller.dataset.dataset import Dataset
from mlsched.controller.objects.desired import PodSettings
from mlsched.controller.scheduling.displacement import Refusals, Vacating
from mlsched.controller.kube.events import Recorder
from mlsched.controller.kube.kube import KubeApi
from mlsched.controller.process.leadership import Leadership
from mlsched.controller.objects.services import ServiceBook
from mlsched.controller.process.metrics import Metrics
from mlsched.controller.serving.models import ModelResolver
from mlsched.controller.objects.preflight import Preflight
from mlsched.controller.kube.object_writer import ObjectWriter
from mlsched.controller.objects.records import NodeRecord
from mlsched.controller.objects.job_records import JobRecord
from mlsched.controller.scheduling.cluster_fit import ClusterFit
from mlsched.controller.kube.status_writer import Seen, StatusWriter
from mlsched.controller.kube.written_status import WrittenStatus
from mlsched.controller.scheduling.indexes import Indexes, JobKey, PolicyKey, flatten
from mlsched.controller.scheduling.books import (
    DueJobs, FailureBook, JobBooks, PlacementBook, PodClocks, PodStates, PolicyBooks, ReservationBook,
    Wakeups,
)

MAX_DEPARTED = 10_000  # deleted jobs whose policy is remembered (runtime.departed)


@dataclass
class Runtime:
    config: OperatorConfig
    api: KubeApi
    models: ModelResolver
    metrics: Metrics = field(default_factory=Metrics)
    placements: PlacementBook = field(default_factory=PlacementBook)
    services: ServiceBook = field(default_factory=ServiceBook)  # whose headless Service exists
    reservations: ReservationBook = field(default_factory=ReservationBook)
    failures: FailureBook = field(default_factory=FailureBook)
    # What is kept of each policy between its steps, forgotten together (books.PolicyBooks).
    per_policy: PolicyBooks = field(default_factory=PolicyBooks)
    # Since when each job's pods have shown a problem (books.PodClocks).
    pod_clocks: PodClocks = field(default_factory=PodClocks)
    # What the MLJob handlers keep of each job between its events (books.JobBooks).
    job_books: JobBooks = field(default_factory=JobBooks)
    # Latest accepted progress report per job (epochs, epoch seconds, speed): newer than the
    # index until the status patch comes back through the watch.
    progress: dict[JobKey, tuple[float, float, float, float | None]] = field(default_factory=dict)
    # Pods pinned but not yet seen ungated (uid → node): a burst of watch events for one pod
    # then costs one patch, not one per event.
    pinned: dict[str, str] = field(default_factory=dict)
    indexes: Indexes | None = None
    round_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    wakeups: Wakeups = field(default_factory=Wakeups)
    # Jobs to evaluate now (a pod changed), and those being evaluated: one at a time per job.
    lifecycle_due: DueJobs = field(default_factory=DueJobs)
    pod_states: PodStates = field(default_factory=PodStates)
    # The lifecycle's status patches not yet seen in the job's watch (written_status.py).
    written_status: WrittenStatus = field(default_factory=WrittenStatus)
    # The policy of each job deleted lately, for the deletion of its pods (which outlive it)
    # to wake that policy's admission. The latest MAX_DEPARTED only.
    departed: dict[JobKey, str] = field(default_factory=dict)
    # Each namespace's labels as last seen: a change asks again about its refused jobs' pods.
    namespace_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    # Each node's record as last seen by the node handler: a change wakes admission.
    node_states: dict[str, NodeRecord] = field(default_factory=dict)
    # Why each job its policy's latest round or admission step gave nothing still waits
    # (waiting.py): the message of its Admitted=False condition.
    waiting: dict[JobKey, str] = field(default_factory=dict)
    # Nodes kube-scheduler refused each job's pods on lately, avoided when they are placed
    # again (displacement.py).
    refusals: Refusals = field(default_factory=Refusals)
    # Nodes our pods are leaving, for the jobs' conditions (displacement.Vacating).
    vacating: Vacating = field(default_factory=Vacating)
    # Each job's dry-run verdict: would the API server create its pods (preflight.py)?
    preflight: Preflight = field(default_factory=Preflight)
    policy_loops: Any = None  # supervision.PolicyLoops, made at startup
    # Whether this replica may write (controller/process/leadership.py); it does unless it stands by.
    leadership: Leadership = field(default_factory=Leadership)
    # Grouping (pools.py): each job's pool as the latest decision left it; newer than the
    # index until the status writes come back.
    groups: dict[JobKey, Any] = field(default_factory=dict)
    # Policies named by jobs or node labels but missing from the index: since when (jobs.py).
    orphans: dict[PolicyKey, float] = field(default_factory=dict)
    _fit: tuple[float, Any, ClusterFit] | None = None

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
        now = time.monotonic()
        if self._fit is None or self._fit[1] is not idx.nodes or now - self._fit[0] > 1.0:
            fit = ClusterFit.of(flatten(idx.nodes), node_selector=self.config.node_selector,
                                tolerated_taints=self.config.tolerated_taints)
            self._fit = (now, idx.nodes, fit)
        return self._fit[2]

    def _seen(self, kind: str, namespace: str, name: str) -> Seen | None:
        job = self.indexes.job(namespace, name) if self.indexes and kind == "MLJob" else None
        return Seen(job.uid, {"history": job.history}) if job else None

    def epochs_done(self, job: JobRecord) -> float:
        """The newest progress known: the index, or a report whose status write is in flight."""
        cached = self.progress.get(job.key)
        return max(job.epochs_done, cached[0] if cached else 0.0)

    def measured(self, job: JobRecord) -> tuple[float | None, float, float | None]:
        """(time, epochs/s, samples/s) of the job's latest progress report: the report this
        process accepted last, else what its status holds."""
        cached = self.progress.get(job.key)
        if cached is not None:
            return cached[1], cached[2], cached[3]
        return job.last_report_s, job.speed, job.samples_per_second

    def note_departed(self, key: JobKey, policy: str) -> None:
        self.departed.pop(key, None)
        self.departed[key] = policy
        while len(self.departed) > MAX_DEPARTED:
            del self.departed[next(iter(self.departed))]

    def forget_job(self, key: JobKey) -> None:
        self.job_books.forget(key)
        self.written_status.forget(key)
        self.pod_clocks.forget(key)
        self.waiting.pop(key, None)
        self.preflight.forget(key)
        self.refusals.forget(key)
        self.placements.forget(key)
        self.services.forget(key)
        self.reservations.release(key)
        self.failures.forget(key)
        self.progress.pop(key, None)
        self.groups.pop(key, None)

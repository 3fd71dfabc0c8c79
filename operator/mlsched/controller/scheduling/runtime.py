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
from mlsched.controller.dataset.rewards import OpenInterval
from mlsched.controller.scheduling.cluster_fit import ClusterFit
from mlsched.controller.kube.status_writer import Seen, StatusWriter
from mlsched.controller.kube.written_status import WrittenStatus
from mlsched.policies.cycle_guard import CycleGuard
from mlsched.controller.scheduling.indexes import Indexes, JobKey, PolicyKey, flatten
from mlsched.controller.scheduling.books import (
    DueJobs, FailureBook, PlacementBook, PodStates, ReservationBook, Wakeups,
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
    intervals: dict[PolicyKey, OpenInterval] = field(default_factory=dict)
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
    # Jobs being evaluated, each with whether it was marked due meanwhile (jobs.sync_job).
    syncing: dict[JobKey, bool] = field(default_factory=dict)
    # Jobs whose change of pod counts alone waits to be written, until when (loop time;
    # jobs.counts_wait).
    counts_due: dict[JobKey, float] = field(default_factory=dict)
    # The latest body of each MLJob (from its watch events), for the lifecycle sweep.
    job_bodies: dict[JobKey, dict[str, Any]] = field(default_factory=dict)
    # The lifecycle's status patches not yet seen in the job's watch (written_status.py).
    written_status: WrittenStatus = field(default_factory=WrittenStatus)
    # (uid, generation) whose children were created and templates refreshed: a watch event
    # of another generation (an edit) reconciles again. Lost on restart: all are, once.
    reconciled: dict[JobKey, tuple[str, int]] = field(default_factory=dict)
    # (job, StatefulSet) -> (since when it has been seen with fewer pods than replicas and
    # none created, how many pods it had then) (pod_problems.pods_refused).
    short_since: dict[tuple[JobKey, str], tuple[float, int]] = field(default_factory=dict)
    # The policy of each job deleted lately, for the deletion of its pods (which outlive it)
    # to wake that policy's admission. The latest MAX_DEPARTED only.
    departed: dict[JobKey, str] = field(default_factory=dict)
    # job -> pod uid -> when the pod was first seen pinned, ungated and with no word from any
    # scheduler (pod_problems.unscheduled). Per job: a sweep touches one job's clocks, not everyone's.
    unseen_since: dict[JobKey, dict[str, float]] = field(default_factory=dict)
    # job -> pod uid -> when the pod was first seen bound with its containers still being
    # created; per job, the latest read of such a pod's Warning Events: (when, pod, why or
    # None) (jobs.stuck_creating).
    creating_since: dict[JobKey, dict[str, float]] = field(default_factory=dict)
    creating_checks: dict[JobKey, tuple[float, str, str | None]] = field(default_factory=dict)
    # The same for pods whose ResourceClaims have not been made (jobs.claims_unmade).
    claims_since: dict[JobKey, dict[str, float]] = field(default_factory=dict)
    claims_checks: dict[JobKey, tuple[float, str, str | None]] = field(default_factory=dict)
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
    # The last transient error creating a job's children (reported once, retried each sweep).
    retrying: dict[JobKey, str] = field(default_factory=dict)
    # Jobs whose children the namespace's ResourceQuota had no room for: (uid, generation,
    # monotonic time of the refusal), so they are not retried every sweep (jobs.py).
    over_quota: dict[JobKey, tuple[str, int, float]] = field(default_factory=dict)
    policy_loops: Any = None  # supervision.PolicyLoops, made at startup
    # Per policy, the published model versions its latest round adopted (phase -> algorithm ->
    # ModelRef), so that admission steps serve what the round served. Lost on restart: the
    # first round lists them again.
    adopted: dict[PolicyKey, Any] = field(default_factory=dict)
    # Per policy, the published versions serving ("phase/algorithm" -> version), for the
    # decision log of admission steps.
    served_versions: dict[PolicyKey, dict[str, int | None]] = field(default_factory=dict)
    # Per policy, the cycle guard its unsettled (learned) rounds go through
    # (policies/cycle_guard.py): the counts each job held since anything else changed.
    cycle_guards: dict[PolicyKey, CycleGuard] = field(default_factory=dict)
    # Whether this replica may write (controller/process/leadership.py); it does unless it stands by.
    leadership: Leadership = field(default_factory=Leadership)
    # Grouping (pools.py): each job's pool as the latest decision left it, and each policy's
    # status.groups as last queued; newer than the index until the status writes come back.
    groups: dict[JobKey, Any] = field(default_factory=dict)
    policy_groups: dict[PolicyKey, list] = field(default_factory=dict)
    # Each policy's status.admittedJobs / waitingJobs as last queued (loop.job_counts).
    policy_counts: dict[PolicyKey, dict[str, int]] = field(default_factory=dict)
    # Each policy's status.workConservation as last queued (conservation.py): the count of
    # rounds in a row not work conserving goes on from it, not from a status not yet written.
    work_conservation: dict[PolicyKey, dict[str, Any]] = field(default_factory=dict)
    # Each policy's ModelInDomain status as last queued ("True" | "False" | "Unknown", None:
    # absent), so its Events follow changes of the condition, not of a status not yet written.
    model_domain: dict[PolicyKey, str | None] = field(default_factory=dict)
    # Each policy's regret guard between rounds (controller/scheduling/guard.py: its records of the
    # current window, its state); absent without spec.guard.
    guards: dict[PolicyKey, Any] = field(default_factory=dict)
    # Each policy's fair share of contended GPUs at its latest step (fair_share.py); absent
    # while nothing bounds it.
    fair_shares: dict[PolicyKey, Any] = field(default_factory=dict)
    policy_nodes: dict[PolicyKey, dict[str, str]] = field(default_factory=dict)  # node → label
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
                   models=ModelResolver(config.model_cache_dir, read_configmap, config.model_dirs,
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
        self.job_bodies.pop(key, None)
        self.written_status.forget(key)
        self.counts_due.pop(key, None)
        self.reconciled.pop(key, None)
        for stuck in [k for k in self.short_since if k[0] == key]:
            del self.short_since[stuck]
        self.unseen_since.pop(key, None)
        self.creating_since.pop(key, None)
        self.creating_checks.pop(key, None)
        self.claims_since.pop(key, None)
        self.claims_checks.pop(key, None)
        self.retrying.pop(key, None)
        self.over_quota.pop(key, None)
        self.waiting.pop(key, None)
        self.preflight.forget(key)
        self.refusals.forget(key)
        self.placements.forget(key)
        self.services.forget(key)
        self.reservations.release(key)
        self.failures.forget(key)
        self.progress.pop(key, None)
        self.groups.pop(key, None)

"""The operator's in-memory state, each part owned by the module that changes it.

The `Runtime` (runtime.py) holds the seams (config, API, models, metrics, leadership) and one
object per owner below; a function is passed the owner it reads or changes, not the whole
Runtime, where that is all it needs. A job is forgotten by one `forget_job(key)` per owner
(`Runtime.forget_job` calls each). Everything here is lost on an operator restart; each book
says why that is fine (books.py, displacement.py, preflight.py, written_status.py).

    PodBooks     our pods as last seen: pins in flight, lifecycle-relevant states, problem
                 clocks, kube-scheduler's refusals, nodes being vacated
    JobState     per job between its events: handler books, progress reports, why it waits,
                 status patches in flight, due lifecycle evaluations, dry-run verdicts,
                 the policy of jobs deleted lately
    ClusterView  the kopf indexes as read, and what the node and namespace handlers last saw
    Scheduling   what the policies' steps keep: per-policy books, decided placements,
                 reservations, Services, restarts, pools, wake-ups, the round lock, loops
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from mlsched.controller.kube.written_status import WrittenStatus
from mlsched.controller.objects.job_records import JobRecord
from mlsched.controller.objects.preflight import Preflight
from mlsched.controller.objects.records import NodeRecord
from mlsched.controller.objects.services import ServiceBook
from mlsched.controller.scheduling.books import (
    DueJobs, FailureBook, JobBooks, PlacementBook, PodClocks, PodStates, PolicyBooks, ReservationBook,
    Wakeups,
)
from mlsched.controller.scheduling.cluster_fit import ClusterFit
from mlsched.controller.scheduling.displacement import Refusals, Vacating
from mlsched.controller.scheduling.indexes import Indexes, JobKey, PolicyKey, flatten

MAX_DEPARTED = 10_000  # deleted jobs whose policy is remembered (JobState.departed)


@dataclass
class PodBooks:
    """Changed by the pod handlers (app/pod_events.py, app/pod_problems.py) and displacement."""

    # Pods pinned but not yet seen ungated (uid → node): a burst of watch events for one pod
    # then costs one patch, not one per event.
    pinned: dict[str, str] = field(default_factory=dict)
    # What the lifecycle reads of each pod, as last seen (books.PodStates).
    states: PodStates = field(default_factory=PodStates)
    # Since when each job's pods have shown a problem (books.PodClocks).
    clocks: PodClocks = field(default_factory=PodClocks)
    # Nodes kube-scheduler refused each job's pods on lately, avoided when they are placed
    # again (displacement.py).
    refusals: Refusals = field(default_factory=Refusals)
    # Nodes our pods are leaving, for the jobs' conditions (displacement.Vacating).
    vacating: Vacating = field(default_factory=Vacating)

    def forget_job(self, key: JobKey) -> None:
        self.clocks.forget(key)
        self.refusals.forget(key)


@dataclass
class JobState:
    """Changed by the MLJob handlers (app/jobs.py, app/job_lifecycle.py), the progress
    endpoint and the steps (why a job waits)."""

    # What the MLJob handlers keep of each job between its events (books.JobBooks).
    books: JobBooks = field(default_factory=JobBooks)
    # Latest accepted progress report per job (epochs, epoch seconds, speed): newer than the
    # index until the status patch comes back through the watch.
    progress: dict[JobKey, tuple[float, float, float, float | None]] = field(default_factory=dict)
    # Why each job its policy's latest round or admission step gave nothing still waits
    # (waiting.py): the message of its Admitted=False condition.
    waiting: dict[JobKey, str] = field(default_factory=dict)
    # The lifecycle's status patches not yet seen in the job's watch (written_status.py).
    written_status: WrittenStatus = field(default_factory=WrittenStatus)
    # Jobs to evaluate now (a pod changed), and those being evaluated: one at a time per job.
    due: DueJobs = field(default_factory=DueJobs)
    # Each job's dry-run verdict: would the API server create its pods (preflight.py)?
    preflight: Preflight = field(default_factory=Preflight)
    # When a round last changed each running job's counts (a rescale; wall time): its pods
    # made before then measured their samples/s at the old counts (progress_server.py).
    counts_since: dict[JobKey, float] = field(default_factory=dict)
    # The policy of each job deleted lately, for the deletion of its pods (which outlive it)
    # to wake that policy's admission. The latest MAX_DEPARTED only; kept past forget_job.
    departed: dict[JobKey, str] = field(default_factory=dict)

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
        self.books.forget(key)
        self.written_status.forget(key)
        self.waiting.pop(key, None)
        self.preflight.forget(key)
        self.progress.pop(key, None)
        self.counts_since.pop(key, None)


@dataclass
class ClusterView:
    """The kopf indexes (set at startup, app/watched.py) and what the node and namespace
    handlers saw last (app/handlers.py). Holds nothing per job."""

    indexes: Indexes | None = None
    # Each node's record as last seen by the node handler: a change wakes admission.
    node_states: dict[str, NodeRecord] = field(default_factory=dict)
    # Each namespace's labels as last seen: a change asks again about its refused jobs' pods.
    namespace_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    _fit: tuple[float, Any, ClusterFit] | None = None

    def fit(self, idx: Indexes, node_selector: Any, tolerated_taints: Any) -> ClusterFit:
        """The schedulable nodes summed, at most once a second (a sweep asks once per job)."""
        now = time.monotonic()
        if self._fit is None or self._fit[1] is not idx.nodes or now - self._fit[0] > 1.0:
            fit = ClusterFit.of(flatten(idx.nodes), node_selector=node_selector,
                                tolerated_taints=tolerated_taints)
            self._fit = (now, idx.nodes, fit)
        return self._fit[2]

    def forget_job(self, key: JobKey) -> None:
        """Nothing to forget: the indexes are kopf's, the rest is per node and namespace."""


@dataclass
class Scheduling:
    """Changed by the policies' steps (step.py, rounds.py, admitting.py, pool_steps.py) and
    their loops (loop.py, process/supervision.py)."""

    # What is kept of each policy between its steps, forgotten together (books.PolicyBooks).
    per_policy: PolicyBooks = field(default_factory=PolicyBooks)
    placements: PlacementBook = field(default_factory=PlacementBook)
    reservations: ReservationBook = field(default_factory=ReservationBook)
    services: ServiceBook = field(default_factory=ServiceBook)  # whose headless Service exists
    failures: FailureBook = field(default_factory=FailureBook)
    # Grouping (pools.py): each job's pool as the latest decision left it; newer than the
    # index until the status writes come back.
    groups: dict[JobKey, Any] = field(default_factory=dict)
    # Policies named by jobs or node labels but missing from the index: since when (jobs.py).
    orphans: dict[PolicyKey, float] = field(default_factory=dict)
    wakeups: Wakeups = field(default_factory=Wakeups)
    round_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    policy_loops: Any = None  # supervision.PolicyLoops, made at startup

    def forget_job(self, key: JobKey) -> None:
        self.placements.forget(key)
        self.services.forget(key)
        self.reservations.release(key)
        self.failures.forget(key)
        self.groups.pop(key, None)

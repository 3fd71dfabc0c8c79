"""The runtime's small in-memory books: what each step decided per job (`PlacementBook`),
what each policy reserved (`ReservationBook`), jobs due a lifecycle check (`DueJobs`), pod
states seen (`PodStates`), wake-ups of the policy loops (`Wakeups`), container restarts
(`FailureBook`); and, grouped by owner so that each is forgotten in one call, what is kept per
policy between its steps (`PolicyBooks`), the pod-problem clocks (`PodClocks`) and what the
MLJob handlers keep per job (`JobBooks`). Each says what is lost on an operator restart and
why that is fine."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from mlsched.controller.dataset.rewards import OpenInterval
from mlsched.controller.objects.records import PodRecord
from mlsched.controller.objects.quantities import Resources
from mlsched.controller.scheduling.indexes import JobKey, PolicyKey
from mlsched.policies.cycle_guard import CycleGuard


class PlacementBook:
    """The node decided for each task ordinal, for pods that appear between rounds.

    Lost on restart: the first round of each policy runs right away and refills it; until
    then new pods simply stay gated.
    """

    def __init__(self) -> None:
        self._nodes: dict[JobKey, Mapping[str, tuple[str, ...]]] = {}
        # Jobs whose decision is recorded here but not yet applied (a round or an admission
        # step between deciding and its patches' answers), with how many steps apply it.
        self._applying: dict[JobKey, int] = {}
        self._applied: dict[JobKey, asyncio.Event] = {}  # set when the last of them is done

    def set(self, key: JobKey, nodes: Mapping[str, tuple[str, ...]]) -> None:
        self._nodes[key] = dict(nodes)

    @contextlib.contextmanager
    def applying(self, keys: Iterable[JobKey]) -> Iterator[None]:
        """While a step applies its decision for these jobs. A StatefulSet's watch event from
        before the step's own scaling must not be taken for a hand edit then: scaling it
        back with a replicas-only patch ahead of the step's patch made the StatefulSet
        controller start pods from the old template, which the step's template then
        replaced (seen in bench_e2e: pods deleted and pinned twice, "Restored" on jobs nobody
        touched)."""
        keys = list(keys)
        for key in keys:
            self._applying[key] = self._applying.get(key, 0) + 1
            self._applied.setdefault(key, asyncio.Event())
        try:
            yield
        finally:
            for key in keys:
                left = self._applying.get(key, 0) - 1
                if left > 0:
                    self._applying[key] = left
                else:
                    self._applying.pop(key, None)
                    self._applied.pop(key).set()

    def being_applied(self, key: JobKey) -> bool:
        return key in self._applying

    async def settled(self, key: JobKey) -> None:
        """Return once no step is applying a decision for this job (at once if none is)."""
        while (done := self._applied.get(key)) is not None:
            await done.wait()

    def node_for(self, key: JobKey, role: str, ordinal: int) -> str | None:
        nodes = self._nodes.get(key, {}).get(role, ())
        return nodes[ordinal] if ordinal < len(nodes) else None

    def forget(self, key: JobKey) -> None:
        self._nodes.pop(key, None)

    def of(self, key: JobKey) -> Mapping[str, tuple[str, ...]] | None:
        return self._nodes.get(key)


class ReservationBook:
    """What each policy's latest round allotted, per job and node (catalog demands).

    Other policies subtract it from capacity even before the pods exist. Lost on restart: the
    pods that exist by then are counted instead (cluster_state.held_elsewhere).
    """

    def __init__(self) -> None:
        self._by_policy: dict[PolicyKey, dict[JobKey, dict[str, Resources]]] = {}

    def set(self, policy: PolicyKey, usage: dict[JobKey, dict[str, Resources]]) -> None:
        self._by_policy[policy] = usage

    def add(self, policy: PolicyKey, usage: dict[JobKey, dict[str, Resources]]) -> None:
        """An admission step's grants, on top of the policy's latest round."""
        self._by_policy.setdefault(policy, {}).update(usage)

    def all(self) -> dict[JobKey, dict[str, Resources]]:
        return {job: usage for usage_by_job in self._by_policy.values()
                for job, usage in usage_by_job.items()}

    def usage_of(self, job: JobKey) -> dict[str, Resources] | None:
        """What the job's latest decision reserved, per node; None if none is known."""
        for usage in self._by_policy.values():
            if job in usage:
                return usage[job]
        return None

    def gpus(self, policy: PolicyKey) -> float:
        """The GPUs the policy's jobs hold as decided."""
        return sum(r[1] for usage in self._by_policy.get(policy, {}).values()
                   for r in usage.values())

    def release(self, job: JobKey) -> None:
        for usage in self._by_policy.values():
            usage.pop(job, None)

    def drop_policy(self, policy: PolicyKey) -> None:
        self._by_policy.pop(policy, None)


class DueJobs:
    """Jobs whose lifecycle (phase, conditions) is to be evaluated now, not at the next sweep:
    a pod of theirs changed (Ready, failed, deleted) or a StatefulSet rolled. The sweep alone
    left a burst of 300 jobs `Pending` two minutes after their pods were Ready (issue 55).
    Marks within COALESCE_S are taken together, so a job whose pods change at once is looked
    at once."""

    COALESCE_S = 0.1

    def __init__(self) -> None:
        self._due: dict[JobKey, None] = {}  # insertion-ordered: the first marked go first
        self._event: asyncio.Event | None = None

    def _signal(self) -> asyncio.Event:
        if self._event is None:
            self._event = asyncio.Event()
        return self._event

    def mark(self, key: JobKey) -> None:
        self._due[key] = None
        self._signal().set()

    async def take(self) -> list[JobKey]:
        """Wait for a mark, let the burst it is part of gather, and take every job marked."""
        event = self._signal()
        await event.wait()
        await asyncio.sleep(self.COALESCE_S)
        event.clear()
        due, self._due = list(self._due), {}
        return due


class PodStates:
    """What the lifecycle reads of each pod of ours, as last seen: a pod event that changes
    none of it (a pin, a binding, a kubelet heartbeat) marks no job due (DueJobs)."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple] = {}  # uid → state

    def changed(self, pod: PodRecord, gone: bool = False) -> bool:
        if gone:  # its going changes its job's counts
            self._seen.pop(pod.uid, None)
            return True
        state = (pod.ready, pod.phase, pod.deleting, pod.restarts, pod.completed,
                 pod.unschedulable, pod.stuck, pod.creating, pod.claims_unmade, pod.unseen)
        before = self._seen.get(pod.uid)
        self._seen[pod.uid] = state
        return before != state


class Wakeups:
    """Why a policy's loop should act before its next interval: `admission` (a job arrived,
    finished or got its StatefulSets) or `policy` (its spec was edited). Signals that arrive
    while the loop is busy are kept, so none is lost, and a burst is answered once."""

    def __init__(self) -> None:
        self._events: dict[PolicyKey, asyncio.Event] = {}
        self._reasons: dict[PolicyKey, set[str]] = {}
        self._count: dict[PolicyKey, int] = {}  # signals so far: has another come since?

    def _event(self, policy: PolicyKey) -> asyncio.Event:
        return self._events.setdefault(policy, asyncio.Event())

    def signal(self, policy: PolicyKey, reason: str) -> None:
        self._reasons.setdefault(policy, set()).add(reason)
        self._count[policy] = self._count.get(policy, 0) + 1
        self._event(policy).set()

    def signals(self, policy: PolicyKey) -> int:
        """How many signals the policy has had: unchanged over a pause means a burst ended."""
        return self._count.get(policy, 0)

    async def wait(self, policy: PolicyKey, timeout: float) -> set[str]:
        """The reasons signalled (cleared on return); empty when `timeout` passed first."""
        event = self._event(policy)
        if not event.is_set():
            try:
                await asyncio.wait_for(event.wait(), timeout)
            except TimeoutError:
                return set()
        event.clear()
        return self._reasons.pop(policy, set())

    def peek(self, policy: PolicyKey) -> set[str]:
        return set(self._reasons.get(policy, ()))

    def drop(self, policy: PolicyKey, reason: str) -> None:
        """`reason` is being answered now; a signal after this wakes the loop again."""
        reasons = self._reasons.get(policy, set())
        reasons.discard(reason)
        if not reasons:
            self._event(policy).clear()

    def forget(self, policy: PolicyKey) -> None:
        self._events.pop(policy, None)
        self._reasons.pop(policy, None)
        self._count.pop(policy, None)


class FailureBook:
    """Pod failures per job for backoffLimit, counted from each pod's restarts as they grow: a
    restart that followed an exit 0 is not one (StatefulSet pods restart whatever the exit
    code). Per pod uid, so pods that were replaced still count. Lost on restart (then only live
    pods count, each restart seen then as a failure unless the latest followed an exit 0)."""

    def __init__(self) -> None:
        self._seen: dict[JobKey, dict[str, tuple[int, int]]] = {}  # uid → (restarts, failures)
        self._last: dict[JobKey, str] = {}  # "pod p: container c exited with code 3 (Error)"

    def observe(self, job: JobKey, uid: str, restarts: int, last_exit_zero: bool = False,
                pod: str = "", failure: str | None = None) -> None:
        """`failure`: the pod's latest non-zero exit (PodRecord.last_failure), kept as the
        job's last when this observation counts a new failure."""
        pods = self._seen.setdefault(job, {})
        seen, failures = pods.get(uid, (0, 0))
        if restarts > seen:
            new = restarts - seen - (1 if last_exit_zero else 0)
            failures += new
            if new > 0 and failure:
                self._last[job] = f"pod {pod}: {failure}" if pod else failure
        pods[uid] = (max(seen, restarts), failures)

    def total(self, job: JobKey) -> int:
        return sum(failures for _, failures in self._seen.get(job, {}).values())

    def last(self, job: JobKey) -> str | None:
        return self._last.get(job)

    def forget(self, job: JobKey) -> None:
        self._seen.pop(job, None)
        self._last.pop(job, None)


@dataclass
class PodClocks:
    """Since when each job's pods have shown a problem, for the Events and conditions that say
    why they do not run (app/pod_problems.py). Lost on restart: each clock starts again, so a
    problem is told a grace period later than it could have been."""

    # (job, StatefulSet) -> (since when it has been seen with fewer pods than replicas and
    # none created, how many pods it had then) (pods_refused).
    short_since: dict[tuple[JobKey, str], tuple[float, int]] = field(default_factory=dict)
    # job -> pod uid -> when the pod was first seen pinned, ungated and with no word from any
    # scheduler (unscheduled). Per job: a sweep touches one job's clocks, not everyone's.
    unseen_since: dict[JobKey, dict[str, float]] = field(default_factory=dict)
    # job -> pod uid -> when the pod was first seen bound with its containers still being
    # created; per job, the latest read of such a pod's Warning Events: (when, pod, why or
    # None) (stuck_creating).
    creating_since: dict[JobKey, dict[str, float]] = field(default_factory=dict)
    creating_checks: dict[JobKey, tuple[float, str, str | None]] = field(default_factory=dict)
    # The same for pods whose ResourceClaims have not been made (claims_unmade).
    claims_since: dict[JobKey, dict[str, float]] = field(default_factory=dict)
    claims_checks: dict[JobKey, tuple[float, str, str | None]] = field(default_factory=dict)

    def forget(self, job: JobKey) -> None:
        for stuck in [k for k in self.short_since if k[0] == job]:
            del self.short_since[stuck]
        for clocks in (self.unseen_since, self.creating_since, self.creating_checks,
                       self.claims_since, self.claims_checks):
            clocks.pop(job, None)


@dataclass
class PolicyBooks:
    """What the runtime keeps of each SchedulingPolicy between its steps, forgotten together
    when its loop ends (`forget`). Lost on restart: the first round rebuilds each (the open
    interval from status.openInterval, rewards.restore)."""

    # The interval each policy's latest round opened (rewards.py).
    intervals: dict[PolicyKey, OpenInterval] = field(default_factory=dict)
    # The published model versions its latest round adopted (phase -> algorithm -> ModelRef),
    # so that admission steps serve what the round served.
    adopted: dict[PolicyKey, Any] = field(default_factory=dict)
    # The published versions serving ("phase/algorithm" -> version), for the decision log of
    # admission steps.
    served_versions: dict[PolicyKey, dict[str, int | None]] = field(default_factory=dict)
    # The cycle guard its unsettled (learned) rounds go through (policies/cycle_guard.py): the
    # counts each job held since anything else changed.
    cycle_guards: dict[PolicyKey, CycleGuard] = field(default_factory=dict)
    # status.admittedJobs / waitingJobs / bookedGpus / fairShare as last queued (job_counts).
    policy_counts: dict[PolicyKey, dict[str, Any]] = field(default_factory=dict)
    # status.workConservation as last queued (conservation.py): the count of rounds in a row
    # not work conserving goes on from it, not from a status not yet written.
    work_conservation: dict[PolicyKey, dict[str, Any]] = field(default_factory=dict)
    # The ModelInDomain status as last queued ("True" | "False" | "Unknown", None: absent), so
    # its Events follow changes of the condition, not of a status not yet written.
    model_domain: dict[PolicyKey, str | None] = field(default_factory=dict)
    # The regret guard between rounds (guard.py: its records of the current window, its
    # state); absent without spec.guard.
    guards: dict[PolicyKey, Any] = field(default_factory=dict)
    # Harmony's grouping guard (grouping_guard.py: the candidate in force, its history of
    # arrivals, the co-location error); absent unless the policy groups with guarded harmony.
    grouping_guards: dict[PolicyKey, Any] = field(default_factory=dict)
    # The fair share of contended GPUs at its latest step (fair_share.py); absent while
    # nothing bounds it.
    fair_shares: dict[PolicyKey, Any] = field(default_factory=dict)
    # Grouping (pools.py): status.groups as last queued, and the pool label of each node it
    # labelled (node -> label).
    policy_groups: dict[PolicyKey, list] = field(default_factory=dict)
    policy_nodes: dict[PolicyKey, dict[str, str]] = field(default_factory=dict)

    def forget(self, policy: PolicyKey) -> None:
        for book in (self.intervals, self.adopted, self.served_versions, self.cycle_guards,
                     self.policy_counts, self.work_conservation, self.model_domain, self.guards,
                     self.grouping_guards, self.fair_shares, self.policy_groups, self.policy_nodes):
            book.pop(policy, None)


@dataclass
class JobBooks:
    """What the MLJob handlers (app/jobs.py) keep of each job between its events, forgotten
    together when the job is (`forget`). Lost on restart: every job is reconciled once again,
    and a refusal or a transient error is met (and reported) again."""

    # The latest body of each MLJob (from its watch events), for the lifecycle sweep.
    job_bodies: dict[JobKey, dict[str, Any]] = field(default_factory=dict)
    # Jobs being evaluated, each with whether it was marked due meanwhile (jobs.sync_job).
    # Not forgotten: the evaluation in flight clears its own entry.
    syncing: dict[JobKey, bool] = field(default_factory=dict)
    # Jobs whose change of pod counts alone waits to be written, until when (loop time;
    # jobs.counts_wait).
    counts_due: dict[JobKey, float] = field(default_factory=dict)
    # (uid, generation) whose children were created and templates refreshed: a watch event
    # of another generation (an edit) reconciles again.
    reconciled: dict[JobKey, tuple[str, int]] = field(default_factory=dict)
    # The last transient error creating a job's children (reported once, retried each sweep).
    retrying: dict[JobKey, str] = field(default_factory=dict)
    # Jobs whose children the namespace's ResourceQuota had no room for: (uid, generation,
    # monotonic time of the refusal), so they are not retried every sweep.
    over_quota: dict[JobKey, tuple[str, int, float]] = field(default_factory=dict)

    def forget(self, job: JobKey) -> None:
        for book in (self.job_bodies, self.counts_due, self.reconciled, self.retrying,
                     self.over_quota):
            book.pop(job, None)

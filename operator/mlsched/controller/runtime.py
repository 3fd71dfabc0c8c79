"""Operator-wide state shared by the handlers, the scheduling loops and the progress endpoint.

kopf passes it around as `memo.runtime`. Besides the seams (API, Events, metrics) it keeps a few
small in-memory books; each says below what is lost on an operator restart and why that is fine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mlsched.controller.config import OperatorConfig
from mlsched.controller.desired import PodSettings
from mlsched.controller.events import Recorder
from mlsched.controller.kube import KubeApi
from mlsched.controller.metrics import Metrics
from mlsched.controller.models import ModelResolver
from mlsched.controller.records import JobRecord, NodeRecord, PodRecord, Resources, StsRecord
from mlsched.controller.rewards import OpenInterval
from mlsched.controller.snapshot import ClusterState

JobKey = tuple[str, str]
PolicyKey = tuple[str, str]


def values(index: Mapping[Any, Iterable[Any]], key: Any) -> list[Any]:
    """The values stored under one key of a kopf index (or of a dict of lists in tests)."""
    return list(index.get(key, ()))


def flatten(index: Mapping[Any, Iterable[Any]]) -> list[Any]:
    return [v for store in index.values() for v in store]


@dataclass
class Indexes:
    """kopf's in-memory indexes (live objects: they update as watch events arrive)."""

    nodes: Mapping[str, Iterable[NodeRecord]]
    pods: Mapping[JobKey, Iterable[PodRecord]]
    statefulsets: Mapping[JobKey, Iterable[StsRecord]]
    foreign: Mapping[str, Iterable[Resources]]
    mljobs: Mapping[JobKey, Iterable[JobRecord]]
    policies: Mapping[PolicyKey, Iterable[Any]]

    def cluster(self) -> ClusterState:
        return ClusterState(nodes=flatten(self.nodes), pods=self.pods,
                            statefulsets=self.statefulsets, foreign=self.foreign)

    def job(self, namespace: str, name: str) -> JobRecord | None:
        found = values(self.mljobs, (namespace, name))
        return found[0] if found else None

    def jobs_of_policy(self, namespace: str, policy: str) -> list[JobRecord]:
        return [j for j in flatten(self.mljobs) if j.namespace == namespace and j.policy == policy]


class PlacementBook:
    """The node decided for each task ordinal, for pods that appear between rounds.

    Lost on restart: the first round of each policy runs right away and refills it; until
    then new pods simply stay gated.
    """

    def __init__(self) -> None:
        self._nodes: dict[JobKey, Mapping[str, tuple[str, ...]]] = {}

    def set(self, key: JobKey, nodes: Mapping[str, tuple[str, ...]]) -> None:
        self._nodes[key] = dict(nodes)

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
    pods that exist by then are counted instead (snapshot.held_elsewhere).
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

    def release(self, job: JobKey) -> None:
        for usage in self._by_policy.values():
            usage.pop(job, None)

    def drop_policy(self, policy: PolicyKey) -> None:
        self._by_policy.pop(policy, None)


class Wakeups:
    """Why a policy's loop should act before its next interval: `admission` (a job arrived,
    finished or got its StatefulSets) or `policy` (its spec was edited). Signals that arrive
    while the loop is busy are kept, so none is lost, and a burst is answered once."""

    def __init__(self) -> None:
        self._events: dict[PolicyKey, asyncio.Event] = {}
        self._reasons: dict[PolicyKey, set[str]] = {}

    def _event(self, policy: PolicyKey) -> asyncio.Event:
        return self._events.setdefault(policy, asyncio.Event())

    def signal(self, policy: PolicyKey, reason: str) -> None:
        self._reasons.setdefault(policy, set()).add(reason)
        self._event(policy).set()

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


class FailureBook:
    """Pod failures per job for backoffLimit: the highest restart count seen per pod uid, so
    pods that were replaced still count. Lost on restart (then only live pods count)."""

    def __init__(self) -> None:
        self._seen: dict[JobKey, dict[str, int]] = {}

    def observe(self, job: JobKey, uid: str, failures: int) -> None:
        pods = self._seen.setdefault(job, {})
        pods[uid] = max(pods.get(uid, 0), failures)

    def total(self, job: JobKey) -> int:
        return sum(self._seen.get(job, {}).values())

    def forget(self, job: JobKey) -> None:
        self._seen.pop(job, None)


@dataclass
class Runtime:
    config: OperatorConfig
    api: KubeApi
    models: ModelResolver
    metrics: Metrics = field(default_factory=Metrics)
    placements: PlacementBook = field(default_factory=PlacementBook)
    reservations: ReservationBook = field(default_factory=ReservationBook)
    failures: FailureBook = field(default_factory=FailureBook)
    intervals: dict[PolicyKey, OpenInterval] = field(default_factory=dict)
    # Latest accepted progress report per job (epochs, epoch seconds, speed): newer than the
    # index until the status patch comes back through the watch.
    progress: dict[JobKey, tuple[float, float, float]] = field(default_factory=dict)
    # Pods pinned but not yet seen ungated (uid → node): a burst of watch events for one pod
    # then costs one patch, not one per event.
    pinned: dict[str, str] = field(default_factory=dict)
    indexes: Indexes | None = None
    round_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    wakeups: Wakeups = field(default_factory=Wakeups)

    def __post_init__(self) -> None:
        self.recorder = Recorder(self.api)
        self.pod_settings = PodSettings(progress_url=self.config.progress_url,
                                        token_audience=self.config.token_audience)

    @classmethod
    def create(cls, config: OperatorConfig, api: KubeApi) -> Runtime:
        async def read_configmap(namespace: str, name: str):
            return await api.get("ConfigMap", namespace, name)

        return cls(config=config, api=api,
                   models=ModelResolver(config.model_cache_dir, read_configmap, config.model_dirs,
                                        config.max_model_bytes))

    def epochs_done(self, job: JobRecord) -> float:
        """The newest progress known: the index, or a report whose status write is in flight."""
        cached = self.progress.get(job.key)
        return max(job.epochs_done, cached[0] if cached else 0.0)

    def forget_job(self, key: JobKey) -> None:
        self.placements.forget(key)
        self.reservations.release(key)
        self.failures.forget(key)
        self.progress.pop(key, None)

"""The operator process under kopf: kopf's settings (`configure`), startup (the runtime,
writers, leader election, the progress endpoint, the policy loops and sweeps) and cleanup,
and the helpers every handler uses to reach the runtime (`runtime`) and wake the policy
loops (`wake_all_admissions`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from typing import Any

import kopf
import kubernetes.client
import kubernetes.watch

from mlsched.api import GROUP
from mlsched.controller.app import jobs
from mlsched.controller.progress import progress_server
from mlsched.controller.objects.cluster_pods import OtherNamespaceClaims, OtherNamespacePods
from mlsched.controller.kube.kube import ClientKubeApi
from mlsched.controller.process.leadership import (Leadership, elect, label_own_pod,
                                           unlabel_previous_leader)
from mlsched.controller.scheduling.loop import run_policy_forever
from mlsched.controller.process.loop_health import LoopHealth
from mlsched.controller.process.relists import Gone, Relists
from mlsched.controller.scheduling.runtime import Runtime
from mlsched.controller.scheduling.state import Scheduling
from mlsched.controller.scheduling.indexes import flatten
from mlsched.controller.process.supervision import LiveBody, PolicyLoops, sweep_forever
from mlsched.controller.app.watched import CONFIG, INDEXED, indexes_from


class UnusedDiffBase(kopf.AnnotationsDiffBaseStorage):
    """kopf builds a diff base for every watch event of every watched resource (a deep copy of
    the body, status and all), which only change handlers (on.create/update) read. We register
    none (supervision.py says why), so it is never built or read here: under a burst of pod
    and StatefulSet events that copy was the operator's largest single cost (py-spy, 12 % of
    its CPU). Keys stay ours, so nothing kopf would write could land outside our prefix."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None


def configure(settings: kopf.OperatorSettings) -> None:
    """kopf's bookkeeping in annotations under our prefix (decision in mlsched/api/__init__.py)."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP, v1=False)
    settings.persistence.diffbase_storage = UnusedDiffBase(
        prefix=GROUP, key="last-handled-configuration", v1=False)
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    # Only problems become Events from kopf itself; our own Events are posted explicitly.
    settings.posting.level = logging.WARNING



def runtime(memo: Any) -> Runtime:
    return memo["runtime"]


async def present(rt: Runtime, plural: str, namespace: str | None) -> set[str]:
    """The uids of `plural` the API server has in `namespace` (None: cluster-scoped)."""
    group, version, _ = INDEXED[plural]
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    scope = f"/namespaces/{namespace}" if namespace else ""
    return await rt.api.uids_at(f"{base}{scope}/{plural}")


async def forget_gone(rt: Runtime, gone: list[Gone]) -> None:
    """What a DELETED event of each would have done: jobs and policies forgotten (their
    loops stopped), capacity that pods, claims or quotas held offered to waiting jobs."""
    for g in gone:
        if g.plural == "schedulingpolicies":
            rt.scheduling.policy_loops.stop((g.namespace or "", g.name))
        elif g.plural == "mljobs":
            key = (g.namespace or "", g.name)
            body = rt.jobs.books.job_bodies.get(key) or {"metadata": {"namespace": key[0], "name": g.name,
                                                           "uid": g.uid}}
            await jobs.on_job_event(rt, "DELETED", body, rt.cluster.indexes)
    wake_all_admissions(rt.scheduling)


# ---------------------------------------------------------------------------- operator


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
    configure(settings)
    # An embedding program (or a test) may have put a Runtime with its own API into the memo.
    rt = memo.get("runtime") or Runtime.create(CONFIG, ClientKubeApi(
        concurrency=CONFIG.api_concurrency, create_concurrency=CONFIG.create_concurrency,
        # Which replica sent a request, in the API server's audit log.
        user_agent=f"mlsched-operator ({CONFIG.leader_identity})"))
    rt.cluster.indexes = indexes_from(kwargs)
    if CONFIG.namespaces and isinstance(rt.api, ClientKubeApi):
        # Nodes are shared: count what other namespaces run on them (cluster_pods.py).
        loop = asyncio.get_running_loop()
        rt.cluster.indexes.other_namespaces = other = OtherNamespacePods(
            CONFIG.namespaces, on_freed=lambda: loop.call_soon_threadsafe(wake_all_admissions, rt.scheduling))
        other.start(rt.api.core.list_pod_for_all_namespaces, lambda: kubernetes.watch.Watch())
        memo["other_namespaces"] = other
        # And the DRA devices their pods' claims hold (dra.py).
        rt.cluster.indexes.other_claims = claims = OtherNamespaceClaims(
            CONFIG.namespaces, on_freed=lambda: loop.call_soon_threadsafe(wake_all_admissions, rt.scheduling))
        # The return type named: the client (37.0) cannot derive the claim's model name from
        # the list function (its models are ResourceV1ResourceClaim), and the events are read
        # as plain dicts anyway (deserialize=False).
        claims.start(kubernetes.client.ResourceV1Api(rt.api.core.api_client)
                     .list_resource_claim_for_all_namespaces,
                     lambda: kubernetes.watch.Watch(return_type="ResourceV1ResourceClaim"))
        memo["other_claims"] = claims
    rt.process.metrics.watch_job_phases(
        lambda: Counter((j.namespace, j.phase or "Unknown", j.reason or "")
                        for j in flatten(rt.cluster.indexes.mljobs)))
    rt.scheduling.policy_loops = policy_loops(rt)
    if CONFIG.leader_election:  # a standby until it wins the Lease (leadership.py)
        rt.process.leadership = Leadership(leading=False)
        rt.scheduling.policy_loops.active = False
        # Nothing is written unless this replica holds the Lease at the moment it is sent:
        # the operator's writes (kube.py) and kopf's own Events of handler failures.
        if isinstance(rt.api, ClientKubeApi):
            rt.api.fence = lambda: rt.process.leadership.leading
        settings.posting.enabled = False
        rt.process.leadership.watchers.append(lambda leading: setattr(settings.posting, "enabled",
                                                                      leading))
    memo["runtime"] = rt
    memo["relists"] = Relists(lambda plural, ns: present(rt, plural, ns),
                              lambda gone: forget_gone(rt, gone),
                              on_relisted=rt.scheduling.services.relisted)
    memo["loop_health_stopped"] = health_stopped = asyncio.Event()
    memo["loop_health"] = asyncio.create_task(LoopHealth(rt.process.metrics.registry).watch(health_stopped),
                                              name="mlsched-loop-health")
    # Before anything renders a pod template: the endpoint's CA becomes part of them.
    memo["server"] = await progress_server.start(rt)
    rt.process.leadership.on_leading(lambda: start_leading(rt, memo))
    if CONFIG.leader_election:
        elect(rt.process.leadership, CONFIG.leader_election, CONFIG.leader_identity,
              rt.api.api_client, asyncio.get_running_loop())


async def move_leader_label(rt: Runtime) -> None:
    """The Service's label onto this replica's pod, off the previous leader's."""
    await label_own_pod(rt.api, True)
    await unlabel_previous_leader(rt.api, rt.process.leadership.previous_holder)


def start_leading(rt: Runtime, memo: kopf.Memo) -> None:
    """What only the leader runs: the scheduling loops and the lifecycle sweep."""
    memo["leader_label"] = asyncio.create_task(move_leader_label(rt), name="mlsched-leader-label")
    rt.scheduling.policy_loops.activate()
    memo["sweep_stopped"] = stopped = asyncio.Event()
    # A replica that just won the Lease sweeps at once: jobs created while it stood by have no
    # children yet (at startup, each job's first watch event does that instead).
    memo["sweep"] = asyncio.create_task(
        sweep_forever(lambda: jobs.sweep(rt, rt.cluster.indexes), CONFIG.job_sync_seconds, stopped,
                      first_after_s=0.0 if CONFIG.leader_election else None),
        name="mlsched-lifecycle-sweep")
    # Between sweeps, the jobs whose pods changed, as they change.
    memo["due"] = asyncio.create_task(jobs.sync_due_forever(rt),
                                      name="mlsched-lifecycle-due")


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    for watch in ("other_namespaces", "other_claims"):
        if watch in memo:
            memo[watch].stop()
    if "sweep" in memo:
        memo["sweep_stopped"].set()
        memo["due"].cancel()
        await asyncio.gather(memo["sweep"], memo["due"], return_exceptions=True)
    await runtime(memo).scheduling.policy_loops.stop_all()
    # Status records still queued get a few seconds; what is left is not lost: each job's
    # status.openInterval lets the next operator close the interval open now.
    await asyncio.gather(runtime(memo).writers.status.flush(timeout=5.0),
                         runtime(memo).writers.objects.flush(timeout=5.0),
                         runtime(memo).writers.events.settled(timeout=5.0))
    server = memo.get("server")
    if server is not None:
        await server.cleanup()
    if "loop_health" in memo:
        memo["loop_health_stopped"].set()
        await asyncio.gather(memo["loop_health"], return_exceptions=True)


# ----------------------------------------------------------------------------- indexes
# An indexer returns {} (never None) for an object that is not, or no longer, to be indexed:
# kopf drops an object's earlier entries when the new result has none of their keys, but keeps
# them all when the result is None. A pod that completed kept holding its node's capacity, a
# PriorityClass no longer the default stayed the default, until the object was deleted.


def policy_loops(rt: Runtime) -> PolicyLoops:
    async def loop(body: LiveBody, stopped: asyncio.Event) -> None:
        async def sleep(seconds: float) -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopped.wait(), seconds)

        await run_policy_forever(rt, body, rt.cluster.indexes, sleep=sleep, stopped=stopped.is_set)

    return PolicyLoops(loop)



def wake_all_admissions(scheduling: Scheduling) -> None:
    """Capacity may have appeared (a node added, Ready again, uncordoned, untainted, grown or
    relabelled; another workload's pod gone): every policy's waiting jobs get an admission
    step now, not at their policy's next round. A policy with nothing waiting does nothing."""
    for key in scheduling.policy_loops.running():
        scheduling.wakeups.signal(key, "admission")


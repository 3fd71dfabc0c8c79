"""kopf handlers: decorators and wiring only; the work is in jobs.py, loop.py and friends.

Run with `python -m mlsched.controller` (see __main__.py) or
`kopf run --standalone -m mlsched.controller.app.handlers` (settings from MLSCHED_* variables).

- Indexes keep compact records of nodes, our pods, other pods' requests per node, our
  StatefulSets, MLJobs and SchedulingPolicies: a round reads memory, never re-lists.
- One task per SchedulingPolicy runs its scheduling loop (supervision.py: started and stopped
  from watch events, so no finalizer is needed); it wakes early for an admission step when a
  job's StatefulSets appear or one of our pods goes away (capacity freed), and for a full
  round when the policy's spec is edited (a new generation). A StatefulSet scaled or
  recreated by hand is scaled back to the decided replicas (with their template) at once;
  not while the decision's own patches are in flight (pod_events.restore_replicas).
- MLJobs: a watch-event handler creates the children of each new generation; one sweep over
  all jobs keeps the lifecycle (phase, conditions, suspend, deadline, backoff, cleanup, TTL)
  current. No kopf change handler, timer or daemon: those need finalizers and annotations.
- A pod event handler pins gated pods created between rounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import kopf
import kubernetes.client
import kubernetes.watch

from mlsched.api import GROUP, VERSION
from mlsched.controller.scheduling import displacement, fair_share
from mlsched.controller.constraints import dra
from mlsched.controller.app import jobs, pod_events
from mlsched.controller.objects import preflight
from mlsched.controller.progress import progress_server
from mlsched.controller.process.config import OperatorConfig
from mlsched.controller.kube.constants import JOB_LABEL
from mlsched.controller.objects.cluster_pods import OtherNamespaceClaims, OtherNamespacePods
from mlsched.controller.constraints.host_ports import host_ports
from mlsched.controller.kube.kube import ClientKubeApi
from mlsched.controller.process.leadership import (Leadership, elect, label_own_pod,
                                           unlabel_previous_leader)
from mlsched.controller.scheduling.loop import run_policy_forever
from mlsched.controller.process.loop_health import LoopHealth
from mlsched.controller.admission.limitranges import limit_range_record
from mlsched.controller.constraints.pod_anti_affinity import node_selectors
from mlsched.controller.constraints.runtimeclasses import runtime_class_record
from mlsched.controller.admission.quotas import global_default_entry, quota_record
from mlsched.controller.process.relists import Gone, Relists
from mlsched.controller.objects.records import node_record, pod_record, sts_record
from mlsched.controller.objects.job_records import job_record
from mlsched.controller.objects.quantities import extended_requests, is_active_pod, pod_requests
from mlsched.controller.scheduling.runtime import Runtime
from mlsched.controller.scheduling.indexes import Indexes, flatten
from mlsched.controller.process.supervision import LiveBody, PolicyLoops, sweep_forever

DRA = ("resource.k8s.io", "v1")  # Dynamic Resource Allocation's API (dra.py)

MLJOBS = (GROUP, VERSION, "mljobs")
POLICIES = (GROUP, VERSION, "schedulingpolicies")
CONFIG = OperatorConfig.from_env()  # read at import: the timer interval is a decorator argument


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


def indexes_from(kwargs: dict[str, Any]) -> Indexes:
    return Indexes(nodes=kwargs["node_index"], pods=kwargs["pod_index"],
                   statefulsets=kwargs["statefulset_index"], foreign=kwargs["foreign_pod_index"],
                   mljobs=kwargs["mljob_index"], policies=kwargs["policy_index"],
                   quotas=kwargs["quota_index"], limit_ranges=kwargs["limit_range_index"],
                   runtime_classes=kwargs["runtime_class_index"],
                   priority_classes=kwargs["priority_class_index"],
                   foreign_ports=kwargs["foreign_port_index"],
                   foreign_extended=kwargs["foreign_extended_index"],
                   foreign_labels=kwargs["foreign_label_index"],
                   foreign_repels=kwargs["foreign_repel_index"],
                   device_classes=kwargs["device_class_index"],
                   resource_slices=kwargs["resource_slice_index"],
                   claim_templates=kwargs["claim_template_index"],
                   resource_claims=kwargs["resource_claim_index"])


def runtime(memo: Any) -> Runtime:
    return memo["runtime"]


# ------------------------------------------------------ objects deleted while a watch was down
#: Each indexed resource: its API group and version, and the indexes it feeds (relists.py).
INDEXED: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "nodes": ("", "v1", ("node_index",)),
    "pods": ("", "v1", ("pod_index", "foreign_pod_index", "foreign_port_index",
                        "foreign_extended_index", "foreign_label_index", "foreign_repel_index")),
    "resourcequotas": ("", "v1", ("quota_index",)),
    "limitranges": ("", "v1", ("limit_range_index",)),
    "priorityclasses": ("scheduling.k8s.io", "v1", ("priority_class_index",)),
    "runtimeclasses": ("node.k8s.io", "v1", ("runtime_class_index",)),
    "deviceclasses": (*DRA, ("device_class_index",)),
    "resourceslices": (*DRA, ("resource_slice_index",)),
    "resourceclaimtemplates": (*DRA, ("claim_template_index",)),
    "resourceclaims": (*DRA, ("resource_claim_index",)),
    "statefulsets": ("apps", "v1", ("statefulset_index",)),
    "mljobs": (*MLJOBS[:2], ("mljob_index",)),
    "schedulingpolicies": (*POLICIES[:2], ("policy_index",)),
}


@kopf.on.event("nodes")
@kopf.on.event("pods")
@kopf.on.event("resourcequotas")
@kopf.on.event("limitranges")
@kopf.on.event("scheduling.k8s.io", "v1", "priorityclasses")
@kopf.on.event("node.k8s.io", "v1", "runtimeclasses")
@kopf.on.event(*DRA, "deviceclasses")
@kopf.on.event(*DRA, "resourceslices")
@kopf.on.event(*DRA, "resourceclaimtemplates")
@kopf.on.event(*DRA, "resourceclaims")
@kopf.on.event("apps", "v1", "statefulsets")
@kopf.on.event(*MLJOBS)
@kopf.on.event(*POLICIES)
async def watch_noted(event: kopf.RawEvent, body: kopf.Body, resource: kopf.Resource,
                      memo: kopf.Memo, **kwargs: Any) -> None:
    """Every event of an indexed resource, noted to find what a listing again leaves out."""
    relists = memo.get("relists")
    if relists is not None and resource.plural in INDEXED:
        relists.note(resource.plural, event.get("type"), body,
                     [kwargs[name] for name in INDEXED[resource.plural][2]])


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
            rt.policy_loops.stop((g.namespace or "", g.name))
        elif g.plural == "mljobs":
            key = (g.namespace or "", g.name)
            body = rt.job_bodies.get(key) or {"metadata": {"namespace": key[0], "name": g.name,
                                                           "uid": g.uid}}
            await jobs.on_job_event(rt, "DELETED", body, rt.indexes)
    wake_all_admissions(rt)


# ---------------------------------------------------------------------------- operator


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
    configure(settings)
    # An embedding program (or a test) may have put a Runtime with its own API into the memo.
    rt = memo.get("runtime") or Runtime.create(CONFIG, ClientKubeApi(
        concurrency=CONFIG.api_concurrency, create_concurrency=CONFIG.create_concurrency,
        # Which replica sent a request, in the API server's audit log.
        user_agent=f"mlsched-operator ({CONFIG.leader_identity})"))
    rt.indexes = indexes_from(kwargs)
    if CONFIG.namespaces and isinstance(rt.api, ClientKubeApi):
        # Nodes are shared: count what other namespaces run on them (cluster_pods.py).
        loop = asyncio.get_running_loop()
        rt.indexes.other_namespaces = other = OtherNamespacePods(
            CONFIG.namespaces, on_freed=lambda: loop.call_soon_threadsafe(wake_all_admissions, rt))
        other.start(rt.api.core.list_pod_for_all_namespaces, lambda: kubernetes.watch.Watch())
        memo["other_namespaces"] = other
        # And the DRA devices their pods' claims hold (dra.py).
        rt.indexes.other_claims = claims = OtherNamespaceClaims(
            CONFIG.namespaces, on_freed=lambda: loop.call_soon_threadsafe(wake_all_admissions, rt))
        # The return type named: the client (37.0) cannot derive the claim's model name from
        # the list function (its models are ResourceV1ResourceClaim), and the events are read
        # as plain dicts anyway (deserialize=False).
        claims.start(kubernetes.client.ResourceV1Api(rt.api.core.api_client)
                     .list_resource_claim_for_all_namespaces,
                     lambda: kubernetes.watch.Watch(return_type="ResourceV1ResourceClaim"))
        memo["other_claims"] = claims
    rt.metrics.watch_job_phases(
        lambda: Counter((j.namespace, j.phase or "Unknown", j.reason or "")
                        for j in flatten(rt.indexes.mljobs)))
    rt.policy_loops = policy_loops(rt)
    if CONFIG.leader_election:  # a standby until it wins the Lease (leadership.py)
        rt.leadership = Leadership(leading=False)
        rt.policy_loops.active = False
        # Nothing is written unless this replica holds the Lease at the moment it is sent:
        # the operator's writes (kube.py) and kopf's own Events of handler failures.
        if isinstance(rt.api, ClientKubeApi):
            rt.api.fence = lambda: rt.leadership.leading
        settings.posting.enabled = False
        rt.leadership.watchers.append(lambda leading: setattr(settings.posting, "enabled",
                                                              leading))
    memo["runtime"] = rt
    memo["relists"] = Relists(lambda plural, ns: present(rt, plural, ns),
                              lambda gone: forget_gone(rt, gone),
                              on_relisted=rt.services.relisted)
    memo["loop_health_stopped"] = health_stopped = asyncio.Event()
    memo["loop_health"] = asyncio.create_task(LoopHealth(rt.metrics.registry).watch(health_stopped),
                                              name="mlsched-loop-health")
    # Before anything renders a pod template: the endpoint's CA becomes part of them.
    memo["server"] = await progress_server.start(rt)
    rt.leadership.on_leading(lambda: start_leading(rt, memo))
    if CONFIG.leader_election:
        elect(rt.leadership, CONFIG.leader_election, CONFIG.leader_identity,
              rt.api.api_client, asyncio.get_running_loop())


async def move_leader_label(rt: Runtime) -> None:
    """The Service's label onto this replica's pod, off the previous leader's."""
    await label_own_pod(rt.api, True)
    await unlabel_previous_leader(rt.api, rt.leadership.previous_holder)


def start_leading(rt: Runtime, memo: kopf.Memo) -> None:
    """What only the leader runs: the scheduling loops and the lifecycle sweep."""
    memo["leader_label"] = asyncio.create_task(move_leader_label(rt), name="mlsched-leader-label")
    rt.policy_loops.activate()
    memo["sweep_stopped"] = stopped = asyncio.Event()
    # A replica that just won the Lease sweeps at once: jobs created while it stood by have no
    # children yet (at startup, each job's first watch event does that instead).
    memo["sweep"] = asyncio.create_task(
        sweep_forever(lambda: jobs.sweep(rt, rt.indexes), CONFIG.job_sync_seconds, stopped,
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
    await runtime(memo).policy_loops.stop_all()
    # Status records still queued get a few seconds; what is left is not lost: each job's
    # status.openInterval lets the next operator close the interval open now.
    await asyncio.gather(runtime(memo).records.flush(timeout=5.0),
                         runtime(memo).objects.flush(timeout=5.0),
                         runtime(memo).recorder.settled(timeout=5.0))
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
NOT_INDEXED: Mapping[str, Any] = MappingProxyType({})


@kopf.index("nodes")
def node_index(name: str, body: kopf.Body, **_: Any):
    return {name: node_record(body)}


@kopf.index("pods", labels={JOB_LABEL: kopf.PRESENT})
def pod_index(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any):
    record = pod_record(body)
    return {(namespace, labels[JOB_LABEL]): record} if record else NOT_INDEXED


@kopf.index("pods", labels={JOB_LABEL: kopf.ABSENT})
def foreign_pod_index(spec: kopf.Spec, body: kopf.Body, **_: Any):
    """Requests of other schedulers' pods per node: capacity our jobs cannot have."""
    node = _bound_to(spec, body)
    return {node: pod_requests(spec)} if node else NOT_INDEXED


def _bound_to(spec: kopf.Spec, body: kopf.Body) -> str | None:
    """The node a pod is bound to, while it holds it (not Succeeded or Failed)."""
    node = spec.get("nodeName")
    return node if node and is_active_pod(body) else None


@kopf.index("pods", labels={JOB_LABEL: kopf.ABSENT})
def foreign_port_index(spec: kopf.Spec, body: kopf.Body, **_: Any):
    """Host ports of other schedulers' pods per node, for those holding any (host_ports.py):
    a node where one holds 29500 takes no task that needs it."""
    node = _bound_to(spec, body)
    ports = host_ports(spec) if node else None
    return {node: ports} if ports else NOT_INDEXED


@kopf.index("pods", labels={JOB_LABEL: kopf.ABSENT})
def foreign_extended_index(spec: kopf.Spec, body: kopf.Body, **_: Any):
    """Extended resources of other schedulers' pods per node, for those requesting any
    (counted_resources.py): a node whose two RDMA NICs another pod holds takes no task
    that needs one."""
    node = _bound_to(spec, body)
    extended = extended_requests(spec) if node else None
    return {node: extended} if extended else NOT_INDEXED


@kopf.index("pods", labels={JOB_LABEL: kopf.ABSENT})
def foreign_label_index(namespace: str, spec: kopf.Spec, labels: kopf.Labels, body: kopf.Body,
                        **_: Any):
    """Node and labels of other schedulers' pods per namespace, for those with labels: a
    job's required anti-affinity keeps its pods off nodes where a matching pod of its
    namespace runs (cluster_state.held_selected)."""
    node = _bound_to(spec, body) if labels else None
    return {namespace: (node, dict(labels))} if node else NOT_INDEXED


@kopf.index("pods", labels={JOB_LABEL: kopf.ABSENT})
def foreign_repel_index(namespace: str, spec: kopf.Spec, body: kopf.Body, **_: Any):
    """Node and required anti-affinity selectors (per node) of other schedulers' pods per
    namespace, for those carrying any: a job pod matching one is kept off that node
    (pod_anti_affinity.py)."""
    node = _bound_to(spec, body)
    selectors = node_selectors(spec) if node else ()
    return {namespace: (node, selectors)} if selectors else NOT_INDEXED


@kopf.index("resourcequotas")
def quota_index(namespace: str, body: kopf.Body, **_: Any):
    """Each namespace's ResourceQuotas: what its rounds may book (quotas.py)."""
    record = quota_record(body)
    return {namespace: record} if record else NOT_INDEXED


@kopf.index("limitranges")
def limit_range_index(namespace: str, body: kopf.Body, **_: Any):
    """Each namespace's LimitRanges: the requests its pods will be given (limitranges.py)."""
    record = limit_range_record(body)
    return {namespace: record} if record else NOT_INDEXED


@kopf.index("scheduling.k8s.io", "v1", "priorityclasses")
def priority_class_index(name: str, body: kopf.Body, **_: Any):
    """The globalDefault PriorityClass: the class of pods whose template names none, which
    PriorityClass-scoped ResourceQuotas count (quotas.py)."""
    return global_default_entry(name, body) or NOT_INDEXED


@kopf.index("node.k8s.io", "v1", "runtimeclasses")
def runtime_class_index(name: str, body: kopf.Body, **_: Any):
    """RuntimeClasses by name: what the pods of a template naming one will be."""
    return {name: runtime_class_record(body)}


# Dynamic Resource Allocation (dra.py). On a cluster without resource.k8s.io/v1 (before
# Kubernetes 1.34) kopf logs that these are not served and the rest runs as before.
@kopf.index(*DRA, "deviceclasses")
def device_class_index(name: str, body: kopf.Body, **_: Any):
    """DeviceClasses by name: which devices a claim of the class can be given."""
    return {name: dra.device_class_record(body)}


@kopf.index(*DRA, "resourceslices")
def resource_slice_index(name: str, body: kopf.Body, **_: Any):
    """Node-local ResourceSlices by name: the devices each node has."""
    record = dra.resource_slice_record(body)
    return {name: record} if record.node else NOT_INDEXED


@kopf.index(*DRA, "resourceclaimtemplates")
def claim_template_index(namespace: str, body: kopf.Body, **_: Any):
    """Each namespace's ResourceClaimTemplates: the devices each pod naming one claims."""
    return {namespace: dra.claim_template_record(body)}


@kopf.index(*DRA, "resourceclaims")
def resource_claim_index(namespace: str, body: kopf.Body, **_: Any):
    """Allocated ResourceClaims by namespace: the devices in use."""
    record = dra.resource_claim_record(body)
    return {namespace: record} if record else NOT_INDEXED


@kopf.index("apps", "v1", "statefulsets", labels={JOB_LABEL: kopf.PRESENT})
def statefulset_index(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any):
    return {(namespace, labels[JOB_LABEL]): sts_record(body)}


@kopf.index(*MLJOBS)
def mljob_index(namespace: str, name: str, body: kopf.Body, **_: Any):
    return {(namespace, name): job_record(body)}


@kopf.index(*POLICIES)
def policy_index(namespace: str, name: str, spec: kopf.Spec, **_: Any):
    """The policies there are, with each one's fair-sharing weight (fair_share.py), which
    every other policy's steps read."""
    return {(namespace, name): fair_share.weight_of(spec)}


# ---------------------------------------------------------------------- scheduling loop


def policy_loops(rt: Runtime) -> PolicyLoops:
    async def loop(body: LiveBody, stopped: asyncio.Event) -> None:
        async def sleep(seconds: float) -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopped.wait(), seconds)

        await run_policy_forever(rt, body, rt.indexes, sleep=sleep, stopped=stopped.is_set)

    return PolicyLoops(loop)


@kopf.on.event(*POLICIES)
async def policy_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Start a policy's loop when it is first seen, stop it when it is deleted; an edited
    algorithm, model or interval takes effect now, not after the old interval."""
    rt = runtime(memo)
    key = (body["metadata"].get("namespace", ""), body["metadata"]["name"])
    if event.get("type") == "DELETED":
        rt.policy_loops.stop(key)
        return
    if rt.leadership.leading:
        await jobs.release_legacy_finalizer(rt, "SchedulingPolicy", body)
    if rt.policy_loops.observe(body):
        rt.wakeups.signal(key, "policy")


def wake_all_admissions(rt: Runtime) -> None:
    """Capacity may have appeared (a node added, Ready again, uncordoned, untainted, grown or
    relabelled; another workload's pod gone): every policy's waiting jobs get an admission
    step now, not at their policy's next round. A policy with nothing waiting does nothing."""
    for key in rt.policy_loops.running():
        rt.wakeups.signal(key, "admission")


@kopf.on.event("nodes")
async def node_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A node whose record (what planning reads: allocatable, Ready, cordon, taints, labels)
    changed, or that was deleted, wakes admission: new capacity admits waiting jobs, lost
    capacity displaces tasks; a kubelet's heartbeat changes none of it and wakes nothing."""
    rt = runtime(memo)
    name = body["metadata"]["name"]
    if event.get("type") == "DELETED":
        # Its jobs' tasks are placed again (displacement.py) once their pods are gone.
        rt.node_states.pop(name, None)
        wake_all_admissions(rt)
        return
    record = node_record(body)
    if rt.node_states.get(name) != record:
        rt.node_states[name] = record
        wake_all_admissions(rt)


@kopf.on.event("pods", labels={JOB_LABEL: kopf.ABSENT})
async def foreign_pod_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo,
                            **_: Any) -> None:
    """Another workload's pod on a node ended or went: its requests are free again."""
    if (body.get("spec") or {}).get("nodeName") and (
            event.get("type") == "DELETED" or not is_active_pod(body)):
        wake_all_admissions(runtime(memo))


@kopf.on.event("resourcequotas")
async def quota_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A quota raised, or its usage recounted after pods went: waiting jobs may fit it now,
    and jobs whose children it had no room for are tried again at the next sweep."""
    rt = runtime(memo)
    namespace = (body.get("metadata") or {}).get("namespace")
    for key in [k for k in rt.over_quota if k[0] == namespace]:
        del rt.over_quota[key]
    wake_all_admissions(rt)


@kopf.on.event("limitranges")
async def limit_range_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo,
                            **_: Any) -> None:
    """Defaults lowered or removed: waiting jobs may fit now (raised: they are decided again
    with the larger requests at the next step, which needs no wake-up of its own)."""
    wake_all_admissions(runtime(memo))


@kopf.on.event("namespaces")
async def namespace_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo,
                          **_: Any) -> None:
    """A namespace relabelled (Pod Security's enforce level, a label a ValidatingAdmissionPolicy
    selects on): its jobs whose pods the API server refused are asked again now, not at their
    next recheck 30 s later (preflight.py)."""
    rt = runtime(memo)
    name = body["metadata"]["name"]
    if event.get("type") == "DELETED":
        rt.namespace_labels.pop(name, None)
        return
    labels = dict(body["metadata"].get("labels") or {})
    before = rt.namespace_labels.get(name)
    rt.namespace_labels[name] = labels
    if before is not None and before != labels and rt.leadership.leading:
        await preflight.namespace_relabelled(rt, name)


@kopf.on.event("scheduling.k8s.io", "v1", "priorityclasses")
async def priority_class_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo,
                               **_: Any) -> None:
    """The globalDefault PriorityClass set, moved or removed: the pods of templates naming no
    class count against other scoped quotas now, so waiting jobs may fit (or, counted anew,
    are told why they wait). Any class event wakes: whether it was the default before an
    edit or deletion is not in the event, and classes change rarely."""
    wake_all_admissions(runtime(memo))


@kopf.on.event("node.k8s.io", "v1", "runtimeclasses")
async def runtime_class_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo,
                              **_: Any) -> None:
    """A RuntimeClass created or changed: jobs naming it may be plannable now."""
    wake_all_admissions(runtime(memo))


@kopf.on.event(*DRA, "deviceclasses")
@kopf.on.event(*DRA, "resourceslices")
@kopf.on.event(*DRA, "resourceclaimtemplates")
async def device_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Devices published, a class or claim template created or changed: jobs claiming them may
    be plannable or fit now."""
    wake_all_admissions(runtime(memo))


@kopf.on.event(*DRA, "resourceclaims")
async def resource_claim_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo,
                               **_: Any) -> None:
    """A claim gone (its pod deleted before), or one made by hand deallocated once its pod
    completed (the claim stays): its devices are free for waiting jobs. (A claim being made
    is unallocated too until kube-scheduler allocates it: a wake that finds nothing more.)"""
    kind = event.get("type")
    if kind == "DELETED" or (kind == "MODIFIED" and dra.resource_claim_record(body) is None):
        wake_all_admissions(runtime(memo))


def wake_admission(rt: Runtime, namespace: str, job_name: str) -> None:
    """Wake the admission of the job's policy; of the policy it had, for a job deleted since
    (its pods go after it, and their going is what frees its capacity: the waiting jobs of its
    policy used to wait for the next round)."""
    job = rt.indexes.job(namespace, job_name) if rt.indexes else None
    policy = job.policy if job is not None else rt.departed.get((namespace, job_name))
    if policy is not None:
        rt.wakeups.signal((namespace, policy), "admission")


@kopf.on.event("apps", "v1", "statefulsets", labels={JOB_LABEL: kopf.PRESENT})
async def statefulset_event(event: kopf.RawEvent, body: kopf.Body, namespace: str,
                            labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
    rt = runtime(memo)
    if not rt.leadership.leading:
        return
    # Its pods rolled to a new revision (a rescale ends when they all have): the job's
    # conditions follow now, not at the next sweep.
    rt.lifecycle_due.mark((namespace, labels[JOB_LABEL]))
    # Scaled or recreated by hand: back to the decided replicas now, not at the next round.
    await pod_events.restore_replicas(rt, event.get("type"), body, rt.indexes)
    # A new job can be admitted once its StatefulSets exist (they are created on arrival).
    if event.get("type") == "ADDED":
        wake_admission(rt, namespace, labels[JOB_LABEL])


@kopf.on.event("services", labels={JOB_LABEL: kopf.PRESENT})
async def service_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A job's Service deleted by hand comes back at once (pod_events.on_service_deleted)."""
    rt = runtime(memo)
    if event.get("type") == "DELETED" and rt.leadership.leading:
        await pod_events.on_service_deleted(rt, body, rt.indexes)


# ------------------------------------------------------------------------------ mljobs


@kopf.on.event(*MLJOBS)
async def mljob_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Children for a new or edited job (a generation not reconciled yet); the lifecycle sweep
    (started at startup) keeps phase and conditions current and retries what failed here."""
    rt = runtime(memo)
    meta = body["metadata"]
    policy_key = (meta.get("namespace", ""),
                  (body.get("spec") or {}).get("schedulingPolicy") or "default")
    key = (policy_key[0], meta["name"])
    reconciled = rt.reconciled.get(key)
    # A spec edit of a job already decided: an admission step checks at once whether the
    # decision still fits the spec (loop.outgrown) and decides the job again if not.
    edited = (event.get("type") == "MODIFIED" and reconciled is not None
              and reconciled != (meta.get("uid"), int(meta.get("generation") or 0))
              and rt.placements.of(key) is not None)
    if event.get("type") in ("ADDED", "DELETED") or edited:
        # Wake the policy now: its admission step then waits for the burst this job may be
        # part of, and for the children of every job in it (loop._quiet); a deleted job's
        # policy recounts its jobs (the capacity it held frees as its pods go, below).
        rt.wakeups.signal(policy_key, "admission")
    previous = rt.job_bodies.get(key)
    before = ((previous.get("spec") or {}).get("schedulingPolicy") or "default") \
        if previous is not None else policy_key[1]
    if before != policy_key[1]:
        # Moved to another policy: the one it left recounts its jobs (and may admit others
        # into what the job held); it used to go on showing the job as its own.
        rt.wakeups.signal((policy_key[0], before), "admission")
    await jobs.on_job_event(rt, event.get("type"), body, rt.indexes)


# -------------------------------------------------------------------------------- pods


@kopf.on.event("pods", labels={JOB_LABEL: kopf.PRESENT})
async def pod_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    rt = runtime(memo)
    await pod_events.on_pod_event(rt, event.get("type"), body, rt.indexes)
    if event.get("type") == "DELETED":  # capacity freed (a job finished, was deleted, shrank)
        namespace = body["metadata"].get("namespace", "")
        job_name = body["metadata"].get("labels", {}).get(JOB_LABEL, "")
        wake_admission(rt, namespace, job_name)
        node = (body.get("spec") or {}).get("nodeName")
        if node:  # refusals there wait a while (displacement.py); then they are looked at again
            rt.refusals.departed(node, time.time())
            asyncio.get_running_loop().call_later(
                displacement.DEPARTURE_SETTLE_S + 0.5, wake_admission, rt, namespace, job_name)

"""The jobs a step decides, and what they hold: the reservation a decision makes
(`reservation`, `usage_of`), a spec edited out of its decision (`outgrown`), tasks whose node
no longer takes them (`displaced_jobs`), children ready to be scaled, and the policy's job
counts in its status (`job_counts`). Used by a round and an admission step (step.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mlsched.controller.kube.events import ObjectRef
from mlsched.controller.objects.desired import JobTarget, roles_of
from mlsched.controller.objects.records import NodeRecord
from mlsched.controller.objects.job_records import JobRecord
from mlsched.controller.objects.quantities import Resources, add
from mlsched.controller.scheduling import displacement
from mlsched.controller.scheduling.runtime import Runtime
from mlsched.controller.scheduling.state import Scheduling
from mlsched.controller.scheduling.indexes import Indexes, JobKey


def reservation(job: JobRecord, target: JobTarget) -> dict[str, Resources]:
    return usage_of(job, target.nodes)


def usage_of(job: JobRecord, nodes_by_role: Mapping[str, tuple[str, ...]]) -> dict[str, Resources]:
    """Per node, what the job's tasks there request (its templates' requests now)."""
    usage: dict[str, Resources] = {}
    for role, nodes in nodes_by_role.items():
        demand = job.demands.get(role, (0.0, 0.0, 0.0))
        for node in nodes:
            usage[node] = add(usage.get(node, (0.0, 0.0, 0.0)), demand)  # type: ignore[arg-type]
    return usage


def outgrown(job: JobRecord, decided: Mapping[str, tuple[str, ...]],
             nodes: Mapping[str, NodeRecord], reserved: Mapping[str, Resources] | None) -> str | None:
    """Why the job's spec, edited since its last decision, no longer admits that decision
    (None when it does): a role's count outside its new [min, max], a task on a node its
    template no longer allows, or pods that now request something else than what was
    reserved for them (`reserved`: the reservation made with the decision; None if unknown).
    Such a job is re-decided by the next admission step, not left so until the next round."""
    for role in roles_of(job):
        count = len(decided.get(role, ()))
        low, high = job.bounds(role)
        if not low <= count <= high:
            return f"its {count} {role} are outside the edited [{low}, {high}]"
        constraint = job.node_constraints.get(role)
        if constraint is not None:
            for name in decided.get(role, ()):
                node = nodes.get(name)
                if node is not None and not constraint.allows(name, node.labels, (), node.extended):
                    return f"its {role} on {name}, which the edited template does not allow"
    if reserved is not None:
        now = usage_of(job, {role: decided.get(role, ()) for role in roles_of(job)})
        if now.keys() != reserved.keys() or any(
                abs(a - b) > 1e-9 for node, r in now.items() for a, b in zip(r, reserved[node])):
            return "its pods' requests were edited"
    return None


def displaced_jobs(rt: Runtime, idx: Indexes, jobs: list[JobRecord],
                   decided: Mapping[JobKey, Mapping[str, tuple[str, ...]] | None],
                   nodes: Mapping[str, NodeRecord], now: float,
                   ) -> dict[JobKey, displacement.Displaced]:
    """The running jobs among `jobs` with tasks their decided node no longer takes."""
    # Nodes whose refusals may be the room a pod of ours holds or just left (displacement.py).
    vacating = frozenset(rt.pods.refusals.settling(now).union(
        *(displacement.leaving(idx.pods.get(j.key, ()), decided.get(j.key)) for j in jobs)))
    cache: dict = {}
    out = {}
    for job in jobs:
        nodes_of = decided.get(job.key)
        if not (nodes_of or {}).get("worker"):
            continue
        moves = {role: rt.pods.refusals.moves(job.key, role, now) for role in nodes_of}
        tasks = displacement.displaced_tasks(job, nodes_of, idx.pods.get(job.key, ()), nodes,
                                             rt.process.config.node_selector, rt.process.config.tolerated_taints,
                                             moves, vacating, cache)
        for role in nodes_of:  # remembered: not sent back there, and moves are counted
            refusing = {d.node for (r, _), d in tasks.items() if r == role and d.by_scheduler}
            if refusing:
                rt.pods.refusals.note(job.key, role, refusing, now)
        if tasks:
            out[job.key] = tasks
    return out


def job_counts(scheduling: Scheduling, key: tuple[str, str], jobs: list[JobRecord],
               status: Mapping[str, Any]) -> dict[str, Any]:
    """status.admittedJobs / waitingJobs / bookedGpus / fairShare after a step (the `kubectl
    get` columns), where they changed since last written or queued: the policy's jobs holding
    tasks as decided, those (not suspended or finished) holding nothing, the GPUs they hold,
    and its fair share while one bounds it (None clears it)."""
    admitted = sum(1 for j in jobs if j.schedulable and (scheduling.placements.of(j.key) or {}).get("worker"))
    share = scheduling.per_policy.fair_shares.get(key)
    counts = {"admittedJobs": admitted,
              "waitingJobs": sum(1 for j in jobs if j.schedulable) - admitted,
              "bookedGpus": round(scheduling.reservations.gpus(key), 3),
              "fairShare": None if share is None else {
                  "entitledGpus": round(share.gpus, 3), "capacityGpus": round(share.capacity, 3),
                  "demandGpus": round(share.demand, 3), "contenders": share.contenders}}
    before = scheduling.per_policy.policy_counts.get(key) or {k: status.get(k) for k in counts}
    scheduling.per_policy.policy_counts[key] = counts
    return {k: v for k, v in counts.items() if before.get(k) != v}


def queue_counts(rt: Runtime, ref: ObjectRef, body: Mapping[str, Any],
                 jobs: list[JobRecord]) -> None:
    counts = job_counts(rt.scheduling, (ref.namespace, ref.name), jobs, body.get("status") or {})
    if counts:
        rt.writers.status.enqueue("SchedulingPolicy", ref.namespace, ref.name,
                                  uid=body["metadata"].get("uid"), fields=counts)


def children_exist(job: JobRecord, idx: Indexes) -> bool:
    return {s.role for s in idx.statefulsets.get(job.key, ())} >= set(roles_of(job))


def children_ready(scheduling: Scheduling, job: JobRecord, idx: Indexes) -> bool:
    """Its StatefulSets exist to be scaled, and its Service was not refused (services.py)."""
    return children_exist(job, idx) and not scheduling.services.refused(job)


def wake_others(scheduling: Scheduling, key: tuple[str, str]) -> None:
    """Every other policy's waiting jobs get an admission step now, not at their next round
    (one with nothing waiting does nothing)."""
    loops = scheduling.policy_loops
    for other in loops.running() if loops is not None else ():
        if other != key:
            scheduling.wakeups.signal(other, "admission")


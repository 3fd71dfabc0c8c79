"""What one policy's step sees: the snapshot of the capacity it may decide on (other
policies' reservations, quotas, fair share, what pods outside its jobs hold), and its jobs
held where the last decision put them (`held_as_decided`)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping

from mlsched.controller.admission import quotas
from mlsched.controller.objects.job_records import JobRecord
from mlsched.controller.objects.quantities import TERMINAL_POD_PHASES
from mlsched.controller.scheduling import fair_share, pools
from mlsched.controller.scheduling.runtime import Runtime
from mlsched.controller.scheduling.state import Scheduling
from mlsched.controller.scheduling.indexes import Indexes, flatten, values
from mlsched.controller.scheduling.snapshot import build_snapshot
from mlsched.controller.scheduling.cluster_state import (
    held_counted, held_elsewhere, held_labelled, held_ports, held_selected,
)


def policy_snapshot(rt: Runtime, idx: Indexes, jobs: list[JobRecord], schedulable: list[JobRecord],
                    now: float, interval_s: float, setup: pools.PoolSetup | None = None,
                    policy: tuple[str, str] | None = None):
    """What one policy may decide on: capacity less what other policies reserved and what
    pods outside its schedulable jobs hold (controller/scheduling/snapshot.py), its GPUs bounded by its
    fair share while policies contend for them (fair_share.py; `policy`: its key, whose
    entitlement is kept in rt.scheduling.per_policy.fair_shares). Call under round_lock. With a grouping (`setup`),
    only the nodes it may use (pools.usable)."""
    cluster = idx.cluster()
    share = None
    if policy is not None:
        share = policy_entitlement(rt, idx, policy, cluster)
        if share is None:
            rt.scheduling.per_policy.fair_shares.pop(policy, None)
        else:
            rt.scheduling.per_policy.fair_shares[policy] = share
    budget = fair_share.bounded(quota_budget(rt.scheduling, idx, schedulable), share)
    if setup is not None:
        cluster = dataclasses.replace(cluster, nodes=[n for n in cluster.nodes
                                                      if pools.usable(n, setup)])
    mine = {j.key for j in jobs}  # built once: inside the comprehension it was O(jobs²), 50 %
    # of the operator's time and 8-15 s event-loop stalls per step at 2,000 jobs
    others = {k: v for k, v in rt.scheduling.reservations.all().items() if k not in mine}
    deciding = {j.key for j in schedulable}
    selectors = {s for j in schedulable for found in j.anti_affinity.values() for s in found}
    spread = any(j.spread_constraints for j in schedulable)
    held = held_elsewhere(cluster, deciding, others)
    # Ports and counted resources (pod slots, devices) of the tasks other policies decided,
    # whose pods may not exist yet: their reservations are CPU, GPU and memory only.
    decided = {k: (job, nodes) for k in others
               if (nodes := rt.scheduling.placements.of(k)) is not None and (job := idx.job(*k)) is not None}
    # Pods others hold matter only to jobs spread by anti-affinity or topology constraints.
    labelled = held_labelled(cluster, deciding, schedulable[0].namespace, decided) \
        if schedulable and (selectors or spread) else ()
    return build_snapshot(schedulable, cluster, now_s=now, interval_s=interval_s, held=held,
                          node_selector=rt.process.config.node_selector,
                          tolerated_taints=rt.process.config.tolerated_taints,
                          budget=budget,
                          # Others' ports matter only to tasks holding ports themselves.
                          ports=held_ports(cluster, deciding, decided)
                          if any(j.host_ports for j in schedulable) else None,
                          counted_used=held_counted(cluster, deciding, decided),
                          selected=held_selected(labelled, selectors) if selectors else None,
                          labelled=labelled,
                          # Other workloads' anti-affinity terms repelling job pods (rare).
                          repelled=cluster.foreign_repels.get(schedulable[0].namespace)
                          if schedulable else None)


def policy_entitlement(rt: Runtime, idx: Indexes, policy: tuple[str, str],
                       cluster) -> fair_share.Entitlement | None:
    """The policy's fair share of contended GPUs now (fair_share.py); None when unbounded.
    The cluster is read before a grouping narrows it: the policies share all the nodes."""
    weights = fair_share.weights(idx.policies)
    if len(weights) < 2:
        return None  # one policy: nothing to share (and no job to scan)
    every = flatten(idx.mljobs)
    running = {j.key for j in every if (rt.scheduling.placements.of(j.key) or {}).get("worker")}
    return fair_share.entitlement(policy, every, weights, running, cluster,
                                  rt.process.config.node_selector)


def quota_budget(scheduling: Scheduling, idx: Indexes, schedulable: list[JobRecord]):
    """What the namespace's ResourceQuotas leave the jobs a step decides (quotas.py): their
    own pods' usage counts as free, since the step books their tasks afresh; the tasks other
    jobs of the namespace were decided and have no pod for yet count as used, since the quota
    counts a pod only once it exists (two policies of one namespace deciding one after the
    other each booked what the quota had left, and both jobs were half-created). Each per
    quota scope: a PriorityClass-scoped quota counts the pods of its classes only, each pod
    by the class it was given when it was made."""
    if not schedulable:
        return None
    namespace = schedulable[0].namespace
    found = values(idx.quotas, namespace)
    if not found:
        return None
    scopes = quotas.scopes_of(found)
    scoped = len(scopes) > 1  # a PriorityClass-scoped quota: pods' classes matter
    default = idx.default_priority_class() if scoped else ""
    counts = any(q.counted for q in found)  # the counted resources (extended, DRA devices)
    own = {scope: quotas.Usage() for scope in scopes}
    for job in schedulable:
        for pod in idx.pods.get(job.key, ()):
            if pod.phase not in TERMINAL_POD_PHASES:
                priority = pod.priority_class  # set when it was made: the default may have moved
                taken = quotas.pod_takes(job, pod) if counts else ()
                for scope, usage in own.items():
                    if quotas.matches(scope, priority):
                        usage.add((*pod.requests, *pod.limits, 1.0), taken)
    mine = {j.key for j in schedulable}
    pending = {scope: quotas.Usage() for scope in scopes}
    for job in flatten(idx.mljobs):
        decided = scheduling.placements.of(job.key) if job.namespace == namespace else None
        if not decided or job.key in mine:
            continue
        exist = Counter(p.role for p in idx.pods.get(job.key, ())
                        if p.phase not in TERMINAL_POD_PHASES)
        for role, nodes in decided.items():
            missing = len(nodes) - exist[role]
            charge = job.charges.get(role)
            if missing > 0 and charge is not None:
                priority = quotas.priority_of(job, role, default) if scoped else ""
                for scope, usage in pending.items():
                    if quotas.matches(scope, priority):
                        usage.add(charge, quotas.quota_takes(job, role), missing)
    return quotas.budget(found, own, pending, default)


def held_as_decided(snapshot, decided: Mapping[str, Mapping[str, tuple[str, ...]] | None],
                    released: frozenset[str] | set[str] = frozenset()):
    """Job views whose counts and nodes are what the last decision gave them (the pods may not
    all exist or be placed yet): what an admission step holds them at, and where a round's
    stickiness sends them back. Each role's nodes are cut at the first node no longer in the
    snapshot (lost, cordoned), as the pod-derived prefix is: ordinal k keeps its node only if
    every ordinal before it does. `released` jobs hold nothing (an admission step re-decides
    them), whatever their pods show."""
    index = {name: i for i, name in enumerate(snapshot.node_names)}

    def prefix(names) -> tuple[int, ...]:
        out = []
        for name in names:
            if name not in index:
                break
            out.append(index[name])
        return tuple(out)

    views = []
    for view in snapshot.jobs:
        nodes = decided.get(view.name) or {}
        if view.name in released:
            view = dataclasses.replace(view, ps=0, workers=0, ps_nodes=(), worker_nodes=())
        elif nodes.get("worker"):
            ps, workers = prefix(nodes.get("ps", ())), prefix(nodes["worker"])
            view = dataclasses.replace(view, ps=len(ps), workers=len(workers),
                                       ps_nodes=ps, worker_nodes=workers)
        views.append(view)
    return dataclasses.replace(snapshot, jobs=views)


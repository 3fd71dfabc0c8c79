"""A round's and an admission step's grouping work in the cluster (controller/scheduling/pools.py has
the pure parts): the snapshot with the pools in force, targets naming the labelled pool,
node labels, each job's pool and its status, the policy's status.groups, Events, metric."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mlsched.cluster.types import Decision
from mlsched.controller.scheduling import pools
from mlsched.controller.dataset.dataset import rfc3339
from mlsched.controller.objects.desired import JobTarget
from mlsched.controller.kube.events import ObjectRef
from mlsched.controller.objects.job_records import JobRecord
from mlsched.controller.scheduling.runtime import Runtime
from mlsched.controller.scheduling.indexes import Indexes, flatten


def grouped(rt: Runtime, idx: Indexes, snapshot, setup: pools.PoolSetup | None,
            jobs: list[JobRecord], status: Mapping[str, Any], grouping):
    """The snapshot with the pools in force and the grouping as the cluster runs it. What this
    process last applied (labels, status.groups) wins over what the watch shows yet: an
    admission step right after a round must see that round's pools, not the ones before.

    A policy that does not group sees no pools at all: the node labels are other policies'
    pools, not pools in force for it. Left in its snapshot, they made its admission steps
    read its running jobs on another policy's nodes as moved out of their pools and hold
    every new job back with "its grouping has not given it a node pool yet" (issue 55)."""
    if setup is None:
        if snapshot.node_pools is None:
            return snapshot, grouping
        return dataclasses.replace(snapshot, node_pools=None, pool_shares=None), grouping
    key = (setup.owner.split("/", 1)[0], setup.owner.split("/", 1)[1])
    nodes = {n.name: n for n in flatten(idx.nodes)}
    members = {j.name: pools.membership(j, rt.scheduling.groups) for j in jobs}
    if key in rt.scheduling.per_policy.policy_groups:
        status = {**status, "groups": rt.scheduling.per_policy.policy_groups[key]}
    snapshot, labels = pools.fill(snapshot, setup, nodes, members, status,
                                  rt.scheduling.per_policy.policy_nodes.get(key))
    allowed = None
    if setup.mode == pools.LABEL_NODES:
        # Only nodes no other tenant uses go into this policy's pools (issue 55).
        cluster = idx.cluster()
        own = {j.key for j in idx.jobs_of_policy(*key)} | {j.key for j in jobs}
        taken = pools.others_nodes(cluster.pods, own, rt.scheduling.reservations.all(), cluster.strays,
                                   cluster.foreign, cluster.foreign_extended)
        allowed = pools.poolable(snapshot, taken)
    return snapshot, pools.grouping_for(grouping, setup, labels, allowed)


def with_pools(targets: dict[str, JobTarget], decision: Decision,
               setup: pools.PoolSetup | None) -> dict[str, JobTarget]:
    """Targets naming the pool as the nodes are labelled."""
    return {name: dataclasses.replace(t, pool=pools.cluster_pool(decision.pools, name, setup))
            for name, t in targets.items()}


async def sync_node_labels(rt: Runtime, idx: Indexes, ref: ObjectRef, snapshot,
                           decision: Decision, setup: pools.PoolSetup | None) -> None:
    """LabelNodes (--label-nodes only): the policy's nodes carry its pools' labels, and only
    those; also with grouping off, so that turning it off removes them."""
    if not rt.process.config.label_nodes:
        return
    if setup is not None and decision.pools.is_shared and snapshot.node_pools is None:
        return  # no pool in force, none wanted: nothing of this policy's to write or remove
    # A shared plan with pools in force removes them: the grouping found no group worth a
    # pool (Harmony's min_members), no node it may pool, or no job (they used to stay on the
    # nodes of a policy left without jobs, keeping other grouping policies off them).
    owner = f"{ref.namespace}/{ref.name}"
    desired = pools.desired_labels(snapshot, decision.pools, setup)
    rt.scheduling.per_policy.policy_nodes[(ref.namespace, ref.name)] = desired
    failures = await pools.sync_labels(rt.api, flatten(idx.nodes), owner, desired)
    if failures:
        rt.process.metrics.api_errors.labels("label").inc(len(failures))
        text = "; ".join(f"node {c.node}: {err}" for c, err in failures[:5])
        await rt.writers.events.emit(ref, "Warning", "PoolLabelFailed", text)


def settle_groups(rt: Runtime, jobs: list[JobRecord], targets: Mapping[str, JobTarget],
                  now: float) -> tuple[dict[str, dict[str, Any]], list[tuple[JobRecord, str | None, str | None]]]:
    """Each decided job's pool (rt.scheduling.groups): the status fields `group` and `groupSince` to
    write where status does not show them yet, and the jobs whose pool changed (old, new)."""
    fields: dict[str, dict[str, Any]] = {}
    changes = []
    stamp = float(int(now))
    for job in jobs:
        old = pools.membership(job, rt.scheduling.groups)
        target = targets.get(job.name)
        value = target.pool if target is not None else None
        since = (old.since_s if value == old.group and old.since_s is not None else stamp) \
            if value else None
        rt.scheduling.groups[job.key] = pools.Membership(value, since)
        if value != old.group:
            changes.append((job, old.group, value))
        if (value, since) != (job.group, job.group_since_s):
            fields[job.name] = {"group": value,
                                "groupSince": rfc3339(since) if since is not None else None}
    return fields, changes


async def group_events(rt: Runtime, changes, moved: set[str]) -> None:
    """`Grouped` on each job whose pool changed."""
    for job, old, new in changes:
        ref = ObjectRef("MLJob", job.namespace, job.name, job.uid)
        if new:
            how = "; its pods restart there (checkpoint-restart)" if job.name in moved else ""
            text = f"pool {new}" + (f" (was {old})" if old else "") + how
        else:
            text = f"left pool {old}"
        await rt.writers.events.emit(ref, "Normal", "Grouped", text)


async def policy_groups(rt: Runtime, body: Mapping[str, Any], ref: ObjectRef, snapshot,
                        decision: Decision, setup: pools.PoolSetup | None, spec,
                        targets: Mapping[str, JobTarget], now: float,
                        round_: bool = True) -> dict[str, Any]:
    """status.groups and status.grouping where they changed, a `Regrouped` Event when the
    pools' members did, and (`round_`) the pools' utilisation metrics. An admission step
    that keeps the pools in force has no forecasts: the previous ones stay shown."""
    key = (ref.namespace, ref.name)
    status = body.get("status") or {}
    groups = pools.groups_status(snapshot, decision.pools, setup)
    before = rt.scheduling.per_policy.policy_groups.get(key, status.get("groups") or [])
    if not round_:
        old = {g.get("name"): g for g in before}
        groups = [{**{k: v for k, v in old.get(g["name"], {}).items() if k.startswith("predicted")},
                   **g} for g in groups]
    old_grouping = status.get("grouping") or {}
    out: dict[str, Any] = {}
    changed = pools.memberships(groups) != pools.memberships(before)
    if groups != list(before):
        out["groups"] = pools.bounded(groups)
    grouping = None
    if setup is not None:
        # An admission step's plan predicts nothing new (it keeps the pools or adds to them):
        # the round's predicted gain stays shown.
        gain = (round(float(decision.pools.predicted_gain), 6) if round_
                else old_grouping.get("predictedGain", 0.0))
        grouping = {"labelKey": setup.label_key, "predictedGain": gain, "pools": len(groups)}
        last = rfc3339(now) if changed else old_grouping.get("lastRegroupingTime")
        if last:
            grouping["lastRegroupingTime"] = last
    if grouping != (status.get("grouping") or None):
        out["grouping"] = grouping
    if changed and (groups or before):
        threshold = spec.pools.threshold if spec.grouping == "harmony" else None
        await rt.writers.events.emit(ref, "Normal", "Regrouped",
                                     pools.describe(groups, decision.pools, threshold, not before))
    rt.scheduling.per_policy.policy_groups[key] = groups
    if not round_:
        return out
    rows: dict[str, dict[str, float]] = {}
    if setup is not None:
        counts = {n: (t.count("ps"), t.count("worker")) for n, t in targets.items()}
        speeds = {j.name: rt.jobs.progress.get(j.key, (0, 0, j.speed))[2] or j.speed
                  for j in rt.cluster.indexes.jobs_of_policy(*key)} if rt.cluster.indexes else {}
        rows = {setup.value(p): r for p, r in
                pools.utilisation(snapshot, decision.pools, counts, speeds).items()}
    rt.process.metrics.set_pools(ref.namespace, ref.name, rows)
    return out

"""Grouping in the cluster (docs/grouping.md, "In the cluster"): a SchedulingPolicy's pools
become node pools, its grouped jobs' pods require their pool's nodes.

Two modes (spec.pools.mode):

- LabelNodes: the operator labels the nodes a pool gets with `mlsched.io/pool=<pool>` and
  marks each with the annotation `mlsched.io/pool-owner: <namespace>/<policy>`; it only ever
  removes labels carrying its own mark, so an admin's label is never touched, and it only
  places a grouping policy's jobs on nodes without the label or with its own. Needs
  --label-nodes and the nodes patch rule (manifests/overlays/label-nodes). Pool names are
  `<namespace>.<policy>.<group>` (a hash prefix when that is too long for a label value),
  so two policies never share a label value. Pools live beside other tenants (issue 55): a
  pool takes only nodes no other tenant uses (`poolable`), a group of one job gets no pool
  (its job runs ungrouped on the nodes in none), and a running job is moved only into a
  pool where it fits (HarmonyConfig.min_members, moves_must_fit).
- ExistingPools: groups are assigned to pools an admin labelled (`spec.pools.labelKey`,
  e.g. cloud.google.com/gke-nodepool); the operator writes no node, and a grouping policy
  places only on nodes carrying the key (policies/grouping/existing_pools.py).

Status is the memory across rounds and restarts: the snapshot gets each job's pool and the
time it joined from `status.group`/`status.groupSince` (or the newer in-memory copy a round
has not seen come back yet), the pools in force from the node labels (LabelNodes) or the
members' groups (ExistingPools), the shares from the policy's `status.groups`.
Everything here but `sync_labels` and `sweep` is pure.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from mlsched.api import SchedulingPolicySpec
from mlsched.cluster.types import WAITING_POOL, PoolPlan, Snapshot
from mlsched.controller.kube.constants import POOL_LABEL, POOL_OWNER_ANNOTATION
from mlsched.controller.serving.models import ResolvedPolicy, Verdict
from mlsched.controller.objects.records import NodeRecord, PodPool
from mlsched.controller.objects.job_records import JobRecord
from mlsched.policies.grouping.existing_pools import OntoExistingPools
from mlsched.policies.grouping.harmony import Harmony
from mlsched.policies.grouping.none import NoGrouping
from mlsched.policies.grouping.on_nodes import OnNodes
from mlsched.policies.grouping.profiles import profile_table

log = logging.getLogger("mlsched.controller.scheduling.pools")
LABEL_NODES, EXISTING_POOLS = "LabelNodes", "ExistingPools"
MAX_PREFIX = 48  # a label value is at most 63 characters; group names are short (g12)


@dataclass(frozen=True)
class PoolSetup:
    """One policy's pools in the cluster: which label, and how a group's name maps to its
    value. The policies decide on bare group names; the cluster sees `prefix + name`."""

    mode: str
    label_key: str
    prefix: str
    owner: str  # namespace/policy

    def value(self, group: str) -> str:
        return self.prefix + group

    def group_of(self, value: str | None) -> str | None:
        if not value or not value.startswith(self.prefix):
            return None
        return value[len(self.prefix):] or None


def setup_for(namespace: str, policy: str, spec: SchedulingPolicySpec) -> PoolSetup:
    owner = f"{namespace}/{policy}"
    if spec.pools.mode == EXISTING_POOLS:
        return PoolSetup(EXISTING_POOLS, spec.pools.label_key, "", owner)
    prefix = f"{namespace}.{policy}."
    if len(prefix) > MAX_PREFIX:
        prefix = hashlib.sha256(owner.encode()).hexdigest()[:12] + "."
    return PoolSetup(LABEL_NODES, POOL_LABEL, prefix, owner)


def configure(resolved: ResolvedPolicy, spec: SchedulingPolicySpec, namespace: str, policy: str,
              label_nodes: bool, interval_scale: float) -> PoolSetup | None:
    """The grouping this policy runs in the cluster (changes `resolved` in place): harmony with
    spec.pools' threshold and minimum stay; none, with a FallbackActive note, when LabelNodes
    is asked of an operator started without --label-nodes. None when nothing is grouped."""
    name = getattr(resolved.grouping, "name", "none")
    if name == "none":
        return None
    if spec.pools.mode == LABEL_NODES and not label_nodes:
        resolved.grouping = NoGrouping()
        note = (f"grouping {name!r} with pools.mode LabelNodes needs an operator started with "
                f"--label-nodes (and the nodes patch rule of manifests/overlays/label-nodes), "
                f"grouping with none; or use pools.mode ExistingPools")
        ready = resolved.ready
        message = f"{ready.message}; {note}" if ready.reason == "FallbackActive" and ready.message else note
        resolved.ready = Verdict(True, "FallbackActive", message)
        return None
    if isinstance(resolved.grouping, Harmony):
        # A pool of one job co-locates nothing and fences nodes off from everyone else: only
        # the operator's own labels are such fences (ExistingPools' pools are the admin's).
        config = dataclasses.replace(resolved.grouping.config, threshold=spec.pools.threshold,
                                     min_pool_s=spec.pools.min_stay_seconds * interval_scale,
                                     min_members=2 if spec.pools.mode == LABEL_NODES else 1,
                                     moves_must_fit=True)
        resolved.grouping = Harmony(config)
    return setup_for(namespace, policy, spec)


def usable(node: NodeRecord, setup: PoolSetup) -> bool:
    """Whether a grouping policy may place on the node (module docstring)."""
    if setup.mode == LABEL_NODES:
        return POOL_LABEL not in node.labels or node.pool_owner == setup.owner
    return setup.label_key in node.labels


def others_nodes(pods: Mapping[tuple[str, str], Iterable[Any]], own: set[tuple[str, str]],
                 reserved: Mapping[tuple[str, str], Mapping[str, Any]],
                 strays: Iterable[Any] = (), foreign_gpus: Mapping[str, Iterable[Any]] | None = None,
                 foreign_extended: Mapping[str, Iterable[Any]] | None = None) -> set[str]:
    """The nodes other tenants use, which a LabelNodes policy must not put in its pools: where
    pods of jobs not its own (any namespace, any policy) are bound and not finished, where
    another policy's latest step reserved capacity (its pods may not exist yet), where pods of
    an earlier job of the same name still run (`strays`), and where pods of other workloads
    hold GPUs or extended resources (`foreign_gpus`: node -> their (cpu, gpu, mem) requests;
    `foreign_extended`: node -> their extended resources). Other workloads' pods asking only
    CPU and memory do not count: every node runs some (kube-proxy, log and metric agents),
    and the indexes keep no owner to tell a node agent from a tenant's service."""
    out: set[str] = set()
    for key, found in pods.items():
        if key in own:
            continue
        out.update(p.node for p in found if p.node and p.phase not in ("Succeeded", "Failed"))
    for key, usage in reserved.items():
        if key not in own:
            out.update(node for node, r in usage.items() if any(float(x) > 0 for x in r))
    out.update(p.node for p in strays if p.node and p.phase not in ("Succeeded", "Failed"))
    for node, requests in (foreign_gpus or {}).items():
        if any(float(r[1]) > 0 for r in requests):
            out.add(node)
    out.update(node for node, found in (foreign_extended or {}).items() if any(found))
    return out


def poolable(snapshot: Snapshot, taken: set[str]) -> list[bool]:
    """Per snapshot node, whether a LabelNodes policy may put it in a pool: no other tenant
    uses it (`taken`, others_nodes), and some task of the policy's jobs may run there (their
    templates' node constraints, JobView.node_filters): a node none of them can use would be
    a pool's node in name only."""
    n = len(snapshot.node_names)
    allowed = np.zeros(n, dtype=bool)
    for job in snapshot.jobs:
        for role in (("ps", "worker") if job.uses_ps else ("worker",)):
            mask = job.node_filter(role)  # type: ignore[arg-type]
            if mask is None:
                allowed[:] = True
                break
            allowed |= mask
        if allowed.all():
            break
    return [bool(a) and name not in taken for a, name in zip(allowed, snapshot.node_names)]


@dataclass(frozen=True)
class Membership:
    """A job's pool as the latest decision left it (None: in none), and since when."""

    group: str | None
    since_s: float | None


def membership(job: JobRecord, memory: Mapping[tuple[str, str], Membership]) -> Membership:
    """The in-memory record of the latest decision when there is one (its status write may not
    have come back through the watch yet), else the job's status."""
    return memory.get(job.key) or Membership(job.group, job.group_since_s)


def fill(snapshot: Snapshot, setup: PoolSetup, nodes: Mapping[str, NodeRecord],
         members: Mapping[str, Membership], status: Mapping[str, Any],
         applied: Mapping[str, str] | None = None) -> tuple[Snapshot, list]:
    """The snapshot a grouping decides on: job pools and the time they joined, the pools in
    force (node labels, or `applied`: the labels this process last wrote, node → value), their
    shares (status.groups); only CPU is divided by a share. Also the existing pool label of
    every node (ExistingPools' projection needs them)."""
    labels = [nodes[n].labels.get(setup.label_key) for n in snapshot.node_names]
    if setup.mode == LABEL_NODES and applied is not None:
        node_pools = [setup.group_of(applied.get(n)) for n in snapshot.node_names]
    elif setup.mode == LABEL_NODES:
        node_pools = [setup.group_of(v) if nodes[n].pool_owner == setup.owner else None
                      for n, v in zip(snapshot.node_names, labels)]
    else:
        in_force = {m.group for m in members.values() if m.group}
        node_pools = [v if v in in_force else None for v in labels]
    views = []
    for view in snapshot.jobs:
        m = members.get(view.name) or Membership(None, None)
        pool = setup.group_of(m.group)
        views.append(dataclasses.replace(view, pool=pool,
                                         pool_since_s=m.since_s if pool else None))
    shares = {}
    for g in status.get("groups") or ():
        name = setup.group_of(g.get("name"))
        if name:
            shares[name] = max(1, int(g.get("share") or 1))
    out = dataclasses.replace(snapshot, jobs=views,
                              node_pools=node_pools if any(p is not None for p in node_pools) else None,
                              pool_shares=shares or None, divisible=(0,))
    return out, labels


def grouping_for(grouping, setup: PoolSetup, labels: list, allowed: list[bool] | None = None):
    """The grouping as the cluster runs it: onto the admin's pools (ExistingPools), or pooling
    only the `allowed` nodes (LabelNodes, `poolable`)."""
    if setup.mode == EXISTING_POOLS:
        return OntoExistingPools(grouping, labels)
    return OnNodes(grouping, allowed) if allowed is not None else grouping


def cluster_pool(plan: PoolPlan, job: str, setup: PoolSetup | None) -> str | None:
    """The job's pool as its nodes are labelled; None without grouping, or while it waits."""
    pool = plan.job_pools.get(job) if setup is not None else None
    return setup.value(pool) if pool and pool != WAITING_POOL else None


def pod_pool(plan: PoolPlan, job: str, setup: PoolSetup | None) -> PodPool | None:
    value = cluster_pool(plan, job, setup)
    if value is None:
        return None
    return PodPool(setup.label_key, value, plan.share_of(plan.job_pools[job]))  # type: ignore[union-attr]


# ------------------------------------------------------------------------- node labels


@dataclass(frozen=True)
class LabelNode:
    """Set (value) or remove (None) the operator's pool label and its owner mark on a node."""

    node: str
    value: str | None
    owner: str

    def patch(self) -> dict:
        if self.value is None:
            return {"metadata": {"labels": {POOL_LABEL: None},
                                 "annotations": {POOL_OWNER_ANNOTATION: None}}}
        return {"metadata": {"labels": {POOL_LABEL: self.value},
                             "annotations": {POOL_OWNER_ANNOTATION: self.owner}}}


def desired_labels(snapshot: Snapshot, plan: PoolPlan, setup: PoolSetup | None) -> dict[str, str]:
    """node → label value this policy wants (LabelNodes only)."""
    if setup is None or setup.mode != LABEL_NODES or plan.node_pools is None:
        return {}
    used = {p for j, p in plan.job_pools.items() if p != WAITING_POOL}
    return {snapshot.node_names[i]: setup.value(p) for i, p in enumerate(plan.node_pools)
            if p is not None and p in used}


def label_changes(nodes: Iterable[NodeRecord], owner: str,
                  desired: Mapping[str, str]) -> list[LabelNode]:
    """What turns the nodes' labels of `owner` into `desired`. A node labelled by anyone else
    (no mark, or another policy's) is never changed."""
    out = []
    for node in nodes:
        want = desired.get(node.name)
        mine = node.pool_owner == owner
        if want is not None:
            if mine and node.labels.get(POOL_LABEL) == want:
                continue
            if POOL_LABEL in node.labels and not mine:
                continue
            out.append(LabelNode(node.name, want, owner))
        elif mine:
            out.append(LabelNode(node.name, None, owner))
    return out


async def sync_labels(api, nodes: Iterable[NodeRecord], owner: str,
                      desired: Mapping[str, str]) -> list[tuple[LabelNode, BaseException]]:
    """Apply label_changes; the failures (logged), never raised."""
    failures = []
    for change in label_changes(nodes, owner, desired):
        try:
            await api.patch("Node", "", change.node, change.patch())
        except Exception as err:  # noqa: BLE001 - a label failure must not stop the round
            log.warning("node %s: cannot %s pool label: %s", change.node,
                        "remove the" if change.value is None else "set the", err)
            failures.append((change, err))
    return failures


def served(namespace: str, patterns: Iterable[str]) -> bool:
    patterns = list(patterns)
    return not patterns or any(fnmatch.fnmatchcase(namespace, p) for p in patterns)


def orphaned_labels(nodes: Iterable[NodeRecord], policies: Iterable[tuple[str, str]],
                    namespaces: Iterable[str]) -> list[LabelNode]:
    """Labels of policies that no longer exist (in a namespace this operator serves)."""
    live = {f"{ns}/{name}" for ns, name in policies}
    namespaces = list(namespaces)
    return [LabelNode(n.name, None, n.pool_owner) for n in nodes
            if n.pool_owner and n.pool_owner not in live
            and served(n.pool_owner.split("/", 1)[0], namespaces)]


# ------------------------------------------------------------------------------ status


def groups_status(snapshot: Snapshot, plan: PoolPlan, setup: PoolSetup | None) -> list[dict]:
    """status.groups: every pool with members, as applied."""
    if setup is None or plan.is_shared:
        return []
    members: dict[str, list[str]] = {}
    for job, pool in plan.job_pools.items():
        if pool != WAITING_POOL:
            members.setdefault(pool, []).append(job)
    out = []
    for pool in sorted(members):
        nodes = [snapshot.node_names[i] for i, p in enumerate(plan.node_pools or ()) if p == pool]
        entry: dict[str, Any] = {"name": setup.value(pool), "members": sorted(members[pool]),
                                 "nodes": nodes, "nodeCount": len(nodes),
                                 "share": plan.share_of(pool)}
        f = plan.forecasts.get(pool)
        if f is not None:
            entry.update(predictedIterationSeconds=round(f.iteration_s, 6),
                         predictedComputeUtilisation=round(f.cpu_util, 6),
                         predictedNetworkUtilisation=round(f.net_util, 6))
        out.append(entry)
    return out


MAX_STATUS_GROUPS, MAX_STATUS_NODES, MAX_STATUS_MEMBERS = 512, 1024, 64


def bounded(groups: list[dict]) -> list[dict]:
    """status.groups within the CRD's bounds (the full list stays in the operator's memory;
    a restarted operator then reads the shares of the first 512 pools only)."""
    return [{**g, "nodes": sorted(g["nodes"])[:MAX_STATUS_NODES],
             "members": g["members"][:MAX_STATUS_MEMBERS]} for g in groups[:MAX_STATUS_GROUPS]]


def memberships(groups: Iterable[Mapping[str, Any]]) -> dict[str, tuple[str, ...]]:
    return {g["name"]: tuple(sorted(g.get("members") or ())) for g in groups}


def describe(groups: list[dict], plan: PoolPlan, threshold: float | None,
             first: bool = False) -> str:
    """The Regrouped Event's message: whether a fresh grouping was taken and why, the pools."""
    gain = f"{plan.predicted_gain * 100:.1f} %"
    bound = f" (threshold {threshold * 100:.1f} %)" if threshold is not None else ""
    if not groups:
        return "no pools: grouping is off, or there is no job to group"
    if first:
        head = "grouped"
    elif plan.regrouped:
        head = f"regrouped: predicted gain {gain} over keeping the groups{bound}"
    else:
        head = f"kept the groups: a fresh grouping's predicted gain {gain}{bound}"
    if plan.moved:
        head += f"; moved (checkpoint-restart): {', '.join(plan.moved)}"
    parts = []
    for g in groups:
        line = f"{g['name']} [{' '.join(g['members'])}] on {len(g['nodes'])} node(s), share {g['share']}"
        if g.get("predictedIterationSeconds") is not None:
            line += f", predicted iteration {g['predictedIterationSeconds']:.3g} s"
        parts.append(line)
    return f"{head}. Pools: {'; '.join(parts) or 'none'}"


# ---------------------------------------------------------------------------- metrics


def utilisation(snapshot: Snapshot, plan: PoolPlan, counts: Mapping[str, tuple[int, int]],
                speeds: Mapping[str, float], max_dop: int = 16) -> dict[str, dict[str, float]]:
    """Per pool: predicted compute and network utilisation (the forecast) and, where members
    report progress, the observed: predicted × Σ reported speed / Σ speed the co-location
    model predicts for them (their speed curve at their counts × their own iteration time /
    the group's). Busy time per resource is not measured in the cluster; this is how far the
    group's measured progress is from the progress the prediction assumed."""
    out: dict[str, dict[str, float]] = {}
    views = {j.name: j for j in snapshot.jobs}
    for pool, f in plan.forecasts.items():
        row = {"predicted_compute": f.cpu_util, "predicted_network": f.net_util}
        names = [n for n, p in plan.job_pools.items() if p == pool and n in views]
        running = [n for n in names if counts.get(n, (0, 0))[1] > 0 and speeds.get(n, 0.0) > 0]
        if running and f.iteration_s > 0:
            jobs = [views[n] for n in running]
            C, N = profile_table(jobs, max_dop)
            d = int(min(max(f.nodes, 1), max_dop))
            predicted = 0.0
            for i, job in enumerate(jobs):
                ps, workers = counts[job.name]
                alone = job.prior.epochs_per_s(ps, workers) if job.prior is not None else 0.0
                t_alone = float(C[i, d] + N[i, d])
                if np.isfinite(t_alone) and t_alone > 0:
                    predicted += alone * min(1.0, t_alone / f.iteration_s)
            if predicted > 0:
                ratio = sum(speeds[n] for n in running) / predicted
                row["observed_compute"] = f.cpu_util * ratio
                row["observed_network"] = f.net_util * ratio
        out[pool] = row
    return out


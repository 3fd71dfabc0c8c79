"""Why a job the policy did not admit is still waiting, in the words `kubectl describe` shows.

"Pending" is the question users ask most, and "the scheduling policy has not allocated the
minimum of every role yet" does not answer it. After each round and admission step, every
job given nothing gets one of:

- its minimum does not fit what is free now: how much it needs, how much is free, and the most
  one node has, so a user sees whether to wait or to ask for less;
- its minimum would fit, but the policy gave the capacity to others (or, for a learned
  policy, chose to stop): a fairness or ordering decision, not a shortage;
- its minimum would fit the nodes but not the namespace's quota once the tasks decided before
  it count (the quota's own count, which WaitingForQuota reports, lags until their pods exist),
  or not its policy's fair share of contended GPUs (fair_share.py);
- its grouping has not given it a node pool yet;
- its minimum does not fit the nodes of the GPU types a role is restricted to
  (spec.replicaSpecs.<role>.gpuTypes): "no node of GPU type v100 has room for a worker ...".

"Free now" is what the decision leaves: the snapshot's capacity (other policies' and other
workloads' use already taken out, the namespace's quota as budget) less every task decided.
The test is a first-fit of the job's starting gang, honouring its template's node
constraints and its pool, so "would fit" means a node set for it exists.
"""

from __future__ import annotations

import numpy as np

from mlsched.cluster.ledger import Ledger
from mlsched.cluster.types import WAITING_POOL, Decision, JobDecision, JobView, Snapshot
from mlsched.controller.admission.counted_resources import POD_SLOTS, pods_room
from mlsched.controller.admission.counted_resources import describe as describe_counted
from mlsched.controller.constraints import gpu_labels
from mlsched.controller.constraints.host_ports import describe
from mlsched.controller.constraints.pod_anti_affinity import TOKEN
from mlsched.policies.base import book_held
from mlsched.policies.placement.heuristics import FirstFit
from mlsched.policies.round import with_pools


def _amount(v: np.ndarray) -> str:
    cpu, gpu, mem = (float(x) for x in v)
    return f"{gpu:g} GPU, {cpu:g} CPU, {mem:g} GiB"


def why_waiting(snapshot: Snapshot, decision: Decision, allocation: str,
                fair_share: str | None = None) -> dict[str, str]:
    """Per job of the snapshot that the decision gives nothing: why it waits. `fair_share`:
    the policy's fair share of contended GPUs in words, when one bounds the step (the budget
    is then that share as well as the quotas')."""
    view = with_pools(snapshot, decision.pools)
    waiting = [j for j in view.jobs if not (decision.jobs.get(j.name) or JobDecision()).workers]
    if not waiting:
        return {}
    if not view.node_names:
        return {j.name: "no node is schedulable now (cordoned, not Ready, or outside the "
                        "operator's node selector)" for j in waiting}
    ledger = Ledger(view, FirstFit(), decision.pools)
    jobs = {j.name: j for j in view.jobs}
    book_held(ledger, [(jobs[name], d) for name, d in decision.jobs.items() if name in jobs])
    free = ledger.free_total.copy()
    most = ledger.free_by_resource.max(axis=1)  # per resource, the most one node has free
    nodes = len(view.node_names)
    out = {}
    for job in waiting:
        if job.pool == WAITING_POOL:
            out[job.name] = "its grouping has not given it a node pool yet"
            continue
        gang = job.starting_gang
        need = _need(job, gang)
        if np.all(need <= free + 1e-9) and _gang_fits(ledger, job, gang):
            out[job.name] = (f"its minimum would fit what is free now, but {allocation} gave "
                             f"the capacity to other jobs this time")
            continue
        short = _exclusive_short(ledger, job, gang) if job.exclusive else None
        short = short or (_counted_short(ledger, job, gang) if job.counted else None)
        if short:
            out[job.name] = short
            continue
        if ledger.budget is not None and _fits_without_budget(ledger, job, gang):
            if fair_share is not None:
                out[job.name] = (f"its minimum would fit what is free now, but not within "
                                 f"{fair_share}, or what the namespace's ResourceQuotas leave, "
                                 f"once the tasks decided before it are counted")
                continue
            # The quota's own count (quotas.reasons, WaitingForQuota) does not show it yet.
            out[job.name] = ("its minimum would fit what is free now, but not in what the "
                             "namespace's ResourceQuotas leave once the tasks decided before it "
                             "are counted (this step's, and other policies' whose pods do not "
                             "exist yet)")
            continue
        short = _gpu_type_short(ledger, job, gang) if job.gpu_types else None
        out[job.name] = short or (
            f"its minimum ({_counts(job, gang)}: {_amount(need)}) does not fit "
            f"what is free now: {_amount(free)} on {nodes} nodes, at most "
            f"{_amount(most)} on any one")
    return out


def _gpu_type_short(ledger: Ledger, job: JobView, gang: tuple[int, int]) -> str | None:
    """Its minimum needs more room on the nodes of the GPU types a role is restricted to
    (JobView.gpu_types) than they have free now (the quota budget aside: a shortage of quota
    is told before this is asked)."""
    budget, ledger.budget = ledger.budget, None
    try:
        ps, workers = gang
        for role, count in (("worker", workers), ("ps", ps)):
            types = job.gpu_types.get(role) if count else None
            if not types:
                continue
            kind = f"GPU type {gpu_labels.describe(types)}"
            allowed = ledger.allowed_nodes(job, role)
            if allowed is None:
                allowed = np.ones(len(ledger.snapshot.node_names), dtype=bool)
            if not allowed.any():
                return f"no schedulable node of {kind} may take its {role} pods now"
            demand = np.asarray(ledger.demand(job, role), dtype=float)
            free = ledger.free_by_resource[:, allowed]
            room = _room(free, demand, ledger.fits_mask(demand, job, role)[allowed])
            if room >= count:
                continue
            on = (f"the {int(allowed.sum())} nodes of {kind} it may use have "
                  f"{_amount(free.sum(axis=1))} free, at most {_amount(free.max(axis=1))} on "
                  f"any one")
            if room == 0:
                return f"no node of {kind} has room for a {role} ({_amount(demand)}) now: {on}"
            return (f"its minimum ({_counts(job, gang)}) needs room for {count} {role} on "
                    f"nodes of {kind}; there is room for {room} now: {on}")
        return None
    finally:
        ledger.budget = budget


def _room(free: np.ndarray, demand: np.ndarray, fits: np.ndarray) -> int:
    """How many tasks of `demand` the nodes (columns of `free`) hold, on those that `fits`."""
    if not fits.any():
        return 0
    asked = demand > 0
    if not asked.any():
        return 1 << 30  # asks for nothing: room everywhere it fits
    per_node = np.floor(np.min(free[asked][:, fits] / demand[asked, None], axis=0) + 1e-9)
    return int(per_node.sum())


def _fits_without_budget(ledger: Ledger, job: JobView, gang: tuple[int, int]) -> bool:
    """Whether its minimum would fit were it not for the quota budget (the ledger as it was)."""
    budget, ledger.budget = ledger.budget, None
    try:
        return _gang_fits(ledger, job, gang)
    finally:
        ledger.budget = budget


def _gang_fits(ledger: Ledger, job: JobView, gang: tuple[int, int]) -> bool:
    """Whether its minimum can be granted now (the ledger left as it was)."""
    if not ledger.grant(job, *gang):
        return False
    d = ledger.jobs[job.name]
    ledger.release(job, [("ps", n) for n in d.ps_nodes] + [("worker", n) for n in d.worker_nodes])
    return True


def _exclusive_short(ledger: Ledger, job: JobView, gang: tuple[int, int]) -> str | None:
    """Its minimum needs more nodes where a host port (or its spreading anti-affinity) is
    free than there are now."""
    ps, workers = gang
    for role, count in (("ps", ps), ("worker", workers)):
        for thing in sorted(job.holds(role) if count else (), key=str):
            free_nodes = ledger.exclusive_free_nodes(job, role, thing)
            taken, total = len(free_nodes) - int(free_nodes.sum()), len(free_nodes)
            if total - taken >= count:
                continue
            if thing[0] == TOKEN:
                return (f"its minimum ({_counts(job, gang)}) needs {count} nodes without a pod "
                        f"its required pod anti-affinity ({thing[1]}) keeps its {role} pods "
                        f"from; such pods are on {taken} of the {total} nodes")
            return (f"its minimum ({_counts(job, gang)}) needs {count} nodes where host port "
                    f"{describe([thing])} is free (one {role} pod per node holds it); other "
                    f"pods hold it on {taken} of the {total} nodes")
    return None


def _counted_short(ledger: Ledger, job: JobView, gang: tuple[int, int]) -> str | None:
    """Its minimum needs more pod slots (or more of an extended resource) than the nodes it
    may use have free now (counted_resources.py)."""
    ps, workers = gang
    for role, count in (("ps", ps), ("worker", workers)):
        allowed = ledger.allowed_nodes(job, role) if count else None
        for name, amount in job.takes(role) if count else ():
            free = ledger.counted_free[name] if allowed is None else ledger.counted_free[name][allowed]
            room = float(pods_room(free, amount).sum())
            if room >= count:
                continue
            if name == POD_SLOTS:
                return (f"its minimum ({_counts(job, gang)}) needs {count} {role} pods; the "
                        f"{len(free)} nodes it may use have {room:g} pod slots free now (other "
                        f"pods take the rest of their allocatable pods)")
            return (f"its minimum ({_counts(job, gang)}) needs {count} {role} pods taking "
                    f"{describe_counted(name, amount)} each; the {len(free)} nodes it may use "
                    f"have room for {room:g} such pods now (other pods hold the rest)")
    slots = ledger.counted_free.get(POD_SLOTS)
    if slots is not None and ps + workers > slots.sum() + 1e-9:
        return (f"its minimum ({_counts(job, gang)}) needs {ps + workers} pods; the "
                f"{len(slots)} nodes have {slots.sum():g} pod slots free now (other pods "
                f"take the rest of their allocatable pods)")
    return None


def _need(job: JobView, gang: tuple[int, int]) -> np.ndarray:
    ps, workers = gang
    total = workers * np.asarray(job.demand("worker"), dtype=float)
    if ps:
        total = total + ps * np.asarray(job.demand("ps"), dtype=float)
    return total


def _counts(job: JobView, gang: tuple[int, int]) -> str:
    ps, workers = gang
    return " and ".join(([f"{ps} ps"] if ps else []) + [f"{workers} worker"])


"""Tasks whose decided node no longer takes them: placed again by the next admission step,
not left Pending until the policy's next round.

A node is drained (cordoned, its pods evicted), deleted (the pod garbage collector removes
its pods), tainted, or stops being Ready. The StatefulSet recreates the lost pods, but the
node their ordinals were decided on refuses them, so they would stay Pending until the next
round (20 minutes by default), and a parameter-server job missing a PS, or an all-reduce job
missing a worker, trains nothing meanwhile.

The rule: a task is displaced when its decided node cannot take a new pod of its role now
(deleted, not Ready, cordoned, outside the operator's node selector, a taint or label its
template does not accept) and its pod is not running there. A pod still running on a cordoned
or NotReady node is left alone, as Kubernetes leaves it (a cordon is often the first step of
maintenance, a NotReady spell often passes); once it is evicted, it is displaced. The round
itself moves every task off a node it may no longer use (loop.held_as_decided).

`round.run_admission` places the displaced tasks again with the policy's placement rule, the
job's other tasks kept on their nodes and ordinals.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from mlsched.controller.node_constraints import EVERY_NODE, NodeConstraint
from mlsched.controller.records import TERMINAL_POD_PHASES, JobRecord, NodeRecord, PodRecord
from mlsched.controller.snapshot import untolerated, usable

#: (role, ordinal) -> why its decided node no longer takes it
Displaced = dict[tuple[str, int], str]


def refusal(node: NodeRecord | None, constraint: NodeConstraint, node_selector: Mapping[str, str],
            tolerated_taints: frozenset[str]) -> str | None:
    """Why `node` cannot take a new pod of a role with this template constraint now; None if
    it can (what kube-scheduler would check, for the fields the operator plans with)."""
    if node is None:
        return "deleted"
    if not node.ready:
        return "not Ready"
    if node.unschedulable:
        return "cordoned"
    if not usable(node, node_selector):
        return "outside the operator's node selector"
    taints = untolerated(node, tolerated_taints)
    if constraint.allows(node.name, node.labels, taints):
        return None
    if not constraint.allows(node.name, node.labels):
        return "labels its template does not select"
    refused = [t for t in taints if not any(tol.tolerates(t) for tol in constraint.tolerations)]
    return "tainted " + ", ".join(f"{k}={v}:{e}" if v else f"{k}:{e}" for k, v, e in refused)


def _holds(pod: PodRecord, node: str) -> bool:
    """The pod is on `node` and not gone: bound there (scheduled or running) and not ending."""
    return (pod.bound and pod.node == node and not pod.deleting
            and pod.phase not in TERMINAL_POD_PHASES)


def displaced_tasks(job: JobRecord, decided: Mapping[str, tuple[str, ...]],
                    pods: Iterable[PodRecord], nodes: Mapping[str, NodeRecord],
                    node_selector: Mapping[str, str], tolerated_taints: frozenset[str],
                    cache: dict | None = None) -> Displaced:
    """The job's displaced tasks (see the module docstring); {} when none. `cache` (one dict
    per admission step) keeps each (node, constraint) verdict: most jobs share both."""
    cache = {} if cache is None else cache
    by_task = {(p.role, p.ordinal): p for p in pods}
    out: Displaced = {}
    for role, names in decided.items():
        constraint = job.node_constraints.get(role, EVERY_NODE)
        for ordinal, name in enumerate(names):
            key = (name, constraint)
            if key not in cache:
                cache[key] = refusal(nodes.get(name), constraint, node_selector, tolerated_taints)
            why = cache[key]
            if why is None:
                continue
            pod = by_task.get((role, ordinal))
            if pod is not None and _holds(pod, name):
                continue
            out[(role, ordinal)] = f"{name} ({why})"
    return out


def describe(job_name: str, tasks: Displaced) -> str:
    """`bert-ps-1, bert-ps-3 on node-3 (cordoned)`: the tasks grouped by node and reason."""
    by_node: dict[str, list[str]] = {}
    for (role, ordinal), where in sorted(tasks.items()):
        by_node.setdefault(where, []).append(f"{job_name}-{role}-{ordinal}")
    return "; ".join(f"{', '.join(names)} on {where}" for where, names in by_node.items())


def slots(decided: Mapping[str, tuple[str, ...]], tasks: Displaced,
          index: Mapping[str, int]) -> dict[str, tuple[int | None, ...]]:
    """Per role, the decided node index of each ordinal, None where the task is to be placed
    again: displaced, or on a node the step may not use (not in the snapshot)."""
    return {role: tuple(None if (role, k) in tasks else index.get(name)
                        for k, name in enumerate(names))
            for role, names in decided.items()}

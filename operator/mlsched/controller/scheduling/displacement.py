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

A task is displaced too when kube-scheduler refuses its pod on the decided node (PodScheduled
False, Unschedulable): a constraint the operator does not plan with (a pod anti-affinity
pod_anti_affinity.py does not plan, pod affinity, a volume's node affinity) or capacity a
preemptor took since. Such a node is remembered for the job's role (`Refusals`) and avoided
when the role's tasks are placed again, so a job is not sent back where it was refused; the
memory fades after REFUSAL_TTL_S, since capacity comes back, and after MAX_MOVES moves in
that time a refused pod is left where it is, reported Unschedulable. A refusal on a node where one of
the policy's own pods is leaving waits for that pod to go, and for DEPARTURE_SETTLE_S after:
it may hold the room. Leaving: being deleted, beyond its role's decided count (the
StatefulSet's scale-down removes it) or decided onto another node (the step's DeletePod).
A round that shrinks jobs gives their room to others at once, so the new pods are pinned
where old ones still run for a while; and once those go, the refusal stays in the pod's
status until kube-scheduler tries again. Acting on either moved 200-270 pods per 2,000-job
settling (bench_e2e (b), 28 Nov), each move a refusal elsewhere as likely.

`round.run_admission` places the displaced tasks again with the policy's placement rule, the
job's other tasks kept on their nodes and ordinals.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

from mlsched.controller.constraints.node_constraints import EVERY_NODE, NodeConstraint
from mlsched.controller.objects.records import NodeRecord, PodRecord
from mlsched.controller.objects.job_records import JobRecord
from mlsched.controller.objects.quantities import TERMINAL_POD_PHASES
from mlsched.controller.scheduling.cluster_state import untolerated, usable


class Displacement(NamedTuple):
    """Why one task is displaced: its decided node, why that node no longer takes it, and
    whether kube-scheduler said so (a refusal to remember) rather than the node's state."""

    node: str
    why: str
    by_scheduler: bool = False


#: (role, ordinal) -> its displacement
Displaced = dict[tuple[str, int], Displacement]

REFUSAL_TTL_S = 600.0
#: Moves (admission steps that displace some of a role's refused pods) per REFUSAL_TTL_S:
#: after these, refused pods stay where they are, reported Unschedulable. Bin-packed tasks
#: refused by a one-per-node anti-affinity are spread in about log2(tasks) moves; what no
#: node can take (a volume that cannot bind) must not restart pods forever.
MAX_MOVES = 5
#: After one of the policy's pods leaves a node, how long a refusal there is taken as stale
#: (kube-scheduler retries refused pods when a pod goes; under load, within seconds).
DEPARTURE_SETTLE_S = 10.0


class Refusals:
    """Per job and role, the nodes kube-scheduler refused a pinned pod on and the moves made
    for such refusals, each with when: both fade after `ttl_s`."""

    def __init__(self, ttl_s: float = REFUSAL_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._nodes: dict[tuple[tuple[str, str], str], dict[str, float]] = {}
        self._moves: dict[tuple[tuple[str, str], str], list[float]] = {}
        self._departures: dict[str, float] = {}  # node -> when a pod of ours last left it

    def departed(self, node: str, now: float) -> None:
        """A bound pod of a job left `node`: refusals there are stale for a while."""
        self._departures[node] = now

    def settling(self, now: float) -> frozenset[str]:
        """Nodes a pod of ours left less than DEPARTURE_SETTLE_S ago."""
        for node in [n for n, t in self._departures.items() if now - t >= DEPARTURE_SETTLE_S]:
            del self._departures[node]
        return frozenset(self._departures)

    def note(self, job: tuple[str, str], role: str, nodes: Iterable[str], now: float) -> None:
        """One move of the role's tasks away from `nodes`, which refused them."""
        seen = self._nodes.setdefault((job, role), {})
        for node in nodes:
            seen[node] = now
        self._moves.setdefault((job, role), []).append(now)

    def of(self, job: tuple[str, str], role: str, now: float) -> frozenset[str]:
        nodes = self._nodes.get((job, role))
        if not nodes:
            return frozenset()
        for node in [n for n, t in nodes.items() if now - t > self.ttl_s]:
            del nodes[node]
        return frozenset(nodes)

    def moves(self, job: tuple[str, str], role: str, now: float) -> int:
        times = self._moves.get((job, role))
        if not times:
            return 0
        times[:] = [t for t in times if now - t <= self.ttl_s]
        return len(times)

    def forget(self, job: tuple[str, str]) -> None:
        for book in (self._nodes, self._moves):
            for key in [k for k in book if k[0] == job]:
                del book[key]


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
    if constraint.allows(node.name, node.labels, taints, node.extended):
        return None
    if not constraint.has_resources(node.extended):
        return "lacks " + ", ".join(k for k, v in constraint.resources
                                    if node.extended.get(k, 0.0) < v)
    if not constraint.allows(node.name, node.labels, (), node.extended):
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
                    moves: Mapping[str, int] | None = None,
                    vacating: frozenset[str] = frozenset(),
                    cache: dict | None = None) -> Displaced:
    """The job's displaced tasks (see the module docstring); {} when none.

    `moves`: per role, the moves made lately for kube-scheduler's refusals (Refusals.moves);
    after MAX_MOVES a refused pod stays where it is, reported Unschedulable: what it lacks is
    then likely lacking everywhere, and moving it on would restart it again and again.
    `vacating`: nodes where a pod of the policy's jobs is leaving or left lately (see
    the module doc); a refusal there may be the room that pod holds or held, so it waits:
    the pod's deletion, and the settle time after it, wake the next admission step.
    `cache` (one dict per step) keeps each (node, constraint) verdict."""
    cache = {} if cache is None else cache
    moves = moves or {}
    by_task = {(p.role, p.ordinal): p for p in pods}
    out: Displaced = {}
    for role, names in decided.items():
        constraint = job.node_constraints.get(role, EVERY_NODE)
        may_move = moves.get(role, 0) < MAX_MOVES
        for ordinal, name in enumerate(names):
            pod = by_task.get((role, ordinal))
            if pod is not None and refused_there(pod, name):
                if may_move and name not in vacating:
                    out[(role, ordinal)] = Displacement(
                        name, f"kube-scheduler: {pod.unschedulable}", by_scheduler=True)
                continue
            key = (name, constraint)
            if key not in cache:
                cache[key] = refusal(nodes.get(name), constraint, node_selector, tolerated_taints)
            why = cache[key]
            if why is None or (pod is not None and _holds(pod, name)):
                continue
            out[(role, ordinal)] = Displacement(name, why)
    return out


def leaving_pods(pods: Iterable[PodRecord], decided: Mapping[str, tuple[str, ...]] | None
                 ) -> Iterator[PodRecord]:
    """The job's bound pods that are leaving their node: being deleted, beyond their role's
    decided count, or decided onto another node."""
    for pod in pods:
        if not pod.bound or not pod.node or pod.phase in TERMINAL_POD_PHASES:
            continue
        names = (decided or {}).get(pod.role, ())
        if pod.deleting or pod.ordinal >= len(names) or names[pod.ordinal] != pod.node:
            yield pod


def leaving(pods: Iterable[PodRecord], decided: Mapping[str, tuple[str, ...]] | None) -> set[str]:
    """Nodes one of the job's bound pods is leaving (leaving_pods)."""
    return {pod.node for pod in leaving_pods(pods, decided)}


class Vacating:
    """For the jobs' conditions: the nodes a pod of any of our jobs is leaving (node -> that
    pod's name) or left lately (node -> ""). A pod pinned there and refused by kube-scheduler
    waits for that room, as the admission step lets it (displaced_tasks' `vacating`): its job
    is starting, not Unschedulable. A round that shrinks jobs to admit others pins the new pods
    where the old ones are still saving their checkpoints; every such job used to turn
    Unschedulable with a Warning Event, until the old pod had gone.

    Worked out over every job's pods at most once a second, and only when a job with a refused
    pod asks (a 2,000-job round refuses hundreds at once, each evaluated several times); sooner
    (after MIN_REFRESH_S) when asked about a node the last answer does not name, which a round
    may have started to vacate since: a false alarm is a Warning Event the user sees."""

    REFRESH_S = 1.0
    MIN_REFRESH_S = 0.1

    def __init__(self) -> None:
        self._at = float("-inf")
        self._nodes: dict[str, str] = {}

    def nodes(self, pods: Any,
              decided_of: Callable[[Any], Mapping[str, tuple[str, ...]] | None],
              settling: Iterable[str], now: float,
              asked: Iterable[str] = ()) -> Mapping[str, str]:
        """`pods`: the pods index by job (Indexes.pods, a indexes.Owned: its `strays()`,
        children of an earlier job of the same name, are leaving too); `decided_of`: a job's decided nodes per role;
        `settling`: Refusals.settling; `asked`: the nodes the caller looks up."""
        age = now - self._at
        if age < self.MIN_REFRESH_S or (
                age < self.REFRESH_S and all(node in self._nodes for node in asked)):
            return self._nodes
        out = dict.fromkeys(settling, "")
        found = [pod for key, records in pods.items()
                 for pod in leaving_pods(records, decided_of(key))]
        found += [pod for pod in pods.strays()
                  if pod.bound and pod.node and pod.phase not in TERMINAL_POD_PHASES]
        for pod in sorted(found, key=lambda p: p.name, reverse=True):  # the first name wins
            out[pod.node] = pod.name
        self._at, self._nodes = now, out
        return out


def refused_there(pod: PodRecord, node: str) -> bool:
    """kube-scheduler refuses the pod on `node`, where the operator pinned it."""
    return bool(pod.unschedulable) and pod.pinned == node and not pod.deleting and not pod.bound


def describe(job_name: str, tasks: Displaced) -> str:
    """`bert-ps-1, bert-ps-3 on node-3 (cordoned)`: the tasks grouped by node and reason."""
    by_node: dict[str, list[str]] = {}
    for (role, ordinal), d in sorted(tasks.items()):
        by_node.setdefault(f"{d.node} ({d.why})", []).append(f"{job_name}-{role}-{ordinal}")
    return "; ".join(f"{', '.join(names)} on {where}" for where, names in by_node.items())


def avoided(job: JobRecord, roles: Iterable[str], refusals: Refusals, now: float,
            index: Mapping[str, int]) -> dict[str, frozenset[int]]:
    """Per role, the node indices its tasks must not be placed again on: where kube-scheduler
    refused one of its pods lately (this step's refusals noted already)."""
    out = {}
    for role in roles:
        found = frozenset(index[n] for n in refusals.of(job.key, role, now) if n in index)
        if found:
            out[role] = found
    return out


def slots(decided: Mapping[str, tuple[str, ...]], tasks: Displaced,
          index: Mapping[str, int]) -> dict[str, tuple[int | None, ...]]:
    """Per role, the decided node index of each ordinal, None where the task is to be placed
    again: displaced, or on a node the step may not use (not in the snapshot)."""
    return {role: tuple(None if (role, k) in tasks else index.get(name)
                        for k, name in enumerate(names))
            for role, names in decided.items()}

"""The nodes the operator places on (`ClusterFit`), once per change of the node index: why a
job can never fit (its minimum against the usable nodes' allocatable, its templates'
constraints and counted resources). Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any


from mlsched.controller.admission.counted_resources import (
    POD_SLOTS, available, extended_of, pods_room,
)
from mlsched.controller.admission.counted_resources import describe as describe_counted
from mlsched.controller.admission.counted_resources import source as counted_source
from mlsched.controller.constraints.pod_anti_affinity import describe_exclusive
from mlsched.controller.constraints.node_constraints import EVERY_NODE, NodeConstraint, Taint
from mlsched.controller.objects.records import NodeRecord
from mlsched.controller.objects.job_records import JobRecord
from mlsched.controller.objects.quantities import NO_RESOURCES, Resources, add
from mlsched.controller.scheduling.cluster_state import exclusive_of, untolerated, usable



def _describe(r: Resources) -> str:
    cpu, gpu, mem = r
    return f"{cpu:g} CPU, {gpu:g} GPU, {mem:g} GiB"


@dataclass(frozen=True)
class ClusterFit:
    """The nodes the operator places on, once per change of the node index, to tell jobs that
    can never fit. `taints`: per node, what a template must tolerate itself."""

    nodes: tuple[NodeRecord, ...]
    taints: Mapping[str, tuple[Taint, ...]]

    @classmethod
    def of(cls, nodes: Iterable[NodeRecord], *, node_selector: Mapping[str, str] | None = None,
           tolerated_taints: frozenset[str] = frozenset()) -> ClusterFit:
        usable_nodes = tuple(n for n in nodes if usable(n, node_selector or {}))
        return cls(usable_nodes, {n.name: untolerated(n, tolerated_taints) for n in usable_nodes})

    @cached_property
    def _fewest_slots(self) -> float:
        return min((n.pods for n in self.nodes), default=0.0)

    @cached_property
    def _by_name(self) -> dict[str, NodeRecord]:
        return {n.name: n for n in self.nodes}

    # What the node scans below give depends only on a role's template (its constraint) and
    # demand, which the jobs of a burst and of a sweep share: each is made once per instance
    # (rebuilt when the nodes change), not once per job (500 nodes scanned twice per new job
    # were a tenth of the operator's event loop in a burst of 200, bench_e2e).
    @cached_property
    def _scans(self) -> dict[tuple, Any]:
        return {}

    def _allowed(self, constraint: NodeConstraint) -> list[NodeRecord]:
        key = ("allowed", constraint)
        found = self._scans.get(key)
        if found is None:
            found = self._scans[key] = [
                n for n in self.nodes
                if constraint.allows(n.name, n.labels, self.taints[n.name], n.extended)]
        return found

    def _fitting(self, constraint: NodeConstraint, demand: Resources) -> frozenset[str]:
        """The allowed nodes that can hold one pod of `demand`."""
        key = ("fitting", constraint, demand)
        found = self._scans.get(key)
        if found is None:
            found = self._scans[key] = frozenset(
                n.name for n in self._allowed(constraint)
                if all(d <= a for d, a in zip(demand, n.allocatable)))
        return found

    def _room(self, constraints: frozenset[NodeConstraint]) -> tuple[dict[str, NodeRecord], Resources]:
        """The nodes any of `constraints` allows, and their allocatable summed."""
        key = ("room", constraints)
        found = self._scans.get(key)
        if found is None:
            nodes = {n.name: n for c in constraints for n in self._allowed(c)}
            total = NO_RESOURCES
            for n in nodes.values():
                total = add(total, n.allocatable)
            found = self._scans[key] = (nodes, total)
        return found

    def why_not(self, job: JobRecord) -> str | None:
        """Why the job's minimum (`min` of every role, admitted together) cannot run even on
        an empty cluster; None when it can. A job that only waits for others to finish is
        never told this (Kueue's "inadmissible" as against "pending")."""
        roles = [("ps", job.bounds("ps")[0])] if job.arch == "ps" else []
        roles.append(("worker", job.min_workers))
        constraints: set[NodeConstraint] = set()
        fitting: dict[str, frozenset[str]] = {}  # per role, the nodes that can hold one of its pods
        for role, count in roles:
            demand = tuple(job.demands.get(role, NO_RESOURCES))
            constraint = job.node_constraints.get(role)
            nodes = self._allowed(constraint or EVERY_NODE)
            constraints.add(constraint or EVERY_NODE)
            where = (f"the cluster's {len(nodes)} schedulable nodes" if constraint is None
                     else f"the {len(nodes)} schedulable nodes its template allows ({constraint})")
            if constraint is not None and not nodes:
                return (f"no schedulable node matches the {role} template's {constraint} "
                        f"(of the cluster's {len(self.nodes)} schedulable nodes)")
            fitting[role] = self._fitting(constraint or EVERY_NODE, demand)
            if not fitting[role]:
                return (f"one {role} asks for {_describe(demand)} and none of {where} has that "
                        f"much allocatable")
            if constraint is not None and count:
                room = self._room(frozenset((constraint,)))[1]
                role_need = tuple(count * d for d in demand)
                if any(x > h for x, h in zip(role_need, room)):
                    return (f"its minimum of {count} {role} needs {_describe(role_need)}; "
                            f"{where} have {_describe(room)} allocatable in all")
        need = job.minimum_requests()
        allowed_any, total = self._room(frozenset(constraints))
        if any(n > h for n, h in zip(need, total)):
            wanted = " and ".join(f"{count} {role}" for role, count in roles)
            return (f"its minimum ({wanted}) needs {_describe(need)}; the cluster's "
                    f"{len(allowed_any)} schedulable nodes have {_describe(total)} "
                    f"allocatable in all")
        return (self._exclusive_why_not(job, roles, fitting)
                or self._counted_why_not(job, roles, fitting, allowed_any))

    def _counted_why_not(self, job: JobRecord, roles: list[tuple[str, int]],
                         fitting: Mapping[str, set[str]],
                         allowed_any: Mapping[str, NodeRecord]) -> str | None:
        """A minimum needing more pod slots, or more of an extended resource, than the nodes
        that could take its pods have allocatable (counted_resources.py). Pod slots are summed
        only when the fewest any node has could be too few (a sweep asks this of every job)."""
        for role, count in roles:
            counted = extended_of(job, role)
            if count > len(fitting[role]) * self._fewest_slots:
                counted += ((POD_SLOTS, 1.0),)
            nodes = [self._by_name[name] for name in fitting[role]] if counted else []
            for name, amount in counted:
                room = sum(pods_room(available(n, name), amount) for n in nodes)
                if count > room:
                    what = ("pods" if name == POD_SLOTS
                            else f"pods taking {describe_counted(name, amount)} each")
                    return (f"its minimum of {count} {role} needs {count} {what}; the "
                            f"{len(nodes)} schedulable nodes that can take one have room for "
                            f"{room:g} ({counted_source(name)})")
        total = sum(count for _, count in roles)
        if total > len(allowed_any) * self._fewest_slots and \
                total > (slots := sum(n.pods for n in allowed_any.values())):
            wanted = " and ".join(f"{count} {role}" for role, count in roles)
            return (f"its minimum ({wanted}) needs {total} pods; the cluster's "
                    f"{len(allowed_any)} schedulable nodes allow {slots:g} in all "
                    f"(allocatable pods)")
        return None

    @staticmethod
    def _exclusive_why_not(job: JobRecord, roles: list[tuple[str, int]],
                           fitting: Mapping[str, set[str]]) -> str | None:
        """A host port or spreading anti-affinity its minimum holds more often than there are
        nodes to hold it."""
        held = exclusive_of(job, [s for found in job.anti_affinity.values() for s in found])
        for thing in sorted(set().union(*held.values()), key=str):
            holders = [(role, count) for role, count in roles if count and thing in held.get(role, ())]
            nodes = set().union(*(fitting[role] for role, _ in holders))
            if sum(count for _, count in holders) > len(nodes):
                who = " and ".join(f"{count} {role}" for role, count in holders)
                return (f"its minimum ({who}) {describe_exclusive(thing)}: one such pod per node, "
                        f"and only {len(nodes)} schedulable nodes can take one")
        return None

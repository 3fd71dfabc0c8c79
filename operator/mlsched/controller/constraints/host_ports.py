"""Host ports: what a pod holds on its node besides CPU, GPU and memory.

Distributed training often runs with `hostNetwork: true` (RDMA, NCCL over the host's NICs),
and then every `containerPort` is a port on the node: the API server defaults each one's
`hostPort` to its `containerPort`. kube-scheduler (its NodePorts filter) puts at most one pod
using a given host port and protocol on a node. A template with `hostNetwork` and
`containerPort: 29500` can therefore run one worker per node, and two jobs from the same
template cannot share a node at all.

The rounds used to pack such tasks as if only resources counted: kube-scheduler refused the
second pod on each node ("didn't have free ports for the requested pod ports"), the
displacement machinery moved it, and a second job whose port was taken on every node was
admitted, held its GPUs with every pod Pending and was reported Unschedulable. Now each role's
host ports are part of its demand: the ledger books them per node (cluster/ledger.py), ports
held by pods the round does not re-decide, and by tasks other policies decided whose pods may
not exist yet, are taken out first (cluster_state.held_ports), a job
whose minimum needs more nodes than allow its ports is told CannotFit, and one whose port is
taken where it could run waits, holding nothing.

Which ports count is kube-scheduler 1.34's rule, checked on the e2e control plane: app
containers and sidecars (init containers with `restartPolicy: Always`); a regular init
container's ports do not. A port is (protocol, number). The host IP is left out, which
over-counts only two pods binding the same port on two different specific host IPs of one
node (kube-scheduler lets them share it; the planner keeps them apart).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

HostPort = tuple[str, int]  # (protocol, port)
NO_PORTS: frozenset[HostPort] = frozenset()


def host_ports(spec: Mapping[str, Any] | None) -> frozenset[HostPort]:
    """The host ports a pod of this spec holds on its node (see the module docstring)."""
    if not isinstance(spec, Mapping):
        return NO_PORTS
    host_network = bool(spec.get("hostNetwork"))
    containers = [c for c in spec.get("containers") or () if isinstance(c, Mapping)]
    containers += [c for c in spec.get("initContainers") or ()
                   if isinstance(c, Mapping) and c.get("restartPolicy") == "Always"]
    out = set()
    for container in containers:
        for port in container.get("ports") or ():
            if not isinstance(port, Mapping):
                continue
            number = port.get("hostPort") or (port.get("containerPort") if host_network else None)
            if isinstance(number, int) and number > 0:
                out.add((str(port.get("protocol") or "TCP"), number))
    return frozenset(out) if out else NO_PORTS


def role_host_ports(templates: Mapping[str, Any]) -> dict[str, frozenset[HostPort]]:
    """Per role, the host ports one pod of its template holds (roles holding none left out)."""
    out = {}
    for role, template in templates.items():
        ports = host_ports(template.get("spec") if isinstance(template, Mapping) else None)
        if ports:
            out[role] = ports
    return out


def describe(ports: Iterable[HostPort]) -> str:
    """`29500/TCP, 29501/TCP`: how kubectl writes ports."""
    return ", ".join(f"{number}/{protocol}" for protocol, number in sorted(ports, key=lambda p: (p[1], p[0])))

"""Required pod anti-affinity per node: "at most one of these pods on a node", planned.

Users spread a job's workers over nodes (bandwidth, failure isolation) with a template like

    affinity:
      podAntiAffinity:
        requiredDuringSchedulingIgnoredDuringExecution:
        - labelSelector: {matchLabels: {app: trainer}}
          topologyKey: kubernetes.io/hostname

kube-scheduler then refuses a pod on a node where a pod matching the selector runs (and, by
symmetry, a matching pod next to one carrying the term). The rounds used to pack such tasks by
resources alone; kube-scheduler refused them where they were pinned and displacement.py moved
them, a job shrinking when the moves ran out. Such a term is now one more thing a task holds
on its node alone, as a host port is (host_ports.py, the ledger's `exclusive`): a token per
distinct selector, held by every role (of any job its policy decides) whose pods match it.

What is planned, and what is left to kube-scheduler (a refusal moves the task):
- terms with `topologyKey: kubernetes.io/hostname` whose selector matches the role's own pods
  (the spreading case); a term on another topology key (zone), a term that only repels other
  pods, or one with `namespaces`, a `namespaceSelector`, `matchLabelKeys` or
  `mismatchLabelKeys` is not planned;
- pods the round does not re-decide (other policies' jobs, other workloads) hold a selector
  on their node when they are in the job's namespace and match it (cluster_state.held_selected);
  other workloads' own terms repel the job's pods by symmetry ("keep training off my node":
  `mlsched.io/job-name Exists`): a role whose pods match one is kept off that pod's node
  (`node_selectors`, snapshot.repelled_masks); other jobs' terms that only repel are not read;
- a role that matches a selector without carrying the term is kept apart from its own kind
  too, which kube-scheduler would allow (they repel only the term's carriers): the planner is
  stricter, never looser.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mlsched.controller.kube.constants import HOSTNAME_LABEL
from mlsched.controller.constraints.host_ports import describe
from mlsched.controller.constraints.label_selector import Selector, parse_selector, per_role

#: The token a selector's holders share on a node (the ledger compares tokens by equality).
TOKEN = "pod-anti-affinity"
_UNPLANNED_KEYS = ("namespaces", "namespaceSelector", "matchLabelKeys", "mismatchLabelKeys")


def spreading_selectors(spec: Any, own_labels: Mapping[str, str]) -> tuple[Selector, ...]:
    """The selectors of the pod spec's required anti-affinity terms that are planned (see the
    module docstring): per node, and matching the pod's own labels."""
    return tuple(s for s in node_selectors(spec) if s.matches(own_labels))


def node_selectors(spec: Any) -> tuple[Selector, ...]:
    """The selectors of the pod spec's required anti-affinity terms per node (hostname
    topology) naming no other namespace: the pods it keeps off its node."""
    affinity = spec.get("affinity") if isinstance(spec, Mapping) else None
    anti = affinity.get("podAntiAffinity") if isinstance(affinity, Mapping) else None
    terms = anti.get("requiredDuringSchedulingIgnoredDuringExecution") if isinstance(anti, Mapping) else None
    out = []
    for term in terms if isinstance(terms, list) else ():
        if not isinstance(term, Mapping) or term.get("topologyKey") != HOSTNAME_LABEL \
                or any(term.get(k) for k in _UNPLANNED_KEYS):
            continue
        selector = parse_selector(term.get("labelSelector"))
        if selector is not None and selector not in out:
            out.append(selector)
    return tuple(out)


def role_anti_affinity(templates: Mapping[str, Any],
                       labels: Mapping[str, Mapping[str, str]]) -> dict[str, tuple[Selector, ...]]:
    """Per role, spreading_selectors of its template (roles with none left out); `labels`:
    per role, what its pods carry."""
    return per_role(templates, labels, spreading_selectors)


def token(selector: Selector) -> tuple[str, Selector]:
    return (TOKEN, selector)


def describe_exclusive(thing: tuple) -> str:
    """What a JobView.exclusive token is, in a condition's words: a host port or a spreading
    anti-affinity."""
    if thing and thing[0] == TOKEN:
        return f"is spread one pod per node by its required pod anti-affinity ({thing[1]})"
    return f"holds host port {describe([thing])} (a hostPort, or a containerPort under hostNetwork)"

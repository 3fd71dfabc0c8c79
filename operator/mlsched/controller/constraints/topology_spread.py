"""A template's topologySpreadConstraints, enforced by the planner because the pin defeats them.

    topologySpreadConstraints:
    - maxSkew: 1
      topologyKey: kubernetes.io/hostname      # or topology.kubernetes.io/zone
      whenUnsatisfiable: DoNotSchedule
      labelSelector: {matchLabels: {app: trainer}}

kube-scheduler counts the pods matching the selector per topology domain (node, zone) among
the nodes the pod's own nodeSelector and node affinity allow (`nodeAffinityPolicy: Honor`, the
default). The operator pins every pod with a nodeSelector on its node's hostname (desired.py),
so that set is one node and the skew is always 0: kube-scheduler never refuses a pinned pod for
spread. Tried on the e2e control plane (1.34): a bin-packed job with maxSkew 1 on the hostname
ran two workers on each of two nodes while four nodes stood empty, nothing said. The planner
is therefore the one that enforces the constraint, with the user's meaning: placing a task of
a role that carries it on a node whose domain already has `min + maxSkew` matching tasks
(`min`: the fewest in any domain the template allows; 0 when fewer such domains than
`minDomains`) is not allowed, and nodes without the topology key are never used for it
(cluster/ledger.py books the counts).

What is counted and what is not:
- the tasks of the jobs a round decides whose pods match the selector (any of them, whichever
  carries the constraint), and the matching pods of the namespace it does not decide (other
  workloads', other policies' jobs' and the tasks those were decided: cluster_state.held_labelled),
  in the domain of their node, cordoned or not (Spreads.held); kube-scheduler counts them all;
- the domains are those of the nodes the round can place on (Ready, not cordoned, inside the
  operator's node selector) that the template allows; kube-scheduler would also count
  cordoned and tainted nodes (`nodeTaintsPolicy: Ignore`), which only makes it stricter;
- only `whenUnsatisfiable: DoNotSchedule` (ScheduleAnyway is a preference), only selectors
  that match the role's own pods, and not constraints with `matchLabelKeys` (they count per
  revision, which the pin makes vacuous all the same: they are left as they are).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mlsched.controller.constraints.label_selector import Selector, parse_selector, per_role


@dataclass(frozen=True, slots=True)
class SpreadConstraint:
    selector: Selector
    topology_key: str
    max_skew: int
    min_domains: int = 1
    honor_affinity: bool = True  # nodeAffinityPolicy: Honor (default) or Ignore

    def __str__(self) -> str:
        return f"at most {self.max_skew} more per {self.topology_key} than the emptiest ({self.selector})"


def spread_constraints(spec: Any, own_labels: Mapping[str, str]) -> tuple[SpreadConstraint, ...]:
    """The pod spec's constraints the planner enforces (see the module docstring)."""
    raw = spec.get("topologySpreadConstraints") if isinstance(spec, Mapping) else None
    out = []
    for c in raw if isinstance(raw, list) else ():
        if not isinstance(c, Mapping) or c.get("whenUnsatisfiable") != "DoNotSchedule" \
                or c.get("matchLabelKeys"):
            continue
        key, skew, minimum = c.get("topologyKey"), c.get("maxSkew"), c.get("minDomains")
        selector = parse_selector(c.get("labelSelector"))
        if not isinstance(key, str) or not key or not isinstance(skew, int) or skew < 1 \
                or selector is None or not selector.matches(own_labels):
            continue
        found = SpreadConstraint(selector, key, skew,
                                 minimum if isinstance(minimum, int) and minimum > 1 else 1,
                                 c.get("nodeAffinityPolicy") != "Ignore")
        if found not in out:
            out.append(found)
    return tuple(out)


def role_spread_constraints(templates: Mapping[str, Any], labels: Mapping[str, Mapping[str, str]]
                            ) -> dict[str, tuple[SpreadConstraint, ...]]:
    """Per role, spread_constraints of its template (roles with none left out)."""
    return per_role(templates, labels, spread_constraints)

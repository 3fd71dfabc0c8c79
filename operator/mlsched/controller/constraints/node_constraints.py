"""The nodes a pod template allows: its nodeSelector and required node affinity. Pure.

The operator pins every task to a node (a nodeSelector on the hostname label, desired.py), but
kube-scheduler still applies the template's own constraints: a pin to a node the template
excludes leaves the pod Pending for good while its capacity stays reserved. So planning must
know them. Users write them to choose a GPU type (`nvidia.com/gpu.product`), an instance
family, a zone, or to keep parameter servers off GPU nodes; ps and worker templates differ.

Kubernetes' semantics (core/v1 NodeSelector, as kube-scheduler's NodeAffinity plugin applies
them): every nodeSelector label must be present with exactly that value; the required
affinity's terms are ORed, a term's requirements ANDed, a term with none matches no node;
In / NotIn / Exists / DoesNotExist / Gt / Lt on labels (NotIn and DoesNotExist hold where the
label is absent; Gt and Lt compare integers), and In / NotIn on the field `metadata.name`.
A user's own pin, `nodeName` or the hostname label in a nodeSelector, is a constraint like
any other: desired.py drops both from the rendered pods (a gated pod cannot carry a nodeName,
and two pins would fight), so the operator's pin must land on that node. They used to be
dropped without a trace, and the pods ran wherever placement chose. Preferred affinity only
ranks nodes for kube-scheduler and is left out.

Taints: the operator tolerates some taint keys for every pod it renders
(OperatorConfig.tolerated_taints, e.g. `nvidia.com/gpu`). A node's other NoSchedule and
NoExecute taints (a team's dedicated nodes, `sku=gpu` on an AKS GPU pool) must each be
tolerated by the role's template, with Kubernetes' matching: an empty key with `Exists`
tolerates every taint, otherwise the keys match and `Exists` or an equal value (`Equal`, the
default); an empty effect matches every effect.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mlsched.controller.constraints.gpu_labels import GPU_TYPE_LABEL, describe, node_type

NAME_FIELD = "metadata.name"


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str
    values: tuple[str, ...] = ()
    field: bool = False  # matchFields (the node's name) rather than matchExpressions (labels)

    def allows(self, name: str, labels: Mapping[str, str]) -> bool:
        if self.field:
            value: str | None = name if self.key == NAME_FIELD else None
        else:
            value = labels.get(self.key)
        op = self.operator
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        if op in ("Gt", "Lt") and value is not None and len(self.values) == 1:
            try:
                have, bound = int(value), int(self.values[0])
            except ValueError:
                return False
            return have > bound if op == "Gt" else have < bound
        return False  # an operator the API server would have refused

    def __str__(self) -> str:
        key = f"{self.key} (field)" if self.field else self.key
        if self.operator in ("Exists", "DoesNotExist"):
            return f"{key} {self.operator}"
        return f"{key} {self.operator} [{', '.join(self.values)}]"


Taint = tuple[str, str, str]  # key, value, effect


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        key, value, effect = taint
        if self.effect and self.effect != effect:
            return False
        if not self.key:
            return self.operator == "Exists"
        return self.key == key and (self.operator == "Exists" or self.value == value)


@dataclass(frozen=True, slots=True)
class NodeConstraint:
    """One role's template: its nodeSelector, required affinity terms (None: no affinity) and
    tolerations. Hashable, so a round evaluates each distinct constraint once over the nodes.
    The empty constraint allows every node without a taint the operator does not tolerate."""

    selector: tuple[tuple[str, str], ...] = ()
    terms: tuple[tuple[Requirement, ...], ...] | None = None
    tolerations: tuple[Toleration, ...] = ()
    # Extended resources one pod asks for (quantities.extended_requests): a node must have at
    # least that much allocatable; how much other pods use is counted per round
    # (counted_resources.py).
    resources: tuple[tuple[str, float], ...] = ()
    node_name: str = ""  # the template's spec.nodeName: that node only
    # The GPU types the role may use (the job's spec.replicaSpecs.<role>.gpuTypes, not its
    # template): a node whose `gpu_label` maps to none of them (gpu_labels.node_type) is not
    # allowed. Empty: any node, whatever its GPUs.
    gpu_types: tuple[str, ...] = ()
    gpu_label: str = GPU_TYPE_LABEL

    def allows(self, name: str, labels: Mapping[str, str], taints: tuple[Taint, ...] = (),
               extended: Mapping[str, float] | None = None) -> bool:
        """`taints`: the node's NoSchedule/NoExecute taints the operator does not tolerate;
        `extended`: its allocatable extended resources."""
        if any(not any(t.tolerates(taint) for t in self.tolerations) for taint in taints):
            return False
        if not self.has_resources(extended):
            return False
        if self.node_name and name != self.node_name:
            return False
        if self.gpu_types and node_type(labels, self.gpu_label) not in self.gpu_types:
            return False
        if any(labels.get(key) != value for key, value in self.selector):
            return False
        if self.terms is None:
            return True
        return any(term and all(r.allows(name, labels) for r in term) for term in self.terms)

    def has_resources(self, extended: Mapping[str, float] | None) -> bool:
        return all((extended or {}).get(k, 0.0) >= v for k, v in self.resources)

    def __str__(self) -> str:
        parts = [f"nodeName {self.node_name}"] if self.node_name else []
        if self.selector:
            parts.append("nodeSelector " + ", ".join(f"{k}={v}" for k, v in self.selector))
        if self.terms is not None:
            terms = [" and ".join(str(r) for r in term) or "(empty term)" for term in self.terms]
            parts.append("required node affinity " + " or ".join(f"({t})" for t in terms))
        if self.tolerations:
            parts.append("tolerations " + ", ".join(_describe_toleration(t)
                                                    for t in self.tolerations))
        if self.resources:
            parts.append("requests " + ", ".join(resource_text(k, v) for k, v in self.resources))
        if self.gpu_types:
            parts.append(f"GPU type {describe(self.gpu_types)} (gpuTypes; node label "
                         f"{self.gpu_label})")
        return "; ".join(parts) or "no node constraint"


EVERY_NODE = NodeConstraint()  # a template that constrains nothing and tolerates nothing


#: The prefix of a DRA DeviceClass counted as a resource (dra.py).
DEVICE_PREFIX = "dra:"


def resource_text(name: str, value: float) -> str:
    """An amount of a counted resource: '2 example.com/nic', '1Gi ephemeral-storage',
    '1 gpu.example.com device' (a DRA DeviceClass)."""
    if name.startswith(DEVICE_PREFIX):
        return f"{value:g} {name[len(DEVICE_PREFIX):]} device{'' if value == 1 else 's'}"
    return f"{amount_text(name, value)} {name}"


def amount_text(name: str, value: float) -> str:
    """A request as a person wrote it: bytes (ephemeral-storage, hugepages) in Ki/Mi/Gi/Ti."""
    if name == "ephemeral-storage" or name.startswith("hugepages-"):
        for unit, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
            if value >= size:
                return f"{value / size:.4g}{unit}"
    return f"{value:g}"


def _describe_toleration(t: Toleration) -> str:
    what = "every taint" if not t.key else t.key if t.operator == "Exists" else f"{t.key}={t.value}"
    return what + (f":{t.effect}" if t.effect else "")


def _requirements(items: Any, field: bool) -> list[Requirement]:
    out = []
    for item in items or ():
        if not isinstance(item, Mapping):
            continue
        values = item.get("values") or ()
        out.append(Requirement(str(item.get("key", "")), str(item.get("operator", "")),
                               tuple(str(v) for v in values) if isinstance(values, list) else (),
                               field))
    return out


def node_constraint(pod_spec: Any) -> NodeConstraint | None:
    """The constraint of one pod template's spec; None when it constrains nothing."""
    if not isinstance(pod_spec, Mapping):
        return None
    selector = pod_spec.get("nodeSelector")
    pairs = tuple(sorted((str(k), str(v)) for k, v in selector.items())) \
        if isinstance(selector, Mapping) else ()
    node_name = pod_spec.get("nodeName")
    node_name = node_name if isinstance(node_name, str) else ""
    affinity = pod_spec.get("affinity")
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") \
        if isinstance(node_affinity, Mapping) else None
    raw_terms = required.get("nodeSelectorTerms") if isinstance(required, Mapping) else None
    terms = None
    if isinstance(raw_terms, list) and raw_terms:  # the API server requires at least one term
        terms = tuple(tuple(_requirements(t.get("matchExpressions"), False)
                            + _requirements(t.get("matchFields"), True))
                      if isinstance(t, Mapping) else () for t in raw_terms)
    tolerations = tuple(sorted(
        {Toleration(str(t.get("key") or ""), str(t.get("operator") or "Equal"),
                    str(t.get("value") or ""), str(t.get("effect") or ""))
         for t in pod_spec.get("tolerations") or () if isinstance(t, Mapping)
         # Only these keep a pod off a node; PreferNoSchedule is a preference.
         and (t.get("effect") or "") in ("", "NoSchedule", "NoExecute")},
        key=lambda t: (t.key, t.operator, t.value, t.effect)))
    if not pairs and terms is None and not tolerations and not node_name:
        return None
    return NodeConstraint(pairs, terms, tolerations, node_name=node_name)


def role_constraints(templates: Mapping[str, Any],
                     extended: Callable[[Mapping[str, Any]], tuple[tuple[str, float], ...]]
                     | None = None,
                     gpu_types: Mapping[str, tuple[str, ...]] | None = None
                     ) -> dict[str, NodeConstraint]:
    """Per role, the constraint of its template (roles that constrain nothing left out);
    `extended`: the extended resources a pod spec requests (quantities.extended_requests);
    `gpu_types`: per role, the GPU types the job allows it (JobRecord.gpu_types)."""
    out = {}
    for role in ("ps", "worker"):
        template = templates.get(role)
        spec = template.get("spec") if isinstance(template, Mapping) else None
        constraint = node_constraint(spec)
        resources = extended(spec) if extended is not None and isinstance(spec, Mapping) else ()
        if resources:
            constraint = dataclasses.replace(constraint or EVERY_NODE, resources=resources)
        if (gpu_types or {}).get(role):
            constraint = dataclasses.replace(constraint or EVERY_NODE,
                                             gpu_types=tuple(gpu_types[role]))
        if constraint is not None:
            out[role] = constraint
    return out

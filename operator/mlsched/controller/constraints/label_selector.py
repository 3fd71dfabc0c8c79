"""Label selectors (metav1.LabelSelector) as pod anti-affinity and topology spread use them
to pick the pods they count. Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mlsched.controller.constraints.node_constraints import Requirement


@dataclass(frozen=True, slots=True)
class Selector:
    """A metav1.LabelSelector: matchLabels and matchExpressions (In, NotIn, Exists,
    DoesNotExist), ANDed. Hashable: equal selectors are one token."""

    labels: tuple[tuple[str, str], ...] = ()
    expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return (all(labels.get(k) == v for k, v in self.labels)
                and all(r.allows("", labels) for r in self.expressions))

    def __str__(self) -> str:
        return ", ".join([f"{k}={v}" for k, v in self.labels] + [str(r) for r in self.expressions]) \
            or "every pod"


def parse_selector(raw: Any) -> Selector | None:
    """None for a missing selector (it matches no pod) or one with an operator this does
    not know."""
    if not isinstance(raw, Mapping):
        return None  # a term without a labelSelector matches no pod
    match = raw.get("matchLabels") or {}
    expressions = []
    for item in raw.get("matchExpressions") or ():
        if not isinstance(item, Mapping) or item.get("operator") not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return None
        values = item.get("values") or ()
        expressions.append(Requirement(str(item.get("key", "")), str(item["operator"]),
                                       tuple(sorted(str(v) for v in values)) if isinstance(values, list) else ()))
    if not isinstance(match, Mapping):
        return None
    return Selector(tuple(sorted((str(k), str(v)) for k, v in match.items())),
                    tuple(sorted(expressions, key=lambda r: (r.key, r.operator, r.values))))


def per_role(templates: Mapping[str, Any], labels: Mapping[str, Mapping[str, str]],
             parse: Callable[[Any, Mapping[str, str]], tuple]) -> dict[str, tuple]:
    """Per role, what `parse(its template's pod spec, its pods' labels)` finds; roles where it
    finds nothing are left out."""
    out = {}
    for role, template in templates.items():
        spec = template.get("spec") if isinstance(template, Mapping) else None
        found = parse(spec, labels.get(role) or {})
        if found:
            out[role] = found
    return out

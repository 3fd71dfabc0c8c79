"""RuntimeClasses: what a pod template naming one will be once created. Pure.

A template's `runtimeClassName` (gVisor, Kata, a GPU runtime) changes its pods at admission,
not in the template: the RuntimeClass admission plugin adds the class's `overhead.podFixed`
to the pod (kube-scheduler reserves it on top of the containers), merges its
`scheduling.nodeSelector` into the pod's (the nodes that have the runtime) and appends its
tolerations; a pod naming a RuntimeClass that does not exist, or whose nodeSelector
contradicts the class's, is refused (all checked on Kubernetes 1.34). Planned from the
template alone, such a job was packed without the overhead and pinned to nodes without the
runtime, where kube-scheduler refused its pods. The operator plans with the pods as they will
be (`effective`), and a job whose pods would be refused is told so (limitranges.as_planned).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RuntimeClassRecord:
    name: str
    overhead: tuple[tuple[str, str], ...] = ()  # overhead.podFixed, as quantities
    node_selector: tuple[tuple[str, str], ...] = ()  # scheduling.nodeSelector
    tolerations: tuple[tuple[tuple[str, Any], ...], ...] = ()  # scheduling.tolerations

    def changes_pods(self) -> bool:
        return bool(self.overhead or self.node_selector or self.tolerations)


def runtime_class_record(body: Mapping[str, Any]) -> RuntimeClassRecord:
    overhead = ((body.get("overhead") or {}).get("podFixed")) or {}
    scheduling = body.get("scheduling") or {}
    return RuntimeClassRecord(
        name=(body.get("metadata") or {}).get("name", ""),
        overhead=tuple(sorted((str(k), str(v)) for k, v in overhead.items())),
        node_selector=tuple(sorted((str(k), str(v)) for k, v in
                                   (scheduling.get("nodeSelector") or {}).items())),
        tolerations=tuple(tuple(sorted(t.items())) for t in scheduling.get("tolerations") or ()
                          if isinstance(t, Mapping)))


def named(templates: Mapping[str, Mapping[str, Any]]) -> tuple[str, ...]:
    """The RuntimeClasses a job's templates name."""
    out = set()
    for template in templates.values():
        spec = template.get("spec") if isinstance(template, Mapping) else None
        name = spec.get("runtimeClassName") if isinstance(spec, Mapping) else None
        if isinstance(name, str) and name:
            out.add(name)
    return tuple(sorted(out))


def effective(spec: Mapping[str, Any], classes: Mapping[str, RuntimeClassRecord]
              ) -> tuple[Mapping[str, Any], str | None]:
    """(the pod spec as the RuntimeClass admission plugin makes it, why the API server would
    refuse such pods, worded to follow "its worker pods", or None). A spec naming no
    RuntimeClass comes back as it is."""
    name = spec.get("runtimeClassName")
    if not name:
        return spec, None
    record = classes.get(name)
    if record is None:
        return spec, f"name RuntimeClass {name!r}, which does not exist: the API server refuses them"
    if not record.changes_pods():
        return spec, None
    selector = dict(spec.get("nodeSelector") or {})
    for key, value in record.node_selector:
        if key in selector and selector[key] != value:
            return spec, (f"select {key}={selector[key]}, which contradicts RuntimeClass "
                          f"{name!r}'s {key}={value}: the API server refuses them")
        selector[key] = value
    out = dict(spec)
    if record.overhead:
        out["overhead"] = dict(record.overhead)
    if selector:
        out["nodeSelector"] = selector
    if record.tolerations:
        out["tolerations"] = [*(spec.get("tolerations") or ()),
                              *(dict(t) for t in record.tolerations)]
    return out, None

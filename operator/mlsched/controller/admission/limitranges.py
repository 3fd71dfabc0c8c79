"""A namespace's LimitRanges: the requests its pods will really have. Pure.

When a pod is created, the LimitRanger admission plugin (on in every kube-apiserver by
default) fills in each container's unset requests from the namespace's LimitRanges of type
`Container`: their `defaultRequest`, which the API server itself defaults from `default` and
then `min` (and `default` from `max`). It does so for init containers and sidecars too
(checked on Kubernetes 1.34). A pod template that requests nothing was planned as requesting
nothing (or, for a catalog model, the catalog's demand), while its pods asked kube-scheduler
for the LimitRange's defaults: in a namespace defaulting to 3 CPU, bin-packing put four
workers on one 8-CPU node and kube-scheduler refused two of them. The operator now plans
each job with its namespace's defaults applied, as the pods will be.

Several LimitRanges defaulting one resource: Kubernetes applies them one after another in no
stated order, the first to set a value winning; here they are taken in name order. Within one
LimitRange a later `Container` item overrides an earlier one, as in the plugin. The default
*limits* (`default`, else `max`) count too: a ResourceQuota on `limits.cpu` refuses pods whose
containers set no CPU limit, and namespaces that have one usually give the limit by default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mlsched.controller.constraints import dra, runtimeclasses
from mlsched.controller.constraints.node_constraints import EVERY_NODE, role_constraints
from mlsched.controller.objects.job_records import JobRecord, role_charges, role_demands
from mlsched.controller.objects.quantities import (
    container_limited, container_requested, extended_requests, parse_quantity, pod_limits,
    pod_requests, pod_totals,
)
from mlsched.controller.constraints.runtimeclasses import RuntimeClassRecord

Amounts = tuple[tuple[str, float], ...]  # (resource name, cores / bytes / units), sorted


@dataclass(frozen=True)
class LimitRangeRecord:
    namespace: str
    name: str
    requests: Amounts  # the default request of each resource
    limits: Amounts = ()  # the default limit of each resource
    # What LimitRanger checks on a pod: (item type `Container` or `Pod`, `min`, `max` or
    # `maxLimitRequestRatio`, resource, amount).
    checks: tuple[tuple[str, str, str, float], ...] = ()


@dataclass(frozen=True)
class ContainerDefaults:
    """What a container that sets no request (limit) for a resource is given, per resource."""

    requests: Mapping[str, float]
    limits: Mapping[str, float]

    def __bool__(self) -> bool:
        return bool(self.requests or self.limits)


CHECKED = ("min", "max", "maxLimitRequestRatio")


def limit_range_record(body: Mapping[str, Any]) -> LimitRangeRecord | None:
    """The container defaults and the pod checks of one LimitRange; None when it has neither
    (PersistentVolumeClaim items only)."""
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    checks = []
    for item in (body.get("spec") or {}).get("limits") or ():
        if not isinstance(item, Mapping) or item.get("type") not in ("Container", "Pod"):
            continue
        checks += [(item["type"], kind, resource, parse_quantity(value))
                   for kind in CHECKED for resource, value in (item.get(kind) or {}).items()]
        if item["type"] == "Container":
            limit = {**(item.get("max") or {}), **(item.get("default") or {})}
            limits.update(limit)
            requests.update({**(item.get("min") or {}), **limit,
                             **(item.get("defaultRequest") or {})})
    if not requests and not checks:
        return None
    meta = body.get("metadata") or {}
    return LimitRangeRecord(meta.get("namespace", ""), meta.get("name", ""),
                            _amounts(requests), _amounts(limits), tuple(checks))


def _amounts(values: Mapping[str, Any]) -> Amounts:
    return tuple(sorted((k, parse_quantity(v)) for k, v in values.items()))


def container_defaults(records: Iterable[LimitRangeRecord]) -> ContainerDefaults:
    """The namespace's defaults: per resource, the first LimitRange (by name) that sets one."""
    requests: dict[str, float] = {}
    limits: dict[str, float] = {}
    for record in sorted(records, key=lambda r: r.name):
        for resource, value in record.requests:
            requests.setdefault(resource, value)
        for resource, value in record.limits:
            limits.setdefault(resource, value)
    return ContainerDefaults(requests, limits)


def defaulted(job: JobRecord, defaults: ContainerDefaults,
              templates: Mapping[str, Mapping[str, Any]] | None = None) -> JobRecord:
    """The job as its pods will be: its demands, extended resources, node constraints and
    quota charges from `templates` (its own, or as a RuntimeClass makes them) with the
    namespace's `defaults`."""
    if job.error is not None or (not defaults and templates is None):
        return job
    templates = job.templates if templates is None else templates
    requests = defaults.requests
    return dataclasses.replace(
        job, demands=role_demands(job.model, templates, requests),
        charges=role_charges(templates, requests, defaults.limits),
        node_constraints=role_constraints(templates,
                                          lambda spec: extended_requests(spec, requests),
                                          job.gpu_types))


def as_planned(job: JobRecord, records: Iterable[LimitRangeRecord],
               classes: Mapping[str, RuntimeClassRecord] | None = None) -> JobRecord:
    """The job as the API server will make its pods: the RuntimeClasses its templates name
    applied (runtimeclasses.effective), then its namespace's LimitRange defaults
    (`defaulted`); `blocked` with the API server's objection when either refuses its pods
    (such a job is given no tasks: it used to be admitted, hold its capacity and get
    `FailedCreate` for every pod)."""
    records = sorted(records, key=lambda r: r.name)
    if job.error is not None or (not records and not job.runtime_classes):
        return job
    templates: dict[str, Mapping[str, Any]] = dict(job.templates)
    blocked = None
    for role, template in job.templates.items():
        spec = template.get("spec") if isinstance(template, Mapping) else None
        if not isinstance(spec, Mapping) or not job.bounds(role)[1]:
            continue
        spec, refused = runtimeclasses.effective(spec, classes or {})
        templates[role] = {**template, "spec": spec}
        if refused and blocked is None:
            blocked = f"its {role} pods {refused}"
    defaults = container_defaults(records)
    planned = defaulted(job, defaults, templates if job.runtime_classes else None)
    blocked = blocked or _refused_by(records, templates, job, defaults)
    return dataclasses.replace(planned, blocked=blocked) if blocked else planned


def _refused_by(records: list[LimitRangeRecord], templates: Mapping[str, Mapping[str, Any]],
                job: JobRecord, defaults: ContainerDefaults) -> str | None:
    """The first LimitRange objection to one of the job's roles, worded for `blocked`."""
    for role in ("ps", "worker"):
        template = templates.get(role)
        spec = template.get("spec") if isinstance(template, Mapping) else None
        if not job.bounds(role)[1] or not isinstance(spec, Mapping):
            continue
        for record in records:
            refused = refusal(spec, record, defaults)
            if refused:
                return (f"the namespace's LimitRange {record.name!r} refuses its {role} pods: "
                        f"{refused}")
    return None


def refusal(spec: Mapping[str, Any], record: LimitRangeRecord,
            defaults: ContainerDefaults) -> str | None:
    """LimitRanger's first objection to a pod of `spec` (its wording), None if it has none.
    Container checks apply to every container, init containers and sidecars included, and
    Pod checks to the pod's requests and limits by the scheduler's rule (both checked on
    Kubernetes 1.34)."""
    containers = [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]
    effective = [_effective(c, defaults) for c in containers if isinstance(c, Mapping)]
    for type_, kind, resource, bound in record.checks:
        if type_ == "Container":
            for requests, limits in effective:
                why = _check(kind, resource, bound, requests, limits, type_)
                if why:
                    return why
        else:
            requests = pod_totals(spec, defaults.requests)
            limits = pod_limits(spec, defaults.limits)
            given = [lim for _, lim in effective]
            if not given or any(resource not in lim for lim in given):
                limits.pop(resource, None)  # some container sets no such limit
            given = [req for req, _ in effective]
            if not given or any(resource not in req for req in given):
                requests.pop(resource, None)
            why = _check(kind, resource, bound, requests, limits, type_)
            if why:
                return why
    return None


def _effective(container: Mapping[str, Any], defaults: ContainerDefaults):
    """(requests, limits) of a container once created: a request defaults to its limit, then
    LimitRanger fills what is still unset (records' own rules)."""
    return (container_requested(container, defaults.requests),
            container_limited(container, defaults.limits))


def _check(kind: str, resource: str, bound: float, requests: Mapping[str, float],
           limits: Mapping[str, float], type_: str) -> str | None:
    req, lim = requests.get(resource), limits.get(resource)
    per = f"{resource} usage per {type_} is {_show(resource, bound)}"
    if kind == "min":
        if req is None:
            return f"minimum {per}, but no request is specified"
        if req < bound - 1e-9:
            return f"minimum {per}, but request is {_show(resource, req)}"
        if lim is not None and lim < bound - 1e-9:
            return f"minimum {per}, but limit is {_show(resource, lim)}"
    elif kind == "max":
        if lim is None:
            return f"maximum {per}, but no limit is specified"
        if lim > bound + 1e-9:
            return f"maximum {per}, but limit is {_show(resource, lim)}"
        if req is not None and req > bound + 1e-9:
            return f"maximum {per}, but request is {_show(resource, req)}"
    elif kind == "maxLimitRequestRatio":
        ratio = f"{resource} max limit to request ratio per {type_} is {bound:g}"
        if not req:
            return f"{ratio}, but no request is specified or request is 0"
        if not lim:
            return f"{ratio}, but no limit is specified or limit is 0"
        if lim / req > bound + 1e-9:
            return f"{ratio}, but provided ratio is {lim / req:g}"
    return None


def _show(resource: str, amount: float) -> str:
    """An amount as a person writes it: bytes in Gi or Mi where they divide evenly."""
    if resource in ("memory", "ephemeral-storage") or resource.startswith("hugepages-"):
        for unit, size in (("Gi", 2.0**30), ("Mi", 2.0**20), ("Ki", 2.0**10)):
            if amount >= size and (amount / size) == int(amount / size):
                return f"{amount / size:g}{unit}"
    return f"{amount:g}"


def with_devices(job: JobRecord, templates: Mapping[str, dra.ClaimTemplateRecord],
                 classes: Mapping[str, dra.DeviceClassRecord]) -> JobRecord:
    """The job with the devices each pod of a role claims added to that role's node constraint
    (its `resources`, which counted_resources.py counts per node: dra.py) and those of GPU
    classes to its GPU demand, or `blocked` if a claim template or class it names does not
    exist (its pods would wait for good)."""
    constraints, demands = dict(job.node_constraints), dict(job.demands)
    for role, names in job.claim_templates.items():
        if not job.bounds(role)[1]:
            continue
        taken, missing = dra.template_takes(names, templates, classes)
        if missing:
            if job.blocked is not None:
                return job
            return dataclasses.replace(
                job, blocked=f"its {role} pods {missing}: kube-scheduler cannot place them")
        if taken:
            constraint = constraints.get(role, EVERY_NODE)
            resources = dict(constraint.resources)
            for name, amount in taken:
                resources[name] = resources.get(name, 0.0) + amount
            constraints[role] = dataclasses.replace(constraint, resources=tuple(sorted(resources.items())))
        gpus = dra.gpus_of(taken)
        if gpus:
            # A template requesting no GPU of its own may have the catalog's demand, whose GPUs
            # are these claimed ones: they replace it rather than add to it.
            template = job.templates.get(role) or {}
            spec = template.get("spec") if isinstance(template, Mapping) else None
            own = pod_requests(spec)[1] if isinstance(spec, Mapping) else 0.0
            cpu, gpu, memory = demands.get(role, (0.0, 0.0, 0.0))
            demands[role] = (cpu, (gpu if own else 0.0) + gpus, memory)
    return dataclasses.replace(job, node_constraints=constraints, demands=demands)


class Defaulted(Mapping[tuple[str, str], Iterable[JobRecord]]):
    """The MLJob index seen as the API server will make each job's pods (`as_planned`: the
    RuntimeClasses its templates name, its namespace's LimitRanges; `with_devices`: the
    devices its ResourceClaimTemplates claim), so that every reader (rounds, admission,
    waiting reasons, CannotFit) plans with what the pods will request and where they may run.
    A job's record is recomputed only when it or what it depends on changed; a job touched by
    none of them is seen as it is."""

    def __init__(self, raw: Mapping[tuple[str, str], Iterable[JobRecord]],
                 limit_ranges: Mapping[str, Iterable[LimitRangeRecord]],
                 runtime_classes: Mapping[str, Iterable[RuntimeClassRecord]] | None = None,
                 claim_templates: Mapping[str, Iterable[dra.ClaimTemplateRecord]] | None = None,
                 device_classes: Mapping[str, Iterable[dra.DeviceClassRecord]] | None = None):
        self.raw = raw
        self.limit_ranges = limit_ranges
        self.runtime_classes = runtime_classes if runtime_classes is not None else {}
        self.claim_templates = claim_templates if claim_templates is not None else {}
        self.device_classes = device_classes if device_classes is not None else {}
        self._cache: dict[tuple[str, str], tuple[JobRecord, tuple, JobRecord]] = {}

    def _classes(self, job: JobRecord) -> tuple[RuntimeClassRecord | None, ...]:
        return tuple(next(iter(self.runtime_classes.get(name, ())), None)
                     for name in job.runtime_classes)

    def _claims(self, job: JobRecord) -> tuple:
        """The claim templates of its namespace and the DeviceClasses (dra.with_devices)."""
        if not job.claim_templates:
            return ()
        return (tuple(self.claim_templates.get(job.namespace, ())),
                tuple(c for found in self.device_classes.values() for c in found))

    def plan(self, job: JobRecord) -> JobRecord:
        """`as_planned` for any record (one read from a body, say), not cached."""
        return self._plan(job, *self._inputs(job))

    def _inputs(self, job: JobRecord):
        ranges = tuple(self.limit_ranges.get(job.namespace, ()))
        return ranges, self._classes(job) if job.runtime_classes else (), self._claims(job)

    def _plan(self, job: JobRecord, ranges: tuple, classes: tuple, claims: tuple) -> JobRecord:
        if ranges or job.runtime_classes:
            job = as_planned(job, ranges, {c.name: c for c in classes if c is not None})
        if claims:
            templates, device_classes = claims
            job = with_devices(job, {t.name: t for t in templates},
                                   {c.name: c for c in device_classes})
        return job

    @staticmethod
    def _touched(job: JobRecord, ranges: tuple | bool) -> bool:
        return bool(ranges or job.runtime_classes or job.claim_templates)

    def apply(self, job: JobRecord) -> JobRecord:
        """`plan`, cached per job until its record or what it depends on changes."""
        inputs = self._inputs(job)
        if not self._touched(job, inputs[0]):
            return job
        cached = self._cache.get(job.key)
        if cached is not None and cached[0] is job and cached[1] == inputs:
            return cached[2]
        result = self._plan(job, *inputs)
        if len(self._cache) > 2 * len(self.raw) + 64:  # forget deleted jobs now and then
            self._cache = {k: v for k, v in self._cache.items() if k in self.raw}
        self._cache[job.key] = (job, inputs, result)
        return result

    def __getitem__(self, key: tuple[str, str]) -> Iterable[JobRecord]:
        records = self.raw[key]
        if any(self._touched(r, key[0] in self.limit_ranges) for r in records):
            return [self.apply(r) for r in records]
        return records

    def __iter__(self):
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)

    def values(self):  # type: ignore[override]
        ranges, out = self.limit_ranges, []
        for key, records in self.raw.items():
            for r in records:
                if self._touched(r, bool(ranges) and key[0] in ranges):
                    records = [self.apply(r) for r in records]
                    break
            out.append(records)
        return out

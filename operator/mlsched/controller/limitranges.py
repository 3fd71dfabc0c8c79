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

from mlsched.controller.node_constraints import role_constraints
from mlsched.controller.records import (
    JobRecord, extended_requests, parse_quantity, role_charges, role_demands,
)

Amounts = tuple[tuple[str, float], ...]  # (resource name, cores / bytes / units), sorted


@dataclass(frozen=True)
class LimitRangeRecord:
    namespace: str
    name: str
    requests: Amounts  # the default request of each resource
    limits: Amounts = ()  # the default limit of each resource


@dataclass(frozen=True)
class ContainerDefaults:
    """What a container that sets no request (limit) for a resource is given, per resource."""

    requests: Mapping[str, float]
    limits: Mapping[str, float]

    def __bool__(self) -> bool:
        return bool(self.requests or self.limits)


def limit_range_record(body: Mapping[str, Any]) -> LimitRangeRecord | None:
    """The container defaults of one LimitRange; None when it defaults nothing."""
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    for item in (body.get("spec") or {}).get("limits") or ():
        if not isinstance(item, Mapping) or item.get("type") != "Container":
            continue
        limit = {**(item.get("max") or {}), **(item.get("default") or {})}
        limits.update(limit)
        requests.update({**(item.get("min") or {}), **limit, **(item.get("defaultRequest") or {})})
    if not requests:
        return None
    meta = body.get("metadata") or {}
    return LimitRangeRecord(meta.get("namespace", ""), meta.get("name", ""),
                            _amounts(requests), _amounts(limits))


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


def defaulted(job: JobRecord, defaults: ContainerDefaults) -> JobRecord:
    """The job as its pods will be: its demands, extended resources and quota charges with
    the namespace's `defaults`."""
    if not defaults or job.error is not None:
        return job
    requests = defaults.requests
    return dataclasses.replace(
        job, demands=role_demands(job.model, job.templates, requests),
        charges=role_charges(job.templates, requests, defaults.limits),
        node_constraints=role_constraints(job.templates,
                                          lambda spec: extended_requests(spec, requests)))


class Defaulted(Mapping[tuple[str, str], Iterable[JobRecord]]):
    """The MLJob index seen with each namespace's LimitRange defaults applied (`defaulted`),
    so that every reader (rounds, admission, waiting reasons, CannotFit) plans with what the
    pods will request. A job's record is recomputed only when it or its namespace's
    LimitRanges changed; without any LimitRange this is the index itself."""

    def __init__(self, raw: Mapping[tuple[str, str], Iterable[JobRecord]],
                 limit_ranges: Mapping[str, Iterable[LimitRangeRecord]]):
        self.raw = raw
        self.limit_ranges = limit_ranges
        self._cache: dict[tuple[str, str], tuple[JobRecord, tuple, JobRecord]] = {}

    def apply(self, job: JobRecord) -> JobRecord:
        ranges = tuple(self.limit_ranges.get(job.namespace, ()))
        if not ranges:
            return job
        cached = self._cache.get(job.key)
        if cached is not None and cached[0] is job and cached[1] == ranges:
            return cached[2]
        result = defaulted(job, container_defaults(ranges))
        if len(self._cache) > 2 * len(self.raw) + 64:  # forget deleted jobs now and then
            self._cache = {k: v for k, v in self._cache.items() if k in self.raw}
        self._cache[job.key] = (job, ranges, result)
        return result

    def __getitem__(self, key: tuple[str, str]) -> Iterable[JobRecord]:
        records = self.raw[key]
        if not self.limit_ranges or key[0] not in self.limit_ranges:
            return records
        return [self.apply(r) for r in records]

    def __iter__(self):
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)

    def values(self):  # type: ignore[override]
        if not self.limit_ranges:  # the common case, kept as fast as the index itself
            return self.raw.values()
        return [self[key] for key in self.raw]

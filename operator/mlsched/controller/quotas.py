"""A namespace's ResourceQuotas as a budget for its policies' rounds. Pure.

Kubernetes enforces a ResourceQuota when a pod is created: a StatefulSet scaled past what the
quota has left gets `FailedCreate` and the pods never appear, so a job planned past it waits
half-created while its capacity stays reserved. Platform teams give every tenant namespace a
quota (Kueue exists largely to queue jobs against such limits), so the operator plans within
it: a round's ledger may book no more CPU, GPU and memory requests than every quota of the
namespace has left for the jobs it decides (cluster/ledger.py `budget`), and a job whose
minimum exceeds a quota's hard limit is told it can never run.

What counts: `requests.cpu` (or `cpu`), `requests.memory` (or `memory`) and
`requests.<the GPU resource>` (`requests.nvidia.com/gpu` by default), the requests the operator
plans with. Quotas with scopes other than
NotTerminating and NotBestEffort (which training pods with requests always fall in) or with a
scopeSelector apply to some pods only and are left out; so are limits.* and object counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from mlsched.controller import records
from mlsched.controller.records import Resources, parse_quantity

UNITS = (1.0, 1.0, 2.0**30)  # memory in GiB, as everywhere in the planner


def keys() -> tuple[tuple[str, ...], ...]:
    """Quota keys per resource, in the (cpu, gpu, mem) order; either spelling of cpu and
    memory. Extended resources (the GPU) are quota'd as requests only."""
    return (("requests.cpu", "cpu"), (f"requests.{records.GPU_RESOURCE}",),
            ("requests.memory", "memory"))
ALWAYS_APPLY = {"NotTerminating", "NotBestEffort"}


@dataclass(frozen=True, slots=True)
class QuotaRecord:
    namespace: str
    name: str
    hard: tuple[float | None, float | None, float | None]  # None: that resource is not limited
    used: Resources

    def limits_anything(self) -> bool:
        return any(h is not None for h in self.hard)


def _amounts(values: Mapping[str, Any] | None) -> list[float | None]:
    values = values or {}
    out: list[float | None] = []
    for names, unit in zip(keys(), UNITS):
        found = [parse_quantity(values[k]) / unit for k in names if k in values]
        out.append(min(found) if found else None)
    return out


def quota_record(body: Mapping[str, Any]) -> QuotaRecord | None:
    """The quota as it bounds training pods; None when it bounds none of what we plan."""
    meta, spec, status = body.get("metadata", {}), body.get("spec") or {}, body.get("status") or {}
    if spec.get("scopeSelector") or set(spec.get("scopes") or ()) - ALWAYS_APPLY:
        return None
    hard = _amounts(spec.get("hard"))
    used = tuple(u or 0.0 for u in _amounts(status.get("used")))
    record = QuotaRecord(meta.get("namespace", ""), meta.get("name", ""),
                         (hard[0], hard[1], hard[2]), (used[0], used[1], used[2]))
    return record if record.limits_anything() else None


def budget(quotas: Iterable[QuotaRecord], own: Resources) -> np.ndarray | None:
    """What a round may book in all, per resource (inf where nothing limits it): each quota's
    hard limit less what it counts as used by pods other than `own` (the requests of the pods
    of the jobs the round decides, which it books afresh). None without any quota."""
    quotas = list(quotas)
    if not quotas:
        return None
    out = np.full(3, np.inf)
    for q in quotas:
        for r, hard in enumerate(q.hard):
            if hard is not None:
                out[r] = min(out[r], hard - max(q.used[r] - own[r], 0.0))
    return np.maximum(out, 0.0)


_NAMES = ("CPU", "GPU", "GiB of memory")


def why_not(minimum: Resources, quotas: Iterable[QuotaRecord]) -> str | None:
    """Why a job whose minimum requests `minimum` can never run in its namespace; None if it can."""
    for q in quotas:
        for r, hard in enumerate(q.hard):
            if hard is not None and minimum[r] > hard + 1e-9:
                return (f"its minimum requests {minimum[r]:g} {_NAMES[r]}; the namespace's "
                        f"ResourceQuota {q.name!r} allows {hard:g} in all")
    return None


def why_waiting(minimum: Resources, quotas: Iterable[QuotaRecord]) -> str | None:
    """Why a job whose minimum requests `minimum` cannot start now for want of quota (others'
    pods use it; Kueue's "insufficient quota"); None if the quotas have room for it."""
    for q in quotas:
        for r, hard in enumerate(q.hard):
            if hard is not None and minimum[r] > hard - q.used[r] + 1e-9:
                left = max(hard - q.used[r], 0.0)
                return (f"its minimum requests {minimum[r]:g} {_NAMES[r]}; the namespace's "
                        f"ResourceQuota {q.name!r} has {left:g} of {hard:g} left")
    return None

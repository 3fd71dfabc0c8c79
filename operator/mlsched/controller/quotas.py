"""A namespace's ResourceQuotas as a budget for its policies' rounds. Pure.

Kubernetes enforces a ResourceQuota when a pod is created: a StatefulSet scaled past what the
quota has left gets `FailedCreate` and the pods never appear, so a job planned past it waits
half-created while its capacity stays reserved. Platform teams give every tenant namespace a
quota (Kueue exists largely to queue jobs against such limits), so the operator plans within
it: a round's ledger may book no more CPU, GPU and memory requests than every quota of the
namespace has left for the jobs it decides (cluster/ledger.py `budget`), and a job whose
minimum exceeds a quota's hard limit is told it can never run.

What counts (records.QUOTA_DIMS): `requests.cpu` (or `cpu`), `requests.memory` (or `memory`),
`requests.<the GPU resource>` (`requests.nvidia.com/gpu` by default), `limits.cpu`,
`limits.memory` and `pods` (or `count/pods`), each pod charged what records.quota_usage says
(LimitRange defaults applied). Namespaces that bound limits or the pod count were planned as if
unbounded: a job of eight 2-CPU-limit workers under `limits.cpu: 8` was scaled to 8, four pods
were refused with `FailedCreate`, and the job showed Running with half its workers while the
other half's GPUs stayed reserved. A pod that sets no limit (or request) of a resource a quota
bounds is refused outright by the API server; such a job is told it can never run. Quotas with
scopes other than NotTerminating and NotBestEffort (which training pods with requests always
fall in) or with a scopeSelector apply to some pods only and are left out; so are other object
counts and extended resources other than the GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from mlsched.controller import records
from mlsched.controller.records import QUOTA_DIMS, QuotaUsage, parse_quantity

UNITS = (1.0, 1.0, 2.0**30, 1.0, 2.0**30, 1.0)  # memory in GiB, as everywhere in the planner


def keys() -> tuple[tuple[str, ...], ...]:
    """Quota keys per dimension, in records.QUOTA_DIMS order; either spelling where Kubernetes
    has two. Extended resources (the GPU) are quota'd as requests only."""
    return (("requests.cpu", "cpu"), (f"requests.{records.GPU_RESOURCE}",),
            ("requests.memory", "memory"), ("limits.cpu",), ("limits.memory",),
            ("pods", "count/pods"))
ALWAYS_APPLY = {"NotTerminating", "NotBestEffort"}


@dataclass(frozen=True, slots=True)
class QuotaRecord:
    namespace: str
    name: str
    hard: tuple[float | None, ...]  # per QUOTA_DIMS; None: that one is not bounded
    used: tuple[float, ...]

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
    record = QuotaRecord(meta.get("namespace", ""), meta.get("name", ""), tuple(hard), used)
    return record if record.limits_anything() else None


def budget(quotas: Iterable[QuotaRecord], own: QuotaUsage,
           pending: QuotaUsage | None = None) -> np.ndarray | None:
    """What a round may book in all, per QUOTA_DIMS (inf where nothing bounds it): each quota's
    hard limit less what it counts as used by pods other than `own` (the usage of the pods of
    the jobs the round decides, which it books afresh) and less `pending` (pods other jobs
    were decided and that do not exist yet). None without any quota."""
    quotas = list(quotas)
    if not quotas:
        return None
    out = np.full(QUOTA_DIMS, np.inf)
    for q in quotas:
        for r, hard in enumerate(q.hard):
            if hard is not None:
                out[r] = min(out[r], hard - max(q.used[r] - own[r], 0.0)
                             - (pending[r] if pending else 0.0))
    return np.maximum(out, 0.0)


# How a message names each dimension: (the minimum ..., unit, what a pod must set for it).
_SAYS = (("requests", "CPU", "a CPU request"), ("requests", "GPU", "a GPU request"),
         ("requests", "GiB of memory", "a memory request"), ("has limits of", "CPU", "a CPU limit"),
         ("has limits of", "GiB of memory", "a memory limit"), ("is", "pods", ""))


def _minimum(r: int, amount: float) -> str:
    verb, unit, _ = _SAYS[r]
    return f"its minimum {verb} {amount:g} {unit}"


def _unset(r: int, q: QuotaRecord) -> str:
    return (f"its pods do not set {_SAYS[r][2]} in every container (init containers included), "
            f"so the API server refuses them: the namespace's ResourceQuota {q.name!r} bounds "
            f"{keys()[r][0]}")


def why_not(minimum: QuotaUsage, quotas: Iterable[QuotaRecord]) -> str | None:
    """Why a job whose minimum counts `minimum` (QUOTA_DIMS) against its namespace's quotas can
    never run there; None if it can."""
    for q in quotas:
        for r, hard in enumerate(q.hard):
            if hard is None:
                continue
            if np.isnan(minimum[r]):
                return _unset(r, q)
            if minimum[r] > hard + 1e-9:
                return (f"{_minimum(r, minimum[r])}; the namespace's ResourceQuota {q.name!r} "
                        f"allows {hard:g} in all")
    return None


def why_waiting(minimum: QuotaUsage, quotas: Iterable[QuotaRecord]) -> str | None:
    """Why a job whose minimum counts `minimum` cannot start now for want of quota (others'
    pods use it; Kueue's "insufficient quota"); None if the quotas have room for it."""
    for q in quotas:
        for r, hard in enumerate(q.hard):
            if hard is not None and minimum[r] > hard - q.used[r] + 1e-9:
                left = max(hard - q.used[r], 0.0)
                return (f"{_minimum(r, minimum[r])}; the namespace's ResourceQuota {q.name!r} "
                        f"has {left:g} of {hard:g} left")
    return None

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
counts.

The counted resources (counted_resources.py) are planned within too: `requests.<name>` of an
extended resource (`requests.example.com/nic`, `requests.ephemeral-storage` or
`ephemeral-storage`, `requests.hugepages-2Mi`) and `<class>.deviceclass.resource.k8s.io/devices`,
the devices of a DRA DeviceClass that the namespace's ResourceClaims request. They were not: a
job of NIC-requesting workers was scaled past a 2-NIC quota and the pods beyond it refused
(`FailedCreate`); with a 2-device quota, four workers claiming one device each were created,
kube-controller-manager could not make two of their claims (`exceeded quota`) and those two
pods stayed Pending for good. Each such bound is one more budget dimension after QUOTA_DIMS
(Budget.counted names them), charged what one pod takes of it (JobView.quota_charges).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from mlsched.controller import dra, records
from mlsched.controller.counted_resources import Counted, extended_of
from mlsched.controller.node_constraints import DEVICE_PREFIX, amount_text, resource_text
from mlsched.controller.records import (
    QUOTA_DIMS, JobRecord, PodRecord, QuotaUsage, is_extended, parse_quantity,
)

UNITS = (1.0, 1.0, 2.0**30, 1.0, 2.0**30, 1.0)  # memory in GiB, as everywhere in the planner


def keys() -> tuple[tuple[str, ...], ...]:
    """Quota keys per dimension, in records.QUOTA_DIMS order; either spelling where Kubernetes
    has two. Extended resources (the GPU) are quota'd as requests only."""
    return (("requests.cpu", "cpu"), (f"requests.{records.GPU_RESOURCE}",),
            ("requests.memory", "memory"), ("limits.cpu",), ("limits.memory",),
            ("pods", "count/pods"))
ALWAYS_APPLY = {"NotTerminating", "NotBestEffort"}
_DEVICES = ".deviceclass.resource.k8s.io/devices"


def counted_key(quota_key: str) -> str | None:
    """The counted resource (counted_resources.py's name for it) a quota key bounds, or None:
    `requests.example.com/nic` → `example.com/nic`, `ephemeral-storage` → itself,
    `gpu.example.com.deviceclass.resource.k8s.io/devices` → `dra:gpu.example.com`."""
    if quota_key.endswith(_DEVICES):
        return DEVICE_PREFIX + quota_key[:-len(_DEVICES)]
    if quota_key == "ephemeral-storage":
        return quota_key
    if quota_key.startswith("requests.") and is_extended(quota_key[len("requests."):]):
        return quota_key[len("requests."):]
    return None


@dataclass(frozen=True, slots=True)
class QuotaRecord:
    namespace: str
    name: str
    hard: tuple[float | None, ...]  # per QUOTA_DIMS; None: that one is not bounded
    used: tuple[float, ...]
    # The counted resources it bounds: (counted_key, hard, used), by name.
    counted: tuple[tuple[str, float, float], ...] = ()

    def limits_anything(self) -> bool:
        return any(h is not None for h in self.hard) or bool(self.counted)


@dataclass(frozen=True)
class Budget:
    """What a round may book: `amounts` per QUOTA_DIMS and then per `counted` resource (inf
    where nothing bounds it)."""
    amounts: np.ndarray
    counted: tuple[str, ...] = ()


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
    counted = _counted(spec.get("hard") or {}, status.get("used") or {})
    record = QuotaRecord(meta.get("namespace", ""), meta.get("name", ""), tuple(hard), used, counted)
    return record if record.limits_anything() else None


def _counted(hard: Mapping[str, Any], used: Mapping[str, Any]) -> tuple[tuple[str, float, float], ...]:
    """(counted_key, hard, used) of each counted resource bounded (the lower of two spellings)."""
    found: dict[str, tuple[float, float]] = {}
    for k, value in hard.items():
        name = counted_key(k)
        if name is None:
            continue
        bound = (parse_quantity(value), parse_quantity(used[k]) if k in used else 0.0)
        if name not in found or bound[0] < found[name][0]:
            found[name] = bound
    return tuple((name, h, u) for name, (h, u) in sorted(found.items()))


def budget(quotas: Iterable[QuotaRecord], own: QuotaUsage, pending: QuotaUsage | None = None,
           own_counted: Mapping[str, float] | None = None,
           pending_counted: Mapping[str, float] | None = None) -> Budget | None:
    """What a round may book in all (Budget): each quota's hard limit less what it counts as
    used by pods other than `own` (the usage of the pods of the jobs the round decides, which
    it books afresh; `own_counted` for the counted resources) and less `pending` (pods other
    jobs were decided and that do not exist yet; `pending_counted`). None without any quota."""
    quotas = list(quotas)
    if not quotas:
        return None
    names = tuple(sorted({name for q in quotas for name, _, _ in q.counted}))
    out = np.full(QUOTA_DIMS + len(names), np.inf)
    for q in quotas:
        for r, hard in enumerate(q.hard):
            if hard is not None:
                out[r] = min(out[r], hard - max(q.used[r] - own[r], 0.0)
                             - (pending[r] if pending else 0.0))
        for name, hard, used in q.counted:
            r = QUOTA_DIMS + names.index(name)
            out[r] = min(out[r], hard - max(used - (own_counted or {}).get(name, 0.0), 0.0)
                         - (pending_counted or {}).get(name, 0.0))
    return Budget(np.maximum(out, 0.0), names)


def pod_takes(job: JobRecord, pod: PodRecord) -> Counted:
    """What a pod of `job` counts against quotas of counted resources: its extended requests
    and the devices its claims request (made from its role's claim templates, which
    dra.with_devices added to the job's record)."""
    devices = tuple((n, a) for n, a in extended_of(job, pod.role) if n.startswith(DEVICE_PREFIX))
    return pod.extended + devices


def add_takes(total: dict[str, float], taken: Counted, times: int = 1) -> None:
    """`taken` added `times` over to `total`, by what quotas count: a request narrowing its
    DeviceClass by selectors (dra.refined_key) counts as the class's devices."""
    for name, amount in taken:
        name = dra.class_key(name) if name.startswith(DEVICE_PREFIX) else name
        total[name] = total.get(name, 0.0) + amount * times


def minimum_takes(job: JobRecord) -> dict[str, float]:
    """What the job's minimum takes of the counted resources in all (every role's `min`)."""
    total: dict[str, float] = {}
    for role in ("ps", "worker"):
        count = job.bounds(role)[0]
        if count:
            add_takes(total, extended_of(job, role), count)
    return total


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


def _minimum_takes(name: str, amount: float) -> str:
    verb = "claims" if name.startswith(DEVICE_PREFIX) else "requests"
    return f"its minimum {verb} {resource_text(name, amount)}"


def why_not(minimum: QuotaUsage, quotas: Iterable[QuotaRecord],
            takes: Mapping[str, float] | None = None) -> str | None:
    """Why a job whose minimum counts `minimum` (QUOTA_DIMS) and takes `takes` of the counted
    resources (minimum_takes) against its namespace's quotas can never run there; None if it
    can."""
    for q in quotas:
        for r, hard in enumerate(q.hard):
            if hard is None:
                continue
            if np.isnan(minimum[r]):
                return _unset(r, q)
            if minimum[r] > hard + 1e-9:
                return (f"{_minimum(r, minimum[r])}; the namespace's ResourceQuota {q.name!r} "
                        f"allows {hard:g} in all")
        for name, hard, _ in q.counted:
            wanted = (takes or {}).get(name, 0.0)
            if wanted > hard + 1e-9:
                return (f"{_minimum_takes(name, wanted)}; the namespace's ResourceQuota "
                        f"{q.name!r} allows {amount_text(name, hard)} in all")
    return None


def why_waiting(minimum: QuotaUsage, quotas: Iterable[QuotaRecord],
                takes: Mapping[str, float] | None = None) -> str | None:
    """Why a job whose minimum counts `minimum` (and takes `takes`) cannot start now for want
    of quota (others' pods use it; Kueue's "insufficient quota"); None if the quotas have room
    for it."""
    for q in quotas:
        for r, hard in enumerate(q.hard):
            if hard is not None and minimum[r] > hard - q.used[r] + 1e-9:
                left = max(hard - q.used[r], 0.0)
                return (f"{_minimum(r, minimum[r])}; the namespace's ResourceQuota {q.name!r} "
                        f"has {left:g} of {hard:g} left")
        for name, hard, used in q.counted:
            wanted = (takes or {}).get(name, 0.0)
            if wanted and wanted > hard - used + 1e-9:
                left = max(hard - used, 0.0)
                return (f"{_minimum_takes(name, wanted)}; the namespace's ResourceQuota "
                        f"{q.name!r} has {amount_text(name, left)} of {amount_text(name, hard)} left")
    return None

"""A namespace's ResourceQuotas as a budget for its policies' rounds. Pure.

Kubernetes enforces a ResourceQuota when a pod is created: a StatefulSet scaled past what the
quota has left gets `FailedCreate` and the pods never appear, so a job planned past it waits
half-created while its capacity stays reserved. Platform teams give every tenant namespace a
quota (Kueue exists largely to queue jobs against such limits), so the operator plans within
it: a round's ledger may book no more CPU, GPU and memory requests than every quota of the
namespace has left for the jobs it decides (cluster/ledger.py `budget`), and a job whose
minimum exceeds a quota's hard limit is told it can never run.

What counts (quantities.QUOTA_DIMS): `requests.cpu` (or `cpu`), `requests.memory` (or `memory`),
`requests.<the GPU resource>` (`requests.nvidia.com/gpu` by default), `limits.cpu`,
`limits.memory` and `pods` (or `count/pods`), each pod charged what quantities.quota_usage says
(LimitRange defaults applied). Namespaces that bound limits or the pod count were planned as if
unbounded: a job of eight 2-CPU-limit workers under `limits.cpu: 8` was scaled to 8, four pods
were refused with `FailedCreate`, and the job showed Running with half its workers while the
other half's GPUs stayed reserved. A pod that sets no limit (or request) of a resource a quota
bounds is refused outright by the API server; such a job is told it can never run.

A quota scoped to PriorityClasses (`scopeSelector` on `PriorityClass`, `In`, `NotIn` or
`Exists`: how platform teams cap what a namespace may run at high priority) counts the pods
whose template's `priorityClassName` it matches and no others. It used to be left out: DRF
scaled a high-priority job to 4 one-GPU workers under a 2-GPU quota of its class, and two pods
were refused. Each scope is a block of budget dimensions of its own (Budget.scopes), charged
only by the tasks it matches. Quotas with other scopes (Terminating, BestEffort,
CrossNamespacePodAffinity, ...) do not count training pods, which have requests and no
deadline, and NotTerminating and NotBestEffort count them all.

The counted resources (counted_resources.py) are planned within too: `requests.<name>` of an
extended resource (`requests.example.com/nic`, `requests.ephemeral-storage` or
`ephemeral-storage`, `requests.hugepages-2Mi`) and `<class>.deviceclass.resource.k8s.io/devices`,
the devices of a DRA DeviceClass that the namespace's ResourceClaims request. They were not: a
job of NIC-requesting workers was scaled past a 2-NIC quota and the pods beyond it refused
(`FailedCreate`); with a 2-device quota, four workers claiming one device each were created,
kube-controller-manager could not make two of their claims (`exceeded quota`) and those two
pods stayed Pending for good. Each such bound is one more budget dimension after QUOTA_DIMS
(Budget.counted names them), charged what one pod takes of it (JobView.quota_charges).

So is the one object count that grows with a job's pods, `count/resourceclaims.resource.k8s.io`
(CLAIMS): each pod makes one ResourceClaim per claim template it names. Under a quota of 2, two
of four claiming workers never got their claims and waited for good (`PodsCannotStart`). The
children a job makes once (its StatefulSets, its Service) are not planned with: a quota that
refuses them is reported as it happens (jobs.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mlsched.controller.constraints import dra
from mlsched.controller.objects import quantities
from mlsched.controller.admission.counted_resources import Counted, extended_of
from mlsched.controller.constraints.node_constraints import DEVICE_PREFIX, amount_text, resource_text
from mlsched.controller.objects.records import PodRecord
from mlsched.controller.objects.job_records import JobRecord
from mlsched.controller.objects.quantities import (
    QUOTA_DIMS, QuotaUsage, is_extended, parse_quantity,
)

UNITS = (1.0, 1.0, 2.0**30, 1.0, 2.0**30, 1.0)  # memory in GiB, as everywhere in the planner


def keys() -> tuple[tuple[str, ...], ...]:
    """Quota keys per dimension, in quantities.QUOTA_DIMS order; either spelling where Kubernetes
    has two. Extended resources (the GPU) are quota'd as requests only."""
    return (("requests.cpu", "cpu"), (f"requests.{quantities.GPU_RESOURCE}",),
            ("requests.memory", "memory"), ("limits.cpu",), ("limits.memory",),
            ("pods", "count/pods"))
ALWAYS_APPLY = {"NotTerminating", "NotBestEffort"}
_DEVICES = ".deviceclass.resource.k8s.io/devices"
#: The object count of ResourceClaims, a counted resource of its own: one per claim template a
#: pod names (its claims made from `resourceClaimName` exist already and are not the pod's).
CLAIMS = "count/resourceclaims.resource.k8s.io"
#: A PriorityClass scope: (operator, values) of a quota's scopeSelector on PriorityClass.
Scope = tuple[str, tuple[str, ...]]


def matches(scope: Scope | None, priority_class: str) -> bool:
    """Whether a quota of `scope` counts a pod of `priority_class` ("" for none), by the API
    server's rule (the class as the value of a label the selector matches; None: every pod)."""
    if scope is None:
        return True
    operator, values = scope
    if operator == "In":
        return priority_class in values
    if operator == "NotIn":
        return priority_class not in values
    return bool(priority_class)  # Exists


def priority_of(job: JobRecord, role: str, default: str = "") -> str:
    """The priorityClassName the role's pods get: their template's, else the cluster's
    globalDefault PriorityClass (`default`; the API server's Priority admission fills it in
    when the pod is created), else ""."""
    template = job.templates.get(role) if job.templates else None
    spec = template.get("spec") if isinstance(template, Mapping) else None
    found = spec.get("priorityClassName") if isinstance(spec, Mapping) else None
    return found if isinstance(found, str) and found else default


#: The key under which the PriorityClass index holds the globalDefault class's name.
GLOBAL_DEFAULT = "globalDefault"


def global_default_entry(name: str, body: Mapping[str, Any]) -> dict[str, str] | None:
    """The PriorityClass index's entry for a class: its name under GLOBAL_DEFAULT if it is
    the cluster's globalDefault, else none."""
    return {GLOBAL_DEFAULT: name} if body.get("globalDefault") else None


def _scope(spec: Mapping[str, Any]) -> tuple[bool, Scope | None]:
    """(counts training pods at all, the PriorityClass scope if any)."""
    if set(spec.get("scopes") or ()) - ALWAYS_APPLY:
        return False, None
    scope = None
    for expression in (spec.get("scopeSelector") or {}).get("matchExpressions") or ():
        name, operator = expression.get("scopeName"), expression.get("operator")
        if name in ALWAYS_APPLY and operator == "Exists":
            continue
        if name != "PriorityClass" or operator not in ("In", "NotIn", "Exists") or scope is not None:
            return False, None
        scope = (operator, tuple(sorted(str(v) for v in expression.get("values") or ())))
    return True, scope


def counted_key(quota_key: str) -> str | None:
    """The counted resource (counted_resources.py's name for it) a quota key bounds, or None:
    `requests.example.com/nic` → `example.com/nic`, `ephemeral-storage` → itself,
    `gpu.example.com.deviceclass.resource.k8s.io/devices` → `dra:gpu.example.com`."""
    if quota_key == CLAIMS:
        return CLAIMS
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
    scope: Scope | None = None  # the pods it counts, by PriorityClass; None: every pod

    def limits_anything(self) -> bool:
        return any(h is not None for h in self.hard) or bool(self.counted)


@dataclass(frozen=True)
class Budget:
    """What a round may book: `amounts`, one block per scope (`scopes`: None, every pod, first),
    each per QUOTA_DIMS and then per `counted` resource (inf where nothing bounds it)."""
    amounts: np.ndarray
    counted: tuple[str, ...] = ()
    scopes: tuple[Scope | None, ...] = (None,)
    default_priority: str = ""  # the globalDefault PriorityClass, for templates naming none


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
    counts_training_pods, scope = _scope(spec)
    if not counts_training_pods:
        return None
    hard = _amounts(spec.get("hard"))
    used = tuple(u or 0.0 for u in _amounts(status.get("used")))
    counted = _counted(spec.get("hard") or {}, status.get("used") or {})
    record = QuotaRecord(meta.get("namespace", ""), meta.get("name", ""), tuple(hard), used, counted,
                         scope)
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


@dataclass
class Usage:
    """What a quota of some scope counts, per QUOTA_DIMS and per counted resource."""
    amounts: list[float] = field(default_factory=lambda: [0.0] * QUOTA_DIMS)
    counted: dict[str, float] = field(default_factory=dict)

    def add(self, amounts: Iterable[float], taken: Counted = (), times: int = 1) -> None:
        for r, amount in enumerate(amounts):
            self.amounts[r] += times * (0.0 if math.isnan(amount) else amount)
        add_takes(self.counted, taken, times)


def scopes_of(quotas: Iterable[QuotaRecord]) -> tuple[Scope | None, ...]:
    """The budget's blocks: every pod's first, then each PriorityClass scope."""
    return (None, *sorted({q.scope for q in quotas if q.scope is not None}))


def budget(quotas: Iterable[QuotaRecord], own: Mapping[Scope | None, Usage],
           pending: Mapping[Scope | None, Usage] | None = None,
           default_priority: str = "") -> Budget | None:
    """What a round may book in all (Budget): each quota's hard limit less what it counts as
    used by pods other than `own` (per scope: the usage of the pods of the jobs the round
    decides, which it books afresh) and less `pending` (per scope: pods other jobs were decided
    and that do not exist yet). None without any quota."""
    quotas = list(quotas)
    if not quotas:
        return None
    names = tuple(sorted({name for q in quotas for name, _, _ in q.counted}))
    scopes = scopes_of(quotas)
    width = QUOTA_DIMS + len(names)
    out = np.full(width * len(scopes), np.inf)
    none = Usage()
    for q in quotas:
        at = width * scopes.index(q.scope)
        mine, theirs = own.get(q.scope, none), (pending or {}).get(q.scope, none)
        for r, hard in enumerate(q.hard):
            if hard is not None:
                out[at + r] = min(out[at + r], hard - max(q.used[r] - mine.amounts[r], 0.0)
                                  - theirs.amounts[r])
        for name, hard, used in q.counted:
            r = at + QUOTA_DIMS + names.index(name)
            out[r] = min(out[r], hard - max(used - mine.counted.get(name, 0.0), 0.0)
                         - theirs.counted.get(name, 0.0))
    return Budget(np.maximum(out, 0.0), names, scopes, default_priority)


def charges(job: JobRecord, budget: Budget) -> dict[str, np.ndarray]:
    """Per role, what one task counts against `budget`: in each scope's block that counts its
    pods, QUOTA_DIMS (quantities.quota_usage) then its take of each counted resource (extended
    requests, DRA devices); zeros in the others. A new pod's: of the class its template or
    the current globalDefault gives (kept_charges: the pods that exist)."""
    return {role: _in_scopes(_block(job, role, budget), priority_of(job, role, budget.default_priority),
                             budget)
            for role in job.charges}


def kept_charges(job: JobRecord, pods: Iterable[PodRecord],
                 budget: Budget) -> dict[str, tuple[np.ndarray | None, ...]]:
    """Per role, by ordinal, what the task an existing pod keeps counts against `budget` where
    that pod's PriorityClass is not the one a new pod would get (None where it is); roles
    whose pods all have it are absent (the usual case: {}). The API server sets a pod's class
    when it is created, so after the globalDefault moves the older pods stay in the quotas of
    their class: planned with the new default's, a running job filled a quota that counted
    none of its pods, and a job of that class waited for room the quota had."""
    if len(budget.scopes) == 1:
        return {}
    out: dict[str, list[np.ndarray | None]] = {}
    for pod in pods:
        if pod.phase in quantities.TERMINAL_POD_PHASES or pod.deleting or pod.role not in job.charges:
            continue  # a deleted pod's replacement gets the class of a new one
        if pod.priority_class == priority_of(job, pod.role, budget.default_priority):
            continue
        kept = out.setdefault(pod.role, [])
        kept.extend([None] * (pod.ordinal + 1 - len(kept)))
        kept[pod.ordinal] = _in_scopes(_block(job, pod.role, budget), pod.priority_class, budget)
    return {role: tuple(kept) for role, kept in out.items()}


def _block(job: JobRecord, role: str, budget: Budget) -> list[float]:
    """One task's charge in one scope's block: QUOTA_DIMS, then each counted resource."""
    charge = list(job.charges[role])
    if not budget.counted:
        return charge
    takes: dict[str, float] = {}
    add_takes(takes, quota_takes(job, role))
    return [*charge, *(takes.get(name, 0.0) for name in budget.counted)]


def _in_scopes(block: list[float], priority: str, budget: Budget) -> np.ndarray:
    """`block` in every scope's block of the budget that counts pods of `priority`."""
    if len(budget.scopes) == 1:  # no scoped quota (the usual case: 10,000 jobs a round)
        return np.array(block, dtype=float)
    empty = [0.0] * len(block)
    return np.array([x for scope in budget.scopes
                     for x in (block if matches(scope, priority) else empty)], dtype=float)


def quota_takes(job: JobRecord, role: str) -> Counted:
    """What one pod of `role` will count against quotas of counted resources: its extended
    requests and the devices its claims request (extended_of), and the claims it makes."""
    claims = len(job.claim_templates.get(role, ()))
    return extended_of(job, role) + (((CLAIMS, float(claims)),) if claims else ())


def pod_takes(job: JobRecord, pod: PodRecord) -> Counted:
    """What a pod of `job` counts against quotas of counted resources: its extended requests
    and the devices its claims request (made from its role's claim templates, which
    dra.with_devices added to the job's record), and those claims, unless they were never
    made (PodRecord.claims_unmade: a quota refused them, so it counts none of them)."""
    if pod.claims_unmade:
        return pod.extended
    devices = tuple((n, a) for n, a in quota_takes(job, pod.role)
                    if n.startswith(DEVICE_PREFIX) or n == CLAIMS)
    return pod.extended + devices


def add_takes(total: dict[str, float], taken: Counted, times: int = 1) -> None:
    """`taken` added `times` over to `total`, by what quotas count: a request narrowing its
    DeviceClass by selectors (dra.refined_key) counts as the class's devices."""
    for name, amount in taken:
        name = dra.class_key(name) if name.startswith(DEVICE_PREFIX) else name
        total[name] = total.get(name, 0.0) + amount * times


def minimum_of(job: JobRecord, scope: Scope | None,
               default_priority: str = "") -> tuple[QuotaUsage, dict[str, float]]:
    """What the job's minimum counts against a quota of `scope`: the roles whose pods it counts
    (QUOTA_DIMS, and what they take of the counted resources)."""
    total, takes = [0.0] * QUOTA_DIMS, {}  # NaN stays: a request or limit its pods leave unset
    for role in ("ps", "worker"):
        count = job.bounds(role)[0]
        if count and matches(scope, priority_of(job, role, default_priority)):
            charge = job.charges.get(role, quantities.NO_CHARGE)
            total = [t + count * c for t, c in zip(total, charge)]
            add_takes(takes, quota_takes(job, role), count)
    return tuple(total), takes  # type: ignore[return-value]


def reasons(job: JobRecord, quotas: Iterable[QuotaRecord],
            default_priority: str = "") -> tuple[str | None, str | None]:
    """(why the job can never run within its namespace's quotas, why it cannot start now for
    want of quota): why_not and why_waiting over each quota that counts its pods."""
    never = waiting = None
    by_scope: dict[Scope | None, list[QuotaRecord]] = {}
    for q in quotas:
        by_scope.setdefault(q.scope, []).append(q)
    for scope, found in by_scope.items():
        minimum, takes = minimum_of(job, scope, default_priority)
        never = never or why_not(minimum, found, takes)
        waiting = waiting or why_waiting(minimum, found, takes)
    return never, waiting


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
    if name == CLAIMS:
        return f"its minimum makes {amount:g} ResourceClaim{'' if amount == 1 else 's'}"
    verb = "claims" if name.startswith(DEVICE_PREFIX) else "requests"
    return f"its minimum {verb} {resource_text(name, amount)}"


def why_not(minimum: QuotaUsage, quotas: Iterable[QuotaRecord],
            takes: Mapping[str, float] | None = None) -> str | None:
    """Why a job whose minimum counts `minimum` (QUOTA_DIMS) and takes `takes` of the counted
    resources (minimum_of) against its namespace's quotas can never run there; None if it
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

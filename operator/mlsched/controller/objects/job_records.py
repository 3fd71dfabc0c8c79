"""An MLJob's compact record (`JobRecord`) and how it is read from the object: the parsed
spec (cached by spec), per-role demands, quota charges, node constraints (with the roles'
allowed GPU types), spreads, anti-affinity, host ports, RuntimeClasses and DRA claims of its
templates, and its trained intervals. Pure: dict in, record out."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mlsched.api import InvalidObject, MLJob
from mlsched.api.base import plain
from mlsched.controller.constraints import dra, runtimeclasses
from mlsched.controller.constraints.host_ports import role_host_ports
from mlsched.controller.constraints.label_selector import Selector
from mlsched.controller.constraints.pod_anti_affinity import role_anti_affinity
from mlsched.controller.constraints.topology_spread import SpreadConstraint, role_spread_constraints
from mlsched.controller.constraints.node_constraints import NodeConstraint, role_constraints
from mlsched.controller.objects.quantities import (
    NO_RESOURCES, QuotaUsage, Resources, add, extended_requests, parse_time, pod_requests,
    quota_usage,
)
from mlsched.controller.objects.records import pod_labels
from mlsched.workloads import catalog
from mlsched.workloads.gpu_types import GPU_TYPES



@dataclass(frozen=True, slots=True)
class JobRecord:
    """An MLJob as the scheduling loop and the progress endpoint need it.

    `error` is set when the spec does not parse; such a job is never scheduled, and the lifecycle
    timer reports it on the object.
    """

    namespace: str
    name: str
    uid: str
    generation: int
    created_s: float
    policy: str
    model: str
    arch: str  # 'ps' or 'allreduce' (the cluster/ vocabulary)
    epochs: float
    min_ps: int
    max_ps: int
    min_workers: int
    max_workers: int
    suspend: bool
    phase: str | None
    final: bool  # Succeeded or Failed for good (a Failed for an invalid spec is not final)
    refused: bool  # Failed/InvalidSpec: waits for a spec edit, gets no tasks meanwhile
    epochs_done: float
    speed: float
    last_report_s: float | None
    history: tuple[Mapping[str, Any], ...]
    # (ps, workers, epochs) of the latest intervals in which the job trained, newest last:
    # the speed observations policies learn from, extracted once per watch event, not per round.
    trained: tuple[tuple[int, int, float], ...]
    slots_run: int  # intervals in the history in which the job had workers
    placement: Mapping[str, Any] | None  # status.placement as last written
    desired: Mapping[str, int]  # status.replicaStatuses.<role>.desired as last written
    # The pod templates by role, as written in the spec (a reference into the watched body,
    # not a copy): rendering StatefulSets needs them when a round changes a job's counts.
    templates: Mapping[str, Mapping[str, Any]]
    error: str | None = None
    samples_per_second: float | None = None  # as the job last reported it
    started: bool = False  # status.startTime: it has run (a change of its counts is a rescale)
    rescales: Mapping[str, Any] | None = None  # status.rescales as last written
    # What one pod of each role requests (its template's containers), the truth for planning;
    # the catalog's per-model demand only where the template requests nothing.
    demands: Mapping[str, Resources] = field(default_factory=dict)
    declared_epochs_per_hour: float | None = None  # spec.speedPrior
    # status.openInterval: the interval a round opened for this job and no round closed yet
    # (rewards.restore closes it after an operator restart).
    open_interval: Mapping[str, Any] | None = None
    group: str | None = None  # status.group: the pool its policy's grouping put it in
    group_since_s: float | None = None  # status.groupSince
    # Per role, the nodes its template allows (nodeSelector, required node affinity): the
    # rounds place its tasks there only. Roles that constrain nothing are absent.
    node_constraints: Mapping[str, NodeConstraint] = field(default_factory=dict)
    # Per role, what one pod counts against the namespace's ResourceQuotas (quota_usage).
    charges: Mapping[str, QuotaUsage] = field(default_factory=dict)
    runtime_classes: tuple[str, ...] = ()  # the RuntimeClasses its templates name
    # Per role, the ResourceClaimTemplates its template's resourceClaims name (dra.py): the
    # devices each pod claims are added to its node constraint's resources when planned.
    claim_templates: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Why the namespace's LimitRanges refuse its pods, if they do (limitranges.as_planned): the
    # job gets no tasks and is told CannotFit until the template or the LimitRange changes.
    blocked: str | None = None
    # The Running condition's reason (what `kubectl get mljobs` shows as REASON): WaitingForQuota,
    # CannotFit, PodsCannotStart, AllRolesReady, ... (metrics: mlsched_jobs_by_reason).
    reason: str | None = None
    # Per role, the host ports one pod holds on its node (host_ports.py): at most one such
    # pod per node and port. Roles holding none are absent.
    host_ports: Mapping[str, frozenset[tuple[str, int]]] = field(default_factory=dict)
    # Per role, the selectors of its template's required pod anti-affinity that spread its
    # pods one per node (pod_anti_affinity.py).
    anti_affinity: Mapping[str, tuple[Selector, ...]] = field(default_factory=dict)
    # Per role, the topologySpreadConstraints the planner enforces (topology_spread.py).
    spread_constraints: Mapping[str, tuple[SpreadConstraint, ...]] = field(default_factory=dict)
    # Per role, the GPU types its pods may run on (spec.replicaSpecs.<role>.gpuTypes, as
    # gpu_labels reads them off the nodes); also in its node constraint. Roles with none absent.
    gpu_types: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # The GPU type each of `trained` was measured at (trained_types); empty when none has one.
    trained_types: tuple[str | None, ...] = ()

    # (namespace, name): how every index finds the job, read 60,000 times by a 10,000-job
    # round's snapshot, so made once.
    key: tuple[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", (self.namespace, self.name))

    def pod_labels(self, role: str) -> dict[str, str]:
        """The labels its pods of `role` carry: the template's and the operator's (derived
        when a round has selectors to match, not kept for every job)."""
        return pod_labels(self.name, role, self.templates.get(role))

    @property
    def finished(self) -> bool:
        return self.final and self.error is None

    @property
    def schedulable(self) -> bool:
        """Whether the scheduling loop should give this job tasks."""
        return (self.error is None and not self.suspend and not self.finished
                and not self.refused and self.blocked is None and self.epochs_done < self.epochs)

    def bounds(self, role: str) -> tuple[int, int]:
        if role == "ps":
            return (self.min_ps, self.max_ps) if self.arch == "ps" else (0, 0)
        return (self.min_workers, self.max_workers)

    def minimum_requests(self) -> Resources:
        """What the job's minimum (every role's `min`, admitted together) requests in all."""
        total = NO_RESOURCES
        for role in ("ps", "worker"):  # an all-reduce job's PS minimum is 0
            count = self.bounds(role)[0]
            d = self.demands.get(role, NO_RESOURCES)
            total = add(total, (count * d[0], count * d[1], count * d[2]))
        return total


INVALID_SPEC = "InvalidSpec"  # the reason of a Failed condition the user can still fix


def is_refused(status: Mapping[str, Any]) -> bool:
    """Failed because the spec (or a child rendered from it) is invalid: fixable by an edit."""
    return status.get("phase") == "Failed" and any(
        c.get("type") == "Failed" and c.get("status") == "True" and c.get("reason") == INVALID_SPEC
        for c in status.get("conditions") or ())


def is_final(status: Mapping[str, Any]) -> bool:
    return status.get("phase") in ("Succeeded", "Failed") and not is_refused(status)


MAX_OBSERVATIONS = 24  # per job, as in the simulator: older speeds say little about now


def trained_intervals(history: Any) -> tuple[tuple[tuple[int, int, float], ...], int]:
    """(the latest MAX_OBSERVATIONS (ps, workers, epochs) with training, intervals with workers)."""
    trained, slots = [], 0
    for h in history:
        workers = h.get("workers") or 0
        if workers:
            slots += 1
            epochs = h.get("epochs") or 0.0
            if epochs > 0:
                trained.append((int(h.get("ps") or 0), int(workers), float(epochs)))
    return tuple(trained[-MAX_OBSERVATIONS:]), slots


def trained_types(history: Any) -> tuple[str | None, ...]:
    """The GPU type each of trained_intervals' speeds was measured at, in the same order: the
    slowest table type among the workers' (status.placement.gpuTypes.worker of the interval:
    a job runs at its slowest worker's pace), None where no worker's type is in the table.
    Empty when none has a type (JobView.observation_types)."""
    types: list[str | None] = []
    for h in history:
        if (h.get("workers") or 0) and (h.get("epochs") or 0.0) > 0:
            named = ((h.get("placement") or {}).get("gpuTypes") or {}).get("worker") or ""
            known = [t for t in GPU_TYPES if t in named.split(",")]
            types.append(known[-1] if known else None)  # GPU_TYPES: fastest first
    types = types[-MAX_OBSERVATIONS:]
    return tuple(types) if any(t is not None for t in types) else ()


def parse_job(body: Mapping[str, Any]) -> MLJob:
    """Validate spec and name only: status is written by the operator itself, and parsing a
    long history on every watch event would cost more than the whole scheduling round."""
    return MLJob.from_k8s({"apiVersion": body.get("apiVersion", "mlsched.io/v1alpha1"),
                           "kind": "MLJob", "metadata": {"name": body["metadata"]["name"],
                                                         "namespace": body["metadata"].get("namespace")},
                           "spec": body.get("spec") or {}})


def model_label(model_type: str | None) -> str:
    """The catalog's canonical name for a catalog model, the label as given otherwise."""
    if not model_type:
        return "unknown"
    return catalog.canonical_name(model_type) if catalog.is_known(model_type) else model_type


def role_demands(model: str, templates: Mapping[str, Mapping[str, Any]],
                 defaults: Mapping[str, float] | None = None) -> dict[str, Resources]:
    """Per role: what its pods will request (the template's requests, with the namespace's
    LimitRange `defaults` where it sets none); where that is nothing, the catalog's demand
    for a catalog model (a prior, as for speeds), else nothing."""
    out: dict[str, Resources] = {}
    for role in ("ps", "worker"):
        template = templates.get(role) or {}
        spec = template.get("spec") if isinstance(template, Mapping) else None
        requested = pod_requests(spec, defaults) if isinstance(spec, Mapping) else NO_RESOURCES
        if requested == NO_RESOURCES and catalog.is_known(model):
            requested = tuple(float(x) for x in catalog.get(model).demand(role))  # type: ignore[assignment]
        out[role] = requested
    return out


def role_charges(templates: Mapping[str, Mapping[str, Any]],
                 request_defaults: Mapping[str, float] | None = None,
                 limit_defaults: Mapping[str, float] | None = None) -> dict[str, QuotaUsage]:
    """Per role, what one of its pods counts against the namespace's ResourceQuotas."""
    out = {}
    for role in ("ps", "worker"):
        template = templates.get(role)
        spec = template.get("spec") if isinstance(template, Mapping) else None
        if isinstance(spec, Mapping):
            out[role] = quota_usage(spec, request_defaults, limit_defaults)
    return out


def job_record(body: Mapping[str, Any]) -> JobRecord:
    meta, spec = body.get("metadata", {}), body.get("spec") or {}
    status = body.get("status") or {}
    progress = status.get("progress") or {}
    trained, slots_run = trained_intervals(status.get("history") or ())
    types = trained_types(status.get("history") or ()) if trained else ()
    common = dict(
        namespace=meta.get("namespace", ""), name=meta["name"], uid=meta.get("uid", ""),
        generation=int(meta.get("generation") or 0),
        created_s=parse_time(meta.get("creationTimestamp")) or 0.0,
        policy=str(spec.get("schedulingPolicy") or "default"), phase=status.get("phase"),
        reason=next((c.get("reason") for c in status.get("conditions") or ()
                     if isinstance(c, Mapping) and c.get("type") == "Running"), None),
        final=is_final(status), refused=is_refused(status),
        epochs_done=float(progress.get("epochsDone") or 0.0),
        speed=float(progress.get("speed") or 0.0),
        last_report_s=parse_time(progress.get("lastReportTime")),
        samples_per_second=(float(progress["samplesPerSecond"])
                            if progress.get("samplesPerSecond") is not None else None),
        started=bool(status.get("startTime")),
        rescales=status.get("rescales") if isinstance(status.get("rescales"), Mapping) else None,
        history=tuple(status.get("history") or ()),
        trained=trained, slots_run=slots_run, trained_types=types,
        placement=status.get("placement"),
        open_interval=status.get("openInterval"),
        group=status.get("group"), group_since_s=parse_time(status.get("groupSince")),
        desired={role: int((rs or {}).get("desired") or 0)
                 for role, rs in (status.get("replicaStatuses") or {}).items()},
        templates={role: (rs or {}).get("template") or {}
                   for role, rs in (spec.get("replicaSpecs") or {}).items()
                   if isinstance(rs, Mapping)},
    )
    return JobRecord(**common, **_read_spec(body, common["templates"])[1])


def parsed_job(body: Mapping[str, Any]) -> MLJob:
    """parse_job, read once per spec (see _FROM_SPEC); raises InvalidObject as it does."""
    job = _read_spec(body)[0]
    if isinstance(job, InvalidObject):
        raise job
    return job


def _read_spec(body: Mapping[str, Any], templates: Mapping[str, Any] | None = None
               ) -> tuple[MLJob | InvalidObject, dict[str, Any]]:
    meta, spec = body.get("metadata", {}), body.get("spec") or {}
    key = (meta.get("namespace", ""), meta["name"])
    cached = _FROM_SPEC.get(key)
    if cached is not None and cached[0] == spec:
        _FROM_SPEC.move_to_end(key)
        return cached[1], cached[2]
    if templates is None:
        templates = {role: (rs or {}).get("template") or {}
                     for role, rs in (spec.get("replicaSpecs") or {}).items()
                     if isinstance(rs, Mapping)}
    try:
        job: MLJob | InvalidObject = parse_job(body)
    except InvalidObject as exc:
        job = exc
    fields = _from_spec(job, meta["name"], templates)
    _FROM_SPEC[key] = (plain(spec), job, fields)
    if len(_FROM_SPEC) > MAX_SPEC_CACHE:
        _FROM_SPEC.popitem(last=False)
    return job, fields


#: What job_record reads from the spec (and the parsed MLJob), by job, with the spec it was
#: read from: one parse serves every status write and watch event until the spec changes (a
#: comparison of two dicts costs microseconds). Parsing the spec (pydantic validation, the templates' requests,
#: constraints and charges) on each was 19 % of the operator's event loop in a 300-job burst
#: (py-spy, bench_e2e (a)), which then saw its pods' Ready events 18 s late. Oldest out first
#: beyond MAX_SPEC_CACHE (a few KiB each).
_FROM_SPEC: OrderedDict[tuple[str, str], tuple[dict[str, Any], MLJob | InvalidObject,
                                                dict[str, Any]]] = OrderedDict()
MAX_SPEC_CACHE = 20000


def _from_spec(job: MLJob | InvalidObject, name: str, templates: Mapping[str, Any]
               ) -> dict[str, Any]:
    if isinstance(job, InvalidObject):
        return dict(model="", arch="ps", epochs=0.0, min_ps=0, max_ps=0, min_workers=0,
                    max_workers=0, suspend=False, error=str(job))
    rs = job.spec.replica_specs
    model = model_label(job.spec.model_type)
    labels = {role: pod_labels(name, role, t) for role, t in templates.items()}
    gpu_types = {role: tuple(str(t) for t in spec.gpu_types)
                 for role, spec in (("ps", rs.ps), ("worker", rs.worker))
                 if spec is not None and spec.gpu_types}
    return dict(
        model=model, demands=role_demands(model, templates),
        charges=role_charges(templates),
        runtime_classes=runtimeclasses.named(templates),
        claim_templates={role: names for role, t in templates.items()
                         if (names := dra.claim_template_names(t))},
        node_constraints=role_constraints(templates, extended_requests, gpu_types),
        gpu_types=gpu_types,
        host_ports=role_host_ports(templates),
        anti_affinity=role_anti_affinity(templates, labels),
        spread_constraints=role_spread_constraints(templates, labels),
        declared_epochs_per_hour=(job.spec.speed_prior.reference_epochs_per_hour
                                  if job.spec.speed_prior else None),
        arch="ps" if job.spec.architecture == "ParameterServer" else "allreduce",
        epochs=job.spec.epochs, min_ps=rs.ps.min if rs.ps else 0, max_ps=rs.ps.max if rs.ps else 0,
        min_workers=rs.worker.min, max_workers=rs.worker.max, suspend=job.spec.run_policy.suspend,
    )

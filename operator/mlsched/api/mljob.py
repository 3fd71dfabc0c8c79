"""MLJob: one distributed training job (parameter-server or all-reduce) that mlsched scales.

The run-policy block copies Kubeflow's `runPolicy` vocabulary so that TFJob / PyTorchJob users
can move their settings over unchanged. The scheduler owns the replica counts between
`min` and `max`; the job's owner only sets the bounds.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints, field_validator

from mlsched.api.base import IMMUTABLE, PRESERVE_UNKNOWN, ApiModel, CelRule, StatusModel
from mlsched.api.common import MAX_HISTORY, Condition
from mlsched.api.crdinfo import AGE, API_VERSION, CrdInfo, PrinterColumn

#: Upper bound of any replica count; also bounds the per-role placement lists in status.
MAX_REPLICAS = 1000

#: MLJob names prefix StatefulSet, pod and Service names. `<name>-worker-<10-char revision
#: hash>` must fit the 63-character label limit, hence 45; Services need a DNS-1035 label.
MAX_NAME_LENGTH = 45
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

NodeName = Annotated[str, StringConstraints(max_length=253)]

#: A model label: free-form, lowercase. Catalog names (resnet-50, vgg-16, ...) give the
#: scheduler measured priors for the job's speed; any other name is scheduled all the same.
MODEL_TYPE_PATTERN = r"^[a-z0-9]([-a-z0-9._]*[a-z0-9])?$"


class Architecture(StrEnum):
    PARAMETER_SERVER = "ParameterServer"
    ALL_REDUCE = "AllReduce"


# The GPU types whose measured speeds mlsched knows: workloads/gpu_types.GPU_TYPES, which
# tests/test_gpu_labels.py checks this against (`api` imports nothing of the scheduler).
class GpuType(StrEnum):
    """A GPU type mlsched has measured speeds for."""

    V100 = "v100"
    P100 = "p100"
    K80 = "k80"


class CleanPodPolicy(StrEnum):
    """Which pods to delete when the job finishes (Kubeflow semantics)."""

    ALL = "All"
    RUNNING = "Running"
    NONE = "None"


class JobPhase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class JobConditionType(StrEnum):
    """Condition types the operator sets on MLJobs (positive polarity, like Kueue)."""

    ADMITTED = "Admitted"  # allocated at least `min` of every role, atomically
    RUNNING = "Running"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    RESCALING = "Rescaling"  # the counts changed; the pods restart with the new ones


# ---------------------------------------------------------------------------------- spec


#: A pod template as the API server checks it at admission: kept as written (unknown fields
#: preserved), but with a spec that lists at least one container. CEL cannot see into
#: preserved fields, so this is schema. The rest (field names, required fields, resources) is
#: checked when the operator creates the StatefulSet with strict field validation; a template
#: refused there fails the job with InvalidSpec and the server's message.
POD_TEMPLATE_SCHEMA: dict[str, Any] = {
    **PRESERVE_UNKNOWN, "required": ["spec"],
    "properties": {"spec": {
        "type": "object", **PRESERVE_UNKNOWN, "required": ["containers"],
        "properties": {"containers": {
            "type": "array", "minItems": 1,
            "items": {"type": "object", **PRESERVE_UNKNOWN}}}}}}


def _has_containers(template: dict[str, Any]) -> bool:
    spec = template.get("spec")
    containers = spec.get("containers") if isinstance(spec, dict) else None
    return isinstance(containers, list) and len(containers) > 0


class ReplicaSpec(ApiModel):
    """Bounds the scheduler may choose within, and the pod template of this role."""

    min: int = Field(1, ge=1, le=MAX_REPLICAS,
                     description="Fewest replicas the job can run with; admitted all at once.")
    max: int = Field(ge=1, le=MAX_REPLICAS, description="Most replicas the scheduler may give.")
    template: dict[str, Any] = Field(
        min_length=1, json_schema_extra=POD_TEMPLATE_SCHEMA,
        description="A core/v1 PodTemplateSpec for this role's pods; stored as written.")
    gpu_types: list[GpuType] | None = Field(
        None, min_length=1, max_length=len(GpuType),
        json_schema_extra={"x-kubernetes-list-type": "set"},
        description="GPU types this role's pods may run on (v100, p100, k80), as read from "
                    "each node's GPU product label (nvidia.com/gpu.product by default); "
                    "unset: any node. A node without the label, or of a product outside these "
                    "types, is none of them.")

    cel_rules = (CelRule("self.min <= self.max", "must be >= min",
                         lambda s: s.min <= s.max, field_path=".max"),)

    @field_validator("template")
    @classmethod
    def _template_has_containers(cls, template: dict[str, Any]) -> dict[str, Any]:
        # The Python twin of POD_TEMPLATE_SCHEMA's `required` and `minItems`.
        if not _has_containers(template):
            raise ValueError("must list at least one container in spec.containers")
        return template


class ReplicaSpecs(ApiModel):
    ps: ReplicaSpec | None = Field(
        None, description="Parameter servers: required for ParameterServer, not allowed for "
                          "AllReduce.")
    worker: ReplicaSpec


class RunPolicy(ApiModel):
    """Lifecycle settings, named and defaulted as in Kubeflow's runPolicy."""

    suspend: bool = Field(False,
                          description="True stops all pods and keeps the job; False resumes.")
    backoff_limit: int | None = Field(
        None, ge=0, description="Pod restarts tolerated before the job fails; unset: no limit.")
    active_deadline_seconds: int | None = Field(
        None, ge=1, description="Running time after which the job fails; unset: no deadline.")
    ttl_seconds_after_finished: int | None = Field(
        None, ge=0, description="Delete the finished job after this long; unset: keep it.")
    clean_pod_policy: CleanPodPolicy = Field(
        CleanPodPolicy.RUNNING, description="Pods deleted on completion: All, Running or None.")


class SpeedPrior(ApiModel):
    """The job's speed as its owner measured or estimated it."""

    reference_epochs_per_hour: float = Field(
        gt=0, le=1e6, description="Epochs per hour with one PS and one worker (one worker "
                                  "for AllReduce).")


class MLJobSpec(ApiModel):
    """What to train and within which bounds the scheduler may size it."""

    # maxLength also bounds the CEL cost estimate of the immutability rule (unbounded strings
    # are costed at the request-size limit).
    model_type: str | None = Field(
        None, pattern=MODEL_TYPE_PATTERN, max_length=63, json_schema_extra=IMMUTABLE,
        description="What is trained, e.g. resnet-50: any name. A model from the mlsched "
                    "catalog gives the scheduler measured speed priors; others start from "
                    "speedPrior or a generic curve and are learned from observed progress.")
    speed_prior: SpeedPrior | None = Field(
        None, description="What the job's owner knows of its speed, used until progress is "
                          "observed.")
    architecture: Architecture = Field(
        json_schema_extra={**IMMUTABLE, "maxLength": 32},
        description="ParameterServer or AllReduce; fixed at creation.")
    epochs: float = Field(gt=0, description="Estimated epochs to convergence.")
    global_batch_size: int | None = Field(None, ge=1,
                                          description="Optional; the catalog's if unset.")
    scheduling_policy: str = Field(
        "default", pattern=DNS_SUBDOMAIN, max_length=253,
        description="SchedulingPolicy in the job's namespace; when omitted the one named "
                    "`default` is used.")
    replica_specs: ReplicaSpecs = Field(description="Replica bounds and pod template per role.")
    # `default: {}` lets the apiserver fill the nested defaults when the block is omitted.
    run_policy: RunPolicy = Field(default_factory=RunPolicy, json_schema_extra={"default": {}})

    cel_rules = (
        CelRule("self.architecture != 'AllReduce' || !has(self.replicaSpecs.ps)",
                "must not be set for AllReduce jobs",
                lambda s: s.architecture != Architecture.ALL_REDUCE or s.replica_specs.ps is None,
                field_path=".replicaSpecs.ps"),
        CelRule("self.architecture != 'ParameterServer' || has(self.replicaSpecs.ps)",
                "is required for ParameterServer jobs",
                lambda s: (s.architecture != Architecture.PARAMETER_SERVER
                           or s.replica_specs.ps is not None),
                field_path=".replicaSpecs.ps"),
    )


# -------------------------------------------------------------------------------- status


class RoleReplicas(StatusModel):
    """Replica counts of one role."""

    desired: int = Field(0, ge=0, description="Replicas the scheduler allocated.")
    ready: int = Field(0, ge=0, description="Replicas whose pods are Ready.")


class ReplicaStatuses(StatusModel):
    """Replica counts per role (ps is absent for AllReduce jobs)."""

    ps: RoleReplicas | None = None
    worker: RoleReplicas | None = None


class RoleGpuTypes(StatusModel):
    """Per role, the GPU types of the nodes its pods are placed on."""

    ps: str | None = Field(None, max_length=253)
    worker: str | None = Field(None, max_length=253)


class Placement(StatusModel):
    """Where each pod runs: list index = pod ordinal of that role."""

    pool: str | None = Field(None, max_length=253, description="Node pool (grouping decision).")
    ps: list[NodeName] = Field(default_factory=list, max_length=MAX_REPLICAS)
    worker: list[NodeName] = Field(default_factory=list, max_length=MAX_REPLICAS)
    gpu_types: RoleGpuTypes | None = Field(
        None, description="Per role, the GPU types of its pods' nodes, comma-separated, "
                          "fastest first (v100, p100, k80; a product outside these by its "
                          "label value); a role on nodes without the GPU product label is "
                          "absent.")


class Progress(StatusModel):
    """Training progress as reported by the job's pods."""

    epochs_done: float = Field(0.0, ge=0)
    speed: float = Field(0.0, ge=0, description="Epochs per second, recent average.")
    last_report_time: datetime | None = None
    summary: str | None = Field(None, max_length=64,
                                description="Done/total for `kubectl get`, e.g. 12.0/100.")
    samples_per_second: float | None = Field(
        None, ge=0, description="Training samples per second, as the job's pods last measured "
                                "and reported it (mlsched.training reports it).")

    @classmethod
    def of(cls, epochs_done: float, epochs: float, speed: float,
           at: datetime | None = None, samples_per_second: float | None = None) -> Progress:
        """A Progress with the summary the Progress printer column shows filled in."""
        total = f"{epochs:g}" if float(epochs).is_integer() else f"{epochs:.1f}"
        return cls(epochs_done=epochs_done, speed=speed, last_report_time=at,
                   summary=f"{epochs_done:.1f}/{total}", samples_per_second=samples_per_second)


class IntervalGrant(StatusModel):
    """What the scheduler gave this job for one interval."""

    interval: int = Field(ge=0, description="Scheduling round number.")
    start: datetime
    ps: int = Field(ge=0)
    workers: int = Field(ge=0)
    placement: Placement | None = None


class HistoryEntry(IntervalGrant):
    """What the scheduler gave this job in one interval and what it earned."""

    epochs: float = Field(ge=0, description="Epochs completed during the interval.")
    reward: float
    # Measured by the job itself at this interval's counts: absent when it reported nothing
    # during the interval (a job that does not report, or one restarting all interval long).
    speed: float | None = Field(None, ge=0, description="Epochs per second the job last "
                                "reported during the interval.")
    samples_per_second: float | None = Field(None, ge=0, description="Samples per second the "
                                             "job last reported during the interval.")


# Kept in status so that an operator restarted mid-interval closes this interval with the
# progress reported since (a history entry) instead of losing it; written in the same patch
# as the previous interval's history entry, so it costs no extra call.
class OpenInterval(IntervalGrant):
    """The interval now running: what the latest round gave the job, and its progress then."""

    epochs_at_start: float = Field(ge=0, description="status.progress.epochsDone when it began.")


class RoleCounts(StatusModel):
    """Parameter servers and workers."""

    ps: int = Field(0, ge=0)
    workers: int = Field(0, ge=0)


class Rescale(StatusModel):
    """One change of a running job's counts: every pod gets SIGTERM and its grace period to
    checkpoint, then the pods of the new counts start (a checkpoint-restart)."""

    from_: RoleCounts = Field(alias="from")
    to: RoleCounts
    start_time: datetime = Field(description="When the operator changed the counts.")
    completion_time: datetime | None = Field(
        None, description="When every pod of the new counts was Ready; unset while rescaling.")
    seconds: float | None = Field(None, ge=0, description="completionTime - startTime.")


class Rescales(StatusModel):
    """How often the scheduler resized the running job, and what it cost."""

    count: int = Field(0, ge=0, description="Rescales so far.")
    seconds: float = Field(0.0, ge=0, description="Time spent rescaling, summed: from each "
                           "change of counts until every pod of the new counts was Ready.")
    last: Rescale | None = None


class MLJobStatus(StatusModel):
    """Written by the operator only (status subresource)."""

    phase: JobPhase | None = Field(None, description="Summary of the conditions, for people.")
    conditions: list[Condition] = Field(
        default_factory=list, max_length=16, description="Latest observations, one per type.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]})
    observed_generation: int | None = Field(
        None, ge=0, description="metadata.generation this status reflects.")
    replica_statuses: ReplicaStatuses | None = None
    placement: Placement | None = None
    progress: Progress | None = None
    start_time: datetime | None = Field(None, description="When the job first ran.")
    completion_time: datetime | None = Field(None, description="When it succeeded or failed.")
    history: list[HistoryEntry] = Field(
        default_factory=list, max_length=MAX_HISTORY,
        description="Newest last; trimmed to the policy's historyLimit.")
    open_interval: OpenInterval | None = None
    group: str | None = Field(
        None, max_length=63,
        description="The node pool the policy's grouping put the job in (spec.grouping); its "
                    "pods require a node labelled with it.")
    group_since: datetime | None = Field(None, description="When the job entered `group`.")
    rescales: Rescales | None = Field(None, description="Changes of a running job's counts.")


# ---------------------------------------------------------------------------------- root


class MLJob(ApiModel):
    """A distributed ML training job scheduled by mlsched."""

    api_version: Literal["mlsched.io/v1alpha1"] = API_VERSION
    kind: Literal["MLJob"] = "MLJob"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: MLJobSpec
    status: MLJobStatus = Field(default_factory=MLJobStatus)

    cel_rules = (
        CelRule(f"self.metadata.name.size() <= {MAX_NAME_LENGTH} && "
                f"self.metadata.name.matches('{NAME_PATTERN}')",
                f"metadata.name must be a DNS-1035 label of at most {MAX_NAME_LENGTH} "
                "characters: it prefixes pod and Service names",
                lambda s: _valid_name(s.metadata.get("name"))),
    )


def _valid_name(name: str | None) -> bool:
    # Unnamed objects (generateName, local fixtures) have no name to check yet.
    if name is None:
        return True
    return len(name) <= MAX_NAME_LENGTH and re.fullmatch(NAME_PATTERN, name) is not None


CRD = CrdInfo(
    model=MLJob,
    kind="MLJob",
    plural="mljobs",
    short_names=("mlj", "mljob"),
    columns=(
        PrinterColumn("Phase", ".status.phase"),
        # Why it is (not) running at a glance, as a Pod's STATUS column says CrashLoopBackOff:
        # WaitingForAllocation, CannotFit, WaitingForQuota, Unschedulable, AllRolesReady, ...
        PrinterColumn("Reason", '.status.conditions[?(@.type=="Running")].reason',
                      description="The Running condition's reason"),
        PrinterColumn("PS", ".status.replicaStatuses.ps.desired", "integer",
                      "Parameter servers allocated"),
        PrinterColumn("Workers", ".status.replicaStatuses.worker.desired", "integer",
                      "Workers allocated"),
        PrinterColumn("Progress", ".status.progress.summary", description="Epochs done/total"),
        PrinterColumn("Policy", ".spec.schedulingPolicy"),
        PrinterColumn("Group", ".status.group", description="Node pool (grouping)"),
        AGE,
        PrinterColumn("Model", ".spec.modelType", priority=1),
        PrinterColumn("Architecture", ".spec.architecture", priority=1),
        PrinterColumn("Speed", ".status.progress.speed", "number", "Epochs per second", 1),
        PrinterColumn("Samples/s", ".status.progress.samplesPerSecond", "number",
                      "Training samples per second", 1),
        PrinterColumn("Rescales", ".status.rescales.count", "integer",
                      "Changes of the running job's counts", 1),
        PrinterColumn("GPU", ".status.placement.gpuTypes.worker",
                      description="GPU types of the workers' nodes", priority=1),
    ),
)

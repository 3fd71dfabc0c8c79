"""SchedulingPolicy: which algorithms schedule the MLJobs that name it, and their ONNX models.

Editing the object swaps the policy live. Algorithm names are refused at admission unless
they are among the known ones (`api/algorithms.py`, the CRD's `enum`s): a typo shows at
`kubectl apply` with the names it could have been. The models here keep them plain strings,
so that an object stored before a name was withdrawn (the API server does not re-check what
it stores) still parses, and the operator schedules it with the fallback and says so
(`Ready=True/FallbackActive`) rather than dropping the whole policy.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints, field_validator

from mlsched.api.algorithms import (
    ALLOCATION, ALLOCATION_HEURISTICS, GROUPING, PLACEMENT,
)
from mlsched.api.base import ApiModel, CelRule, StatusModel
from mlsched.api.common import MAX_HISTORY, Condition
from mlsched.api.crdinfo import AGE, API_VERSION, CrdInfo, PrinterColumn

ALGORITHM_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
CONFIGMAP_KEY = r"^[-._a-zA-Z0-9]+$"
SHA256_HEX = r"^[a-f0-9]{64}$"
PARENT_SEGMENT = r"(^|/)[.][.](/|$)"  # in CEL (RE2) and Python alike
Sha256 = Annotated[str, StringConstraints(pattern=SHA256_HEX)]


class PolicyConditionType(StrEnum):
    # True when every learned algorithm in use has its model loaded and verified (also True,
    # reason NoModelNeeded, when only heuristics are configured).
    MODEL_LOADED = "ModelLoaded"
    # True when the policy can schedule: algorithms known and models loaded, or fallback active.
    READY = "Ready"
    # Whether the round is inside the setting the served learned models were trained in (their
    # cards' domain; Unknown when a card records none); absent when only heuristics serve.
    MODEL_IN_DOMAIN = "ModelInDomain"
    # With spec.guard: True while the fallback serves because the recorded intervals, replayed,
    # show it ahead of the learned policy; False while the model serves; Unknown when the
    # estimate failed (the model keeps serving). Absent without a guard or a learned phase.
    GUARD_TRIPPED = "GuardTripped"


# ---------------------------------------------------------------------------------- spec


class ConfigMapKeyRef(ApiModel):
    name: str = Field(pattern=DNS_SUBDOMAIN, max_length=253,
                      description="ConfigMap in the policy's namespace.")
    key: str = Field(pattern=CONFIGMAP_KEY, max_length=253,
                     description="Key under data or binaryData holding the .onnx file.")


class ModelRef(ApiModel):
    """Where a learned algorithm's ONNX file comes from: exactly one of configMapKeyRef, path."""

    config_map_key_ref: ConfigMapKeyRef | None = Field(
        None, description="ONNX file in a ConfigMap (binaryData; ConfigMaps hold up to 1 MiB: a larger "
                          "model is split over several, named by annotation mlsched.io/model-parts).")
    path: str | None = Field(
        None, pattern=r"^/", max_length=4096,
        description="Absolute path of an ONNX file inside the operator pod, in one of the "
                    "directories the operator allows (--allowed-model-dir; by default the "
                    "models it ships); its model card <stem>.card.json beside it.")
    sha256: str | None = Field(
        None, pattern=SHA256_HEX,
        description="Optional pin: lowercase hex digest the file must have, else it is refused.")

    cel_rules = (
        CelRule("has(self.configMapKeyRef) != has(self.path)",
                "set exactly one of configMapKeyRef or path",
                lambda s: (s.config_map_key_ref is None) != (s.path is None)),
        # The operator resolves paths itself and refuses any outside its model directories;
        # a '..' is refused here too, so that the mistake shows at `kubectl apply`.
        CelRule(f"!has(self.path) || !self.path.matches('{PARENT_SEGMENT}')",
                "path must not contain '..' segments",
                lambda s: s.path is None or not re.search(PARENT_SEGMENT, s.path),
                field_path=".path"),
    )


class Exploration(ApiModel):
    """Off-policy actions taken while serving, so that retraining sees alternatives."""

    epsilon: float = Field(0.0, ge=0, le=1,
                           description="Probability that a decision is replaced by a random one.")
    entropy: float | None = Field(
        None, ge=0, description="Entropy-bonus weight for retraining Jobs that learn from this "
                                "policy's records; not used when serving.")


class Guard(ApiModel):
    """A regret guard (docs/operator.md, "Regret guard"): once `window` intervals have closed,
    at every closed interval the simulator replays the latest `window` of them (a rolling
    window) from their recorded start under the learned policy and under the fallback; the
    fallback serves once it is ahead, over the latest judgements pooled, by more than
    `fallbackWhenWorseBy`, and the model again after a spec edit or when they show it ahead."""

    fallback_when_worse_by: str = Field(
        "10%", pattern=r"^[0-9]+(\.[0-9]+)?%?$", max_length=16,
        description="How far ahead the fallback's estimate must be to trip: a percentage "
                    "(\"10%\") or a fraction as a string (\"0.1\").")
    window: int = Field(6, ge=1, le=1000, description="Closed intervals per judgement (a rolling "
                                                      "window, judged at every interval once full).")

    @field_validator("fallback_when_worse_by")
    @classmethod
    def _at_most_1000_percent(cls, value: str) -> str:
        # The scheduler's parse (policies/regret_guard.parse_threshold) refuses more; the
        # api imports nothing of the scheduler, so the bound is stated here as well.
        number = float(value.rstrip("%")) / (100 if value.endswith("%") else 1)
        if number > 10:
            raise ValueError(f"fallbackWhenWorseBy {value!r}: at most 1000 % (10)")
        return value


class Retraining(ApiModel):
    """The dataset the operator keeps for retraining Jobs (docs/operator.md, "Retraining")."""

    dataset_limit: int = Field(
        2000, ge=0, le=100000,
        description="Newest closed intervals kept as interval records (ConfigMaps labelled "
                    "mlsched.io/dataset-of=<policy>); older ones are deleted. 0 records nothing.")


class FairSharing(ApiModel):
    """How this policy shares GPUs with the other policies whose jobs draw on the same nodes
    (docs/operator.md, "Fair sharing between policies")."""

    weight: float = Field(
        1.0, ge=0, le=1000,
        description="While the policies' jobs together want more GPUs than the nodes have, each "
                    "policy may book at most its weighted share of them (plus what the others "
                    "leave idle); 0: only what the others leave idle, beyond its running jobs' "
                    "minimums.")


#: The node label a LabelNodes pool is written under (the only key the operator writes).
POOL_LABEL_KEY = "mlsched.io/pool"
LABEL_KEY = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
             r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class PoolOptions(ApiModel):
    """How a grouping's pools become node pools in the cluster (docs/grouping.md, "In the
    cluster"). Used only when spec.grouping is not none."""

    mode: Literal["LabelNodes", "ExistingPools"] = Field(
        "LabelNodes",
        description="LabelNodes: the operator labels the nodes it gives a pool with "
                    "mlsched.io/pool (needs the operator's --label-nodes and its nodes patch "
                    "rule, manifests/overlays/label-nodes). ExistingPools: groups are assigned to "
                    "node pools an admin labelled with labelKey; the operator writes no node.")
    label_key: str = Field(
        POOL_LABEL_KEY, max_length=317, pattern=LABEL_KEY,
        description="ExistingPools: the node label naming a node's pool, e.g. "
                    "cloud.google.com/gke-nodepool. LabelNodes writes mlsched.io/pool only.")
    threshold: float = Field(
        0.05, ge=0, le=10,
        description="Regroup only when the new grouping's predicted score beats keeping the "
                    "groups by more than this fraction (harmony).")
    min_stay_seconds: int = Field(
        1200, ge=0, le=604800,
        description="A running job stays at least this long in its pool before a regrouping "
                    "may move it (harmony); policy time, scaled like interval.")
    guard: bool = Field(
        False,
        description="harmony: at the first round after an arrival, compare its grouping with "
                    "isolated and none by rollouts in the simulator and keep the best "
                    "(status.grouping.governing). Off by default: isolated gives each job a "
                    "pool of its own, which in LabelNodes fences its nodes off other tenants.")

    cel_rules = (
        # has(): the apiserver also checks the rule against the bare default `{}`.
        CelRule("(has(self.mode) && self.mode == 'ExistingPools') || !has(self.labelKey) || "
                f"self.labelKey == '{POOL_LABEL_KEY}'",
                f"LabelNodes writes {POOL_LABEL_KEY} only; labelKey is for ExistingPools",
                lambda s: s.mode != "LabelNodes" or s.label_key == POOL_LABEL_KEY,
                field_path=".labelKey"),
    )


def _models_of(phase: str):
    return Field(default_factory=dict, max_length=8, json_schema_extra={"default": {}},
                 description=f"ONNX model per learned {phase} algorithm, keyed by its name.")


class PhaseModels(ApiModel):
    """Models keyed by phase, then algorithm: one name (e.g. tetris) may be an allocation
    and a placement algorithm, so a bare algorithm name would be ambiguous."""

    allocation: dict[str, ModelRef] = _models_of("allocation")
    placement: dict[str, ModelRef] = _models_of("placement")
    grouping: dict[str, ModelRef] = _models_of("grouping")

    def for_phase(self, phase: str) -> dict[str, ModelRef]:
        return getattr(self, phase)


def _algorithm(default: str, names: tuple[str, ...], description: str):
    """A name the API server refuses unless it is one of `names` (an enum in the schema only:
    see the module's docstring)."""
    return Field(default, pattern=ALGORITHM_NAME, max_length=63,
                 json_schema_extra={"enum": list(names)},
                 description=f"{description} One of: {', '.join(names)}.")


class SchedulingPolicySpec(ApiModel):
    """Algorithms for each decision kind, the models behind the learned ones, and bookkeeping."""

    interval: int = Field(1200, ge=1, le=86400, description="Seconds between scheduling rounds.")
    allocation: str = _algorithm("drf", ALLOCATION,
                                 "How many PS and workers each job gets.")
    placement: str = _algorithm("load-balance", PLACEMENT,
                                "Which node each task lands on.")
    grouping: str = _algorithm("none", GROUPING,
                               "Which jobs share a node pool; none disables grouping.")
    pools: PoolOptions = Field(default_factory=PoolOptions, json_schema_extra={"default": {}})
    models: PhaseModels = Field(
        default_factory=PhaseModels, json_schema_extra={"default": {}},
        description="ONNX models of learned algorithms, by phase and algorithm, e.g. "
                    "models.allocation.dl2. Learned algorithms without an entry use the model "
                    "shipped with the operator.")
    exploration: Exploration = Field(default_factory=Exploration, json_schema_extra={"default": {}})
    update_policy: Literal["Auto", "Manual"] = Field(
        "Manual", description="Published model versions (ConfigMaps labelled "
                              "mlsched.io/model-of=<policy>): Auto serves the newest from the next "
                              "interval on, Manual only reports it in status.modelVersions. An "
                              "entry in models always wins.")
    retraining: Retraining = Field(default_factory=Retraining, json_schema_extra={"default": {}})
    fair_sharing: FairSharing = Field(default_factory=FairSharing,
                                      json_schema_extra={"default": {}})
    guard: Guard | None = Field(
        None, description="Serve the fallback while the recorded intervals show it doing better "
                          "than the learned policy; absent: no guard.")
    fallback: str = _algorithm("drf", ALLOCATION_HEURISTICS,
                               "Allocation used while a learned model is unavailable (one that "
                               "needs no model).")
    history_limit: int = Field(50, ge=1, le=MAX_HISTORY,
                               description="Per-interval entries kept in status lists.")


# -------------------------------------------------------------------------------- status


class RewardEntry(StatusModel):
    """What the policy earned, summed over its jobs, in one interval."""

    interval: int = Field(ge=0, description="Scheduling round number.")
    start: datetime
    reward: float = Field(description="Sum of the jobs' rewards in this interval.")
    jobs: int = Field(ge=0, description="Jobs scheduled in this interval.")


class ServedVersion(StatusModel):
    """The model serving a learned algorithm."""

    source: Literal["spec", "published", "shipped"] = Field(
        description="spec: models.<phase>.<algorithm>; published: adopted by updatePolicy Auto; "
                    "shipped: the model installed with the operator.")
    sha256: Sha256
    version: int | None = Field(None, ge=1, description="Published version, when it is one.")
    config_map: str | None = Field(None, max_length=253, description="ConfigMap it came from.")
    evaluation: dict[str, float] = Field(
        default_factory=dict, max_length=32,
        description="The numbers retraining judged the version by (its mlsched.io/evaluation).")


class CandidateVersion(StatusModel):
    """The newest published version, when it is not the one serving."""

    version: int = Field(ge=1)
    sha256: Sha256
    config_map: str = Field(max_length=253)
    evaluation: dict[str, float] = Field(default_factory=dict, max_length=32)


class ModelVersions(StatusModel):
    active: ServedVersion | None = None
    candidate: CandidateVersion | None = None


class ExplorationStatus(StatusModel):
    requested: float = Field(ge=0, le=1, description="spec.exploration.epsilon.")
    applied: float = Field(ge=0, le=1, description="What serving applies: the request, at most "
                                                   "the operator's --max-exploration.")


class GroupStatus(StatusModel):
    """One pool the grouping decided, as the latest round applied it."""

    name: str = Field(max_length=63, description="The pool: the value of its nodes' label.")
    members: list[str] = Field(default_factory=list, max_length=64,
                               description="MLJobs in the pool.")
    nodes: list[str] = Field(default_factory=list, max_length=1024,
                             description="Nodes of the pool (the first 1024 by name).")
    node_count: int = Field(0, ge=0, description="Nodes in the pool.")
    share: int = Field(1, ge=1, description="Jobs time-sharing each node's CPU: each member's "
                                            "pods request 1/share of their template's CPU.")
    predicted_iteration_seconds: float | None = Field(
        None, ge=0, description="The group's predicted iteration time (Harmony eq. 1).")
    predicted_compute_utilisation: float | None = Field(None, ge=0)
    predicted_network_utilisation: float | None = Field(None, ge=0)


class GroupingStatus(StatusModel):
    """The latest grouping decision."""

    label_key: str = Field(max_length=317, description="The node label the pools are under.")
    pools: int = Field(0, ge=0, description="Pools with members.")
    predicted_gain: float = Field(
        0.0, description="Predicted score of a fresh grouping over keeping the groups "
                         "(relative); a regrouping needs more than spec.pools.threshold.")
    last_regrouping_time: datetime | None = Field(
        None, description="When the groups' members last changed.")
    governing: str | None = Field(
        None, max_length=63,
        description="harmony with pools.guard: which of harmony, isolated and none governs "
                    "(the lowest summed JCT of the rollouts at the latest arrival).")
    governing_since: datetime | None = Field(None, description="When it took over.")
    governing_message: str | None = Field(None, max_length=1024,
                                          description="Why it governs, or why no rollout ran.")
    estimates: dict[str, float] | None = Field(
        None, description="Summed JCT (policy seconds) of each candidate's rollout at the "
                          "latest decision.")
    colocation_error: float | None = Field(
        None, ge=0, description="Mean absolute relative error of the co-location model's "
                                "predicted speed against the members' reported speed "
                                "(pools of two or more members, since the operator started).")
    colocation_samples: int | None = Field(None, ge=0,
                                           description="Job-rounds the error is over.")


class FairShareStatus(StatusModel):
    """The policy's fair share of the GPUs contended for at its latest step (spec.fairSharing)."""

    entitled_gpus: float = Field(ge=0, description="The most its jobs may book in all now.")
    capacity_gpus: float = Field(ge=0, description="The GPUs the contending policies share.")
    demand_gpus: float = Field(ge=0, description="What its jobs could use, each at its max.")
    contenders: int = Field(ge=0, description="Policies with demand for them, itself included.")


class WorkConservationStatus(StatusModel):
    """Whether the latest round left idle capacity that a waiting job's minimum would fit
    (docs/operator.md, Work conservation)."""

    conserving: bool = Field(description="No waiting job's minimum task set would have fit "
                                         "in what the latest round left free.")
    idle_gpus: float = Field(0.0, ge=0, description="GPUs the minimums of the waiting jobs "
                                                    "that would fit would use (0 when conserving).")
    idle_cpus: float = Field(0.0, ge=0, description="CPUs they would use.")
    idle_tasks: int = Field(0, ge=0, description="Tasks they would start.")
    fitting_jobs: int = Field(0, ge=0, description="Waiting jobs whose minimum would fit.")
    consecutive_rounds: int = Field(
        0, ge=0, description="Rounds in a row, the latest included, that were not work "
                             "conserving; Ready says NotWorkConserving from the third.")


class GuardStatus(StatusModel):
    """The regret guard's latest judgement (docs/operator.md, "Regret guard"). Estimates are
    normalised progress per hour: the jobs' epochs trained over their total epochs."""

    tripped: bool = Field(description="The fallback serves in place of the learned policy.")
    since: datetime | None = Field(None, description="When it last tripped or cleared.")
    window: int = Field(ge=1, description="Closed intervals per judgement (spec.guard.window).")
    intervals: int = Field(0, ge=0, description="Closed intervals in the window (fewer than "
                                                "`window` until the first judgement after a change).")
    learned_estimate: float | None = Field(
        None, description="The latest window replayed under the learned policy.")
    fallback_estimate: float | None = Field(
        None, description="The latest window replayed under the fallback.")
    recorded: float | None = Field(None, description="What the policy that ran achieved, "
                                                     "as recorded.")
    estimate_error: float | None = Field(
        None, description="(replay of the policy that ran - recorded) / recorded: how far the "
                          "simulator's estimate is off on this cluster.")
    served: str | None = Field(None, description="learned or fallback: what ran that window.")
    message: str | None = Field(None, max_length=1024,
                                description="The latest judgement, or why none could be made.")


class SchedulingPolicyStatus(StatusModel):
    """Written by the operator only (status subresource)."""

    active_models: dict[str, Sha256] = Field(
        default_factory=dict, max_length=8,
        description="phase/algorithm (e.g. allocation/dl2) to sha256 of the model file "
                    "currently serving it.")
    model_versions: dict[str, ModelVersions] = Field(
        default_factory=dict, max_length=8,
        description="phase/algorithm to the version serving it and the newest published "
                    "candidate (updatePolicy Manual, or not yet adopted).")
    model_version: str | None = Field(
        None, max_length=256, description="Summary of the active versions, e.g. 'dl2 v3'.")
    exploration: ExplorationStatus | None = None
    conditions: list[Condition] = Field(
        default_factory=list, max_length=16,
        description="ModelLoaded, Ready and (while a learned model serves) ModelInDomain, one "
                    "entry per type.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]})
    last_round_time: datetime | None = Field(None, description="Start of the latest round.")
    last_round_duration_seconds: float | None = Field(
        None, ge=0, description="Wall time the latest round's decisions took.")
    decisions: int | None = Field(None, ge=0, description="Decisions made since the policy loaded.")
    admitted_jobs: int | None = Field(
        None, ge=0, description="Its jobs holding tasks after its latest round or admission step.")
    waiting_jobs: int | None = Field(
        None, ge=0, description="Its jobs (not suspended or finished) holding nothing then; each "
                                "says why in its Admitted condition.")
    booked_gpus: float | None = Field(
        None, ge=0, description="GPUs its jobs hold as its latest round or admission step decided.")
    fair_share: FairShareStatus | None = Field(
        None, description="Its share while policies contend for GPUs; absent while nothing "
                          "bounds it.")
    work_conservation: WorkConservationStatus | None = Field(
        None, description="The latest round's work-conservation check.")
    guard: GuardStatus | None = Field(None, description="The regret guard, with spec.guard.")
    rewards: list[RewardEntry] = Field(default_factory=list, max_length=MAX_HISTORY,
                                       description="Newest last; trimmed to historyLimit.")
    observed_generation: int | None = Field(
        None, ge=0, description="metadata.generation the loaded policy reflects.")
    groups: list[GroupStatus] = Field(
        default_factory=list, max_length=512,
        description="The pools of the grouping in force (spec.grouping), empty without one; "
                    "the first 512 by name (grouping.pools counts them all).")
    grouping: GroupingStatus | None = None


# ---------------------------------------------------------------------------------- root


class SchedulingPolicy(ApiModel):
    """Algorithms and learned models that schedule the MLJobs naming this policy."""

    api_version: Literal["mlsched.io/v1alpha1"] = API_VERSION
    kind: Literal["SchedulingPolicy"] = "SchedulingPolicy"
    metadata: dict[str, Any] = Field(default_factory=dict)
    # Every field has a default, so `spec: {}` (or no spec) is the drf/load-balance policy.
    spec: SchedulingPolicySpec = Field(default_factory=SchedulingPolicySpec,
                                       json_schema_extra={"default": {}})
    status: SchedulingPolicyStatus = Field(default_factory=SchedulingPolicyStatus)


def _condition_status(type_: str) -> str:
    return f'.status.conditions[?(@.type=="{type_}")].status'


CRD = CrdInfo(
    model=SchedulingPolicy,
    kind="SchedulingPolicy",
    plural="schedulingpolicies",
    short_names=("schedpol",),
    columns=(
        PrinterColumn("Allocation", ".spec.allocation"),
        PrinterColumn("Placement", ".spec.placement"),
        PrinterColumn("Model loaded", _condition_status(PolicyConditionType.MODEL_LOADED)),
        PrinterColumn("Ready", _condition_status(PolicyConditionType.READY)),
        PrinterColumn("Admitted", ".status.admittedJobs", "integer", "Jobs holding tasks"),
        PrinterColumn("Waiting", ".status.waitingJobs", "integer", "Jobs holding nothing"),
        PrinterColumn("GPUs", ".status.bookedGpus", "number", "GPUs its jobs hold as decided"),
        PrinterColumn("Model version", ".status.modelVersion"),
        PrinterColumn("Last round", ".status.lastRoundTime", "date"),
        AGE,
        PrinterColumn("Grouping", ".spec.grouping", priority=1),
        PrinterColumn("Gain", ".status.grouping.predictedGain", "number",
                      "Predicted gain of regrouping over keeping the groups", 1),
        PrinterColumn("Share", ".status.fairShare.entitledGpus", "number",
                      "Its fair share of contended GPUs (absent: not bounded)", 1),
        PrinterColumn("Weight", ".spec.fairSharing.weight", "number", "Fair-sharing weight", 1),
        PrinterColumn("Interval", ".spec.interval", "integer", "Seconds between rounds", 1),
        PrinterColumn("Decisions", ".status.decisions", "integer", priority=1),
    ),
)

"""The mlsched API (group `mlsched.io`, version `v1alpha1`): MLJob and SchedulingPolicy.

The pydantic models here are the single source of the API. `crds/` is generated from them:

    PYTHONPATH=operator python -m mlsched.api.crdgen --out crds/

and tests/test_crds.py fails when the committed YAML drifts from the models.

Using the models in the operator
--------------------------------
- `MLJob.from_k8s(body)` / `SchedulingPolicy.from_k8s(body)` parse a raw object (a kopf body
  works as is) and raise `InvalidObject`, whose message is one line naming every bad field:
  ``MLJob team-a/bert: spec.replicaSpecs.worker.max: must be >= min``. Post it with
  `kopf.warn(...)` / a `Failed` condition instead of crashing the handler.
- `model.to_k8s()` gives the camelCase wire form for a patch (None fields omitted).
- `set_condition(conditions, type, status, reason, message)` returns a new list with that
  condition replaced; lastTransitionTime only moves when `status` changes.
- `append_bounded(history, entry, policy.spec.history_limit)` keeps the per-interval lists short.
- An omitted `spec.schedulingPolicy` is defaulted to `default`: the SchedulingPolicy named
  `default` in the job's namespace.

Where kopf keeps its bookkeeping
--------------------------------
Nowhere on the objects (docs/operator.md, "Where kopf keeps its bookkeeping"): the operator
uses kopf for watching and indexing only, with no change handlers, timers or daemons, so kopf
writes no finalizer, no diff-base annotation and no `status.<handler id>`. The CRD schemas are
structural, so the apiserver prunes any status field these models do not declare: a new
status field goes into these models first (then `crds/` is regenerated). kopf's settings are
in the operator's handlers module (`configure`).
"""

from mlsched.api.base import InvalidObject, describe_errors, immutable_changes
from mlsched.api.common import (
    MAX_HISTORY,
    Condition,
    ConditionStatus,
    append_bounded,
    get_condition,
    is_condition_true,
    set_condition,
    utcnow,
)
from mlsched.api.crdinfo import API_VERSION, GROUP, VERSION
from mlsched.api.mljob import (
    Architecture,
    CleanPodPolicy,
    GpuType,
    HistoryEntry,
    JobConditionType,
    JobPhase,
    MLJob,
    MLJobSpec,
    MLJobStatus,
    OpenInterval,
    Placement,
    Progress,
    ReplicaSpec,
    RoleReplicas,
)
from mlsched.api.schedulingpolicy import (
    GroupStatus, ModelRef, PhaseModels, PoolOptions,
    PolicyConditionType,
    RewardEntry,
    SchedulingPolicy,
    SchedulingPolicySpec,
    SchedulingPolicyStatus,
)

#: Annotation prefix for kopf's bookkeeping (see the module docstring).
KOPF_ANNOTATION_PREFIX = GROUP

__all__ = [
    "API_VERSION", "GROUP", "KOPF_ANNOTATION_PREFIX", "MAX_HISTORY", "VERSION",
    "Architecture", "CleanPodPolicy", "Condition", "GpuType", "ConditionStatus", "HistoryEntry",
    "InvalidObject", "JobConditionType", "JobPhase", "MLJob", "MLJobSpec", "MLJobStatus",
    "GroupStatus", "ModelRef", "OpenInterval", "PhaseModels", "Placement", "PoolOptions", "PolicyConditionType", "Progress", "ReplicaSpec", "RewardEntry",
    "RoleReplicas", "SchedulingPolicy", "SchedulingPolicySpec", "SchedulingPolicyStatus",
    "append_bounded", "describe_errors", "get_condition", "immutable_changes",
    "is_condition_true", "set_condition", "utcnow",
]

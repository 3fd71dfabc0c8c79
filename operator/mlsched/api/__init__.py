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

Where kopf keeps its bookkeeping (decision)
-------------------------------------------
The CRD schemas are structural, so the apiserver prunes every status field the models do not
declare. kopf's defaults would write `status.kopf.progress` (pruned, so handlers would re-run
forever) and `status.<handler id>` for handler return values (also pruned). Therefore:

1. All kopf state goes into annotations under our own prefix, never into status::

       @kopf.on.startup()
       def configure(settings: kopf.OperatorSettings, **_):
           settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
               prefix="mlsched.io", v1=False)
           settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
               prefix="mlsched.io", key="last-handled-configuration", v1=False)
           settings.persistence.finalizer = "mlsched.io/finalizer"

   (`v1=False`: no legacy duplicate keys to keep for rollbacks in a new operator.)
   Annotations written: `mlsched.io/last-handled-configuration` (the diff base, the spec as
   last handled), `mlsched.io/touch-dummy` (kopf's no-op patch for timers and daemons), and
   short-lived `mlsched.io/<handler-id>` progress keys, removed when a handler succeeds.
2. Handlers return None and write status through `patch.status[...]` with values from
   `to_k8s()`; a returned value would land in the pruned `status.<handler id>`.
3. Argo CD must neither report these annotations as drift nor re-reconcile the Application
   every time kopf or the operator touches them. The manifests are owned by `manifests/`;
   the settings to put there, for kinds `MLJob` and `SchedulingPolicy` of group mlsched.io::

       # Application.spec (or argocd-cm resource.customizations.ignoreDifferences.<group>_<kind>)
       ignoreDifferences:
       - group: mlsched.io
         kind: MLJob                      # and again for SchedulingPolicy
         jqPathExpressions:
         - .metadata.annotations["mlsched.io/last-handled-configuration"]
         - .metadata.annotations["mlsched.io/touch-dummy"]
       # argocd-cm: resource.customizations.ignoreResourceUpdates.mlsched.io_MLJob (and
       # ..._SchedulingPolicy): the same two paths plus `.status`, which the operator rewrites
       # every interval.

   Status is not in the manifests, so it does not show up as drift.
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
    "Architecture", "CleanPodPolicy", "Condition", "ConditionStatus", "HistoryEntry",
    "InvalidObject", "JobConditionType", "JobPhase", "MLJob", "MLJobSpec", "MLJobStatus",
    "GroupStatus", "ModelRef", "OpenInterval", "PhaseModels", "Placement", "PoolOptions", "PolicyConditionType", "Progress", "ReplicaSpec", "RewardEntry",
    "RoleReplicas", "SchedulingPolicy", "SchedulingPolicySpec", "SchedulingPolicyStatus",
    "append_bounded", "describe_errors", "get_condition", "immutable_changes",
    "is_condition_true", "set_condition", "utcnow",
]

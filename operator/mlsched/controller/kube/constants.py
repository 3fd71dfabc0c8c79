"""Names the operator writes into the cluster: labels, the scheduling gate, annotations, paths.

Kept in one place because three parties must agree on them: the manifests the operator renders,
the index functions that read objects back, and the training pods (through their environment).
"""

from mlsched.api import GROUP

#: Every object the operator creates for a job carries these two labels.
JOB_LABEL = f"{GROUP}/job-name"
ROLE_LABEL = f"{GROUP}/role"

#: Pods are created with this scheduling gate and stay unschedulable until the operator has
#: pinned them to the node the policy chose (see docs/operator.md, "Placement").
PLACEMENT_GATE = f"{GROUP}/placement"
# On the operator's own pod while it leads: the Service selects it, so progress reports (and
# Prometheus) reach the leader, while both replicas stay Ready (a PodDisruptionBudget counts
# Ready pods; with only the leader Ready, no drain could ever evict it).
LEADER_LABEL = f"{GROUP}/leader"

#: The well-known label every kubelet sets to its node name; the pin is a nodeSelector on it.
HOSTNAME_LABEL = "kubernetes.io/hostname"

#: Set by the StatefulSet controller (k8s >= 1.28) on every pod: its ordinal.
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"

#: Hash of the pod template the operator last rendered into a StatefulSet; comparing it is how
#: re-rendering an unchanged template costs no API call.
TEMPLATE_HASH_ANNOTATION = f"{GROUP}/template-hash"

#: Optional node label naming the node pool a grouping policy may assign jobs to.
POOL_LABEL = f"{GROUP}/pool"
#: On a node the operator labelled with POOL_LABEL (--label-nodes): `namespace/policy` of the
#: SchedulingPolicy whose pool it is. Only labels with this annotation are ever removed, so an
#: admin's mlsched.io/pool label is never touched.
POOL_OWNER_ANNOTATION = f"{GROUP}/pool-owner"
#: On a StatefulSet whose pod template requires a pool: the pool as rendered (JSON of label
#: key, value and CPU share), so that re-rendering after a spec edit keeps it.
STS_POOL_ANNOTATION = f"{GROUP}/pool"

#: The audience-bound ServiceAccount token training pods present to the progress endpoint.
TOKEN_AUDIENCE = f"{GROUP}/progress"
TOKEN_VOLUME = "mlsched-progress-token"
TOKEN_DIR = "/var/run/secrets/mlsched.io"
TOKEN_PATH = f"{TOKEN_DIR}/token"
TOKEN_EXPIRATION_SECONDS = 3600

#: What TokenReview puts into user.extra for tokens bound to a pod.
EXTRA_POD_NAME = "authentication.kubernetes.io/pod-name"
EXTRA_POD_UID = "authentication.kubernetes.io/pod-uid"

#: The component name in Events and the field manager of the operator's writes.
COMPONENT = "mlsched-operator"

ROLES = ("ps", "worker")


def operator_labels(job: str, role: str | None = None) -> dict[str, str]:
    """The labels the operator puts on a job's children (and, with the role, on its pods,
    over the template's own)."""
    out = {JOB_LABEL: job, "app.kubernetes.io/managed-by": COMPONENT}
    if role:
        out[ROLE_LABEL] = role
    return out

#: What earlier versions of the operator left on objects through kopf (a finalizer; the last-handled spec
#: and handler progress as annotations). Removed when seen: nothing needs them any more.
LEGACY_FINALIZER = f"{GROUP}/finalizer"
LEGACY_ANNOTATIONS = tuple(f"{GROUP}/{name}" for name in (
    "last-handled-configuration", "mljob_children", "mljob_deleted", "policy_edited"))

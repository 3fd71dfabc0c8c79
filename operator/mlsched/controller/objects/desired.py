"""What should exist for a job, and the smallest set of changes that gets there. Pure.

- `service_manifest` / `statefulset_manifest` / `pod_template`: the children of an MLJob.
- `job_targets`: a round's Decision as per-job counts and per-ordinal node names.
- `plan_statefulset` / `plan_pods`: compare targets with what the indexes show and return only
  the actions that change something, so applying the same decision twice does nothing.

StatefulSet ordinal k of a role is task ordinal k of that role in the Decision.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mlsched.api import API_VERSION
from mlsched.cluster.types import Decision, Snapshot
from mlsched.controller.constraints import gpu_labels
from mlsched.controller.kube.constants import (
    HOSTNAME_LABEL, JOB_LABEL, PLACEMENT_GATE, POD_INDEX_LABEL, ROLES,
    STS_POOL_ANNOTATION, TEMPLATE_HASH_ANNOTATION, TOKEN_AUDIENCE, TOKEN_DIR, TOKEN_EXPIRATION_SECONDS, TOKEN_PATH,
    TOKEN_VOLUME, operator_labels,
)
from mlsched.controller.objects.records import PodPool, PodRecord, StsRecord
from mlsched.controller.objects.job_records import JobRecord
from mlsched.controller.objects.quantities import parse_quantity

# ------------------------------------------------------------------------------ manifests


@dataclass(frozen=True)
class PodSettings:
    """What every training pod is told about the operator: where and as whom to report."""

    progress_url: str
    token_audience: str = TOKEN_AUDIENCE
    # Taint keys of the nodes the operator places tasks on (OperatorConfig.tolerated_taints):
    # its pods must tolerate them, or a pod pinned to such a node could never start there.
    tolerated_taints: tuple[str, ...] = ()
    # The ServiceAccount pods run as when their template names none (None: the namespace's
    # `default`): the training one has no API rights and mounts no API token.
    service_account: str | None = None
    # PEM of the CA that signed the endpoint's certificate (None: the endpoint is plain HTTP or
    # signed by a CA the pods already trust). mlsched.progress verifies the endpoint with it.
    progress_ca: str | None = None


def sts_name(job: str, role: str) -> str:
    return f"{job}-{role}"


def roles_of(job: JobRecord) -> tuple[str, ...]:
    return ROLES if job.arch == "ps" else ("worker",)


def labels(job: JobRecord, role: str | None = None) -> dict[str, str]:
    return operator_labels(job.name, role)


def owner_reference(job: JobRecord) -> dict[str, Any]:
    # controller=true: the children are this job's alone; deleting the MLJob garbage-collects them.
    return {"apiVersion": API_VERSION, "kind": "MLJob", "name": job.name, "uid": job.uid,
            "controller": True, "blockOwnerDeletion": True}


def service_manifest(job: JobRecord) -> dict[str, Any]:
    """Headless Service: gives every pod the DNS name <pod>.<job>.<namespace>.svc, also before
    it is Ready, so that peers can find each other while they start."""
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": job.name, "namespace": job.namespace, "labels": labels(job),
                     "ownerReferences": [owner_reference(job)]},
        "spec": {"clusterIP": "None", "selector": {JOB_LABEL: job.name},
                 "publishNotReadyAddresses": True},
    }


def host_names(job: JobRecord, role: str, count: int) -> str:
    return ",".join(f"{job.name}-{role}-{k}.{job.name}.{job.namespace}.svc" for k in range(count))


#: Ports of the frameworks' conventions, as Kubeflow's PyTorchJob and TFJob default them; a
#: container port of the role's template named like theirs (pytorchjob-port, tfjob-port)
#: moves it, so templates written for those operators keep their ports.
MASTER_PORT, MASTER_PORT_NAME = 23456, "pytorchjob-port"
TF_PORT, TF_PORT_NAME = 2222, "tfjob-port"
#: The volume a job's pods checkpoint into (docs/training.md): where a container mounts it is
#: MLSCHED_CHECKPOINT_DIR.
CHECKPOINT_VOLUME = "checkpoint"
#: The pod's ordinal, defined first so that later values can refer to it as $(...): the
#: kubelet expands a reference to a variable defined earlier in the list.
INDEX_VAR = "MLSCHED_REPLICA_INDEX"
ARCHITECTURE_NAMES = {"ps": "ParameterServer", "allreduce": "AllReduce"}


def named_port(job: JobRecord, role: str, name: str, default: int) -> int:
    """The containerPort of `role`'s template named `name`, else `default`."""
    spec = (job.templates.get(role) or {}).get("spec") or {}
    for container in spec.get("containers") or ():
        for port in container.get("ports") or ():
            if port.get("name") == name and isinstance(port.get("containerPort"), int):
                return port["containerPort"]
    return default


def tf_config(job: JobRecord, role: str, counts: Mapping[str, int]) -> str:
    """TF_CONFIG as Kubeflow's TFJob renders it, the task index left to the kubelet."""
    cluster = {r: [f"{h}:{named_port(job, r, TF_PORT_NAME, TF_PORT)}"
                   for h in host_names(job, r, counts.get(r, 0)).split(",") if h]
               for r in ROLES}
    text = json.dumps({"cluster": cluster, "task": {"type": role, "index": 0},
                       "environment": "cloud"}, separators=(",", ":"))
    # The one per-pod value: a template is shared by every pod of the StatefulSet.
    return text.replace('"index":0', f'"index":$({INDEX_VAR})')


def framework_environment(job: JobRecord, role: str, counts: Mapping[str, int]) -> dict[str, str]:
    """The variables training frameworks already read, so code written for Kubeflow's
    PyTorchJob / TFJob (or torchrun) runs unchanged: the torch.distributed `env://` set and
    torchrun's PET_* for all-reduce jobs (one process per pod), TF_CONFIG for parameter-server
    jobs. Per-pod values refer to the pod's ordinal ($(MLSCHED_REPLICA_INDEX))."""
    if job.arch != "allreduce":
        return {"TF_CONFIG": tf_config(job, role, counts)}
    master = f"{job.name}-worker-0.{job.name}.{job.namespace}.svc"
    port = str(named_port(job, "worker", MASTER_PORT_NAME, MASTER_PORT))
    workers, rank = str(counts.get("worker", 0)), f"$({INDEX_VAR})"
    return {"MASTER_ADDR": master, "MASTER_PORT": port, "WORLD_SIZE": workers, "RANK": rank,
            "PET_MASTER_ADDR": master, "PET_MASTER_PORT": port, "PET_NNODES": workers,
            "PET_NODE_RANK": rank}


def environment(job: JobRecord, role: str, counts: Mapping[str, int],
                settings: PodSettings) -> list[dict]:
    """What training code needs to find its peers and report progress: mlsched's own
    MLSCHED_* variables and the frameworks' (framework_environment).

    The counts are part of the template on purpose: a job whose allocation changes restarts
    with the new cluster spec (checkpoint-restart, the scaling cost the simulator models).
    """
    ps, workers = counts.get("ps", 0), counts.get("worker", 0)
    env: list[dict] = [
        {"name": INDEX_VAR, "valueFrom": {"fieldRef": {
            "fieldPath": f"metadata.labels['{POD_INDEX_LABEL}']"}}},
        {"name": "MLSCHED_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "MLSCHED_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    plain = {
        "MLSCHED_JOB_NAME": job.name,
        "MLSCHED_ROLE": role,
        "MLSCHED_ARCHITECTURE": ARCHITECTURE_NAMES.get(job.arch, job.arch),
        "MLSCHED_MODEL_TYPE": job.model,
        "MLSCHED_EPOCHS": f"{job.epochs:g}",
        "MLSCHED_SERVICE": job.name,
        "MLSCHED_HOST_PATTERN": f"{job.name}-{{role}}-{{index}}.{job.name}.{job.namespace}.svc",
        "MLSCHED_PS_REPLICAS": str(ps),
        "MLSCHED_WORKER_REPLICAS": str(workers),
        "MLSCHED_PS_HOSTS": host_names(job, "ps", ps),
        "MLSCHED_WORKER_HOSTS": host_names(job, "worker", workers),
        "MLSCHED_PROGRESS_URL": settings.progress_url,
        "MLSCHED_TOKEN_FILE": TOKEN_PATH,
    }
    if settings.progress_ca:
        plain["MLSCHED_PROGRESS_CA"] = settings.progress_ca
    plain.update(framework_environment(job, role, counts))
    return env + [{"name": k, "value": v} for k, v in plain.items()]


def checkpoint_environment(container: Mapping[str, Any]) -> list[dict]:
    """MLSCHED_CHECKPOINT_DIR for a container that mounts the `checkpoint` volume."""
    for mount in container.get("volumeMounts") or ():
        if mount.get("name") == CHECKPOINT_VOLUME and mount.get("mountPath"):
            return [{"name": "MLSCHED_CHECKPOINT_DIR", "value": mount["mountPath"]}]
    return []


def pool_affinity(spec: dict, pool: PodPool) -> None:
    """Require a node labelled `pool.key=pool.value`, on top of the template's own required
    node affinity: the requirement joins every nodeSelectorTerm (terms are ORed, expressions
    in a term ANDed), so kube-scheduler alone keeps the pods inside the pool."""
    need = {"key": pool.key, "operator": "In", "values": [pool.value]}
    affinity = spec["affinity"] = spec.get("affinity") or {}
    node = affinity["nodeAffinity"] = affinity.get("nodeAffinity") or {}
    key = "requiredDuringSchedulingIgnoredDuringExecution"
    required = node[key] = node.get(key) or {}
    terms = required.get("nodeSelectorTerms") or [{}]
    for term in terms:
        exprs = [e for e in term.get("matchExpressions") or () if e.get("key") != pool.key]
        term["matchExpressions"] = [*exprs, need]
    required["nodeSelectorTerms"] = terms


def millicores(value: Any) -> int:
    return int(round(parse_quantity(value) * 1000))


def share_cpu(spec: dict, share: int) -> None:
    """Each container's CPU request / `share` (rounded down to a millicore, at least 1m): the
    pool's nodes' CPU is time-shared by `share` jobs. A CPU limit stays (a request below its
    limit is valid); a container with a limit and no request gets the divided limit as its
    request. Memory and GPUs are never divided (docs/grouping.md, "In the cluster")."""
    if share <= 1:
        return
    # The pod itself too: pod-level resources, where set, replace its containers' CPU sum.
    pod_level = [spec] if spec.get("resources") else []
    for container in [*(spec.get("containers") or ()), *(spec.get("initContainers") or ()),
                      *pod_level]:
        res = container["resources"] = container.get("resources") or {}
        requests, limits = res.get("requests") or {}, res.get("limits") or {}
        cpu = requests.get("cpu", limits.get("cpu"))
        if cpu is None:
            continue
        res["requests"] = {**requests, "cpu": f"{max(1, millicores(cpu) // share)}m"}


def pod_template(job: JobRecord, role: str, counts: Mapping[str, int],
                 settings: PodSettings, pool: PodPool | None = None) -> dict:
    """The user's template plus our labels, environment, progress token and placement gate;
    for a grouped job (`pool`), the pool's node affinity and its share of the CPU."""
    tpl = json.loads(json.dumps(job.templates.get(role) or {}))  # a deep copy, 3x faster
    meta = tpl.setdefault("metadata", {})
    meta["labels"] = {**(meta.get("labels") or {}), **labels(job, role)}
    spec = tpl.setdefault("spec", {})
    spec["restartPolicy"] = "Always"  # the only policy StatefulSets accept
    if settings.service_account and not spec.get("serviceAccountName") \
            and not spec.get("serviceAccount"):  # the deprecated alias counts as naming one
        spec["serviceAccountName"] = settings.service_account
    # The operator owns placement: a user pin would fight it (and cannot be changed on a
    # gated pod once set), so it is dropped.
    spec.pop("nodeName", None)
    selector = {k: v for k, v in (spec.get("nodeSelector") or {}).items() if k != HOSTNAME_LABEL}
    if selector:
        spec["nodeSelector"] = selector
    else:
        spec.pop("nodeSelector", None)
    tolerations = list(spec.get("tolerations") or ())
    tolerated = {t.get("key") for t in tolerations
                 if t.get("operator") == "Exists" and not t.get("effect")}
    tolerations += [{"key": key, "operator": "Exists"}
                    for key in settings.tolerated_taints if key not in tolerated]
    if tolerations:
        spec["tolerations"] = tolerations
    gates = [g for g in spec.get("schedulingGates") or () if g.get("name") != PLACEMENT_GATE]
    spec["schedulingGates"] = [*gates, {"name": PLACEMENT_GATE}]
    volumes = [v for v in spec.get("volumes") or () if v.get("name") != TOKEN_VOLUME]
    spec["volumes"] = [*volumes, {"name": TOKEN_VOLUME, "projected": {"sources": [
        {"serviceAccountToken": {"audience": settings.token_audience, "path": "token",
                                 "expirationSeconds": TOKEN_EXPIRATION_SECONDS}}]}}]
    ours = environment(job, role, counts, settings)
    for container in spec.get("containers") or ():
        mine = [*ours, *checkpoint_environment(container)]
        our_names = {e["name"] for e in mine}
        env = [e for e in container.get("env") or () if e.get("name") not in our_names]
        container["env"] = [*env, *mine]
        mounts = [m for m in container.get("volumeMounts") or () if m.get("name") != TOKEN_VOLUME]
        container["volumeMounts"] = [*mounts, {"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR,
                                               "readOnly": True}]
    if pool is not None:
        pool_affinity(spec, pool)
        share_cpu(spec, pool.share)
    return tpl


#: Bump when pod_template renders differently from the same inputs: running jobs then get
#: the new template at their next round.
RENDER_VERSION = 3  # 2: tolerations of the operator's tolerated taints; 3: frameworks' variables
_hashes: dict[tuple, str] = {}
_HASH_CACHE_SIZE = 8192


def template_hash(job: JobRecord, role: str, counts: Mapping[str, int],
                  settings: PodSettings, pool: PodPool | None = None) -> str:
    """Identifies a rendered template by everything it is rendered from, so comparing with the
    StatefulSet's annotation needs no rendering. Memoized per (job uid, generation, ...): a
    steady round hashes nothing."""
    ps, workers = counts.get("ps", 0), counts.get("worker", 0)
    key = (job.uid, job.generation, job.namespace, job.name, role, ps, workers, settings, pool)
    digest = _hashes.get(key)
    if digest is None:
        source = [RENDER_VERSION, job.templates.get(role), job.namespace, job.name, job.model,
                  job.epochs, role, ps, workers, settings.progress_url, settings.token_audience,
                  list(settings.tolerated_taints), settings.service_account, settings.progress_ca]
        if pool is not None:  # appended only when set: ungrouped jobs keep their hashes
            source.append([pool.key, pool.value, pool.share])
        digest = hashlib.sha256(json.dumps(source, sort_keys=True).encode()).hexdigest()[:16]
        if len(_hashes) >= _HASH_CACHE_SIZE:
            _hashes.clear()
        _hashes[key] = digest
    return digest


def clear_hash_cache() -> None:
    _hashes.clear()


def starting_counts(job: JobRecord) -> dict[str, int]:
    """The counts a waiting job's StatefulSets are rendered for (at creation, and by a spec
    edit's refresh while it waits): its minimum, what a busy cluster admits it with. Admitting
    it with them changes the replicas alone: no new template, so no new ControllerRevision and
    a patch of a few bytes instead of the whole pod template. The first round after a mass
    arrival admits about a thousand waiting jobs (bench_e2e: 1,101 of the 1,365 jobs it
    changed, most at their minimum). No pod ever runs with these counts unless they are
    the decided ones: a role with replicas gets the template of the decided counts."""
    return {role: job.min_ps if role == "ps" else job.min_workers for role in roles_of(job)}


def statefulset_manifest(job: JobRecord, role: str, replicas: int, counts: Mapping[str, int],
                         settings: PodSettings, pool: PodPool | None = None) -> dict[str, Any]:
    template = pod_template(job, role, counts, settings, pool)
    digest = template_hash(job, role, counts, settings, pool)
    annotations = {TEMPLATE_HASH_ANNOTATION: digest}
    if pool is not None:
        annotations[STS_POOL_ANNOTATION] = pool.annotation()
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": sts_name(job.name, role), "namespace": job.namespace,
                     "labels": labels(job, role),
                     "annotations": annotations,
                     "ownerReferences": [owner_reference(job)]},
        "spec": {
            "replicas": replicas,
            "serviceName": job.name,
            # Parallel: all pods of a new allocation are created at once (OrderedReady would
            # start them one by one, each waiting for the previous one to be Ready).
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": labels(job, role)},
            # maxUnavailable lets a changed allocation restart every pod at once; apiservers
            # without the MaxUnavailableStatefulSet feature drop it and roll one pod at a time.
            "updateStrategy": {"type": "RollingUpdate",
                               "rollingUpdate": {"maxUnavailable": "100%"}},
            "template": template,
        },
    }


# -------------------------------------------------------------------------------- targets


@dataclass(frozen=True)
class JobTarget:
    """What a round decided for one job: node name per task ordinal of each role."""

    nodes: Mapping[str, tuple[str, ...]]
    pool: str | None = None
    # status.placement.gpuTypes: per role, its nodes' GPU names (gpu_labels.role_names).
    gpu_types: Mapping[str, str] = field(default_factory=dict)

    def count(self, role: str) -> int:
        return len(self.nodes.get(role, ()))

    @property
    def counts(self) -> dict[str, int]:
        return {role: self.count(role) for role in ROLES}

    def placement(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ps": list(self.nodes.get("ps", ())),
                               "worker": list(self.nodes.get("worker", ()))}
        if self.pool:
            out["pool"] = self.pool
        if self.gpu_types:
            out["gpuTypes"] = dict(self.gpu_types)
        return out


NOTHING = JobTarget(nodes={"ps": (), "worker": ()})


def job_targets(decision: Decision, snapshot: Snapshot) -> dict[str, JobTarget]:
    """Decision → targets for every job in the snapshot (absent from the decision: nothing).

    Bounds are enforced again here even though the Packer respects them: a learned policy is
    untrusted input, and a job below its minimum of any role cannot train (gang).
    """
    names = snapshot.node_names
    out = {}
    for view in snapshot.jobs:
        d = decision.jobs.get(view.name)
        if d is None:
            out[view.name] = NOTHING
            continue
        ps = tuple(names[i] for i in d.ps_nodes)[:view.bounds("ps")[1]]
        workers = tuple(names[i] for i in d.worker_nodes)[:view.bounds("worker")[1]]
        too_few = len(workers) < max(view.min_workers, 1) or (
            view.uses_ps and len(ps) < max(view.min_ps, 1))
        out[view.name] = NOTHING if too_few else JobTarget(
            {"ps": ps, "worker": workers}, view.pool, gpu_labels.role_names(
                snapshot.gpu_names, {"ps": d.ps_nodes[:len(ps)], "worker": d.worker_nodes[:len(workers)]}))
    return out


# ---------------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class PatchStatefulSet:
    namespace: str
    name: str
    replicas: int
    template: dict | None = field(default=None, compare=False)  # None: template unchanged
    template_hash: str | None = None
    uid: str | None = field(default=None, compare=False)  # the StatefulSet this was planned for
    pool: PodPool | None = None  # the pool the new template requires (with a template only)
    # A template-only change (a spec edit's refresh): the replicas are left as they are, and
    # the patch fails (422) unless the template it replaces is still this one.
    replaces_hash: str | None = field(default=None, compare=False)
    keep_replicas: bool = field(default=False, compare=False)

    def patch(self) -> list[dict]:
        """A JSON patch: `replace` swaps the template exactly, where a merge patch would keep
        keys the user has since removed from the MLJob's template. With a uid, `test` makes it
        fail (422) on a StatefulSet that was replaced since it was planned."""
        hash_path = ("/metadata/annotations/"
                     + TEMPLATE_HASH_ANNOTATION.replace("~", "~0").replace("/", "~1"))
        ops = [{"op": "test", "path": "/metadata/uid", "value": self.uid}] if self.uid else []
        if self.replaces_hash is not None:
            ops += [{"op": "test", "path": hash_path, "value": self.replaces_hash}]
        if not self.keep_replicas:
            ops += [{"op": "replace", "path": "/spec/replicas", "value": self.replicas}]
        if self.template is not None:
            ops += [{"op": "replace", "path": "/spec/template", "value": self.template},
                    {"op": "add", "path": hash_path, "value": self.template_hash},
                    # "" when ungrouped: `add` replaces, and needs no test that it exists
                    {"op": "add", "path": "/metadata/annotations/"
                     + STS_POOL_ANNOTATION.replace("~", "~0").replace("/", "~1"),
                     "value": self.pool.annotation() if self.pool else ""}]
        return ops


@dataclass(frozen=True)
class PinPod:
    """Pin a gated pod to its node and lift our gate; kube-scheduler then binds it there."""

    namespace: str
    name: str
    uid: str
    role: str
    ordinal: int
    node: str

    def patch(self) -> dict:
        # Strategic merge: the `$patch: delete` removes our gate only, whatever other gates
        # other controllers have added or removed meanwhile.
        return {"spec": {"nodeSelector": {HOSTNAME_LABEL: self.node},
                         "schedulingGates": [{"name": PLACEMENT_GATE, "$patch": "delete"}]}}


@dataclass(frozen=True)
class DeletePod:
    """A pod on (or pinned to) another node than decided; its StatefulSet recreates it gated."""

    namespace: str
    name: str
    uid: str
    role: str
    ordinal: int
    node: str
    was: str | None


Action = PatchStatefulSet | PinPod | DeletePod


def plan_statefulset(job: JobRecord, role: str, current: StsRecord, counts: Mapping[str, int],
                     settings: PodSettings, pool: PodPool | None = None) -> PatchStatefulSet | None:
    """Replicas of `role` := counts[role], with the template re-rendered for `counts` and
    `pool` (a changed pool is a changed template: the checkpoint-restart of a scaling)."""
    replicas = counts.get(role, 0)
    template = None
    digest = current.template_hash
    if replicas > 0:  # a role scaled to zero keeps its template: no pods, nothing to roll
        wanted = template_hash(job, role, counts, settings, pool)
        if wanted != current.template_hash:
            template, digest = pod_template(job, role, counts, settings, pool), wanted
    if replicas == current.replicas and template is None:
        return None
    return PatchStatefulSet(job.namespace, current.name, replicas, template, digest,
                            uid=current.uid or None, pool=pool if template is not None else None)


def plan_pods(namespace: str, pods: Iterable[PodRecord],
              nodes: Mapping[str, Sequence[str]]) -> list[PinPod | DeletePod]:
    """Pin gated pods to their decided node; delete pods that sit elsewhere.

    Pods beyond the decided count are left alone: the StatefulSet's scale-down removes them.
    """
    actions: list[PinPod | DeletePod] = []
    for pod in pods:
        decided = nodes.get(pod.role, ())
        if pod.deleting or pod.ordinal >= len(decided):
            continue
        node = decided[pod.ordinal]
        if pod.gated and pod.pinned in (None, node):
            actions.append(PinPod(namespace, pod.name, pod.uid, pod.role, pod.ordinal, node))
        elif pod.node != node:
            # Also a gated pod pinned elsewhere: a gated pod's nodeSelector may only be added
            # to, never changed, so it has to be recreated.
            actions.append(DeletePod(namespace, pod.name, pod.uid, pod.role, pod.ordinal, node,
                                     pod.node))
    return actions

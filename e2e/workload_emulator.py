"""Plays the training code of every Running MLJob, so jobs make progress on kwok nodes.

kwok pods run nothing. The emulator stands in for the training processes: for each
MLJob whose phase is Running it looks at the job's pods that really run (Running,
Ready, bound to a node), advances the job's epochs at the speed the simulator would
give it, and reports them the way training code does.

- Speed: `speed_models.epochs_per_s` for the job's model, architecture and the PS and
  worker counts it actually has (all-reduce rings also by how many nodes the workers
  span), times `interference.job_speed_factors` for the nodes all emulated jobs' pods
  are on. That is the simulator's model (sim/simulator.py `advance`), so what a policy
  learned in the simulator meets the same world here.
- Scaling cost: when a job's set of pods changes (a round scaled or moved it and the
  StatefulSet rolled its pods), it trains nothing for `restart_cost_s` simulated
  seconds, the checkpoint-restart the simulator charges.
- Time: one real second is `time_scale` simulated seconds. Tests use
  1 / (the operator's --interval-scale), so one scheduling round is one simulated
  interval, as in the simulator.
- Reporting: `mlsched.progress.Reporter`, the client training code uses, with the
  URL from the pod's own environment and a token file holding a ServiceAccount token
  bound to that pod (pod_tokens.py), POSTed to the operator's /v1/progress.

The emulator keeps counting while the operator is down (training does not stop when
its scheduler restarts) and reports the cumulative total once it is back.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client

from mlsched import progress
from mlsched.workloads import catalog, interference
from mlsched.workloads.speed_curve import prior_curve
from mlsched.workloads.speed_models import epochs_per_s, get_speed_model
from pod_tokens import TokenFiles

log = logging.getLogger("e2e.emulator")
GROUP, VERSION = "mlsched.io", "v1alpha1"
JOB_LABEL = "mlsched.io/job-name"
ROLE_LABEL = "mlsched.io/role"


@dataclass
class JobState:
    """What the emulator remembers of one job between ticks."""

    epochs_done: float
    pod_uids: frozenset[str] = frozenset()
    restart_left_s: float = 0.0  # simulated seconds of checkpoint-restart still to pay
    reported: float = -1.0


@dataclass
class Training:
    """One Running job's training pods in this tick."""

    namespace: str
    name: str
    uid: str
    model: str
    arch: str  # 'ps' or 'allreduce', as in cluster/
    epochs: float
    ps_nodes: list[str]
    worker_nodes: list[str]
    pods: list[client.V1Pod] = field(default_factory=list)
    declared_epochs_per_hour: float | None = None  # spec.speedPrior, for models outside the catalog


def _model(label: str | None) -> str:
    if label and catalog.is_known(label):
        return catalog.canonical_name(label)
    return label or "unknown"


def _is_training(pod: client.V1Pod) -> bool:
    if pod.metadata.deletion_timestamp or not pod.spec.node_name:
        return False
    if (pod.status.phase or "") != "Running":
        return False
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or ())


def _reporter_pod(pods: list[client.V1Pod]) -> client.V1Pod:
    # Training code reports from one process, worker 0 by convention (docs/operator.md).
    def rank(pod: client.V1Pod) -> tuple[int, str]:
        role = pod.metadata.labels.get(ROLE_LABEL, "")
        return (0 if role == "worker" else 1, pod.metadata.name)
    return min(pods, key=rank)


def _pod_env(pod: client.V1Pod, name: str) -> str | None:
    for container in pod.spec.containers:
        for env in container.env or ():
            if env.name == name and env.value is not None:
                return env.value
    return None


class WorkloadEmulator:
    def __init__(self, api_client: client.ApiClient, namespaces: list[str], token_dir: Path, *,
                 time_scale: float, tick_s: float = 0.5, restart_cost_s: float = 30.0,
                 speed_model: str = "measured", with_interference: bool = True):
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.namespaces = namespaces
        self.tokens = TokenFiles(self.core, token_dir)
        self.time_scale = time_scale
        self.tick_s = tick_s
        self.restart_cost_s = restart_cost_s
        self.speed = get_speed_model(speed_model)
        self.with_interference = with_interference
        self.jobs: dict[str, JobState] = {}  # MLJob uid -> state
        # accepted / unreachable / refused, pod gone / refused (a live pod: a bug)
        self.reports: Counter[str] = Counter()
        self.refusals: list[str] = []  # why live pods were refused
        self.last_error = ""
        self.speeds: dict[str, float] = {}  # job name -> epochs per simulated second, last tick
        self._last_tick: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ thread

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="workload-emulator", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as err:  # noqa: BLE001 - e.g. the apiserver restarting
                self.last_error = f"{type(err).__name__}: {err}"
                log.debug("emulator tick failed: %s", err)
            self._stop.wait(self.tick_s)

    # ------------------------------------------------------------------ one tick

    def tick(self, now: float | None = None) -> None:
        """Advance every Running job by the real time since the previous tick."""
        with self._lock:
            now = time.monotonic() if now is None else now
            elapsed = 0.0 if self._last_tick is None else now - self._last_tick
            self._last_tick = now
            training = [t for ns in self.namespaces for t in self._observe(ns)]
            factors = self._interference(training)
            live = set()
            for job in training:
                live.update(p.metadata.uid for p in job.pods)
                self._advance(job, elapsed * self.time_scale, factors.get(job.uid, 1.0))
            self.tokens.forget_except(live)

    def _observe(self, namespace: str) -> list[Training]:
        jobs = self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "mljobs")
        pods = self.core.list_namespaced_pod(namespace, label_selector=JOB_LABEL).items
        by_job: dict[str, list[client.V1Pod]] = {}
        for pod in pods:
            if _is_training(pod):
                by_job.setdefault(pod.metadata.labels[JOB_LABEL], []).append(pod)
        out = []
        for body in jobs["items"]:
            meta, spec, status = body["metadata"], body["spec"], body.get("status") or {}
            if status.get("phase") != "Running":
                continue
            job_pods = by_job.get(meta["name"], [])
            role_nodes = {"ps": [], "worker": []}
            for pod in job_pods:
                role_nodes.setdefault(pod.metadata.labels.get(ROLE_LABEL, ""), []).append(
                    pod.spec.node_name)
            out.append(Training(
                namespace=namespace, name=meta["name"], uid=meta["uid"],
                model=_model(spec.get("modelType")),
                declared_epochs_per_hour=(spec.get("speedPrior") or {}).get("referenceEpochsPerHour"),
                arch="ps" if spec["architecture"] == "ParameterServer" else "allreduce",
                epochs=float(spec["epochs"]), ps_nodes=role_nodes["ps"],
                worker_nodes=role_nodes["worker"], pods=job_pods))
            if meta["uid"] not in self.jobs:
                # Resume from what the operator already recorded (an emulator started late).
                done = float((status.get("progress") or {}).get("epochsDone") or 0.0)
                self.jobs[meta["uid"]] = JobState(epochs_done=done)
        return out

    def _interference(self, training: list[Training]) -> dict[str, float]:
        if not self.with_interference:
            return {}
        node_ids: dict[str, int] = {}
        placements = {}
        for job in training:
            nodes = [node_ids.setdefault(n, len(node_ids)) for n in job.ps_nodes + job.worker_nodes]
            if job.worker_nodes and catalog.is_known(job.model):  # no profile for other models
                placements[job.uid] = (job.model, nodes)
        return interference.job_speed_factors(placements)

    def _advance(self, job: Training, simulated_s: float, factor: float) -> None:
        state = self.jobs[job.uid]
        uids = frozenset(p.metadata.uid for p in job.pods)
        if uids != state.pod_uids:
            # New pods: the job restarts from its checkpoint with the new cluster spec.
            if state.pod_uids:
                state.restart_left_s = self.restart_cost_s
            state.pod_uids = uids
        if catalog.is_known(job.model):
            rate = epochs_per_s(self.speed, job.model, job.arch, len(job.ps_nodes),
                                len(job.worker_nodes), len(set(job.worker_nodes))) * factor
        else:  # a model the catalog does not know trains as its declared (or the generic) curve says
            curve = prior_curve(job.model, job.arch, job.declared_epochs_per_hour)
            rate = curve.epochs_per_s(len(job.ps_nodes), len(job.worker_nodes)) * factor
        self.speeds[job.name] = rate
        paying = min(state.restart_left_s, simulated_s)
        state.restart_left_s -= paying
        state.epochs_done = min(job.epochs, state.epochs_done + rate * (simulated_s - paying))
        if job.pods and state.epochs_done > state.reported:
            self._report(job, state)

    def _report(self, job: Training, state: JobState) -> None:
        pod = _reporter_pod(job.pods)
        url = _pod_env(pod, "MLSCHED_PROGRESS_URL")
        if not url:
            self.reports["unreachable"] += 1
            self.last_error = f"pod {pod.metadata.name} has no MLSCHED_PROGRESS_URL"
            return
        # As the pod's own Reporter.from_env would: with the CA the operator put into the pod
        # when it serves HTTPS (--tls-secret).
        reporter = progress.Reporter(url=url, namespace=job.namespace, job=job.name,
                                     token_file=str(self.tokens.path_for(pod)),
                                     ca_pem=_pod_env(pod, "MLSCHED_PROGRESS_CA"))
        try:
            reporter.report(state.epochs_done, strict=True)
        except progress.ProgressError as err:
            self.last_error = str(err)
            if not isinstance(err.__cause__, urllib.error.HTTPError):
                self.reports["unreachable"] += 1  # the operator is down or restarting
            elif not self._still_running(pod):
                # Replaced or scaled away since this tick listed it: its token is void now,
                # and refusing it is right.
                self.reports["refused, pod gone"] += 1
            else:
                # A live pod of the job refused: what a legitimate pod must never get.
                self.reports["refused"] += 1
                self.refusals.append(f"{job.name} by {pod.metadata.name}: {err}")
            return
        self.reports["accepted"] += 1
        state.reported = state.epochs_done

    def _still_running(self, pod: client.V1Pod) -> bool:
        try:
            now = self.core.read_namespaced_pod(pod.metadata.name, pod.metadata.namespace)
        except client.exceptions.ApiException as err:
            if err.status == 404:
                return False
            raise
        return now.metadata.uid == pod.metadata.uid and not now.metadata.deletion_timestamp

    # ------------------------------------------------------------------ reading

    def epochs_of(self, uid: str) -> float:
        state = self.jobs.get(uid)
        return state.epochs_done if state else 0.0

"""The operator and the samples on a real node: containers really start (e2e/real_node.py).

The images are built from this checkout (e2e/build_images.sh) and imported into the node's
containerd; the operator is installed with `kubectl apply --server-side -k` of the dev overlay
(two replicas of the built image), and the samples (manifests/samples) are applied as a user
applies them, with a kustomize overlay of the test's own for what a two-core node needs: the
local training image, small CPU requests and no GPU, a few epochs, fixed counts. The training
pods find each other through their headless Service's DNS names (CoreDNS) and report to the
operator's progress endpoint through its Service (kube-proxy).
"""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest
import yaml
from kubernetes import client

import real_node
from mlsched_objects import REPO, MLSched, condition, load_yaml
from real_cluster import (
    JOBS_NAMESPACE, OPERATOR_NAMESPACE, TRAINING_IMAGE, RealCluster, checkpoint_volume,
    claim_with_volume, install_operator, lease_holder, running_real_cluster, wait_operator_ready,
)
from training_logs import (
    EPOCH_DONE, START, check_every_step_trained_once, check_resumed_where_stopped,
    logged,
)
from waiting import wait_for

SAMPLES = REPO / "manifests" / "samples"
EPOCHS = 8
# 2 ms of compute per sample a worker trains (EXAMPLE_SAMPLE_COST_S), so that the jobs run for
# some of their progress reports: a 128-sample step is 256 ms for one worker.
SAMPLE_COST_S = 0.002


@pytest.fixture(scope="module")
def real_cluster(request: pytest.FixtureRequest):
    with running_real_cluster(request) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def installed(real_cluster: RealCluster) -> RealCluster:
    install_operator(real_cluster)
    wait_operator_ready(real_cluster, 240)
    return real_cluster


def test_the_operator_from_its_image_runs_one_leader_and_hands_over(installed: RealCluster):
    cluster = installed
    leader, pods = wait_operator_ready(cluster, 60)
    (standby,) = set(pods) - {leader}
    # What a user sees: the Deployment 2/2 from the built image, on the real node.
    shown = cluster.kubectl("get", "deployment", "mlsched-operator", "-n", OPERATOR_NAMESPACE,
                            "-o", "jsonpath={.status.readyReplicas} {.spec.template.spec."
                            "containers[0].image}").stdout
    assert shown == "2 localhost/mlsched-operator:e2e"
    nodes = cluster.kubectl("get", "pods", "-n", OPERATOR_NAMESPACE, "-o",
                            "jsonpath={.items[*].spec.nodeName}").stdout.split()
    assert set(nodes) == {real_node.NAME}

    cluster.kubectl("delete", "pod", leader, "-n", OPERATOR_NAMESPACE, "--wait=false")
    api = cluster.api_client()
    try:
        wait_for(lambda: lease_holder(api) == standby, 60,
                 f"the standby {standby} holding the Lease after {leader} was deleted",
                 describe=lambda: lease_holder(api))
    finally:
        api.close()
    new_leader, pods = wait_operator_ready(cluster, 180)
    assert new_leader == standby and leader not in pods


# ------------------------------------------------------------------------- training


def samples_overlay(cluster: RealCluster, counts: dict[str, dict[str, int]]) -> Path:
    """manifests/samples under what a two-core node with no GPU needs, as JSON patches."""
    overlay = cluster.workdir / "samples-overlay"
    overlay.mkdir(parents=True, exist_ok=True)
    patches = []
    for job_file in sorted(SAMPLES.glob("mljob-*.yaml")):
        (job,) = load_yaml(job_file)
        name = job["metadata"]["name"]
        ops = [{"op": "replace", "path": "/spec/epochs", "value": EPOCHS}]
        for role, spec in job["spec"]["replicaSpecs"].items():
            n = counts[name][role]
            ops += [{"op": "replace", "path": f"/spec/replicaSpecs/{role}/min", "value": n},
                    {"op": "replace", "path": f"/spec/replicaSpecs/{role}/max", "value": n}]
            container = f"/spec/replicaSpecs/{role}/template/spec/containers/0"
            ops += [
                {"op": "add", "path": f"{container}/imagePullPolicy", "value": "Never"},
                {"op": "replace", "path": f"{container}/resources",
                 "value": {"requests": {"cpu": "100m", "memory": "256Mi"},
                           "limits": {"memory": "2Gi"}}},
                {"op": "add", "path": f"{container}/args",
                 "value": ["--report-interval", "2"]},
                {"op": "add", "path": f"{container}/env",
                 "value": [{"name": "OMP_NUM_THREADS", "value": "1"},
                           {"name": "EXAMPLE_SAMPLE_COST_S", "value": str(SAMPLE_COST_S)}]},
            ]
        patches.append({"target": {"kind": "MLJob", "name": name}, "patch": yaml.safe_dump(ops)})
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(SAMPLES, overlay)],
        "images": [{"name": "mlsched-training", "newName": TRAINING_IMAGE.split(":")[0],
                    "newTag": TRAINING_IMAGE.split(":")[1]}],
        "patches": patches,
    }))
    return overlay


class PodLogs:
    """`kubectl logs -f` of every pod of a job once its container runs, as a user would
    follow them, each run of each container into a file of its own (a restarted container is
    followed again); the pods may be gone by the time the job ends."""

    def __init__(self, cluster: RealCluster, job: str):
        self.cluster, self.job = cluster, job
        self.directory = cluster.workdir / "followed-logs" / job
        self.directory.mkdir(parents=True, exist_ok=True)
        self.followers: dict[str, subprocess.Popen] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PodLogs:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)
        for process in self.followers.values():
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()

    def _run(self) -> None:
        api = self.cluster.api_client()
        core = client.CoreV1Api(api)
        try:
            while not self._stop.wait(0.5):
                for pod in core.list_namespaced_pod(
                        JOBS_NAMESPACE, label_selector=f"mlsched.io/job-name={self.job}").items:
                    for status in pod.status.container_statuses or []:
                        run = f"{pod.metadata.name}-{pod.metadata.uid[:8]}r{status.restart_count}"
                        if status.state.running and run not in self.followers:
                            self._follow(pod, run)
        finally:
            api.close()

    def _follow(self, pod: client.V1Pod, run: str) -> None:
        out = open(self.directory / f"{run}.log", "w")
        self.followers[run] = subprocess.Popen(
            [str(self.cluster.plane.bin_dir / "kubectl"), "--kubeconfig",
             str(self.cluster.plane.kubeconfig_path), "logs", "-f", "-n", JOBS_NAMESPACE,
             pod.metadata.name], stdout=out, stderr=subprocess.STDOUT)
        out.close()

    def text(self, role: str) -> dict[str, str]:
        return {path.name: path.read_text() for path in sorted(self.directory.glob("*.log"))
                if f"-{role}-" in path.name}


def test_the_samples_train_for_real(installed: RealCluster):
    """The all-reduce sample (2 workers, DistributedDataParallel over gloo) and the
    parameter-server sample (1 PS, 2 workers, under the samples' `dl2` policy) train to
    Succeeded: the loss falls in `kubectl logs`, the status shows the measured samples/s."""
    cluster = installed
    counts = {"resnext110-allreduce": {"worker": 2},
              "resnet50-ps": {"ps": 1, "worker": 2}}
    volumes = [checkpoint_volume(cluster, path) for path in sorted(SAMPLES.glob("pvc-*.yaml"))]
    overlay = samples_overlay(cluster, counts)
    api = cluster.api_client()
    jobs = MLSched(api, JOBS_NAMESPACE)
    speeds: dict[str, float] = {}

    def finished():
        done = True
        for name in counts:
            current = status(jobs, name)
            speed = (current.get("progress") or {}).get("samplesPerSecond") or 0
            speeds[name] = max(speeds.get(name, 0), speed)
            if current.get("phase") == "Failed":
                raise AssertionError(f"{name} failed: {current.get('conditions')}")
            done = done and current.get("phase") == "Succeeded"
        return done

    followers = [PodLogs(cluster, name) for name in counts]
    try:
        for follower in followers:
            follower.__enter__()
        cluster.kubectl("apply", "-n", JOBS_NAMESPACE, "-k", str(overlay))
        wait_for(finished, 600, "both samples Succeeded",
                 describe=lambda: {n: status(jobs, n).get("phase") for n in counts}
                 | {"pods": cluster.kubectl("get", "pods", "-n", JOBS_NAMESPACE, "-o", "wide",
                                            check=False).stdout})
    finally:
        for follower in followers:
            follower.__exit__(None, None, None)

    for follower in followers:
        # Each worker's first run (r0). A worker that exited 0 may be restarted by the kubelet
        # before the operator scales the finished job down (StatefulSet pods restart whatever
        # the exit code); that run finds the last checkpoint and exits at once.
        logs = {pod: text for pod, text in follower.text("worker").items()
                if pod.endswith("r0.log")}
        assert len(logs) == counts[follower.job]["worker"], logs.keys()
        # Every worker trained to the end; the chief (worker 0) logs each epoch's loss.
        for pod, text in logs.items():
            assert f"all {EPOCHS} epochs trained" in text, f"{pod}:\n{text}"
        chief = next(text for pod, text in logs.items() if "-worker-0-" in pod)
        losses = [float(m.group(2)) for m in EPOCH_DONE.finditer(chief)]
        assert len(losses) == EPOCHS, f"{len(losses)} epochs in worker 0's log:\n{chief}"
        assert losses[-1] < 0.5 * losses[0], f"the loss did not fall: {losses}"
        # The operator saw the speed the pods measured and reported through its Service.
        assert speeds[follower.job] > 0, speeds
    shown = cluster.kubectl("get", "mljobs", "-n", JOBS_NAMESPACE).stdout
    assert shown.count("Succeeded") == 2, shown
    api.close()
    for name in volumes:
        cluster.kubectl("delete", "pv", name, "--wait=false")


# ------------------------------------------------------------------------- rescale, faults

GLOBAL_BATCH = 64
RESCALE_EPOCHS = 16
RESCALE_COST_S = 0.004  # 256 ms a step with 1 worker (5.9 s an epoch), 128 ms with 2


class FollowedPod:
    """One pod's followed log, as training_logs' checks read a process's."""

    def __init__(self, path: Path):
        self.path, self.name = path, path.stem.rsplit("-", 1)[0]

    def log(self, tail: int | None = None) -> str:
        text = self.path.read_text()
        return "\n".join(text.splitlines()[-tail:]) if tail else text


class Generations(PodLogs):
    """PodLogs grouped by the stage the test was in when each pod's container started: the
    pods a rescale or a restart brought, in order."""

    def __init__(self, cluster: RealCluster, job: str):
        super().__init__(cluster, job)
        self.stage = 0
        self.stages: dict[str, int] = {}

    def _follow(self, pod: client.V1Pod, run: str) -> None:
        super()._follow(pod, run)
        self.stages[run] = self.stage

    def runs(self) -> list[list[FollowedPod]]:
        """The processes of each stage that started training, without those the kubelet
        restarted after the job was trained (a container that exited 0 is restarted until the
        job's pods go: it finds the final checkpoint, trains nothing and exits again, or dies
        in DDP's start-up when its peer has already exited: seen on 30 Nov, where those runs
        made the 2-worker stage count four). A run still starting shows once it has started."""
        out: dict[int, list[FollowedPod]] = {}
        for path in sorted(self.directory.glob("*.log")):
            pod = FollowedPod(path)
            text = pod.log()
            if "trained epoch=" not in text and ("epochs trained" in text or not START.search(text)):
                continue
            out.setdefault(self.stages[path.stem], []).append(pod)
        return [out[k] for k in sorted(out)]


def training_job(name: str, counts: dict[str, int], claim: str, *, policy: str,
                 epochs: int = RESCALE_EPOCHS, **extra_spec) -> dict:
    def template(role: str) -> dict:
        return {"spec": {
            "securityContext": {"fsGroup": 10001},
            "volumes": [{"name": "checkpoint", "persistentVolumeClaim": {"claimName": claim}}],
            "containers": [{
                "name": role, "image": TRAINING_IMAGE, "imagePullPolicy": "Never",
                "command": ["python", "/opt/mlsched/examples/pytorch/allreduce.py"],
                "args": ["--global-batch-size", str(GLOBAL_BATCH), "--report-interval", "2"],
                "env": [{"name": "OMP_NUM_THREADS", "value": "1"},
                        {"name": "EXAMPLE_TRACE_STEPS", "value": "1"},
                        {"name": "EXAMPLE_SAMPLE_COST_S", "value": str(RESCALE_COST_S)}],
                "volumeMounts": [{"name": "checkpoint", "mountPath": "/checkpoint"}],
                "resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                              "limits": {"memory": "2Gi"}}}]}}

    return {"apiVersion": "mlsched.io/v1alpha1", "kind": "MLJob", "metadata": {"name": name},
            "spec": {"modelType": "mlp-digits", "architecture": "AllReduce", "epochs": epochs,
                     "globalBatchSize": GLOBAL_BATCH, "schedulingPolicy": policy,
                     "replicaSpecs": {role: {"min": n, "max": n, "template": template(role)}
                                      for role, n in counts.items()}, **extra_spec}}


def status(jobs: MLSched, name: str) -> dict:
    return (jobs.job(name) or {}).get("status") or {}


def history_at(jobs: MLSched, name: str, workers: int) -> list[dict]:
    """The job's interval records at this worker count that carry a measured speed."""
    return [h for h in status(jobs, name).get("history") or []
            if h["workers"] == workers and (h.get("samplesPerSecond") or 0) > 0]


@pytest.fixture
def jobs(installed: RealCluster):
    api = installed.api_client()
    yield MLSched(api, JOBS_NAMESPACE)
    api.close()


def short_policy(jobs: MLSched, name: str) -> str:
    """A SchedulingPolicy deciding every 6 s (the shipped ones every 20 min), so that each count
    gets interval records within seconds."""
    jobs.create({"apiVersion": "mlsched.io/v1alpha1", "kind": "SchedulingPolicy",
                 "metadata": {"name": name},
                 "spec": {"allocation": "drf", "placement": "load-balance", "interval": 6}})
    return name


def holder_job(name: str, policy: str) -> dict:
    """Another tenant's one-pod job, which only holds its pod (a `sleep`): what makes DRF give
    the rescaled job less or more."""
    pod = {"terminationGracePeriodSeconds": 1, "containers": [{
        "name": "worker", "image": TRAINING_IMAGE, "imagePullPolicy": "Never",
        "command": ["sleep", "infinity"],
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}
    return {"apiVersion": "mlsched.io/v1alpha1", "kind": "MLJob", "metadata": {"name": name},
            "spec": {"modelType": "mlp-digits", "architecture": "AllReduce", "epochs": 1,
                     "globalBatchSize": GLOBAL_BATCH, "schedulingPolicy": policy,
                     "replicaSpecs": {"worker": {"min": 1, "max": 1,
                                                 "template": {"spec": pod}}}}}


def pods_quota(cluster: RealCluster, pods: int) -> str:
    """A ResourceQuota of `pods` pods in the jobs' namespace (a tenant's quota, as platform
    teams give each namespace): the capacity the policy shares out."""
    path = cluster.workdir / "quota.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "ResourceQuota",
                                    "metadata": {"name": "tenant-pods"},
                                    "spec": {"hard": {"pods": str(pods)}}}))
    cluster.kubectl("apply", "-n", JOBS_NAMESPACE, "-f", str(path))
    return "tenant-pods"


def test_a_live_rescale_restarts_the_pods_and_resumes_from_the_checkpoint(installed, jobs):
    """1 -> 2 -> 1 workers while training, each decided by the SchedulingPolicy (DRF) as another
    tenant's job leaves and comes, under a namespace quota of two pods: no edit of the job.
    The StatefulSet's pods stop with SIGTERM at a step they agree on, checkpoint into the claim,
    and the new pods (the new topology in their environment) resume there; every step of
    every epoch trained exactly once; the interval records carry the speed at each count."""
    cluster = installed
    claim, volume = claim_with_volume(cluster, "rescale-checkpoints")
    policy = short_policy(jobs, "live")
    quota = pods_quota(cluster, 2)
    stages = [{"worker": 1}, {"worker": 2}, {"worker": 1}]

    # What changes the policy's answer at each stage: the other tenant's job goes, then a new
    # one comes. DRF shares the quota's two pods: one each while both want one.
    def make_room():
        cluster.kubectl("delete", "mljob", "-n", JOBS_NAMESPACE, "holder", "--wait=false")

    def take_room():
        jobs.create(holder_job("holder-2", policy))

    try:
        jobs.create(holder_job("holder", policy))
        wait_for(lambda: (status(jobs, "holder").get("phase") == "Running"), 120,
                 "the other tenant's job to run", describe=lambda: status(jobs, "holder"))
        job = training_job("rescaled", {"worker": 1}, claim, policy=policy)
        job["spec"]["replicaSpecs"]["worker"]["max"] = 2
        jobs.create(job)
        with Generations(cluster, "rescaled") as logs:
            for number, counts in enumerate(stages):
                if number:
                    logs.stage = number
                    (make_room, take_room)[number - 1]()
                # Every pod of the stage running, and the chief (worker 0: it logs the start).
                wait_for(lambda: len(logs.runs()) > number and
                         len(logs.runs()[number]) == counts["worker"] and
                         logged(logs.runs()[number], START), 180,
                         f"the pods of {counts} to start training",
                         # Each run named pod-uid-r<restarts>: which pod, and which restart of
                         # it, a run beyond the stage's count was (a flake seen twice on 30 Nov).
                         describe=lambda: ([[(p.path.stem, p.log(tail=3)) for p in run]
                                            for run in logs.runs()],
                                           status(jobs, "rescaled").get("conditions")))
                if number < len(stages) - 1:
                    wait_for(lambda: history_at(jobs, "rescaled", counts["worker"]), 120,
                             f"an interval record at {counts} with its measured speed",
                             describe=lambda: status(jobs, "rescaled").get("history"))
            wait_for(lambda: status(jobs, "rescaled").get("phase") == "Succeeded", 240,
                     "the rescaled job to succeed",
                     describe=lambda: (status(jobs, "rescaled").get("progress"),
                                       [[p.log(tail=2) for p in run] for run in logs.runs()]))
    finally:
        cluster.kubectl("delete", "mljob", "-n", JOBS_NAMESPACE, "holder", "holder-2",
                        "--ignore-not-found", "--wait=false", check=False)
        cluster.kubectl("delete", "resourcequota", "-n", JOBS_NAMESPACE, quota,
                        "--ignore-not-found", check=False)
    runs = logs.runs()
    assert [sorted(p.name for p in run) for run in runs] == [
        [f"rescaled-worker-{k}" for k in range(c["worker"])] for c in stages]
    check_every_step_trained_once(runs, RESCALE_EPOCHS, GLOBAL_BATCH)
    stops = check_resumed_where_stopped(runs, GLOBAL_BATCH, mid_epoch=False)
    first, last = logged(runs[0], START)[0], logged(runs[-1], EPOCH_DONE)
    assert int(last[-1][0]) == RESCALE_EPOCHS
    assert float(last[-1][1]) < 0.5 * float(first[2]), (first, last[-1])
    final = status(jobs, "rescaled")
    assert final["progress"]["epochsDone"] == RESCALE_EPOCHS
    assert final["rescales"]["count"] == 2
    assert jobs.job("rescaled")["metadata"]["generation"] == 1  # the policy rescaled it, not an edit
    speeds = {}
    for counts in stages[:2]:
        speeds[counts["worker"]] = max(h["samplesPerSecond"]
                                       for h in history_at(jobs, "rescaled", counts["worker"]))
    # Two workers share the stand-in compute: the records show the real speed-up.
    assert speeds[2] > speeds[1], speeds
    print(f"\nreal node 1 -> 2 -> 1 workers: stopped at {stops}; samples/s recorded {speeds}; "
          f"loss {first[2]} -> {last[-1][1]}")
    cluster.kubectl("delete", "pv", volume, "--wait=false")


def test_a_deleted_worker_resumes_from_its_checkpoint(installed, jobs):
    """`kubectl delete pod` of a worker mid-epoch: it stops at a step both workers agree on and
    checkpoints; the StatefulSet brings the pod back, the other worker's container restarts,
    and the job goes on from that step to Succeeded without a step lost or trained twice."""
    cluster = installed
    claim, volume = claim_with_volume(cluster, "deleted-checkpoints")
    policy = short_policy(jobs, "steady")
    jobs.create(training_job("deleted", {"worker": 2}, claim, policy=policy, epochs=8))
    with Generations(cluster, "deleted") as logs:
        wait_for(lambda: len(logged(logs.runs()[0] if logs.runs() else [], EPOCH_DONE)) >= 2,
                 180, "two epochs trained",
                 describe=lambda: [[p.log(tail=3) for p in run] for run in logs.runs()])
        logs.stage = 1
        cluster.kubectl("delete", "pod", "deleted-worker-1", "-n", JOBS_NAMESPACE)
        wait_for(lambda: status(jobs, "deleted").get("phase") == "Succeeded", 240,
                 "the job to succeed after its worker was deleted",
                 describe=lambda: (status(jobs, "deleted").get("progress"),
                                   [[p.log(tail=2) for p in run] for run in logs.runs()]))
    runs = logs.runs()
    # The deleted pod's successor, a new pod of the same name, joined the surviving pod, whose
    # container exited 0 after the agreed stop and was restarted by the kubelet.
    assert [sorted(p.name for p in run) for run in runs] == [
        ["deleted-worker-0", "deleted-worker-1"]] * 2, [[p.path.name for p in r] for r in runs]
    stops = check_resumed_where_stopped(runs, GLOBAL_BATCH, mid_epoch=False)
    check_every_step_trained_once(runs, 8, GLOBAL_BATCH)
    assert stops[0] >= (2, 0), stops
    print(f"\nreal node, worker deleted: both stopped at {stops[0]} and resumed there")
    cluster.kubectl("delete", "pv", volume, "--wait=false")


def test_an_image_that_does_not_exist_is_reported(installed, jobs):
    """The kubelet cannot pull it (the registry `localhost` does not answer): the job's
    Running condition says PodsCannotStart with the pull error, and a Warning Event says so."""
    policy = short_policy(jobs, "typo")
    job = training_job("typo", {"worker": 1}, "unused", policy=policy)
    pod = job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]
    pod["volumes"] = [{"name": "checkpoint", "emptyDir": {}}]
    pod["containers"][0].update(image="localhost/mlsched-no-such-image:e2e",
                                imagePullPolicy="IfNotPresent")
    jobs.create(job)
    reason = wait_for(lambda: (c := (condition(jobs.job("typo"), "Running") or {})).get("reason") ==
                      "PodsCannotStart" and c, 120, "the job to say its pod cannot start",
                      describe=lambda: (condition(jobs.job("typo"), "Running") or {}))
    assert "typo-worker-0" in reason["message"]
    assert "ErrImagePull" in reason["message"] or "ImagePullBackOff" in reason["message"], reason
    assert "localhost/mlsched-no-such-image:e2e" in reason["message"], reason
    warnings = [e for e in jobs.events("typo", "MLJob") if e.type == "Warning"]
    assert any(e.reason == "PodsCannotStart" for e in warnings), [e.reason for e in warnings]
    shown = cluster_describe(installed, "typo")
    assert "PodsCannotStart" in shown


def test_a_program_that_crashes_fails_the_job_naming_its_exit_code(installed, jobs):
    """A container that exits 3 each time it starts: the kubelet restarts it, each restart
    counts toward backoffLimit, and the job fails naming the container and its exit code."""
    policy = short_policy(jobs, "crash")
    job = training_job("crasher", {"worker": 1}, "unused", policy=policy,
                       runPolicy={"backoffLimit": 1})
    pod = job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]
    pod["volumes"] = [{"name": "checkpoint", "emptyDir": {}}]
    pod["containers"][0].update(command=["python", "-c", "raise SystemExit(3)"], args=[])
    jobs.create(job)
    wait_for(lambda: status(jobs, "crasher").get("phase") == "Failed", 180, "the job to fail",
             describe=lambda: status(jobs, "crasher"))
    failed = condition(jobs.job("crasher"), "Failed")
    assert failed["reason"] == "BackoffLimitExceeded", failed
    assert "pod crasher-worker-0: container worker exited with code 3 (Error)" in \
        failed["message"], failed
    warnings = [e for e in jobs.events("crasher", "MLJob") if e.type == "Warning"]
    assert any(e.reason == "BackoffLimitExceeded" and "exited with code 3" in e.message
               for e in warnings), [(e.reason, e.message) for e in warnings]


def cluster_describe(cluster: RealCluster, job: str) -> str:
    return cluster.kubectl("describe", "mljob", job, "-n", JOBS_NAMESPACE).stdout

"""The reference programs (examples/pytorch) as real processes, in pods as pod_runner makes
them, with the environment the operator renders: they train, stop on SIGTERM at a step all
processes agree on, and resume at another worker (and PS) count without losing or repeating
a sample. No control plane: the pods' env comes from desired.statefulset_manifest, resolved
per ordinal as the kubelet does.

Each program logs, with EXAMPLE_TRACE_STEPS=1, one line per trained step and worker with the
rows of the epoch's permutation it trained; these lines are what the tests count.
EXAMPLE_SAMPLE_COST_S pads each step to 2 ms per sample the process trained (this MLP's steps
take about a millisecond; 128 ms a step with 1 worker, 43 ms with 3) so a SIGTERM sent after
step 5 of an epoch lands well before its last step (23).
"""

from __future__ import annotations

import importlib
import json
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from mlsched import training
from mlsched.controller.objects.desired import PodSettings, statefulset_manifest
from mlsched.controller.objects.job_records import job_record
from pod_runner import (
    PodProcess, PodRunner, addresses, expand, hosts_file, pod_argv, pod_env, statefulset_pods,
    terminate_all,
)
from training_logs import (
    EPOCH_DONE, SAVED, START, TRACE, check_every_step_trained_once, check_resumed_where_stopped,
    logged, steps_per_epoch,
)
from waiting import wait_for

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "pytorch"
NS = "team-a"
CHECKPOINT_MOUNT = "/mnt/mlsched-checkpoint"
GLOBAL_BATCH = 64
STEPS_PER_EPOCH = steps_per_epoch(GLOBAL_BATCH)  # 23
EPOCHS = 4
RUN_TIMEOUT_S = 90

@pytest.fixture
def examples_installed():
    # Never a skip: a missing dependency fails and says what to install.
    for module in ("torch", "sklearn"):
        try:
            importlib.import_module(module)
        except ImportError as err:
            pytest.fail(f"{err}: the reference programs need pip install -e '.[examples]' "
                        "(torch and scikit-learn; `make dev` installs both)")


@pytest.fixture
def progress_endpoint():
    """Records what the programs report (the operator's endpoint is another test's)."""
    received: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append({**json.loads(body), "token": self.headers.get("Authorization")})
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/v1/progress", received
    server.shutdown()
    server.server_close()


def mljob(name: str, architecture: str, program: str, *, epochs: float = EPOCHS,
          sample_cost_s: float = 0.002, launcher: tuple[str, ...] = ()) -> dict:
    def template(role: str) -> dict:
        env = [{"name": "OMP_NUM_THREADS", "value": "1"},  # one core per pod; 2 cores here
               {"name": "EXAMPLE_TRACE_STEPS", "value": "1"},
               {"name": "EXAMPLE_SAMPLE_COST_S", "value": str(sample_cost_s)}]
        return {"spec": {
            "terminationGracePeriodSeconds": 30,
            "volumes": [{"name": "checkpoint", "persistentVolumeClaim": {"claimName": f"{name}-ckpt"}}],
            "containers": [{
                "name": role, "image": "mlsched-training:latest",
                "command": [sys.executable, *launcher, str(EXAMPLES / program)],
                "args": ["--global-batch-size", str(GLOBAL_BATCH), "--report-interval", "1"],
                "env": env,
                "volumeMounts": [{"name": "checkpoint", "mountPath": CHECKPOINT_MOUNT}],
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}

    roles = {"worker": {"min": 1, "max": 4, "template": template("worker")}}
    if architecture == "ParameterServer":
        roles["ps"] = {"min": 1, "max": 4, "template": template("ps")}
    body = {"apiVersion": "mlsched.io/v1alpha1", "kind": "MLJob",
            "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "generation": 1},
            "spec": {"modelType": "mlp-digits", "architecture": architecture, "epochs": epochs,
                     "globalBatchSize": GLOBAL_BATCH, "replicaSpecs": roles}}
    record = job_record(body)
    assert record.error is None, record.error
    return record


def rendered_pods(job, counts: dict[str, int], url: str = "http://127.0.0.1:1/v1/progress"):
    settings = PodSettings(progress_url=url)
    return [pod for role in ("ps", "worker") if counts.get(role)
            for pod in statefulset_pods(statefulset_manifest(job, role, counts[role], counts, settings))]


# ------------------------------------------------------------------------ the pods' environment


def test_expansion_follows_the_kubelet():
    defined = {"A": "1", "B": "x$y"}
    assert expand("$(A)-$(B)", defined) == "1-x$y"
    assert expand("$$(A) $$ $x $(", defined) == "$(A) $ $x $("
    assert expand("$(LATER) $(A", defined) == "$(LATER) $(A"  # unknown or unclosed: as written
    assert expand("end$", defined) == "end$"


def test_each_pod_resolves_to_a_topology_the_helper_accepts():
    """The rendering (desired.py), resolved per ordinal as the kubelet does, is what
    mlsched.training and torch read: ranks and TF_CONFIG's task index come out per pod."""
    ring = mljob("ring", "AllReduce", "allreduce.py")
    for k, pod in enumerate(rendered_pods(ring, {"worker": 3})):
        env = pod_env(pod)
        topo = training.topology(env)
        assert (topo.rank, topo.world_size, topo.index) == (k, 3, k)
        assert topo.master_addr == f"ring-worker-0.ring.{NS}.svc" and topo.master_port == 23456
        assert env["MLSCHED_POD_NAME"] == f"ring-worker-{k}" and env["MLSCHED_NAMESPACE"] == NS
        assert env["MLSCHED_CHECKPOINT_DIR"] == CHECKPOINT_MOUNT
        assert (env["PET_NODE_RANK"], env["PET_NNODES"]) == (str(k), "3")
        assert pod_argv(pod, env)[1] == str(EXAMPLES / "allreduce.py")
    bert = mljob("bert", "ParameterServer", "parameter_server.py")
    pods = rendered_pods(bert, {"ps": 2, "worker": 3})
    tasks = [(t.task_type, t.task_index) for t in map(training.topology, map(pod_env, pods))]
    assert tasks == [("ps", 0), ("ps", 1), ("worker", 0), ("worker", 1), ("worker", 2)]
    topo = training.topology(pod_env(pods[0]))
    assert topo.cluster["ps"] == (f"bert-ps-0.bert.{NS}.svc:2222", f"bert-ps-1.bert.{NS}.svc:2222")
    # Every pod's DNS name and short name on a loopback address of its own.
    address = addresses(pods)
    assert len(set(address.values())) == 5 and "127.0.0.1" not in address.values()
    hosts = hosts_file(pods, address)
    assert f"{address['bert-worker-2']}\tbert-worker-2.bert.{NS}.svc " in hosts
    assert hosts.rstrip().endswith("bert-worker-2")


# ------------------------------------------------------------------------ the programs


def start(runner: PodRunner, job, counts: dict[str, int], checkpoint: Path,
          url: str) -> list[PodProcess]:
    pods = rendered_pods(job, counts, url)
    return runner.start(pods, volumes={"checkpoint": checkpoint}, token=f"token-of-{job.name}")


def wait_for_step(pods: list[PodProcess], epoch: int, step: int) -> None:
    def reached():
        dead = [p.name for p in pods if not p.running()]
        assert not dead, f"{dead} exited early:\n" + "\n".join(p.log(tail=20) for p in pods)
        return any(int(e) == epoch and int(s) == step for e, s, *_ in logged(pods, TRACE))
    wait_for(reached, RUN_TIMEOUT_S, f"step {step} of epoch {epoch}", interval=0.05,
             describe=lambda: pods[-1].log(tail=3))


def finish(pods: list[PodProcess]) -> None:
    codes = {p.name: p.wait(RUN_TIMEOUT_S) for p in pods}
    assert set(codes.values()) == {0}, f"{codes}\n" + "\n".join(p.log(tail=20) for p in pods)


def check_trained_and_reported(runs, received, capsys, title: str, stops: list[tuple[int, int]],
                               exits_s: list[float]) -> None:
    first = logged(runs[0], START)
    epochs = logged(runs[-1], EPOCH_DONE)
    assert [int(e) for e, *_ in epochs][-1] == EPOCHS
    assert not any(int(e) > EPOCHS for run in runs for e, *_ in logged(run, EPOCH_DONE))
    start_loss, end_loss, accuracy = float(first[0][2]), float(epochs[-1][1]), float(epochs[-1][2])
    assert end_loss < 0.5 * start_loss, (start_loss, end_loss)
    assert accuracy > 0.85, accuracy
    done = [r["epochsDone"] for r in received]
    assert done == sorted(done) and done[-1] == EPOCHS, done
    assert any(r.get("samplesPerSecond", 0) > 0 for r in received)
    assert {r["job"] for r in received} == {runs[0][0].pod["metadata"]["labels"]["mlsched.io/job-name"]}
    assert all(r["token"] == f"Bearer token-of-{r['job']}" for r in received)
    # The checkpoints written on SIGTERM (by each PS, in PS mode), and how long the pods took
    # from the signal to their exit: what a rescale costs on top of the restart.
    saves = [float(took) for run, (epoch, step) in zip(runs, stops)
             for e, s, took in logged(run, SAVED) if (int(e), int(s)) == (epoch, step)]
    assert saves, "no checkpoint written on SIGTERM"
    with capsys.disabled():
        print(f"\n{title}: train loss {start_loss:.3f} -> {end_loss:.3f}, test accuracy "
              f"{accuracy:.3f}; {len(received)} progress reports; stopped at {stops}; "
              f"checkpoints on SIGTERM took {', '.join(f'{t * 1000:.0f}' for t in saves)} ms; "
              f"SIGTERM to exit: {', '.join(f'{t:.2f}' for t in exits_s)} s")


def stop_and_time(pods: list[PodProcess], signalled: list[PodProcess]) -> float:
    """SIGTERM to `signalled` as the kubelet sends it; every pod of the run must then exit 0
    within its grace period. The seconds from the signal to the last exit."""
    started = time.monotonic()
    codes = terminate_all(pods, signalled=signalled)
    took = time.monotonic() - started
    assert codes == [0] * len(pods), f"{codes}\n" + "\n".join(p.log(tail=20) for p in pods)
    return took


def test_allreduce_resumes_across_worker_counts(examples_installed, tmp_path, progress_endpoint, capsys):
    url, received = progress_endpoint
    job = mljob("ring", "AllReduce", "allreduce.py")
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    with PodRunner(tmp_path / "pods") as runner:
        one = start(runner, job, {"worker": 1}, checkpoint, url)
        wait_for_step(one, epoch=0, step=5)
        exits = [stop_and_time(one, one)]
        three = start(runner, job, {"worker": 3}, checkpoint, url)
        wait_for_step(three, epoch=2, step=5)
        # A rolling update deletes the highest ordinal first: one pod's SIGTERM stops all.
        exits.append(stop_and_time(three, three[-1:]))
        two = start(runner, job, {"worker": 2}, checkpoint, url)
        finish(two)
    runs = [one, three, two]
    check_every_step_trained_once(runs, EPOCHS, GLOBAL_BATCH)
    stops = check_resumed_where_stopped(runs, GLOBAL_BATCH)
    check_trained_and_reported(runs, received, capsys, "all-reduce 1 -> 3 -> 2 workers", stops, exits)


def test_parameter_server_resumes_across_ps_and_worker_counts(examples_installed, tmp_path, progress_endpoint, capsys):
    url, received = progress_endpoint
    job = mljob("bert", "ParameterServer", "parameter_server.py")
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    with PodRunner(tmp_path / "pods") as runner:
        first = start(runner, job, {"ps": 1, "worker": 1}, checkpoint, url)
        wait_for_step(first, epoch=0, step=5)
        exits = [stop_and_time(first, first)]
        second = start(runner, job, {"ps": 2, "worker": 3}, checkpoint, url)
        wait_for_step(second, epoch=2, step=5)
        # ps-1 alone: the others learn it through the agreement.
        exits.append(stop_and_time(second, second[1:2]))
        third = start(runner, job, {"ps": 1, "worker": 2}, checkpoint, url)
        finish(third)
    runs = [first, second, third]
    check_every_step_trained_once(runs, EPOCHS, GLOBAL_BATCH)
    stops = check_resumed_where_stopped(runs, GLOBAL_BATCH)
    check_trained_and_reported(runs, received, capsys, "parameter server (1,1) -> (2,3) -> (1,2)",
                               stops, exits)


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("program, architecture", [("allreduce.py", "AllReduce"),
                                                   ("parameter_server.py", "ParameterServer")])
def test_speed(examples_installed, tmp_path, progress_endpoint, capsys, program, architecture, workers):
    """Samples/s of steady epochs (the median of epochs 2-4, steps unpadded), printed per
    worker count (PS jobs with one PS); not compared with each other: 3 workers on a 2-core
    machine share its cores."""
    url, received = progress_endpoint
    job = mljob("speed", architecture, program, epochs=4, sample_cost_s=0)
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    counts = {"worker": workers, **({"ps": 1} if architecture == "ParameterServer" else {})}
    with PodRunner(tmp_path / "pods") as runner:
        pods = start(runner, job, counts, checkpoint, url)
        finish(pods)
    epochs = logged(pods, EPOCH_DONE)
    assert [int(e) for e, *_ in epochs] == [1, 2, 3, 4]
    speed = statistics.median(int(e[4]) for e in epochs[1:])
    assert speed > 0 and any(r.get("samplesPerSecond", 0) > 0 for r in received)
    with capsys.disabled():
        print(f"\n{program} with {counts}: {speed:.0f} samples/s")


def test_torchrun_starts_from_the_pet_variables_alone(examples_installed, tmp_path,
                                                      progress_endpoint):
    """`torchrun SCRIPT` with no option, as under Kubeflow's PyTorchJob: its static rendezvous
    reads PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT, and the ranks and
    world size it gives its one process per pod are the ones the program checks against the
    pod's ordinal and the host list."""
    url, received = progress_endpoint
    job = mljob("launched", "AllReduce", "allreduce.py", epochs=1, sample_cost_s=0,
                launcher=("-m", "torch.distributed.run"))
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    with PodRunner(tmp_path / "pods") as runner:
        pods = start(runner, job, {"worker": 2}, checkpoint, url)
        finish(pods)
    assert [int(e) for e, *_ in logged(pods, EPOCH_DONE)] == [1]
    assert {(rank, world) for *_, rank, world in logged(pods, TRACE)} == {("0", "2"), ("1", "2")}
    assert received[-1]["epochsDone"] == 1

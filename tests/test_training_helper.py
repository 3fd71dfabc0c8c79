"""mlsched.training: the pod's topology, atomic checkpoints, SIGTERM, progress. No torch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from mlsched import progress, training
from mlsched.training import CheckpointStore, TrainingEnvError

HOSTS = "ring-worker-{}.ring.team-a.svc"


def allreduce_env(index: int = 1, workers: int = 3, **over: str) -> dict[str, str]:
    master = HOSTS.format(0)
    env = {"MLSCHED_ARCHITECTURE": "AllReduce", "MLSCHED_ROLE": "worker",
           "MLSCHED_REPLICA_INDEX": str(index), "MLSCHED_JOB_NAME": "ring",
           "MLSCHED_NAMESPACE": "team-a", "MLSCHED_EPOCHS": "2.5", "MLSCHED_PS_HOSTS": "",
           "MLSCHED_WORKER_HOSTS": ",".join(HOSTS.format(k) for k in range(workers)),
           "MASTER_ADDR": master, "MASTER_PORT": "23456", "WORLD_SIZE": str(workers),
           "RANK": str(index)}
    env.update(over)
    return env


def ps_env(role: str = "worker", index: int = 1, ps: int = 2, workers: int = 3,
           **over: str) -> dict[str, str]:
    host = "bert-{}-{}.bert.team-a.svc"
    cluster = {"ps": [host.format("ps", k) + ":2222" for k in range(ps)],
               "worker": [host.format("worker", k) + ":2222" for k in range(workers)]}
    env = {"MLSCHED_ARCHITECTURE": "ParameterServer", "MLSCHED_ROLE": role,
           "MLSCHED_REPLICA_INDEX": str(index), "MLSCHED_JOB_NAME": "bert",
           "MLSCHED_NAMESPACE": "team-a", "MLSCHED_EPOCHS": "6",
           "MLSCHED_PS_HOSTS": ",".join(h.rsplit(":", 1)[0] for h in cluster["ps"]),
           "MLSCHED_WORKER_HOSTS": ",".join(h.rsplit(":", 1)[0] for h in cluster["worker"]),
           "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": role, "index": index},
                                    "environment": "cloud"})}
    env.update(over)
    return env


# ------------------------------------------------------------------------------ topology


def test_allreduce_topology_comes_from_the_torch_variables():
    topo = training.topology(allreduce_env(index=2))
    assert (topo.architecture, topo.role, topo.index, topo.job, topo.namespace) == \
        ("AllReduce", "worker", 2, "ring", "team-a")
    assert topo.epochs == 2.5 and len(topo.worker_hosts) == 3 and topo.ps_hosts == ()
    assert (topo.world_size, topo.rank, topo.master_addr, topo.master_port) == \
        (3, 2, HOSTS.format(0), 23456)
    assert topo.cluster is None and not topo.is_chief
    assert training.topology(allreduce_env(index=0)).is_chief


def test_parameter_server_topology_comes_from_tf_config():
    topo = training.topology(ps_env(role="ps", index=1))
    assert (topo.architecture, topo.role, topo.index) == ("ParameterServer", "ps", 1)
    assert (topo.task_type, topo.task_index) == ("ps", 1)
    assert topo.cluster["ps"] == ("bert-ps-0.bert.team-a.svc:2222", "bert-ps-1.bert.team-a.svc:2222")
    assert len(topo.cluster["worker"]) == 3 and topo.world_size is None
    assert not topo.is_chief and training.topology(ps_env(index=0)).is_chief
    hash(topo)  # frozen and hashable although it holds the cluster dict


@pytest.mark.parametrize("env, names", [
    (allreduce_env(MLSCHED_ARCHITECTURE=""), "MLSCHED_ARCHITECTURE is not set"),
    (allreduce_env(MLSCHED_ARCHITECTURE="Ring"), "MLSCHED_ARCHITECTURE='Ring'"),
    (allreduce_env(MLSCHED_ROLE="ps"), "MLSCHED_ROLE='ps'"),
    (allreduce_env(MLSCHED_REPLICA_INDEX="x"), "MLSCHED_REPLICA_INDEX='x' is not an integer"),
    (allreduce_env(MLSCHED_REPLICA_INDEX="5"), "MLSCHED_REPLICA_INDEX=5"),
    (allreduce_env(MLSCHED_EPOCHS="many"), "MLSCHED_EPOCHS='many'"),
    (allreduce_env(MLSCHED_EPOCHS="0"), "MLSCHED_EPOCHS='0' must be > 0"),
    (allreduce_env(MLSCHED_EPOCHS="nan"), "MLSCHED_EPOCHS='nan' must be > 0"),
    (allreduce_env(MLSCHED_NAMESPACE=""), "MLSCHED_NAMESPACE is not set"),
    (allreduce_env(MASTER_ADDR=""), "MASTER_ADDR is not set"),
    (allreduce_env(MASTER_PORT="0"), "MASTER_PORT='0' must be >= 1"),
    (allreduce_env(RANK="2"), "RANK=2, WORLD_SIZE=3 disagree"),
    (allreduce_env(WORLD_SIZE="2"), "RANK=1, WORLD_SIZE=2 disagree"),
    # An unexpanded $(MLSCHED_REPLICA_INDEX): what a pod shows if the rendering's order is wrong.
    (allreduce_env(RANK="$(MLSCHED_REPLICA_INDEX)"), "RANK='$(MLSCHED_REPLICA_INDEX)'"),
    (ps_env(TF_CONFIG=""), "TF_CONFIG is not set"),
    (ps_env(TF_CONFIG="{not json"), "TF_CONFIG is not"),
    (ps_env(TF_CONFIG='{"cluster": {"ps": []}}'), "TF_CONFIG is not"),
    (ps_env(TF_CONFIG=ps_env(index=2)["TF_CONFIG"]), "TF_CONFIG (task worker 2"),
    (ps_env(TF_CONFIG=ps_env(ps=1)["TF_CONFIG"]), "disagrees with"),
])
def test_a_missing_or_bad_variable_is_named(env, names):
    with pytest.raises(TrainingEnvError) as err:
        training.topology(env)
    assert names in str(err.value)


def test_outside_a_pod_the_error_says_so():
    with pytest.raises(TrainingEnvError, match="not running in an mlsched training pod"):
        training.topology({})


# ------------------------------------------------------------------------------ checkpoints


def write_text(text: str):
    return lambda d: (d / "state.txt").write_text(text)


def test_checkpoint_dir_comes_from_the_environment_or_an_explicit_path(tmp_path):
    assert training.checkpoint_dir(env={"MLSCHED_CHECKPOINT_DIR": "/ckpt"}) == Path("/ckpt")
    assert training.checkpoint_dir(tmp_path, env={}) == tmp_path
    with pytest.raises(TrainingEnvError, match="MLSCHED_CHECKPOINT_DIR.*volume named `checkpoint`"):
        training.checkpoint_dir(env={})


def test_save_publishes_and_latest_finds_it(tmp_path):
    store = CheckpointStore(tmp_path)
    assert store.latest() is None
    first = store.save("e1", write_text("one"), meta={"epoch": 1})
    store.save("e2", write_text("two"), meta={"epoch": 2})
    latest = store.latest()
    assert latest.meta == {"epoch": 2} and (latest.path / "state.txt").read_text() == "two"
    # The same name saved again gets a directory of its own: the published copy is untouched
    # while the new one is written.
    again = store.save("e2", write_text("two again"), meta={"epoch": 2})
    assert again != latest.path and (latest.path / "state.txt").read_text() == "two"
    (tmp_path / "dataset.bin").write_text("not the store's")  # the volume may hold other things
    assert sorted(store.prune()) == sorted([first.name, latest.path.name])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["latest", again.name, "dataset.bin"])


CRASH_MID_SAVE = """
import os, sys
from mlsched.training import CheckpointStore
def write(d):
    (d / "state.txt").write_text("half of epoch 3")
    os.kill(os.getpid(), 9)  # SIGKILL: the grace period ran out mid-save
CheckpointStore(sys.argv[1]).save("e3", write, meta={"epoch": 3})
"""


def test_a_process_killed_mid_save_leaves_the_previous_checkpoint(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save("e2", write_text("epoch 2"), meta={"epoch": 2})
    done = subprocess.run([sys.executable, "-c", CRASH_MID_SAVE, str(tmp_path)], timeout=60)
    assert done.returncode == -signal.SIGKILL
    assert any(p.name.startswith(".partial-e3-") for p in tmp_path.iterdir())
    latest = store.latest()
    assert latest.meta == {"epoch": 2} and (latest.path / "state.txt").read_text() == "epoch 2"
    # The next save succeeds, and pruning after it clears the crashed save's leftovers.
    store.save("e3", write_text("epoch 3"), meta={"epoch": 3})
    store.prune()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".partial")] == []
    assert (store.latest().path / "state.txt").read_text() == "epoch 3"


def test_a_multi_part_checkpoint_counts_only_once_published(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save("e1", write_text("whole"), meta={"epoch": 1})
    shard0 = store.save("e2-ps0", write_text("range 0"), publish=False)
    # PS 1 died before writing its range: nothing new is published.
    assert store.latest().meta == {"epoch": 1}
    with pytest.raises(FileNotFoundError, match="missing parts"):
        store.publish([shard0, tmp_path / "e2-ps1-deadbeef"], {"epoch": 2})
    assert store.latest().meta == {"epoch": 1}
    shard1 = store.save("e2-ps1", write_text("range 1"), publish=False)
    store.publish([shard0, shard1], {"epoch": 2})
    latest = store.latest()
    assert [(p / "state.txt").read_text() for p in latest.parts] == ["range 0", "range 1"]


# ------------------------------------------------------------------------------ SIGTERM


STOPPING_PROGRAM = """
import sys, time
from mlsched import training
stop = training.StopSignal()
assert not training.stop_requested()  # installs the default handler too
print("ready", flush=True)
steps = 0
while not stop.requested:
    time.sleep(0.01)
    steps += 1
print(f"stopping after {steps} steps, default flag {training.stop_requested()}", flush=True)
sys.exit(0)
"""


def test_sigterm_sets_the_flag_and_the_program_exits_cleanly():
    proc = subprocess.Popen([sys.executable, "-c", STOPPING_PROGRAM], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "stopping after" in out and "default flag True" in out
    assert "got signal 15" in err


def test_request_stops_without_a_signal():
    stop = training.StopSignal(signals=())
    assert not stop.requested
    stop.request()
    assert stop.requested and stop.received_at is not None


# ------------------------------------------------------------------------------ progress


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def endpoint():
    """A local progress endpoint that records the JSON it gets."""
    received: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            assert self.headers["Authorization"] == "Bearer tok"
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    # shutdown() returns once serve_forever sees it, which it checks every poll_interval
    # (0.5 s by default: half a second of every test that uses this endpoint)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/v1/progress", received
    server.shutdown()
    server.server_close()


def reporter_for(url: str, tmp_path: Path, clock) -> training.ProgressReporter:
    token = tmp_path / "token"
    token.write_text("tok\n")
    env = {"MLSCHED_PROGRESS_URL": url, "MLSCHED_NAMESPACE": "team-a",
           "MLSCHED_JOB_NAME": "ring", "MLSCHED_TOKEN_FILE": str(token)}
    return training.ProgressReporter.from_env(env, min_interval_s=5.0, clock=clock)


def test_reports_are_throttled_and_carry_samples_per_second(endpoint, tmp_path):
    url, received = endpoint
    clock = FakeClock()
    reporter = reporter_for(url, tmp_path, clock)
    reporter.start()
    clock.now += 2
    assert reporter.step(0.1, 64) is False and received == []  # not due yet
    clock.now += 4
    assert reporter.step(0.2, 64) is True  # 128 samples in 6 s
    clock.now += 1
    assert reporter.step(1.0, 100, epoch_end=True) is True  # epoch ends always report
    assert [r["epochsDone"] for r in received] == [0.2, 1.0]
    assert received[0]["samplesPerSecond"] == pytest.approx(128 / 6)
    assert received[1]["samplesPerSecond"] == pytest.approx(100 / 1)
    assert received[0]["namespace"] == "team-a" and received[0]["job"] == "ring"
    assert reporter.report(1.0) is True and "samplesPerSecond" not in received[-1]


def test_an_unreachable_operator_only_warns(tmp_path, caplog):
    import socket
    with socket.socket() as s:  # a port that was free a moment ago: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    clock = FakeClock()
    reporter = reporter_for(f"http://127.0.0.1:{port}/v1/progress", tmp_path, clock)
    clock.now += 10
    assert reporter.step(0.5, 640) is False
    assert reporter.last_samples_per_second == pytest.approx(64)
    assert "progress report to" in caplog.text
    # Outside a pod: a warning at start, then silence.
    quiet = training.ProgressReporter.from_env({}, clock=clock)
    assert quiet.step(1, 1, epoch_end=True) is False
    assert "progress will not be reported" in caplog.text


def test_a_report_that_raises_is_caught(tmp_path, caplog):
    class Broken(progress.Reporter):
        def report(self, *a, **kw):
            raise ValueError("boom")

    reporter = training.ProgressReporter(Broken(url="http://x", namespace="n", job="j"))
    assert reporter.report(1.0) is False and "boom" in caplog.text


def test_nothing_here_needs_torch():
    out = subprocess.run([sys.executable, "-c", "import sys; import mlsched.training; "
                          "print('torch' in sys.modules)"], capture_output=True, text=True,
                         env={**os.environ}, timeout=60)
    assert out.stdout.strip() == "False", out.stderr

"""The retraining Job's container run as a subprocess, as its pod would (`mlsched retrain` with
manifests/retraining/job.yaml's args and a token of the mlsched-retrain ServiceAccount), and
what a retraining run reads and publishes: the policy's interval records, its model versions,
its status."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from mlsched.formats import dataset_store, model_versions
from mlsched_objects import REPO, load_yaml
from operator_identity import TOKEN_SECONDS, _create

RETRAINING = REPO / "manifests" / "retraining"
SERVICE_ACCOUNT = "mlsched-retrain"
POLICY = "default"  # what job.yaml's --policy names
ROUND_TIMEOUT = 90  # rounds every 6 s; generous on a loaded 2-core machine
RUN_TIMEOUT = 240  # one retraining run: torch import, reading, 0.3 min of training, evaluation
SHORT_INTERVAL = 1200  # 6 s rounds


def require_torch() -> None:
    if importlib.util.find_spec("torch") is None:
        pytest.fail(f"the retraining Job needs torch, which {sys.executable} lacks: install the "
                    "train extra, `pip install -e '.[train]'` (or `make dev`)", pytrace=False)


def retrain_command() -> list[str]:
    """The Job's container command: the train image's ENTRYPOINT (`mlsched retrain`)."""
    entry = Path(sys.executable).with_name("mlsched")
    if entry.is_file():
        return [str(entry), "retrain"]
    found = shutil.which("mlsched")
    if found is None:
        pytest.fail("no `mlsched` entry point beside the interpreter: `pip install -e '.[train]'`",
                    pytrace=False)
    return [found, "retrain"]


def job_args(**overrides: object) -> list[str]:
    """manifests/retraining/job.yaml's container args, with `--name=value` replaced (or added)
    for each override (time_budget_min -> --time-budget-min)."""
    (job,) = load_yaml(RETRAINING / "job.yaml")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert [e["name"] for e in container["env"]] == ["POD_NAMESPACE"], container["env"]
    args = list(container["args"])
    for key, value in overrides.items():
        flag = "--" + key.replace("_", "-")
        entry = f"{flag}={value}"
        at = [i for i, a in enumerate(args) if a.split("=", 1)[0] == flag]
        if at:
            args[at[0]] = entry
        else:
            args.append(entry)
    return args


def retraining_kubeconfig(api: client.ApiClient, namespace: str, server: str, ca_cert: Path,
                          path: Path) -> Path:
    """`kubectl apply -n <namespace> -f manifests/retraining/rbac.yaml`, then a kubeconfig with
    a token of the mlsched-retrain ServiceAccount (what the Job's pod is given)."""
    for doc in load_yaml(RETRAINING / "rbac.yaml"):
        _create(api, doc, namespace)
    token = client.CoreV1Api(api).create_namespaced_service_account_token(
        SERVICE_ACCOUNT, namespace, {"apiVersion": "authentication.k8s.io/v1",
                                     "kind": "TokenRequest",
                                     "spec": {"expirationSeconds": TOKEN_SECONDS}}).status.token
    user = f"system:serviceaccount:{namespace}:{SERVICE_ACCOUNT}"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": server,
                                                 "certificate-authority": str(ca_cert)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
        "current-context": "e2e",
    }))
    path.chmod(0o600)
    return path


class RetrainingJob:
    """One run of the retraining Job's container, as a subprocess."""

    def __init__(self, kubeconfig: Path, namespace: str, workdir: Path):
        self.kubeconfig, self.namespace, self.workdir = kubeconfig, namespace, workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.runs = 0

    def env(self) -> dict[str, str]:
        tmp = self.workdir / "tmp"  # the Job's emptyDir at /tmp
        tmp.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        env.update(KUBECONFIG=str(self.kubeconfig), POD_NAMESPACE=self.namespace,
                   TMPDIR=str(tmp), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        return env

    def start(self, args: list[str]) -> tuple[subprocess.Popen, Path, Path]:
        self.runs += 1
        out = self.workdir / f"run-{self.runs}.stdout"
        err = self.workdir / f"run-{self.runs}.stderr"
        with out.open("wb") as o, err.open("wb") as e:
            proc = subprocess.Popen([*retrain_command(), *args], stdout=o, stderr=e,
                                    env=self.env(), cwd=self.workdir)
        return proc, out, err

    def run(self, args: list[str]) -> dict:
        """Runs to the end; returns the JSON report the CLI prints last."""
        proc, out, err = self.start(args)
        try:
            rc = proc.wait(RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"retraining run {self.runs} still going after {RUN_TIMEOUT}s:\n"
                                 + tail(err)) from None
        assert rc == 0, f"retraining run {self.runs} exited {rc}:\n{tail(err)}"
        lines = out.read_text().strip().splitlines()
        assert lines, f"retraining run {self.runs} printed no report:\n{tail(err)}"
        report = json.loads(lines[-1])
        report["_log"] = err.read_text()
        return report

    def run_killed_when(self, args: list[str], marker: str) -> str:
        """Starts a run and SIGKILLs it as soon as its log shows `marker`; returns the log."""
        proc, _, err = self.start(args)
        deadline = time.monotonic() + RUN_TIMEOUT
        try:
            while marker not in err.read_text():
                assert proc.poll() is None, (f"retraining run {self.runs} ended ({proc.returncode}) "
                                             f"before '{marker}':\n{tail(err)}")
                assert time.monotonic() < deadline, f"no '{marker}' after {RUN_TIMEOUT}s:\n{tail(err)}"
                time.sleep(0.05)
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait()
        assert proc.returncode == -signal.SIGKILL, proc.returncode
        return err.read_text()


def tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def records(api, namespace: str) -> list:
    return dataset_store.list_records(client.CoreV1Api(api), namespace, POLICY)


def versions(api, namespace: str) -> list[dict]:
    items = client.CoreV1Api(api).list_namespaced_config_map(
        namespace, label_selector=model_versions.selector(POLICY)).items
    return [client.ApiClient().sanitize_for_serialization(cm) for cm in items]


def policy_status(mlsched) -> dict:
    return (mlsched.policy(POLICY) or {}).get("status") or {}

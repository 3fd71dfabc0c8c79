"""The operator against a real API server: reconcile latency, round time and memory at scale.

It starts its own e2e control plane (etcd, kube-apiserver, KCM, kube-scheduler, kwok; see
e2e/README.md) with 500 kwok nodes (8 CPU, 2 GPU, 48 GiB each) and runs the operator as a
subprocess with its shipped ServiceAccount and RBAC, as the e2e tests do.

(a) Reconcile latency: 200 MLJobs submitted at once (20 client threads); for each, the time
    from just before its create call until a watch has seen every StatefulSet of the job.
    The DL² paper reports 700 ms end-to-end scheduling latency; p99 / 700 ms is printed
    (< 1.00 is faster). Also shown, not compared: the time until a round has allocated
    the job (its StatefulSets scaled up), which includes waiting for the next round.
(b) Scale: 800 more MLJobs (1,000 in all) on the 500 nodes. Every job must be reconciled
    (have all its StatefulSets). Rounds are timed from the policy's
    status.lastRoundDurationSeconds (which covers deciding, applying, and writing every job's
    status), with their change counts from the operator's log: the busiest round while the
    jobs arrive, and `--rounds` rounds once the cluster has settled (a round without changes,
    a running pod for every decided task). The operator's memory is read from
    /proc/<pid>/status (VmRSS now, VmHWM peak). Targets as in bench_operator.py: a round
    <= 200 ms (that benchmark times the CPU part of a round only) and RSS <= 300 MB.

Run: `.venv/bin/python bench/bench_e2e.py` (several minutes; progress is printed).
Options: --jobs, --burst, --nodes, --rounds, --keep (keep the control plane's temp dir).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import random
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "e2e"))  # the harness modules are plain files, not a package

from kubernetes import client, watch  # noqa: E402

from controlplane import ControlPlane  # noqa: E402
from mlsched.workloads import catalog  # noqa: E402
from mlsched_objects import (  # noqa: E402
    GROUP, JOB_LABEL, KWOK_TOLERATION, ROLE_LABEL, VERSION, MLSched, install_crds,
    scheduling_policy,
)
from operator_identity import operator_kubeconfig  # noqa: E402
from operator_process import OperatorProcess  # noqa: E402

NAMESPACE = "bench"
PAPER_LATENCY_MS = 700.0  # DL² (Peng et al.), end-to-end scheduling latency
ROUND_TARGET_MS, RSS_TARGET_MB = 200.0, 300.0
# Rounds every 1200 s x 0.025 = 30 s: long enough for a 1,000-job round and its writes.
INTERVAL_SCALE = 0.025


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: the smallest value at least q % of the values are <= to."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


# ------------------------------------------------------------------ workload


def role_template(model: str, role: str) -> dict:
    demand = catalog.MODELS[model].demand(role)
    requests = {"cpu": f"{demand[0]:g}", "memory": f"{demand[2]:g}Gi"}
    if demand[1]:
        requests["nvidia.com/gpu"] = f"{demand[1]:g}"
    return {"spec": {"tolerations": [KWOK_TOLERATION], "containers": [{
        "name": role, "image": "registry.invalid/mlsched/trainer:bench",
        "resources": {"requests": requests, "limits": requests}}]}}


def job_manifest(i: int, rng: random.Random) -> dict:
    """A mix like bench_operator.py's: every catalog model, 30 % all-reduce, small bounds.
    Epochs are out of reach: nothing reports progress here, and no job should finish."""
    model = rng.choice(catalog.MODEL_NAMES)
    allreduce = rng.random() < 0.3
    specs = {"worker": {"min": 1, "max": rng.choice((1, 2, 4)),
                        "template": role_template(model, "worker")}}
    if not allreduce:
        specs["ps"] = {"min": 1, "max": rng.choice((1, 2)), "template": role_template(model, "ps")}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "MLJob",
            "metadata": {"name": f"job-{i:04d}"},
            "spec": {"modelType": model, "architecture": "AllReduce" if allreduce else
                     "ParameterServer", "epochs": 1e6, "replicaSpecs": specs}}


def roles(job: dict) -> set[str]:
    return set(job["spec"]["replicaSpecs"])


# ------------------------------------------------------------------ observation


class StatefulSetWatch:
    """When each job's StatefulSets were first seen, and first seen with replicas > 0."""

    def __init__(self, api: client.ApiClient, namespace: str):
        self.apps = client.AppsV1Api(api)
        self.namespace = namespace
        self.created: dict[str, dict[str, float]] = {}  # job -> role -> monotonic time
        self.scaled: dict[str, float] = {}  # job -> first time any role had replicas
        self._watch = watch.Watch()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        version = self.apps.list_namespaced_stateful_set(self.namespace).metadata.resource_version
        self._version = version
        self._thread.start()

    def stop(self) -> None:
        self._stopped = True
        self._watch.stop()

    def _run(self) -> None:
        while not self._stopped:
            try:
                for event in self._watch.stream(self.apps.list_namespaced_stateful_set,
                                                self.namespace, resource_version=self._version,
                                                timeout_seconds=300):
                    now = time.monotonic()
                    sts = event["object"]
                    self._version = sts.metadata.resource_version
                    job, role = sts.metadata.labels[JOB_LABEL], sts.metadata.labels[ROLE_LABEL]
                    self.created.setdefault(job, {}).setdefault(role, now)
                    if (sts.spec.replicas or 0) > 0:
                        self.scaled.setdefault(job, now)
            except Exception as err:  # noqa: BLE001 - a dropped watch is resumed
                if not self._stopped:
                    # From the current state: what is already recorded keeps its first time.
                    self._version = None
                    log(f"StatefulSet watch restarted: {err}")


def submit(api: client.ApiClient, jobs: list[dict]) -> dict[str, float]:
    """Creates the jobs from 20 threads at once; returns when each create call began."""
    custom = client.CustomObjectsApi(api)
    began: dict[str, float] = {}

    def create(job: dict) -> None:
        began[job["metadata"]["name"]] = time.monotonic()
        custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "mljobs", job)

    with ThreadPoolExecutor(max_workers=20) as pool:
        list(pool.map(create, jobs))
    return began


def wait_reconciled(seen: StatefulSetWatch, jobs: list[dict], timeout: float,
                    while_waiting=lambda: None) -> float:
    deadline, last_print = time.monotonic() + timeout, 0.0
    while True:
        while_waiting()
        done = sum(1 for j in jobs if set(seen.created.get(j["metadata"]["name"], {}))
                   >= roles(j))
        now = time.monotonic()
        if done == len(jobs):
            return now
        if now - last_print > 10:
            log(f"  {done}/{len(jobs)} jobs have all their StatefulSets")
            last_print = now
        if now > deadline:
            raise SystemExit(f"only {done}/{len(jobs)} jobs reconciled after {timeout:.0f}s")
        time.sleep(0.5)


# ------------------------------------------------------------------ the benchmark


def latency_table(began: dict[str, float], seen: StatefulSetWatch) -> None:
    created = [(max(seen.created[j].values()) - t) * 1000 for j, t in began.items()]
    print(f"\n(a) {len(began)} MLJobs submitted at once -> StatefulSets exist")
    print(f"    {'':<34} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    print(f"    {'created -> StatefulSets exist':<34} {percentile(created, 50):>8.0f} "
          f"{percentile(created, 99):>8.0f} {max(created):>8.0f}")
    allocated = [(seen.scaled[j] - t) * 1000 for j, t in began.items() if j in seen.scaled]
    if allocated:
        print(f"    {'created -> allocated by a round':<34} {percentile(allocated, 50):>8.0f} "
              f"{percentile(allocated, 99):>8.0f} {max(allocated):>8.0f}   "
              f"({len(allocated)} jobs; includes waiting for the next round)")
    p99 = percentile(created, 99)
    print(f"    p99 / DL² {PAPER_LATENCY_MS:.0f} ms = {p99 / PAPER_LATENCY_MS:.2f}x")


ROUND_LINE = re.compile(r"round (\d+): (\d+) jobs, (\d+) changes, allocation \S+, (\d+) ms")


class RoundLog:
    """Every round of the policy: its duration from status.lastRoundDurationSeconds, its job
    and change counts from the operator's log line for it, and the operator's peak RSS."""

    def __init__(self, mlsched: MLSched, operator: OperatorProcess):
        self.mlsched, self.operator = mlsched, operator
        self.rounds: list[tuple[float, int, int]] = []  # (seconds, jobs, changes)
        self.peak_kib = 0
        self._last = None

    def poll(self) -> bool:
        """Reads the policy once; True if a round finished since the previous poll."""
        status = (self.mlsched.policy("default") or {}).get("status") or {}
        stamp = (status.get("lastRoundTime"), status.get("lastRoundDurationSeconds"))
        self.peak_kib = max(self.peak_kib, self.operator.rss_kib())
        if not stamp[0] or stamp == self._last:
            return False
        first = self._last is None
        self._last = stamp
        if first:  # a round from before we started watching
            return False
        summaries = ROUND_LINE.findall(self.operator.log_text())
        _, jobs, changes, _ = summaries[-1] if summaries else ("", 0, -1, 0)
        self.rounds.append((float(stamp[1]), int(jobs), int(changes)))
        log(f"  round at {stamp[0]}: {stamp[1] * 1000:.0f} ms, {jobs} jobs, {changes} changes, "
            f"operator RSS {self.operator.rss_kib() / 1024:.0f} MB")
        return True


def settled(mlsched: MLSched, core: client.CoreV1Api) -> tuple[bool, str]:
    """Every decided task has a running pod (KCM creates pods at its own pace)."""
    decided = sum((r or {}).get("desired") or 0 for j in mlsched.jobs()
                  for r in ((j.get("status") or {}).get("replicaStatuses") or {}).values())
    running = sum(1 for p in core.list_namespaced_pod(NAMESPACE).items
                  if p.status.phase == "Running" and not p.metadata.deletion_timestamp)
    return running == decided, f"{running}/{decided} decided tasks have a running pod"


def vm_hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def run(args: argparse.Namespace, plane: ControlPlane, workdir: Path) -> None:
    log(f"creating {args.nodes} kwok nodes")
    plane.create_nodes(args.nodes, timeout=600)
    api = plane.api_client()
    api.configuration.connection_pool_maxsize = 32
    install_crds(api)
    client.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})
    mlsched = MLSched(api, NAMESPACE)
    mlsched.create(scheduling_policy("default"))

    kubeconfig = operator_kubeconfig(api, plane.apiserver_url, plane.ca_cert_path,
                                     workdir / "operator.kubeconfig")
    operator = OperatorProcess(kubeconfig, workdir / "operator.log", namespaces=[NAMESPACE],
                               interval_scale=INTERVAL_SCALE, job_sync_seconds=10)
    operator.start()
    log(f"operator running (pid {operator.pid}, log {operator.log_path})")
    try:
        rng = random.Random(7)
        jobs = [job_manifest(i, rng) for i in range(args.jobs)]
        seen = StatefulSetWatch(api, NAMESPACE)
        seen.start()

        log(f"(a) submitting {args.burst} MLJobs at once")
        began = submit(api, jobs[:args.burst])
        wait_reconciled(seen, jobs[:args.burst], timeout=300)
        time.sleep(1200 * INTERVAL_SCALE + 5)  # let a round allocate them, for the second row
        latency_table(began, seen)

        log(f"(b) submitting {args.jobs - args.burst} more MLJobs ({args.jobs} in all)")
        rounds = RoundLog(mlsched, operator)
        rounds.poll()
        submit(api, jobs[args.burst:])
        wait_reconciled(seen, jobs, timeout=1200, while_waiting=rounds.poll)
        sts = client.AppsV1Api(api).list_namespaced_stateful_set(NAMESPACE).items
        expected = sum(len(roles(j)) for j in jobs)
        log(f"all {args.jobs} jobs reconciled: {len(sts)} StatefulSets (expected {expected})")
        core = client.CoreV1Api(api)
        log("waiting for the cluster to settle: a round without changes, every task running")
        deadline = time.monotonic() + 1800
        while True:
            if rounds.poll() and rounds.rounds[-1][2] == 0:
                done, progress = settled(mlsched, core)
                log(f"  {progress}")
                if done:
                    break
            if time.monotonic() > deadline:
                raise SystemExit(f"not settled in 30 min: {settled(mlsched, core)[1]}")
            time.sleep(1)
        busy = list(rounds.rounds)
        log(f"timing {args.rounds} more rounds (one every {1200 * INTERVAL_SCALE:.0f} s)")
        while len(rounds.rounds) < len(busy) + args.rounds:
            rounds.poll()
            time.sleep(1)
        quiet = rounds.rounds[len(busy):]
        rss_mb = operator.rss_kib() / 1024
        hwm_mb = max(vm_hwm_kib(operator.pid), rounds.peak_kib) / 1024
        pods = len(core.list_namespaced_pod(NAMESPACE).items)
        seen.stop()

        print(f"\n(b) {args.jobs} MLJobs on {args.nodes} nodes: {len(sts)} StatefulSets "
              f"(every job reconciled: {len(sts) == expected}), {pods} pods")
        print(f"    {'':<46} {'value':>9} {'target':>8} {'ratio':>7}")
        busiest = max(busy, key=lambda r: r[2])
        label = f"busiest round ({busiest[2]} changes), ms"
        print(f"    {label:<46} {busiest[0] * 1000:>9.0f} {ROUND_TARGET_MS:>8.0f} "
              f"{busiest[0] * 1000 / ROUND_TARGET_MS:>6.2f}x")
        durations = [r[0] * 1000 for r in quiet]
        median = statistics.median(durations)
        label = f"settled rounds, median of {len(quiet)}, ms"
        print(f"    {label:<46} {median:>9.0f} {ROUND_TARGET_MS:>8.0f} "
              f"{median / ROUND_TARGET_MS:>6.2f}x   (min {min(durations):.0f}, "
              f"max {max(durations):.0f}; changes {[r[2] for r in quiet]})")
        print(f"    {'operator RSS now (MB)':<44} {rss_mb:>9.0f} {RSS_TARGET_MB:>8.0f} "
              f"{rss_mb / RSS_TARGET_MB:>6.2f}x")
        print(f"    {'operator RSS peak, VmHWM (MB)':<44} {hwm_mb:>9.0f} {RSS_TARGET_MB:>8.0f} "
              f"{hwm_mb / RSS_TARGET_MB:>6.2f}x")
        print("    rounds until settled: " + ", ".join(
            f"{d * 1000:.0f} ms/{c} changes" for d, _, c in busy))
        if len(sts) != expected:
            raise SystemExit(f"{expected - len(sts)} StatefulSets missing")
    finally:
        operator.stop()
        api.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the control plane's temp dir")
    args = parser.parse_args()
    if args.keep:
        os.environ["MLSCHED_E2E_KEEP"] = "1"
    plane = ControlPlane()
    log("starting the control plane (builds the binaries on first use)")
    plane.start()
    with tempfile.TemporaryDirectory(prefix="bench-e2e-") as tmp:
        workdir = plane.workdir if args.keep else Path(tmp)
        try:
            run(args, plane, workdir)
        finally:
            plane.stop()


if __name__ == "__main__":
    main()

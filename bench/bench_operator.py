"""Operator speed and memory at scale: 1,000 MLJobs on 500 nodes.

1. One scheduling round (target <= 200 ms): Snapshot from the index records, grouping ->
   allocation (drf) -> placement (load-balance) via run_served_round (as rounds.py runs a round:
   settled, policies/round.py), and the desired-state diff (StatefulSet and pod actions) for
   every job. No API calls. Measured in steady state (the cluster already runs the previous
   decision) and cold (every job new), and once more including turning the raw Kubernetes
   dicts into index records, which the operator does per watch event rather than per round.
2. API calls per round (mlsched_api_requests_total, counted as the operator counts them, by
   verb and resource) when the real `rounds.run_policy_round` runs against an API that accepts
   every call at once: a busy round (1,000 new jobs scaled and placed) and a steady round
   (nothing changed: only each job's interval record and the policy's are written).
3. Process RSS while the indexes hold 1,000 MLJobs (and their bodies, which kopf keeps for the
   per-job timers), 500 nodes and every pod of the running jobs (target <= 300 MB), with the
   operator's imports loaded.
4. A decision round at scale: 10,000 MLJobs on 5,000 nodes (`--scale-jobs/--scale-nodes`),
   for DRF and for DL² (the shipped model, served by ONNX Runtime): the snapshot from the index
   records and the decision (run_served_round: allocation and placement, DRF's settled),
   target <= 1 s; the desired-state diff after it is shown beside it. Every job is new (a
   cold cluster, the most work a decision can have; the learned policy decides every job
   afresh each round anyway), the garbage collector as `python -m mlsched.controller` runs it (young threshold
   raised, what the indexes hold frozen, as its watcher freezes the survivors of every full
   collection, and held off for the snapshot and the decision, as step.py holds it for a
   round: controller/process/loop_health.py); `--gc-defaults` measures with CPython's.

Ratios < 1.00 meet the target. Run: `python bench/bench_operator.py [--scale-jobs N --scale-nodes M]`.
"""

from __future__ import annotations

import os

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import gc  # noqa: E402
import random  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402

import numpy as np  # noqa: E402

from mlsched.controller.app import handlers  # noqa: E402,F401 - the operator's import footprint
from mlsched.controller.scheduling import loop, policy_view  # noqa: E402
from mlsched.controller.process.config import OperatorConfig  # noqa: E402
from mlsched.controller.kube.kube import RESOURCES  # noqa: E402
from mlsched.controller.scheduling.runtime import Runtime
from mlsched.controller.scheduling.indexes import Indexes
from mlsched.controller.objects.desired import (  # noqa: E402
    PodSettings, clear_hash_cache, job_targets, plan_pods, plan_statefulset, roles_of,
    statefulset_manifest,
)
from mlsched.controller.objects.records import node_record, pod_record, sts_record
from mlsched.controller.objects.job_records import job_record
from mlsched.policies import registry  # noqa: E402
from mlsched.policies.round import run_served_round  # noqa: E402 (a round as rounds.py decides it)
from mlsched.workloads import catalog  # noqa: E402

JOBS, NODES, NAMESPACE = 1000, 500, "bench"
ROUND_TARGET_MS, RSS_TARGET_MB = 200.0, 300.0
SCALE_TARGET_MS = 1000.0
REPEATS = 5
SETTINGS = PodSettings(progress_url="http://mlsched-operator.mlsched-system.svc:8080/v1/progress")


def rss_mb() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def node_body(i: int) -> dict:
    name = f"node-{i:04d}"
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": f"node-uid-{i}",
                         "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                    "kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": "gpu-2x"}},
            "spec": {"podCIDR": f"10.{i // 256}.{i % 256}.0/24"},
            "status": {"allocatable": {"cpu": "8", "memory": "48Gi", "nvidia.com/gpu": "2", "pods": "110"},
                       "capacity": {"cpu": "8", "memory": "48Gi", "nvidia.com/gpu": "2", "pods": "110"},
                       "conditions": [{"type": t, "status": "True" if t == "Ready" else "False"}
                                      for t in ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure")]}}


def template(role: str, model: str) -> dict:
    demand = catalog.MODELS[model].demand(role)
    requests = {"cpu": f"{demand[0]:g}", "memory": f"{demand[2]:g}Gi"}
    if demand[1]:
        requests["nvidia.com/gpu"] = f"{demand[1]:g}"
    return {"metadata": {"labels": {"team": "vision"}},
            "spec": {"containers": [{"name": role, "image": "registry.example/train:1.0",
                                     "command": ["python", "-m", "train", f"--role={role}"],
                                     "resources": {"requests": requests, "limits": requests}}]}}


def job_body(i: int, rng: random.Random) -> dict:
    model = rng.choice(catalog.MODEL_NAMES)
    allreduce = rng.random() < 0.3
    specs = {"worker": {"min": 1, "max": rng.choice((2, 4, 8)), "template": template("worker", model)}}
    if not allreduce:
        specs["ps"] = {"min": 1, "max": rng.choice((1, 2, 4)), "template": template("ps", model)}
    epochs = rng.choice((20, 50, 100))
    history = [{"interval": k, "start": "2026-01-01T00:00:00Z", "ps": 1, "workers": 2,
                "placement": {"ps": ["node-001"], "worker": ["node-002", "node-003"]},
                "epochs": 0.5, "reward": 0.01} for k in range(50)]  # the default historyLimit
    return {"apiVersion": "mlsched.io/v1alpha1", "kind": "MLJob",
            "metadata": {"name": f"job-{i:04d}", "namespace": NAMESPACE, "uid": f"job-uid-{i}",
                         "generation": 1, "creationTimestamp": f"2026-01-01T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z"},
            "spec": {"modelType": model, "architecture": "AllReduce" if allreduce else "ParameterServer",
                     "epochs": epochs, "schedulingPolicy": "default", "replicaSpecs": specs},
            "status": {"phase": "Running", "progress": {"epochsDone": rng.uniform(0, epochs / 2)},
                       "history": history}}


def pod_body(job: dict, role: str, k: int, node: str) -> dict:
    name, ns = job["metadata"]["name"], NAMESPACE
    tpl = job["spec"]["replicaSpecs"][role]["template"]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{name}-{role}-{k}", "namespace": ns, "uid": f"{name}-{role}-{k}-uid",
                         "labels": {"mlsched.io/job-name": name, "mlsched.io/role": role,
                                    "apps.kubernetes.io/pod-index": str(k)}},
            "spec": {**tpl["spec"], "nodeName": node, "nodeSelector": {"kubernetes.io/hostname": node}},
            "status": {"phase": "Running", "containerStatuses": [{"name": role, "restartCount": 0}]}}


def build_indexes(nodes, jobs, pods, statefulsets):
    """What kopf's indexes hold: records keyed as in handlers.py."""
    node_index = {n["metadata"]["name"]: [node_record(n)] for n in nodes}
    job_index = {(NAMESPACE, j["metadata"]["name"]): [job_record(j)] for j in jobs}
    pod_index, sts_index = defaultdict(list), defaultdict(list)
    for p in pods:
        pod_index[(NAMESPACE, p["metadata"]["labels"]["mlsched.io/job-name"])].append(pod_record(p))
    for s in statefulsets:
        sts_index[(NAMESPACE, s["metadata"]["labels"]["mlsched.io/job-name"])].append(sts_record(s))
    return node_index, job_index, dict(pod_index), dict(sts_index)


def cold_indexes(nodes, jobs, settings: PodSettings = SETTINGS):
    """Every job new: its StatefulSets at zero replicas, no pods."""
    zero_sts = []
    for j in jobs:
        rec = job_record(j)
        zero_sts += [statefulset_manifest(rec, role, 0, {}, settings) for role in roles_of(rec)]
    return build_indexes(nodes, jobs, [], zero_sts)


def snapshot_of(node_index, job_index, pod_index, sts_index):
    """The schedulable jobs and the snapshot a round decides on, built by the operator's own
    `policy_view.policy_snapshot`, with every job holding a reservation (as after any round)."""
    jobs = [j for store in job_index.values() for j in store if j.schedulable]
    rt = Runtime.create(OperatorConfig(), AcceptingApi())
    rt.scheduling.reservations.set((NAMESPACE, "default"), {j.key: {} for j in jobs})
    idx = Indexes(nodes=node_index, pods=pod_index, statefulsets=sts_index, foreign={},
                  mljobs=job_index, policies={(NAMESPACE, "default"): [True]})
    return jobs, policy_view.policy_snapshot(rt, idx, jobs, jobs, now=time.time(), interval_s=1200.0)


def plan_all(jobs, targets, pod_index, sts_index):
    """The desired-state diff: StatefulSet and pod actions for every job."""
    actions = []
    for job in jobs:
        current = {s.role: s for s in sts_index.get(job.key, ())}
        target = targets[job.name]
        for role in roles_of(job):
            if role in current:
                plan = plan_statefulset(job, role, current[role], target.counts, SETTINGS)
                if plan:
                    actions.append(plan)
        actions += plan_pods(job.namespace, pod_index.get(job.key, ()), target.nodes)
    return actions


def one_round(node_index, job_index, pod_index, sts_index):
    """Snapshot → run_served_round → targets → actions: the CPU part of rounds.run_policy_round."""
    jobs, snap = snapshot_of(node_index, job_index, pod_index, sts_index)
    decision = run_served_round(snap, registry.make_allocation("drf"),
                                registry.make_placement("load-balance"))
    targets = job_targets(decision, snap)
    return targets, plan_all(jobs, targets, pod_index, sts_index)


def timed(fn, repeats=REPEATS):
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - start) * 1000)
    return min(times), statistics.median(times), result


def measure_rounds(jobs: list[dict]) -> tuple[list[tuple], tuple]:
    """Timings of the rounds, and the steady-state indexes (what the operator then holds)."""
    nodes = [node_body(i) for i in range(NODES)]
    cold_idx = cold_indexes(nodes, jobs)
    clear_hash_cache()  # cold: nothing hashed or rendered before; one run
    cold_ms, _, (targets, cold_actions) = timed(lambda: one_round(*cold_idx), 1)

    # Steady state: the previous decision runs (pods bound where it put them).
    running_sts, pods = [], []
    for j in jobs:
        rec = job_record(j)
        target = targets[rec.name]
        for role in roles_of(rec):
            running_sts.append(statefulset_manifest(rec, role, target.count(role), target.counts, SETTINGS))
            pods += [pod_body(j, role, k, node) for k, node in enumerate(target.nodes.get(role, ()))]
    index_best, index_median, indexes = timed(lambda: build_indexes(nodes, jobs, pods, running_sts), 3)
    # After an operator restart nothing is cached: every template is hashed once to compare.
    clear_hash_cache()
    restart_ms, _, _ = timed(lambda: one_round(*indexes), 1)
    steady_best, steady_median, (_, steady_actions) = timed(lambda: one_round(*indexes))

    print(f"{JOBS} MLJobs, {NODES} nodes, {len(pods)} pods, {len(running_sts)} StatefulSets; "
          f"drf + load-balance; best of {REPEATS} (median in brackets)")
    return [
        ("round, steady state (snapshot+decide+diff)", steady_best, steady_median,
         f"{len(steady_actions)} actions"),
        ("round, cold: 1000 new jobs (one run)", cold_ms, cold_ms, f"{len(cold_actions)} actions"),
        ("first round after a restart: + records from dicts", restart_ms + index_best,
         restart_ms + index_median, f"records alone {index_best:.0f} ms"),
    ], indexes


class AcceptingApi:
    """The KubeApi seam answering every call at once, as if the API server accepted it. Each
    call is reported through `on_request`, which the Runtime counts in
    mlsched_api_requests_total, as it does for the production KubeApi."""

    def __init__(self) -> None:
        self.on_request = None

    def _count(self, verb: str, kind: str, status: bool = False) -> None:
        resource = RESOURCES.get(kind, kind.lower() + "s")
        self.on_request(verb, f"{resource}/status" if status else resource)

    async def create(self, body):
        self._count("create", body["kind"])
        return True

    async def get(self, kind, namespace, name):
        self._count("get", kind)
        return None

    async def patch(self, kind, namespace, name, patch, *, patch_type="merge", status=False,
                    urgent=False):
        self._count("patch", kind, status)
        return True

    async def delete(self, kind, namespace, name, *, uid=None):
        self._count("delete", kind)
        return True

    async def pod_warnings(self, namespace, pod):
        self._count("list", "Event")
        return []

    async def dry_run_create(self, body):
        self._count("dry-run", body["kind"])

    async def review_token(self, token, audiences):
        self._count("create", "TokenReview")
        return {}

    async def list(self, kind, namespace, label_selector, *, metadata_only=False):
        self._count("list", kind)
        return []


def request_counts(rt: Runtime) -> dict[tuple[str, str], float]:
    return {(s.labels["verb"], s.labels["resource"]): s.value
            for metric in rt.process.metrics.registry.collect() if metric.name == "mlsched_api_requests"
            for s in metric.samples if s.name.endswith("_total")}


def counted_round(rt: Runtime, policy: dict, indexes: tuple, now: float):
    """One real round and the writing of its status records; the API calls it made."""
    before = request_counts(rt)
    node_index, job_index, pod_index, sts_index = indexes
    idx = Indexes(nodes=node_index, pods=pod_index, statefulsets=sts_index, foreign={},
                  mljobs=job_index, policies={(NAMESPACE, "default"): [True]})
    rt.cluster.indexes = idx

    async def round_and_records():
        report = await loop.run_policy_round(rt, policy, idx, now=now)
        await rt.writers.status.flush()
        await rt.writers.objects.flush()  # the interval's record in the retraining dataset
        return report

    report = asyncio.run(round_and_records())
    after = request_counts(rt)
    return report, {k: after[k] - before.get(k, 0) for k in after if after[k] > before.get(k, 0)}


def measure_api_calls(jobs: list[dict]) -> list[tuple[str, dict]]:
    """API calls of a busy round (every job new) and of the steady round after it."""
    rt = Runtime.create(OperatorConfig(record_rate=0), AcceptingApi())
    policy = {"apiVersion": "mlsched.io/v1alpha1", "kind": "SchedulingPolicy",
              "metadata": {"name": "default", "namespace": NAMESPACE, "uid": "policy-uid",
                           "generation": 1},
              "spec": {"allocation": "drf", "placement": "load-balance"}}
    nodes = [node_body(i) for i in range(NODES)]
    now = time.time()
    busy, busy_calls = counted_round(rt, policy, cold_indexes(nodes, jobs, rt.pod_settings), now)

    # The decision runs and is recorded (as the watch would show it by the next round).
    running_sts, pods, recorded = [], [], []
    for j in jobs:
        rec = job_record(j)
        target = busy.targets[rec.name]
        for role in roles_of(rec):
            running_sts.append(statefulset_manifest(rec, role, target.count(role), target.counts,
                                                    rt.pod_settings))
            pods += [pod_body(j, role, k, node) for k, node in enumerate(target.nodes.get(role, ()))]
        recorded.append({**j, "status": {**j["status"], **busy.job_patches.get(rec.name, {})}})
    steady_idx = build_indexes(nodes, recorded, pods, running_sts)
    _, steady_calls = counted_round(rt, policy, steady_idx, now + 1200)
    return [("busy round: 1000 new jobs scaled and placed", busy_calls),
            ("steady round: nothing changed", steady_calls)]


def measure_scale(n_jobs: int, n_nodes: int, repeats: int = 3, gc_defaults: bool = False) -> None:
    """Section 4: snapshot + decide (and the diff) for DRF and DL² on a large cold cluster."""
    from mlsched.controller.process.loop_health import collection_paused, tune_collector
    from mlsched.policies.allocation.dl2 import DL2Policy

    paused = contextlib.nullcontext if gc_defaults else collection_paused
    if not gc_defaults:
        tune_collector()
    rng = random.Random(11)
    jobs = [job_body(i, rng) for i in range(n_jobs)]
    nodes = [node_body(i) for i in range(n_nodes)]
    indexes = cold_indexes(nodes, jobs)
    if not gc_defaults:  # the operator's watcher freezes the survivors of a full collection
        gc.collect()
        gc.freeze()
    print(f"Collector: {'CPython defaults' if gc_defaults else 'as the operator runs it'}")
    pod_index, sts_index = indexes[2], indexes[3]
    placement = registry.make_placement("load-balance")
    print(f"Decision round at scale: {n_jobs} MLJobs (all new) on {n_nodes} nodes, load-balance "
          f"placement; best of {repeats} [median]")
    print(f"  {'':<22} {'snapshot':>9} {'decide':>9} {'snap+decide':>12} {'target':>7} {'ratio':>7}"
          f" {'diff':>9}  tasks / inferences")
    # Under a namespace ResourceQuota (a budget far above what the round books) every fit is
    # checked through the ledger, as with node filters, host ports or counted pod slots.
    quota = np.array([1e9, 1e9, 1e12, np.inf, np.inf, 1e9])
    dl2 = DL2Policy.load(None)
    for name, allocation, budget in (("drf", registry.make_allocation("drf"), None),
                                     ("dl2", dl2, None), ("dl2 under a quota", dl2, quota)):
        rows = []
        for _ in range(repeats):
            clear_hash_cache()
            with paused():
                t0 = time.perf_counter()
                js, snap = snapshot_of(*indexes)
                if budget is not None:
                    snap = dataclasses.replace(snap, budget=budget)
                t1 = time.perf_counter()
                decision = run_served_round(snap, allocation, placement)
            t2 = time.perf_counter()  # after the pause: with the young collection it deferred
            plan_all(js, job_targets(decision, snap), pod_index, sts_index)
            t3 = time.perf_counter()
            tasks = sum(d.ps + d.workers for d in decision.jobs.values())
            rows.append(((t1 - t0) * 1000, (t2 - t1) * 1000, (t2 - t0) * 1000, (t3 - t2) * 1000,
                         tasks, decision.inferences))
        best = min(rows, key=lambda r: r[2])
        median = statistics.median(r[2] for r in rows)
        label = f"{name} (round)" if budget is None else name
        print(f"  {label:<22} {best[0]:>9.0f} {best[1]:>9.0f} {best[2]:>12.0f} {SCALE_TARGET_MS:>7.0f} "
              f"{best[2] / SCALE_TARGET_MS:>6.2f}x {best[3]:>9.0f}  {best[4]} / {best[5]}  [{median:.0f}]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale-jobs", type=int, default=10_000)
    parser.add_argument("--scale-nodes", type=int, default=5_000)
    parser.add_argument("--only-scale", action="store_true", help="section 4 only")
    parser.add_argument("--gc-defaults", action="store_true",
                        help="section 4 with CPython's collector settings, not the operator's")
    args = parser.parse_args()
    if args.only_scale:
        measure_scale(args.scale_jobs, args.scale_nodes, gc_defaults=args.gc_defaults)
        return
    rng = random.Random(7)
    base_rss = rss_mb()
    jobs = [job_body(i, rng) for i in range(JOBS)]
    rows, indexes = measure_rounds(jobs)
    print(f"  {'':<52} {'ms':>8} {'target':>7} {'ratio':>7}")
    for label, best, median, note in rows:
        print(f"  {label:<52} {best:>8.1f} {ROUND_TARGET_MS:>7.0f} {best / ROUND_TARGET_MS:>6.2f}x  "
              f"[{median:.1f}]  {note}")

    print(f"API calls per round (mlsched_api_requests_total), {JOBS} jobs, records included:")
    for label, calls in measure_api_calls(jobs):
        detail = ", ".join(f"{verb} {resource} {n:.0f}" for (verb, resource), n in sorted(calls.items()))
        print(f"  {label:<52} {sum(calls.values()):>8.0f}  ({detail})")

    # Memory: what the running operator holds, `indexes` and the MLJob bodies in `jobs` (kopf
    # keeps those for the per-job timers). Raw pod/node/StatefulSet bodies are garbage by now:
    # kopf keeps index values only.
    gc.collect()
    rss = rss_mb()
    print(f"  {'RSS holding the indexes + MLJob bodies (MB)':<52} {rss:>8.1f} {RSS_TARGET_MB:>7.0f} "
          f"{rss / RSS_TARGET_MB:>6.2f}x  (imports alone {base_rss:.0f} MB; "
          f"{sum(len(v) for v in indexes[2].values())} pod records held)")
    del jobs, indexes
    gc.collect()
    measure_scale(args.scale_jobs, args.scale_nodes, gc_defaults=args.gc_defaults)


if __name__ == "__main__":
    main()

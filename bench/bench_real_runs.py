"""Sim-to-real (issue 53): a small trace of the reference training jobs run on the real node
under each policy, then the same trace in the simulator calibrated from the run's records.

    python bench/bench_real_runs.py [--policies drf dl2] [--out bench/real_runs] [--repeat N]
    python bench/bench_real_runs.py --compare-only bench/real_runs   # the simulator side again

What runs (root, e2e/real_node.py's requirements; the images are built from this checkout and
cached, e2e/build_images.sh):

1. A control plane with one real node (e2e/real_cluster.py), the operator installed from its
   image as a user installs it. The node is given 4 `nvidia.com/gpu` the way an admin
   advertises an extended resource (a PATCH of the node's status): the node has no GPU, but the
   policies plan with GPUs, and a scarce resource is what makes them choose. Each worker asks
   for one; PS and workers 100m CPU.
2. For each policy, a SchedulingPolicy deciding every `--interval` seconds and `TRACE`'s jobs
   created at their arrival offsets: the reference programs (examples/pytorch), padded to a
   per-model cost per sample (EXAMPLE_SAMPLE_COST_S, the compute of a bigger model divided
   among the workers) and labelled with a catalog model type so that the policies have priors.
   Each job may use 1-3 workers (and 1-2 PS). The run records, per job: created, started and
   completed times, its interval history (counts, epochs, measured samples/s), its rescales
   (count and seconds); and the policy's interval records (the retraining dataset).
3. The simulator side (`compare`): the same trace, arrivals as they were created, in
   `Simulator` with one node of the real node's free capacity, the same interval, the
   scaling cost measured (the run's mean rescale seconds) and each model's speed factor
   calibrated from the run's own interval records (policy_models/retrain/calibration.py, as
   `mlsched retrain` does). Per job and on average: real JCT, simulated JCT, error.

Writes `<out>/run.json` (what was measured), `<out>/records/<policy>/*.json.gz` (interval
records, readable by `mlsched retrain --records DIR`) and `<out>/fidelity.json`, and prints the
table. Wall time: the node's start (about 3 minutes, plus an image rebuild after an edit to
operator/) and about 5-8 minutes per policy on a 2-core machine. Not run in CI (it needs the
machine to itself: the jobs' speeds are real).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "e2e"))  # the real node's harness

from policy_models.retrain.fidelity import RealJob, compare, print_table  # noqa: E402
from policy_models.retrain.workload import seconds_of  # noqa: E402

GPUS = 4  # the extended resource the bench advertises on the node
INTERVAL_S = 10
SAMPLE_COST_S = {"resnet-50": 0.004, "inception-bn": 0.003}  # seconds per sample trained
PROGRAM = {"ParameterServer": "parameter_server.py", "AllReduce": "allreduce.py"}
GLOBAL_BATCH = 64

# name, architecture, model type, epochs, arrival offset (s): both architectures, sizes from
# 6 to 20 epochs (about 5 s an epoch at one worker), arrivals over 2.5 minutes.
TRACE = (
    RealJob("ps-a", "ParameterServer", "resnet-50", 14, 0),
    RealJob("ar-a", "AllReduce", "inception-bn", 20, 0),
    RealJob("ps-b", "ParameterServer", "resnet-50", 8, 30),
    RealJob("ar-b", "AllReduce", "inception-bn", 10, 60),
    RealJob("ps-c", "ParameterServer", "resnet-50", 20, 100),
    RealJob("ar-c", "AllReduce", "inception-bn", 6, 150),
)
MAX_WORKERS, MAX_PS = 3, 2


def seeded_trace(seed: int, jobs: int = 6) -> tuple[RealJob, ...]:
    """Another trace of the same kind (--trace-seed): the architectures alternating, 6-20
    epochs, Poisson arrivals 30 s apart on average, the first at 0."""
    import numpy as np
    rng = np.random.default_rng(seed)
    arrivals = np.concatenate([[0.0], np.cumsum(rng.exponential(30.0, jobs - 1))])
    out = []
    for i in range(jobs):
        ps = i % 2 == 0
        out.append(RealJob(f"{'ps' if ps else 'ar'}-{chr(ord('a') + i // 2)}",
                           "ParameterServer" if ps else "AllReduce",
                           "resnet-50" if ps else "inception-bn",
                           int(rng.integers(6, 21)), round(float(arrivals[i]), 1)))
    return tuple(out)


def mljob(job: RealJob, policy: str, claim: str, image: str,
          counts: dict[str, int] | None = None, sample_cost_s: float | None = None) -> dict:
    """The MLJob of a trace job: 1-3 workers (and 1-2 PS), or exactly `counts`."""
    roles = {"worker": (1, MAX_WORKERS)}
    if job.architecture == "ParameterServer":
        roles = {"ps": (1, MAX_PS), **roles}
    if counts:
        roles = {role: (n, n) for role, n in counts.items()}
    cost = SAMPLE_COST_S[job.model] if sample_cost_s is None else sample_cost_s

    def template(role: str) -> dict:
        requests = {"cpu": "100m", "memory": "256Mi"}
        if role == "worker":
            requests["nvidia.com/gpu"] = "1"
        limits = {"memory": "2Gi", **({"nvidia.com/gpu": "1"} if role == "worker" else {})}
        return {"spec": {
            "securityContext": {"fsGroup": 10001},
            "volumes": [{"name": "checkpoint", "persistentVolumeClaim": {"claimName": claim}}],
            "containers": [{
                "name": role, "image": image, "imagePullPolicy": "Never",
                "command": ["python", f"/opt/mlsched/examples/pytorch/{PROGRAM[job.architecture]}"],
                "args": ["--global-batch-size", str(GLOBAL_BATCH), "--report-interval", "2"],
                "env": [{"name": "OMP_NUM_THREADS", "value": "1"},
                        {"name": "EXAMPLE_SAMPLE_COST_S", "value": str(cost)}],
                "volumeMounts": [{"name": "checkpoint", "mountPath": "/checkpoint"}],
                "resources": {"requests": requests, "limits": limits}}]}}

    return {"apiVersion": "mlsched.io/v1alpha1", "kind": "MLJob",
            "metadata": {"name": f"{policy}-{job.name}"},
            "spec": {"modelType": job.model, "architecture": job.architecture,
                     "epochs": job.epochs, "globalBatchSize": GLOBAL_BATCH,
                     "schedulingPolicy": policy,
                     "replicaSpecs": {role: {"min": lo, "max": hi, "template": template(role)}
                                      for role, (lo, hi) in roles.items()}}}


def scheduling_policy(name: str, allocation: str, interval: int) -> dict:
    spec = {"allocation": allocation, "placement": "load-balance", "interval": interval,
            "historyLimit": 200}
    if allocation not in ("drf", "fifo", "srtf", "tetris", "optimus"):
        spec["fallback"] = "drf"
        spec["updatePolicy"] = "Auto"  # serves what `mlsched retrain` publishes (--retrain-min)
    return {"apiVersion": "mlsched.io/v1alpha1", "kind": "SchedulingPolicy",
            "metadata": {"name": name}, "spec": spec}


def advertise_gpus(cluster, count: int) -> None:
    """What an admin does for an extended resource the kubelet does not manage: the node's
    status.capacity gets it; the kubelet's next status update adds it to allocatable."""
    import real_node
    from kubernetes import client
    from waiting import wait_for
    api = cluster.api_client()
    try:
        core = client.CoreV1Api(api)
        core.patch_node_status(real_node.NAME, {"status": {"capacity": {"nvidia.com/gpu": str(count)}}})
        wait_for(lambda: core.read_node(real_node.NAME).status.allocatable.get("nvidia.com/gpu") == str(count),
                 120, f"{count} nvidia.com/gpu allocatable on the node", interval=1)
    finally:
        api.close()


def node_free(cluster) -> dict:
    """The real node's allocatable less what the operator's pods request: what the jobs get."""
    import real_node
    from kubernetes import client
    from mlsched.controller.objects.quantities import parse_quantity
    api = cluster.api_client()
    try:
        core = client.CoreV1Api(api)
        node = core.read_node(real_node.NAME)
        free = {k: float(parse_quantity(v)) for k, v in node.status.allocatable.items()
                if k in ("cpu", "memory", "nvidia.com/gpu")}
        for pod in core.list_pod_for_all_namespaces().items:
            if pod.spec.node_name != real_node.NAME or pod.status.phase in ("Succeeded", "Failed"):
                continue
            for c in pod.spec.containers:
                for k, v in ((c.resources and c.resources.requests) or {}).items():
                    if k in free:
                        free[k] -= float(parse_quantity(v))
        return free
    finally:
        api.close()


def run_policy(cluster, trace: tuple[RealJob, ...], allocation: str, interval: int, out: Path,
               label: str | None = None, after_interval: int = -1) -> dict:
    """The trace under one policy on the real node: what each job measured, and the policy's
    records after `after_interval`. `label` (default: the allocation) names the jobs and the
    records' directory; a label other than the allocation reruns the policy that exists."""
    from kubernetes import client

    from mlsched.formats import dataset_store
    from mlsched_objects import MLSched
    from real_cluster import JOBS_NAMESPACE, TRAINING_IMAGE, claim_with_volume
    from waiting import wait_for

    policy, label = f"real-{allocation}", label or allocation
    prefix = f"real-{label}"
    api = cluster.api_client()
    objects = MLSched(api, JOBS_NAMESPACE)
    if objects.policy(policy) is None:
        objects.create(scheduling_policy(policy, allocation, interval))
    claims = {job.name: claim_with_volume(cluster, f"{prefix}-{job.name}")[0] for job in trace}
    started = time.time()
    pending = sorted(trace, key=lambda j: j.arrival_s)
    seen: dict[str, dict] = {}

    def step():
        now = time.time() - started
        while pending and pending[0].arrival_s <= now:
            job = pending.pop(0)
            body = mljob(job, policy, claims[job.name], TRAINING_IMAGE)
            body["metadata"]["name"] = f"{prefix}-{job.name}"
            objects.create(body)
            print(f"[{now:6.1f} s] {policy}: created {job.name}", file=sys.stderr)
        done = 0
        for job in trace:
            found = objects.job(f"{prefix}-{job.name}")
            status = (found or {}).get("status") or {}
            phase = status.get("phase")
            if phase == "Failed":
                raise RuntimeError(f"{prefix}-{job.name} failed: {status.get('conditions')}")
            if found and seen.get(job.name, {}).get("phase") != phase:
                print(f"[{now:6.1f} s] {prefix}-{job.name}: {phase}", file=sys.stderr)
            if found:
                seen[job.name] = {"phase": phase}
            done += phase == "Succeeded"
        return not pending and done == len(trace)

    wait_for(step, 1800, f"every job of the trace Succeeded under {policy}", interval=2,
             describe=lambda: seen)
    wall = time.time() - started
    jobs = {}
    for job in trace:
        found = objects.job(f"{prefix}-{job.name}")
        status = found["status"]
        rescales = status.get("rescales") or {}
        jobs[job.name] = {
            "created_s": seconds_of(found["metadata"]["creationTimestamp"]),
            "started_s": seconds_of(status["startTime"]),
            "completed_s": seconds_of(status["completionTime"]),
            "rescales": rescales.get("count", 0), "rescale_seconds": rescales.get("seconds", 0.0),
            "history": status.get("history") or [],
        }
    # After `after_interval`, and holding this run's jobs: the interval that closed after the
    # previous run of the policy ended may hold only that run's last job.
    records = [r for r in dataset_store.list_records(client.CoreV1Api(api), JOBS_NAMESPACE, policy)
               if r.interval > after_interval and any(j.name.startswith(f"{prefix}-") for j in r.jobs)]
    directory = out / "records" / label
    directory.mkdir(parents=True, exist_ok=True)
    for record in records:
        (directory / f"{record.interval:05d}.json.gz").write_bytes(record.to_bytes())
    api.close()
    return {"policy": policy, "allocation": allocation, "label": label, "wall_s": wall,
            "jobs": jobs, "records": len(records),
            "last_interval": max((r.interval for r in records), default=after_interval),
            "active_model": ((objects.policy(policy) or {}).get("status") or {}).get("activeModels")}


def retrain(cluster, minutes: float, policy: str = "real-dl2") -> dict:
    """`mlsched retrain dl2` on the policy's records in the cluster, as the retraining Job runs
    it (the cluster's admin credentials here); when it publishes, the policy (updatePolicy
    Auto) serves the new version from its next round: waited for. Its report, and whether
    the policy serves it."""
    import subprocess

    from mlsched_objects import MLSched
    from real_cluster import JOBS_NAMESPACE
    from waiting import wait_for

    started = time.time()
    done = subprocess.run(
        [str(Path(sys.executable).parent / "mlsched"), "retrain", "dl2", "--namespace", JOBS_NAMESPACE,
         "--policy", policy, "--time-budget-min", str(minutes), "--min-samples", "3"],
        env={**os.environ, "KUBECONFIG": str(cluster.plane.kubeconfig_path)},
        capture_output=True, text=True, timeout=1800)
    print(done.stderr[-3000:], file=sys.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"mlsched retrain exited {done.returncode}:\n{done.stderr[-3000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    found = {"report": report, "log": done.stderr.strip().splitlines()[-12:], "wall_s": time.time() - started}
    if report.get("status") == "published":
        api = cluster.api_client()
        objects = MLSched(api, JOBS_NAMESPACE)

        def serving():
            status = (objects.policy(policy) or {}).get("status") or {}
            return status.get("modelVersion") == f"dl2 v{report['version']}" and status

        try:
            status = wait_for(serving, 120, f"{policy} serving the published version", interval=2)
            found["adopted"] = status.get("modelVersion")
        finally:
            api.close()
    return found


# ------------------------------------------------------------------ co-located pairs

PAIR_JOBS = {"ps": (RealJob("ps", "ParameterServer", "resnet-50", 10000, 0), {"ps": 1, "worker": 2}),
             "ar": (RealJob("ar", "AllReduce", "inception-bn", 10000, 0), {"worker": 2})}
PAIRS = (("ps",), ("ar",), ("ps", "ps"), ("ar", "ar"), ("ps", "ar"))


def measure_together(cluster, names: tuple[str, ...], padded: bool, warmup_s: float,
                     window_s: float, tag: str) -> list[float]:
    """Epochs/s of each job of `names` running side by side on the node, measured over
    `window_s` once all have reported for `warmup_s`: the growth of status.progress.epochsDone
    (the pods' reports)."""
    from mlsched_objects import MLSched
    from real_cluster import JOBS_NAMESPACE, TRAINING_IMAGE, claim_with_volume
    from waiting import wait_for

    api = cluster.api_client()
    objects = MLSched(api, JOBS_NAMESPACE)
    made = []
    for i, name in enumerate(names):
        job, counts = PAIR_JOBS[name]
        full = f"{tag}-{i}-{name}"
        claim = claim_with_volume(cluster, full)[0]
        body = mljob(job, "real-pairs", claim, TRAINING_IMAGE, counts=counts,
                     sample_cost_s=None if padded else 0.0)
        body["metadata"]["name"] = full
        objects.create(body)
        made.append(full)

    def done_epochs():
        return [((objects.job(n) or {}).get("status") or {}).get("progress", {}).get("epochsDone") or 0.0
                for n in made]

    wait_for(lambda: all(e > 0 for e in done_epochs()), 300, f"{made} reporting progress",
             interval=1, describe=done_epochs)
    time.sleep(warmup_s)
    first, t0 = done_epochs(), time.monotonic()
    time.sleep(window_s)
    last, t1 = done_epochs(), time.monotonic()
    for n in made:
        cluster.kubectl("delete", "mljob", n, "-n", JOBS_NAMESPACE, "--wait=true", "--timeout=120s",
                        check=False)
    wait_for(lambda: not [p for p in cluster.kubectl(
        "get", "pods", "-n", JOBS_NAMESPACE, "-o", "name").stdout.split() if tag in p],
        180, f"the pods of {made} gone", interval=1)
    api.close()
    return [(b - a) / (t1 - t0) for a, b in zip(first, last)]


def measure_pairs(cluster, padded: bool, warmup_s: float = 20, window_s: float = 40) -> dict:
    """Each reference job alone and in pairs on the node: each side's slowdown against alone,
    beside what workloads/interference.py predicts for the same tasks on a node of this
    node's cores."""
    from mlsched.workloads import interference
    from mlsched_objects import MLSched
    from real_cluster import JOBS_NAMESPACE

    api = cluster.api_client()
    objects = MLSched(api, JOBS_NAMESPACE)
    if objects.policy("real-pairs") is None:  # fixed counts: the policy only admits them
        objects.create(scheduling_policy("real-pairs", "drf", INTERVAL_S))
    api.close()
    cpus = node_free(cluster)["cpu"]
    alone, rows = {}, []
    for names in PAIRS:
        tag = f"pair{'p' if padded else 'u'}{len(rows) + len(alone)}"
        speeds = measure_together(cluster, names, padded, warmup_s, window_s, tag)
        print(f"[bench] {'padded' if padded else 'unpadded'} {names}: {speeds} epochs/s", file=sys.stderr)
        if len(names) == 1:
            alone[names[0]] = speeds[0]
            continue
        placements = {f"{i}": (PAIR_JOBS[n][0].model, [0] * sum(PAIR_JOBS[n][1].values()))
                      for i, n in enumerate(names)}
        predicted = interference.job_speed_factors(
            placements, capacity=interference.node_capacity(cpus))
        rows.append({"pair": list(names), "models": [PAIR_JOBS[n][0].model for n in names], "speeds": speeds,
                     "measured_slowdown": [round(1 - v / alone[n], 4) for v, n in zip(speeds, names)],
                     "predicted_slowdown": [round(1 - predicted[f"{i}"], 4) for i in range(len(names))]})
    return {"padded": padded, "alone": alone, "pairs": rows, "node_cpus": cpus}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", nargs="+", default=["drf", "dl2"])
    parser.add_argument("--interval", type=int, default=INTERVAL_S)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "real_runs")
    parser.add_argument("--no-pairs", action="store_true", help="skip the co-located pairs")
    parser.add_argument("--trace-seed", type=int,
                        help="another trace of the same kind, drawn from this seed (default: TRACE)")
    parser.add_argument("--pairs-from", type=Path, metavar="RUN_JSON",
                        help="with --no-pairs: the pairs measured by an earlier run (the same "
                             "programs on the same node), for the simulator's interference")
    parser.add_argument("--retrain-min", type=float, default=2.0,
                        help="`mlsched retrain dl2` on the dl2 run's records for this many "
                             "minutes, and the trace again under what it published (0: no)")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="run the trace N times under each policy: the runs after the first "
                             "say how far the node reproduces itself (fidelity's repeatability)")
    parser.add_argument("--compare-only", type=Path, metavar="DIR",
                        help="no real run: the simulator side of an earlier run's DIR")
    args = parser.parse_args()
    if args.compare_only:
        out = args.compare_only
        if not (out / "run.json").is_file() or not (out / "records").is_dir():
            parser.error(f"--compare-only {out}: no run.json and records/ there; give the --out "
                         "directory of an earlier run (bench/real_runs holds one)")
    else:
        from real_cluster import install_operator, real_cluster, wait_operator_ready

        out = args.out
        out.mkdir(parents=True, exist_ok=True)
        trace = TRACE if args.trace_seed is None else seeded_trace(args.trace_seed)
        print(f"[bench] trace: {[asdict(j) for j in trace]}", file=sys.stderr)
        begun = time.time()
        with real_cluster() as cluster:
            install_operator(cluster)
            wait_operator_ready(cluster, 300)
            advertise_gpus(cluster, GPUS)
            free = node_free(cluster)
            print(f"[bench] node up in {time.time() - begun:.0f} s; free for jobs: {free}",
                  file=sys.stderr)
            runs, repeats = [], []
            for allocation in args.policies:
                runs.append(run_policy(cluster, trace, allocation, args.interval, out))
                last = runs[-1]["last_interval"]
                for again in range(2, args.repeat + 1):
                    repeats.append(run_policy(cluster, trace, allocation, args.interval, out,
                                              label=f"{allocation}-r{again}", after_interval=last))
                    last = repeats[-1]["last_interval"]
            retrained = None
            if args.retrain_min > 0 and "dl2" in args.policies:
                retrained = retrain(cluster, args.retrain_min)
                if retrained.get("adopted"):
                    last = retrained["report"]["evaluation"]["trained_through_interval"]
                    retrained["rerun"] = run_policy(cluster, trace, "dl2", args.interval, out,
                                                    label="dl2-retrained", after_interval=last)
            pairs = [] if args.no_pairs else [measure_pairs(cluster, padded) for padded in (True, False)]
        if args.pairs_from:
            pairs = json.loads(args.pairs_from.read_text())["pairs"]
        doc = {"format": "mlsched.io/real-runs", "version": 1,
               "trace": [asdict(j) for j in trace], "trace_seed": args.trace_seed,
               "interval_s": args.interval,
               "sample_cost_s": SAMPLE_COST_S, "max_workers": MAX_WORKERS, "max_ps": MAX_PS,
               "node_free": free, "wall_s": time.time() - begun, "runs": runs, "repeats": repeats,
               "pairs": pairs,
               "pairs_from": str(args.pairs_from) if args.pairs_from else None,
               "retrained": retrained}
        (out / "run.json").write_text(json.dumps(doc, indent=1) + "\n")
    result = compare(json.loads((out / "run.json").read_text()), out / "records")
    (out / "fidelity.json").write_text(json.dumps(result, indent=1) + "\n")
    print_table(result)
    doc = json.loads((out / "run.json").read_text())
    retrained = doc.get("retrained")
    if retrained:
        report = retrained["report"]
        print(f"\nmlsched retrain dl2 on the dl2 run's records ({retrained['wall_s']:.0f} s): "
              f"{report['status']}, candidate / active {report['evaluation']['ratio']:.4f} on "
              f"{report['evaluation']['traces']} held-out traces of the recorded workload in the "
              f"calibrated simulator; served: {retrained.get('adopted')}")
        rerun = retrained.get("rerun")
        if rerun:
            shipped = next(r for r in doc["runs"] if r["allocation"] == "dl2")
            def avg(run):
                return sum(j["completed_s"] - j["created_s"] for j in run["jobs"].values()) / len(run["jobs"])
            print(f"  the trace again on the real node under it: avg JCT {avg(rerun):.0f} s "
                  f"(shipped model: {avg(shipped):.0f} s, ratio {avg(rerun) / avg(shipped):.3f})")
    for found in doc.get("pairs") or []:
        print(f"\nco-located pairs ({'padded' if found['padded'] else 'unpadded'}), "
              f"alone: {found['alone']} epochs/s")
        for row in found["pairs"]:
            print(f"  {' + '.join(row['pair']):8} slowdown measured {row['measured_slowdown']}, "
                  f"predicted {row['predicted_slowdown']}")


if __name__ == "__main__":
    main()

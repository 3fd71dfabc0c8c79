"""Garbage collection while 2,000 MLJobs arrive: the default collector against the operator's
tuning (`controller/process/loop_health.py`: a larger young threshold, the imports frozen at startup,
the survivors of each full collection frozen by the loop watcher).

Each arrival does in process what the operator keeps for a job: the MLJob body (kopf keeps it
for the per-job timers) and the index records of the job and of its pods (built from raw pod
bodies, which are garbage afterwards, as kopf keeps index values only), plus the per-event
garbage of a watch event (a deep copy of the body). Arrivals come in batches of 20 with the
event loop free in between, and `LoopHealth.watch` runs beside them as in the operator, so its
lag probe measures what the collector does to every other task.

Printed: total and longest collector pause, full collections, the worst event-loop lag, and
the ratios tuned / default (< 1: the tuning helps). Both runs in one process, default first;
the tuning is undone between them. Run: `python bench/bench_gc.py [--jobs 2000]`.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_operator import NAMESPACE, job_body, pod_body  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from mlsched.controller.process import loop_health  # noqa: E402
from mlsched.controller.process.loop_health import LoopHealth  # noqa: E402
from mlsched.controller.objects.records import pod_record
from mlsched.controller.objects.job_records import job_record

BATCH = 20
PODS_PER_JOB = 5


async def arrivals(n_jobs: int, health: LoopHealth) -> dict:
    rng = random.Random(11)
    kept_bodies, job_index, pod_index = [], {}, {}
    stopped = asyncio.Event()
    watcher = asyncio.create_task(health.watch(stopped))
    await asyncio.sleep(loop_health.PERIOD_S)
    paused0, full0 = health.gc.paused_s, health.gc.full_collections
    started = time.perf_counter()
    for i in range(n_jobs):
        body = job_body(i, rng)
        copy.deepcopy(body)  # a watch event's per-event copies: garbage at once
        kept_bodies.append(body)
        job_index[(NAMESPACE, body["metadata"]["name"])] = [job_record(body)]
        pod_index[(NAMESPACE, body["metadata"]["name"])] = [
            pod_record(pod_body(body, "worker", k, f"node-{k:04d}")) for k in range(PODS_PER_JOB)]
        if i % BATCH == BATCH - 1:
            await asyncio.sleep(0.01)
    wall = time.perf_counter() - started
    await asyncio.sleep(loop_health.PERIOD_S * 2)
    stopped.set()
    await watcher
    return {"wall_s": wall, "paused_s": health.gc.paused_s - paused0,
            "full": health.gc.full_collections - full0, "longest_s": health.gc.longest_s,
            "worst_lag_s": health.worst_s}


def run(n_jobs: int, tuned: bool) -> dict:
    threshold = gc.get_threshold()
    gc.collect()
    if tuned:
        loop_health.tune_collector()
    try:
        return asyncio.run(arrivals(n_jobs, LoopHealth(CollectorRegistry())))
    finally:
        loop_health._tuned = False
        gc.unfreeze()
        gc.set_threshold(*threshold)
        gc.collect()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2000)
    args = parser.parse_args()
    default = run(args.jobs, tuned=False)
    tuned = run(args.jobs, tuned=True)
    print(f"{args.jobs} MLJobs arriving ({PODS_PER_JOB} pods each, batches of {BATCH}):")
    print(f"  {'':<36} {'default':>9} {'tuned':>9} {'ratio':>7}")
    for key, label in (("paused_s", "collector pauses, total (s)"),
                       ("longest_s", "longest collector pause (s)"),
                       ("worst_lag_s", "worst event-loop lag (s)"),
                       ("full", "full collections"), ("wall_s", "arrivals wall time (s)")):
        a, b = default[key], tuned[key]
        ratio = f"{b / a:>6.2f}x" if a else "     -"
        print(f"  {label:<36} {a:>9.3f} {b:>9.3f} {ratio}")


if __name__ == "__main__":
    main()

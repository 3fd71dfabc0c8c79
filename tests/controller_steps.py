"""Controller steps shared by the tests: a scheduling round and an admission step run as the
loop runs them (waiting for what they recorded), a settled cluster, the lifecycle timer once
for a job, and the small scenarios several modules start from. A helper module, not a test
module: tests import it (`from controller_steps import ...`). The loop's functions are looked up
at call time (`loop.run_policy_round`), so a test that replaces them is seen here too.
"""

from __future__ import annotations

from mlsched.api import get_condition
from mlsched.controller.app import job_lifecycle, pod_events
from mlsched.controller.progress.progress_server import record_progress
from mlsched.controller.scheduling import loop
from mlsched.formats import dataset_store as store
from builders import NOW, NS, allreduce_job, cluster, create_jobs, make_runtime, policy, ps_job, recorded, run


# ---- a scheduling round and an admission step ---------------------------------------------------
def round_(rt, kube, name="default", now=NOW, timeout=10.0):
    return recorded(rt, loop.run_policy_round(rt, kube.obj("SchedulingPolicy", NS, name), kube.indexes(), now=now),
                    timeout)


def settle(rt, kube):
    """Let the fake controllers act and the pod handler pin what they created."""
    kube.settle()
    for p in kube.of_kind("Pod"):
        run(pod_events.on_pod_event(rt, "ADDED", p, kube.indexes()))
    kube.settle()


def setup(nodes=4, policies=(policy(),), job_bodies=None):
    rt, kube = make_runtime(cluster(nodes))
    for p in policies:
        kube.put(p)
    run(create_jobs(rt, kube, *(job_bodies or [ps_job("bert", max_workers=4), allreduce_job("ring", max_workers=4)])))
    return rt, kube


def two_policies_under_one_quota(nodes: int, a_min_workers: int):
    """Policies a and b of one namespace with a job each (a1, b1: up to 4 workers; b1 at least
    2) and a 4-GPU ResourceQuota whose own count shows nothing used."""
    rt, kube = setup(nodes=nodes, policies=(policy("a"), policy("b")),
                     job_bodies=[ps_job("a1", policy="a", min_workers=a_min_workers, max_workers=4),
                                 ps_job("b1", policy="b", min_workers=2, max_workers=4)])
    kube.put({"apiVersion": "v1", "kind": "ResourceQuota",
              "metadata": {"name": "gpus", "namespace": NS},
              "spec": {"hard": {"requests.nvidia.com/gpu": "4"}}, "status": {"used": {}}})
    return rt, kube


def admit(rt, kube, name="default", now=NOW + 30):
    return recorded(rt, loop.run_policy_admission(rt, kube.obj("SchedulingPolicy", NS, name), kube.indexes(), now=now))


# ---- an MLJob's lifecycle ------------------------------------------------------------------------
def sync(rt, kube, name, now=None):
    """Run the lifecycle timer once for a job and apply its status patch, like kopf would."""
    body = kube.obj("MLJob", NS, name)
    patch: dict = {}
    outcome = run(job_lifecycle.sync_lifecycle(rt, body, kube.indexes(), patch, now=now))
    if patch:
        run(kube.patch("MLJob", NS, name, patch, status=True))
    return outcome


def status(kube, name):
    return kube.obj("MLJob", NS, name).get("status") or {}


def cond(kube, name, type_):
    return get_condition(status(kube, name).get("conditions"), type_)


def scheduled(names=("bert",), **job_kw):
    """A cluster with a default policy, jobs created and one round applied and settled."""
    rt, kube = make_runtime(cluster(4))
    kube.put(policy())
    run(create_jobs(rt, kube, *(ps_job(n, **job_kw) for n in names)))
    run(loop.run_policy_round(rt, kube.obj("SchedulingPolicy", NS, "default"), kube.indexes(), now=NOW))
    kube.settle()
    for p in kube.of_kind("Pod"):
        run(pod_events.on_pod_event(rt, "ADDED", p, kube.indexes()))
    kube.settle()
    return rt, kube


# ---- the retraining dataset ----------------------------------------------------------------------
def dataset_step(rt, kube, now, name="default", admission=False):
    """A round (or admission step) with everything it queued written."""
    async def go():
        body = kube.obj("SchedulingPolicy", NS, name)
        fn = loop.run_policy_admission if admission else loop.run_policy_round
        result = await fn(rt, body, kube.indexes(), now=now)
        assert await rt.writers.status.flush(10) and await rt.writers.objects.flush(10)
        return result

    return run(go())


def report_epochs(rt, kube, job, epochs):
    """The job's pods report `epochs` done (through the progress endpoint's recorder)."""
    run(record_progress(rt, kube.indexes().job(NS, job), epochs, None, now=NOW))


def dataset_records(kube, include_open=False):
    """The retraining dataset's records in the cluster's ConfigMaps."""
    return store.read_records(kube.of_kind("ConfigMap"), include_open)


def dataset_setup(**spec):
    """A 4-node cluster, a default policy with `spec`, jobs a (100 epochs) and b (40)."""
    rt, kube = make_runtime(cluster(4))
    kube.put(policy(**spec))
    run(create_jobs(rt, kube, ps_job("a", epochs=100), ps_job("b", epochs=40)))
    rt.cluster.indexes = kube.indexes()
    return rt, kube

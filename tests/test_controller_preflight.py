"""Dry-run creates of a job's pods before it is given capacity (controller/objects/preflight.py), against
the in-memory API whose `pod_admission` plays Pod Security, a missing ServiceAccount or a
webhook for dry runs and for the StatefulSet controller alike."""

from __future__ import annotations

import pytest

from mlsched.api import get_condition
from mlsched.controller.app import job_lifecycle, jobs, pod_problems
from mlsched.controller.scheduling import loop
from mlsched.controller.objects import preflight
from mlsched.controller.kube.kube import KubeError
from builders import NOW, NS, cluster, create_jobs, make_runtime, policy, ps_job, run

MISSING_SA = ('pods "{pod}" is forbidden: error looking up service account team-a/tyop: '
              'serviceaccount "tyop" not found')


def refuse_service_account(pod: dict) -> str | None:
    """What the ServiceAccount admission plugin says about a pod naming one that is missing."""
    if pod["spec"].get("serviceAccountName") == "tyop":
        return MISSING_SA.format(pod=pod["metadata"]["name"])
    return None


def typo_job(name: str, **kw) -> dict:
    body = ps_job(name, **kw)
    for role in body["spec"]["replicaSpecs"].values():
        role["template"]["spec"]["serviceAccountName"] = "tyop"
    return body


def sync(rt, kube, name):
    body = kube.obj("MLJob", NS, name)
    patch: dict = {}
    run(job_lifecycle.sync_lifecycle(rt, body, kube.indexes(), patch))
    if patch:
        run(kube.patch("MLJob", NS, name, patch, status=True))


def running(kube, name):
    return get_condition((kube.obj("MLJob", NS, name).get("status") or {}).get("conditions"), "Running")


def replicas(kube, name):
    return {s["metadata"]["name"]: s["spec"]["replicas"] for s in kube.of_kind("StatefulSet")
            if s["metadata"]["name"].startswith(name + "-")}


def round_(rt, kube):
    return run(loop.run_policy_round(rt, kube.obj("SchedulingPolicy", NS, "default"),
                                     kube.indexes(), now=NOW))


def dry_runs(kube):
    return [c for c in kube.calls if c[0] == "dry-run"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("status,message,kind", [
    (403, 'pods "x-0" is forbidden: violates PodSecurity "restricted:latest": runAsNonRoot != true',
     "refused"),
    (403, MISSING_SA.format(pod="x-0"), "refused"),
    (400, 'admission webhook "gpu.example.com" denied the request: at most 2 GPUs', "refused"),
    (422, 'Pod "x-0" is invalid: spec.hostname: Invalid value', "refused"),
    # kube-apiserver 1.34's words for a ValidatingAdmissionPolicy (422 for an admin, 403 here).
    (422, 'The pods "g-worker-0" is invalid: : ValidatingAdmissionPolicy \'gpu-cap\' with binding '
          '\'gpu-cap-team-a\' denied request: at most 1 GPU per container', "refused"),
    (403, 'pods "g2-worker-0" is forbidden: ValidatingAdmissionPolicy \'gpu-cap\' with binding '
          '\'gpu-cap-team-a\' denied request: at most 1 GPU per container', "refused"),
    # Planned by the rounds themselves, or not about the pod: no verdict against the job.
    (403, 'pods "x-0" is forbidden: exceeded quota: q, requested: requests.nvidia.com/gpu=1',
     "passed"),
    (403, 'pods "x-0" is forbidden: failed quota: q: must specify limits.cpu', "passed"),
    (409, 'pods "x-0" already exists', "passed"),
    # LimitRange and RuntimeClass: planned with (limitranges.py, runtimeclasses.py), which
    # unblock the job as soon as the object changes. kube-apiserver 1.34's words:
    (403, 'pods "l-worker-0" is forbidden: [maximum memory usage per Container is 16Gi, but '
          'limit is 32Gi, cpu max limit to request ratio per Container is 2, but provided ratio '
          'is 3.000000]', "passed"),
    (403, 'pods "l-worker-0" is forbidden: minimum cpu usage per Pod is 2, but request is 1',
     "passed"),
    (403, 'pods "r-worker-0" is forbidden: pod rejected: RuntimeClass "kata-x" not found', "passed"),
    # Checks that cannot be made are not held against the job either.
    (403, 'pods is forbidden: User "system:serviceaccount:mlsched-system:mlsched-operator" cannot '
          'create resource "pods" in API group "" in the namespace "team-a"', "unavailable"),
    (400, 'admission webhook "audit.example.com" does not support dry run', "unknown"),
    (500, 'Internal error occurred: failed calling webhook "gpu.example.com"', "unknown"),
    (429, "too many requests", "unknown"),
])
def test_answers_are_classified(status, message, kind):
    assert preflight.classify(KubeError(status, message))[0] == kind


def test_the_dry_run_pod_is_the_statefulset_s_first_pod():
    rt, _ = make_runtime(cluster(1))
    from mlsched.controller.objects.job_records import job_record

    job = job_record(ps_job("bert"))
    pod = preflight.dry_run_pod(job, "worker", rt.pod_settings)
    meta, spec = pod["metadata"], pod["spec"]
    assert (pod["kind"], meta["name"], meta["namespace"]) == ("Pod", "bert-worker-0", NS)
    assert (spec["hostname"], spec["subdomain"]) == ("bert-worker-0", "bert")
    assert meta["labels"]["mlsched.io/job-name"] == "bert"
    assert meta["labels"]["statefulset.kubernetes.io/pod-name"] == "bert-worker-0"
    assert spec["serviceAccountName"] == rt.pod_settings.service_account  # the operator's default
    assert {"name": "mlsched.io/placement"} in spec["schedulingGates"]


def test_a_job_whose_pods_would_be_refused_is_given_nothing_and_told_why():
    """A typo in serviceAccountName: the job used to be admitted, every pod refused, and its
    capacity held until its policy's next round. Now the dry run says so before any of it."""
    rt, kube = make_runtime(cluster(2))
    kube.pod_admission = refuse_service_account
    kube.put(policy())
    run(create_jobs(rt, kube, typo_job("typo", max_workers=4), ps_job("fine", max_workers=4)))
    assert {c[3] for c in dry_runs(kube)} == {"typo-ps-0", "typo-worker-0", "fine-ps-0",
                                              "fine-worker-0"}
    c = running(kube, "typo")
    assert c.reason == "PodsRefused"
    assert c.message.startswith("the API server would refuse to create its pods: "
                                + MISSING_SA.format(pod="typo-ps-0")), c.message
    admitted = get_condition(kube.obj("MLJob", NS, "typo")["status"]["conditions"], "Admitted")
    assert (admitted.status, admitted.reason) == ("False", "PodsRefused")
    assert [e["reason"] for e in kube.events("typo") if e["type"] == "Warning"] == ["PodsRefused"]
    round_(rt, kube)
    kube.settle()
    assert set(replicas(kube, "typo").values()) == {0}
    assert replicas(kube, "fine")["fine-worker"] == 4  # all 4 GPUs: nothing held for the typo
    assert not [e for e in kube.of_kind("Event") if e.get("reason") == "FailedCreate"]
    assert rt.process.metrics.preflights.labels("refused")._value.get() == 1


def test_a_refused_job_is_asked_again_and_admitted_once_its_pods_would_be_created(monkeypatch):
    clock = Clock()
    rt, kube = make_runtime(cluster(2))
    rt.jobs.preflight.clock = clock
    kube.pod_admission = refuse_service_account
    kube.put(policy())
    run(create_jobs(rt, kube, typo_job("typo")))
    sync(rt, kube, "typo")
    assert len(dry_runs(kube)) == 2  # not asked again within RECHECK_S
    kube.pod_admission = None  # the admin created the ServiceAccount
    clock.now += preflight.RECHECK_S
    wakeups = rt.scheduling.wakeups.signals((NS, "default"))
    sync(rt, kube, "typo")
    assert len(dry_runs(kube)) == 4
    assert rt.scheduling.wakeups.signals((NS, "default")) == wakeups + 1  # its policy's admission runs now
    assert not rt.jobs.preflight.holds(kube.indexes().job(NS, "typo"))
    assert running(kube, "typo").reason == "WaitingForAllocation"
    run(loop.run_policy_admission(rt, kube.obj("SchedulingPolicy", NS, "default"), kube.indexes(),
                                  now=NOW))
    assert replicas(kube, "typo")["typo-worker"] >= 1


def test_a_job_whose_pods_become_refused_after_admission_gives_its_capacity_back(monkeypatch):
    """Admitted while its pods would be created, then the namespace's policy changed: every
    pod refused. It held its GPUs until the next round; now it is asked again and releases."""
    clock = Clock()
    monkeypatch.setattr(jobs.time, "monotonic", clock)
    rt, kube = make_runtime(cluster(2))
    rt.jobs.preflight.clock = clock
    kube.put(policy())
    run(create_jobs(rt, kube, typo_job("later", max_workers=4)))
    round_(rt, kube)
    held = replicas(kube, "later")
    assert held["later-worker"] == 4
    kube.pod_admission = refuse_service_account  # the refusal begins after the check
    kube.settle()
    assert not kube.of_kind("Pod")
    sync(rt, kube, "later")  # refused pods noticed; the grace period starts
    clock.now += max(pod_problems.REFUSAL_GRACE_S, preflight.RECHECK_S)
    sync(rt, kube, "later")
    assert set(replicas(kube, "later").values()) == {0}
    assert rt.scheduling.placements.of((NS, "later")) is None and rt.scheduling.reservations.usage_of((NS, "later")) is None
    released = [e["message"] for e in kube.events("later") if e["reason"] == "Released"]
    assert released == [f"gave back {held['later-ps']} ps, 4 worker: the API server refuses to "
                        f"create its pods"]
    sync(rt, kube, "later")
    c = running(kube, "later")
    assert c.reason == "PodsRefused" and "would refuse" in c.message
    round_(rt, kube)
    assert set(replicas(kube, "later").values()) == {0}  # not given anything again


def test_a_running_job_is_never_released_by_a_dry_run(monkeypatch):
    """Some of its pods run: a refusal of the rest (a webhook's per-job cap) is reported and the
    job keeps what runs (its policy's next round decides)."""
    clock = Clock()
    monkeypatch.setattr(jobs.time, "monotonic", clock)
    rt, kube = make_runtime(cluster(2))
    rt.jobs.preflight.clock = clock
    kube.put(policy())
    run(create_jobs(rt, kube, ps_job("bert", max_workers=4)))
    round_(rt, kube)
    kube.pod_admission = lambda pod: ("denied: one worker per job" if "-worker-" in pod["metadata"]["name"]
                                      and pod["metadata"]["name"] != "bert-worker-1" else None)
    kube.settle()
    assert [p["metadata"]["name"] for p in kube.of_kind("Pod") if "-worker-" in p["metadata"]["name"]] \
        == ["bert-worker-1"]
    sync(rt, kube, "bert")
    clock.now += max(pod_problems.REFUSAL_GRACE_S, preflight.RECHECK_S)
    sync(rt, kube, "bert")
    assert replicas(kube, "bert")["bert-worker"] == 4
    assert not dry_runs(kube)[2:]  # pods exist: not asked again


def test_checks_that_cannot_be_made_never_hold_a_job():
    rt, kube = make_runtime(cluster(2))
    kube.put(policy())
    kube.failing[("dry-run", "a-worker-0")] = 500
    run(create_jobs(rt, kube, ps_job("a", max_workers=2)))
    round_(rt, kube)
    assert replicas(kube, "a")["a-worker"] == 2


def test_without_the_right_to_create_pods_the_operator_stops_asking(caplog):
    rt, kube = make_runtime(cluster(2))
    kube.put(policy())

    async def forbidden(body):  # an RBAC without pods create (the operator's own rights)
        kube.calls.append(("dry-run", "Pod", NS, body["metadata"]["name"]))
        raise KubeError(403, 'pods is forbidden: User "system:serviceaccount:x:y" cannot create '
                             'resource "pods" in API group "" in the namespace "team-a"')

    kube.dry_run_create = forbidden
    run(create_jobs(rt, kube, ps_job("a", max_workers=2), ps_job("b", max_workers=2)))
    assert len(dry_runs(kube)) == 2  # the first job's two pods; then no more checks
    assert "lacks pods create" in caplog.text
    round_(rt, kube)
    assert replicas(kube, "a")["a-worker"] >= 1 and replicas(kube, "b")["b-worker"] >= 1


def test_jobs_made_from_one_manifest_are_checked_once_per_role():
    """A sweep of 20 jobs from one template costs one dry run per role, not per job; a
    template that differs is asked about, and a pass is forgotten after PASS_TTL_S."""
    clock = Clock()
    rt, kube = make_runtime(cluster(2))
    rt.jobs.preflight.clock = clock
    kube.put(policy())
    run(create_jobs(rt, kube, *(ps_job(f"sweep-{i}") for i in range(20))))
    assert sorted(c[3] for c in dry_runs(kube)) == ["sweep-0-ps-0", "sweep-0-worker-0"]
    assert all(rt.jobs.preflight.checked(j) and not rt.jobs.preflight.holds(j)
               for j in kube.indexes().jobs_of_policy(NS, "default"))
    run(create_jobs(rt, kube, ps_job("bigger", max_workers=6)))  # worker bounds are not the template
    assert len(dry_runs(kube)) == 2
    run(create_jobs(rt, kube, typo_job("other")))  # another template: asked
    assert len(dry_runs(kube)) == 4
    clock.now += preflight.PASS_TTL_S
    run(create_jobs(rt, kube, ps_job("late")))
    assert len(dry_runs(kube)) == 6


def test_a_burst_from_one_manifest_shares_the_dry_run_in_flight():
    """Created at once, the jobs' checks overlap: the first one's dry run answers the others."""
    import asyncio

    rt, kube = make_runtime(cluster(2))
    kube.put(policy())
    asked = kube.dry_run_create

    async def slow(body):
        await asyncio.sleep(0.01)
        await asked(body)

    kube.dry_run_create = slow
    bodies = [kube.put(ps_job(f"burst-{i}")) for i in range(10)]

    async def arrive():
        await asyncio.gather(*(jobs.reconcile_children(rt, b, kube.indexes(), {}) for b in bodies))

    run(arrive())
    assert sorted(c[3] for c in dry_runs(kube)) == ["burst-0-ps-0", "burst-0-worker-0"]
    assert all(rt.jobs.preflight.checked(j) and not rt.jobs.preflight.holds(j)
               for j in kube.indexes().jobs_of_policy(NS, "default"))


def test_a_relabelled_namespace_has_its_refused_jobs_asked_again_at_once():
    """Pod Security's level lowered (or a label an admission policy selects on removed): the
    namespace's refused jobs are asked again by the namespace's watch event, not 30 s later."""
    from mlsched.controller.app import handlers

    rt, kube = make_runtime(cluster(2))
    kube.pod_admission = refuse_service_account
    kube.put(policy())
    run(create_jobs(rt, kube, typo_job("typo")))
    rt.cluster.indexes = kube.indexes()
    namespace = {"metadata": {"name": NS, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
    memo = {"runtime": rt}
    run(handlers.namespace_event({"type": "ADDED"}, namespace, memo))
    assert len(dry_runs(kube)) == 2  # first sight of the namespace: nothing to compare
    kube.pod_admission = None
    wakeups = rt.scheduling.wakeups.signals((NS, "default"))
    namespace["metadata"]["labels"] = {"pod-security.kubernetes.io/enforce": "baseline"}
    run(handlers.namespace_event({"type": "MODIFIED"}, namespace, memo))
    assert len(dry_runs(kube)) == 4
    assert not rt.jobs.preflight.holds(rt.cluster.indexes.job(NS, "typo"))
    assert rt.scheduling.wakeups.signals((NS, "default")) == wakeups + 1
    run(handlers.namespace_event({"type": "MODIFIED"}, namespace, memo))  # unchanged: nothing
    assert len(dry_runs(kube)) == 4
    # Relabelled again: what passed before it is asked about again.
    namespace["metadata"]["labels"] = {"pod-security.kubernetes.io/enforce": "restricted"}
    run(handlers.namespace_event({"type": "MODIFIED"}, namespace, memo))
    run(create_jobs(rt, kube, typo_job("after")))
    assert [c[3] for c in dry_runs(kube)[4:]] == ["after-ps-0", "after-worker-0"]

"""A running job's counts change: status says it is rescaling and from what to what, counts
the rescales and the time they cost, and Events say when each began and ended (pure
lifecycle.evaluate, fed the StatefulSets as the index records them)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from mlsched.api import get_condition
from mlsched.controller.objects.lifecycle import Observed, evaluate, start_rescale
from mlsched.controller.objects.records import StsRecord
from mlsched.controller.objects.job_records import parse_job
from builders import NS, allreduce_job, ps_job

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def sts(role: str, replicas: int, ready: int, updated: int | None = None,
        created: int | None = None, observed: bool = True) -> StsRecord:
    return StsRecord(name=f"j-{role}", role=role, replicas=replicas, ready=ready,
                     template_hash="h", created=replicas if created is None else created,
                     observed=observed, updated=replicas if updated is None else updated)


class Job:
    """Feeds evaluate() its own output, as the lifecycle sweep does through the API server."""

    def __init__(self, body: dict):
        self.spec = parse_job(body).spec
        self.status: dict = {}
        self.events: list[tuple[str, str, str]] = []

    def decided(self, seconds: float, **counts: int) -> None:
        """A step changed the counts: what reporting.record_job_status writes."""
        roles = ("ps", "worker") if self.spec.replica_specs.ps is not None else ("worker",)
        before = {r: self.status["replicaStatuses"][r]["desired"] for r in roles}
        after = {r: counts[r] for r in roles}
        self.status["rescales"] = start_rescale(self.status.get("rescales"), before, after,
                                                T0 + timedelta(seconds=seconds))

    def sweep(self, seconds: float, *statefulsets: StsRecord):
        out = evaluate(self.spec, 1, self.status, Observed(statefulsets=statefulsets,
                                                           now=T0 + timedelta(seconds=seconds)))
        self.status = {**self.status, **out.status}
        self.events += out.events
        return out

    def cond(self, type_: str):
        return get_condition(self.status.get("conditions"), type_)


def running_ps_job() -> Job:
    job = Job(ps_job("j"))
    job.sweep(0, sts("ps", 1, 1), sts("worker", 1, 1))
    assert job.status["phase"] == "Running" and "rescales" not in job.status
    return job


def test_a_change_of_counts_is_a_rescale_from_what_to_what_until_the_new_pods_are_ready():
    job = running_ps_job()
    # The round scaled it to 2 PS, 3 workers: the StatefulSet controller has not acted yet
    # (the old pods are still Ready: readyReplicas alone would say it is done).
    job.decided(10, ps=2, worker=3)
    job.sweep(10, sts("ps", 2, 1, updated=0, created=1), sts("worker", 3, 1, updated=0, created=1))
    last = job.status["rescales"]["last"]
    assert job.status["rescales"]["count"] == 1
    assert last["from"] == {"ps": 1, "workers": 1} and last["to"] == {"ps": 2, "workers": 3}
    assert not last.get("completionTime")
    rescaling = job.cond("Rescaling")
    assert rescaling.status == "True" and rescaling.reason == "CountsChanged"
    assert "1 ps, 1 worker → 2 ps, 3 worker" in rescaling.message
    assert ("Normal", "Rescaling") in {(t, r) for t, r, _ in job.events}
    # The old pods go; the new ones start: the job says why it is not running.
    job.sweep(15, sts("ps", 2, 0, updated=2), sts("worker", 3, 0, updated=3))
    running = job.cond("Running")
    assert job.status["phase"] == "Pending" and running.reason == "Rescaling"
    assert "0/3 worker ready" in running.message
    # Some new pods Ready is not the end of it.
    job.sweep(20, sts("ps", 2, 2), sts("worker", 3, 2))
    assert job.status["phase"] == "Running" and job.cond("Running").reason == "Rescaling"
    assert not job.status["rescales"]["last"].get("completionTime")
    job.sweep(27, sts("ps", 2, 2), sts("worker", 3, 3))
    done = job.status["rescales"]
    assert done["last"]["seconds"] == 17 and done["seconds"] == 17 and done["count"] == 1
    assert job.cond("Rescaling").status == "False" and job.cond("Rescaling").reason == "Rescaled"
    assert job.cond("Running").reason == "AllRolesReady"
    assert any(r == "Rescaled" and "in 17 s" in m for _, r, m in job.events)
    # Nothing changes any more: nothing to write.
    assert not job.sweep(40, sts("ps", 2, 2), sts("worker", 3, 3)).changed


def test_rescales_add_up_and_one_cut_short_by_the_next_ends_where_the_next_begins():
    job = running_ps_job()
    job.decided(10, ps=1, worker=3)
    job.sweep(10, sts("ps", 1, 0, updated=0), sts("worker", 3, 0, updated=0))
    job.decided(14, ps=1, worker=2)  # changed again while restarting
    job.sweep(14, sts("ps", 1, 0), sts("worker", 2, 0))
    status = job.status["rescales"]
    assert status["count"] == 2 and status["seconds"] == 4
    assert status["last"]["from"] == {"ps": 1, "workers": 3}
    assert status["last"]["to"] == {"ps": 1, "workers": 2}
    job.sweep(20, sts("ps", 1, 1), sts("worker", 2, 2))
    assert job.status["rescales"]["seconds"] == 10 and job.status["rescales"]["last"]["seconds"] == 6


def test_a_scale_down_ends_only_when_the_extra_pod_is_gone():
    job = Job(allreduce_job("j"))
    job.sweep(0, sts("worker", 3, 3))
    job.decided(5, worker=2)
    job.sweep(5, sts("worker", 2, 3, updated=2, created=3))  # worker-2 still terminating
    assert not job.status["rescales"]["last"].get("completionTime")
    job.sweep(9, sts("worker", 2, 2))
    assert job.status["rescales"]["last"]["seconds"] == 4
    assert job.status["rescales"]["last"]["to"] == {"ps": 0, "workers": 2}


def test_a_stale_view_of_the_statefulsets_does_not_end_a_rescale():
    job = running_ps_job()
    job.decided(10, ps=1, worker=3)
    # The index still shows the StatefulSets from before the round's patch: all Ready.
    job.sweep(11, sts("ps", 1, 1), sts("worker", 1, 1))
    assert job.cond("Rescaling").status == "True"
    assert not job.status["rescales"]["last"].get("completionTime")


def test_one_sweep_that_sees_a_rescale_begin_and_end_says_both():
    job = running_ps_job()
    job.decided(10, ps=1, worker=2)
    job.sweep(12, sts("ps", 1, 1), sts("worker", 2, 2))
    assert [r for _, r, _ in job.events if r.startswith("Rescal")] == ["Rescaling", "Rescaled"]
    assert job.status["rescales"]["last"]["seconds"] == 2


# --------------------------------------------------------------- through the round (fakes)

def test_the_round_records_a_rescale_of_a_running_job_and_the_sweep_ends_it():
    """What the operator writes: the round that changed a running job's counts starts the
    rescale; admitting a job, and scaling one that never ran, do not."""
    from builders import recorded, run
    from controller_steps import scheduled, status, sync

    rt, kube = scheduled(("bert",))
    sync(rt, kube, "bert")
    assert status(kube, "bert")["phase"] == "Running" and "rescales" not in status(kube, "bert")
    before = status(kube, "bert")["replicaStatuses"]
    run(kube.patch("MLJob", NS, "bert", {"spec": {"replicaSpecs": {"worker": {"min": 3, "max": 3}}}}))
    from mlsched.controller.app import pod_events
    from mlsched.controller.scheduling import loop
    recorded(rt, loop.run_policy_round(rt, kube.obj("SchedulingPolicy", NS, "default"),
                                       kube.indexes()))
    rescales = status(kube, "bert").get("rescales")
    assert rescales and rescales["count"] == 1, status(kube, "bert")
    assert rescales["last"]["from"] == {"ps": before["ps"]["desired"],
                                        "workers": before["worker"]["desired"]}
    assert rescales["last"]["to"]["workers"] == 3
    # From now on a pod made before this round reports no samples/s (progress_server.py).
    assert (NS, "bert") in rt.jobs.counts_since
    sync(rt, kube, "bert")  # the StatefulSet controller has not acted yet
    rescaling = get_condition(status(kube, "bert")["conditions"], "Rescaling")
    last = rescales["last"]
    assert rescaling.status == "True" and rescaling.message.startswith(
        f"rescaling {last['from']['ps']} ps, {last['from']['workers']} worker → "
        f"{last['to']['ps']} ps, 3 worker: ")
    kube.settle()  # the new pods are created, pinned, and run
    for p in kube.of_kind("Pod"):
        run(pod_events.on_pod_event(rt, "ADDED", p, kube.indexes()))
    kube.settle()
    sync(rt, kube, "bert")
    done = status(kube, "bert")["rescales"]["last"]
    assert done["completionTime"] and done["seconds"] >= 0
    rescaling = get_condition(status(kube, "bert")["conditions"], "Rescaling")
    assert rescaling.status == "False" and rescaling.reason == "Rescaled"
    # The next one is a record of its own: nothing of the finished one's end is kept (a status
    # patch merges; it kept completionTime, and the new rescale looked finished at once).
    run(kube.patch("MLJob", NS, "bert", {"spec": {"replicaSpecs": {"worker": {"min": 2, "max": 2}}}}))
    recorded(rt, loop.run_policy_round(rt, kube.obj("SchedulingPolicy", NS, "default"),
                                       kube.indexes()))
    second = status(kube, "bert")["rescales"]
    assert second["count"] == 2 and second["last"]["to"]["workers"] == 2
    assert "completionTime" not in second["last"] and "seconds" not in second["last"]
    sync(rt, kube, "bert")
    assert get_condition(status(kube, "bert")["conditions"], "Rescaling").status == "True"


def test_admission_suspension_and_resumption_are_not_rescales():
    job = Job(ps_job("j"))
    job.sweep(0, sts("ps", 0, 0), sts("worker", 0, 0))  # waiting
    job.sweep(5, sts("ps", 1, 0), sts("worker", 2, 0))  # admitted, never ran
    job.sweep(8, sts("ps", 1, 1), sts("worker", 2, 2))
    assert job.status["phase"] == "Running" and "rescales" not in job.status
    job.spec.run_policy.suspend = True
    job.sweep(10, sts("ps", 0, 0), sts("worker", 0, 0))
    job.spec.run_policy.suspend = False
    job.sweep(20, sts("ps", 1, 1), sts("worker", 4, 4))
    assert "rescales" not in job.status and job.cond("Rescaling") is None

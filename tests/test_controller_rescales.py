"""A running job's counts change: status says it is rescaling and from what to what, counts
the rescales and the time they cost, and Events say when each began and ended (pure
lifecycle.evaluate, fed the StatefulSets as the index records them)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from mlsched.api import get_condition
from mlsched.controller.lifecycle import Observed, evaluate
from mlsched.controller.records import StsRecord, parse_job
from test_controller_fixtures import allreduce_job, ps_job

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
    job.sweep(10, sts("ps", 2, 1, updated=0, created=1), sts("worker", 3, 1, updated=0, created=1))
    last = job.status["rescales"]["last"]
    assert job.status["rescales"]["count"] == 1
    assert last["from"] == {"ps": 1, "workers": 1} and last["to"] == {"ps": 2, "workers": 3}
    assert "completionTime" not in last
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
    assert "completionTime" not in job.status["rescales"]["last"]
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
    job.sweep(10, sts("ps", 1, 0, updated=0), sts("worker", 3, 0, updated=0))
    job.sweep(14, sts("ps", 1, 0), sts("worker", 2, 0))  # changed again while restarting
    status = job.status["rescales"]
    assert status["count"] == 2 and status["seconds"] == 4
    assert status["last"]["from"] == {"ps": 1, "workers": 3}
    assert status["last"]["to"] == {"ps": 1, "workers": 2}
    job.sweep(20, sts("ps", 1, 1), sts("worker", 2, 2))
    assert job.status["rescales"]["seconds"] == 10 and job.status["rescales"]["last"]["seconds"] == 6


def test_a_scale_down_ends_only_when_the_extra_pod_is_gone():
    job = Job(allreduce_job("j"))
    job.sweep(0, sts("worker", 3, 3))
    job.sweep(5, sts("worker", 2, 3, updated=2, created=3))  # worker-2 still terminating
    assert "completionTime" not in job.status["rescales"]["last"]
    job.sweep(9, sts("worker", 2, 2))
    assert job.status["rescales"]["last"]["seconds"] == 4
    assert job.status["rescales"]["last"]["to"] == {"ps": 0, "workers": 2}


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

"""The operator's in-memory state is a few owners (scheduling/state.py), not one bag: the
Runtime holds the seams and one object per owner, and a job is forgotten by one call per owner
(issue 50)."""

from __future__ import annotations

import dataclasses

from mlsched.controller.scheduling.runtime import Runtime
from mlsched.controller.scheduling.state import ClusterView, JobState, PodBooks, Scheduling
from mlsched.controller.objects.job_records import job_record
from builders import NS
from controller_steps import round_, settle, setup, sync

# Not a job's state to forget: kopf's indexes (the job is still in the cluster until its
# deletion's event), the policy of jobs deleted lately (kept on purpose, for its pods'
# deletions to wake that policy), and two queues that drain themselves (a job marked due after
# it was forgotten is taken and skipped, having no body; an evaluation clears its own entry).
SKIPPED = {ClusterView: ("indexes",), JobState: ("departed", "due")}

OWNERS = {"pods": PodBooks, "jobs": JobState, "cluster": ClusterView, "scheduling": Scheduling}


def test_the_runtime_has_under_ten_fields_and_each_owner_forgets_a_job():
    fields = {f.name: f.type for f in dataclasses.fields(Runtime)}
    assert len(fields) < 10, sorted(fields)
    assert set(OWNERS) <= set(fields)
    for owner in OWNERS.values():
        assert callable(owner.forget_job)


def _holds(value, key, seen=None, depth=0) -> list[str]:
    """Where `key` (a job's (namespace, name)) still appears in `value`: as a key of a dict, an
    element of a set, or the job part of a tuple key; walked through plain attributes."""
    seen = seen if seen is not None else set()
    if id(value) in seen or depth > 6 or isinstance(value, (str, bytes, int, float, type(None))):
        return []
    seen.add(id(value))
    found = []
    if isinstance(value, dict):
        for k, v in list(value.items()):
            if k == key or (isinstance(k, tuple) and k and k[0] == key):
                found.append(repr(k))
            found += [f"[{k!r}]{w}" for w in _holds(v, key, seen, depth + 1)]
    elif isinstance(value, (set, frozenset)):
        found += [repr(k) for k in value if k == key or (isinstance(k, tuple) and k and k[0] == key)]
    elif hasattr(value, "__dict__") and type(value).__module__.startswith("mlsched.controller"):
        for name, v in vars(value).items():
            if name in SKIPPED.get(type(value), ()):
                continue
            found += [f".{name}{w}" for w in _holds(v, key, seen, depth + 1)]
    return found


def test_forgetting_a_job_clears_it_from_every_owner():
    """A job that has run a round and a lifecycle evaluation is in many books; after
    `forget_job` no owner holds it anywhere but JobState.departed (kept on purpose, for its
    pods' deletions to wake its policy)."""
    rt, kube = setup()
    round_(rt, kube)
    settle(rt, kube)
    key = (NS, "bert")
    sync(rt, kube, "bert")
    job = job_record(kube.obj("MLJob", NS, "bert"))
    # What other handlers would have added for it by now.
    rt.jobs.progress[key] = (1.0, 2.0, 0.1, None)
    rt.jobs.note_departed(key, "default")
    rt.jobs.waiting[key] = "waits"
    rt.jobs.written_status.wrote(key, {"phase": "Running"})
    rt.jobs.books.retrying[key] = "boom"
    rt.jobs.preflight.passed_over.add(key)
    rt.pods.clocks.unseen_since[key] = {"uid": 1.0}
    rt.pods.clocks.short_since[(key, "bert-worker")] = (1.0, 0)
    rt.pods.refusals.note(key, "worker", ["node-0"], 1.0)
    rt.scheduling.failures.observe(key, "uid", 1)
    rt.scheduling.groups[key] = "pool-0"
    rt.scheduling.services.note(job)
    before = {name: _holds(getattr(rt, name), key) for name in OWNERS}
    # The scenario put the job in every owner with per-job books (the cluster view has none).
    assert all(before[name] for name in ("pods", "jobs", "scheduling")), before
    rt.forget_job(key)
    after = {name: _holds(getattr(rt, name), key) for name in OWNERS}
    assert after == {"pods": [], "jobs": [], "cluster": [], "scheduling": []}, after
    assert not rt.scheduling.reservations.usage_of(key)
    assert rt.jobs.departed == {key: "default"}

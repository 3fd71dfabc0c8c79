"""A standby replica writes nothing until it leads; then it schedules at once."""

from __future__ import annotations

import asyncio
import math

import pytest

from mlsched.controller.app import jobs
from mlsched.controller.process.leadership import Leadership
from mlsched.controller.process.supervision import PolicyLoops
from builders import NS, cluster, make_runtime, policy, ps_job, run


def test_callbacks_run_once_when_leadership_is_won():
    calls = []
    standby = Leadership(leading=False)
    standby.on_leading(lambda: calls.append("a"))
    assert calls == []
    standby.become_leader()
    standby.become_leader()
    assert calls == ["a"]
    standby.on_leading(lambda: calls.append("b"))  # already leading: at once
    assert calls == ["a", "b"]
    assert Leadership().leading  # no election: it leads from the start


def test_a_standby_keeps_policies_and_starts_their_loops_when_it_leads():
    async def scenario():
        started = []

        async def loop(body, stopped):
            started.append(body["metadata"]["name"])
            await stopped.wait()

        loops = PolicyLoops(loop, active=False)
        loops.observe({"metadata": {"name": "p", "namespace": NS, "uid": "u", "generation": 1}})
        assert loops.running() == []  # no task at all: nothing can start it later
        await asyncio.sleep(0)
        assert started == []
        loops.activate()
        assert loops.running() == [(NS, "p")]
        for _ in range(100):  # turns of the event loop until the loop has started
            if started:
                break
            await asyncio.sleep(0)
        assert started == ["p"]
        await loops.stop_all()

    run(scenario())


def test_a_standby_creates_no_children_and_pins_nothing():
    rt, kube = make_runtime(cluster(2))
    rt.process.leadership = Leadership(leading=False)
    kube.put(policy())
    body = kube.put(ps_job("bert"))
    run(jobs.on_job_event(rt, "ADDED", body, kube.indexes()))
    assert kube.writes() == [] and (NS, "bert") in rt.jobs.books.job_bodies
    # Once it leads, the sweep reconciles what arrived while it stood by.
    rt.process.leadership.hold_until(math.inf)  # as the election does when it wins the Lease
    rt.process.leadership.become_leader()
    run(jobs.sweep(rt, kube.indexes()))
    assert sorted(s["metadata"]["name"] for s in kube.of_kind("StatefulSet")) == \
        ["bert-ps", "bert-worker"]


def test_the_leader_labels_its_own_pod_and_a_new_leader_unlabels_the_previous_ones(monkeypatch):
    """The Service selects the leader's pod by mlsched.io/leader=true, so both replicas can be
    Ready (a PodDisruptionBudget counts Ready pods) while reports reach the leader only."""
    from mlsched.controller.process.leadership import label_own_pod, unlabel_previous_leader

    rt, kube = make_runtime(cluster(2))
    kube.put({"apiVersion": "v1", "kind": "Pod",
              "metadata": {"name": "mlsched-operator-abc", "namespace": "mlsched-system",
                           "labels": {"app.kubernetes.io/name": "mlsched-operator"}},
              "spec": {"containers": [{"name": "operator"}]}})

    def labels() -> dict:
        (pod,) = kube.of_kind("Pod")
        return pod["metadata"]["labels"]

    monkeypatch.delenv("POD_NAME", raising=False)
    assert run(label_own_pod(rt.api, True)) is False  # not in a pod: nothing to label
    monkeypatch.setenv("POD_NAME", "mlsched-operator-abc")
    monkeypatch.setenv("POD_NAMESPACE", "mlsched-system")
    assert run(label_own_pod(rt.api, True)) is True
    assert labels() == {"app.kubernetes.io/name": "mlsched-operator", "mlsched.io/leader": "true"}
    # Another replica wins the Lease: it takes the label off the previous holder's pod (a
    # replica that is not the leader writes nothing, not even its own label).
    monkeypatch.setenv("POD_NAME", "mlsched-operator-def")
    assert run(unlabel_previous_leader(rt.api, "mlsched-operator-abc")) is True
    assert labels() == {"app.kubernetes.io/name": "mlsched-operator"}
    assert run(unlabel_previous_leader(rt.api, "mlsched-operator-def")) is False  # itself
    assert run(unlabel_previous_leader(rt.api, None)) is False
    assert run(unlabel_previous_leader(rt.api, "gone", attempts=1, backoff_s=0)) is False
    monkeypatch.setenv("POD_NAME", "gone")
    assert run(label_own_pod(rt.api, True, attempts=1, backoff_s=0)) is False


# ------------------------------------------------------------------ the election (issue 55)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Outage(Exception):
    pass


class MemoryLeaseStore:
    """One Lease shared by the replicas' elections, with optimistic concurrency, and an API
    server that can be down."""

    def __init__(self) -> None:
        self.record = None
        self.version = 0
        self.down = False
        self.writes: list[str] = []

    def read(self):
        if self.down:
            raise Outage("connection refused")
        return self.record

    def write(self, holder, *, duration_s, acquire_time, transitions, resource_version):
        from mlsched.controller.process.leadership import Conflict, LeaseRecord

        if self.down:
            raise Outage("connection refused")
        current = self.record.resource_version if self.record else None
        if resource_version != current:
            raise Conflict("the object has been modified")
        self.version += 1
        self.record = LeaseRecord(holder, duration_s, str(self.version), acquire_time,
                                  transitions)
        self.writes.append(holder)
        return self.record


class Partition:
    """One replica's way to the shared Lease, which can be cut alone."""

    def __init__(self, store):
        self.store, self.cut = store, False

    def read(self):
        if self.cut:
            raise Outage("no route to host")
        return self.store.read()

    def write(self, *args, **kwargs):
        if self.cut:
            raise Outage("no route to host")
        return self.store.write(*args, **kwargs)


def replica(store, identity, clock):
    from mlsched.controller.process.leadership import Election

    leadership = Leadership(leading=False, clock=clock)
    events = []
    election = Election(leadership, store, identity, clock=clock,
                        on_won=lambda: events.append("won"), on_lost=lambda: events.append("lost"))
    return election, leadership, events


def tick(clock, elections, seconds=1.0):
    """Each election tries once (errors as the thread's loop takes them), then time passes."""
    from mlsched.controller.process.leadership import Conflict

    for election in elections:
        try:
            election.step()
        except (Outage, Conflict):
            pass
        election.check_deadline()
    clock.now += seconds


def test_one_replica_wins_and_the_other_stands_by():
    clock, store = Clock(), MemoryLeaseStore()
    (a, la, ea), (b, lb, eb) = replica(store, "a", clock), replica(store, "b", clock)
    for _ in range(20):
        tick(clock, [a, b])
        assert not (la.leading and lb.leading)
    assert la.leading and not lb.leading and ea == ["won"] and eb == []
    assert set(store.writes) == {"a"}  # the standby only reads a Lease that is renewed


def test_a_leader_cut_off_stops_writing_before_the_standby_can_take_the_lease():
    """The leader cannot reach the API server for 20 s, the standby can: the leader is fenced
    at its deadline; the standby, which campaigned all along, takes over no sooner than 2 s
    later; the old leader, back, finds the Lease taken and restarts as a standby."""
    from mlsched.controller.process.leadership import LEASE_S, RENEW_DEADLINE_S

    clock, store = Clock(), MemoryLeaseStore()
    way = Partition(store)
    (a, la, ea), (b, lb, eb) = replica(way, "a", clock), replica(store, "b", clock)
    tick(clock, [a, b])
    renewed = clock.now - 1.0  # the start of a's last successful renewal
    way.cut = True
    fenced_at = taken_at = None
    for _ in range(300):
        tick(clock, [a, b], 0.1)
        if fenced_at is None and not la.leading:
            fenced_at = clock.now
        if taken_at is None and lb.leading:
            taken_at = clock.now
        assert not (la.leading and lb.leading)
        way.cut = clock.now - renewed < 20
    assert fenced_at is not None and fenced_at - renewed <= RENEW_DEADLINE_S + 0.1
    assert taken_at is not None and taken_at - renewed >= LEASE_S
    assert taken_at - fenced_at >= LEASE_S - RENEW_DEADLINE_S - 0.1
    assert not la.leading and ea == ["won", "lost"]  # a restarts as a standby (exec)
    assert eb == ["won"] and lb.previous_holder == "a"


def test_after_an_outage_of_the_api_server_exactly_one_replica_leads():
    clock, store = Clock(), MemoryLeaseStore()
    (a, la, _), (b, lb, _) = replica(store, "a", clock), replica(store, "b", clock)
    for down_s in (4, 20):
        for _ in range(20):
            tick(clock, [b, a], 0.5)
        store.down = True
        for _ in range(int(down_s / 0.1)):
            tick(clock, [b, a], 0.1)
            assert not (la.leading and lb.leading)
        store.down = False
        for _ in range(40):
            tick(clock, [b, a], 0.5)
            assert not (la.leading and lb.leading)
        assert la.leading != lb.leading


def test_a_fenced_leader_whose_lease_nobody_took_resumes_writing():
    clock, store = Clock(), MemoryLeaseStore()
    a, la, ea = replica(store, "a", clock)
    tick(clock, [a])
    store.down = True
    for _ in range(10):
        tick(clock, [a])
    assert not la.leading
    store.down = False
    tick(clock, [a], 0.0)
    assert la.leading and ea == ["won"]  # the same term: no restart


def test_the_leases_duration_is_counted_from_when_the_standby_saw_the_record():
    """A standby that starts late does not take a Lease whose renewTime is old: it has not
    seen it unchanged for a whole duration yet (clocks of other machines are not trusted)."""
    from mlsched.controller.process.leadership import LEASE_S

    clock, store = Clock(), MemoryLeaseStore()
    a, la, _ = replica(store, "a", clock)
    tick(clock, [a])
    clock.now += 100  # a was SIGKILLed long ago
    b, lb, _ = replica(store, "b", clock)
    for _ in range(LEASE_S):
        tick(clock, [b])
        assert not lb.leading
    tick(clock, [b])
    assert lb.leading and lb.previous_holder == "a"


def test_the_election_loop_survives_every_error(monkeypatch):
    """The loop a thread runs: errors reading the Lease (what ended the client's election
    thread) are logged and tried again; it never returns."""
    import threading
    import time

    from mlsched.controller.process import leadership

    class Flaky(MemoryLeaseStore):
        calls = 0

        def read(self):
            self.calls += 1
            if self.calls in (2, 3):
                raise RuntimeError("MaxRetryError: NewConnectionError")
            if self.calls == 4:
                raise ValueError("a body that is not JSON")
            return super().read()

    monkeypatch.setattr(leadership, "RETRY_S", 0.01)
    store = Flaky()
    lead = Leadership(leading=False)
    election = leadership.Election(lead, store, "a", on_won=lambda: None, on_lost=lambda: None)
    thread = threading.Thread(target=election.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    while store.calls < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert thread.is_alive() and store.calls >= 10 and lead.leading


def test_writes_are_refused_before_they_are_sent_when_the_lease_lapsed():
    from mlsched.controller.kube.kube import NotLeading, _request

    sent = []
    clock = Clock()
    lead = Leadership(leading=False, clock=clock)
    lead.hold_until(clock.now + 6)
    assert _request(lambda: lead.leading, lambda **_: sent.append(1) or FakeResponse(), (), {}) \
        == b"{}"
    clock.now += 6
    with pytest.raises(NotLeading):
        _request(lambda: lead.leading, lambda **_: sent.append(1) or FakeResponse(), (), {})
    assert sent == [1]


class FakeResponse:
    data = b"{}"

    def release_conn(self):
        pass

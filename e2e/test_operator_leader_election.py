"""Leader election through API-server outages (issue 55), on a control plane of this module's
own whose API server keeps an audit log of the operator's writes.

Two replicas, jobs running. kube-apiserver SIGKILLed and down 4 s; later stopped for 20 s.
After each: exactly one replica leads (its `mlsched_leader` is 1 and it renews the Lease), the
other stands by, and jobs created afterwards are scheduled. Then the leader is frozen
(SIGSTOP) past its Lease: the other takes over, the thawed one restarts in place as a
standby; killing the new leader hands back to it, so it campaigned all along. Throughout, the API server's own audit log shows
no two writers: no replica writes anything but the Lease while another holds it (every write
of a replica falls while its own Lease acquisition or renewal is the latest the API server
accepted). Before issue 55 the election thread of both replicas died in the first outage
(`MaxRetryError` reading the Lease) and the leader went on writing with a frozen Lease."""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import datetime

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from controlplane import ControlPlane
from job_state import placed_as_decided, placement_problems
from mlsched.controller.kube.constants import LEADER_LABEL
from mlsched_objects import install_crds, mljob, scheduling_policy
from operator_identity import NAMESPACE as OPERATOR_NAMESPACE
from operator_identity import USER, operator_kubeconfig
from plane_fixture import running_plane
from waiting import wait_for

LEASE = "mlsched-operator"
TAKEOVER_S = 15
WRITES = ["create", "update", "patch", "delete", "deletecollection"]
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata", "users": [USER], "verbs": WRITES}, {"level": "None"}],
}


# A control plane of this module's own: its API server is taken down twice, and audited.
@pytest.fixture(scope="module")
def control_plane(node_shape):
    yield from running_plane(ControlPlane(audit_policy=AUDIT_POLICY), lambda p: p.create_nodes(
        node_shape.count, cpu=node_shape.cpu, gpu=node_shape.gpu,
        memory_gib=node_shape.memory_gib))


@pytest.fixture(scope="module")
def api(control_plane):
    api_client = control_plane.api_client()
    yield api_client
    api_client.close()


@pytest.fixture(scope="module")
def crds(api):
    return install_crds(api)


@pytest.fixture(scope="module")
def operator_identity(control_plane, api, tmp_path_factory):
    return operator_kubeconfig(api, control_plane.apiserver_url, control_plane.ca_cert_path,
                               tmp_path_factory.mktemp("operator") / "operator.kubeconfig")


def _lease(coordination: client.CoordinationV1Api):
    try:
        return coordination.read_namespaced_lease(LEASE, OPERATOR_NAMESPACE).spec
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def _leader_metric(operator) -> float | None:
    try:
        with operator._open("/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except Exception:  # noqa: BLE001 - a replica restarting in place does not answer
        return None
    for line in text.splitlines():
        if line.startswith("mlsched_leader "):
            return float(line.split()[1])
    return None


def _replica_pod(core: client.CoreV1Api, name: str) -> None:
    """The Pod object a replica labels (never scheduled: it tolerates no kwok taint)."""
    core.create_namespaced_pod(OPERATOR_NAMESPACE, {
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "mlsched-operator"}},
        "spec": {"containers": [{"name": "operator", "image": "mlsched-operator:e2e"}]}})


def _labelled(core: client.CoreV1Api) -> set[str]:
    return {p.metadata.name for p in core.list_namespaced_pod(
        OPERATOR_NAMESPACE, label_selector=f"{LEADER_LABEL}=true").items}


def _one_leader(replicas: dict, coordination) -> str:
    """Waits until exactly one replica leads, by its own word and the Lease's, and renews:
    returns its name."""
    def settled():
        metrics = {name: _leader_metric(r) for name, r in replicas.items()}
        leading = [n for n, m in metrics.items() if m == 1.0]
        lease = _lease(coordination)
        if len(leading) != 1 or any(m is None for m in metrics.values()) or lease is None \
                or lease.holder_identity != leading[0]:
            return None
        return leading[0], lease.renew_time

    first = wait_for(settled, 90, "exactly one replica to lead and hold the Lease",
                     describe=lambda: ({n: _leader_metric(r) for n, r in replicas.items()},
                                       _lease(coordination)))
    # ... and go on leading while the other stays a standby: two renewals of the Lease by the
    # same leader seen (its acts, not a fixed sleep).
    renewals = set()

    def renewing():
        now = settled()
        if now and now[0] == first[0] and now[1] > first[1]:
            renewals.add(now[1])
        return len(renewals) >= 2 and now

    again = wait_for(renewing, 20, f"{first[0]} to go on leading and renew the Lease twice",
                     describe=lambda: (first, sorted(renewals), settled()))
    assert again[0] == first[0] and again[1] > first[1], (first, again)
    return first[0]


def _placed(mlsched, names: list[str], seconds: float) -> None:
    wait_for(lambda: all(placed_as_decided(mlsched, n) and
                         (mlsched.job(n).get("status") or {}).get("phase") == "Running"
                         for n in names), seconds, f"{names} to be placed and Running",
             describe=lambda: {n: placement_problems(mlsched, n) for n in names})


def _time(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def two_writers(audit_lines: list[str], agents: dict[str, str]) -> list[str]:
    """Writes of a replica while another held the Lease, by the API server's clock: each
    replica's write must come after the latest accepted Lease write (acquisition or renewal)
    before it was received, and that one must be its own."""
    events = [json.loads(line) for line in audit_lines if line.strip()]
    events = [e for e in events if e.get("stage") == "ResponseComplete"
              and e.get("user", {}).get("username") == USER and "objectRef" in e]
    lease_writes = sorted(
        (_time(e["stageTimestamp"]), agents[e["userAgent"]]) for e in events
        if e["objectRef"].get("resource") == "leases" and e["userAgent"] in agents
        and 200 <= e.get("responseStatus", {}).get("code", 0) < 300)
    problems = []
    for e in events:
        if e["objectRef"].get("resource") == "leases":
            continue
        who = agents.get(e.get("userAgent", ""))
        assert who is not None, f"a write by the operator's user from {e.get('userAgent')!r}"
        received = _time(e["requestReceivedTimestamp"])
        holder = None
        for when, name in lease_writes:
            if when > received:
                break
            holder = name
        if holder != who:
            ref = e["objectRef"]
            problems.append(f"{received.isoformat()} {who} {e['verb']} {ref.get('resource')}/"
                            f"{ref.get('name')} while the Lease was {holder}'s")
    return problems


def test_leader_election_survives_api_server_outages_with_never_two_writers(
        api, control_plane, mlsched, start_operator):
    coordination = client.CoordinationV1Api(api)
    core = client.CoreV1Api(api)
    replicas, agents = {}, {}
    shared_url: list[str] = []
    for name in ("replica-a", "replica-b"):
        _replica_pod(core, name)
        replicas[name] = start_operator(
            extra_env={"POD_NAME": name, "POD_NAMESPACE": OPERATOR_NAMESPACE},
            extra_args=["--leader-election", f"{OPERATOR_NAMESPACE}/{LEASE}",
                        "--leader-identity", name,
                        *(["--progress-url", shared_url[0]] if shared_url else [])])
        shared_url.append(replicas[name].progress_url)
        agents[f"mlsched-operator ({name})"] = name
    leader = _one_leader(replicas, coordination)
    wait_for(lambda: _labelled(core) == {leader}, 10, "the leader to label its pod")

    mlsched.create(scheduling_policy("default"))
    for i in range(3):
        mlsched.create(mljob(f"before-{i}", ps=(1, 1), workers=(1, 2)))
    _placed(mlsched, [f"before-{i}" for i in range(3)], 120)

    outages = [("SIGKILL, down 4 s", dict(crash=True, down_s=4.0)),
               ("stopped, down 20 s", dict(crash=False, down_s=20.0))]
    for number, (what, how) in enumerate(outages):
        print(f"kube-apiserver {what}")
        control_plane.restart_apiserver(**how)
        leader = _one_leader(replicas, coordination)
        assert all(r.running() for r in replicas.values()), "a replica exited"
        print(f"after the outage ({what}) {leader} leads")
        wait_for(lambda: _labelled(core) == {leader}, 20, "only the leader's pod labelled",
                 describe=lambda: _labelled(core))
        # The leader schedules: a job created now runs.
        mlsched.create(mljob(f"after-{number}", ps=(1, 1), workers=(1, 1)))
        _placed(mlsched, [f"after-{number}"], 120)

    # The leader frozen (SIGSTOP: a long GC pause, a VM migrated) past its Lease: the other
    # takes over; the old one, thawed, is fenced already, finds the Lease taken and restarts
    # in place as a standby.
    frozen, other = leader, ({"replica-a", "replica-b"} - {leader}).pop()
    os.kill(replicas[frozen].pid, signal.SIGSTOP)
    try:
        wait_for(lambda: (_lease(coordination) or client.V1LeaseSpec()).holder_identity == other,
                 TAKEOVER_S + 5, "the other replica to take the frozen leader's Lease")
        # ... and leads by its own word before the frozen one thaws (not a fixed sleep).
        wait_for(lambda: _leader_metric(replicas[other]) == 1.0, 10,
                 "the other replica to lead", describe=lambda: _leader_metric(replicas[other]))
    finally:
        os.kill(replicas[frozen].pid, signal.SIGCONT)
    wait_for(lambda: "restarting as a standby" in replicas[frozen].log_path.read_text(), 20,
             "the thawed replica to find its Lease taken")
    leader = _one_leader(replicas, coordination)
    assert leader == other
    wait_for(lambda: _labelled(core) == {leader}, 20, "only the new leader's pod labelled",
             describe=lambda: _labelled(core))
    mlsched.create(mljob("after-freeze", ps=(1, 1), workers=(1, 1)))
    _placed(mlsched, ["after-freeze"], 120)

    # The restarted replica campaigns: killing the leader hands over to it.
    standby = frozen
    replicas[leader].kill()
    killed = time.monotonic()
    wait_for(lambda: (_lease(coordination) or client.V1LeaseSpec()).holder_identity == standby
             and _leader_metric(replicas[standby]) == 1.0, TAKEOVER_S + 5,
             "the standby to take over from the killed leader")
    took = time.monotonic() - killed
    print(f"{standby} took over {took:.1f} s after the leader's SIGKILL")
    assert took <= TAKEOVER_S
    wait_for(lambda: _labelled(core) == {standby}, 20, "the new leader's pod labelled alone",
             describe=lambda: _labelled(core))
    mlsched.create(mljob("after-takeover", ps=(1, 1), workers=(1, 1)))
    _placed(mlsched, ["after-takeover"], 120)

    problems = two_writers(control_plane.audit_log_path.read_text().splitlines(), agents)
    assert not problems, "\n".join(problems[:20])
    # The lease chatter is gone from the log: renewals are at debug level.
    for name, replica in replicas.items():
        log = replica.log_path.read_text(errors="replace")
        assert log.count("renewed the Lease") <= 2, (name, log.count("renewed the Lease"))
        assert "Traceback" not in log or "leader" not in log.split("Traceback", 1)[1][:2000], \
            (name, log[-3000:])
    for name in replicas:
        core.delete_namespaced_pod(name, OPERATOR_NAMESPACE, grace_period_seconds=0)

"""Does what the API server stores for a job agree with what its policy decided?

The decision is recorded in the MLJob's status (replicaStatuses.<role>.desired and
placement.<role>, a node per ordinal). It is applied when each role's StatefulSet
has exactly that many replicas and pod k of the role runs on placement[k], with no
other pod of the job alive. Tests poll for this (the operator applies a decision
within a round) and then assert on it.

And what else the API server stores of a job that several test modules read: its pods
running, its desired counts, a condition's reason, its Events (placed at once, refused
creates).
"""

from __future__ import annotations

import re

from kubernetes import client

from mlsched_objects import MLSched, ROLE_LABEL, condition, ordinal
from waiting import wait_for


def roles_of(job: dict) -> tuple[str, ...]:
    return ("ps", "worker") if job["spec"]["architecture"] == "ParameterServer" else ("worker",)


def placement_problems(mlsched: MLSched, name: str) -> list[str]:
    """Why the job's children do not (yet) match its recorded decision; [] when they do."""
    job = mlsched.job(name)
    if job is None:
        return [f"MLJob {name} does not exist"]
    status = job.get("status") or {}
    placement, desired = status.get("placement") or {}, status.get("replicaStatuses") or {}
    sets = mlsched.statefulsets(name)
    live = [p for p in mlsched.pods(name) if not p.metadata.deletion_timestamp]
    problems = []
    for role in roles_of(job):
        nodes = placement.get(role) or []
        wanted = (desired.get(role) or {}).get("desired")
        if not nodes:
            problems.append(f"{role}: no placement recorded")
            continue
        if wanted != len(nodes):
            problems.append(f"{role}: desired {wanted} but {len(nodes)} nodes placed")
        replicas = sets[role].spec.replicas if role in sets else None
        if replicas != len(nodes):
            problems.append(f"{role}: StatefulSet replicas {replicas}, decision {len(nodes)}")
        pods = {}
        for pod in live:
            if pod.metadata.labels.get(ROLE_LABEL) == role:
                pods.setdefault(ordinal(pod), []).append(pod)
        if sorted(pods) != list(range(len(nodes))):
            problems.append(f"{role}: pod ordinals {sorted(pods)}, want 0..{len(nodes) - 1}")
        for k, same in pods.items():
            if len(same) > 1:
                problems.append(f"{role}-{k}: {len(same)} pods")
            pod = same[0]
            where = nodes[k] if k < len(nodes) else None
            if pod.status.phase != "Running" or pod.spec.node_name != where:
                problems.append(f"{pod.metadata.name}: {pod.status.phase} on "
                                f"{pod.spec.node_name}, decided {where}")
    return problems


def placed_as_decided(mlsched: MLSched, name: str) -> dict | None:
    """The job's status once its children match it (see the module docstring), else None."""
    if placement_problems(mlsched, name):
        return None
    return mlsched.job(name)["status"]


def all_running(mlsched, name: str, at_least: int):
    """Every pod the job was decided (status.replicaStatuses), at least `at_least`, Running;
    None until then (the StatefulSet creates them a few at a time)."""
    status = (mlsched.job(name) or {}).get("status") or {}
    desired = ((status.get("replicaStatuses") or {}).get("worker") or {}).get("desired") or 0
    pods = mlsched.pods(name)
    if desired < at_least or len(pods) != desired or any(p.status.phase != "Running" for p in pods):
        return None
    return pods


def wait_all_running(mlsched, name: str, at_least: int):
    return wait_for(lambda: all_running(mlsched, name, at_least), 90, f"every pod of {name} to run",
                    describe=lambda: [(p.metadata.name, p.status.phase, p.spec.node_name)
                                      for p in mlsched.pods(name)])


def _reason(mlsched, name: str, kind: str) -> tuple[str, str] | None:
    c = condition(mlsched.job(name), kind)
    return (c["reason"], c.get("message", "")) if c else None


def placed_at_once(mlsched, name: str) -> None:
    reasons = [e.reason for e in mlsched.events(name, "MLJob")]
    assert "Displaced" not in reasons and "Unschedulable" not in reasons, reasons


def waits_saying(mlsched, name: str, words: str) -> str:
    reason, message = wait_for(
        lambda: (r := _reason(mlsched, name, "Admitted")) and words in r[1] and r, 60,
        f"{name} to say why it waits", describe=lambda: _reason(mlsched, name, "Admitted"))
    assert reason == "WaitingForAllocation", (reason, message)
    assert mlsched.pods(name) == []
    return message


def refused_for_good(mlsched) -> list[str]:
    """The FailedCreate Events of pods that do not exist now. A create refused by the quota
    and then made is Kubernetes' own accounting: a full quota refuses even the create of a pod
    that exists (its admission runs before the name is looked up), which the StatefulSet
    controller sends when its cache has not seen the pod yet; seen once in CI for a job whose
    four pods all ran."""
    have = {p.metadata.name for p in mlsched.pods()}
    out = []
    for e in mlsched.core.list_namespaced_event(mlsched.namespace).items:
        found = re.search(r"create Pod (\S+) in StatefulSet", e.message or "")
        if e.reason == "FailedCreate" and not (found and found.group(1) in have):
            out.append(e.message)
    return out


def running_reason(mlsched, name: str) -> tuple[str, str] | None:
    c = condition(mlsched.job(name), "Running")
    return (c["reason"], c.get("message", "")) if c else None


def counts(mlsched, name: str) -> dict[str, int]:
    desired = ((mlsched.job(name) or {}).get("status") or {}).get("replicaStatuses") or {}
    return {role: (desired.get(role) or {}).get("desired", 0) for role in ("ps", "worker")}


def running_pod(mlsched, job: str) -> client.V1Pod:
    return wait_for(lambda: next((p for p in mlsched.pods(job) if p.status.phase == "Running"),
                                 None), 90, f"a running pod of {job}")

"""Does what the API server stores for a job agree with what its policy decided?

The decision is recorded in the MLJob's status (replicaStatuses.<role>.desired and
placement.<role>, a node per ordinal). It is applied when each role's StatefulSet
has exactly that many replicas and pod k of the role runs on placement[k], with no
other pod of the job alive. Tests poll for this (the operator applies a decision
within a round) and then assert on it.
"""

from __future__ import annotations

from mlsched_objects import MLSched, ROLE_LABEL, ordinal


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

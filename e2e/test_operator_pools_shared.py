"""Harmony's pools live beside other tenants (issue 55, point 2; docs/grouping.md, "In the
cluster"): a `grouping: harmony` policy with 20 jobs labels only nodes no other tenant's pods
use, labels no pool of one job, and a `grouping: none` policy's new job in another namespace
runs at once on the free nodes.

Before: the harmony policy made pools of one job and labelled nearly every node, including
nodes full of other namespaces' pods, and the other namespace's new job waited with "its
grouping has not given it a node pool yet" (its own policy does not group) while nodes were
empty: its admission step read the other policy's labels as pools in force.

Everything is read as a user would with kubectl: node labels and annotations, the jobs'
status.phase, status.group and Admitted condition, pods' nodes, Events. The test gives its
operator 16 kwok nodes of its own (8 CPU, 2 GPU, 48 GiB; a node selector on a label only they
carry), so the session's other nodes are left to the other tests. The operator runs with
--label-nodes and the nodes patch rule of manifests/overlays/label-nodes.
"""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from mlsched_objects import OWNER, POOL_LABEL, condition, mljob, phase, scheduling_policy
from operator_fixtures import own_nodes
from signals import utc_now, wait_for_rounds
from waiting import wait_for

SELECT = "e2e.mlsched.io/pools-shared"
NODES = 16  # 32 GPUs: team B's 6 + 1, team A's 20 (one worker each), some left
HARMONY_JOBS = 20
MODELS = ("dssm", "wlm", "resnet-50", "seq2seq", "vgg-16")
TEAM_B_JOBS = 3  # each two one-GPU workers (AllReduce): spread over up to six nodes


@pytest.fixture
def pool_nodes(api, control_plane, mlsched):
    yield from own_nodes(api, control_plane, NODES, "pools", SELECT, mlsched.namespace,
                         cpu=8, gpu=2, memory_gib=48)


@pytest.fixture
def shared_operator(label_rights, pool_nodes, start_operator, mlsched, second_tenant):
    # start_operator after the nodes and rights: its teardown (jobs deleted, pods gone) first.
    return start_operator(namespaces=[mlsched.namespace, second_tenant.namespace],
                          extra_args=["--label-nodes"],
                          extra_env={"MLSCHED_NODE_SELECTOR": f"{SELECT}={mlsched.namespace}"})


def labels(core, nodes) -> dict[str, tuple[str | None, str | None]]:
    """node -> (mlsched.io/pool, mlsched.io/pool-owner), as `kubectl get nodes` shows them."""
    out = {}
    for name in nodes:
        meta = core.read_node(name).metadata
        out[name] = ((meta.labels or {}).get(POOL_LABEL), (meta.annotations or {}).get(OWNER))
    return out


def nodes_of(tenant) -> set[str]:
    return {p.spec.node_name for p in tenant.pods()
            if p.spec.node_name and not p.metadata.deletion_timestamp}


def running(tenant, names) -> list[str]:
    return [n for n in names if phase(tenant.job(n)) == "Running"]


def trespass(core, nodes, owner: str, tenant) -> dict[str, str]:
    """Nodes labelled into `owner`'s pools while the other tenant's pods run there."""
    theirs = nodes_of(tenant)
    return {n: v for n, (v, o) in labels(core, nodes).items() if o == owner and n in theirs}


def single_pools(core, nodes, owner: str, team) -> dict[str, list[str]]:
    """Pool labels of `owner` on nodes that one job or none of its team is in (status.group)."""
    members: dict[str, list[str]] = {}
    for job in team.jobs():
        group = (job.get("status") or {}).get("group")
        if group:
            members.setdefault(group, []).append(job["metadata"]["name"])
    values = {v for v, o in labels(core, nodes).values() if o == owner}
    return {v: members.get(v, []) for v in values if len(members.get(v, [])) < 2}


# pool_nodes before second_tenant: second_tenant sets up start_operator, and fixtures are torn
# down in the reverse order, so the jobs are deleted and their pods waited out while their
# nodes still exist. Nodes deleted first left their pods to the pod garbage collector, which
# deletes the pods of a vanished node only after a 40 s quarantine: 50 s of teardown.
def test_a_harmony_policy_leaves_other_tenants_their_nodes(api, mlsched, pool_nodes,
                                                           second_tenant, shared_operator):
    core = client.CoreV1Api(api)
    team_a, team_b = mlsched, second_tenant
    owner_a = f"{team_a.namespace}/default"

    # Team B runs first under a policy that does not group. A day-long interval: what happens
    # to its new job below is the admission step's doing, not a round's.
    team_b.create(scheduling_policy("default", grouping="none", interval=86400))
    b_jobs = [f"b-{i}" for i in range(TEAM_B_JOBS)]
    for name in b_jobs:
        team_b.create(mljob(name, ps=None, workers=(2, 2), epochs=1e9))
    wait_for(lambda: len(running(team_b, b_jobs)) == TEAM_B_JOBS, 120, "team B's jobs to run",
             describe=lambda: {n: phase(team_b.job(n)) for n in b_jobs})

    # Team A: harmony co-location over the same nodes, 20 jobs.
    team_a.create(scheduling_policy("default", grouping="harmony", interval=1200,
                                    pools={"mode": "LabelNodes", "minStaySeconds": 0}))
    a_jobs = [f"a-{i}" for i in range(HARMONY_JOBS)]
    for i, name in enumerate(a_jobs):
        team_a.create(mljob(name, model=MODELS[i % len(MODELS)], ps=(1, 1), workers=(1, 1),
                            epochs=1e9))

    def a_settled():
        pools = {v for v, o in labels(core, pool_nodes).values() if o == owner_a}
        up = running(team_a, a_jobs)
        return pools and len(up) >= HARMONY_JOBS // 2 and (pools, len(up))

    wait_for(a_settled, 180, "team A's pools and most of its jobs running",
             describe=lambda: (labels(core, pool_nodes), running(team_a, a_jobs)))
    # Sampled over two rounds (one every 6 s) and the admission steps of team A: the rounds
    # counted by its status.lastRoundTime, not a fixed time that a loaded machine may fill
    # with fewer of them.
    bad_labels: dict[str, str] = {}
    singles: dict[str, list[str]] = {}

    def sample() -> None:
        bad_labels.update(trespass(core, pool_nodes, owner_a, team_b))
        singles.update(single_pools(core, pool_nodes, owner_a, team_a))

    wait_for_rounds(team_a, "default", 2, timeout=60, interval=1.0, sample=sample)

    # Team B's new job runs within 10 s, on the nodes left free.
    free_before = {n for n, (v, o) in labels(core, pool_nodes).items() if o is None}
    team_b.create(mljob("late", ps=None, workers=(1, 1), epochs=1e9))
    created = time.monotonic()
    said = set()  # what its Admitted condition said while it waited (kubectl describe)
    while phase(team_b.job("late")) != "Running" and time.monotonic() - created < 30:
        said.add((condition(team_b.job("late"), "Admitted") or {}).get("message") or "")
        time.sleep(0.25)
    took = time.monotonic() - created
    ran = utc_now()
    admitted = condition(team_b.job("late"), "Admitted") or {}
    # Every check is collected, so that a failure shows all that is wrong at once.
    problems = []
    if any("its grouping has not given it a node pool" in m for m in said):
        problems.append(f"team B's new job waited for a pool its policy never makes: {said}")
    if took > 10.0:
        problems.append(f"team B's new job took {took:.1f} s to run ({phase(team_b.job('late'))}, "
                        f"Admitted: {admitted}); nodes free of team A's pools before: "
                        f"{sorted(free_before)}")

    # Labels attract, they never repel: had the new job landed on a node of team A's pools,
    # team A's next round (every 6 s) takes that node out of them. Sampled after it: two
    # rounds of team A since the job ran (the second has seen its pods), then over the next.
    settled = wait_for_rounds(team_a, "default", 2, since=ran, timeout=60)
    wait_for_rounds(team_a, "default", 1, since=settled, timeout=60, interval=1.0, sample=sample)
    # No node running team B's pods carries a label of team A's pools ...
    if bad_labels:
        problems.append(f"nodes running team B's pods labelled into team A's pools: {bad_labels}")
    # ... no pool label is held by a single job ...
    if singles:
        problems.append(f"team A's pools of one job (pool: members): {singles}")
    # ... and status.groups, what `kubectl get schedulingpolicy -o yaml` shows, agrees.
    groups = ((team_a.policy("default") or {}).get("status") or {}).get("groups") or []
    if any(len(g["members"]) < 2 for g in groups):
        problems.append(f"status.groups has pools of one job: "
                        f"{[(g['name'], g['members']) for g in groups if len(g['members']) < 2]}")
    # Team B's jobs were never stopped by team A's grouping.
    if running(team_b, [*b_jobs, "late"]) != [*b_jobs, "late"]:
        problems.append(f"team B's jobs not all running: "
                        f"{ {n: phase(team_b.job(n)) for n in [*b_jobs, 'late']} }")
    assert not problems, "\n".join(problems)
    assert shared_operator.running(), shared_operator.log_tail()

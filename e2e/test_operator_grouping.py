"""Harmony co-location in the cluster (docs/grouping.md, "In the cluster"): pools as node
labels, required node affinity, CPU shares, status.group / status.groups, Events, the metric;
regrouping against the threshold; grouping turned off; deleted jobs.

Each test gives its operator three kwok nodes of its own (a node selector on a label the
test sets; the session's other nodes are left to the other tests) and a fourth carrying an
admin's mlsched.io/pool label, which the operator must neither use nor touch. The operator
runs with --label-nodes and, for these tests only, the nodes patch rule of
manifests/overlays/label-nodes bound to its ServiceAccount (the least-privilege test checks
the default install has none).
"""

from __future__ import annotations

import pytest
from kubernetes import client

from mlsched_objects import OWNER, POOL_LABEL, mljob, scheduling_policy
from operator_fixtures import INTERVAL_SCALE
from waiting import wait_for

SELECT = "e2e.mlsched.io/grouping"
NODES = [f"kwok-node-{i}" for i in (9, 10, 11)]
ADMINS = "kwok-node-12"


@pytest.fixture
def grouping_nodes(api, mlsched):
    """Three nodes for this test's operator, and a fourth with an admin's pool label."""
    core = client.CoreV1Api(api)

    def label(name, labels):
        core.patch_node(name, {"metadata": {"labels": labels}},
                        _content_type="application/merge-patch+json")

    for name in NODES:
        label(name, {SELECT: mlsched.namespace})
    label(ADMINS, {SELECT: mlsched.namespace, POOL_LABEL: "admins-own"})
    yield core
    for name in [*NODES, ADMINS]:  # whatever a failed test left
        label(name, {SELECT: None, POOL_LABEL: None})
        core.patch_node(name, {"metadata": {"annotations": {OWNER: None}}},
                        _content_type="application/merge-patch+json")


@pytest.fixture
def grouping_operator(label_rights, grouping_nodes, start_operator, mlsched):
    # start_operator after the nodes and rights: its teardown (the policies deleted, the
    # operator stopped) runs before theirs.
    return start_operator(extra_args=["--label-nodes"],
                          extra_env={"MLSCHED_NODE_SELECTOR": f"{SELECT}={mlsched.namespace}"})


def node_pools(core) -> dict[str, tuple[str | None, str | None]]:
    out = {}
    for name in [*NODES, ADMINS]:
        meta = core.read_node(name).metadata
        out[name] = ((meta.labels or {}).get(POOL_LABEL), (meta.annotations or {}).get(OWNER))
    return out


def groups(mlsched) -> list[dict]:
    return ((mlsched.policy("default") or {}).get("status") or {}).get("groups") or []


def group_of(mlsched, job: str) -> str | None:
    return ((mlsched.job(job) or {}).get("status") or {}).get("group")


def pool_affinity(pod_spec) -> set[str]:
    affinity = pod_spec.affinity
    if affinity is None or affinity.node_affinity is None:
        return set()
    required = affinity.node_affinity.required_during_scheduling_ignored_during_execution
    return {v for term in (required.node_selector_terms if required else ())
            for e in term.match_expressions or () if e.key == POOL_LABEL for v in e.values}


def consistent(mlsched, core, jobs, ungrouped=()) -> str | None:
    """What still differs from a settled grouping: every job of `jobs` in a pool of
    status.groups, its status.group that pool, its StatefulSets and Running pods requiring
    it, its pods on its nodes, which carry the pool's label (and no others do); every job of
    `ungrouped` (a group of one job gets no pool) Running with no pool, off the pools' nodes."""
    found = groups(mlsched)
    members = {m: g for g in found for m in g["members"]}
    if set(members) != set(jobs):
        return f"members {sorted(members)}"
    labelled = {n: v for n, (v, owner) in node_pools(core).items() if owner}
    wanted = {n: g["name"] for g in found for n in g["nodes"]}
    if labelled != wanted:
        return f"labels {labelled} != groups' nodes {wanted}"
    for job in ungrouped:
        if group_of(mlsched, job):
            return f"{job}: status.group {group_of(mlsched, job)}, a pool of one job"
        pods = mlsched.pods(job)
        if not pods or any(p.status.phase != "Running" or p.metadata.deletion_timestamp
                           or pool_affinity(p.spec) or p.spec.node_name in labelled
                           for p in pods):
            return f"{job}: pods {[(p.metadata.name, p.status.phase, p.spec.node_name) for p in pods]}"
    for job in jobs:
        g = members[job]
        if group_of(mlsched, job) != g["name"]:
            return f"{job}: status.group {group_of(mlsched, job)} != {g['name']}"
        for sts in mlsched.statefulsets(job).values():
            if pool_affinity(sts.spec.template.spec) != {g["name"]}:
                return f"{sts.metadata.name}: template requires {pool_affinity(sts.spec.template.spec)}"
        pods = mlsched.pods(job)
        if not pods or any(p.status.phase != "Running" or p.metadata.deletion_timestamp
                           for p in pods):
            return f"{job}: pods {[(p.metadata.name, p.status.phase) for p in pods]}"
        for p in pods:
            if pool_affinity(p.spec) != {g["name"]} or p.spec.node_name not in g["nodes"]:
                return f"{p.metadata.name} on {p.spec.node_name}, requires {pool_affinity(p.spec)}"
    return None


def reasons(mlsched, name, kind) -> list[str]:
    return [e.reason for e in mlsched.events(name, kind)]


def children_exist(mlsched, jobs):
    return all(len(mlsched.statefulsets(j)) == 2 for j in jobs)


def test_complementary_jobs_share_a_pool_and_their_pods_land_on_its_nodes(
        api, mlsched, grouping_operator):
    core = client.CoreV1Api(api)
    jobs = {"resnet": "resnet-50", "dssm": "dssm", "wlm": "wlm"}
    for name, model in jobs.items():
        mlsched.create(mljob(name, model=model))
    wait_for(lambda: children_exist(mlsched, jobs), 60, "the jobs' StatefulSets")
    # The policy comes last, so that its first round groups the three together.
    mlsched.create(scheduling_policy("default", grouping="harmony",
                                     pools={"mode": "LabelNodes", "minStaySeconds": 0}))
    pair = ["dssm", "wlm"]
    wait_for(lambda: consistent(mlsched, core, pair, ["resnet"]) is None, 120,
             "a settled grouping", describe=lambda: consistent(mlsched, core, pair, ["resnet"]))
    found = {tuple(g["members"]): g for g in groups(mlsched)}
    # dssm computes most of an iteration, wlm communicates: they share one node, time-sharing
    # its CPU; resnet-50 has the other two alone, with no pool (a pool of one job co-locates
    # nothing and would only fence nodes off from other tenants).
    shared = found[("dssm", "wlm")]
    assert (len(shared["nodes"]), shared["share"]) == (1, 2), found
    assert shared["predictedIterationSeconds"] > 0 and shared["predictedComputeUtilisation"] > 0
    assert list(found) == [("dssm", "wlm")], found
    for job in ("dssm", "wlm"):
        for pod in mlsched.pods(job):
            (container,) = pod.spec.containers
            assert container.resources.requests["cpu"] in ("1", "1000m")  # 2 CPU / share 2
            if pod.metadata.labels["mlsched.io/role"] == "worker":
                assert container.resources.requests["nvidia.com/gpu"] == "1"  # GPUs whole
    pools = node_pools(core)
    assert pools[ADMINS] == ("admins-own", None)  # an admin's label: not used, not touched
    assert all(p.spec.node_name != ADMINS for p in mlsched.pods())
    assert set(v for v, owner in pools.values() if owner) == {g["name"] for g in groups(mlsched)}
    assert all(owner in (None, f"{mlsched.namespace}/default") for _, owner in pools.values())
    # kubectl shows the pool; Events say what happened; the metric has each pool.
    assert mlsched.job("dssm")["status"]["group"] == shared["name"]
    assert shared["name"].startswith(f"{mlsched.namespace}.default.")
    assert "Regrouped" in reasons(mlsched, "default", "SchedulingPolicy")
    assert "Grouped" in reasons(mlsched, "wlm", "MLJob")
    metrics = grouping_operator.metrics()
    assert (f'mlsched_pool_utilisation{{kind="predicted",namespace="{mlsched.namespace}",'
            f'policy="default",pool="{shared["name"]}",resource="compute"}}') in metrics, metrics

    # Deleting a job leaves no stale pool: wlm's goes, and dssm, alone, leaves its pool.
    client.CustomObjectsApi(api).delete_namespaced_custom_object(
        "mlsched.io", "v1alpha1", mlsched.namespace, "mljobs", "wlm")
    wait_for(lambda: consistent(mlsched, core, [], ["dssm", "resnet"]) is None, 120,
             "the deleted job's pool to go",
             describe=lambda: consistent(mlsched, core, [], ["dssm", "resnet"]))
    assert groups(mlsched) == []

    # Grouping off: affinity, labels and status go; the admin's label stays.
    mlsched.patch_policy("default", {"grouping": "none"})

    def ungrouped():
        pools = node_pools(core)
        if any(owner for _, owner in pools.values()):
            return f"labels {pools}"
        if groups(mlsched):
            return f"groups {groups(mlsched)}"
        for job in ("dssm", "resnet"):
            if group_of(mlsched, job):
                return f"{job}: status.group {group_of(mlsched, job)}"
            for sts in mlsched.statefulsets(job).values():
                if pool_affinity(sts.spec.template.spec):
                    return f"{sts.metadata.name} still requires a pool"
            pods = mlsched.pods(job)
            if not pods or any(pool_affinity(p.spec) or p.status.phase != "Running" for p in pods):
                return f"{job}: pods {[(p.metadata.name, p.status.phase, pool_affinity(p.spec)) for p in pods]}"
        return None

    wait_for(lambda: ungrouped() is None, 120, "grouping to be undone", describe=ungrouped)
    assert node_pools(core)[ADMINS] == ("admins-own", None)
    assert grouping_operator.running(), grouping_operator.log_tail()


@pytest.mark.parametrize("threshold, regroups", [(0.0, True), (10.0, False)])
def test_an_arrival_regroups_only_when_the_gain_beats_the_threshold(
        api, mlsched, grouping_operator, threshold, regroups):
    core = client.CoreV1Api(api)
    first = {"dssm": "dssm", "wlm": "wlm", "resnet": "resnet-50"}
    for name, model in first.items():
        mlsched.create(mljob(name, model=model))
    wait_for(lambda: children_exist(mlsched, first), 60, "the jobs' StatefulSets")
    mlsched.create(scheduling_policy("default", grouping="harmony", pools={
        "mode": "LabelNodes", "minStaySeconds": 0, "threshold": threshold}))
    pair = ["dssm", "wlm"]
    wait_for(lambda: consistent(mlsched, core, pair, ["resnet"]) is None, 120,
             "the first grouping", describe=lambda: consistent(mlsched, core, pair, ["resnet"]))
    before = {job: (group_of(mlsched, job), (mlsched.job(job)["status"] or {}).get("groupSince"))
              for job in first}

    # seq2seq arrives: a fresh grouping would pair it with dssm (predicted 8 % better) and
    # move wlm out of its pool.
    mlsched.create(mljob("seq", model="seq2seq"))
    if regroups:
        wait_for(lambda: consistent(mlsched, core, ["dssm", "seq"], ["wlm", "resnet"]) is None,
                 180, "the arrival to be grouped",
                 describe=lambda: consistent(mlsched, core, ["dssm", "seq"], ["wlm", "resnet"]))
    else:
        wait_for(lambda: consistent(mlsched, core, pair, ["resnet", "seq"]) is None, 180,
                 "the arrival to run ungrouped",
                 describe=lambda: consistent(mlsched, core, pair, ["resnet", "seq"]))
    after = {job: (group_of(mlsched, job), (mlsched.job(job)["status"] or {}).get("groupSince"))
             for job in first}
    messages = [e.message for e in mlsched.events("default", "SchedulingPolicy")
                if e.reason == "Regrouped"]
    if regroups:
        # dssm and seq2seq now share a node; wlm left the pool, restarted without it.
        gain = mlsched.policy("default")["status"]["grouping"]["predictedGain"]
        assert gain > threshold
        assert after != before
        assert any(m.startswith("regrouped: predicted gain") and "moved" in m for m in messages), messages
        assert any(e.message.startswith("left pool ") for e in mlsched.events("wlm", "MLJob")
                   if e.reason == "Grouped")
    else:
        # The same gain is predicted, but it does not beat 1000 %: nobody running moves, and
        # seq2seq, in no group, runs at once on the nodes in none.
        assert after == before
    assert grouping_operator.running(), grouping_operator.log_tail()
    assert INTERVAL_SCALE < 1  # rounds every few seconds: the waits above span several


NODEPOOL = "e2e.example.com/nodepool"


def test_existing_pools_are_used_as_the_admin_labelled_them(api, mlsched, grouping_nodes,
                                                          start_operator):
    # No --label-nodes, no node rights: the admin's pools, e.g. a cloud provider's.
    core = grouping_nodes
    for name, pool in zip(NODES, ("pool-a", "pool-a", "pool-b")):
        core.patch_node(name, {"metadata": {"labels": {NODEPOOL: pool}}},
                        _content_type="application/merge-patch+json")
    try:
        start_operator(extra_env={"MLSCHED_NODE_SELECTOR": f"{SELECT}={mlsched.namespace}"})
        mlsched.create(scheduling_policy("default", grouping="isolated", pools={
            "mode": "ExistingPools", "labelKey": NODEPOOL}))
        for name in ("one", "two"):
            mlsched.create(mljob(name, model="resnet-50"))

        def settled():
            found = groups(mlsched)
            if sorted(m for g in found for m in g["members"]) != ["one", "two"]:
                return f"groups {found}"
            for g in found:
                (job,) = g["members"]
                if group_of(mlsched, job) != g["name"]:
                    return f"{job}: status.group {group_of(mlsched, job)}"
                pods = mlsched.pods(job)
                if not pods or any(p.status.phase != "Running" for p in pods):
                    return f"{job}: pods not running"
                for p in pods:
                    terms = p.spec.affinity.node_affinity \
                        .required_during_scheduling_ignored_during_execution.node_selector_terms
                    keys = {(e.key, tuple(e.values)) for t in terms for e in t.match_expressions}
                    if keys != {(NODEPOOL, (g["name"],))} or p.spec.node_name not in g["nodes"]:
                        return f"{p.metadata.name} on {p.spec.node_name} requires {keys}"
            return None

        wait_for(lambda: settled() is None, 120, "the jobs in the admin's pools", describe=settled)
        found = {g["name"]: g for g in groups(mlsched)}
        assert set(found) == {"pool-a", "pool-b"}
        assert sorted(found["pool-a"]["nodes"]) == sorted(NODES[:2]) and found["pool-b"]["nodes"] == NODES[2:]
        assert mlsched.policy("default")["status"]["grouping"]["labelKey"] == NODEPOOL
        # Nothing written on any node: no mark, the admin's labels as they were.
        assert all(owner is None for _, owner in node_pools(core).values())
        assert node_pools(core)[ADMINS] == ("admins-own", None)
    finally:
        for name in NODES:
            core.patch_node(name, {"metadata": {"labels": {NODEPOOL: None}}},
                            _content_type="application/merge-patch+json")


def test_the_grouping_guard_says_which_candidate_governs_and_serves_it(
        api, mlsched, grouping_operator):
    """spec.pools.guard (docs/grouping.md, "In the cluster"): harmony's grouping against
    isolated and none by rollouts in the simulator from the first round's snapshot; the one
    with the lowest summed JCT is in status.grouping.governing, and it is what runs."""
    core = client.CoreV1Api(api)
    jobs = {"resnet": "resnet-50", "dssm": "dssm", "wlm": "wlm"}
    for name, model in jobs.items():
        mlsched.create(mljob(name, model=model))
    wait_for(lambda: children_exist(mlsched, jobs), 60, "the jobs' StatefulSets")
    mlsched.create(scheduling_policy("default", grouping="harmony", pools={
        "mode": "LabelNodes", "minStaySeconds": 0, "guard": True}))

    def grouping():
        return ((mlsched.policy("default") or {}).get("status") or {}).get("grouping") or {}

    wait_for(lambda: grouping().get("governing"), 120, "status.grouping.governing",
             describe=grouping)
    found = grouping()
    estimates = found["estimates"]
    assert set(estimates) == {"harmony", "isolated", "none"}, found
    assert found["governing"] == min(estimates, key=estimates.get), found
    assert found["governingSince"] and found["governingMessage"].startswith(found["governing"])
    # What governs is what runs: isolated gives each job a pool of its own, harmony pools
    # dssm with wlm (resnet alone, ungrouped), none pools nothing.
    members, alone = {"isolated": (list(jobs), []), "harmony": (["dssm", "wlm"], ["resnet"]),
                      "none": ([], list(jobs))}[found["governing"]]
    wait_for(lambda: consistent(mlsched, core, members, alone) is None, 120,
             "the governing grouping, settled",
             describe=lambda: consistent(mlsched, core, members, alone))
    if found["governing"] == "isolated":
        assert all(len(g["members"]) == 1 and g["share"] == 1 for g in groups(mlsched))
    governed = [e for e in mlsched.events("default", "SchedulingPolicy")
                if e.reason == "GroupingGoverned"]
    assert bool(governed) == (found["governing"] != "harmony"), governed
    assert "colocationSamples" in grouping()

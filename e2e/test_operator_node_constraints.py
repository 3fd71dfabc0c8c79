"""A pod template's own node constraints (nodeSelector, required node affinity) are planned
with: the operator pins each task to a node the template allows, as a user of GPU types or
dedicated node groups writes them, and a job no node allows is told so and holds nothing."""

from __future__ import annotations

import contextlib

from kubernetes import client

from mlsched_objects import condition, mljob, scheduling_policy
from node_fixtures import DISK, labelled
from waiting import wait_for


def _running(mlsched, name: str) -> tuple[str, str] | None:
    c = condition(mlsched.job(name), "Running")
    return (c["reason"], c.get("message", "")) if c else None


def _pods_by_role(mlsched, job: str) -> dict[str, list[client.V1Pod]]:
    out: dict[str, list[client.V1Pod]] = {"ps": [], "worker": []}
    for pod in mlsched.pods(job):
        out[pod.metadata.labels["mlsched.io/role"]].append(pod)
    return out


def test_tasks_land_only_on_nodes_their_template_allows(control_plane, api, mlsched, operator):
    core = client.CoreV1Api(api)
    ssd = ["kwok-node-3", "kwok-node-7"]
    with labelled(core, ssd, DISK, "ssd"):
        mlsched.create(scheduling_policy("default", interval=600))
        # Workers only on the two ssd nodes (nodeSelector), a gang of four: every GPU there;
        # parameter servers never there (required node affinity, NotIn). A planner that
        # ignored the template would spread the gang over the least-loaded of 13 nodes.
        job = mljob("picky-disks", workers=(4, 4), ps=(1, 2))
        specs = job["spec"]["replicaSpecs"]
        specs["worker"]["template"]["spec"]["nodeSelector"] = {DISK: "ssd"}
        specs["ps"]["template"]["spec"]["affinity"] = {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": DISK, "operator": "NotIn", "values": ["ssd"]}]}]}}}
        mlsched.create(job)

        def settled():
            pods = _pods_by_role(mlsched, "picky-disks")
            if len(pods["worker"]) < 4 or not pods["ps"]:  # the gang, created in parallel
                return None
            if any(p.status.phase != "Running" for role in pods.values() for p in role):
                return None
            return pods

        pods = wait_for(settled, 90, "every pod of the job to run",
                        describe=lambda: [(p.metadata.name, p.status.phase, p.spec.node_name)
                                          for p in mlsched.pods("picky-disks")])
        worker_nodes = [p.spec.node_name for p in pods["worker"]]
        ps_nodes = [p.spec.node_name for p in pods["ps"]]
        assert set(worker_nodes) <= set(ssd), worker_nodes
        assert not set(ps_nodes) & set(ssd), ps_nodes
        # Every GPU of the two nodes used, none elsewhere: 2 nodes x 2 GPUs.
        assert len(worker_nodes) == 4, worker_nodes
        placement = mlsched.job("picky-disks")["status"]["placement"]
        assert set(placement["worker"]) <= set(ssd) and not set(placement["ps"]) & set(ssd)


def test_a_job_no_node_allows_is_told_so_and_holds_nothing(control_plane, mlsched, operator):
    mlsched.create(scheduling_policy("default", interval=600))
    job = mljob("nowhere")
    job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["nodeSelector"] = {
        "example.com/gpu-model": "h200"}
    mlsched.create(job)
    mlsched.create(mljob("fits", ps=None))

    reason, message = wait_for(lambda: (r := _running(mlsched, "nowhere")) and
                               r[0] == "CannotFit" and r, 60, "the job to be reported",
                               describe=lambda: _running(mlsched, "nowhere"))
    assert "worker" in message and "example.com/gpu-model=h200" in message, message
    warnings = [(e.reason, e.message) for e in mlsched.events("nowhere", "MLJob")
                if e.type == "Warning"]
    assert any(r == "CannotFit" and "example.com/gpu-model=h200" in m for r, m in warnings)
    described = control_plane.kubectl("describe", "mljob", "nowhere", "-n", mlsched.namespace).stdout
    assert "example.com/gpu-model=h200" in described
    # `kubectl get` says why at a glance (the REASON column).
    row = control_plane.kubectl("get", "mljob", "nowhere", "-n", mlsched.namespace,
                                "--no-headers").stdout.split()
    assert row[1:3] == ["Pending", "CannotFit"], row
    # The job that fits runs; the one that cannot holds no pod (not even its parameter server).
    wait_for(lambda: (_running(mlsched, "fits") or ("",))[0] == "AllRolesReady", 90,
             "the job that fits to run", describe=lambda: _running(mlsched, "fits"))
    assert mlsched.pods("nowhere") == []
    body = mlsched.job("nowhere")
    assert not any((body["status"].get("placement") or {}).get(role) for role in ("ps", "worker"))


@contextlib.contextmanager
def tainted(core: client.CoreV1Api, names: list[str], taint: dict):
    """Nodes of the shared plane given one more taint for one test, and without it after."""
    before = {n: list(core.read_node(n).spec.taints or []) for n in names}
    try:
        for name in names:
            core.patch_node(name, {"spec": {"taints": [
                *[t.to_dict() for t in before[name]], taint]}})
        yield
    finally:
        for name in names:
            core.patch_node(name, {"spec": {"taints": [t.to_dict() for t in before[name]] or None}})


def test_dedicated_nodes_are_used_only_by_jobs_that_tolerate_their_taint(control_plane, api,
                                                                        mlsched, operator):
    """The dedicated-node pattern: nodes tainted and labelled for one team; that team's
    templates tolerate the taint and select the label. The operator tolerates only its own
    taints for every pod, so other jobs stay off those nodes, and the team's job uses them."""
    core = client.CoreV1Api(api)
    team_nodes = ["kwok-node-5", "kwok-node-9"]
    taint = {"key": "e2e.mlsched.io/dedicated", "value": "team-x", "effect": "NoSchedule"}
    with labelled(core, team_nodes, "e2e.mlsched.io/team", "x"), tainted(core, team_nodes, taint):
        mlsched.create(scheduling_policy("default", interval=600, allocation="fixed"))
        team = mljob("team-job", workers=(4, 4), ps=(1, 1))
        for spec in (team["spec"]["replicaSpecs"][r]["template"]["spec"] for r in ("ps", "worker")):
            spec["tolerations"] = [*spec["tolerations"], {
                "key": "e2e.mlsched.io/dedicated", "operator": "Equal", "value": "team-x",
                "effect": "NoSchedule"}]
            spec["nodeSelector"] = {"e2e.mlsched.io/team": "x"}
        # Another job, wide enough that a planner ignoring the taint would use those nodes.
        mlsched.create(mljob("others", ps=None, workers=(22, 22)))
        mlsched.create(team)

        def running(job: str, count: int):
            """All `count` pods of the job Running (all of them: the StatefulSet creates
            them in parallel, and a check on the ones that exist so far raced that)."""
            pods = mlsched.pods(job)
            ok = len(pods) == count and all(p.status.phase == "Running" for p in pods)
            return pods if ok else None

        # 4 workers on the 2 nodes' 4 GPUs, and its PS.
        team_pods = wait_for(lambda: running("team-job", 5), 90, "the team's job to run",
                             describe=lambda: _running(mlsched, "team-job"))
        assert {p.spec.node_name for p in team_pods} <= set(team_nodes)
        # Every GPU of the other 11 nodes.
        others = wait_for(lambda: running("others", 22), 90, "the other job to run",
                          describe=lambda: _running(mlsched, "others"))
        assert not {p.spec.node_name for p in others} & set(team_nodes)


@contextlib.contextmanager
def with_extended_resource(core: client.CoreV1Api, name: str, resource: str, amount: str):
    """One node of the shared plane advertising an extended resource (as a device plugin's
    node status would), and without it after."""
    core.patch_node_status(name, {"status": {"capacity": {resource: amount},
                                             "allocatable": {resource: amount}}})
    try:
        yield
    finally:
        core.patch_node_status(name, {"status": {"capacity": {resource: None},
                                                 "allocatable": {resource: None}}})


def test_a_role_asking_for_an_extended_resource_runs_where_nodes_have_it(api, mlsched, operator):
    """A worker asking for `example.com/fpga` used to be pinned to any node and refused there
    by kube-scheduler ("Insufficient example.com/fpga"); now only the node that has the
    resource is planned on for it, and a job asking for more than any node has is CannotFit."""
    core = client.CoreV1Api(api)
    with with_extended_resource(core, "kwok-node-11", "example.com/fpga", "2"):
        mlsched.create(scheduling_policy("default", interval=600, allocation="fixed"))
        job = mljob("accelerated", ps=(1, 1), workers=(2, 2))
        worker = job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]
        for part in ("requests", "limits"):
            worker["resources"][part] = {**worker["resources"][part], "example.com/fpga": "1"}
        mlsched.create(job)
        greedy = mljob("greedy-fpga", ps=None, workers=(1, 1))
        worker = greedy["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]
        for part in ("requests", "limits"):
            worker["resources"][part] = {**worker["resources"][part], "example.com/fpga": "4"}
        mlsched.create(greedy)

        def running():
            pods = _pods_by_role(mlsched, "accelerated")
            ok = len(pods["worker"]) == 2 and pods["ps"] and all(
                p.status.phase == "Running" for role in pods.values() for p in role)
            return pods if ok else None

        pods = wait_for(running, 90, "the job's pods to run",
                        describe=lambda: _running(mlsched, "accelerated"))
        assert {p.spec.node_name for p in pods["worker"]} == {"kwok-node-11"}
        assert not [e for e in mlsched.events("accelerated", "MLJob") if e.reason == "Displaced"]
        reason, message = wait_for(lambda: (r := _running(mlsched, "greedy-fpga")) and
                                   r[0] == "CannotFit" and r, 60, "the greedy job to be told",
                                   describe=lambda: _running(mlsched, "greedy-fpga"))
        assert "requests 4 example.com/fpga" in message, message


def test_a_role_asking_for_scratch_disk_runs_where_nodes_have_it(api, mlsched, operator):
    """Pods asking for `ephemeral-storage` (a dataset staged on local disk) go only to nodes
    with that much; a job asking more than any node has is CannotFit in the units it was
    written in. The latter used to be admitted with every pod Pending ("Insufficient
    ephemeral-storage"), its GPUs held. (kwok nodes advertise no local storage: one is given
    400Gi for the test.)"""
    core = client.CoreV1Api(api)
    with with_extended_resource(core, "kwok-node-7", "ephemeral-storage", "400Gi"):
        mlsched.create(scheduling_policy("default", interval=600, allocation="fixed"))
        job = mljob("staged", ps=None, workers=(2, 2))
        worker = job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]
        worker["resources"]["requests"] = {**worker["resources"]["requests"],
                                           "ephemeral-storage": "150Gi"}
        mlsched.create(job)
        huge = mljob("huge-scratch", ps=None, workers=(1, 1))
        worker = huge["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]
        worker["resources"]["requests"] = {**worker["resources"]["requests"],
                                           "ephemeral-storage": "1Ti"}
        mlsched.create(huge)

        def running():
            pods = _pods_by_role(mlsched, "staged")
            ok = len(pods["worker"]) == 2 and all(p.status.phase == "Running" for p in pods["worker"])
            return pods if ok else None

        pods = wait_for(running, 90, "the job's pods to run",
                        describe=lambda: _running(mlsched, "staged"))
        assert {p.spec.node_name for p in pods["worker"]} == {"kwok-node-7"}
        assert not [e for e in mlsched.events("staged", "MLJob") if e.reason == "Displaced"]
        reason, message = wait_for(lambda: (r := _running(mlsched, "huge-scratch")) and
                                   r[0] == "CannotFit" and r, 60, "the job asking 1Ti to be told",
                                   describe=lambda: _running(mlsched, "huge-scratch"))
        assert "requests 1Ti ephemeral-storage" in message, message
        assert mlsched.pods("huge-scratch") == []


def test_a_template_s_own_node_pin_is_kept(mlsched, operator):
    """Workers pinned by the user (`nodeName`) and parameter servers pinned by the hostname
    label run there. Both pins used to be dropped from the rendered pods without a trace, and
    the tasks ran wherever placement chose (load-balancing spread them over the cluster)."""
    mlsched.create(scheduling_policy("default", interval=600))
    job = mljob("pinned-by-user", workers=(2, 2), ps=(1, 1))
    specs = job["spec"]["replicaSpecs"]
    specs["worker"]["template"]["spec"]["nodeName"] = "kwok-node-5"
    specs["ps"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "kwok-node-9"}
    mlsched.create(job)

    def running():
        pods = _pods_by_role(mlsched, "pinned-by-user")
        ok = len(pods["worker"]) == 2 and len(pods["ps"]) == 1 and all(
            p.status.phase == "Running" for role in pods.values() for p in role)
        return pods if ok else None

    pods = wait_for(running, 90, "every pod of the job to run",
                    describe=lambda: [(p.metadata.name, p.status.phase, p.spec.node_name)
                                      for p in mlsched.pods("pinned-by-user")])
    assert {p.spec.node_name for p in pods["worker"]} == {"kwok-node-5"}
    assert {p.spec.node_name for p in pods["ps"]} == {"kwok-node-9"}

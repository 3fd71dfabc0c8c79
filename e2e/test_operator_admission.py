"""A job is admitted when it arrives, not at its policy's next round; an edited policy acts now.

The policy's interval is a day (432 s at the tests' time scale), so nothing below can be the
work of a scheduled round: a job created after the first round must be running within
seconds, with the job that was already running left exactly where it was; lowering the
interval must take effect at once.
"""

from __future__ import annotations

import re
import time

from job_state import placed_as_decided, placement_problems
from mlsched_objects import condition, mljob, phase, scheduling_policy
from node_fixtures import DISK, labelled
from waiting import wait_for

DAY = 86400


def test_a_job_arriving_between_rounds_runs_long_before_the_interval(mlsched, operator, emulator):
    mlsched.create(scheduling_policy("daily", allocation="drf", interval=DAY))
    mlsched.create(mljob("first", ps=(1, 2), workers=(1, 2), epochs=1e9, policy="daily"))
    first = wait_for(lambda: placed_as_decided(mlsched, "first"), 60, "the first job to be placed",
                     describe=lambda: placement_problems(mlsched, "first"))
    rounds_before = mlsched.policy("daily")["status"].get("lastRoundTime")

    created = time.monotonic()
    mlsched.create(mljob("second", ps=(1, 2), workers=(1, 2), epochs=1e9, policy="daily"))
    wait_for(lambda: placed_as_decided(mlsched, "second"), 30,
             "the second job to be placed by an admission step",
             describe=lambda: placement_problems(mlsched, "second"))
    wait_for(lambda: phase(mlsched.job("second")) == "Running", 30, "the second job to be Running")
    waited = time.monotonic() - created
    assert waited < 60, waited  # the next round is 432 s away
    # No round ran in between, and the running job kept its pods where they were.
    assert mlsched.policy("daily")["status"].get("lastRoundTime") == rounds_before
    assert mlsched.job("first")["status"]["placement"] == first["placement"]


def test_lowering_the_interval_takes_effect_at_once(mlsched, operator):
    mlsched.create(scheduling_policy("slow", allocation="drf", interval=DAY))
    wait_for(lambda: (mlsched.policy("slow").get("status") or {}).get("observedGeneration") == 1, 60,
             "the first round of the slow policy")
    generation = mlsched.patch_policy("slow", {"interval": 1200})["metadata"]["generation"]
    edited = time.monotonic()
    wait_for(lambda: (mlsched.policy("slow").get("status") or {}).get("observedGeneration") == generation, 20,
             "a round with the edited spec", describe=lambda: mlsched.policy("slow").get("status"))
    assert time.monotonic() - edited < 20


def test_a_child_scaled_or_deleted_by_hand_is_restored_within_seconds(mlsched, operator, emulator):
    mlsched.create(scheduling_policy("daily", allocation="drf", interval=DAY))
    mlsched.create(mljob("steady", ps=(1, 2), workers=(1, 2), epochs=1e9, policy="daily"))
    status = wait_for(lambda: placed_as_decided(mlsched, "steady"), 60, "the job to be placed",
                      describe=lambda: placement_problems(mlsched, "steady"))
    decided = status["replicaStatuses"]["worker"]["desired"]
    name = "steady-worker"

    mlsched.apps.patch_namespaced_stateful_set(name, mlsched.namespace, {"spec": {"replicas": 0}})
    wait_for(lambda: mlsched.statefulsets("steady")["worker"].spec.replicas == decided, 15,
             "the hand-scaled StatefulSet to be scaled back")

    mlsched.apps.delete_namespaced_stateful_set(name, mlsched.namespace)
    back = wait_for(lambda: (s := mlsched.statefulsets("steady").get("worker")) is not None
                    and s.spec.replicas == decided and s, 30,
                    "the deleted StatefulSet to come back as decided")
    # With the template of the decided counts: recreated, it had the template of none, and
    # its pods used to start with no peers in their environment.
    env = {e.name: e.value for e in back.spec.template.spec.containers[0].env}
    assert env["MLSCHED_WORKER_REPLICAS"] == str(decided), env
    wait_for(lambda: placed_as_decided(mlsched, "steady"), 60, "its pods to run where decided again",
             describe=lambda: placement_problems(mlsched, "steady"))
    assert "Restored" in {e.reason for e in mlsched.events("steady", "MLJob")}

    # Its headless Service (the pods' DNS names) deleted by hand: made again within seconds.
    # It used to stay gone for good, and the job's peers stopped finding each other.
    old_uid = mlsched.core.read_namespaced_service("steady", mlsched.namespace).metadata.uid
    mlsched.core.delete_namespaced_service("steady", mlsched.namespace)
    deleted = time.monotonic()

    def service_uid() -> str | None:
        found = [s for s in mlsched.core.list_namespaced_service(mlsched.namespace).items
                 if s.metadata.name == "steady"]
        return found[0].metadata.uid if found else None

    wait_for(lambda: service_uid() not in (None, old_uid), 15, "the deleted Service to come back")
    print(f"Service back {time.monotonic() - deleted:.1f} s after its deletion")
    assert any(e.reason == "Restored" and e.message.startswith("Service steady was deleted")
               for e in mlsched.events("steady", "MLJob"))


def test_a_job_admitted_at_its_minimum_keeps_the_revision_it_was_created_with(mlsched, operator,
                                                                              emulator):
    # Its StatefulSets are created for its starting counts (its minimum), so admitting it
    # with them is a change of replicas alone. They used to be created for no peers and
    # re-templated on admission: a second ControllerRevision per StatefulSet, and a patch
    # carrying the whole pod template, for each of the ~1,000 jobs the first round after a
    # mass arrival admits (bench_e2e).
    mlsched.create(scheduling_policy("daily", allocation="drf", interval=DAY))
    mlsched.create(mljob("least", ps=(1, 1), workers=(1, 1), epochs=1e9, policy="daily"))
    wait_for(lambda: placed_as_decided(mlsched, "least"), 60, "the job to be placed",
             describe=lambda: placement_problems(mlsched, "least"))
    revisions = mlsched.apps.list_namespaced_controller_revision(mlsched.namespace).items
    for role, sts in mlsched.statefulsets("least").items():
        env = {e.name: e.value for e in sts.spec.template.spec.containers[0].env}
        assert (env["MLSCHED_PS_REPLICAS"], env["MLSCHED_WORKER_REPLICAS"]) == ("1", "1"), env
        owned = [r.metadata.name for r in revisions
                 if any(o.name == sts.metadata.name for o in r.metadata.owner_references or ())]
        assert len(owned) == 1, (role, owned)
        assert sts.status.update_revision == sts.status.current_revision, sts.status


def _small(name: str) -> dict:
    """A one-worker all-reduce job asking for little: 50 of them fit the 13 nodes."""
    job = mljob(name, ps=None, workers=(1, 1), epochs=1e9, policy="daily")
    small = {"cpu": "100m", "memory": "256Mi"}
    job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": small, "limits": small}
    return job


def test_a_burst_of_50_arrivals_is_admitted_in_one_coalesced_step(mlsched, operator):
    from concurrent.futures import ThreadPoolExecutor

    mlsched.create(scheduling_policy("daily", allocation="drf", interval=DAY))
    wait_for(lambda: (mlsched.policy("daily").get("status") or {}).get("observedGeneration") == 1,
             60, "the policy's first round")
    names = [f"burst-{i:02d}" for i in range(50)]
    created = time.monotonic()
    with ThreadPoolExecutor(8) as pool:  # as fast as a CI pipeline would apply them
        list(pool.map(lambda n: mlsched.create(_small(n)), names))

    def scaled() -> int:
        return sum(bool(s.spec.replicas) for n in names for s in mlsched.statefulsets(n).values())

    wait_for(lambda: scaled() == len(names), 60, "every job of the burst to be given its worker",
             describe=scaled)
    print(f"50 arrivals: all StatefulSets scaled {time.monotonic() - created:.1f} s after the "
          f"first create")
    steps = [line for line in operator.log_path.read_text().splitlines()
             if "admission:" in line and "daily" in line]
    admitted = [int(line.split("admission: ")[1].split(" of ")[0]) for line in steps]
    print(f"admission steps: {admitted}")
    assert sum(admitted) == len(names), steps
    # As `kubectl logs` shows them: each line says when (the operator's default log format).
    assert all(re.match(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] mlsched\.", line)
               for line in steps), steps
    assert len([a for a in admitted if a]) == 1, steps
    # Nobody scaled them: a StatefulSet watch event from before the step's own scaling must
    # not be "restored" (it started pods of the template of no peers, replaced at once).
    reasons = {(e.involved_object.name, e.reason) for e in mlsched.core.list_namespaced_event(
        mlsched.namespace).items}
    assert not [r for r in reasons if r[1] in ("Restored", "SuccessfulDelete")], sorted(reasons)
    # Cleanup, nothing checked: the 50 jobs' children deleted in two calls, not by the garbage
    # collector's hundred at kube-controller-manager's 20 requests/s (11 s of teardown).
    mlsched.delete_all_now()


def test_an_edit_the_running_allocation_no_longer_meets_is_redecided_within_seconds(
        api, mlsched, operator, emulator):
    """Lowering `max` below what a job holds, or a template nodeSelector its nodes do not meet,
    must not wait for the next round (a day here): the job is re-decided by an admission step."""
    from kubernetes import client

    mlsched.create(scheduling_policy("daily", allocation="fixed", interval=DAY))
    mlsched.create(mljob("edited", ps=(1, 1), workers=(1, 4), epochs=1e9, policy="daily"))
    status = wait_for(lambda: placed_as_decided(mlsched, "edited"), 60, "the job to be placed",
                      describe=lambda: placement_problems(mlsched, "edited"))
    assert status["replicaStatuses"]["worker"]["desired"] == 4  # `fixed`: its max
    last_round = mlsched.policy("daily")["status"].get("lastRoundTime")

    edited = time.monotonic()
    mlsched.patch_job("edited", {"replicaSpecs": {"worker": {"max": 2}}})
    status = wait_for(lambda: (s := placed_as_decided(mlsched, "edited"))
                      and s["replicaStatuses"]["worker"]["desired"] == 2 and s, 30,
                      "the job to run 2 workers", describe=lambda: placement_problems(mlsched, "edited"))
    print(f"max lowered: 2 workers {time.monotonic() - edited:.1f} s after the edit")

    # Two nodes none of its pods is on, labelled; the workers' template now selects them.
    used = set(status["placement"]["ps"]) | set(status["placement"]["worker"])
    free = sorted({f"kwok-node-{i}" for i in range(13)} - used)[:2]
    with labelled(client.CoreV1Api(api), free, DISK, "ssd"):
        edited = time.monotonic()
        mlsched.patch_job("edited", {"replicaSpecs": {"worker": {"template": {"spec": {
            "nodeSelector": {DISK: "ssd"}}}}}})
        status = wait_for(lambda: (s := placed_as_decided(mlsched, "edited"))
                          and set(s["placement"]["worker"]) <= set(free) and s, 45,
                          "the workers to run on the selected nodes",
                          describe=lambda: placement_problems(mlsched, "edited"))
        print(f"nodeSelector edited: workers on {status['placement']['worker']} "
              f"{time.monotonic() - edited:.1f} s after the edit")
    assert status["replicaStatuses"]["worker"]["desired"] == 2
    assert mlsched.policy("daily")["status"].get("lastRoundTime") == last_round  # no round ran


def test_capacity_that_appears_admits_a_waiting_job_within_seconds(api, control_plane, mlsched,
                                                                   operator):
    """A node uncordoned (as when a cluster autoscaler adds one, or an admin ends maintenance)
    is new capacity: a job waiting for it starts within seconds, not at the next round."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    spare = "kwok-node-12"
    core.patch_node(spare, {"spec": {"unschedulable": True}})
    try:
        mlsched.create(scheduling_policy("daily", allocation="fixed", interval=DAY))
        # Every GPU of the 12 other nodes, then a job that needs one more.
        mlsched.create(mljob("filler", ps=None, workers=(24, 24), epochs=1e9, policy="daily"))
        wait_for(lambda: placed_as_decided(mlsched, "filler"), 90, "the filler to run",
                 describe=lambda: placement_problems(mlsched, "filler"))
        mlsched.create(mljob("waiter", ps=None, workers=(1, 1), epochs=1e9, policy="daily"))
        # Its admission step has run and found no room: the job says so (a positive signal
        # before asserting what did not happen).
        wait_for(lambda: "does not fit what is free now" in
                 (condition(mlsched.job("waiter"), "Admitted") or {}).get("message", ""), 30,
                 "the waiting job to say why it waits",
                 describe=lambda: condition(mlsched.job("waiter"), "Admitted"))
        assert not (mlsched.job("waiter").get("status") or {}).get("placement", {}).get("worker")
        last_round = mlsched.policy("daily")["status"].get("lastRoundTime")
        # What `kubectl get schedpol` and `kubectl describe mljob` tell the user meanwhile.
        table = control_plane.kubectl("get", "schedpol", "daily", "-n", mlsched.namespace).stdout
        header, row = table.splitlines()[:2]
        start = header.index("ADMITTED")  # columns are aligned; some headers have two words
        assert row[start:header.index("GPUS")].split() == ["1", "1"], table
        assert row[header.index("GPUS"):header.index("MODEL VERSION")].split() == ["24"], table
        described = control_plane.kubectl("describe", "mljob", "waiter", "-n",
                                          mlsched.namespace).stdout
        assert "does not fit what is free now: 0 GPU" in described, described

        freed = time.monotonic()
        core.patch_node(spare, {"spec": {"unschedulable": None}})
        status = wait_for(lambda: placed_as_decided(mlsched, "waiter"), 30,
                          "the waiting job to run on the uncordoned node",
                          describe=lambda: placement_problems(mlsched, "waiter"))
        print(f"uncordoned: the waiting job ran {time.monotonic() - freed:.1f} s later")
        assert status["placement"]["worker"] == [spare]
        assert mlsched.policy("daily")["status"].get("lastRoundTime") == last_round
        counts = wait_for(lambda: (s := mlsched.policy("daily")["status"]).get("waitingJobs") == 0
                          and s, 10, "the policy to count no waiting job")
        assert counts["admittedJobs"] == 2
    finally:
        core.patch_node(spare, {"spec": {"unschedulable": None}})


def test_a_deleted_job_s_capacity_admits_a_waiting_job_within_seconds(mlsched, operator,
                                                                     node_shape):
    """Every GPU held by one job, another waiting; the first is deleted. Its pods go after it,
    and their going woke nothing (the pod handler looked for the job's policy through the job,
    which was gone): the waiting job waited for the next round. The policy also went on
    counting the deleted job as admitted."""
    mlsched.create(scheduling_policy("daily", allocation="fixed", interval=DAY))
    gpus = node_shape.count * node_shape.gpu
    mlsched.create(mljob("hog", ps=None, workers=(gpus, gpus), epochs=1e9, policy="daily"))
    wait_for(lambda: placed_as_decided(mlsched, "hog"), 90, "the job holding every GPU to run",
             describe=lambda: placement_problems(mlsched, "hog"))
    mlsched.create(mljob("next", ps=None, workers=(2, 2), epochs=1e9, policy="daily"))
    wait_for(lambda: (mlsched.policy("daily").get("status") or {}).get("waitingJobs") == 1, 30,
             "the second job to wait")
    deleted = time.monotonic()
    mlsched.custom.delete_namespaced_custom_object("mlsched.io", "v1alpha1", mlsched.namespace,
                                                   "mljobs", "hog")
    # Its pods take their grace period to go (about 40 s here), holding the GPUs till then.
    wait_for(lambda: not mlsched.pods("hog"), 90, "the deleted job's pods to go")
    gone = time.monotonic()
    wait_for(lambda: placed_as_decided(mlsched, "next"), 30,
             "the waiting job to run once the deleted job's pods are gone",
             describe=lambda: placement_problems(mlsched, "next"))
    print(f"deleted: its pods went {gone - deleted:.1f} s later, and the waiting job ran "
          f"{time.monotonic() - gone:.1f} s after that")
    counts = wait_for(lambda: (s := mlsched.policy("daily")["status"]).get("waitingJobs") == 0
                      and s, 10, "the policy to count no waiting job")
    assert counts["admittedJobs"] == 1

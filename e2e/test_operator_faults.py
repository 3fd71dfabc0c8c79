"""Faults: the operator killed mid-round, the API server restarted, a node gone NotReady.

After each, what the API server stores must again match the decision the operator
records: no StatefulSet scaled twice or left behind, no extra pod, no history entry
lost or written twice, and jobs that go on training.
"""

from __future__ import annotations

import time

from kubernetes import client, watch

from job_state import placed_as_decided, placement_problems
from mlsched_objects import GROUP, JOB_LABEL, VERSION, mljob, phase, scheduling_policy
from other_workloads import every_gpu_held_and_a_job_waiting
from waiting import wait_for

SETTLE = 120  # seconds for a restarted operator to bring everything in line


def history(job: dict) -> list[dict]:
    return (job.get("status") or {}).get("history") or []


def kill_on_event(operator, stream_args: tuple, fire, timeout: float = 90.0,
                  resource_version: str | None = None):
    """Watches a list call's events and SIGKILLs the operator on the first event for
    which fire(event) is true; returns that event. The kill follows the API server's
    acknowledgement of the operator's write by milliseconds, so it lands inside the
    round that made the write. `resource_version`: the events from then on, so that a write
    made before the watch began (but after the test set the scene) is not missed."""
    stream = watch.Watch()
    since = {"resource_version": resource_version} if resource_version else {}
    try:
        for event in stream.stream(*stream_args, timeout_seconds=int(timeout), **since):
            if fire(event):
                operator.kill()
                return event
    finally:
        stream.stop()
    raise AssertionError(f"no event to kill the operator on within {timeout:.0f}s")


def all_placed(mlsched, names: list[str]) -> bool:
    return all(placed_as_decided(mlsched, n) for n in names)


def test_operator_killed_mid_round_neither_duplicates_nor_loses(mlsched, start_operator,
                                                                 emulator):
    # One API call at a time: a round's writes then take long enough for a kill to land
    # between two of them, which is the point of this test.
    operator = start_operator(extra_env={"MLSCHED_API_CONCURRENCY": "1"})
    namespace = mlsched.namespace
    custom = client.CustomObjectsApi(mlsched.custom.api_client)
    apps = client.AppsV1Api(mlsched.custom.api_client)
    mlsched.create(scheduling_policy("default"))
    early = [f"early-{i}" for i in range(6)]
    for name in early:
        mlsched.create(mljob(name, ps=(1, 1), workers=(1, 2), epochs=1e9))
    wait_for(lambda: all(len(history(mlsched.job(n))) >= 2 for n in early)
             and all_placed(mlsched, early), SETTLE, "the first jobs to run for two intervals",
             describe=lambda: {n: placement_problems(mlsched, n) for n in early})

    # Kill 1: while a round scales up jobs that arrived since the previous round. The watch
    # starts from before the jobs exist: an admission step can scale them before a watch
    # begun after the creates would be listening, and the kill then waited for a later
    # round that had recorded everything (CI, 30 Nov: 5 of 5 admitted in 150 ms).
    since = apps.list_namespaced_stateful_set(namespace).metadata.resource_version
    late = [f"late-{i}" for i in range(6)]
    for name in late:
        mlsched.create(mljob(name, ps=(1, 1), workers=(1, 2), epochs=1e9))
    kill_on_event(operator, (apps.list_namespaced_stateful_set, namespace),
                  lambda e: e["type"] == "MODIFIED" and (e["object"].spec.replicas or 0) > 0
                  and e["object"].metadata.labels[JOB_LABEL] in late, resource_version=since)
    unrecorded = [n for n in late if not (mlsched.job(n).get("status") or {}).get("placement")]
    scaled = sorted(s.metadata.name for n in late for s in mlsched.statefulsets(n).values()
                    if s.spec.replicas)
    print(f"kill 1: StatefulSets scaled {scaled}; decision not yet recorded for {unrecorded}")
    assert unrecorded, "the kill came after the round had recorded its decisions"

    operator.start()
    everyone = early + late
    wait_for(lambda: all_placed(mlsched, everyone), SETTLE,
             "every job's StatefulSets and pods to match its recorded decision",
             describe=lambda: {n: p for n in everyone if (p := placement_problems(mlsched, n))})
    # No extra pod anywhere: exactly one per decided task.
    decided = sum(len(nodes) for n in everyone
                  for nodes in mlsched.job(n)["status"]["placement"].values()
                  if isinstance(nodes, list))
    assert len([p for p in mlsched.pods() if not p.metadata.deletion_timestamp]) == decided

    # Kill 2: while a round writes the closed interval into the jobs' history.
    baseline: dict[str, int] = {}

    def history_grew(event) -> bool:
        body = event["object"]
        name, length = body["metadata"]["name"], len(history(body))
        if event["type"] == "ADDED":  # the watch's initial state
            baseline[name] = length
            return False
        return event["type"] == "MODIFIED" and length > baseline.get(name, length)

    kill_on_event(operator, (custom.list_namespaced_custom_object, GROUP, VERSION, namespace,
                             "mljobs"), history_grew)
    at_kill = {n: history(mlsched.job(n)) for n in everyone}
    policy_rewards = mlsched.policy("default")["status"].get("rewards") or []
    newest = max(h["interval"] for entries in at_kill.values() for h in entries)
    recorded = sorted(n for n, entries in at_kill.items()
                      if entries and entries[-1]["interval"] == newest)
    print(f"kill 2: interval {newest} recorded for {recorded}; policy rewards end at "
          f"{policy_rewards[-1]['interval'] if policy_rewards else None}")
    assert len(recorded) < len(everyone) or policy_rewards[-1]["interval"] < newest, \
        "the kill came after the round had finished recording"

    operator.start()
    wait_for(lambda: all(len(history(mlsched.job(n))) >= len(at_kill[n]) + 2 for n in everyone),
             SETTLE, "two more intervals recorded for every job after the restart")
    for name in everyone:
        now = history(mlsched.job(name))
        # What was recorded before the kill is still there, unchanged...
        assert now[:len(at_kill[name])] == at_kill[name], name
        # ...and no interval is recorded twice, nor out of order.
        numbers = [h["interval"] for h in now]
        assert numbers == sorted(set(numbers)), (name, numbers)
        assert all(h["epochs"] > 0 for h in now[len(at_kill[name]):]), (name, now)
    rewards = [r["interval"] for r in mlsched.policy("default")["status"]["rewards"]]
    assert rewards == sorted(set(rewards)), rewards
    assert all_placed(mlsched, everyone)
    # Training reported throughout; while the operator was down its reports did not
    # arrive, but a restarted operator never refused one of its own pods' reports.
    assert emulator.reports["accepted"] > 0
    assert emulator.refusals == [], emulator.refusals


def test_operator_rides_out_an_apiserver_crash(control_plane, mlsched, operator):
    mlsched.create(scheduling_policy("default"))
    mlsched.create(mljob("before", epochs=1e9))
    wait_for(lambda: placed_as_decided(mlsched, "before"), 90, "the first job to be placed")

    control_plane.restart_apiserver(crash=True)
    round_before = mlsched.policy("default")["status"]["lastRoundTime"]

    # A job created after the restart gets its children, its tasks and its pods.
    mlsched.create(mljob("after", epochs=1e9))
    wait_for(lambda: set(mlsched.statefulsets("after")) == {"ps", "worker"}, 90,
             "the StatefulSets of a job created after the restart")
    wait_for(lambda: placed_as_decided(mlsched, "after"), 120,
             "the new job to be placed", describe=lambda: placement_problems(mlsched, "after"))
    wait_for(lambda: phase(mlsched.job("after")) == "Running", 60, "the new job to run")
    # Rounds go on (the new job may have been admitted before the next round was due).
    wait_for(lambda: mlsched.policy("default")["status"]["lastRoundTime"] > round_before, 30,
             "a round after the restart")
    assert placed_as_decided(mlsched, "before")
    assert operator.running(), "the operator died with the API server"


def test_node_not_ready_moves_its_pods_and_training_goes_on(control_plane, mlsched, operator,
                                                           emulator):
    mlsched.create(scheduling_policy("default"))
    mlsched.create(mljob("ring", model="resnext-110", ps=None, workers=(2, 4), epochs=1e9))
    status = wait_for(lambda: placed_as_decided(mlsched, "ring"), 90, "the job to be placed",
                      describe=lambda: placement_problems(mlsched, "ring"))
    victim = status["placement"]["worker"][0]
    wait_for(lambda: ((mlsched.job("ring")["status"].get("progress") or {})
                      .get("epochsDone") or 0) > 0, 60, "the job to train")

    try:
        control_plane.set_node_ready(victim, False)
        moved = wait_for(
            lambda: (s := placed_as_decided(mlsched, "ring"))
            and victim not in s["placement"]["worker"]
            and not [p for p in mlsched.pods("ring") if p.spec.node_name == victim] and s,
            90, f"the job's pods to leave NotReady node {victim}",
            describe=lambda: placement_problems(mlsched, "ring"))
        assert len(moved["placement"]["worker"]) == len(status["placement"]["worker"])
        placed = [e.message for e in mlsched.events("ring", "MLJob") if e.reason == "Placed"]
        assert any(f"(was {victim})" in m for m in placed), placed

        # Training goes on where the pods are now.
        done = moved.get("progress", {}).get("epochsDone", 0)
        wait_for(lambda: mlsched.job("ring")["status"]["progress"]["epochsDone"] > done, 60,
                 "progress after the move")
        assert phase(mlsched.job("ring")) == "Running"
    finally:
        control_plane.set_node_ready(victim, True)


def test_pods_deleted_while_the_watches_were_down_stop_holding_their_nodes(
        api, control_plane, node_shape, mlsched, operator):
    """Another workload's GPU pods are deleted while the API server is down (here straight
    from etcd): the operator's watches cannot resume where they stopped, kopf lists the pods
    again, and no DELETED event ever comes. Before, their requests stayed in the operator's
    indexes until it restarted, and a job waiting for their GPUs waited for good; now what
    a listing again leaves out is asked for, dropped when gone, and the job runs."""
    hogs = every_gpu_held_and_a_job_waiting(client.CoreV1Api(api), node_shape, mlsched, "hog")
    core = client.CoreV1Api(api)

    def delete_hogs() -> None:
        for name in hogs:
            assert control_plane.delete_from_storage(f"/registry/pods/{mlsched.namespace}/{name}") == 1
    control_plane.restart_apiserver(while_down=delete_hogs)
    assert core.list_namespaced_pod(mlsched.namespace).items == []
    back = time.monotonic()
    wait_for(lambda: placed_as_decided(mlsched, "after"), 90,
             "the job to run on the GPUs the deleted pods held",
             describe=lambda: placement_problems(mlsched, "after"))
    print(f"placed {time.monotonic() - back:.1f} s after the API server was back")

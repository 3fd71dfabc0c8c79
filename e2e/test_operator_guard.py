"""The regret guard on the control plane (issue 51, part 3; docs/operator.md, "Regret guard"):
the shipped `chic` (a 3-job window, trained on one pool of 10 GPUs) with
`guard: {fallbackWhenWorseBy: "10%", window: 3}` on twelve kwok nodes of 2 GPUs with ten jobs,
a cluster unlike its training. Chic gives jobs outside its window nothing; the workload
emulator trains the others at the simulator's speeds. After the first window of three
intervals the operator replays it under chic and under drf (the fallback), and again at every
interval after (the window rolls). The test checks the first judgement made from the real
records (both estimates, the replay's error, the condition) and that the operator acts on
it consistently: tripped, a Warning Event, Ready=FallbackActive and drf giving every job
workers; not tripped, ModelServing and no Event. It does not assert which: on this emulated
cluster the replays put drf at 0.94-1.52 x chic from run to run (see the comment below).

The test gives its operator nodes of its own (a node selector on a label only they carry).
"""

from __future__ import annotations

import re

import pytest
from kubernetes import client

from dl2_model import configmap_ref, model_configmap
from mlsched_objects import REPO, condition, mljob, scheduling_policy
from operator_fixtures import own_nodes
from test_operator_models import counts
from waiting import wait_for

CHIC = REPO / "policy_models" / "artifacts" / "chic" / "chic.onnx"
SELECT = "e2e.mlsched.io/regret-guard"
NODES, JOBS, WINDOW = 12, 10, 3
ROUND_S = 6  # 1200 policy seconds at the e2e interval scale
# The first window closes after WINDOW intervals with jobs, the second (rolling) one interval
# later; the judgement is made at the start of the next round, and a trip needs two of them.
# Rounds slip on a loaded 2-core machine: allow three times as long.
TRIP_TIMEOUT = 3 * (WINDOW + 3) * ROUND_S + 30


@pytest.fixture
def guard_nodes(api, control_plane, mlsched):
    yield from own_nodes(api, control_plane, NODES, "guard", SELECT, mlsched.namespace,
                         cpu=8, gpu=2, memory_gib=48)


@pytest.fixture
def guard_operator(guard_nodes, start_operator, mlsched):
    return start_operator(extra_env={"MLSCHED_NODE_SELECTOR": f"{SELECT}={mlsched.namespace}"})


def workers(mlsched) -> dict[str, int]:
    return {f"job-{i}": counts(mlsched, f"job-{i}")["worker"] for i in range(JOBS)}


def test_chic_outside_its_domain_trips_the_guard_and_drf_takes_over(api, mlsched, guard_operator,
                                                                     emulator):
    card = CHIC.with_name("chic.card.json")
    assert CHIC.is_file() and card.is_file(), f"the shipped Chic model is missing: {CHIC}"
    client.CoreV1Api(api).create_namespaced_config_map(
        mlsched.namespace, model_configmap("chic-policy", CHIC, card))
    mlsched.create(scheduling_policy(
        "guarded", allocation="chic", fallback="drf",
        models={"allocation": {"chic": configmap_ref("chic-policy")}},
        guard={"fallbackWhenWorseBy": "10%", "window": WINDOW}))
    for i in range(JOBS):  # long enough not to finish within the test
        mlsched.create(mljob(f"job-{i}", ps=(1, 4), workers=(1, 8), epochs=5000, policy="guarded"))

    # Under chic, jobs outside its window wait with nothing while GPUs are free.
    under_chic = wait_for(lambda: any(workers(mlsched).values()) and workers(mlsched), 60,
                          "chic's first allocation")
    guard = mlsched.policy("guarded")["status"]["guard"]
    assert guard["tripped"] is False and guard["window"] == WINDOW
    assert condition(mlsched.policy("guarded"), "GuardTripped")["reason"] == "CollectingWindow"
    waiting = [j for j, w in under_chic.items() if w == 0]
    assert waiting, f"chic gave every job workers: {under_chic}"

    # A judgement: both replays made from the recorded window, and the condition saying what
    # the guard made of them. Whether drf comes out ahead here is not asserted: on this
    # emulated cluster the replays have put drf at 0.94 x to 1.52 x chic from run to run (the
    # replay of chic off its records by -7 % to -31 %), so the trip itself is shown in the
    # simulator (tests/test_regret_guard.py); here, that the operator judges from real
    # records and acts on its verdict consistently either way.
    judged = wait_for(
        lambda: (g := (p := mlsched.policy("guarded"))["status"].get("guard") or {})
        and g.get("learnedEstimate") is not None and g.get("fallbackEstimate") is not None
        and p, TRIP_TIMEOUT, "the guard's first judgement",
        describe=lambda: mlsched.policy("guarded")["status"].get("guard"))
    cond = condition(judged, "GuardTripped")
    status = judged["status"]["guard"]
    span = re.search(r"over the last (\d+) intervals", cond["message"])
    assert span and int(span.group(1)) >= WINDOW, cond["message"]
    assert "learned" in cond["message"] and "fallback" in cond["message"]
    assert "off the records" in cond["message"], cond["message"]
    assert status["estimateError"] is not None and status["recorded"] > 0
    events = [e for e in mlsched.events("guarded", "SchedulingPolicy") if e.reason == "GuardTripped"]
    ready = condition(judged, "Ready")
    if cond["status"] == "True":
        assert cond["reason"] == "FallbackAhead"
        assert status["tripped"] is True
        assert status["fallbackEstimate"] > status["learnedEstimate"] * 1.1
        [event] = events
        assert event.type == "Warning" and "fallback" in event.message
        assert (ready["status"], ready["reason"]) == ("True", "FallbackActive")
        # The fallback decides from now on: drf gives every job workers.
        after = wait_for(lambda: all((w := workers(mlsched)).values()) and w, 3 * ROUND_S + 30,
                         "drf giving every job workers", describe=lambda: workers(mlsched))
        print(f"chic decided {under_chic}; tripped, drf decided {after}; guard: {status}")
    else:
        assert (cond["status"], cond["reason"]) == ("False", "ModelServing"), cond
        assert status["tripped"] is False and not events
        assert ready["reason"] != "FallbackActive", ready
        print(f"chic decided {under_chic}; the model serves; guard: {status}")

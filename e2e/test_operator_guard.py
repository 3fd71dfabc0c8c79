"""The regret guard on the control plane (issue 51, part 3; docs/operator.md, "Regret guard"):
the shipped `chic` (a 3-job window, trained on one pool of 10 GPUs) with
`guard: {fallbackWhenWorseBy: "10%", window: 3}` on twelve kwok nodes of 2 GPUs with ten
all-reduce ResNet-50 jobs (1-8 workers), a cluster unlike its training. Chic gives the jobs of
its window four workers each and those outside it nothing (an admission step may start a few
more, whom the cycle guard then keeps); the workload emulator trains them at the simulator's
speeds. After the first window of three intervals the operator replays it under chic and under
drf (the fallback) at every closed interval; drf, spreading the 24 GPUs over all ten jobs,
comes out 1.60-1.87 x ahead, and the guard trips on its second judgement, the earliest its
rule allows: GuardTripped=True with both estimates, a Warning Event,
Ready=FallbackActive, status.guard; from the next round on drf decides, and every job gets
workers.

Why all-reduce ResNet-50 and not parameter-server jobs: chic gives a PS job of ResNet-50 4 PS
and 1 worker, which the measured table makes 1.9 x as fast as drf's 2 + 2, so with the jobs an
admission step starts beside its window (6 of 10 on this cluster) chic is ahead of drf there
(0.84 x in the replays, as in the records), and behind only when no admission step runs
(1.4 x): whether the guard should trip depended on the operator's timing, not on the model.

The test gives its operator nodes of its own (a node selector on a label only they carry).
"""

from __future__ import annotations

import re

import pytest
from kubernetes import client

from dl2_model import configmap_ref, model_configmap
from job_state import counts
from mlsched_objects import REPO, condition, mljob, scheduling_policy
from operator_fixtures import own_nodes
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
    for i in range(JOBS):  # all-reduce (ps=None), long enough not to finish within the test
        mlsched.create(mljob(f"job-{i}", ps=None, workers=(1, 8), epochs=5000, policy="guarded"))

    # Under chic, jobs outside its window wait with nothing while GPUs are free.
    under_chic = wait_for(lambda: any(workers(mlsched).values()) and workers(mlsched), 60,
                          "chic's first allocation")
    guard = mlsched.policy("guarded")["status"]["guard"]
    assert guard["tripped"] is False and guard["window"] == WINDOW
    assert condition(mlsched.policy("guarded"), "GuardTripped")["reason"] == "CollectingWindow"
    waiting = [j for j, w in under_chic.items() if w == 0]
    assert waiting, f"chic gave every job workers: {under_chic}"

    tripped = wait_for(
        lambda: (c := condition(p := mlsched.policy("guarded"), "GuardTripped"))
        and c["status"] == "True" and p, TRIP_TIMEOUT, "GuardTripped=True",
        describe=lambda: mlsched.policy("guarded")["status"].get("guard"))
    cond = condition(tripped, "GuardTripped")
    assert cond["reason"] == "FallbackAhead"
    # Within the stated window: on the second judgement (the first window pooled with the one
    # rolled an interval on, WINDOW + 1 intervals), the earliest a trip may come.
    span = re.search(r"over the last (\d+) intervals", cond["message"])
    assert span and int(span.group(1)) == WINDOW + 1, cond["message"]
    assert "learned" in cond["message"] and "fallback" in cond["message"]
    assert "off the records" in cond["message"], cond["message"]
    status = tripped["status"]["guard"]
    assert status["tripped"] is True and status["served"] == "learned"
    # Ahead by more than the threshold plus the replay's own error, and that error small: the
    # replay of chic tracks what the emulator recorded. The first window holds the jobs' start:
    # kwok runs their pods 1-2 real seconds after the grant (200-600 policy seconds here), which
    # the replay charges as the records show it (sim/regret_replay.py, start_losses); it was
    # +7 to +18 % off before. In one run of ten chic's every round sent the three jobs an
    # admission step had started back to nothing and the next admission step started them
    # again, which the replay did not (it was -37 % off on that window, -10 to -20 % pooled;
    # the fresh-clone CI's failure); it now admits after a round that frees tasks, as the
    # operator does, and is +7 to +14 % off there. Pooled, over twelve runs: -1.9 to +2.9 %,
    # +10 % in that one.
    assert status["fallbackEstimate"] > status["learnedEstimate"] * (1.1 + abs(status["estimateError"]))
    assert abs(status["estimateError"]) < 0.2, status
    [event] = [e for e in mlsched.events("guarded", "SchedulingPolicy") if e.reason == "GuardTripped"]
    assert event.type == "Warning" and "fallback" in event.message
    ready = condition(tripped, "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "FallbackActive")

    # The fallback decides from now on: drf gives every job workers.
    after = wait_for(lambda: all((w := workers(mlsched)).values()) and w, 3 * ROUND_S + 30,
                     "drf giving every job workers", describe=lambda: workers(mlsched))
    print(f"chic decided {under_chic}; after the trip drf decided {after}; guard: {status}")
    assert condition(mlsched.policy("guarded"), "GuardTripped")["status"] == "True"
